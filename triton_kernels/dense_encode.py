"""dense encode (format v3): one kernel, one program per chunk.

A program takes its chunk id from an atomic ticket (so the look-back below
only ever waits on programs that have started), loads its chunk once (the
only read of the input), analyzes it, writes its chunk-table entry, computes
its padded segment size in 16-byte units, gets its segment offset from the
decoupled look-back (``_lookback.chunk_offset``), writes ``offsets[c]`` and
then its whole segment, padding included (format.py, "Body").

Hot path (``_encode_full``): a full chunk without exact zeros (and, fp32,
not taking LOWBYTE: it counts the nonzero low bytes to know), which is
what Gaussian data (FSDP parameters and gradients) gives. Every element is
kept, so its sm byte(s) and fp16 rem bits sit at its own index in their
streams and are stored as words, thread by thread; its rank depends on its
exponent alone; and its escapes (about one a thread in eight) are written
in rounds, one of each thread's a round (``_escape_rounds``). Cold
(noinline): a full chunk with zeros (``_encode_zeros``: it reads the chunk
again, from cache, and takes the kernel's analysis; its escapes in rounds
too, each kept element's sm bytes and fp16 rem bits at its rank among the
kept), an fp32 chunk that may take LOWBYTE (``_encode_general``: every
escape scattered at its rank as well), the ragged last chunk (the same code
with masks) and the raw copy of a chunk that does not shrink.

Layout. The chunk is a ``[T, G, 8]`` tile: T = 32 * num_warps threads, and
thread t holds the 8 * G consecutive elements ``t * 8G + g * 8 + q`` (its G
rows of 8 are one 16-byte load each for 16-bit words). Everything about a
thread's elements is computed inside the thread; what crosses threads is one
value per thread: the analysis sums (one int64 of packed fields), prefix
sums of the tier, kept and escape counts, and the stream windows below.

Ranks. An element's exponent offset from the chunk's base indexes a per-chunk
table of 16 rank fields (``_chunk_lut``): offsets -6..4 at 0..10 (any other
offset at 10: offset 4 is in no code table, so an escape), -0.0 and +0.0 at
11 and 12, each field holding 4 x the rank, the shift into the constant
tables by rank that give the tiers it opens, its digits and (a per-chunk
word) its escape and kept flags.

Tier streams. Tier t of the dense code is a bit stream of one digit per
element open at that tier, in element order. A thread packs its own digits
into a run (<= 64 bits) with in-thread shifts; its runs start at the
exclusive prefix of the threads' counts. Runs of neighbouring threads share
bytes (a run may be shorter than a byte), so the streams past tier 0 are
written by zeroing their granules, a barrier, and 32-bit atomic ORs of each
run's (at most three) words: no thread needs another's bits. The fp16 rem
stream (3 bits per kept element) is written the same way on the cold
path, a row of 8 elements (<= 24 bits, two words) at a time; on the hot
path a thread's 32 elements' bits are its own three words.
"""
from __future__ import annotations

import triton
import triton.language as tl

from zipccl_fsdp import format as F

from ._codec_common import (low_bit_index, lowbyte_wins, popc32, row_excl, store_words,
                            store_words24, ttile, words24)
from ._lookback import chunk_offset, finish_payload, place_zero_chunk, ticket

# The shape of the format this kernel is written for (fails loudly if it changes).
assert F.TIER_BITS == (2, 1, 1, 2, 2) and F.TIER_START == (0, 3, 4, 5, 8)
assert F.DENSE_SLOTS == 11 and F.DENSE_ESC == 11 and F.REM_BITS == 3
assert F.DENSE_ZERO_FIRST_SHIFT == 5 and F.ALIGN == 16
assert (F.FLAG_LOW16, F.FLAG_ZPOS, F.FLAG_ZNEG, F.FLAG_LOWBYTE) == (1, 2, 4, 8)
assert (F.MODE_RAW, F.MODE_CODED) == (0, 1) and F.CHUNK_ENTRY_NBYTES == 16
assert all(len(o) == F.DENSE_SLOTS - 1 for o in F.DENSE_ORDER)
assert all(-8 <= d <= 7 for o in F.DENSE_ORDER for d in o), "offsets must fit a nibble"


def _check_symbol_rule() -> None:
    """The kernel's rank rule against format.dense_symbol_table: rank of
    offset d = min(index in DENSE_ORDER + zpos + zneg, ESC); +0.0 has rank 0
    with ZPOS, 10 with neither flag, none with ZNEG only; -0.0 rank zpos with
    ZNEG."""
    for zp in (0, 1):
        for zn in (0, 1):
            for ph in range(4):
                table = F.dense_symbol_table(bool(zp), bool(zn), ph)
                for d in range(-8, 8):
                    order = F.DENSE_ORDER[ph]
                    want = table.index(d) if d in table else F.DENSE_ESC
                    got = min((order.index(d) if d in order else 15) + zp + zn, F.DENSE_ESC)
                    assert got == want, (zp, zn, ph, d)
                pos = table.index(F.ZERO_SYMBOL) if F.ZERO_SYMBOL in table else -1
                assert pos == (0 if zp else (-1 if zn else F.DENSE_SLOTS - 1))
                neg = table.index(F.NEG_ZERO_SYMBOL) if F.NEG_ZERO_SYMBOL in table else -1
                assert neg == (zp if zn else -1)


_check_symbol_rule()
ZERO_LAST = tl.constexpr(F.DENSE_SLOTS - 1)  # rank of +0.0 with neither zero flag
# The packed escape/kept counters: escapes in bits 0 .. KS - 1, kept elements
# from bit KS (a chunk's 4096 fit in both fields, and the kept field in an
# int32).
KS = tl.constexpr(18)
EM = tl.constexpr((1 << 18) - 1)


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


# ---------------------------------------------------------------------------
# Functions shared with dense_decode.py
# ---------------------------------------------------------------------------
@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _or(a, b):
    return a | b


# The encoder's element tile is [T, G, 8] (rows of 8), or [T, G, 2, 4] for
# fp32 (W4: each row as two halves of 4 words, one 16-byte load each; the
# ragged last chunk's too, whose scans across threads in the [T, G, 8] tile
# spilled). fp32 cannot have a [T, G, 8] tile in a blocked layout: the load's
# layout has 4 words a thread along the last axis, and a reshape of [T, 2G, 4]
# to [T, G, 8] gets a linear layout, which tl.cumsum cannot take, so the
# in-row scans ran across 8 threads in the default layout, with a layout
# conversion through shared memory each way. The 4-D tile is the load's
# blocked layout permuted. The functions below are the row operations of
# either tile.
@triton.jit
def _rsum(x, W4: tl.constexpr):
    """Row sums [T, G]."""
    if W4:
        r = tl.sum(tl.sum(x, axis=3), axis=2)
    else:
        r = tl.sum(x, axis=2)
    return r


@triton.jit
def _rcum(x, W4: tl.constexpr):
    """In-row inclusive prefix sums in element order (for W4: each half's
    scan, the first half's sum added to the second's)."""
    if W4:
        hs = tl.sum(x, axis=3)  # [T, G, 2]
        h = tl.arange(0, 2)[None, None, :]
        lo = tl.sum(tl.where(h == 0, hs, 0), axis=2)
        r = tl.cumsum(x, axis=3) + tl.where(h == 1, lo[:, :, None], 0)[:, :, :, None]
    else:
        r = tl.cumsum(x, axis=2)
    return r


@triton.jit
def _bt(x, W4: tl.constexpr):
    """A per-thread [T] value broadcastable to the element tile."""
    if W4:
        r = x[:, None, None, None]
    else:
        r = x[:, None, None]
    return r


@triton.jit
def _br(x, W4: tl.constexpr):
    """A per-row [T, G] value broadcastable to the element tile."""
    if W4:
        r = x[:, :, None, None]
    else:
        r = x[:, :, None]
    return r


@triton.jit
def _qidx(W4: tl.constexpr):
    """An element's index in its row (0..7), broadcastable to the tile."""
    if W4:
        r = tl.arange(0, 2)[None, None, :, None] * 4 + tl.arange(0, 4)[None, None, None, :]
    else:
        r = tl.arange(0, 8)[None, None, :]
    return r


@triton.jit
def _store_esc(at, kex, kpre, e, esc, W4: tl.constexpr):
    """The escaped elements' exponent bytes at ``at`` (the esc sub-stream),
    each at its escape rank: a pointer per thread plus the in-thread rank
    (the low field of the packed counters kex, kpre)."""
    tl.store(_bt(at + (kex & EM), W4) + (kpre & EM), e.to(tl.uint8), mask=esc != 0)


@triton.jit
def _kidx(G: tl.constexpr, W4: tl.constexpr):
    """An element's index among its thread's 8G, broadcastable to the tile."""
    if W4:
        r = tl.arange(0, G)[None, :, None, None] * 8 + _qidx(W4)
    else:
        r = tl.arange(0, G)[None, :, None] * 8 + _qidx(W4)
    return r


@triton.jit
def thread_excl(f, W4: tl.constexpr):
    """In-thread exclusive prefix sums (element order) of an element tile
    of packed counters (either shape, see _rsum), each thread's total ([T])
    and the prefix at each row's start ([T, G])."""
    rpre, tot = row_excl(_rsum(f, W4), f.shape[1])
    return _br(rpre, W4) + _rcum(f, W4) - f, tot, rpre


@triton.jit
def layout(n, coded, low16, lowbyte, nz, nesc, n_low, o1, o2, o3, o4, ITEMSIZE: tl.constexpr,
           IS_FP16: tl.constexpr):
    """format.segment_layout of one chunk: sub-stream lengths (codes, sm,
    rem, esc), the starts of sm, rem, esc inside the segment, and the
    padded segment size, all int32 bytes. With LOWBYTE (fp32) rem is the
    bitmap and the low stream (``n_low`` bytes) ends the segment, from
    a_esc + align16(esc)."""
    len0 = (2 * n + 7) >> 3
    codes = len0 + ((o1 + 7) >> 3) + ((o2 + 7) >> 3) + ((2 * o3 + 7) >> 3) + ((2 * o4 + 7) >> 3)
    kept = n - nz
    low = 0 * n
    if ITEMSIZE == 4:
        smb = 3 - 2 * low16 - lowbyte
        rem = tl.where(coded & (lowbyte != 0), (n + 7) >> 3, 0)
        low = tl.where(coded & (lowbyte != 0), n_low, 0)
    else:
        smb = 1
        if IS_FP16:
            rem = tl.where(coded, (3 * kept + 7) >> 3, 0)
        else:
            rem = 0 * n
    sm = tl.where(coded, kept * smb, n * ITEMSIZE)
    codes = tl.where(coded, codes, 0)
    esc = tl.where(coded, nesc, 0)
    a_sm = (codes + 15) & -16
    a_rem = a_sm + ((sm + 15) & -16)
    a_esc = a_rem + ((rem + 15) & -16)
    seg = a_esc + ((esc + 15) & -16) + ((low + 15) & -16)
    return codes, sm, rem, esc, a_sm, a_rem, a_esc, seg


@triton.jit
def zero_pad(ptr, start, end):
    """Zero bytes [start, end) of ptr; end - start < 16."""
    k = tl.arange(0, 16)
    tl.store(ptr + start + k, tl.zeros([16], tl.uint8), mask=start + k < end)


# ---------------------------------------------------------------------------
# Bit-stream runs
# ---------------------------------------------------------------------------
@triton.jit
def _or_run32(words, Q, run, lastw):
    """_or_run of a run of at most 32 bits (uint32 [T]) in 32-bit shifts."""
    s = Q & 31
    at = words + tl.minimum(Q >> 5, lastw)
    p0 = run << s
    p1 = (run >> 1) >> (31 - s)  # (two shifts below 32: s may be 0)
    tl.atomic_or(at, p0.to(tl.int32), sem="relaxed")
    tl.atomic_or(at + 1, p1.to(tl.int32), mask=p1 != 0, sem="relaxed")


@triton.jit
def _or_run(words, Q, run, lastw, WIDE: tl.constexpr):
    """OR a thread's run (uint64 [T], zeros above its length: <= 32 bits,
    or <= 64 with WIDE) into the zeroed 32-bit words at bit Q ([T]) of
    ``words``: one relaxed atomic per word past the first that it touches
    (none for zeros), and one on its first word, unmasked (an OR of 0 where
    the run is empty or its first bits are 0). That word is taken at most
    ``lastw``, the codes' last word: a run that starts past it is empty (its
    bits lie in the codes), and the words up to it hold the tier streams
    (atomics only), their zeroed padding and tier 0, all written before the
    barrier, so an OR of 0 there changes nothing and races with no store."""
    s = (Q & 31).to(tl.uint64)
    at = words + tl.minimum(Q >> 5, lastw)
    p0 = (run << s) & 0xFFFFFFFF
    p1 = (run >> (32 - s)) & 0xFFFFFFFF
    tl.atomic_or(at, p0.to(tl.int32), sem="relaxed")
    tl.atomic_or(at + 1, p1.to(tl.int32), mask=p1 != 0, sem="relaxed")
    if WIDE:
        p2 = (run >> 32) >> (32 - s)
        tl.atomic_or(at + 2, p2.to(tl.int32), mask=p2 != 0, sem="relaxed")


# ---------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------
@triton.jit(noinline=True)
def _write_raw(x_ptr, start, n, dst, ITEMSIZE: tl.constexpr, C: tl.constexpr,
               T: tl.constexpr):
    """A RAW chunk: its words, then zeros up to the segment's end (cold code)."""
    G: tl.constexpr = C // (8 * T)
    i = ttile(G, T)
    valid = i < n
    w = tl.load(x_ptr + start + i, mask=valid, other=0)
    tl.store(dst.to(x_ptr.dtype) + i, w, mask=valid)
    nb = n * ITEMSIZE
    zero_pad(dst, nb, (nb + 15) & -16)


def _rank_lut(order) -> int:
    """Nibble j (0..10): 2 + the index in ``order`` of exponent offset j - 6,
    13 when absent; a chunk's rank is min(nibble + zpos + zneg - 2, ESC).
    Offset 4 is in no table, so nibble 10 is an escape, and every offset
    outside -6..4 is given index 10 (``_exp_index4``). Nibbles 11 and 12 are
    replaced per chunk by those of -0.0 and +0.0 (_chunk_lut); 13..15 are
    not indexed."""
    assert all(-6 <= d <= 3 for o in F.DENSE_ORDER for d in o)
    acc = 0
    for j in range(16):
        d = j - 6
        acc |= ((order.index(d) + 2) if d in order and j <= 10 else 13) << (4 * j)
    return _signed64(acc)


def _by_rank(fn) -> int:
    """Nibble r (rank 0..11): fn(r), an int64 constant."""
    return _signed64(sum(fn(r) << (4 * r) for r in range(F.DENSE_SLOTS + 1)))


# The tiers a rank opens (bit t-1: rank >= start of tier t); tier-3 digit |
# tier-4 digit << 2 (format.rank_tiers; the tier-0 digit is min(rank, 3)).
RANK_M = tl.constexpr(_by_rank(lambda r: sum(1 << (t - 1) for t, st in enumerate(F.TIER_START)
                                             if t and r >= st)))
RANK_D = tl.constexpr(_by_rank(lambda r: (min(r - 5, 3) if r >= 5 else 0) | (
    (r - 8 if r >= 8 else 0) << 2)))
RL0, RL1, RL2, RL3 = (tl.constexpr(_rank_lut(o)) for o in F.DENSE_ORDER)
for _r in range(F.DENSE_SLOTS + 1):  # the constants agree with format.rank_tiers
    _digits = dict(F.rank_tiers(_r))
    assert [(RANK_M.value >> (4 * _r + t - 1)) & 1 for t in range(1, 5)] == [
        int(t in _digits) for t in range(1, 5)]
    assert min(_r, 3) == _digits[0]
    assert (RANK_D.value >> (4 * _r)) & 3 == _digits.get(3, 0)
    assert (RANK_D.value >> (4 * _r + 2)) & 3 == _digits.get(4, 0)


@triton.jit
def _pick64(i, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr):
    return tl.where(i == 0, tl.full([], A, tl.int64),
                    tl.where(i == 1, tl.full([], B, tl.int64),
                             tl.where(i == 2, tl.full([], C, tl.int64), tl.full([], D, tl.int64))))


SIGNED_8888 = tl.constexpr(_signed64(0x8888888888888888))
SIGNED_BBBB = tl.constexpr(_signed64(0xBBBBBBBBBBBBBBBB))


@triton.jit
def _exp_index4(e, base):
    """4 x the rank-table index of exponent e (the nibble's bit): its offset
    from the chunk's base plus 6 where that is 0..10, else 10 (an escape),
    by one multiply-add and one unsigned min: offsets below -6 wrap to large
    values."""
    return tl.minimum((4 * e + 4 * (6 - base)).to(tl.uint32), 40).to(tl.int32)


LUT_KEEP = tl.constexpr(_signed64(~(0xFF << 44) & (2**64 - 1)))  # all but nibbles 11, 12
# Kept flags by rank for the escape/kept word (_chunk_lut): bit KS + 4r.
KEPT_ALL = tl.constexpr(sum(1 << (KS.value + 4 * r) for r in range(F.DENSE_SLOTS + 1)))
KEPT_0 = tl.constexpr(1 << KS.value)
ESC_BIT = tl.constexpr(1 << (4 * F.DENSE_ESC))
EK_FLAGS = tl.constexpr(1 | (1 << KS.value))  # escape and kept bits of a packed counter


@triton.jit
def _chunk_lut(base, phase, zp, zn):
    """The chunk's exponent-index -> rank table, each rank times 4 in bits
    4j + 2 .. 4j + 5 for index j (so a shift by 4 x the index and a mask give
    4 x the rank, the shift into the rank tables): _rank_lut's nibbles with
    nibble 12 for +0.0 and 11 for -0.0 (format.dense_symbol_table: a flagged
    zero's rank, +0.0 last without flags, else the rank exponent 0 has),
    turned into ranks (min(nibble + zpos + zneg - 2, ESC)); and the chunk's
    escape/kept word: bit 4 ESC (rank ESC escapes) and bit KS + 4r (rank r
    has an sm byte, i.e. is not a zero without one), so that a shift by 4 x
    the rank and ``& (1 | 1 << KS)`` give both flags."""
    lut = _pick64(phase, RL0, RL1, RL2, RL3)
    z = zp + zn
    nat = ((lut >> _exp_index4(0, base).to(tl.int64)) & 15).to(tl.int32)
    pos_coded = (zp | (1 - zn)) != 0
    r_pos = tl.where(zp != 0, 0, ZERO_LAST)
    nib_pos = tl.where(pos_coded, r_pos + 2 - z, nat)
    nib_neg = tl.where(zn != 0, zp + 2 - z, nat)
    keep = tl.full([], LUT_KEEP, tl.int64)
    lut = (lut & keep) | (nib_neg.to(tl.int64) << 44) | (nib_pos.to(tl.int64) << 48)
    # Ranks: min(nibble + z - 2, ESC), for all 16 nibbles at once (every
    # nibble is at least 2 - z, so the subtraction borrows from none; 12
    # and 13, bits 3 and 2 set, become 11).
    lut = lut - (2 - z).to(tl.int64) * 0x1111111111111111
    big = (lut & (lut << 1) & tl.full([], SIGNED_8888, tl.int64)) >> 3
    big = (big & 0x1111111111111111) * 15
    lut = (lut & ~big) | (big & tl.full([], SIGNED_BBBB, tl.int64))
    k0 = tl.full([], KEPT_0, tl.int64)
    zk = tl.where(pos_coded, k0 << (4 * r_pos), 0) | tl.where(zn != 0, k0 << (4 * zp), 0)
    ekw = tl.full([], ESC_BIT, tl.int64) | (tl.full([], KEPT_ALL, tl.int64) & ~zk)
    return lut << 2, ekw


def _hot_rank_lut(phase: int) -> int:
    """4 x the rank of exponent index j (0..10: offset j - 6; index 10 is
    every offset outside -6..3, _exp_index4) in bits 4j + 2 .. 4j + 5, for a
    chunk with neither zero flag (format.dense_symbol_table: the phase's
    order, then +0.0, which a hot chunk does not hold; an offset outside the
    order is ESC)."""
    table = F.dense_symbol_table(False, False, phase)
    acc = 0
    for j in range(11):
        d = j - 6
        acc |= (table.index(d) if d in table else F.DENSE_ESC) << (4 * j)
    assert acc >> (4 * 10) == F.DENSE_ESC
    return acc << 2


HL0, HL1, HL2, HL3 = (tl.constexpr(_hot_rank_lut(ph)) for ph in range(4))


@triton.jit
def _hot_lut(phase):
    """_chunk_lut's rank table for a chunk without zero flags (indexes 0..10)."""
    return _pick64(phase, HL0, HL1, HL2, HL3)


@triton.jit
def _nib(lut, sh):
    return ((lut >> sh) & 15).to(tl.int32)


@triton.jit
def _eidx(G: tl.constexpr, T: tl.constexpr, W4: tl.constexpr):
    """An element's index in its chunk in the element tile: [T, G, 2, 4] with
    W4 (see _rsum), else ttile's [T, G, 8]."""
    if W4:
        r = (tl.arange(0, T)[:, None, None, None] * (8 * G)
             + tl.arange(0, G)[None, :, None, None] * 8
             + tl.arange(0, 2)[None, None, :, None] * 4 + tl.arange(0, 4)[None, None, None, :])
    else:
        r = ttile(G, T)
    return r


@triton.jit
def _load_full(x_ptr, start, c, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
               MAN_BITS: tl.constexpr, G: tl.constexpr, T: tl.constexpr):
    """A full chunk's words (the input's only read) and exponents: fp32 as the
    [T, G, 2, 4] tile (W4, see _rsum) in ``w``; 16-bit words as int32 pairs
    ``wp`` ([T, G, 4]), with their sm bytes (bytes 0 and 2 of ``sm8p``, the
    pairs' other bytes not theirs) and the sign-extended words ``w`` and
    exponents ``e`` of the [T, G, 8] tile."""
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    if ITEMSIZE == 4:
        # A row of 8 words is two 16-byte loads: the [T, G, 2, 4] tile.
        w = tl.load(x_ptr + start + _eidx(G, T, True))
        wp = w
        sm8p = w
        e = (w >> MAN_BITS) & EMAX
    else:
        # Pairs of 16-bit words as int32 [T, G, 4], split by shifts into
        # sign-extended elements: loaded as int16 and widened, LLVM packs
        # the element math into 16x2 SIMD ops with a repack per step.
        i2 = tl.arange(0, T)[:, None, None] * (4 * G) + tl.arange(0, G)[None, :, None] * 4 + (
            tl.arange(0, 4)[None, None, :])
        wp = tl.load(x_ptr.to(tl.pointer_type(tl.int32)) + start // 2 + i2)
        w = tl.reshape(tl.join((wp << 16) >> 16, wp >> 16), (T, G, 8))
        # The sm bytes of both words of a pair at once. bf16: the sign
        # moved next to the 7 mantissa bits (bits 7 and 23 taken from 8
        # above, one bit select; the mask ORs in c >> 31, which is 0 for a
        # chunk id, so that LLVM keeps the select, one LOP3, instead of
        # two ANDs with complementary constants and an OR); fp16: the low
        # mantissa byte.
        if IS_FP16:
            sm8p = wp
        else:
            msk = 0x00800080 | (c >> 31)
            sm8p = wp ^ ((wp ^ (wp >> 8)) & msk)
        # Both exponents of a pair by one shift and mask.
        ep = (wp >> MAN_BITS) & (EMAX | (EMAX << 16))
        e = tl.reshape(tl.join(ep & EMAX, ep >> 16), (T, G, 8))
    return w, wp, sm8p, e


@triton.jit
def _load_chunk(x_ptr, start, n, c, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                MAN_BITS: tl.constexpr, G: tl.constexpr, T: tl.constexpr, FULL: tl.constexpr):
    """Chunk c's words and exponents as _load_full gives them; for the ragged
    last chunk (not FULL) the element tile (_eidx; fp32's is W4) of its
    ``n`` words, zeros past them, 16-bit words sign-extended as the full
    chunk's (``wp`` and ``sm8p`` are the words too)."""
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    if FULL:
        w, wp, sm8p, e = _load_full(x_ptr, start, c, ITEMSIZE, EXP_BITS, MAN_BITS, G, T)
    else:
        i = _eidx(G, T, ITEMSIZE == 4)
        w = tl.load(x_ptr + start + i, mask=i < n, other=0).to(tl.int32)
        wp = w
        sm8p = w
        if ITEMSIZE == 2:
            w = (w << 16) >> 16
        e = (w >> MAN_BITS) & EMAX
    return w, wp, sm8p, e


@triton.jit
def _encode_chunk(x_ptr, out_ptr, status_ptr, total_ptr, numel, nch, table_off, offsets_off,
                  body_off, c, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                  MAN_BITS: tl.constexpr, C: tl.constexpr, T: tl.constexpr,
                  FULL: tl.constexpr):
    """Chunk c, any content: its analysis, table entry, offset and segment.
    FULL: the chunk has C elements. Cold code only (inlined into the
    noinline _encode_general and _encode_tail): the hot path is
    _encode_full's."""
    G: tl.constexpr = C // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    W4: tl.constexpr = ITEMSIZE == 4  # the [T, G, 2, 4] tile (_rsum)
    start = c.to(tl.int64) * C
    i = _eidx(G, T, W4)
    # --- load and analyze ---
    if FULL:
        n = C + 0 * c
        vi = 1
    else:
        n = tl.minimum(numel - start, C).to(tl.int32)
        vi = (i < n).to(tl.int32)
    w, wp, sm8p, e = _load_chunk(x_ptr, start, n, c, ITEMSIZE, EXP_BITS, MAN_BITS, G, T, FULL)
    if ITEMSIZE == 2:
        is_neg = w == -32768
    else:
        is_neg = (w != 0) & ((w & 0x7FFFFFFF) == 0)
    is_pos = w == 0
    if not FULL:
        is_pos = is_pos & (vi != 0)
    normal = (e - 1).to(tl.uint32) < EMAX - 1  # 0 < e < EMAX (padding has e = 0)
    # The locator's sums and both zero counts: in-thread fields of one int32
    # (sum e < 2^13, counts <= 32), then one int64 sum over the threads.
    v = tl.where(normal, e + (1 << 13), tl.where(is_pos, 1 << 19, tl.where(is_neg, 1 << 25, 0)))
    ts = tl.sum(_rsum(v, W4), axis=1)
    t64 = (ts & 0x1FFF).to(tl.int64) | (((ts >> 13) & 63).to(tl.int64) << 21) | (
        ((ts >> 19) & 63).to(tl.int64) << 34) | ((ts >> 25).to(tl.int64) << 47)
    tot = tl.sum(t64, axis=0)
    s_sum = (tot & 0x1FFFFF).to(tl.int32)
    k_norm = ((tot >> 21) & 0x1FFF).to(tl.int32)
    npos = ((tot >> 34) & 0x1FFF).to(tl.int32)
    nneg = ((tot >> 47) & 0x1FFF).to(tl.int32)
    qq = tl.where(k_norm > 0, (4 * s_sum) // tl.maximum(k_norm, 1), 0)
    base = qq >> 2
    phase = qq & 3
    low16 = _low16(w, ITEMSIZE, W4)
    zp = ((npos << 5) >= n).to(tl.int32)
    zn = ((nneg << 5) >= n).to(tl.int32)

    if npos == n:  # every element +0.0: a ZERO chunk, no segment (format.py)
        end = place_zero_chunk(out_ptr, status_ptr, c, table_off, offsets_off)
        if c == nch - 1:
            finish_payload(total_ptr, out_ptr, end, offsets_off, nch)
    else:
        # --- ranks (format.dense_symbol_table; see _check_symbol_rule) ---
        lut4, ekw = _chunk_lut(base, phase, zp, zn)
        idx4 = tl.where(is_pos, 48, tl.where(is_neg, 44, _exp_index4(e, base)))
        sh = ((lut4 >> idx4.to(tl.int64)) & 60).to(tl.int64)  # 4 x the rank
        # Escape (bit 0) and kept (bit KS) flags of the rank from the chunk's word.
        ek = ((ekw >> sh) & EK_FLAGS).to(tl.int32)
        # LOWBYTE (format.py): the elements whose low byte is not zero (the
        # padding's is) and the kept ones (those that ship sm), then the rule.
        n_low = 0 * n
        lowbyte = 0 * n
        if ITEMSIZE == 4:
            nk = (((w & 0xFF) != 0).to(tl.int32) << 16) | ((ek >> KS) * vi)
            nk = tl.sum(tl.sum(_rsum(nk, W4), axis=1), axis=0)
            n_low = nk >> 16
            lowbyte = ((low16 == 0) & lowbyte_wins(n, nk & 0xFFFF, n_low)).to(tl.int32)
        _encode_segment(x_ptr, out_ptr, status_ptr, total_ptr, nch, table_off, offsets_off,
                        body_off, c, start, n, w, wp, sm8p, e, sh, ek, vi, base, phase, low16,
                        lowbyte, n_low, zp, zn, ITEMSIZE, EXP_BITS, MAN_BITS, C, T, FULL, False,
                        False)


@triton.jit
def _low16(w, ITEMSIZE: tl.constexpr, W4: tl.constexpr):
    """fp32: 1 where every word of the chunk has zero low 16 bits (LOW16), else 0."""
    low16 = 0
    if ITEMSIZE == 4:
        lo = w & 0xFFFF
        if W4:
            lo = tl.reduce(lo, 3, _or)
        low16 = (tl.max(tl.reduce(tl.reduce(lo, 2, _or), 1, _or), 0) == 0).to(tl.int32)
    return low16


@triton.jit
def _encode_segment(x_ptr, out_ptr, status_ptr, total_ptr, nch, table_off, offsets_off, body_off,
                    c, start, n, w, wp, sm8p, e, sh, ek, vi, base, phase, low16, lowbyte, n_low,
                    zp, zn, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                    MAN_BITS: tl.constexpr, C: tl.constexpr, T: tl.constexpr,
                    FULL: tl.constexpr, HOT: tl.constexpr, ROUNDS: tl.constexpr):
    """Chunk c's tier streams, table entry, offset and segment, from its
    elements' ranks (``sh``: 4 x the rank) and escape (bit 0) and kept (bit
    KS) flags ``ek``. HOT (a full chunk with every element kept and no
    zero flag, _encode_full): ``ek`` holds the escape flags alone, and an
    element's sm byte(s) and rem bits are at its index in their streams,
    so they are stored as words, thread by thread; otherwise each kept
    element's are scattered to its rank among the kept. ROUNDS (HOT, and
    _encode_zeros' full chunks without LOWBYTE): the escapes are written in
    rounds (_escape_rounds), else scattered to their rank; and with LOWBYTE
    (never HOT) a row's bitmap byte is stored at its row index and each
    nonzero low byte at its rank among them (``n_low`` in all)."""
    G: tl.constexpr = C // (8 * T)
    # 16-byte granules per thread that cover a coded segment past tier 0
    # (smaller than the raw one).
    SG: tl.constexpr = (C * ITEMSIZE + 16 * T - 1) // (16 * T)
    SIGN_SHIFT: tl.constexpr = MAN_BITS + EXP_BITS
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    W4: tl.constexpr = ITEMSIZE == 4  # the [T, G, 2, 4] tile (_rsum)
    # The noinline calls (the raw segment, the last program's header) after
    # the coded writes: then no value of those writes is live across a call
    # (which may clobber any register), so they do not spill. fp16's hot path makes
    # the header's call right after the offset (with it last, ptxas
    # recomputes the sign-extended words, which counts more); its cold paths
    # make it last too (in the middle of them, the call's saves spilled). The
    # order of the writes does not matter: they are disjoint and the host
    # reads after the launch.
    FINISH_LAST: tl.constexpr = not IS_FP16 or not HOT
    m = _nib(tl.full([], RANK_M, tl.int64), sh)
    dv = _nib(tl.full([], RANK_D, tl.int64), sh)  # tier-3 digit | tier-4 digit << 2
    d0 = tl.minimum(sh.to(tl.int32), 12)  # 4 x the tier-0 digit, min(rank, 3)
    if not FULL:
        m = m * vi
        dv = dv * vi
        d0 = d0 * vi
        ek = ek * vi
    keep = ek >> KS
    # Open flags of tiers 1..4 in byte fields, the 2-bit tiers' counted twice
    # (bit positions): one multiply spreads m's bits (no carries: 0, 7, 15, 22).
    # The mask ORs in c >> 31 (0) so that LLVM does not narrow the in-row
    # prefix fields to their known bits: a field is then one PRMT, not a
    # shift and a narrow mask.
    f = ((m * 0x408081) & (0x02020101 | (c >> 31))).to(tl.uint32)
    fpre = _rcum(f, W4) - f
    frow = _rsum(f, W4)  # [T, G]
    q = _qidx(W4)
    r0 = _rsum(d0 << (2 * q), W4) >> 2
    # (The digit bits shifted where they are in m, the row's sum shifted back.
    # Tier 1's prefix is below 8, so & 31 keeps it whole: a wrap-mode shift
    # with no mask of its own.)
    r1 = _rsum((m & 2).to(tl.uint32) << (fpre & 31), W4) >> 1
    r2 = _rsum((m & 4).to(tl.uint32) << ((fpre >> 8) & 0xFF), W4) >> 2
    r3 = _rsum((dv & 3).to(tl.uint32) << ((fpre >> 16) & 0xFF), W4)
    r4 = _rsum((dv >> 2).to(tl.uint32) << (fpre >> 24), W4)
    rpre, ttot = row_excl(frow, G)  # a thread's fields stay below 65
    gq = tl.arange(0, G)[None, :]
    ttot = ttot.to(tl.int32)  # [T]
    # (1-bit tiers: a thread's run is at most 32 bits)
    run1 = tl.sum(r1 << (rpre & 0xFF), axis=1)
    run2 = tl.sum(r2 << ((rpre >> 8) & 0xFF), axis=1)
    run3 = tl.sum(r3.to(tl.uint64) << ((rpre >> 16) & 0xFF).to(tl.uint64), axis=1)
    run4 = tl.sum(r4.to(tl.uint64) << (rpre >> 24).to(tl.uint64), axis=1)
    if HOT:  # ek: a thread's escape mask (bit k: its element k)
        ktot = popc32(ek)
    else:
        # Escapes (low half) and kept elements (high half): in-thread ranks.
        esc = ek & 1
        kpre, ktot, krpre = thread_excl(ek, W4)
        if ROUNDS:  # the escapes written in rounds: a thread's as a mask
            emask = tl.sum(_rsum(esc << _kidx(G, W4), W4), axis=1)
            # The sm stores' mask: the elements up to the thread's last kept
            # one (fewer kept before it than in all). An element without sm
            # bytes before it stores at the next kept element's rank, which
            # that element, later in the thread's order of stores to one
            # address, overwrites: one compare an element instead of the
            # kept flags kept as predicates up to the stores.
            upto = kpre < _bt(ktot & ~EM, W4)
    L1 = ttot & 0xFF
    L2 = (ttot >> 8) & 0xFF
    L3 = (ttot >> 16) & 0xFF
    L4 = ttot >> 24
    cnt4 = L1.to(tl.int64) | (L2.to(tl.int64) << 16) | (L3.to(tl.int64) << 32) | (
        L4.to(tl.int64) << 48)
    in4, kin = tl.associative_scan((cnt4, ktot), 0, _add2)
    tot4, ktotal = tl.reduce((cnt4, ktot), 0, _add2)
    ex4 = in4 - cnt4
    kex = kin - ktot
    n_esc = ktotal & EM
    if HOT:
        nz = 0 * n
    else:
        nz = n - (ktotal >> KS)
    n1 = (tot4 & 0xFFFF).to(tl.int32)
    n2 = ((tot4 >> 16) & 0xFFFF).to(tl.int32)
    n3 = ((tot4 >> 33) & 0x7FFF).to(tl.int32)
    n4 = ((tot4 >> 49) & 0x7FFF).to(tl.int32)

    # --- raw or coded, the segment's size and offset ---
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg_c = layout(
        n, True, low16, lowbyte, nz, n_esc, n_low, n1, n2, n3, n4, ITEMSIZE, IS_FP16)
    raw_seg = (n * ITEMSIZE + 15) & -16
    coded = seg_c < raw_seg
    units = (tl.where(coded, seg_c, raw_seg) >> 4).to(tl.int64)
    off = chunk_offset(status_ptr, c, units)
    tl.store(out_ptr.to(tl.pointer_type(tl.int32)) + (offsets_off >> 2) + c, off.to(tl.int32))
    if not FINISH_LAST:
        if c == nch - 1:
            finish_payload(total_ptr, out_ptr, off + units, offsets_off, nch)
    flags = low16 | (zp << 1) | (zn << 2) | (lowbyte << 3)
    ent = out_ptr.to(tl.pointer_type(tl.int32)) + (table_off >> 2) + 4 * c.to(tl.int64)
    ci = coded.to(tl.int32)
    tl.store(ent, ci * (1 | (flags << 8) | (base << 16) | (phase << 24)))
    tl.store(ent + 1, ci * (nz | (n_esc << 16)))
    tl.store(ent + 2, ci * (n1 | (n2 << 16)))
    tl.store(ent + 3, ci * (n3 | (n4 << 16)))
    dst = out_ptr + body_off + 16 * off
    # The coded writes: the per-element scatters (sm, esc) in a uniform
    # branch each, so their masks do not carry ``coded`` (the compiler kept
    # that test per element: ~4 instructions an element); the rest predicated
    # on it. 0/1 int, not a bool: triton 3.9's interpreter takes no scalar
    # bool in a mask; ``x * 0 + cz != 0`` is a uniform mask the compiler folds.
    cz = coded.to(tl.int32)
    # Tier 0: a row's eight 2-bit digits are the 16-bit word 2 * row.
    rows = tl.arange(0, T)[:, None] * G + gq
    len0 = (2 * n + 7) >> 3
    if FULL:
        tl.store(dst.to(tl.pointer_type(tl.int16)) + rows, r0.to(tl.int16),
                 mask=rows * 0 + cz != 0)
    else:  # byte-wise: the last row may hold one byte
        tl.store(dst + 2 * rows, (r0 & 0xFF).to(tl.uint8), mask=2 * rows < len0 * cz)
        tl.store(dst + 2 * rows + 1, ((r0 >> 8) & 0xFF).to(tl.uint8),
                 mask=2 * rows + 1 < len0 * cz)
    p1 = (ex4 & 0xFFFF).to(tl.int32)
    p2 = ((ex4 >> 16) & 0xFFFF).to(tl.int32)
    p3 = ((ex4 >> 32) & 0xFFFF).to(tl.int32)
    p4 = ((ex4 >> 48) & 0xFFFF).to(tl.int32)
    b1 = len0
    b2 = b1 + ((n1 + 7) >> 3)
    b3 = b2 + ((n2 + 7) >> 3)
    b4 = b3 + ((2 * n3 + 7) >> 3)
    if seg_c < raw_seg:
        # The segment past tier 0 zeroed (wide stores; the padding of every
        # sub-stream with it), a barrier, then the byte scatters and each
        # thread's tier runs OR-ed in by 32-bit atomics (no scan of stream
        # windows over the threads; the barrier orders the zeros first).
        z0 = 16 * ((len0 + 15) >> 4)
        if FULL:  # a full chunk's tier 0 ends on a granule
            tl.static_assert((2 * C // 8) % 16 == 0)
        else:
            zero_pad(dst, len0, tl.minimum(z0, a_sm))
        store_words(dst + z0, tl.zeros([T, 4 * SG], tl.int32), seg_c - z0, T, 4 * SG)
        tl.debug_barrier()
    # esc: the escaped elements' exponent bytes, in order; scattered, for
    # fp16 and fp32 before sm (fewer values live across fp32's sm branch),
    # for bf16 after it, whichever counted fewer instructions
    # (``benchmarks/kernel_cost.py``); in rounds after it.
    ESC_FIRST: tl.constexpr = not (ITEMSIZE == 2 and MAN_BITS == 7) and not ROUNDS
    if ESC_FIRST:
        if seg_c < raw_seg:
            _store_esc(dst + a_esc, kex, kpre, e, esc, W4)
    # sm: the kept elements' sign+mantissa bytes at their rank among the kept.
    smv = (((w >> SIGN_SHIFT) & 1) << MAN_BITS) | (w & ((1 << MAN_BITS) - 1))
    # Ranks among the kept (high half) and escaped (low half) elements: a
    # pointer per thread at its first one, the in-thread rank added per element.
    sm_dst = dst + a_sm
    if HOT:
        if seg_c < raw_seg:
            _store_sm_rows(dst + 16 * (a_sm >> 4), smv, sm8p, low16, ITEMSIZE, G, T)
    elif ROUNDS and ITEMSIZE == 4:
        # (no LOWBYTE) an element's bytes from one address, at constant
        # offsets: LOW16's top byte, else all three
        kr = kpre >> KS
        if seg_c < raw_seg:
            if low16 != 0:
                tl.store(_bt(sm_dst + (kex >> KS), W4) + kr, (smv >> 16).to(tl.uint8),
                         mask=upto)
            else:
                at = _bt(sm_dst + 3 * (kex >> KS), W4) + 3 * kr
                tl.store(at, smv.to(tl.uint8), mask=upto)
                tl.store(at + 1, (smv >> 8).to(tl.uint8), mask=upto)
                tl.store(at + 2, (smv >> 16).to(tl.uint8), mask=upto)
    elif ITEMSIZE == 4:
        smb = 3 - 2 * low16 - lowbyte
        # LOW16: the top byte only, LOWBYTE: the top two (one shift, no select)
        smv = smv >> (16 * low16 + 8 * lowbyte)
        if seg_c < raw_seg:
            sm_at = _bt(sm_dst + (kex >> KS) * smb, W4) + (kpre >> KS) * smb
            tl.store(sm_at, (smv & 0xFF).to(tl.uint8), mask=keep != 0)
            # Bytes 1 and 2 in a uniform branch: a mask of ``keep`` and
            # ``not low16`` per element was kept as 32 predicates packed in a
            # register (two LOP3s an element to pack, more to unpack).
            if low16 == 0:
                tl.store(sm_at + 1, ((smv >> 8) & 0xFF).to(tl.uint8), mask=keep != 0)
                if lowbyte == 0:
                    tl.store(sm_at + 2, ((smv >> 16) & 0xFF).to(tl.uint8), mask=keep != 0)
                else:
                    _store_low(dst + a_rem, dst + a_esc + ((esc_nb + 15) & -16), w, vi, n, W4,
                               G, T)
    else:
        if FULL:
            sm8 = tl.reshape(tl.join(sm8p, sm8p >> 16), (T, G, 8))
        else:
            sm8 = smv
        if seg_c < raw_seg:
            if ROUNDS:
                tl.store((sm_dst + (kex >> KS))[:, None, None] + (kpre >> KS),
                         sm8.to(tl.uint8), mask=upto)
            else:
                tl.store((sm_dst + (kex >> KS))[:, None, None] + (kpre >> KS),
                         sm8.to(tl.uint8), mask=keep != 0)
    if HOT:
        if seg_c < raw_seg:
            _escape_rounds(x_ptr + start, dst + a_esc + kex, ek, ktot, c, EXP_BITS, MAN_BITS,
                           G, T)
    elif ROUNDS:
        if seg_c < raw_seg:
            _escape_rounds(x_ptr + start, dst + a_esc + (kex & EM), emask, ktot & EM, c,
                           EXP_BITS, MAN_BITS, G, T)
    elif not ESC_FIRST:
        if seg_c < raw_seg:
            _store_esc(dst + a_esc, kex, kpre, e, esc, W4)
    if seg_c < raw_seg:
        words = dst.to(tl.pointer_type(tl.int32))
        lastw = (a_sm >> 2) - 1
        _or_run32(words, 8 * b1 + p1, run1, lastw)
        _or_run32(words, 8 * b2 + p2, run2, lastw)
        _or_run(words, 8 * b3 + p3, run3, lastw, True)
        _or_run(words, 8 * b4 + p4, run4, lastw, True)
        if IS_FP16:
            # fp16 rem: the kept elements' 3 bits (sign, mantissa bits 9, 8)
            # in order.
            if HOT:
                _store_rem_rows(dst + 16 * (a_rem >> 4), wp, G, T)
            else:
                # A row's kept elements' 3 bits (<= 24) at their rank in the
                # row, OR-ed in at the row's first kept rank: two words a row.
                if FULL:
                    # Both words of a pair at once (sign to bit 2, mantissa bits
                    # 8, 9 to 0, 1), and an element without an sm byte (an exact
                    # zero, whose mantissa bits are 0) keeps none of its sign:
                    # the kept bit, moved to bit 2, ORed with 3 is the mask.
                    remp = ((wp >> 13) & 0x00040004) | ((wp >> 8) & 0x00030003)
                    rem3p = tl.reshape(tl.join(remp & 7, remp >> 16), (T, G, 8))
                    rem3 = rem3p & ((ek >> (KS - 2)) | 3)
                else:
                    rem3 = tl.where(keep != 0, ((w >> 13) & 4) | ((w >> 8) & 3), 0)
                rk = krpre >> KS  # kept elements before the row, in the thread
                run = tl.sum(rem3 << (3 * ((kpre >> KS) - rk[:, :, None])), axis=2).to(tl.uint64)
                bit = 3 * ((kex >> KS)[:, None] + rk)
                s3 = (bit & 31).to(tl.uint64)
                rw = words + (a_rem >> 2) + (bit >> 5)
                q0 = (run << s3) & 0xFFFFFFFF
                q1 = (run << s3) >> 32
                tl.atomic_or(rw, q0.to(tl.int32), mask=q0 != 0, sem="relaxed")
                tl.atomic_or(rw + 1, q1.to(tl.int32), mask=q1 != 0, sem="relaxed")
    if seg_c >= raw_seg:
        _write_raw(x_ptr, start, n, dst, ITEMSIZE, C, T)
    if FINISH_LAST:
        if c == nch - 1:
            finish_payload(total_ptr, out_ptr, off + units, offsets_off, nch)


@triton.jit
def _store_low(bitmap, low, w, vi, n, W4: tl.constexpr, G: tl.constexpr, T: tl.constexpr):
    """LOWBYTE's streams of an fp32 chunk (the element tile ``w``, ``vi``
    its elements below n): each row's bitmap byte at its row index (bit q:
    element q's low byte is not zero), and those bytes at their rank among
    them (like the escapes: in-thread ranks and one scan)."""
    lb = ((w & 0xFF) != 0).to(tl.int32) * vi
    rows = tl.arange(0, T)[:, None] * G + tl.arange(0, G)[None, :]
    tl.store(bitmap + rows, _rsum(lb << _qidx(W4), W4).to(tl.uint8), mask=8 * rows < n)
    lpre, ltot, _ = thread_excl(lb, W4)
    lex = tl.cumsum(ltot, axis=0) - ltot
    tl.store(_bt(low + lex, W4) + lpre, (w & 0xFF).to(tl.uint8), mask=lb != 0)


@triton.jit
def _store_sm_rows(at, smv, sm8p, low16, ITEMSIZE: tl.constexpr, G: tl.constexpr,
                   T: tl.constexpr):
    """The hot path's sm stream (every element kept: element k's bytes at
    k times their count), stored as words from ``at`` (16-byte aligned):
    16-bit words' sm bytes (bytes 0 and 2 of each pair of ``sm8p``) four to
    a word; fp32's 3-byte sign+mantissa values (``smv``, the [T, G, 2, 4]
    tile) four to three words, or with LOW16 their top bytes four to a
    word."""
    wd = at.to(tl.pointer_type(tl.int32))
    if ITEMSIZE == 4:
        a, b = tl.split(tl.reshape(smv, (T, G, 2, 2, 2)))  # a: entries 0, 2 of 4; b: 1, 3
        v0, v2 = tl.split(a)
        v1, v3 = tl.split(b)  # [T, G, 2]: a row's two halves
        h = tl.arange(0, T)[:, None, None] * (2 * G) + tl.arange(0, G)[None, :, None] * 2 + (
            tl.arange(0, 2)[None, None, :])  # the half's index in the chunk
        if low16 != 0:
            x = ((v0 >> 16) & 0xFF) | ((v1 >> 8) & 0xFF00) | (v2 & 0xFF0000) | (
                (v3 << 8) & -0x1000000)
            tl.store(wd + h, x)
        else:
            w0, w1, w2 = words24(v0, v1, v2, v3)
            tl.store(wd + 3 * h, w0)
            tl.store(wd + 3 * h + 1, w1)
            tl.store(wd + 3 * h + 2, w2)
    else:
        a, b = tl.split(tl.reshape(sm8p, (T, G, 2, 2)))  # [T, G, 2]: pairs 2j, 2j + 1
        x = (a & 0xFF) | ((a >> 8) & 0xFF00) | ((b & 0xFF) << 16) | ((b << 8) & -0x1000000)
        k = tl.arange(0, T)[:, None, None] * (2 * G) + tl.arange(0, G)[None, :, None] * 2 + (
            tl.arange(0, 2)[None, None, :])
        tl.store(wd + k, x)


@triton.jit
def _escape_rounds(x_ptr, at, mask, cnt, c, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                   G: tl.constexpr, T: tl.constexpr):
    """A hot chunk's escape bytes: escapes are rare (Gaussian data: about one
    a thread in eight), so each thread writes its own in rounds, one a
    round (the lowest set bit of its escape mask ``mask``), from ``at``
    (the thread's first escape byte) on, its exponent read from the
    element's word again (``x_ptr``: the chunk's first word; from cache).
    ``c``: the chunk id (from the ticket's atomic: a value the compiler
    cannot know, for the loop's step)."""
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    kmax = tl.max(cnt, axis=0)
    words = x_ptr + tl.arange(0, T) * (8 * G)
    k = kmax * 0
    one = (c >= 0).to(tl.int32)  # 1, but not to the compiler: it does not unroll the loop
    while k < kmax:  # offline: dense escape rounds
        live = mask != 0
        b = mask & -mask
        mask = mask ^ b
        w = tl.load(words + low_bit_index(b), mask=live, other=0).to(tl.int32)
        tl.store(at, ((w >> MAN_BITS) & EMAX).to(tl.uint8), mask=live)
        at = at + 1
        k = k + one


@triton.jit
def _store_rem_rows(at, wp, G: tl.constexpr, T: tl.constexpr):
    """The hot path's fp16 rem stream (every element kept: element k's 3 bits
    at bit 3k), from the [T, G, 4] word pairs ``wp``: a row's eight 3-bit
    values are 24 bits, a thread's four rows three words at ``at`` (16-byte
    aligned) + 12 t."""
    tl.static_assert(G == 4)
    # A pair's two 3-bit values (sign to bit 2, mantissa bits 8, 9 to 0, 1;
    # the second word's to bits 3..5).
    remp = ((wp >> 13) & 0x00040004) | ((wp >> 8) & 0x00030003)
    y = (remp | (remp >> 13)) & 0x3F
    row = tl.sum(y << (6 * tl.arange(0, 4)[None, None, :]), axis=2)  # [T, 4]
    store_words24(at, row, 12 * T, T, 1)


@triton.jit(noinline=True)
def _encode_general(x_ptr, out_ptr, status_ptr, total_ptr, numel, nch, table_off, offsets_off,
                    body_off, c, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                    MAN_BITS: tl.constexpr, C: tl.constexpr, T: tl.constexpr):
    """A full fp32 chunk that may take LOWBYTE (the kernel's lower bound of
    its nonzero low bytes, or _encode_zeros' count, passes the rule). Cold
    code: it reads the chunk again (from cache)."""
    _encode_chunk(x_ptr, out_ptr, status_ptr, total_ptr, numel, nch, table_off, offsets_off,
                  body_off, c, ITEMSIZE, EXP_BITS, MAN_BITS, C, T, True)


@triton.jit(noinline=True)
def _encode_zeros(x_ptr, out_ptr, status_ptr, total_ptr, numel, nch, table_off, offsets_off,
                  body_off, c, qq, nzero, low16, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                  MAN_BITS: tl.constexpr, C: tl.constexpr,
                  T: tl.constexpr):  # offline: zero path
    """A full chunk with ``nzero`` exact zeros of either sign (x * mask data:
    dropout, ReLU backward, routing masks), its locator ``qq`` (4 x base +
    phase) and ``low16`` from the kernel's analysis. Cold code: it reads the
    chunk again (from cache) and counts the zeros by sign. Its escapes are
    written in rounds as the hot path's (a flagged zero is no escape); each
    kept element's sm bytes and fp16 rem bits go to its rank among the kept.
    An fp32 chunk that takes LOWBYTE is _encode_general's, a ZERO chunk
    (every element +0.0) gets no segment."""
    G: tl.constexpr = C // (8 * T)
    W4: tl.constexpr = ITEMSIZE == 4  # the [T, G, 2, 4] tile (_rsum)
    start = c.to(tl.int64) * C
    w, wp, sm8p, e = _load_full(x_ptr, start, c, ITEMSIZE, EXP_BITS, MAN_BITS, G, T)
    if ITEMSIZE == 4:
        zero = (w << 1) == 0
    else:
        zero = (w << 17) == 0  # (w sign-extended)
    base = qq >> 2
    phase = qq & 3
    # The rank-table index (4 x): -0.0 at 11, +0.0 at 12 (_chunk_lut), so
    # that -0.0 is counted from it: in bits 0..15; fp32: the nonzero low
    # bytes from bit 16.
    idx4 = tl.where(zero, 48 + 4 * (w >> 31), _exp_index4(e, base))
    v = (idx4 == 44).to(tl.int32)
    if ITEMSIZE == 4:
        v = v | (((w & 0xFF) != 0).to(tl.int32) << 16)
    vs = tl.sum(tl.sum(_rsum(v, W4), axis=1), axis=0)
    nneg = vs & 0xFFFF
    npos = nzero - nneg
    zp = ((npos << 5) >= C).to(tl.int32)
    zn = ((nneg << 5) >= C).to(tl.int32)
    lowbyte = 0 * c
    if ITEMSIZE == 4:  # the flagged zeros are the elements without sm bytes
        lowbyte = ((low16 == 0) & lowbyte_wins(C, C - zp * npos - zn * nneg, vs >> 16)).to(
            tl.int32)
    if npos == C:  # every element +0.0: a ZERO chunk, no segment (format.py)
        end = place_zero_chunk(out_ptr, status_ptr, c, table_off, offsets_off)
        if c == nch - 1:
            finish_payload(total_ptr, out_ptr, end, offsets_off, nch)
    elif lowbyte != 0:
        _encode_general(x_ptr, out_ptr, status_ptr, total_ptr, numel, nch, table_off,
                        offsets_off, body_off, c, ITEMSIZE, EXP_BITS, MAN_BITS, C, T)
    else:
        lut4, ekw = _chunk_lut(base, phase, zp, zn)
        sh = ((lut4 >> idx4.to(tl.int64)) & 60).to(tl.int64)  # 4 x the rank
        ek = ((ekw >> sh) & EK_FLAGS).to(tl.int32)
        _encode_segment(x_ptr, out_ptr, status_ptr, total_ptr, nch, table_off, offsets_off,
                        body_off, c, start, C + 0 * c, w, wp, sm8p, e, sh, ek, 1, base, phase,
                        low16, 0, 0, zp, zn, ITEMSIZE, EXP_BITS, MAN_BITS, C, T, True, False,
                        True)


@triton.jit(noinline=True)
def _encode_tail(x_ptr, out_ptr, status_ptr, total_ptr, numel, nch, table_off, offsets_off,
                 body_off, c, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                 MAN_BITS: tl.constexpr, C: tl.constexpr, T: tl.constexpr):
    """The ragged last chunk (cold code)."""
    _encode_chunk(x_ptr, out_ptr, status_ptr, total_ptr, numel, nch, table_off, offsets_off,
                  body_off, c, ITEMSIZE, EXP_BITS, MAN_BITS, C, T, False)


@triton.jit
def _encode_full(x_ptr, out_ptr, status_ptr, total_ptr, numel, nch, table_off, offsets_off,
                 body_off, c, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                 MAN_BITS: tl.constexpr, C: tl.constexpr, T: tl.constexpr):
    """A full chunk: the hot path when it holds no exact zero of either sign
    (Gaussian data), else the cold _encode_zeros (fp32: or _encode_general
    for a chunk that may take LOWBYTE). Without zeros every
    element is kept (has its sm bytes), neither zero flag is set (their
    thresholds count zeros), and an element's rank depends on its exponent
    alone (subnormals, infinities and NaNs are escapes)."""
    G: tl.constexpr = C // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    W4: tl.constexpr = ITEMSIZE == 4
    tl.static_assert(254 * C < (1 << 21))
    start = c.to(tl.int64) * C
    w, wp, sm8p, e = _load_full(x_ptr, start, c, ITEMSIZE, EXP_BITS, MAN_BITS, G, T)
    normal = (e - 1).to(tl.uint32) < EMAX - 1  # 0 < e < EMAX
    if ITEMSIZE == 4:
        zero = (w << 1) == 0
    else:
        zero = (w << 17) == 0  # (w sign-extended)
    # The locator's sums and the zeros: in-thread fields of one int32 (sum
    # e < 2^13, counts <= 32), then one int64 sum over the threads (the
    # zeros from bit 34).
    v = tl.where(normal, e + (1 << 13), tl.where(zero, 1 << 19, 0))
    ts = tl.sum(_rsum(v, W4), axis=1)
    t64 = (ts & 0x1FFF).to(tl.int64) | (((ts >> 13) & 63).to(tl.int64) << 21) | (
        ((ts >> 19) & 63).to(tl.int64) << 34)
    if ITEMSIZE == 4:
        # fp32: and the rows of 8 whose low bytes are all nonzero (their least
        # is not 0), bits 48.. of the sum: 8 of them bound LOWBYTE's count of
        # nonzero low bytes from below (a hot chunk holds no zero; Gaussian
        # data has about 16 low bytes 0 a chunk, which cost the bound 128).
        rmin = tl.min(tl.min(w & 0xFF, axis=3), axis=2)  # [T, G]
        t64 = t64 | (tl.sum((rmin != 0).to(tl.int32), axis=1).to(tl.int64) << 48)
    tot = tl.sum(t64, axis=0)
    low16 = _low16(w, ITEMSIZE, W4)
    nzero = ((tot >> 34) & 0x1FFF).to(tl.int32)
    hot = nzero == 0
    if ITEMSIZE == 4:
        # A chunk that may take LOWBYTE is _encode_general's: one whose lower
        # bound of nonzero low bytes already fails the rule (it holds for
        # fewer bytes only; every element is kept: n - n_zero = C) stays.
        maybe_low = (low16 == 0) & lowbyte_wins(C, C, 8 * (tot >> 48))
        hot = hot & ~maybe_low
    s_sum = (tot & 0x1FFFFF).to(tl.int32)
    k_norm = ((tot >> 21) & 0x1FFF).to(tl.int32)
    qq = tl.where(k_norm > 0, (4 * s_sum) // tl.maximum(k_norm, 1), 0)
    if hot:
        base = qq >> 2
        phase = qq & 3
        idx4 = _exp_index4(e, base)
        sh = ((_hot_lut(phase) >> idx4.to(tl.int64)) & 60).to(tl.int64)  # 4 x the rank
        # Escapes: exponent index 10 (offsets outside -6..3), a thread's as
        # the bits of its mask (bit k: its element k).
        esc = tl.sum(_rsum(((idx4 + 24) >> 6) << _kidx(G, W4), W4), axis=1)
        _encode_segment(x_ptr, out_ptr, status_ptr, total_ptr, nch, table_off, offsets_off,
                        body_off, c, start, C + 0 * c, w, wp, sm8p, e, sh, esc, 1, base, phase,
                        low16, 0, 0, 0, 0, ITEMSIZE, EXP_BITS, MAN_BITS, C, T, True, True, True)
    elif nzero != 0:
        _encode_zeros(x_ptr, out_ptr, status_ptr, total_ptr, numel, nch, table_off,
                      offsets_off, body_off, c, qq, nzero, low16, ITEMSIZE, EXP_BITS, MAN_BITS,
                      C, T)
    else:  # (fp32: a chunk that may take LOWBYTE)
        _encode_general(x_ptr, out_ptr, status_ptr, total_ptr, numel, nch, table_off,
                        offsets_off, body_off, c, ITEMSIZE, EXP_BITS, MAN_BITS, C, T)


@triton.jit
def dense_encode_kernel(x_ptr, out_ptr, ticket_ptr, status_ptr, total_ptr, numel, nch,
                        table_off, offsets_off, body_off,
                        ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                        MAN_BITS: tl.constexpr, C: tl.constexpr, T: tl.constexpr):
    # Chunk ids in the order programs start, so the look-back only waits on
    # programs that run.
    c = ticket(ticket_ptr)
    if (c.to(tl.int64) + 1) * C <= numel:
        _encode_full(x_ptr, out_ptr, status_ptr, total_ptr, numel, nch, table_off, offsets_off,
                     body_off, c, ITEMSIZE, EXP_BITS, MAN_BITS, C, T)
    else:
        _encode_tail(x_ptr, out_ptr, status_ptr, total_ptr, numel, nch, table_off, offsets_off,
                     body_off, c, ITEMSIZE, EXP_BITS, MAN_BITS, C, T)
