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
3. ``_decode_kernel``, one program per chunk, checks the stream ends against
   the header (program 0), decodes the codes, checks the decoded tier-open,
   escape and zero counts against the table and the exponent range, and
   writes the words. It walks the chunk in sub-blocks like the encoder. Every
   load is masked to its chunk's segment and to its stream's end in the
   header, so no payload, however corrupt, reads out of bounds; nothing is
   decoded when the table is invalid.
4. One host sync reads the error word and raises.

The table is validated on the device rather than with format.validate_table
on the host: that function runs ~25 small torch ops plus a sync, over 100 us
of host time per call where the 256 MiB decode target is ~180 us. On the
error path the host functions are called, so the messages are the torch
backend's.

A payload whose table is valid but whose codes are corrupt may leave ``out``
partially written before the error is raised.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from zipccl_fsdp import format as F
from zipccl_fsdp.errors import CorruptPayloadError

from . import _codec_common as K
from ._codec_common import FIXED3, dense_symbols, fixed_window, join_fields

_INT_VIEW = {2: torch.int16, 4: torch.int32}
# Bits of the error word the kernels set (constexpr: the kernels read them).
ERR_TABLE = tl.constexpr(1)
ERR_TOTALS = tl.constexpr(2)
ERR_TIERS = tl.constexpr(4)
ERR_COUNTS = tl.constexpr(8)
ERR_EXPONENT = tl.constexpr(16)
# Not tuned yet (see SUB_ELEMS in codec_encode.py): sub-blocks of 1024
# elements over 4 warps compile without spills (ptxas -v, sm_90a).
SUB_ELEMS = 1024
NUM_WARPS_DECODE = 4
TABLE_BLOCK = 256  # chunk-table entries per program of _table_kernel; the table is tiny


@triton.jit
def _load_entry(row, mask):
    """The ten fields of chunk-table entries at ``row`` (scalar or vector of pointers)."""
    mode = tl.load(row, mask=mask, other=0).to(tl.int32)
    flags = tl.load(row + 1, mask=mask, other=0).to(tl.int32)
    base = tl.load(row + 2, mask=mask, other=0).to(tl.int32)
    phase = tl.load(row + 3, mask=mask, other=0).to(tl.int32)
    nz = tl.load(row + 4, mask=mask, other=0).to(tl.int32) | (
        tl.load(row + 5, mask=mask, other=0).to(tl.int32) << 8)
    nesc = tl.load(row + 6, mask=mask, other=0).to(tl.int32) | (
        tl.load(row + 7, mask=mask, other=0).to(tl.int32) << 8)
    o1 = tl.load(row + 8, mask=mask, other=0).to(tl.int32) | (
        tl.load(row + 9, mask=mask, other=0).to(tl.int32) << 8)
    o2 = tl.load(row + 10, mask=mask, other=0).to(tl.int32) | (
        tl.load(row + 11, mask=mask, other=0).to(tl.int32) << 8)
    o3 = tl.load(row + 12, mask=mask, other=0).to(tl.int32) | (
        tl.load(row + 13, mask=mask, other=0).to(tl.int32) << 8)
    o4 = tl.load(row + 14, mask=mask, other=0).to(tl.int32) | (
        tl.load(row + 15, mask=mask, other=0).to(tl.int32) << 8)
    return mode, flags, base, phase, nz, nesc, o1, o2, o3, o4


@triton.jit
def _dense_codes_nbytes(n, o1, o2, o3, o4):
    return (((2 * n + 7) >> 3) + ((o1 * K.T1_BITS + 7) >> 3) + ((o2 * K.T2_BITS + 7) >> 3)
            + ((o3 * K.T3_BITS + 7) >> 3) + ((o4 * K.T4_BITS + 7) >> 3))


@triton.jit
def _table_kernel(p_ptr, seg_ptr, err_ptr, table_off, nch, numel, C,
                  CODEC: tl.constexpr, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                  BLOCK: tl.constexpr):
    cid = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = cid < nch
    mode, flags, base, phase, nz, nesc, o1, o2, o3, o4 = _load_entry(
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
        codes_nb = _dense_codes_nbytes(n, o1, o2, o3, o4)
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


@triton.jit
def _decode_tier(src, part_off, part_len, stream_len, rank, is_open, before,
                 BITS: tl.constexpr, CAP: tl.constexpr):
    """Read one dense tier for a sub-block: the open elements' digits, in
    order, from a packed part of part_len bytes at part_off of the codes
    stream; ``before`` open elements of this tier came in earlier sub-blocks."""
    G: tl.constexpr = 8 // BITS
    LOG2G: tl.constexpr = 4 - BITS  # BITS is 1 or 2 (asserted in _codec_common)
    opened = is_open.to(tl.int32)
    pos = before + tl.cumsum(opened, 0) - 1
    local = pos >> LOG2G
    idx = part_off + local
    byte = tl.load(src + idx, mask=is_open & (local < part_len) & (idx < stream_len),
                   other=0).to(tl.int32)
    digit = (byte >> ((pos & (G - 1)) * BITS)) & CAP  # CAP = 2**BITS - 1: all ones
    return (rank + tl.where(is_open, digit, 0), is_open & (digit == CAP),
            before + tl.sum(opened, axis=0))


@triton.jit
def _load_packed3(src, off, seg_len, stream_len, k, SUB: tl.constexpr):
    """The 3-bit values of sub-block k of a packed segment (value i at bit 3i)."""
    g = tl.arange(0, SUB // 8)
    b = tl.arange(0, 4)
    at = k * (SUB * 3 // 8) + 3 * g[:, None] + b[None, :]
    idx = off + at
    byte = tl.load(src + idx, mask=(b[None, :] < 3) & (at < seg_len) & (idx < stream_len),
                   other=0).to(tl.int32)
    acc = tl.sum(byte << (8 * b[None, :]), axis=1)
    return tl.reshape((acc[:, None] >> (3 * tl.arange(0, 8))[None, :]) & 7, (SUB,))


@triton.jit
def _decode_kernel(p_ptr, seg_ptr, cum_ptr, out_ptr, err_ptr, table_off, nch, numel, C,
                   streams_off, codes_end, sm_end, rem_end, esc_end,
                   CODEC: tl.constexpr, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                   MAN_BITS: tl.constexpr, SUB: tl.constexpr, NSUB: tl.constexpr):
    c = tl.program_id(0)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    if c == 0:
        # Stream ends (from the streams' start) per the table, against the header.
        off = ((tl.load(cum_ptr + nch - 1) != codes_end)
               | (tl.load(cum_ptr + 2 * nch - 1) != sm_end)
               | (tl.load(cum_ptr + 3 * nch - 1) != rem_end)
               | (tl.load(cum_ptr + 4 * nch - 1) != esc_end))
        tl.atomic_or(err_ptr, ERR_TOTALS, mask=off)
    # Loaded before the branch on the error word, so their latencies overlap.
    mode, flags, base, phase, nz, nesc, o1, o2, o3, o4 = _load_entry(
        p_ptr + table_off + c.to(tl.int64) * 16, c < nch)
    # Segment offsets from the streams' start (inclusive cumsum minus own
    # length); a load at offset idx of stream s is masked by idx < s's end.
    seg_codes = tl.load(seg_ptr + c)
    seg_sm = tl.load(seg_ptr + nch + c)
    seg_rem = tl.load(seg_ptr + 2 * nch + c)
    seg_esc = tl.load(seg_ptr + 3 * nch + c)
    codes_off = tl.load(cum_ptr + c) - seg_codes
    sm_off = tl.load(cum_ptr + nch + c) - seg_sm
    rem_off = tl.load(cum_ptr + 2 * nch + c) - seg_rem
    esc_off = tl.load(cum_ptr + 3 * nch + c) - seg_esc
    src = p_ptr + streams_off
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)
    dst = out_ptr + start

    # The table kernel ran before this one on the stream: bit ERR_TABLE is final.
    if (tl.load(err_ptr) & ERR_TABLE) == 0:
        if mode == 0:
            for k in range(0, NSUB):
                i = k * SUB + tl.arange(0, SUB)
                valid = i < n
                w = tl.zeros([SUB], tl.int32)
                for b in tl.static_range(ITEMSIZE):
                    at = i * ITEMSIZE + b
                    idx = sm_off + at
                    byte = tl.load(src + idx, mask=valid & (at < seg_sm) & (idx < sm_end),
                                   other=0)
                    w = w | (byte.to(tl.int32) << (8 * b))
                _store_words(dst + i, w, valid, ITEMSIZE)
        else:
            zf = (flags >> 1) & 1
            if CODEC == FIXED3:
                lo, width = fixed_window(base, phase, zf, EMAX)
            else:
                len0 = (2 * n + 7) >> 3
                part1 = codes_off + len0
                part2 = part1 + ((o1 * K.T1_BITS + 7) >> 3)
                part3 = part2 + ((o2 * K.T2_BITS + 7) >> 3)
                part4 = part3 + ((o3 * K.T3_BITS + 7) >> 3)
                # Open elements of tiers 1..4 in earlier sub-blocks.
                t1 = tl.zeros([], tl.int32)
                t2 = tl.zeros([], tl.int32)
                t3 = tl.zeros([], tl.int32)
                t4 = tl.zeros([], tl.int32)
            q_base = tl.zeros([], tl.int32)  # kept elements | escapes << 16 so far
            zeros_got = tl.zeros([], tl.int32)
            bad_exp = tl.zeros([], tl.int32)
            low16 = flags & 1
            for k in range(0, NSUB):
                j = tl.arange(0, SUB)
                i = k * SUB + j
                valid = i < n
                if CODEC == FIXED3:
                    code = _load_packed3(src, codes_off, seg_codes, codes_end, k, SUB)
                    is_zero = valid & (zf != 0) & (code == 0)
                    esc = valid & (code == 7)
                    e = lo + code - zf
                else:
                    g = k * (SUB // 4) + tl.arange(0, SUB // 4)
                    idx = codes_off + g
                    byte = tl.load(src + idx, mask=(g < len0) & (idx < codes_end),
                                   other=0).to(tl.int32)
                    rank = tl.reshape((byte[:, None] >> (2 * tl.arange(0, 4))[None, :]) & 3,
                                      (SUB,))
                    is_open = valid & (rank == K.T0_CAP)
                    rank, is_open, t1 = _decode_tier(src, part1, (o1 * K.T1_BITS + 7) >> 3,
                                                     codes_end, rank, is_open, t1,
                                                     K.T1_BITS, K.T1_CAP)
                    rank, is_open, t2 = _decode_tier(src, part2, (o2 * K.T2_BITS + 7) >> 3,
                                                     codes_end, rank, is_open, t2,
                                                     K.T2_BITS, K.T2_CAP)
                    rank, is_open, t3 = _decode_tier(src, part3, (o3 * K.T3_BITS + 7) >> 3,
                                                     codes_end, rank, is_open, t3,
                                                     K.T3_BITS, K.T3_CAP)
                    rank, is_open, t4 = _decode_tier(src, part4, (o4 * K.T4_BITS + 7) >> 3,
                                                     codes_end, rank, is_open, t4,
                                                     K.T4_BITS, K.T4_CAP)
                    esc = is_open
                    e, zsym = dense_symbols(rank, base, phase, zf)
                    is_zero = valid & zsym & ~esc
                keep = valid & ~is_zero
                zeros_got += tl.sum(is_zero.to(tl.int32), axis=0)
                qv = keep.to(tl.int32) | (esc.to(tl.int32) << 16)
                Q = q_base + tl.cumsum(qv, 0)
                q_base += tl.sum(qv, axis=0)
                krank = (Q & 0xFFFF) - 1
                erank = (Q >> 16) - 1
                idx = esc_off + erank
                ebyte = tl.load(src + idx, mask=esc & (erank < seg_esc) & (idx < esc_end),
                                other=0)
                e = tl.where(esc, ebyte.to(tl.int32), e)
                bad_exp += tl.sum((keep & ((e < 0) | (e > EMAX))).to(tl.int32), axis=0)

                if ITEMSIZE == 4:
                    smb = 3 - 2 * low16
                    word = tl.zeros([SUB], tl.int32)
                    for b in tl.static_range(3):
                        at = krank * smb + b
                        idx = sm_off + at
                        byte = tl.load(src + idx,
                                       mask=keep & (b < smb) & (at < seg_sm) & (idx < sm_end),
                                       other=0)
                        word = word | (byte.to(tl.int32) << (8 * b))
                    sm = tl.where(low16 != 0, word << 16, word)
                else:
                    idx = sm_off + krank
                    sm = tl.load(src + idx, mask=keep & (krank < seg_sm) & (idx < sm_end),
                                 other=0).to(tl.int32)
                if IS_FP16:
                    # rem: 3 bits at bit 3*krank of the chunk's rem segment (may span 2 bytes).
                    bit = 3 * krank
                    at = bit >> 3
                    idx = rem_off + at
                    lo_b = tl.load(src + idx, mask=keep & (at < seg_rem) & (idx < rem_end),
                                   other=0)
                    hi_b = tl.load(src + idx + 1,
                                   mask=keep & (at + 1 < seg_rem) & (idx + 1 < rem_end), other=0)
                    two = lo_b.to(tl.int32) | (hi_b.to(tl.int32) << 8)
                    sm = sm | (((two >> (bit & 7)) & 7) << 8)
                w = join_fields(tl.minimum(tl.maximum(e, 0), EMAX), sm, EXP_BITS, MAN_BITS)
                _store_words(dst + i, tl.where(is_zero, 0, w), valid, ITEMSIZE)

            err = tl.where(((q_base >> 16) != nesc) | (zeros_got != nz), ERR_COUNTS, 0)
            err = err | tl.where(bad_exp != 0, ERR_EXPONENT, 0)
            if CODEC != FIXED3:
                err = err | tl.where((t1 != o1) | (t2 != o2) | (t3 != o3) | (t4 != o4),
                                     ERR_TIERS, 0)
            tl.atomic_or(err_ptr, err, mask=err != 0)


@triton.jit
def _store_words(ptr, w, mask, ITEMSIZE: tl.constexpr):
    if ITEMSIZE == 2:
        tl.store(ptr, w.to(tl.int16), mask=mask)
    else:
        tl.store(ptr, w, mask=mask)


_MESSAGES = {
    ERR_TIERS.value: "dense tier open counts disagree with the table",
    ERR_COUNTS.value: "decoded escape/zero counts disagree with the chunk table",
    ERR_EXPONENT.value: "a code decodes to an exponent outside the dtype",
}


def decode(payload: torch.Tensor, header: F.Header, out: torch.Tensor) -> torch.Tensor:
    info = F.DTYPES[header.dtype]
    if header.codec == "raw":
        out.reshape(-1).view(torch.uint8).copy_(payload[header.streams_offset:])
        return out
    numel, C, nch = header.numel, header.chunk_elems, header.nchunks
    if numel == 0:
        return out
    dev = payload.device
    const = dict(CODEC=F.CODEC_IDS[header.codec], ITEMSIZE=info.itemsize,
                 EXP_BITS=info.exp_bits)
    seg = torch.empty(4 * nch, dtype=torch.int64, device=dev)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    _table_kernel[(triton.cdiv(nch, TABLE_BLOCK),)](
        payload, seg, err, header.table_offset, nch, numel, C, BLOCK=TABLE_BLOCK, **const)
    cum = torch.cumsum(seg, 0)  # flat: see codec_encode.py
    lens = (header.codes_nbytes, header.sm_nbytes, header.rem_nbytes, header.esc_nbytes)
    ends = [sum(lens[:s + 1]) for s in range(4)]  # from the streams' start
    words = out.reshape(-1).view(_INT_VIEW[info.itemsize])
    sub = min(SUB_ELEMS, max(8, triton.next_power_of_2(C)))
    _decode_kernel[(nch,)](
        payload, seg, cum, words, err, header.table_offset, nch, numel, C,
        header.streams_offset, *ends,
        MAN_BITS=info.man_bits, SUB=sub, NSUB=triton.cdiv(C, sub),
        num_warps=NUM_WARPS_DECODE, **const)
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
