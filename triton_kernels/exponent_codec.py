"""The Triton backend of the zipccl codec: ``encode(x, codec)`` and
``decode(payload, header, out)``, byte-identical to ``zipccl_fsdp.codec_torch``.

CUDA tensors; CPU tensors too when ``TRITON_INTERPRET=1`` was set before this
module was imported (triton reads it when ``@triton.jit`` decorates a kernel).
``codec_encode.py`` and ``codec_decode.py`` hold the launchers (and the
decoder's header check); the kernels live one file per codec and op
(``fixed3_encode.py``, ``fixed3_decode.py``, ``dense_encode.py``,
``dense_decode.py``), the functions they share in ``_codec_common.py`` (the
chunk tile) and ``_lookback.py`` (segment offsets in one pass);
``tools/offline.py`` (not installed) compiles them for a GPU without one.

Under ``backend="auto"`` the kernels pass a self-check per device, dtype
and codec first (``zipccl_fsdp/backends.py``, which makes every backend
choice).

``DEVICE_HEADER``: ``decode_into(payload, out)`` checks the header on the
device against ``out``, so zipccl_fsdp.decode with ``out=`` reads nothing
back before the launch.
"""
from __future__ import annotations

import torch

from . import codec_decode, codec_encode

__all__ = ["encode", "decode", "decode_into"]
DEVICE_HEADER = True


def _on_its_device(t: torch.Tensor, fn, *args):
    """``fn(*args)`` with ``t``'s CUDA device current. Triton launches on the
    current device and its current stream, not on the tensor's; a call on the
    current device (the common case) enters no device context."""
    if t.is_cuda and t.get_device() != torch.cuda.current_device():
        with torch.cuda.device(t.device):
            return fn(*args)
    return fn(*args)


def encode(x: torch.Tensor, codec: str) -> torch.Tensor:
    return _on_its_device(x, codec_encode.encode, x, codec)


def decode(payload: torch.Tensor, header, out: torch.Tensor) -> torch.Tensor:
    return _on_its_device(payload, codec_decode.decode, payload, header, out)


def decode_into(payload: torch.Tensor, out: torch.Tensor) -> bool:
    """Decode into ``out`` with the header checked on the device; returns
    whether the payload carries checksums (codec_decode.decode_into)."""
    return _on_its_device(payload, codec_decode.decode_into, payload, out)
