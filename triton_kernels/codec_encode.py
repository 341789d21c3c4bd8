"""Encode (format v2): ``encode(x, codec) -> payload``, byte-identical to
codec_torch.encode, in one kernel per call and one host sync.

The codec's kernel (fixed3_encode.py, dense_encode.py) runs one program per
chunk: each reads its chunk once, writes its table entry, places its segment
by the decoupled look-back over ``status`` (_lookback.py: no prefix sum in
a kernel of its own, no host read between kernels) and writes it, padding
included; the last chunk's program stores the body length. The payload is
allocated at its bound (``format.max_encoded_nbytes`` for x's ndim) before
the launch, so nothing the kernel computes is needed to allocate.

Host syncs: one. The body length is the value the host needs (the payload's
size, and the header's ``body_nbytes``): it is read once, after the kernel,
through pinned memory (``_read_units``). The header, which holds that length
and a CRC-32 over it, is then written by a stream-ordered copy from pinned
memory (``Header.copy_into``) rather than on the device: the host has the
length anyway, and a device-side CRC would put a serial loop of some
hundreds of steps, or a per-ndim table upload, at the end of every encode.
Work queued after ``encode`` on the stream sees the header.

Scratch: one int64 buffer (the ticket counter, the body length, one
look-back status word per chunk), zeroed by one memset per call. Each thread
keeps its buffers per (device, chunk count) across calls (``_take_scratch``):
a call takes its buffer out of the thread's cache and puts it back only
after its length read, when the kernel is done, so no two calls in flight
share one (another thread, another stream, a call that raised).

Host work per call is otherwise the payload's allocation, the launch
(``_launch.Bound``: the plan's int arguments and their key computed once),
the length read and the header: what depends on the data.
"""
from __future__ import annotations

import ctypes
import functools
import math
import threading
from typing import NamedTuple

import torch

from zipccl_fsdp import format as F

from ._codec_common import tile_shape
from ._launch import Bound, Launcher
from .fixed3_encode import fixed3_encode_kernel

_INT_VIEW = {2: torch.int16, 4: torch.int32}
# Warps per program, by codec (gpu_check.py --sweep may change it at run time).
SETTINGS = {"fixed3": 4, "dense": 4}


def _dense_kernel():
    """The dense v2 encode kernel (dense_encode.py), or None when this build
    has only an older one."""
    from . import dense_encode
    k = getattr(dense_encode, "dense_encode_kernel", None)
    return k if k is not None and "ticket_ptr" in getattr(k, "arg_names", ()) else None


def launch_plan(info: F.DTypeInfo, codec: str, C: int) -> tuple:
    """(kernel, constexprs, num_warps) of the encode launch."""
    return _launch_plan(info, codec, C, SETTINGS[codec])


@functools.lru_cache(maxsize=256)
def _launch_plan(info: F.DTypeInfo, codec: str, C: int, warps: int) -> tuple:
    cp, t = tile_shape(C, warps)
    const = dict(ITEMSIZE=info.itemsize, EXP_BITS=info.exp_bits, MAN_BITS=info.man_bits)
    if codec == "fixed3":
        return fixed3_encode_kernel, dict(const, CP=cp, T=t), warps
    kernel = _dense_kernel()
    if kernel is None:
        raise NotImplementedError("the Triton dense encoder of this build is not format v2")
    if C != 32 * 32 * warps:  # 32 elements a thread (dense_decode.py's tile)
        raise NotImplementedError(f"the Triton dense kernels take chunks of "
                                  f"{32 * 32 * warps} elements, not {C}")
    return kernel, dict(const, C=C, T=32 * warps), warps


@functools.lru_cache(maxsize=256)
def _launcher(info: F.DTypeInfo, codec: str, C: int, warps: int) -> Launcher:
    return Launcher(*_launch_plan(info, codec, C, warps))


def launcher(info: F.DTypeInfo, codec: str, C: int) -> Launcher:
    """The encode ``Launcher`` (compiled kernels and fixed arguments kept per
    dtype, codec and chunk size; the size class is the specialization key
    each Launcher keeps)."""
    return _launcher(info, codec, C, SETTINGS[codec])


def launch_args(kernel, x_words, out, scratch, numel, nch, C, header) -> tuple:
    """The kernel's runtime arguments in order."""
    return _tensor_args(x_words, out, scratch) + _int_args(kernel, numel, nch, C, header)


def _tensor_args(x_words, out, scratch) -> tuple:
    """The input, the payload, and the scratch as the ticket, the look-back
    status words and the body length (the kernel's order; one native split
    costs less host time than three slices)."""
    ticket, total, status = scratch.split_with_sizes([1, 1, scratch.numel() - 2])
    return x_words, out, ticket.view(torch.int32), status, total


def _int_args(kernel, numel, nch, C, header) -> tuple:
    """The int arguments (the dense kernel takes the chunk size as a
    constexpr, fixed3 as an argument)."""
    offs = (header.table_offset, header.offsets_offset, header.body_offset)
    return (numel, nch) + ((C,) if kernel is fixed3_encode_kernel else ()) + offs


def _words(x: torch.Tensor, word: torch.dtype) -> torch.Tensor:
    """x's elements as integer words (a kernel indexes them flat, so a
    contiguous x of any shape is viewed in place)."""
    return x.view(word) if x.is_contiguous() else x.reshape(-1).view(word)


class _Plan(NamedTuple):
    """What an encode of one dtype, codec and shape launches with, computed
    once (the host work per call is then allocations, the launch, the length
    read and the header's CRC)."""
    launch: Bound  # the int arguments (``ints``) bound
    nch: int
    bound: int  # payload bytes allocated: format.max_encoded_nbytes for this ndim
    body_offset: int
    ints: tuple
    head: F.HeaderBytes
    word: torch.dtype


def _check_size(numel: int, info: F.DTypeInfo) -> None:
    if numel * info.itemsize > F.MAX_BODY_NBYTES - F.ALIGN:
        raise ValueError(f"a tensor of {numel * info.itemsize} bytes exceeds what format "
                         f"version {F.VERSION} addresses ({F.MAX_BODY_NBYTES - F.ALIGN} bytes)")


@functools.lru_cache(maxsize=1024)
def _plan(dtype: torch.dtype, codec: str, shape: tuple, C: int, warps: int) -> _Plan:
    info = F.dtype_info(dtype)
    numel = math.prod(shape)
    _check_size(numel, info)  # raises each call: lru_cache keeps no exception
    nch = F.nchunks_for(numel, C)
    header = F.Header(codec, dtype, tuple(shape), numel, C, nch, 0)
    launch = _launcher(info, codec, C, warps)
    # The bound of format.max_encoded_nbytes, for this chunk size: a chunk
    # never takes more than its raw bytes rounded up to 16, and C * itemsize
    # is a multiple of 16 (C % 8 == 0).
    bound = header.body_offset + F.align16(numel * info.itemsize)
    ints = _int_args(launch.kernel, numel, nch, C, header)
    return _Plan(launch.bind(ints), nch, bound, header.body_offset, ints, F.HeaderBytes(header),
                 _INT_VIEW[info.itemsize])


_PINNED: dict = {}
_TLS = threading.local()
SCRATCH_KEPT = 16  # scratch buffers a thread keeps (distinct chunk counts)


class _Scratch(NamedTuple):
    words: torch.Tensor  # int64: ticket, body length, status words
    total: torch.Tensor  # words[1:2]
    address: int
    cuda: bool


def _take_scratch(device: torch.device, nch: int) -> _Scratch:
    """A zeroed scratch buffer of nch + 2 words on ``device``, this thread's
    (its cache holds it only between calls)."""
    kept = _TLS.__dict__.get("scratch")
    if kept is None:
        kept = _TLS.scratch = {}
    got = kept.pop((device, nch), None)
    if got is None:
        words = torch.zeros(nch + 2, dtype=torch.int64, device=device)
        return _Scratch(words, words[1:2], words.data_ptr(), device.type == "cuda")
    got.words.zero_()
    return got


def _keep_scratch(device: torch.device, nch: int, got: _Scratch) -> None:
    """Back into this thread's cache, once the kernel that used it is done."""
    kept = _TLS.scratch
    if len(kept) < SCRATCH_KEPT:
        kept[(device, nch)] = got


def _read_units(scratch: _Scratch) -> int:
    """The body length in 16-byte units: the call's one device-to-host read,
    through a pinned buffer (one per device, reused: the read waits for it)."""
    total = scratch.total
    if not scratch.cuda:
        return int(total.item())
    got = _PINNED.get(total.device)
    if got is None:
        buf = torch.empty(1, dtype=torch.int64, pin_memory=True)
        # the value, read from host memory without a torch op
        got = _PINNED[total.device] = (buf, ctypes.c_int64.from_address(buf.data_ptr()))
    got[0].copy_(total)  # to pinned memory, not non_blocking: waits for the current stream
    return got[1].value


def encode(x: torch.Tensor, codec: str) -> torch.Tensor:
    if x.numel() == 0 or codec == "raw":
        info = F.dtype_info(x.dtype)
        _check_size(x.numel(), info)
        return _encode_trivial(x, codec, info)
    plan = _plan(x.dtype, codec, x.shape, F.CHUNK_ELEMS, SETTINGS[codec])
    if not x.is_contiguous():
        x = x.reshape(-1)
    device = x.device
    out = torch.empty(plan.bound, dtype=torch.uint8, device=device)
    scratch = _take_scratch(device, plan.nch)
    # The kernel's pointers as addresses (no views; see _tensor_args for the
    # tensors): the ticket at word 0, the body length at 1, the status from 2.
    s = scratch.address
    plan.launch(plan.nch, (x.data_ptr(), out.data_ptr(), s, s + 16, s + 8), _launch_tensors, x,
                out, scratch.words, plan)
    body = F.ALIGN * _read_units(scratch)
    _keep_scratch(device, plan.nch, scratch)
    F.copy_header_into(plan.head.with_body(body), out)
    return out[:plan.body_offset + body]


def _launch_tensors(x, out, scratch, plan) -> tuple:
    """The encode launch's arguments with tensors (triton's path)."""
    return _tensor_args(_words(x, plan.word), out, scratch) + plan.ints


def _encode_trivial(x: torch.Tensor, codec: str, info: F.DTypeInfo) -> torch.Tensor:
    """raw (header + the words) and empty tensors: no kernel needed."""
    raw = codec == "raw"
    body = x.numel() * info.itemsize if raw else 0
    header = F.Header(codec, x.dtype, tuple(x.shape), x.numel(), 0 if raw else F.CHUNK_ELEMS,
                      0, body)
    out = torch.empty(header.total_nbytes, dtype=torch.uint8, device=x.device)
    header.copy_into(out)
    if raw:
        out[header.body_offset:].copy_(x.reshape(-1).view(torch.uint8))
    return out
