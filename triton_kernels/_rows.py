"""Row tiles: the layout both codecs' kernels work in, and what they share on it.

A sub-block of ``SUB`` elements is a ``[SUB // 8, 8]`` tile (rows of 4 for
fp32 in the dense write kernel: a row is one 16-byte load) whose rows each
live in one thread (see fixed3_encode.py for why), so

- the input is read with 16-byte vector loads (16-bit words as int32 pairs
  where the input is 4-byte aligned),
- packing values into bytes is a per-thread shift-and-add,
- prefix sums scan one total per row across threads and finish inside the
  row (``row_ranks``),
- the analyze kernels' first pass (``locator_pass``: the locator's sums,
  the +0.0 count, the fp32 low-half check) reads the chunk once and, when it
  is one sub-block, leaves it in registers for the second pass.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._codec_common import locator_finish


@triton.jit
def tile_rows(x_ptr, start, n, k, SUB: tl.constexpr, ITEMSIZE: tl.constexpr,
              FULL: tl.constexpr = False, PAIRS: tl.constexpr = False, W: tl.constexpr = 8):
    """Sub-block k of the chunk at element ``start`` (n elements) as
    [SUB // W, W] words; also the row index r, the column q, the element
    index i within the chunk and which elements exist. FULL: the caller
    knows the chunk fills every sub-block, so nothing is masked. PAIRS (with
    FULL, 16-bit words, x 4-byte aligned): read as int32 pairs and split
    with two shifts; a 16-bit load leaves the words packed in registers, and
    the compiler unpacks them again at nearly every use (~9 PRMT an element
    in the write kernel). W: a row's elements; a 16-byte load holds 8 16-bit
    words but 4 fp32 ones, so rows of 8 fp32 words span two threads."""
    r = tl.arange(0, SUB // W)
    q = tl.arange(0, W)
    i = k * SUB + r[:, None] * W + q[None, :]
    # 16-bit words stay sign-extended: every field is taken with a shift and
    # a mask, and the sign extension keeps w == 0 exact. Except under PAIRS:
    # a low word keeps its neighbour above bit 15 (extending it cost 0.6
    # instructions an element), so its fields are exact but w == 0 is not;
    # PAIRS is for callers that test no zeros (fixed3's fast path).
    if FULL and PAIRS and ITEMSIZE == 2:
        valid = tl.full([SUB // 8, 8], True, tl.int1)
        j = k * (SUB // 2) + r[:, None] * 4 + tl.arange(0, 4)[None, :]
        w2 = tl.load(x_ptr.to(tl.pointer_type(tl.int32)) + start // 2 + j)
        w = tl.reshape(tl.join(w2, w2 >> 16), (SUB // 8, 8))
    elif FULL:
        valid = tl.full([SUB // W, W], True, tl.int1)
        w = tl.load(x_ptr + start + i).to(tl.int32)
    else:
        valid = i < n
        w = tl.load(x_ptr + start + i, mask=valid, other=0).to(tl.int32)
    return r, q, i, valid, w


@triton.jit
def sum2(x):
    return tl.sum(tl.sum(x, axis=1), axis=0)


# 16-bit words two at a time (``PAIRS``): each int32 lane below is a 16-bit
# field, and every lane operation stays inside its field (the comments say
# why), so one 32-bit operation tests two elements.
LANES = tl.constexpr(0x10001)  # a 1 in each 16-bit lane


@triton.jit
def pair_tile(x_ptr, start, n, k, SUB: tl.constexpr):
    """Sub-block k of 16-bit words as [SUB // 8, 4] uint32, two elements
    each, the lower-addressed one in the low lane; 0 past the chunk's end
    (the launcher makes n even)."""
    xp = x_ptr.to(tl.pointer_type(tl.int32))
    r = tl.arange(0, SUB // 8)
    h = tl.arange(0, 4)
    j = k * (SUB // 2) + r[:, None] * 4 + h[None, :]
    w = tl.load(xp + start // 2 + j, mask=j < n // 2, other=0)
    return w.to(tl.uint32, bitcast=True)


@triton.jit
def lane_sum(x):
    """The sum of both 16-bit lanes of every word of a tile (each lane's sum
    over a row of 4 words must fit 16 bits)."""
    row = tl.sum(x, axis=1)
    return tl.sum(((row & 0xFFFF) + (row >> 16)).to(tl.int32), axis=0)


@triton.jit
def locator_part_pairs(w, MAN_BITS: tl.constexpr, EMAX: tl.constexpr):
    """locator_part for 16-bit words two at a time. Lanes hold exponents
    e <= 255: e + 255 and e + 256 - EMAX stay below 512, so bit 8 of a lane
    says e >= 1 and e == EMAX; (lane & 0x7FFF) + 0x7FFF stays below 0x10000,
    so its bit 15, or the lane's own, says the word is not 0. The exponent
    sum is over all lanes, less EMAX for each e == EMAX; normal = (e >= 1)
    - (e == EMAX)."""
    E2 = (w >> MAN_BITS) & (EMAX * LANES)
    ge1 = (E2 + 0xFF * LANES) & (0x100 * LANES)
    top = (E2 + (0x100 - EMAX) * LANES) & (0x100 * LANES)
    nonzero = (((w & (0x7FFF * LANES)) + 0x7FFF * LANES) | w) & (0x8000 * LANES)
    zero = nonzero ^ (0x8000 * LANES)
    s_all = lane_sum(E2)  # a row's lane: 4 words x 255
    n_top = lane_sum(top >> 8)
    # e >= 1 at bit 0 and +0.0 at bit 8 of each lane: one reduction for both
    # (a row's field counts at most 4 per lane, 8 once the lanes are added).
    row = tl.sum((ge1 >> 8) | (zero >> 7), axis=1)
    v = (row & 0xFFFF) + (row >> 16)
    both = tl.sum(((v & 0xFF) | ((v >> 8) << 16)).to(tl.int32), axis=0)
    return s_all - EMAX * n_top, both - n_top  # normal | +0.0 << 16


@triton.jit
def locator_part(w, MAN_BITS: tl.constexpr, EMAX: tl.constexpr, ITEMSIZE: tl.constexpr):
    """Sum of normal exponents; normal count | +0.0 count << 16; words with
    nonzero low 16 bits (fp32). Past the chunk's end w is 0, which counts as
    a +0.0 only: the caller subtracts those."""
    e = (w >> MAN_BITS) & EMAX
    normal = (e - 1).to(tl.uint32) < EMAX - 1  # 0 < e < EMAX
    s = sum2(tl.where(normal, e, 0))
    cz = sum2(normal.to(tl.int32) | ((w == 0).to(tl.int32) << 16))
    low = tl.zeros([], tl.int32)
    if ITEMSIZE == 4:
        low = sum2(((w & 0xFFFF) != 0).to(tl.int32))
    return s, cz, low


@triton.jit
def store_rows3(dst, acc, r, nbytes, FULL: tl.constexpr = False):
    """Store the 3 low bytes of each row's 24-bit value at dst + 3 * row,
    those below nbytes (all of them if FULL). Three row vectors, not a
    [rows, 4] byte tile: a tile whose rows are 3 bytes apart gets a layout of
    4 threads per row, and the row's codes would have to move between
    threads to get there."""
    for b in tl.static_range(3):
        at = 3 * r + b
        byte = ((acc >> (8 * b)) & 0xFF).to(tl.uint8)
        if FULL:
            tl.store(dst + at, byte)
        else:
            tl.store(dst + at, byte, mask=at < nbytes)


@triton.jit
def pack_rows3(v, q):
    """Each row's eight 3-bit values as one 24-bit value, value q at bit 3q."""
    return tl.sum(v << (3 * q)[None, :], axis=1)


@triton.jit
def row_ranks(flags, base):
    """Inclusive prefix sums, in element order, of a [rows, W] tile of packed
    counters, plus ``base``; and the tile's total. Each row is summed in its
    thread, the row totals are scanned across threads, the row finishes the
    scan locally."""
    row = tl.sum(flags, axis=1)
    incl = tl.cumsum(row, 0)
    ranks = base + (incl - row)[:, None] + tl.cumsum(flags, 1)
    return ranks, tl.sum(row, axis=0)


@triton.jit
def locator_pass(x_ptr, start, n, SUB: tl.constexpr, NSUB: tl.constexpr,
                 ITEMSIZE: tl.constexpr, MAN_BITS: tl.constexpr, EMAX: tl.constexpr,
                 PAIRS: tl.constexpr = False):
    """Pass 1 of an analyze kernel over the chunk at element ``start`` (n
    elements): the locator (base, phase), the +0.0 words, the fp32 LOW16
    flag, the tile's padding past n, and the chunk's tile for pass 2 when
    it is one sub-block (int32 pairs if PAIRS; else the last sub-block).

    Per-element masks cost predicate registers (a thread holds 32 elements
    of a 4096-element chunk); instead, the padding, all w = 0, is taken out
    of the counts here and by pass 2. PAIRS: 16-bit words read and tested
    two at a time (the launcher sets it when x is 4-byte aligned and every
    chunk's length is even)."""
    pad = NSUB * SUB - n
    low_bits = tl.zeros([], tl.int32)
    if PAIRS:
        w = pair_tile(x_ptr, start, n, 0, SUB)
        s, cz = locator_part_pairs(w, MAN_BITS, EMAX)
    elif NSUB == 1:
        r, q, i, valid, w = tile_rows(x_ptr, start, n, 0, SUB, ITEMSIZE)
        s, cz, low_bits = locator_part(w, MAN_BITS, EMAX, ITEMSIZE)
    else:
        s = tl.zeros([], tl.int32)
        cz = tl.zeros([], tl.int32)
        w = tl.zeros([SUB // 8, 8], tl.int32)
        for k in range(0, NSUB):
            r, q, i, valid, w = tile_rows(x_ptr, start, n, k, SUB, ITEMSIZE)
            ds, dcz, dlow = locator_part(w, MAN_BITS, EMAX, ITEMSIZE)
            s += ds
            cz += dcz
            low_bits += dlow
    base, phase = locator_finish(s, cz & 0xFFFF)
    nz = ((cz >> 16) & 0xFFFF) - pad
    low16 = 0
    if ITEMSIZE == 4:
        low16 = (low_bits == 0).to(tl.int32)
    return base, phase, nz, low16, pad, w
