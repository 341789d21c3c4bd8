"""Pieces the encode and decode kernels share: the format's constants as
``tl.constexpr`` and small ``@triton.jit`` helpers (field split, locator,
code tables, in-block bit packing).

Every constant is derived from ``zipccl_fsdp.format`` at import time, so the
kernels cannot drift from the format; the asserts say which shape of the
format these kernels assume (and fail loudly if the format changes it).

Code tables are packed into integers, 4 bits per entry, and looked up with a
shift: a per-element table lookup then costs two integer ops and no memory
access (a device LUT tensor would need a host-to-device copy per call or a
global cache).
"""
from __future__ import annotations

from types import MappingProxyType

import triton
import triton.language as tl

from zipccl_fsdp import format as F

# ---------------------------------------------------------------------------
# The shape of the format these kernels are written for.
# ---------------------------------------------------------------------------
assert F.FIXED_BITS == 3 and F.FIXED_ESC == 7 and F.REM_BITS == 3
assert F.TIER_BITS == (2, 1, 1, 2, 2), "the dense kernels unroll these five tiers"
assert all(c == (1 << b) - 1 for b, c in zip(F.TIER_BITS, F.TIER_SYMBOLS))  # all-ones = continue
assert F.DENSE_SLOTS == 11 and F.DENSE_ESC == 11
# dense_encode._tier_rows: rank + 16 - start lies in [0, 32) for ranks in [-1, DENSE_ESC].
assert all(-1 + 16 - s >= 0 and F.DENSE_ESC + 16 - s < 32 for s in F.TIER_START[1:])
assert F.DENSE_ESC == F.TIER_START[-1] + F.TIER_SYMBOLS[-1]  # the last tier's top digit
assert all(len(o) == F.DENSE_SLOTS - 1 for o in F.DENSE_ORDER)
assert all(-8 <= d <= 7 for o in F.DENSE_ORDER for d in o), "offsets must fit a nibble"
assert all(-8 <= d <= 7 for d in F.FIXED_LO + F.FIXED_LO_ZERO)
assert F.CHUNK_ENTRY_NBYTES == 16 and F.MODE_RAW == 0 and F.MODE_CODED == 1
assert (F.FLAG_LOW16, F.FLAG_ZERO) == (1, 2)


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _nibbles(values) -> int:
    """Pack small non-negative ints, entry i at bits [4i, 4i+4), as a signed int64."""
    acc = 0
    for i, v in enumerate(values):
        assert 0 <= v < 16
        acc |= v << (4 * i)
    return _signed64(acc)


def _ranks(order, zf: int) -> list[int]:
    """Entry d+8: the rank of exponent offset d under ``order`` and the
    ZERO_FIRST bit zf (its index in the order, + zf), DENSE_ESC if absent."""
    return [order.index(d - 8) + zf if d - 8 in order else F.DENSE_ESC for d in range(16)]


def _rank_lut(order, zf: int) -> int:
    return _nibbles(_ranks(order, zf))


def _sym_lut(order) -> int:
    """Nibble k holds order[k] + 8."""
    return _nibbles([d + 8 for d in order])


def kernel_constexprs(info: F.DTypeInfo, C: int, sub: int) -> MappingProxyType:
    """The constexprs every codec kernel takes, for chunks of C elements in
    sub-blocks of ``sub`` (at most the chunk, rounded up to a power of 2);
    read-only, since the launchers cache them."""
    sub = min(sub, max(8, triton.next_power_of_2(C)))
    return MappingProxyType(dict(ITEMSIZE=info.itemsize, EXP_BITS=info.exp_bits,
                                 MAN_BITS=info.man_bits, SUB=sub, NSUB=triton.cdiv(C, sub)))


# Dense code: per phase and ZERO_FIRST bit, offset -> rank (encode); per phase, order
# index -> offset (decode).
RANK_LUT0, RANK_LUT1, RANK_LUT2, RANK_LUT3 = (tl.constexpr(_rank_lut(o, 0))
                                              for o in F.DENSE_ORDER)
RANK_LUT0Z, RANK_LUT1Z, RANK_LUT2Z, RANK_LUT3Z = (tl.constexpr(_rank_lut(o, 1))
                                                  for o in F.DENSE_ORDER)
SYM_LUT0, SYM_LUT1, SYM_LUT2, SYM_LUT3 = (tl.constexpr(_sym_lut(o)) for o in F.DENSE_ORDER)


def _tier_of_rank(rank: int) -> int:
    """The dense tier whose digit ends an element of this rank; escapes
    (DENSE_ESC) get one past the last tier."""
    if rank == F.DENSE_ESC:
        return len(F.TIER_BITS)
    return max(t for t, s in enumerate(F.TIER_START) if rank >= s)


def _tier_lut(order, zf: int) -> int:
    """Nibble d+8 holds the tier of exponent offset d (ESC_TIER if absent)."""
    return _nibbles([_tier_of_rank(r) for r in _ranks(order, zf)])


# Dense analyze: offset -> tier, per phase, without and with ZERO_FIRST.
TIER_LUT0, TIER_LUT1, TIER_LUT2, TIER_LUT3 = (tl.constexpr(_tier_lut(o, 0))
                                              for o in F.DENSE_ORDER)
TIER_LUT0Z, TIER_LUT1Z, TIER_LUT2Z, TIER_LUT3Z = (tl.constexpr(_tier_lut(o, 1))
                                                  for o in F.DENSE_ORDER)
ESC_TIER = tl.constexpr(_tier_of_rank(F.DENSE_ESC))
ZERO_TIER_FIRST = tl.constexpr(_tier_of_rank(0))  # +0.0 under ZERO_FIRST: rank 0
ZERO_TIER_LAST = tl.constexpr(_tier_of_rank(F.DENSE_SLOTS - 1))  # without: the last rank
# fixed3 window start, nibble zf*4 + phase holds FIXED_LO(_ZERO)[phase] + 8.
FIXED_LO_LUT = tl.constexpr(_nibbles([v + 8 for v in F.FIXED_LO + F.FIXED_LO_ZERO]))

ZERO_SLOT_SHIFT = tl.constexpr(F.FIXED_ZERO_SLOT_SHIFT)
ZERO_FIRST_SHIFT = tl.constexpr(F.DENSE_ZERO_FIRST_SHIFT)
DENSE_ZERO_LAST = tl.constexpr(F.DENSE_SLOTS - 1)  # rank of +0.0 without ZERO_FIRST
DENSE_ESC = tl.constexpr(F.DENSE_ESC)
# Tiers 1..4 (tier 0 is 2 bits wide and holds every element).
T1_START, T2_START, T3_START, T4_START = (tl.constexpr(s) for s in F.TIER_START[1:])
T1_BITS, T2_BITS, T3_BITS, T4_BITS = (tl.constexpr(b) for b in F.TIER_BITS[1:])
T1_CAP, T2_CAP, T3_CAP, T4_CAP = (tl.constexpr(c) for c in F.TIER_SYMBOLS[1:])
T0_CAP = tl.constexpr(F.TIER_SYMBOLS[0])

# Codec ids as the kernels see them (constexpr: each codec compiles its own kernel).
FIXED3 = tl.constexpr(F.CODEC_IDS["fixed3"])
DENSE = tl.constexpr(F.CODEC_IDS["dense"])

# Bits of the decoders' error word (constexpr: the kernels read them).
ERR_TABLE = tl.constexpr(1)
ERR_TOTALS = tl.constexpr(2)
ERR_TIERS = tl.constexpr(4)
ERR_COUNTS = tl.constexpr(8)
ERR_EXPONENT = tl.constexpr(16)

# Segmented-scan flag bit inside each 16-bit field (packed values are 8 bits).
SEG_FLAG_BIT = tl.constexpr(15)
SEG_FLAG_MASK4 = tl.constexpr(0x0001000100010001)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
@triton.jit
def pick4(i, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr):
    """One of four int64 constants, by a runtime index in 0..3."""
    return tl.where(i == 0, tl.full([], A, tl.int64),
                    tl.where(i == 1, tl.full([], B, tl.int64),
                             tl.where(i == 2, tl.full([], C, tl.int64), tl.full([], D, tl.int64))))


@triton.jit
def nibble(lut, idx):
    return ((lut >> (4 * idx).to(tl.int64)) & 0xF).to(tl.int32)


@triton.jit
def split_fields(w, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr):
    """Exponent field and sign+mantissa field (sign on top) of int32 words."""
    e = (w >> MAN_BITS) & ((1 << EXP_BITS) - 1)
    sm = (((w >> (MAN_BITS + EXP_BITS)) & 1) << MAN_BITS) | (w & ((1 << MAN_BITS) - 1))
    return e, sm


@triton.jit
def join_fields(e, sm, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr):
    sign = (sm >> MAN_BITS) & 1
    return (sign << (MAN_BITS + EXP_BITS)) | (e << MAN_BITS) | (sm & ((1 << MAN_BITS) - 1))


@triton.jit
def locator_finish(s, k):
    """From the sum s and count k of the normal exponents (0 < e < emax):
    q = floor(4 * s / k), (base, phase) = (q >> 2, q & 3); 0 when k == 0."""
    q = tl.where(k > 0, (4 * s) // tl.maximum(k, 1), 0)  # both >= 0: // is floor
    return q >> 2, q & 3


@triton.jit
def fixed_window(base, phase, zf, EMAX: tl.constexpr):
    """fixed3: the exponent of code 0 (code 1 under ZERO_SLOT) and the window width."""
    width = 7 - zf
    lo = base + nibble(tl.full([], FIXED_LO_LUT, tl.int64), zf * 4 + phase) - 8
    lo = tl.minimum(tl.maximum(lo, 0), EMAX + 1 - width)
    return lo, width


@triton.jit
def dense_rank_table(phase, zf):
    """The chunk's offset -> rank table (RANK_LUT*) and the rank of +0.0."""
    lut = tl.where(zf != 0, pick4(phase, RANK_LUT0Z, RANK_LUT1Z, RANK_LUT2Z, RANK_LUT3Z),
                   pick4(phase, RANK_LUT0, RANK_LUT1, RANK_LUT2, RANK_LUT3))
    return lut, tl.where(zf != 0, 0, DENSE_ZERO_LAST)


@triton.jit
def dense_ranks(e, is_zero, base, lut, zero_rank):
    """Rank of each element in the chunk's dense symbol order (DENSE_ESC if
    absent), from dense_rank_table's table and +0.0 rank."""
    idx = e - base + 8
    rank = tl.where(idx.to(tl.uint32) < 16, nibble(lut, idx & 15), DENSE_ESC)
    return tl.where(is_zero, zero_rank, rank)


@triton.jit
def dense_symbols(rank, base, phase, zf):
    """Inverse of dense_ranks for ranks < DENSE_ESC: (exponent, is +0.0)."""
    is_zero = tl.where(zf != 0, rank == 0, rank == DENSE_ZERO_LAST)
    k = tl.minimum(tl.maximum(rank - zf, 0), DENSE_ZERO_LAST - 1)
    lut = pick4(phase, SYM_LUT0, SYM_LUT1, SYM_LUT2, SYM_LUT3)
    return base + nibble(lut, k) - 8, is_zero


@triton.jit
def tier_nbytes(n_open, BITS: tl.constexpr):
    """Bytes of a dense tier's part of a chunk: one BITS-bit digit per open element."""
    return (n_open * BITS + 7) >> 3


@triton.jit
def dense_codes_nbytes(n, o1, o2, o3, o4):
    """A dense chunk's codes segment (format.segment_nbytes): tier 0 holds
    all n elements, tiers 1..4 their open ones."""
    return ((2 * n + 7) >> 3) + tier_nbytes(o1, T1_BITS) + tier_nbytes(o2, T2_BITS) + (
        tier_nbytes(o3, T3_BITS) + tier_nbytes(o4, T4_BITS))


@triton.jit
def seg_combine4(a, b):
    """Segmented sum over four 16-bit fields of an int64; bit 15 of a field
    starts a new segment. Within a segment the values sum to at most 255 (they
    are digits at distinct bit offsets of one byte), so fields never carry."""
    restart = ((b >> SEG_FLAG_BIT) & SEG_FLAG_MASK4) * 0xFFFF
    return (a & ~restart) + b


@triton.jit
def seg_combine24(a, b):
    """Segmented sum of 24-bit groups; bit 24 starts a new segment."""
    restart = ((b >> 24) & 1) * 0x1FFFFFF
    return (a & ~restart) + b


@triton.jit
def load_entry(row, mask):
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
def store_words(ptr, w, mask, ITEMSIZE: tl.constexpr):
    """Store int32 words as the dtype's 16- or 32-bit words."""
    if ITEMSIZE == 2:
        tl.store(ptr, w.to(tl.int16), mask=mask)
    else:
        tl.store(ptr, w, mask=mask)


@triton.jit
def write_table_entry(mrow, out_ptr, table_off, c):
    """Chunk c's table entry from its meta row: 4 bytes, then 6 little-endian
    u16 counts."""
    f = tl.arange(0, 16)
    field = tl.load(mrow + tl.where(f < 4, f, 4 + (f - 4) // 2))
    byte = (field >> tl.where(f < 4, 0, 8 * ((f - 4) % 2))) & 0xFF
    tl.store(out_ptr + table_off + c.to(tl.int64) * 16 + f, byte.to(tl.uint8))


@triton.jit
def segment_lengths_offsets(seg_ptr, cum_ptr, nch, c):
    """Chunk c's segment lengths in (codes, sm, rem, esc) and their offsets
    from the streams' start (inclusive cumsum minus own length)."""
    seg_codes = tl.load(seg_ptr + c)
    seg_sm = tl.load(seg_ptr + nch + c)
    seg_rem = tl.load(seg_ptr + 2 * nch + c)
    seg_esc = tl.load(seg_ptr + 3 * nch + c)
    return (seg_codes, seg_sm, seg_rem, seg_esc,
            tl.load(cum_ptr + c) - seg_codes, tl.load(cum_ptr + nch + c) - seg_sm,
            tl.load(cum_ptr + 2 * nch + c) - seg_rem, tl.load(cum_ptr + 3 * nch + c) - seg_esc)


@triton.jit
def check_stream_ends(cum_ptr, nch, err_ptr, codes_end, sm_end, rem_end, esc_end):
    """(Program 0 of a decode kernel.) The stream ends per the table against
    the header's; sets ERR_TOTALS if they differ."""
    off = ((tl.load(cum_ptr + nch - 1) != codes_end)
           | (tl.load(cum_ptr + 2 * nch - 1) != sm_end)
           | (tl.load(cum_ptr + 3 * nch - 1) != rem_end)
           | (tl.load(cum_ptr + 4 * nch - 1) != esc_end))
    tl.atomic_or(err_ptr, ERR_TOTALS, mask=off)


@triton.jit(noinline=True)
def write_raw_chunk(x_ptr, start, n, sm_dst, SUB: tl.constexpr, NSUB: tl.constexpr,
                    ITEMSIZE: tl.constexpr):
    """Encode a raw chunk: its n words at x_ptr + start, little-endian, as
    its sm segment (cold code: a noinline function, see offline.py)."""
    for k in range(0, NSUB):
        i = k * SUB + (tl.arange(0, SUB // 8)[:, None] * 8 + tl.arange(0, 8)[None, :])
        valid = i < n
        w = tl.load(x_ptr + start + i, mask=valid, other=0).to(tl.int32)
        for b in tl.static_range(ITEMSIZE):
            tl.store(sm_dst + i * ITEMSIZE + b, ((w >> (8 * b)) & 0xFF).to(tl.uint8),
                     mask=valid)


@triton.jit(noinline=True)
def decode_raw_chunk(src, sm_off, seg_sm, sm_end, dst, n, SUB: tl.constexpr,
                     NSUB: tl.constexpr, ITEMSIZE: tl.constexpr):
    """Decode a raw chunk: its sm segment holds its words, little-endian;
    every load is masked to the segment and the stream's end."""
    for k in range(0, NSUB):
        i = k * SUB + (tl.arange(0, SUB // 8)[:, None] * 8 + tl.arange(0, 8)[None, :])
        valid = i < n
        w = tl.zeros([SUB // 8, 8], tl.int32)
        for b in tl.static_range(ITEMSIZE):
            at = i * ITEMSIZE + b
            idx = sm_off + at
            byte = tl.load(src + idx, mask=valid & (at < seg_sm) & (idx < sm_end), other=0)
            w = w | (byte.to(tl.int32) << (8 * b))
        store_words(dst + i, w, valid, ITEMSIZE)


@triton.jit
def store_analysis(meta_ptr, seg_ptr, c, nch, n, codes_nb, n_zero, n_esc, low16, zf, base,
                   phase, o1, o2, o3, o4, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr):
    """The end of an analyze kernel: chunk c's segment lengths
    (format.segment_nbytes), whether coding it beats its raw words, and its
    meta row (the table entry's fields; all zero for a raw chunk, whose sm
    segment holds its words)."""
    kept = n - n_zero
    smb = 1
    if ITEMSIZE == 4:
        smb = 3 - 2 * low16
    sm_nb = kept * smb
    rem_nb = 0
    if ITEMSIZE == 2 and EXP_BITS == 5:  # fp16: 3 rem bits per kept element
        rem_nb = (3 * kept + 7) >> 3
    coded = (codes_nb + sm_nb + rem_nb + n_esc) < n * ITEMSIZE
    f = tl.arange(0, 16)
    row = (tl.where(f == 0, 1, 0) + tl.where(f == 1, low16 + 2 * zf, 0)
           + tl.where(f == 2, base, 0) + tl.where(f == 3, phase, 0)
           + tl.where(f == 4, n_zero, 0) + tl.where(f == 5, n_esc, 0)
           + tl.where(f == 6, o1, 0) + tl.where(f == 7, o2, 0)
           + tl.where(f == 8, o3, 0) + tl.where(f == 9, o4, 0))
    tl.store(meta_ptr + c.to(tl.int64) * 16 + f, tl.where(coded, row, 0))
    tl.store(seg_ptr + c, tl.where(coded, codes_nb, 0))
    tl.store(seg_ptr + nch + c, tl.where(coded, sm_nb, n * ITEMSIZE))
    tl.store(seg_ptr + 2 * nch + c, tl.where(coded, rem_nb, 0))
    tl.store(seg_ptr + 3 * nch + c, tl.where(coded, n_esc, 0))
