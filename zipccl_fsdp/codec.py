"""Public codec API: ``encode``, ``decode``, ``max_encoded_nbytes``.

The format lives in ``format.py``; this module only validates arguments and
dispatches to a backend:

* ``"torch"``: vectorized torch ops, CPU or CUDA; the reference.
* ``"cpp"``: a C++ CPU kernel built on first use (see ``codec_cpp.py``).
* ``"triton"``: the GPU kernels in ``triton_kernels`` (CUDA tensors; under
  ``TRITON_INTERPRET=1`` also CPU tensors, slowly, for tests).
* ``"auto"``: triton on CUDA, cpp on CPU, falling back to torch.

All backends write byte-identical payloads and read each other's.
"""
from __future__ import annotations

import os

import torch

from . import format as F
from . import codec_torch
from .errors import CorruptPayloadError

CODECS = ("raw", "fixed3", "dense")
BACKENDS = ("auto", "torch", "cpp", "triton")
DEFAULT_CODEC = "fixed3"


def _check_codec(codec: str) -> str:
    if codec == "auto":
        return DEFAULT_CODEC
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}; choose one of {('auto',) + CODECS}")
    return codec


def _triton_usable(device: torch.device) -> bool:
    from triton_kernels import available
    if not available():
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _backend_module(backend: str, device: torch.device):
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if backend == "auto":
        if device.type == "cuda" and _triton_usable(device):
            backend = "triton"
        elif device.type == "cpu":
            from . import codec_cpp
            backend = "cpp" if codec_cpp.available() else "torch"
        else:
            backend = "torch"
    if backend == "torch":
        return codec_torch
    if backend == "cpp":
        if device.type != "cpu":
            raise ValueError(f"the cpp backend runs on CPU tensors, got a {device.type} tensor")
        from . import codec_cpp
        return codec_cpp
    if not _triton_usable(device):
        raise ValueError("the triton backend needs triton and a CUDA tensor "
                         "(or TRITON_INTERPRET=1 for CPU tensors)")
    from triton_kernels import exponent_codec
    return exponent_codec


def encode(tensor: torch.Tensor, *, codec: str = "auto", backend: str = "auto") -> torch.Tensor:
    """Encode ``tensor`` losslessly into a 1-D uint8 self-describing payload.

    Example::

        >>> x = torch.randn(1000, dtype=torch.bfloat16)
        >>> payload = zipccl_fsdp.encode(x)
        >>> torch.equal(zipccl_fsdp.decode(payload).view(torch.int16), x.view(torch.int16))
        True
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"encode takes a torch.Tensor, got {type(tensor).__name__}")
    F.dtype_info(tensor.dtype)
    codec = _check_codec(codec)
    if tensor.dim() > F.MAX_NDIM:
        raise ValueError(f"tensors of up to {F.MAX_NDIM} dims are supported, got {tensor.dim()}")
    x = tensor.detach()
    if not x.is_contiguous():
        x = x.contiguous()
    return _backend_module(backend, x.device).encode(x, codec)


def decode(payload: torch.Tensor, *, out: torch.Tensor | None = None,
           backend: str = "auto") -> torch.Tensor:
    """Decode a payload back into the exact tensor (dtype, shape, every bit).

    With ``out``, the result is written into it (same dtype and numel,
    contiguous) and ``out`` is returned; otherwise a new tensor is allocated
    on the payload's device.
    """
    header = F.parse_header(payload)
    if out is None:
        out = torch.empty(header.shape, dtype=header.dtype, device=payload.device)
    else:
        if out.dtype != header.dtype or out.numel() != header.numel:
            raise ValueError(f"out is {out.dtype}[{out.numel()}], payload holds "
                             f"{header.dtype}[{header.numel}]")
        if not out.is_contiguous():
            raise ValueError("out must be contiguous")
        if out.device != payload.device:
            raise ValueError(f"out is on {out.device}, payload on {payload.device}")
    return _backend_module(backend, payload.device).decode(payload, header, out)


def max_encoded_nbytes(numel: int, dtype: torch.dtype, codec: str = "auto", ndim: int = 1) -> int:
    """Upper bound on ``encode(t).numel()`` for a tensor of ``numel`` elements."""
    codec = _check_codec(codec)
    if codec == "raw":
        return F.HEADER_NBYTES + 8 * ndim + numel * F.dtype_info(dtype).itemsize
    return F.max_encoded_nbytes(numel, dtype, ndim)


__all__ = ["CODECS", "BACKENDS", "encode", "decode", "max_encoded_nbytes", "CorruptPayloadError"]
