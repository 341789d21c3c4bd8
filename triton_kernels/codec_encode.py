"""Encode: ``encode(x, codec) -> payload``, byte-identical to codec_torch.encode.

Two kernels per codec, one program per chunk of ``CHUNK_ELEMS`` elements
(fixed3_encode.py, dense_encode.py):

1. *analyze* reads the chunk, computes its locator, flags, counts and
   raw-or-coded decision into a ``(nchunks, 16)`` int32 ``meta`` row, and the
   byte length of its segment in each stream (``format.segment_nbytes``)
   into ``seg``, laid out stream by stream: ``seg[s * nchunks + c]``.
2. One flat ``torch.cumsum`` over ``seg`` gives every segment's offset from
   the start of the streams, since the streams follow each other in that
   order in the payload. (A flat scan: torch scans dim 0 of an (n, 4) tensor
   with one thread per column, far slower on large inputs.) The
   host reads the four stream ends (the one sync: the header holds the
   lengths and the payload is allocated at its exact size).
3. *write* reads the chunk again (cheaper than storing per-element codes
   between the passes), recomputes its codes from ``meta`` and writes its
   table entry and its segments.
"""
from __future__ import annotations

import functools

import torch

from zipccl_fsdp import format as F

from ._codec_common import kernel_constexprs
from ._launch import Launcher
from .dense_encode import dense_analyze_kernel, dense_write_kernel
from .fixed3_encode import fixed3_analyze_kernel, fixed3_write_kernel

_INT_VIEW = {2: torch.int16, 4: torch.int32}
META_COLS = 16  # mode flags base phase n_zero n_esc open1..4, then 6 unused (a power of 2)
_KERNELS = {"fixed3": (fixed3_analyze_kernel, fixed3_write_kernel),
            "dense": (dense_analyze_kernel, dense_write_kernel)}
# (elements per sub-block, warps) of each kernel, by codec. fixed3's analyze
# holds a whole 4096-element chunk in registers so its second pass reads no
# memory. Static costs: benchmarks/kernel_cost.py; gpu_check.py --sweep times
# alternatives on a GPU (it overrides this table).
SETTINGS = {
    "fixed3": {"analyze": (4096, 4), "write": (512, 2)},
    "dense": {"analyze": (4096, 4), "write": (256, 1)},
}


def launch_plan(info: F.DTypeInfo, codec: str, C: int) -> tuple:
    """(kernel, constexprs, num_warps) of the analyze and the write launch.
    Cached: the key holds the SETTINGS entry, which gpu_check.py --sweep
    changes at run time."""
    s = SETTINGS[codec]
    return _launch_plan(info, codec, C, s["analyze"], s["write"])


@functools.lru_cache(maxsize=256)
def _launch_plan(info: F.DTypeInfo, codec: str, C: int, *settings: tuple) -> tuple:
    return tuple((kernel, kernel_constexprs(info, C, sub), warps)
                 for kernel, (sub, warps) in zip(_KERNELS[codec], settings))


def pairs(kernel, const, info: F.DTypeInfo, numel: int, C: int, data_ptr: int) -> bool:
    """Whether a kernel reads 16-bit words as int32 pairs (PAIRS): the input
    must be 4-byte aligned; fixed3's write kernel does in its full chunks,
    both analyze kernels (which also test them two at a time) when every
    chunk's length is even and a chunk is one sub-block."""
    if info.itemsize != 2 or C % 8 or data_ptr % 4:
        return False
    return kernel is fixed3_write_kernel or (
        kernel in (fixed3_analyze_kernel, dense_analyze_kernel) and numel % 2 == 0
        and const["NSUB"] == 1)


def with_pairs(kernel, const: dict, info: F.DTypeInfo, numel: int, C: int,
               data_ptr: int) -> dict:
    """``const`` with PAIRS set where ``pairs`` says so."""
    return dict(const, PAIRS=True) if pairs(kernel, const, info, numel, C, data_ptr) else const


def launchers(info: F.DTypeInfo, codec: str, C: int, a_pairs: bool, w_pairs: bool) -> tuple:
    """The analyze and write ``Launcher`` (compiled kernels and their fixed
    arguments kept per dtype, codec, chunk size and PAIRS; the size class is
    the specialization key each Launcher keeps)."""
    s = SETTINGS[codec]
    return _launchers(info, codec, C, a_pairs, w_pairs, s["analyze"], s["write"])


@functools.lru_cache(maxsize=256)
def _launchers(info, codec, C, a_pairs, w_pairs, *settings) -> tuple:
    return tuple(Launcher(kernel, dict(const, PAIRS=True) if p else const, warps)
                 for (kernel, const, warps), p in zip(_launch_plan(info, codec, C, *settings),
                                                      (a_pairs, w_pairs)))


def encode(x: torch.Tensor, codec: str) -> torch.Tensor:
    info = F.dtype_info(x.dtype)
    numel = x.numel()
    dev = x.device
    C = F.CHUNK_ELEMS
    if codec == "raw" or numel == 0:
        return _encode_trivial(x, codec, info)
    nch = F.nchunks_for(numel, C)
    words = x.reshape(-1).view(_INT_VIEW[info.itemsize])
    (analyze, a_const, _), (write, w_const, _) = launch_plan(info, codec, C)
    ptr = words.data_ptr()
    a_launch, w_launch = launchers(info, codec, C, pairs(analyze, a_const, info, numel, C, ptr),
                                   pairs(write, w_const, info, numel, C, ptr))
    meta = torch.empty((nch, META_COLS), dtype=torch.int32, device=dev)
    seg = torch.empty(4 * nch, dtype=torch.int32, device=dev)
    a_launch(nch, words, meta, seg, numel, nch, C)
    cum = torch.cumsum(seg, 0, dtype=torch.int64)
    # Host sync (the only one): the header carries the stream lengths and the
    # payload is allocated at its exact size.
    ends = cum.view(4, nch)[:, -1].tolist()
    codes_nb, sm_nb, rem_nb, esc_nb = (ends[0], ends[1] - ends[0], ends[2] - ends[1],
                                       ends[3] - ends[2])
    header = F.Header(codec, x.dtype, tuple(x.shape), numel, C, nch, codes_nb, sm_nb, rem_nb,
                      esc_nb)
    out = torch.empty(header.total_nbytes, dtype=torch.uint8, device=dev)
    header.copy_into(out)
    w_launch(nch, words, meta, seg, cum, out, numel, nch, C, header.table_offset,
             header.streams_offset)
    return out


def _encode_trivial(x: torch.Tensor, codec: str, info: F.DTypeInfo) -> torch.Tensor:
    """raw (header + the words) and empty tensors: no kernel needed."""
    raw = codec == "raw"
    body = x.numel() * info.itemsize if raw else 0
    header = F.Header(codec, x.dtype, tuple(x.shape), x.numel(), 0 if raw else F.CHUNK_ELEMS,
                      0, 0, body, 0, 0)
    out = torch.empty(header.streams_offset + body, dtype=torch.uint8, device=x.device)
    header.copy_into(out)
    if raw:
        out[header.streams_offset:].copy_(x.reshape(-1).view(torch.uint8))
    return out
