"""The Triton backend of the zipccl codec: ``encode(x, codec)`` and
``decode(payload, header, out)``, byte-identical to ``zipccl_fsdp.codec_torch``.

CUDA tensors; CPU tensors too when ``TRITON_INTERPRET=1`` was set before this
module was imported (triton reads it when ``@triton.jit`` decorates a kernel).
``codec_encode.py`` and ``codec_decode.py`` hold the launchers (and the
decoder's table check); the kernels live one file per codec and op
(``fixed3_encode.py``, ``fixed3_decode.py``, ``dense_encode.py``,
``dense_decode.py``), the helpers they share in ``_codec_common.py`` and
``_rows.py`` (the row tiles both codecs work on);
``offline.py`` compiles them for a GPU without one.
"""
from __future__ import annotations

from .codec_decode import decode
from .codec_encode import encode

__all__ = ["encode", "decode"]
