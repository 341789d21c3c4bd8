"""dense encode kernels: analyze and write, one program per chunk.

``dense_analyze_kernel`` computes each chunk's locator, flags, counts and
raw-or-coded decision into a ``(nchunks, 16)`` int32 ``meta`` row and the
byte length of its segment in each stream (``format.segment_nbytes``) into
``seg``, stream by stream: ``seg[s * nchunks + c]``. ``dense_write_kernel``
reads the chunk again (cheaper than storing per-element codes between the
passes), recomputes its codes from ``meta`` and writes its table entry and
its segments. Compaction (dense tiers, omitted zeros, escapes, fp16 rem
bits) uses in-block prefix sums; bit packing of a compacted stream uses a
segmented scan, so each output byte is written by exactly one element and no
atomics are needed.

Both kernels walk their chunk in sub-blocks of ``SUB`` elements, carrying
running positions (and the partial byte of each compacted bit stream) from
one sub-block to the next, so a program holds a sub-block, not a chunk, in
registers. (Not tuned: fixed3, the codec for speed, has its own kernels in
fixed3_encode.py.)
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import _codec_common as K
from ._codec_common import (dense_ranks, locator_finish, seg_combine4, seg_combine24,
                            segment_lengths_offsets, split_fields, store_analysis,
                            write_raw_chunk, write_table_entry)


@triton.jit
def _sub_words(x_ptr, start, n, k, SUB: tl.constexpr, ITEMSIZE: tl.constexpr):
    """Sub-block k of the chunk at element ``start`` holding n elements."""
    j = tl.arange(0, SUB)
    i = k * SUB + j
    valid = i < n
    w = tl.load(x_ptr + start + i, mask=valid, other=0).to(tl.int32)
    if ITEMSIZE == 2:
        w = w & 0xFFFF
    return j, i, valid, w


@triton.jit
def dense_analyze_kernel(x_ptr, meta_ptr, seg_ptr, numel, nch, C, ITEMSIZE: tl.constexpr,
                         EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr, SUB: tl.constexpr,
                         NSUB: tl.constexpr):
    c = tl.program_id(0)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)

    # Pass 1: locator sums, +0.0 count, low-16-bit check.
    s = tl.zeros([], tl.int32)
    cnt = tl.zeros([], tl.int32)
    nz = tl.zeros([], tl.int32)
    low_bits = tl.zeros([], tl.int32)
    for k in range(0, NSUB):
        j, i, valid, w = _sub_words(x_ptr, start, n, k, SUB, ITEMSIZE)
        e = (w >> MAN_BITS) & EMAX
        normal = valid & (e > 0) & (e < EMAX)
        s += tl.sum(tl.where(normal, e, 0), axis=0)
        cnt += tl.sum(normal.to(tl.int32), axis=0)
        nz += tl.sum((valid & (w == 0)).to(tl.int32), axis=0)
        if ITEMSIZE == 4:
            low_bits += tl.sum((valid & ((w & 0xFFFF) != 0)).to(tl.int32), axis=0)
    base, phase = locator_finish(s, cnt)
    low16 = 0
    if ITEMSIZE == 4:
        low16 = (low_bits == 0).to(tl.int32)

    # Pass 2 (the chunk is in L1/L2 now): escapes and dense tier counts.
    n_esc = tl.zeros([], tl.int32)
    o1 = tl.zeros([], tl.int32)
    o2 = tl.zeros([], tl.int32)
    o3 = tl.zeros([], tl.int32)
    o4 = tl.zeros([], tl.int32)
    zf = ((nz << K.ZERO_FIRST_SHIFT) >= n).to(tl.int32)
    for k in range(0, NSUB):
        j, i, valid, w = _sub_words(x_ptr, start, n, k, SUB, ITEMSIZE)
        e = (w >> MAN_BITS) & EMAX
        rank = tl.where(valid, dense_ranks(e, w == 0, base, phase, zf), -1)
        o1 += tl.sum((rank >= K.T1_START).to(tl.int32), axis=0)
        o2 += tl.sum((rank >= K.T2_START).to(tl.int32), axis=0)
        o3 += tl.sum((rank >= K.T3_START).to(tl.int32), axis=0)
        o4 += tl.sum((rank >= K.T4_START).to(tl.int32), axis=0)
        n_esc += tl.sum((rank == K.DENSE_ESC).to(tl.int32), axis=0)
    n_zero = nz
    codes_nb = (((2 * n + 7) >> 3) + ((o1 * K.T1_BITS + 7) >> 3) + ((o2 * K.T2_BITS + 7) >> 3)
                + ((o3 * K.T3_BITS + 7) >> 3) + ((o4 * K.T4_BITS + 7) >> 3))
    store_analysis(meta_ptr, seg_ptr, c, nch, n, codes_nb, n_zero, n_esc, low16, zf, base, phase,
                   o1, o2, o3, o4, ITEMSIZE, EXP_BITS)


@triton.jit
def _store_packed3(dst, vals, nbytes, SUB: tl.constexpr):
    """Pack 3-bit values, value i at bit 3i (LSB first), and store those of
    the first nbytes bytes: 8 values -> 24 bits -> 3 bytes; a 4th, masked
    column keeps the block shape a power of 2."""
    acc = tl.sum(tl.reshape(vals, (SUB // 8, 8)) << (3 * tl.arange(0, 8))[None, :], axis=1)
    g = tl.arange(0, SUB // 8)
    b = tl.arange(0, 4)
    at = 3 * g[:, None] + b[None, :]
    byte = (acc[:, None] >> (8 * b[None, :])) & 0xFF
    tl.store(dst + at, byte.to(tl.uint8), mask=(b[None, :] < 3) & (at < nbytes))


@triton.jit
def _tier_field(rank, pos, is_open, START: tl.constexpr, BITS: tl.constexpr,
                CAP: tl.constexpr, FIELD: tl.constexpr):
    """This tier's digit, shifted to its slot in its byte, with the segment
    flag on the byte's first digit; placed in 16-bit field FIELD of an int64."""
    G: tl.constexpr = 8 // BITS
    slot = pos & (G - 1)
    digit = tl.minimum(rank - START, CAP)
    v = (digit << (slot * BITS)) | ((slot == 0).to(tl.int32) << K.SEG_FLAG_BIT)
    return tl.where(is_open, v, 0).to(tl.int64) << (16 * FIELD)


@triton.jit
def _store_compact_bits(dst, S, SHIFT: tl.constexpr, is_open, pos, cnt, BITS: tl.constexpr):
    """Store the bytes of a compacted digit stream: the element that closes a
    byte (its last digit, or the stream's last) holds the byte's value in S."""
    G: tl.constexpr = 8 // BITS
    LOG2G: tl.constexpr = 4 - BITS  # BITS is 1 or 2 (asserted in _codec_common)
    byte = ((S >> SHIFT) & 0xFF).to(tl.int32)
    slot = pos & (G - 1)
    closes = is_open & ((slot == G - 1) | (pos == cnt - 1))
    tl.store(dst + (pos >> LOG2G), byte.to(tl.uint8), mask=closes)


@triton.jit
def _last(x, j, SUB: tl.constexpr):
    """The sub-block's last value of a scan, as a scalar."""
    return tl.sum(tl.where(j == SUB - 1, x, 0), axis=0)


@triton.jit
def dense_write_kernel(x_ptr, meta_ptr, seg_ptr, cum_ptr, out_ptr, numel, nch, C, table_off,
                       streams_off, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                       MAN_BITS: tl.constexpr, SUB: tl.constexpr, NSUB: tl.constexpr):
    c = tl.program_id(0)
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    mrow = meta_ptr + c.to(tl.int64) * 16
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)

    write_table_entry(mrow, out_ptr, table_off, c)
    mode = tl.load(mrow)
    _, _, _, _, codes_off, sm_off, rem_off, esc_off = segment_lengths_offsets(
        seg_ptr, cum_ptr, nch, c)
    streams = out_ptr + streams_off
    codes_dst = streams + codes_off
    sm_dst = streams + sm_off
    rem_dst = streams + rem_off
    esc_dst = streams + esc_off

    if mode == 0:
        write_raw_chunk(x_ptr, start, n, sm_dst, SUB, NSUB, ITEMSIZE)
    else:
        flags = tl.load(mrow + 1)
        base = tl.load(mrow + 2)
        phase = tl.load(mrow + 3)
        n_zero = tl.load(mrow + 4)
        zf = (flags >> 1) & 1
        kept = n - n_zero
        rem_len = (3 * kept + 7) >> 3
        # Running ranks before this sub-block: kept elements | escapes << 16.
        q_base = tl.zeros([], tl.int32)
        o1 = tl.load(mrow + 6)
        o2 = tl.load(mrow + 7)
        o3 = tl.load(mrow + 8)
        o4 = tl.load(mrow + 9)
        len0 = (2 * n + 7) >> 3
        dst1 = codes_dst + len0
        dst2 = dst1 + ((o1 * K.T1_BITS + 7) >> 3)
        dst3 = dst2 + ((o2 * K.T2_BITS + 7) >> 3)
        dst4 = dst3 + ((o3 * K.T3_BITS + 7) >> 3)
        # Open counts of tiers 1..4 before this sub-block (16-bit fields)
        # and the partial byte of each tier's stream (segmented-scan carry).
        p_base = tl.zeros([], tl.int64)
        s_carry = tl.zeros([], tl.int64)
        r_carry = tl.zeros([], tl.int32)  # fp16: partial 24-bit rem group

        for k in range(0, NSUB):
            j, i, valid, w = _sub_words(x_ptr, start, n, k, SUB, ITEMSIZE)
            e, sm = split_fields(w, EXP_BITS, MAN_BITS)
            is_zero = valid & (w == 0)
            rank = tl.where(valid, dense_ranks(e, is_zero, base, phase, zf), -1)
            esc = rank == K.DENSE_ESC
            keep = valid & ~is_zero
            # Ranks among kept elements (sm, rem) and among escapes, one int32 prefix sum.
            qv = keep.to(tl.int32) | (esc.to(tl.int32) << 16)
            Q = q_base + tl.cumsum(qv, 0)
            q_base += tl.sum(qv, axis=0)
            krank = (Q & 0xFFFF) - 1
            erank = (Q >> 16) - 1
            tl.store(esc_dst + erank, e.to(tl.uint8), mask=esc)
            if ITEMSIZE == 4:
                low16 = flags & 1
                smv = tl.where(low16 != 0, sm >> 16, sm)
                smb = 3 - 2 * low16
                for b in tl.static_range(3):
                    tl.store(sm_dst + krank * smb + b, ((smv >> (8 * b)) & 0xFF).to(tl.uint8),
                             mask=keep & (b < smb))
            else:
                tl.store(sm_dst + krank, (sm & 0xFF).to(tl.uint8), mask=keep)
            if IS_FP16:
                # rem: sm's top 3 bits of each kept element, 8 per 3 bytes.
                if n_zero == 0:  # nothing omitted: element i is rem value i
                    _store_packed3(rem_dst + k * (SUB * 3 // 8), tl.where(valid, sm >> 8, 0),
                                   rem_len - k * (SUB * 3 // 8), SUB)
                else:
                    slot = krank & 7
                    v = ((sm >> 8) << (slot * 3)) | ((slot == 0).to(tl.int32) << 24)
                    R = seg_combine24(r_carry, tl.associative_scan(tl.where(keep, v, 0), 0,
                                                                   seg_combine24))
                    r_carry = _last(R, j, SUB)
                    closes = keep & ((slot == 7) | (krank == kept - 1))
                    for b in tl.static_range(3):
                        at = 3 * (krank >> 3) + b
                        tl.store(rem_dst + at, ((R >> (8 * b)) & 0xFF).to(tl.uint8),
                                 mask=closes & (at < rem_len))
            # Tier 0 holds every element: 4 digits per byte, no compaction.
            d0 = tl.where(valid, tl.minimum(rank, K.T0_CAP), 0)
            acc = tl.sum(tl.reshape(d0, (SUB // 4, 4)) << (2 * tl.arange(0, 4))[None, :],
                         axis=1)
            g = k * (SUB // 4) + tl.arange(0, SUB // 4)
            tl.store(codes_dst + g, acc.to(tl.uint8), mask=g < len0)
            # Tiers 1..4: one int64 prefix sum yields all four positions.
            op1 = rank >= K.T1_START
            op2 = rank >= K.T2_START
            op3 = rank >= K.T3_START
            op4 = rank >= K.T4_START
            X = (op1.to(tl.int64) | (op2.to(tl.int64) << 16) | (op3.to(tl.int64) << 32)
                 | (op4.to(tl.int64) << 48))
            P = p_base + tl.cumsum(X, 0)  # fields never exceed 4096: no carries
            p_base += tl.sum(X, axis=0)
            p1 = (P & 0xFFFF).to(tl.int32) - 1
            p2 = ((P >> 16) & 0xFFFF).to(tl.int32) - 1
            p3 = ((P >> 32) & 0xFFFF).to(tl.int32) - 1
            p4 = ((P >> 48) & 0xFFFF).to(tl.int32) - 1
            V = (_tier_field(rank, p1, op1, K.T1_START, K.T1_BITS, K.T1_CAP, 0)
                 | _tier_field(rank, p2, op2, K.T2_START, K.T2_BITS, K.T2_CAP, 1)
                 | _tier_field(rank, p3, op3, K.T3_START, K.T3_BITS, K.T3_CAP, 2)
                 | _tier_field(rank, p4, op4, K.T4_START, K.T4_BITS, K.T4_CAP, 3))
            S = seg_combine4(s_carry, tl.associative_scan(V, 0, seg_combine4))
            s_carry = _last(S, j, SUB)
            _store_compact_bits(dst1, S, 0, op1, p1, o1, K.T1_BITS)
            _store_compact_bits(dst2, S, 16, op2, p2, o2, K.T2_BITS)
            _store_compact_bits(dst3, S, 32, op3, p3, o3, K.T3_BITS)
            _store_compact_bits(dst4, S, 48, op4, p4, o4, K.T4_BITS)
