"""dense encode kernels: analyze and write, one program per chunk.

``dense_analyze_kernel`` computes each chunk's locator, flags, counts and
raw-or-coded decision into a ``(nchunks, 16)`` int32 ``meta`` row and the
byte length of its segment in each stream (``format.segment_nbytes``) into
``seg``, stream by stream: ``seg[s * nchunks + c]``. Its first pass is
fixed3's (``_rows.locator_pass``); the second counts tiers with one table
lookup per word. ``dense_write_kernel`` reads the chunk again (cheaper than
storing per-element codes between the passes), recomputes its codes from
``meta`` and writes its table entry and its segments.

Both work on row tiles (``_rows.py``): a row of 8 elements (4 for fp32: a
row is one 16-byte load) lives in one thread. A tier's digits are packed
inside the row's thread; one scan of the row counts places each row's run
in its tier's stream, and a segmented scan over the runs joins the bytes
that neighbouring rows share, so each output byte is written by exactly one
row and no atomics are needed. Kept elements (sm, fp16 rem) and escapes are
placed by one more scan of row counts (``row_ranks``). The write kernel
walks its chunk in sub-blocks of ``SUB`` elements, carrying the running
positions and each stream's partial byte from one to the next.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import _codec_common as K
from ._codec_common import (dense_codes_nbytes, dense_rank_table, dense_ranks, pick4,
                            seg_combine4, segment_lengths_offsets, split_fields, store_analysis,
                            tier_nbytes, write_raw_chunk, write_table_entry)
from ._rows import locator_pass, pack_rows3, row_ranks, store_rows3, tile_rows


@triton.jit
def _tier_hist(w, base, lut, zero_tier, MAN_BITS: tl.constexpr, EMAX: tl.constexpr):
    """How many words of a [rows, <= 8] tile end in each dense tier (0-4;
    ESC_TIER for escapes): 16-bit fields, tiers 0, 2, 4 of the first int64,
    1, 3, 5 of the second. ``lut``: offset -> tier for the chunk's phase and
    ZERO_FIRST bit (one nibble lookup instead of the rank and five compares);
    +0.0 words end in ``zero_tier``. A row's counts add up in 8-bit fields
    inside its thread."""
    e = (w >> MAN_BITS) & EMAX
    idx = e - base + 8
    nib = ((lut >> (4 * (idx & 15)).to(tl.int64)) & 0xF).to(tl.int32)
    tier = tl.where(idx.to(tl.uint32) < 16, nib, K.ESC_TIER)
    tier = tl.where(w == 0, zero_tier, tier)
    row = tl.sum(tl.full([], 1, tl.int64) << (8 * tier).to(tl.int64), axis=1)
    EVEN: tl.constexpr = 0x00FF00FF00FF00FF
    return tl.sum(row & EVEN, axis=0), tl.sum((row >> 8) & EVEN, axis=0)


@triton.jit
def _field(x, f):
    return ((x >> (16 * f)) & 0xFFFF).to(tl.int32)


@triton.jit
def _tier_counts(ev, od):
    """Tiers 1..5 of _tier_hist's fields as int32 (tier 0's is not needed)."""
    return _field(od, 0), _field(ev, 1), _field(od, 1), _field(ev, 2), _field(od, 2)


@triton.jit
def dense_analyze_kernel(x_ptr, meta_ptr, seg_ptr, numel, nch, C, ITEMSIZE: tl.constexpr,
                         EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr, SUB: tl.constexpr,
                         NSUB: tl.constexpr, PAIRS: tl.constexpr = False):
    c = tl.program_id(0)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)

    # Pass 1 (_rows.locator_pass); pass 2, the tier counts, reads the chunk
    # again: from registers when it is one sub-block, else from L1/L2.
    base, phase, nz, low16, pad, w = locator_pass(x_ptr, start, n, SUB, NSUB, ITEMSIZE,
                                                  MAN_BITS, EMAX, PAIRS)
    zf = ((nz << K.ZERO_FIRST_SHIFT) >= n).to(tl.int32)
    lut = tl.where(zf != 0,
                   pick4(phase, K.TIER_LUT0Z, K.TIER_LUT1Z, K.TIER_LUT2Z, K.TIER_LUT3Z),
                   pick4(phase, K.TIER_LUT0, K.TIER_LUT1, K.TIER_LUT2, K.TIER_LUT3))
    zero_tier = tl.where(zf != 0, K.ZERO_TIER_FIRST, K.ZERO_TIER_LAST)
    if PAIRS:  # 16-bit words two at a time: the low halves, then the high ones
        wi = w.to(tl.int32, bitcast=True)
        ev0, od0 = _tier_hist(wi & 0xFFFF, base, lut, zero_tier, MAN_BITS, EMAX)
        ev1, od1 = _tier_hist((wi >> 16) & 0xFFFF, base, lut, zero_tier, MAN_BITS, EMAX)
        ev = ev0 + ev1
        od = od0 + od1
    elif NSUB == 1:
        ev, od = _tier_hist(w, base, lut, zero_tier, MAN_BITS, EMAX)
    else:
        ev = tl.zeros([], tl.int64)
        od = tl.zeros([], tl.int64)
    # Per-tier counts as int32 (a 16-bit field holds one sub-block's).
    h1, h2, h3, h4, h5 = _tier_counts(ev, od)
    if not PAIRS and NSUB > 1:
        for k in range(0, NSUB):
            r, q, i, valid, wk = tile_rows(x_ptr, start, n, k, SUB, ITEMSIZE)
            d1, d2, d3, d4, d5 = _tier_counts(*_tier_hist(wk, base, lut, zero_tier, MAN_BITS,
                                                          EMAX))
            h1 += d1
            h2 += d2
            h3 += d3
            h4 += d4
            h5 += d5
    # The padding past n (w = 0) ended in zero_tier.
    h1 -= tl.where(zero_tier == 1, pad, 0)
    h2 -= tl.where(zero_tier == 2, pad, 0)
    h3 -= tl.where(zero_tier == 3, pad, 0)
    h4 -= tl.where(zero_tier == 4, pad, 0)
    h5 -= tl.where(zero_tier == 5, pad, 0)
    # Tier t holds every element that ends in tier t or later.
    n_esc = h5
    o4 = h4 + h5
    o3 = h3 + o4
    o2 = h2 + o3
    o1 = h1 + o2
    n_zero = nz
    codes_nb = dense_codes_nbytes(n, o1, o2, o3, o4)
    store_analysis(meta_ptr, seg_ptr, c, nch, n, codes_nb, n_zero, n_esc, low16, zf, base, phase,
                   o1, o2, o3, o4, ITEMSIZE, EXP_BITS)


@triton.jit
def _pack_rows(o, v, BITS: tl.constexpr):
    """Over a [rows, W] tile: each row's count of the elements with o = 1
    (0/1 in int32) and their BITS-bit values v (0 where o = 0) packed in
    element order, LSB first, inside the row's thread."""
    before = tl.cumsum(o, 1) - o
    return tl.sum(o, axis=1), tl.sum(v << (before * BITS), axis=1)


@triton.jit
def _ge(rank, START: tl.constexpr):
    """rank >= START as 0/1 in int32. Ranks lie in [-1, DENSE_ESC], so
    rank + 16 - START has bit 4 set exactly then (ints, not masks: selects
    and predicate moves cost more)."""
    return (rank + (16 - START)) >> 4


@triton.jit
def _tier_rows(rank, START: tl.constexpr, BITS: tl.constexpr, CAP: tl.constexpr,
               LAST: tl.constexpr = False):
    """One tier of each row: the elements its earlier digits left open
    (rank >= START), and their digits in this tier, min(rank - START, CAP).
    A 1-bit digit is rank > START; the last tier's never needs the min
    (DENSE_ESC is its all-ones digit)."""
    o = _ge(rank, START)
    if BITS == 1:
        digit = _ge(rank, START + 1)
    elif LAST:
        digit = (rank - START) & -o
    else:
        digit = tl.minimum(rank - START, CAP) & -o
    return _pack_rows(o, digit, BITS)


@triton.jit
def _run(pos, cnt, bits, BITS: tl.constexpr, FIELD: tl.constexpr):
    """A row's run of cnt BITS-bit values (packed in ``bits``) that starts
    at value ``pos`` of a bit stream: its first and end bit, its bits
    shifted to the first bit's byte, and its two segmented-scan elements in
    16-bit field FIELD: the bits it puts in its first byte, and (flagged:
    a new segment) the bits it leaves in the byte it ends in when it
    crosses a byte boundary."""
    first = pos * BITS
    end = first + cnt * BITS
    sh = bits << (first & 7)
    closes = (end >> 3) - (first >> 3)
    head = (sh & 0xFF).to(tl.int64) << (16 * FIELD)
    crosses = closes > 0
    flag = crosses.to(tl.int32) << K.SEG_FLAG_BIT
    tail = tl.where(crosses, (sh >> (8 * closes)) & 0xFF, 0) | flag
    return first, end, sh, head, tail.to(tl.int64) << (16 * FIELD)


@triton.jit
def _store_run(dst, first, end, sh, S_head, S_tail, is_last, FIELD: tl.constexpr,
               MAX_CLOSED: tl.constexpr):
    """Store the bytes a row's run closes (the first one completed by the
    earlier rows' bits, ``S_head``, the segmented scan through the run's
    head), and, for the stream's last run, the partial byte it ends in
    (``S_tail``, the scan through the run)."""
    b0 = first >> 3
    closes = (end >> 3) - b0
    tl.store(dst + b0, ((S_head >> (16 * FIELD)) & 0xFF).to(tl.uint8), mask=closes >= 1)
    tl.store(dst + b0 + 1, ((sh >> 8) & 0xFF).to(tl.uint8), mask=closes >= 2)
    if MAX_CLOSED >= 3:
        tl.store(dst + b0 + 2, ((sh >> 16) & 0xFF).to(tl.uint8), mask=closes >= 3)
    tl.store(dst + (end >> 3), ((S_tail >> (16 * FIELD)) & 0xFF).to(tl.uint8),
             mask=is_last & ((end & 7) != 0))


@triton.jit
def _seg_scan_runs(carry, head, tail, R: tl.constexpr):
    """Segmented scan (seg_combine4) over the runs' elements in stream
    order, head then tail of each row, after ``carry`` (the partial bytes
    left by earlier sub-blocks). Returns the scan at each head, at each
    tail, and the new carry."""
    S = tl.associative_scan(tl.reshape(tl.join(head, tail), (2 * R,)), 0, seg_combine4)
    S = seg_combine4(carry, S)
    S_head, S_tail = tl.split(tl.reshape(S, (R, 2)))
    last = tl.sum(tl.where(tl.arange(0, R) == R - 1, S_tail, 0), axis=0)
    return S_head, S_tail, last


@triton.jit
def dense_write_kernel(x_ptr, meta_ptr, seg_ptr, cum_ptr, out_ptr, numel, nch, C, table_off,
                       streams_off, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                       MAN_BITS: tl.constexpr, SUB: tl.constexpr, NSUB: tl.constexpr):
    c = tl.program_id(0)
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    W: tl.constexpr = 16 // ITEMSIZE  # a row is one 16-byte load (see _rows.tile_rows)
    R: tl.constexpr = SUB // W
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
        o1 = tl.load(mrow + 6)
        o2 = tl.load(mrow + 7)
        o3 = tl.load(mrow + 8)
        o4 = tl.load(mrow + 9)
        len0 = (2 * n + 7) >> 3
        dst1 = codes_dst + len0
        dst2 = dst1 + tier_nbytes(o1, K.T1_BITS)
        dst3 = dst2 + tier_nbytes(o2, K.T2_BITS)
        dst4 = dst3 + tier_nbytes(o3, K.T3_BITS)
        lut, zero_rank = dense_rank_table(phase, zf)
        q_base = tl.zeros([], tl.int32)  # kept elements | escapes << 16 so far
        p_base = tl.zeros([], tl.int64)  # open elements of tiers 1..4 so far, 16-bit fields
        s_carry = tl.zeros([], tl.int64)  # each tier stream's partial byte so far
        r_carry = tl.zeros([], tl.int64)  # fp16, zeros omitted: the rem stream's

        for k in range(0, NSUB):
            r, q, i, valid, w = tile_rows(x_ptr, start, n, k, SUB, ITEMSIZE, W=W)
            e, sm = split_fields(w, EXP_BITS, MAN_BITS)
            is_zero = valid & (w == 0)
            rank = tl.where(valid, dense_ranks(e, is_zero, base, lut, zero_rank), -1)
            esc = rank == K.DENSE_ESC
            keep = valid & ~is_zero
            # Ranks among kept elements (sm, rem) and among escapes: one scan.
            Q, q_tot = row_ranks(keep.to(tl.int32) | (esc.to(tl.int32) << 16), q_base)
            q_base += q_tot
            krank = (Q & 0xFFFF) - 1
            tl.store(esc_dst + (Q >> 16) - 1, e.to(tl.uint8), mask=esc)
            if ITEMSIZE == 4:
                low16 = flags & 1
                smv = tl.where(low16 != 0, sm >> 16, sm)
                smb = 3 - 2 * low16
                for b in tl.static_range(3):
                    tl.store(sm_dst + krank * smb + b, ((smv >> (8 * b)) & 0xFF).to(tl.uint8),
                             mask=tl.where(b < smb, keep, False))
            else:
                tl.store(sm_dst + krank, (sm & 0xFF).to(tl.uint8), mask=keep)
            if IS_FP16:
                # rem: sm's top 3 bits of each kept element, 8 per 3 bytes.
                rv = tl.where(keep, sm >> 8, 0)
                if n_zero == 0:  # nothing omitted: element i is rem value i
                    store_rows3(rem_dst + k * (SUB * 3 // 8), pack_rows3(rv, q), r,
                                rem_len - k * (SUB * 3 // 8))
                else:
                    kc, kb = _pack_rows(keep.to(tl.int32), rv, 3)
                    # Kept elements before each row: its first element's rank, less itself.
                    kpos = tl.sum(tl.where(q[None, :] == 0, krank + 1 - keep.to(tl.int32), 0),
                                  axis=1)
                    first, end, sh, head, tail = _run(kpos, kc, kb, 3, 0)
                    S_head, S_tail, r_carry = _seg_scan_runs(r_carry, head, tail, R)
                    _store_run(rem_dst, first, end, sh, S_head, S_tail,
                               (kc > 0) & (kpos + kc == kept), 0, 3)
            # Tier 0 holds every element: a row's 2-bit digits are W // 4 bytes.
            d0 = tl.sum(tl.where(valid, tl.minimum(rank, K.T0_CAP), 0) << (2 * q)[None, :],
                        axis=1)
            for b in tl.static_range(W // 4):
                g = k * (SUB // 4) + (W // 4) * r + b
                tl.store(codes_dst + g, ((d0 >> (8 * b)) & 0xFF).to(tl.uint8), mask=g < len0)
            # Tiers 1..4: each row's run of digits in each tier's stream; one
            # scan of the row counts places them, one segmented scan joins the
            # bytes that runs of neighbouring rows share.
            c1, b1 = _tier_rows(rank, K.T1_START, K.T1_BITS, K.T1_CAP)
            c2, b2 = _tier_rows(rank, K.T2_START, K.T2_BITS, K.T2_CAP)
            c3, b3 = _tier_rows(rank, K.T3_START, K.T3_BITS, K.T3_CAP)
            c4, b4 = _tier_rows(rank, K.T4_START, K.T4_BITS, K.T4_CAP, LAST=True)
            X = (c1.to(tl.int64) | (c2.to(tl.int64) << 16) | (c3.to(tl.int64) << 32)
                 | (c4.to(tl.int64) << 48))
            P = p_base + tl.cumsum(X, 0) - X  # fields never exceed 4096: no carries
            p_base += tl.sum(X, axis=0)
            p1 = (P & 0xFFFF).to(tl.int32)
            p2 = ((P >> 16) & 0xFFFF).to(tl.int32)
            p3 = ((P >> 32) & 0xFFFF).to(tl.int32)
            p4 = ((P >> 48) & 0xFFFF).to(tl.int32)
            f1, e1, sh1, h1, t1 = _run(p1, c1, b1, K.T1_BITS, 0)
            f2, e2, sh2, h2, t2 = _run(p2, c2, b2, K.T2_BITS, 1)
            f3, e3, sh3, h3, t3 = _run(p3, c3, b3, K.T3_BITS, 2)
            f4, e4, sh4, h4, t4 = _run(p4, c4, b4, K.T4_BITS, 3)
            S_head, S_tail, s_carry = _seg_scan_runs(s_carry, h1 | h2 | h3 | h4,
                                                     t1 | t2 | t3 | t4, R)
            _store_run(dst1, f1, e1, sh1, S_head, S_tail, (c1 > 0) & (p1 + c1 == o1), 0, 2)
            _store_run(dst2, f2, e2, sh2, S_head, S_tail, (c2 > 0) & (p2 + c2 == o2), 1, 2)
            _store_run(dst3, f3, e3, sh3, S_head, S_tail, (c3 > 0) & (p3 + c3 == o3), 2, 2)
            _store_run(dst4, f4, e4, sh4, S_head, S_tail, (c4 > 0) & (p4 + c4 == o4), 3, 2)
