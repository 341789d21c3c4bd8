"""fixed3 decode kernel, over tiles of rows of 8 elements (see fixed3_encode.py).

The checks and error bits are those of ``dense_decode_kernel``: every load
is masked to its chunk's segment and its stream's end (or the segment was
checked to lie inside once per chunk), decoded counts must match the table,
escapes must name an exponent of the dtype. The zero count needs no
reduction of its own: it is the chunk's length less the kept elements.

Paths, by chunk: the hot one (no zero omitted, one sm byte per element, a
full chunk, an 8-byte aligned sm segment: no masks, 8-byte sm loads); the
same with masks and byte loads (``_decode_fast_bytes``); the general one
(``_decode_general``: kept elements' positions from a scan); raw chunks. All
but the first are noinline functions (cold code, see offline.py).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._codec_common import (ERR_COUNTS, ERR_EXPONENT, ERR_TABLE, check_stream_ends,
                            decode_raw_chunk, fixed_window, join_fields, load_entry,
                            segment_lengths_offsets, store_words)
from ._rows import row_ranks
from .fixed3_encode import escape_ranks


@triton.jit
def load_rows3(seg, at, seg_len, stream_left, FULL: tl.constexpr = False):
    """The 24-bit values of 3 bytes at seg + at (a [rows, 1] column: a 2-D
    load keeps the rows' layout, where a 1-D one leaves the tile built from
    it to a default layout of 8 threads per row), masked to the segment's
    seg_len bytes and the stream_left bytes left in its stream, unless FULL
    (the caller checked that every row lies inside both)."""
    acc = tl.zeros(at.shape, tl.int32)
    for b in tl.static_range(3):
        if FULL:
            byte = tl.load(seg + at + b)
        else:
            byte = tl.load(seg + at + b, mask=(at + b < seg_len) & (at + b < stream_left),
                           other=0)
        acc = acc | (byte.to(tl.int32) << (8 * b))
    return acc


@triton.jit
def _decode_codes(src, k, n, lo, zf, codes_off, seg_codes, codes_end, esc_off, esc_room,
                  e_base, SUB: tl.constexpr, FULL: tl.constexpr = False):
    """Sub-block k's codes and escapes: its tile indices, the decoded
    exponents, which elements are escapes and omitted +0.0, the escapes so
    far. FULL: the chunk fills its sub-blocks and its codes segment lies
    inside the stream (the caller checked), so nothing is masked."""
    CODES_PER_SUB: tl.constexpr = SUB * 3 // 8
    r = tl.arange(0, SUB // 8)
    q = tl.arange(0, 8)
    i = k * SUB + r[:, None] * 8 + q[None, :]
    acc = load_rows3(src + codes_off, k * CODES_PER_SUB + 3 * r[:, None], seg_codes,
                     codes_end - codes_off, FULL)
    if FULL:
        valid = tl.full([SUB // 8, 8], True, tl.int1)
    else:
        valid = i < n
        # Codes past the chunk's end (a corrupt payload's) must not count as escapes.
        past = tl.minimum(tl.maximum(n - k * SUB - 8 * r[:, None], 0), 8)
        acc = acc & ((1 << (3 * past)) - 1)
    code = (acc >> (3 * q[None, :])) & 7
    is_zero = tl.where(zf != 0, valid & (code == 0), False)
    esc = code == 7  # 0 past the chunk's end
    rank, e_base = escape_ranks(acc, q, e_base)
    # Escape bytes: inside the segment and the stream (esc_room bytes from esc_off).
    ebyte = tl.load(src + esc_off + rank, mask=esc & (rank < esc_room), other=0)
    e = tl.where(esc, ebyte.to(tl.int32), lo + code - zf)
    return r, q, i, valid, is_zero, esc, e, e_base


@triton.jit
def _bad_exponents(esc, e, EXP_BITS: tl.constexpr):
    """Escapes naming no exponent of the dtype (a byte holds more than 5 bits)."""
    if EXP_BITS < 8:
        return tl.sum(tl.sum((esc & (e > (1 << EXP_BITS) - 1)).to(tl.int32), axis=1), axis=0)
    else:
        return tl.zeros([], tl.int32)


@triton.jit
def _decode_fast(src, sm_src, dst, n, lo, codes_off, seg_codes, codes_end, rem_off, seg_rem,
                 rem_end, esc_off, esc_room, SUB: tl.constexpr, NSUB: tl.constexpr,
                 ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                 ALIGNED: tl.constexpr):
    """A coded chunk with no zero omitted and one sm byte per element, its sm
    segment inside its stream: element i's sm byte (and fp16 rem value) is
    the i-th. ALIGNED: sm_src is 8-byte aligned, the chunk fills its
    sub-blocks and its codes segment lies inside its stream, so a row's 8
    bytes come in one load and nothing is masked. Returns the escapes
    decoded and the count of bad exponents."""
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    CODES_PER_SUB: tl.constexpr = SUB * 3 // 8
    one = (n > 0).to(tl.int32)
    e_base = tl.zeros([], tl.int32)
    bad_exp = tl.zeros([], tl.int32)
    for k in range(0, NSUB):
        r, q, i, valid, is_zero, esc, e, e_base = _decode_codes(
            src, k, n, lo, 0, codes_off, seg_codes, codes_end, esc_off, esc_room,
            e_base, SUB, ALIGNED)
        bad_exp += _bad_exponents(esc, e, EXP_BITS)
        if ALIGNED:
            sm = tl.load(sm_src + i).to(tl.int32)
        else:  # byte loads, contiguity hidden: see _write_fast in fixed3_encode.py
            sm = tl.load(sm_src + i * one, mask=valid, other=0).to(tl.int32)
        if ITEMSIZE == 4:
            sm = sm << 16
        if IS_FP16:
            rem = load_rows3(src + rem_off, k * CODES_PER_SUB + 3 * r[:, None], seg_rem,
                             rem_end - rem_off)
            sm = sm | (((rem >> (3 * q[None, :])) & 7) << 8)
        w = join_fields(tl.minimum(e, EMAX), sm, EXP_BITS, MAN_BITS)
        if ALIGNED:
            store_words(dst + i, w, None, ITEMSIZE)
        else:
            store_words(dst + i, w, valid, ITEMSIZE)
    return e_base, bad_exp


@triton.jit(noinline=True)
def _decode_fast_bytes(src, sm_src, dst, n, lo, codes_off, seg_codes, codes_end, rem_off,
                       seg_rem, rem_end, esc_off, esc_room, SUB: tl.constexpr,
                       NSUB: tl.constexpr, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                       MAN_BITS: tl.constexpr):
    return _decode_fast(src, sm_src, dst, n, lo, codes_off, seg_codes, codes_end, rem_off,
                        seg_rem, rem_end, esc_off, esc_room, SUB, NSUB, ITEMSIZE,
                        EXP_BITS, MAN_BITS, False)


@triton.jit(noinline=True)
def _decode_general(src, dst, n, lo, zf, low16, codes_off, seg_codes, codes_end, sm_off, seg_sm,
                    sm_end, rem_off, seg_rem, rem_end, esc_off, esc_room,
                    SUB: tl.constexpr, NSUB: tl.constexpr, ITEMSIZE: tl.constexpr,
                    EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr):
    """A coded chunk off the fast path (zeros omitted, 3 sm bytes per
    element, or an sm segment past its stream's end): kept elements'
    positions come from a scan. Returns the escapes and kept
    elements decoded and the count of bad exponents."""
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    e_base = tl.zeros([], tl.int32)
    k_base = tl.zeros([], tl.int32)
    bad_exp = tl.zeros([], tl.int32)
    for k in range(0, NSUB):
        r, q, i, valid, is_zero, esc, e, e_base = _decode_codes(
            src, k, n, lo, zf, codes_off, seg_codes, codes_end, esc_off, esc_room,
            e_base, SUB)
        bad_exp += _bad_exponents(esc, e, EXP_BITS)
        keep = valid & ~is_zero
        kr, k_tot = row_ranks(keep.to(tl.int32), k_base)
        k_base += k_tot
        krank = kr - 1
        if ITEMSIZE == 4:
            smb = 3 - 2 * low16
            word = tl.zeros([SUB // 8, 8], tl.int32)
            for b in tl.static_range(3):
                at = krank * smb + b
                idx = sm_off + at
                byte = tl.load(src + idx, mask=tl.where(b < smb, keep & (at < seg_sm) & (idx < sm_end), False),
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
            lo_b = tl.load(src + idx, mask=keep & (at < seg_rem) & (idx < rem_end), other=0)
            hi_b = tl.load(src + idx + 1, mask=keep & (at + 1 < seg_rem) & (idx + 1 < rem_end),
                           other=0)
            two = lo_b.to(tl.int32) | (hi_b.to(tl.int32) << 8)
            sm = sm | (((two >> (bit & 7)) & 7) << 8)
        w = join_fields(tl.minimum(e, EMAX), sm, EXP_BITS, MAN_BITS)
        store_words(dst + i, tl.where(is_zero, 0, w), valid, ITEMSIZE)
    return e_base, k_base, bad_exp


@triton.jit
def fixed3_decode_kernel(p_ptr, seg_ptr, cum_ptr, out_ptr, err_ptr, table_off, nch, numel, C,
                         streams_off, codes_end, sm_end, rem_end, esc_end,
                         ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                         MAN_BITS: tl.constexpr, SUB: tl.constexpr, NSUB: tl.constexpr):
    c = tl.program_id(0)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    if c == 0:
        check_stream_ends(cum_ptr, nch, err_ptr, codes_end, sm_end, rem_end, esc_end)
    mode, flags, base, phase, nz, nesc, o1, o2, o3, o4 = load_entry(
        p_ptr + table_off + c.to(tl.int64) * 16, c < nch)
    # A load at offset idx of stream s is masked by idx < s's end.
    (seg_codes, seg_sm, seg_rem, seg_esc, codes_off, sm_off, rem_off,
     esc_off) = segment_lengths_offsets(seg_ptr, cum_ptr, nch, c)
    src = p_ptr + streams_off
    # Escape bytes a chunk may read: its segment, cut at the stream's end (int32).
    esc_room = tl.maximum(tl.minimum(seg_esc, esc_end - esc_off), 0).to(tl.int32)
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)
    dst = out_ptr + start

    # The table kernel ran before this one on the stream: bit ERR_TABLE is final.
    if (tl.load(err_ptr) & ERR_TABLE) == 0:
        if mode == 0:
            decode_raw_chunk(src, sm_off, seg_sm, sm_end, dst, n, SUB, NSUB, ITEMSIZE)
        else:
            zf = (flags >> 1) & 1
            low16 = flags & 1
            lo, width = fixed_window(base, phase, zf, EMAX)
            # The fast path (see fixed3_write_kernel): element i's sm byte at
            # position i, read 8 bytes at a time from an 8-byte aligned
            # address (p_ptr is specialized as 16-byte aligned when it is),
            # else byte by byte, off the hot path. The segment must lie inside
            # its stream, so that only the chunk's end masks a load.
            sm_at = streams_off + sm_off
            fast = ((zf == 0) & ((ITEMSIZE == 2) | (low16 != 0)) & (seg_sm == n)
                    & (sm_off + n <= sm_end))
            if fast:
                full = (n == NSUB * SUB) & (codes_off + seg_codes <= codes_end)
                if (sm_at % 8 == 0) & full:
                    e_base, bad_exp = _decode_fast(
                        src, p_ptr + tl.multiple_of(sm_at, 8), dst, n, lo, codes_off,
                        seg_codes, codes_end, rem_off, seg_rem, rem_end, esc_off, esc_room,
                        SUB, NSUB, ITEMSIZE, EXP_BITS, MAN_BITS, True)
                else:
                    e_base, bad_exp = _decode_fast_bytes(
                        src, src + sm_off, dst, n, lo, codes_off, seg_codes, codes_end, rem_off,
                        seg_rem, rem_end, esc_off, esc_room, SUB, NSUB, ITEMSIZE,
                        EXP_BITS, MAN_BITS)
                k_base = n
            else:
                e_base, k_base, bad_exp = _decode_general(
                    src, dst, n, lo, zf, low16, codes_off, seg_codes, codes_end, sm_off, seg_sm,
                    sm_end, rem_off, seg_rem, rem_end, esc_off, esc_room,
                    SUB, NSUB, ITEMSIZE, EXP_BITS, MAN_BITS)
            err = tl.where((e_base != nesc) | (n - k_base != nz), ERR_COUNTS, 0)
            err = err | tl.where(bad_exp != 0, ERR_EXPONENT, 0)
            tl.atomic_or(err_ptr, err, mask=err != 0)

