"""Decode: ``decode(payload, header, out) -> out`` for any valid payload, from
any backend; ``CorruptPayloadError`` for anything else.

The header is parsed on the host (``format.parse_header``, by the caller).
Then, with no host sync until the end:

1. ``_table_kernel`` checks every chunk-table entry with the rules of
   ``format.validate_table`` and computes each chunk's segment lengths
   (``format.segment_nbytes``), stream by stream: ``seg[s * nchunks + c]``;
   a bad entry sets bit ERR_TABLE of an error word.
2. One flat ``torch.cumsum`` of ``seg`` gives every segment's offset from the
   start of the streams (see codec_encode.py for why it is flat).
3. The codec's decode kernel (fixed3_decode.py, dense_decode.py), one
   program per chunk, checks the stream ends against the header (program
   0), decodes the codes, checks the decoded (tier-open,) escape and zero
   counts against the table and the exponent range, and writes the words.
   Every load is masked to its chunk's segment and to its stream's end in
   the header, so no payload, however corrupt, reads out of bounds; nothing
   is decoded when the table is invalid.
4. One host sync reads the error word and raises.

The table is validated on the device rather than with format.validate_table
on the host: that function runs a few dozen small torch ops plus a sync,
host time comparable to the whole decode of a large tensor. On the
error path the host functions are called, so the messages are the torch
backend's.

A payload whose table is valid but whose codes are corrupt may leave ``out``
partially written before the error is raised.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from zipccl_fsdp import format as F
from zipccl_fsdp.errors import CorruptPayloadError

from ._codec_common import (ERR_COUNTS, ERR_EXPONENT, ERR_TABLE, ERR_TIERS, ERR_TOTALS, FIXED3,
                            dense_codes_nbytes, kernel_constexprs, load_entry)
from ._launch import Launcher
from .dense_decode import dense_decode_kernel
from .fixed3_decode import fixed3_decode_kernel

_INT_VIEW = {2: torch.int16, 4: torch.int32}
# (elements per sub-block, warps) of the decode kernel, by codec (see
# SETTINGS in codec_encode.py).
SETTINGS = {"fixed3": (512, 2), "dense": (256, 1)}
_KERNELS = {"fixed3": fixed3_decode_kernel, "dense": dense_decode_kernel}
TABLE_BLOCK = 256  # chunk-table entries per program of _table_kernel; the table is tiny


@triton.jit
def _table_kernel(p_ptr, seg_ptr, err_ptr, table_off, nch, numel, C,
                  CODEC: tl.constexpr, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                  BLOCK: tl.constexpr):
    cid = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = cid < nch
    mode, flags, base, phase, nz, nesc, o1, o2, o3, o4 = load_entry(
        p_ptr + table_off + cid.to(tl.int64) * 16, live)
    n = tl.minimum(numel - cid.to(tl.int64) * C, C).to(tl.int32)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5

    # format.validate_table, entry by entry.
    bad = (mode > 1) | (phase > 3) | (base > EMAX) | ((flags & ~3) != 0)
    if ITEMSIZE != 4:
        bad = bad | ((flags & 1) != 0)
    bad = bad | (nz > n) | (nesc > n)
    is_raw = mode == 0
    bad = bad | (is_raw & ((base | phase | flags | nz | nesc | o1 | o2 | o3 | o4) != 0))
    if CODEC == FIXED3:
        bad = bad | ((o1 | o2 | o3 | o4) != 0) | (((flags & 2) == 0) & (nz != 0))
    else:
        bad = bad | (o1 > n) | (o2 > o1) | (o3 > o2) | (o4 > o3) | (nesc > o4)
    bad = bad & live
    tl.atomic_or(err_ptr, 1, mask=tl.max(bad.to(tl.int32), axis=0) != 0)

    # format.segment_nbytes (clamped at 0 so offsets stay monotone for bad entries).
    coded = mode == 1
    kept = tl.maximum(n - nz, 0)
    if CODEC == FIXED3:
        codes_nb = (3 * n + 7) >> 3
    else:
        codes_nb = dense_codes_nbytes(n, o1, o2, o3, o4)
    smb = 1
    if ITEMSIZE == 4:
        smb = tl.where((flags & 1) != 0, 1, 3)
    sm_nb = tl.where(coded, kept * smb, n * ITEMSIZE)
    rem_nb = 0
    if IS_FP16:
        rem_nb = (3 * kept + 7) >> 3
    tl.store(seg_ptr + cid, tl.where(coded, codes_nb, 0).to(tl.int64), mask=live)
    tl.store(seg_ptr + nch + cid, tl.maximum(sm_nb, 0).to(tl.int64), mask=live)
    tl.store(seg_ptr + 2 * nch + cid, tl.where(coded, rem_nb, 0).to(tl.int64), mask=live)
    tl.store(seg_ptr + 3 * nch + cid, tl.where(coded, nesc, 0).to(tl.int64), mask=live)


_MESSAGES = {
    ERR_TIERS.value: "dense tier open counts disagree with the table",
    ERR_COUNTS.value: "decoded escape/zero counts disagree with the chunk table",
    ERR_EXPONENT.value: "a code decodes to an exponent outside the dtype",
}


def launch_plan(info: F.DTypeInfo, codec: str, C: int) -> tuple:
    """(kernel, constexprs, num_warps) of the decode launch; cached like
    codec_encode.launch_plan."""
    return _launch_plan(info, codec, C, SETTINGS[codec])


@functools.lru_cache(maxsize=256)
def _launch_plan(info: F.DTypeInfo, codec: str, C: int, setting: tuple) -> tuple:
    sub, warps = setting
    return _KERNELS[codec], kernel_constexprs(info, C, sub), warps


def launchers(info: F.DTypeInfo, codec: str, C: int) -> tuple:
    """The table and decode ``Launcher`` (see codec_encode.launchers)."""
    return _launchers(info, codec, C, SETTINGS[codec])


@functools.lru_cache(maxsize=256)
def _launchers(info: F.DTypeInfo, codec: str, C: int, setting: tuple) -> tuple:
    table = Launcher(_table_kernel, dict(CODEC=F.CODEC_IDS[codec], ITEMSIZE=info.itemsize,
                                         EXP_BITS=info.exp_bits, BLOCK=TABLE_BLOCK), 4)
    return table, Launcher(*_launch_plan(info, codec, C, setting))


def decode(payload: torch.Tensor, header: F.Header, out: torch.Tensor) -> torch.Tensor:
    info = F.DTYPES[header.dtype]
    if header.codec == "raw":
        out.reshape(-1).view(torch.uint8).copy_(payload[header.streams_offset:])
        return out
    numel, C, nch = header.numel, header.chunk_elems, header.nchunks
    if numel == 0:
        return out
    dev = payload.device
    table, dec = launchers(info, header.codec, C)
    seg = torch.empty(4 * nch, dtype=torch.int64, device=dev)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    table(triton.cdiv(nch, TABLE_BLOCK), payload, seg, err, header.table_offset, nch, numel, C)
    cum = torch.cumsum(seg, 0)  # flat: see codec_encode.py
    lens = (header.codes_nbytes, header.sm_nbytes, header.rem_nbytes, header.esc_nbytes)
    ends = [sum(lens[:s + 1]) for s in range(4)]  # from the streams' start
    words = out.reshape(-1).view(_INT_VIEW[info.itemsize])
    dec(nch, payload, seg, cum, words, err, header.table_offset, nch, numel, C,
        header.streams_offset, *ends)
    # Host sync (the only one after parse_header's): the error word.
    bits = int(err.item())
    if bits:
        _raise(bits, payload, header, info, seg, lens)
    return out


def _raise(bits: int, payload, header, info, seg, lens):
    """The torch backend's message for the first failed check, in its order."""
    if bits & ERR_TABLE.value:
        table = F.ChunkTable.from_bytes(payload[header.table_offset:header.streams_offset],
                                        header.nchunks)
        n = F.chunk_lengths(header.numel, header.nchunks, header.chunk_elems, payload.device)
        F.validate_table(header.codec, info, n, table)  # raises with the entry's index
        raise CorruptPayloadError("the chunk table is invalid")
    if bits & ERR_TOTALS.value:
        got = tuple(seg.view(4, -1).sum(1).tolist())
        raise CorruptPayloadError(f"stream lengths {lens} disagree with the chunk table {got}")
    for bit in sorted(_MESSAGES):
        if bits & bit:
            raise CorruptPayloadError(_MESSAGES[bit])
    raise CorruptPayloadError(f"corrupt payload (error bits {bits:#x})")
