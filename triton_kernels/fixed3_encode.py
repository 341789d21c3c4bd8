"""fixed3 encode kernels, over tiles of rows of 8 elements.

Same two passes and outputs as the dense kernels in ``dense_encode.py``
(``meta``, ``seg``, then the table entry and segments), written for fixed3's
shape: 8 consecutive elements are 8 3-bit codes, exactly 3 bytes. A sub-block
is a ``[SUB // 8, 8]`` tile whose rows each live in one thread, so

- the input is read with 16-byte vector loads,
- packing codes into bytes is a per-thread shift-and-add, with no exchange
  between threads,
- prefix sums (escape and kept-element positions) scan one total per row
  across threads and finish inside the row,
- when no +0.0 is omitted (``ZERO_SLOT`` clear, the usual case), element i's
  sign-mantissa bytes go to position i and need no scan at all;
  with 8-byte aligned destinations they are stored 8 bytes at a time;
- escapes are counted per row from the packed codes (``escape_ranks``);
- 16-bit words are read as int32 pairs where the input is 4-byte aligned,
  and the analyze pass tests them two at a time.

The pieces the dense kernels share (the tile, the analyze kernels' first
pass, row prefix sums, 3-bit packing) are in ``_rows.py``.

The hot path is a full chunk on that fast path with an aligned sm segment;
a tensor's last chunk, unaligned segments, omitted zeros, 3-byte fp32 sm and
raw chunks take noinline functions (cold code). Everything is counted in
SASS by ``benchmarks/kernel_cost.py``: the kernels are issue-bound (measured
on a GPU, docs/benchmarks.md), so the count per element is what bounds
their speed.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import _codec_common as K
from ._codec_common import (fixed_window, seg_combine24, segment_lengths_offsets, split_fields,
                            store_analysis, write_raw_chunk, write_table_entry)
from ._rows import (LANES, lane_sum, locator_pass, pack_rows3, row_ranks, store_rows3, sum2,
                    tile_rows)


@triton.jit
def fixed3_codes(e, is_zero, valid, lo, width, zf):
    """Code of each element: e - lo (+1 under ZERO_SLOT) inside the window,
    0 for +0.0 under ZERO_SLOT, 7 (escape) otherwise; 0 past the chunk."""
    d = e - lo
    inside = d.to(tl.uint32) < width.to(tl.uint32)
    code = tl.where(inside, d + zf, 7)
    code = tl.where(zf != 0, tl.where(is_zero, 0, code), code)
    return tl.where(valid, code, 0)


@triton.jit
def _inside_part_pairs(w, lo, width, MAN_BITS: tl.constexpr, EMAX: tl.constexpr):
    """_inside_part two at a time. d = e + 256 - lo lies in [1, 511];
    d + 0x7F00 reaches bit 15 iff e >= lo, d + 0x7F00 - width iff
    e >= lo + width; neither leaves its lane."""
    E2 = (w >> MAN_BITS) & (EMAX * LANES)
    d = E2 + ((0x100 - lo) * LANES).to(tl.uint32)
    ge_lo = d + 0x7F00 * LANES
    ge_hi = d + ((0x7F00 - width) * LANES).to(tl.uint32)
    inside = (ge_lo ^ ge_hi) & (0x8000 * LANES)  # ge_hi implies ge_lo
    return lane_sum(inside >> 15)


@triton.jit
def _inside_part(w, lo, width, MAN_BITS: tl.constexpr, EMAX: tl.constexpr):
    """Words whose exponent lies in the window (the caller derives the
    escapes from this count, the zeros and the padding)."""
    e = (w >> MAN_BITS) & EMAX
    return sum2(((e - lo).to(tl.uint32) < width.to(tl.uint32)).to(tl.int32))


@triton.jit
def fixed3_analyze_kernel(x_ptr, meta_ptr, seg_ptr, numel, nch, C, ITEMSIZE: tl.constexpr,
                          EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr, SUB: tl.constexpr,
                          NSUB: tl.constexpr, PAIRS: tl.constexpr = False):
    c = tl.program_id(0)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)

    # Pass 1 (_rows.locator_pass). Pass 2 (escapes) needs the window, so it
    # reads again: from registers when the chunk is one sub-block, else from
    # L1/L2.
    base, phase, nz, low16, pad, w = locator_pass(x_ptr, start, n, SUB, NSUB, ITEMSIZE,
                                                  MAN_BITS, EMAX, PAIRS)
    zf = ((nz << K.ZERO_SLOT_SHIFT) >= n).to(tl.int32)
    lo, width = fixed_window(base, phase, zf, EMAX)
    if PAIRS:
        inside = _inside_part_pairs(w, lo, width, MAN_BITS, EMAX)
    elif NSUB == 1:
        inside = _inside_part(w, lo, width, MAN_BITS, EMAX)
    else:
        inside = tl.zeros([], tl.int32)
        for k in range(0, NSUB):
            r, q, i, valid, w = tile_rows(x_ptr, start, n, k, SUB, ITEMSIZE)
            inside += _inside_part(w, lo, width, MAN_BITS, EMAX)
    # Escapes are the words outside the window, less the +0.0 words that
    # ZERO_SLOT codes as 0 (outside the window unless lo is 0). Counted over
    # the tile, the padding (w = 0, exponent 0) behaves like +0.0: outside
    # the window when lo > 0, so without ZERO_SLOT it adds pad escapes.
    zeros_all = nz + pad
    n_esc = (NSUB * SUB - inside - tl.where((zf != 0) & (lo > 0), zeros_all, 0)
             - tl.where((zf == 0) & (lo > 0), pad, 0))

    n_zero = nz * zf
    codes_nb = (3 * n + 7) >> 3
    store_analysis(meta_ptr, seg_ptr, c, nch, n, codes_nb, n_zero, n_esc, low16, zf, base, phase,
                   0, 0, 0, 0, ITEMSIZE, EXP_BITS)


@triton.jit
def escape_ranks(acc, q, base):
    """The escapes (code 7) among each row's eight 3-bit codes, packed in
    acc ([rows, 1], code q at bit 3q): every element's rank among the
    sub-block's escapes (exclusive, plus base; meaningful for escapes only)
    and the escapes so far. One multiply per row counts them: with m holding
    bit 3q for each escape q, m * 0x249249 holds in field 3p (p < 7) the
    escapes among codes 0..p, at most 7, so no field carries into the next."""
    ESC_BITS: tl.constexpr = 0x249249  # bit 3q for q = 0..7
    m = acc & (acc >> 1) & (acc >> 2) & ESC_BITS
    prod = m * ESC_BITS
    # The row counts as a 1-D vector: scanning a [rows, 1] tile trips the
    # compiler (a ScanOpToLLVM assertion, triton 3.6).
    row = tl.sum(((prod >> 18) & 7) + ((m >> 21) & 1), axis=1)
    incl = tl.cumsum(row, 0)
    before = ((prod << 3) >> (3 * q[None, :])) & 7
    rank = base + (incl - row)[:, None] + before
    return rank, base + tl.sum(row, axis=0)


@triton.jit
def _code_sub_block(x_ptr, start, n, k, lo, width, zf, codes_dst, codes_len, esc_dst, e_base,
                    SUB: tl.constexpr, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                    MAN_BITS: tl.constexpr, FULL: tl.constexpr = False,
                    PAIRS: tl.constexpr = False):
    """Write sub-block k's codes and escapes; return its tile (for the sm
    stream) and the escapes so far."""
    CODES_PER_SUB: tl.constexpr = SUB * 3 // 8
    r, q, i, valid, w = tile_rows(x_ptr, start, n, k, SUB, ITEMSIZE, FULL, PAIRS)
    e, sm = split_fields(w, EXP_BITS, MAN_BITS)
    is_zero = valid & (w == 0)
    code = fixed3_codes(e, is_zero, valid, lo, width, zf)
    acc = pack_rows3(code, q)
    store_rows3(codes_dst + k * CODES_PER_SUB, acc, r, codes_len - k * CODES_PER_SUB, FULL)
    rank, e_base = escape_ranks(acc[:, None], q, e_base)
    tl.store(esc_dst + rank, e.to(tl.uint8), mask=code == 7)
    return r, q, i, valid, is_zero, sm, e_base


@triton.jit
def _write_fast(x_ptr, start, n, lo, width, codes_dst, sm_dst, rem_dst, esc_dst,
                SUB: tl.constexpr, NSUB: tl.constexpr, ITEMSIZE: tl.constexpr,
                EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr, ALIGNED: tl.constexpr,
                PAIRS: tl.constexpr = False):
    """A coded chunk with no zero omitted and one sm byte per element:
    element i's sm byte (and fp16 rem value) is the i-th. ALIGNED: sm_dst is
    8-byte aligned and the chunk fills its sub-blocks, so a row's 8 bytes go
    out in one store and nothing is masked."""
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    CODES_PER_SUB: tl.constexpr = SUB * 3 // 8
    codes_len = (3 * n + 7) >> 3
    one = (n > 0).to(tl.int32)
    e_base = tl.zeros([], tl.int32)  # escapes before this sub-block
    for k in range(0, NSUB):
        r, q, i, valid, is_zero, sm, e_base = _code_sub_block(
            x_ptr, start, n, k, lo, width, 0, codes_dst, codes_len, esc_dst, e_base,
            SUB, ITEMSIZE, EXP_BITS, MAN_BITS, ALIGNED, PAIRS)
        if ITEMSIZE == 4:
            sm = sm >> 16
        if ALIGNED:
            tl.store(sm_dst + i, (sm & 0xFF).to(tl.uint8))
        else:
            # Byte stores. The offsets' contiguity is hidden behind a multiply
            # by a 1 the compiler cannot see: a contiguous but unaligned byte
            # tile would be laid out 8 threads to a row, and every row-wise
            # step before it would need shuffles to get there.
            tl.store(sm_dst + i * one, (sm & 0xFF).to(tl.uint8), mask=valid)
        if IS_FP16:
            store_rows3(rem_dst + k * CODES_PER_SUB, pack_rows3(tl.where(valid, sm >> 8, 0), q),
                        r, codes_len - k * CODES_PER_SUB)


@triton.jit(noinline=True)
def _write_fast_bytes(x_ptr, start, n, lo, width, codes_dst, sm_dst, rem_dst, esc_dst,
                      SUB: tl.constexpr, NSUB: tl.constexpr, ITEMSIZE: tl.constexpr,
                      EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr):
    _write_fast(x_ptr, start, n, lo, width, codes_dst, sm_dst, rem_dst, esc_dst, SUB, NSUB,
                ITEMSIZE, EXP_BITS, MAN_BITS, False)


@triton.jit(noinline=True)
def _write_general(x_ptr, start, n, lo, width, zf, low16, n_zero, codes_dst, sm_dst, rem_dst,
                   esc_dst, SUB: tl.constexpr, NSUB: tl.constexpr, ITEMSIZE: tl.constexpr,
                   EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr):
    """A coded chunk off the fast path (zeros omitted, or 3 sm bytes per
    element): kept elements' positions come from a scan; fp16 rem bits are
    compacted with a segmented scan."""
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    kept = n - n_zero
    rem_len = (3 * kept + 7) >> 3
    codes_len = (3 * n + 7) >> 3
    e_base = tl.zeros([], tl.int32)
    k_base = tl.zeros([], tl.int32)
    r_carry = tl.zeros([], tl.int32)  # fp16: the partial 24-bit rem group
    for k in range(0, NSUB):
        r, q, i, valid, is_zero, sm, e_base = _code_sub_block(
            x_ptr, start, n, k, lo, width, zf, codes_dst, codes_len, esc_dst, e_base,
            SUB, ITEMSIZE, EXP_BITS, MAN_BITS)
        keep = tl.where(zf != 0, valid & ~is_zero, valid)
        kr, k_tot = row_ranks(keep.to(tl.int32), k_base)
        k_base += k_tot
        krank = kr - 1
        if ITEMSIZE == 4:
            smv = tl.where(low16 != 0, sm >> 16, sm)
            smb = 3 - 2 * low16
            for b in tl.static_range(3):
                tl.store(sm_dst + krank * smb + b, ((smv >> (8 * b)) & 0xFF).to(tl.uint8),
                         mask=tl.where(b < smb, keep, False))
        else:
            tl.store(sm_dst + krank, (sm & 0xFF).to(tl.uint8), mask=keep)
        if IS_FP16:
            # A segmented scan over the sub-block in element order builds
            # each rem byte in the element that closes it.
            kk = tl.reshape(krank, (SUB,))
            kp = tl.reshape(keep, (SUB,))
            slot = kk & 7
            v = ((tl.reshape(sm, (SUB,)) >> 8) << (slot * 3)) | ((slot == 0).to(tl.int32) << 24)
            R = seg_combine24(r_carry, tl.associative_scan(tl.where(kp, v, 0), 0, seg_combine24))
            r_carry = tl.sum(tl.where(tl.arange(0, SUB) == SUB - 1, R, 0), axis=0)
            closes = kp & ((slot == 7) | (kk == kept - 1))
            for b in tl.static_range(3):
                at = 3 * (kk >> 3) + b
                tl.store(rem_dst + at, ((R >> (8 * b)) & 0xFF).to(tl.uint8),
                         mask=closes & (at < rem_len))


@triton.jit
def fixed3_write_kernel(x_ptr, meta_ptr, seg_ptr, cum_ptr, out_ptr, numel, nch, C, table_off,
                        streams_off, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                        MAN_BITS: tl.constexpr, SUB: tl.constexpr, NSUB: tl.constexpr,
                        PAIRS: tl.constexpr = False):
    c = tl.program_id(0)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    mrow = meta_ptr + c.to(tl.int64) * 16
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)

    write_table_entry(mrow, out_ptr, table_off, c)
    mode = tl.load(mrow)
    _, _, _, _, codes_off, sm_off, rem_off, esc_off = segment_lengths_offsets(
        seg_ptr, cum_ptr, nch, c)
    sm_at = streams_off + sm_off  # from the payload's start: its alignment matters
    codes_dst = out_ptr + streams_off + codes_off
    sm_dst = out_ptr + sm_at
    rem_dst = out_ptr + streams_off + rem_off
    esc_dst = out_ptr + streams_off + esc_off

    flags = tl.load(mrow + 1)
    zf = (flags >> 1) & 1
    low16 = flags & 1
    # The fast path: no +0.0 omitted and one sm byte per element (bf16, fp16,
    # fp32 LOW16), so element i's byte goes to position i.
    fast = (zf == 0) & ((ITEMSIZE == 2) | (low16 != 0))
    if mode == 0:
        write_raw_chunk(x_ptr, start, n, sm_dst, SUB, NSUB, ITEMSIZE)
    else:
        base = tl.load(mrow + 2)
        phase = tl.load(mrow + 3)
        lo, width = fixed_window(base, phase, zf, EMAX)
        if fast:
            # 8 bytes per store when the segment is 8-byte aligned (out_ptr is
            # a fresh allocation: 16-byte aligned; where the sm stream starts
            # depends on numel), and no masks when the chunk is full; else
            # byte stores, off the hot path (so is a tensor's last chunk).
            if (sm_at % 8 == 0) & (n == NSUB * SUB):
                _write_fast(x_ptr, start, n, lo, width, codes_dst,
                            out_ptr + tl.multiple_of(sm_at, 8), rem_dst, esc_dst, SUB, NSUB,
                            ITEMSIZE, EXP_BITS, MAN_BITS, True, PAIRS)
            else:
                _write_fast_bytes(x_ptr, start, n, lo, width, codes_dst, sm_dst, rem_dst,
                                  esc_dst, SUB, NSUB, ITEMSIZE, EXP_BITS, MAN_BITS)
        else:
            _write_general(x_ptr, start, n, lo, width, zf, low16, tl.load(mrow + 4), codes_dst,
                           sm_dst, rem_dst, esc_dst, SUB, NSUB, ITEMSIZE, EXP_BITS, MAN_BITS)
