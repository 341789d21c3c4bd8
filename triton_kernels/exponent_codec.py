"""The Triton backend of the zipccl codec: ``encode(x, codec)`` and
``decode(payload, header, out)``, byte-identical to ``zipccl_fsdp.codec_torch``.

CUDA tensors; CPU tensors too when ``TRITON_INTERPRET=1`` was set before this
module was imported (triton reads it when ``@triton.jit`` decorates a kernel).
One op per file: ``codec_encode.py`` and ``codec_decode.py`` hold each
kernel beside its launcher; ``_codec_common.py`` the helpers they share.
"""
from __future__ import annotations

from .codec_decode import decode
from .codec_encode import encode

__all__ = ["encode", "decode"]
