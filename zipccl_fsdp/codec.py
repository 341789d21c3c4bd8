"""Public codec API: ``encode``, ``decode``, ``max_encoded_nbytes``.

The format lives in ``format.py``; this module only validates arguments and
dispatches to a backend:

* ``"torch"``: vectorized torch ops, CPU or CUDA; the reference.
* ``"cpp"``: a C++ CPU kernel built on first use (see ``codec_cpp.py``).
* ``"triton"``: the GPU kernels in ``triton_kernels`` (CUDA tensors; under
  ``TRITON_INTERPRET=1`` also CPU tensors, slowly, for tests).
* ``"auto"``: triton on CUDA (each dtype and codec after a self-check of
  the kernels on the device), cpp on CPU, falling back to torch.

``backends.py`` makes that choice.

All backends write byte-identical payloads and read each other's.

Checksums (``verify``): a backend whose module sets ``CHECKSUMS`` (cpp)
computes them itself, in the passes over each chunk it makes anyway
(``encode(x, codec, verify=True)``, ``decode(..., sums=buffer)``); for the
others this module computes them with ``chunk_sums`` (torch ops). Either way
the comparison and its error are here (``_check_checksums``).

Room (``encode(..., room=r)``): a backend whose module sets ``ROOM`` (cpp)
allocates its payload's buffer r bytes large; for the others this module
copies the payload into such a buffer.
"""
from __future__ import annotations

import dataclasses

import torch

from . import backends
from . import format as F
from .backends import BACKENDS
from .config import BackendName, CodecName
from .errors import CorruptPayloadError

CODECS = ("raw", "fixed3", "dense")
DEFAULT_CODEC = "dense"  # smaller; fixed3 is the fast one (docs/format.md)


def _check_codec(codec: str) -> str:
    if codec == "auto":
        return DEFAULT_CODEC
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}; choose one of {('auto',) + CODECS}")
    return codec


def chunk_sums(x: torch.Tensor) -> torch.Tensor:
    """The integrity checksums of format.py ("Integrity"): a u32 per CHUNK_ELEMS
    elements, the sum mod 2**32 of a bijective 32-bit mix of each word, its
    position and the dtype, as an int64 tensor on x's device.

    Every product stays below 2**63 (a 32-bit value times a 30-bit constant), so
    int64 arithmetic is exact on every device. Blocks of 32 chunks on the CPU
    (1 MiB of int64 temporaries) keep the passes in cache.
    """
    info = F.dtype_info(x.dtype)
    C, M = F.CHUNK_ELEMS, 0xFFFFFFFF
    flat = x.reshape(-1).view({2: torch.int16, 4: torch.int32}[info.itemsize])
    n = flat.numel()
    word_mask = (1 << (8 * info.itemsize)) - 1
    # Keyed by dtype too, so a payload relabelled bf16 <-> fp16 does not verify.
    pos = torch.arange(C, dtype=torch.int64, device=x.device) | (info.code << 16)
    key = (pos * F.SUM_KEY_MUL) & M
    sums = torch.empty(F.nchunks_for(n, C), dtype=torch.int64, device=x.device)

    def mix_sum(w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        w &= word_mask
        w ^= k
        w *= F.SUM_MUL1
        w &= M
        w ^= w >> 15
        w *= F.SUM_MUL2
        w &= M
        w ^= w >> 16
        return w.sum(-1) & M

    full = n // C
    step = 32 if x.device.type == "cpu" else 4096
    for c0 in range(0, full, step):
        c1 = min(full, c0 + step)
        sums[c0:c1] = mix_sum(flat[c0 * C:c1 * C].to(torch.int64).view(-1, C), key)
    if n % C:
        sums[full] = mix_sum(flat[full * C:].to(torch.int64), key[:n % C])
    return sums


def _sums_bytes(sums: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(0, 32, 8, device=sums.device)
    return ((sums[:, None] >> shifts) & 0xFF).to(torch.uint8).reshape(-1)


def _add_checksums(payload: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    header = F.parse_header(payload)
    header.flags |= F.HEADER_FLAG_CHECKSUM
    head = header.to_tensor(payload.device)
    return torch.cat([head, payload[head.numel():], _sums_bytes(chunk_sums(x))])


def _check_checksums(payload: torch.Tensor, header: F.Header, sums: torch.Tensor) -> None:
    """Compare the payload's sums stream with ``sums``, the checksums of the decoded
    tensor as bytes (``_sums_bytes``); raise naming the first chunk that differs."""
    stored = payload[header.sums_offset:header.total_nbytes].view(-1, 4)
    bad = (stored != sums.view(-1, 4)).any(1).nonzero()
    if bad.numel():
        c = int(bad[0, 0])
        err = CorruptPayloadError(
            f"checksum mismatch in chunk {c} (elements {c * F.CHUNK_ELEMS}.."
            f"{min((c + 1) * F.CHUNK_ELEMS, header.numel) - 1}): the payload was damaged")
        err.chunk = c  # read by protocol.decode_from, which names it with the peer
        raise err


def encode(tensor: torch.Tensor, *, codec: CodecName = "auto", backend: BackendName = "auto",
           verify: bool = False, room: int = 0) -> torch.Tensor:
    """Encode ``tensor`` losslessly into a 1-D uint8 self-describing payload.

    The payload holds everything ``decode`` needs (format version, codec,
    dtype, shape, stream lengths), so any backend on any rank decodes it;
    every backend writes the same bytes for the same input.

    Args:
        tensor (torch.Tensor): bf16, fp16 or fp32, of at most
            ``format.MAX_NDIM`` dims, on a device the backend runs on (a
            non-contiguous one is copied first; autograd records nothing).
        codec (str): "dense" (tiered prefix code: fewer bytes), "fixed3"
            (fixed 3-bit codes: faster), "raw" (framing only) or "auto"
            ("dense").
        backend (str): "auto" (Triton on CUDA, C++ else torch on CPU),
            "torch", "cpp" or "triton".
        verify (bool): append a checksum per 4096 elements of the input,
            which ``decode`` checks on what it produced (4 bytes each).
        room (int): when > 0, the payload is a view at the start of a buffer
            of at least ``room`` bytes that holds nothing else, so a caller
            that sends it padded (an all-gather slot is as wide as the
            largest payload) pads it in place; the bytes past the payload
            are not written.

    Returns:
        torch.Tensor: the payload, 1-D uint8 on the tensor's device, at most
        ``max_encoded_nbytes(tensor.numel(), tensor.dtype, codec,
        ndim=tensor.dim(), verify=verify)`` bytes.

    Raises:
        TypeError: ``tensor`` is not a tensor, or of a dtype the codec does
            not code.
        ValueError: an unknown codec or backend, a backend that cannot run
            on the tensor's device, too many dims, or a bad ``room``.

    Example::

        >>> x = torch.randn(1000, dtype=torch.bfloat16)
        >>> payload = zipccl_fsdp.encode(x)
        >>> torch.equal(zipccl_fsdp.decode(payload).view(torch.int16), x.view(torch.int16))
        True
    """
    # The argument checks as one test, true for every valid call; the checks
    # that name what is wrong run only when it is false, in this order.
    if not (isinstance(tensor, torch.Tensor) and tensor.dtype in F.DTYPES
            and (codec in CODECS or codec == "auto") and tensor.dim() <= F.MAX_NDIM
            and type(room) is int and room >= 0 and in_memory(tensor)):
        _check_encode_args(tensor, codec, room)
    if codec == "auto":
        codec = DEFAULT_CODEC
    # detach() only when autograd could record (a new tensor object per call otherwise)
    x = tensor.detach() if tensor.requires_grad else tensor
    if not x.is_contiguous():
        x = x.contiguous()
    module = backends.module(backend, x.device, x.dtype, codec)
    checksums = verify and getattr(module, "CHECKSUMS", False)
    # a backend with ROOM makes the room itself, unless a pass here follows it
    own_room = room > 0 and getattr(module, "ROOM", False) and (checksums or not verify)
    kwargs = {"room": room} if own_room else {}
    if checksums:
        payload = module.encode(x, codec, verify=True, **kwargs)
    else:
        payload = module.encode(x, codec, **kwargs)
        if verify:
            payload = _add_checksums(payload, x)
    if room > payload.numel() and not own_room:
        buffer = torch.empty(room, dtype=torch.uint8, device=payload.device)
        buffer[:payload.numel()].copy_(payload)
        payload = buffer[:payload.numel()]
    return payload


_STRIDED = torch.strided


def in_memory(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements lie in memory of its own, where a backend reads
    them by address: a strided tensor with a storage (a plain tensor, a
    ``Parameter``, a subclass made with ``_make_subclass``). Not a wrapper
    subclass (``TwoTensor``, FSDP2's all-gather extensions, torchao's float8:
    their storage is empty and ``data_ptr()`` is 0), a fake, meta or sparse
    tensor. What the codec's front door asks of every tensor before any
    backend sees it, and the collectives of the tensors they would encode or
    decode (those that fail it go to torch, which dispatches them)."""
    if type(t) is torch.Tensor:
        return t.layout is _STRIDED and not t.is_meta
    if t.layout is not _STRIDED or t.is_meta:
        return False
    try:
        storage = t.untyped_storage()
        return storage.data_ptr() != 0 or storage.nbytes() == 0
    except (RuntimeError, NotImplementedError):
        return False


def _check_in_memory(t: torch.Tensor, name: str) -> None:
    if not in_memory(t):
        raise TypeError(
            f"{name} is a {type(t).__name__} ({t.layout}, on {t.device}) whose elements are not "
            f"in memory of its own, which the codec reads by address: pass a plain strided "
            f"tensor (for a wrapper tensor subclass, the plain tensors it holds)")


def _check_encode_args(tensor, codec, room) -> None:
    """encode's argument checks, each with its error."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"encode takes a torch.Tensor, got {type(tensor).__name__}")
    _check_in_memory(tensor, "the tensor to encode")
    F.dtype_info(tensor.dtype)
    _check_codec(codec)
    if tensor.dim() > F.MAX_NDIM:
        raise ValueError(f"tensors of up to {F.MAX_NDIM} dims are supported, got {tensor.dim()}")
    if type(room) is not int or room < 0:
        raise ValueError(f"room must be an int of at least 0 (bytes), got {room!r}")


def _check_no_overlap(payload: torch.Tensor, out: torch.Tensor) -> None:
    """Every backend reads the payload while it writes ``out``, chunk by chunk
    and in parallel, so a shared byte would be read after it was overwritten on
    some backends and not others: refuse it, the same way on all of them."""
    if _apart(payload, out) or out.numel() == 0 or payload.numel() == 0:
        return
    p0, o0 = payload.data_ptr(), out.data_ptr()
    raise ValueError(f"out (bytes {o0:#x}..{o0 + out.nbytes:#x}) overlaps the payload (bytes "
                     f"{p0:#x}..{p0 + payload.nbytes:#x}); decode into a separate buffer")


def _apart(payload: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether the byte ranges of ``payload`` and ``out`` are apart (the
    common case, asked first; an empty tensor shares no byte either)."""
    p0, o0 = payload.data_ptr(), out.data_ptr()
    return p0 + payload.nbytes <= o0 or o0 + out.nbytes <= p0


def decode(payload: torch.Tensor, *, out: torch.Tensor | None = None,
           backend: BackendName = "auto") -> torch.Tensor:
    """Decode a payload back into the exact tensor (dtype, shape, every bit).

    Every field of the payload is checked before it is trusted (header, chunk
    table, offsets, padding, and the checksums when ``encode(verify=True)``
    added them), so a damaged or forged payload raises instead of returning
    a wrong tensor or allocating what its header claims.

    Args:
        payload (torch.Tensor): 1-D uint8, as ``encode`` returned it.
        out (torch.Tensor, optional): where to write the result: the
            payload's dtype and numel, contiguous, on the payload's device,
            sharing no byte with it. None allocates a new tensor of the
            payload's shape on the payload's device.
        backend (str): "auto", "torch", "cpp" or "triton", as for ``encode``.

    Returns:
        torch.Tensor: ``out`` when given, else the new tensor.

    Raises:
        CorruptPayloadError: the payload is damaged, truncated or forged.
        ValueError: ``out`` does not fit the payload (dtype, numel, device,
            not contiguous, overlapping it), or an unknown or unusable
            backend.

    Example::

        >>> payload = zipccl_fsdp.encode(x, codec="fixed3", verify=True)
        >>> y = torch.empty_like(x)
        >>> zipccl_fsdp.decode(payload, out=y) is y
        True
    """
    if isinstance(payload, torch.Tensor) and not in_memory(payload):
        _check_in_memory(payload, "the payload")
    if isinstance(out, torch.Tensor) and not in_memory(out):
        _check_in_memory(out, "out")
    module = None
    if out is not None and isinstance(payload, torch.Tensor) and out.dtype in F.DTYPES:
        device = payload.device
        module = backends.module(backend, device, out.dtype)  # None: it depends on the codec
        if getattr(module, "DEVICE_HEADER", False):
            return _decode_device_header(module, payload, out, device)
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
        _check_no_overlap(payload, out)
    if module is None:
        module = backends.module(backend, payload.device, header.dtype, header.codec)
    if not header.flags & F.HEADER_FLAG_CHECKSUM:
        return module.decode(payload, header, out)
    # Backends see the payload without its checksums; we check them after.
    plain = dataclasses.replace(header, flags=0)
    body = payload[:header.sums_offset]
    if getattr(module, "CHECKSUMS", False):
        sums = torch.empty(4 * header.nsums, dtype=torch.uint8, device=payload.device)
        module.decode(body, plain, out, sums=sums)
    else:
        module.decode(body, plain, out)
        sums = _sums_bytes(chunk_sums(out))
    _check_checksums(payload, header, sums)
    return out


def _decode_device_header(module, payload: torch.Tensor, out: torch.Tensor,
                          device: torch.device) -> torch.Tensor:
    """decode(payload, out=out) on a backend that checks the header on the
    device against ``out`` (the Triton one): nothing is read back before its
    kernel; the payload's dtype, numel and integrity are checked there, and
    a mismatch raises here after the launch, as the host path would
    (``device``: the payload's).

    The host's checks of the arguments are asked as one test, in their
    order, true for every valid call; the checks that name what is wrong
    run only when it is false."""
    if not (payload.dtype is torch.uint8 and payload.dim() == 1 and out.is_contiguous()
            and out.device == device and _apart(payload, out)):
        _check_device_header_args(payload, out)
    if module.decode_into(payload, out):  # the payload carries checksums
        header = F.parse_header(payload)
        _check_checksums(payload, header, _sums_bytes(chunk_sums(out)))
    return out


def _check_device_header_args(payload: torch.Tensor, out: torch.Tensor) -> None:
    """The checks of _decode_device_header's one test, each with its error."""
    if payload.dtype != torch.uint8 or payload.dim() != 1:
        raise TypeError(f"payload must be a 1-D uint8 tensor, got {payload.dtype} "
                        f"with shape {tuple(payload.shape)}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    if out.device != payload.device:
        raise ValueError(f"out is on {out.device}, payload on {payload.device}")
    _check_no_overlap(payload, out)


def max_encoded_nbytes(numel: int, dtype: torch.dtype, codec: str = "auto",
                       ndim: int | None = None, verify: bool = False) -> int:
    """Upper bound on ``encode(t).numel()`` for every tensor ``t`` of ``numel``
    elements of ``dtype``: of ``ndim`` dims, or of any number of dims (up to
    format.MAX_NDIM) when ``ndim`` is None. Raises ValueError for a numel that
    is not a non-negative integer or an ndim outside [0, MAX_NDIM]."""
    codec = _check_codec(codec)
    return F.max_encoded_nbytes(numel, dtype, ndim, verify)


__all__ = ["CODECS", "BACKENDS", "encode", "decode", "max_encoded_nbytes", "in_memory",
           "CorruptPayloadError"]
