"""dense decode (format v3): one kernel, one program per chunk, no scan over chunks.

Program c reads its chunk-table entry and ``offsets[c]`` (format.py,
"Body"), checks both (the entry by format.validate_table's rules; the
offset against the next one, or the body's end for the last chunk, so the
chained checks of all chunks are format.validate_offsets; the segment inside
the body; every padding byte zero), and decodes its segment: tier 0 holds
every element's first digit at a fixed place; each later tier's digits are
found by an in-thread prefix of the elements still open plus one prefix sum
across the threads, and read with two aligned 8-byte loads per thread. The
decoded tier-open, escape and kept counts and the exponent range are checked
against the table (per thread, at the thread that holds the chunk's last
element, and one OR over the threads at the end). Errors set bits of a
device word (``ERR_*``), read by the caller once, at the end; nothing is
decoded from a chunk whose entry or offset is bad, and every load stays
inside the chunk's segment.

Hot path: a full CODED chunk without zeros (n_zero 0, no zero flag: what
Gaussian data gives). Every element is kept, so its sm byte(s) and fp16 rem
bits are read as words at its own index, thread by thread; the escaped
elements' exponents (about one a thread in eight) are written after the
block's store, one of each thread's a round (``_patch_escapes``). Cold
(noinline): a full chunk with zeros (``_decode_zeros``: the kept elements'
sm bytes read at their rank among the kept, every element's escape byte at
its rank), RAW chunks, and chunks that are not a full ``[T, 4, 8]`` tile:
the ragged last one, and payloads whose chunk size is not 4096 (the format
allows 8..65535, a multiple of 8; such a chunk is decoded in sub-blocks of
up to 4096 elements, each tier's stream position, the escape and the kept
rank carried from one to the next); and fp32 LOWBYTE chunks, decoded that
way too, their low bytes then ORed into the words (``_patch_low``), after
the bitmap's set bits were counted to check the offsets.

Layout: the ``[T, G, 8]`` tile of dense_encode.py (thread t holds elements
t * 8G .. t * 8G + 8G - 1).
"""
from __future__ import annotations

import triton
import triton.language as tl

from zipccl_fsdp import format as F

from .dense_encode import _or, layout
from ._codec_common import (bitmap_count, bitmap_row, load_words24, low_bit_index, popc32,
                            row_excl, store_zero_words, ttile)

# Error bits: the decoders' shared word (_codec_common.py).
from ._codec_common import (ERR_COUNTS, ERR_EXPONENT, ERR_OFFSETS, ERR_PADDING,  # noqa: E402
                            ERR_TABLE, ERR_TIERS)

assert F.TIER_BITS == (2, 1, 1, 2, 2) and F.DENSE_SLOTS == 11 and F.REM_BITS == 3

# A block's escape and kept ranks share an int32: kept ones in the low
# ESC_AT bits, escapes above (counts <= 4096 each, so neither overflows).
ESC_AT = tl.constexpr(17)
KEPT_MASK = tl.constexpr((1 << 17) - 1)
ESC_KX = tl.constexpr(1 << (17 + F.DENSE_ESC))  # _kept_esc_word's ESC bit


def _sym_lut(zp: int, zn: int, phase: int, zeros=(15, 14)) -> int:
    """Nibble r: symbol of rank r (format.dense_symbol_table) as offset + 8,
    zeros[0] for +0.0, zeros[1] for -0.0; nibble 11 (ESC: the escape byte
    replaces it) 8 (int64 constant)."""
    acc = 0
    table = F.dense_symbol_table(bool(zp), bool(zn), phase)
    for r, s in enumerate(table + (0,)):
        v = zeros[0] if s == F.ZERO_SYMBOL else zeros[1] if s == F.NEG_ZERO_SYMBOL else s + 8
        assert 0 <= v < 14 or s in (F.ZERO_SYMBOL, F.NEG_ZERO_SYMBOL)
        acc |= v << (4 * r)
    return acc - (1 << 64) if acc >= 1 << 63 else acc


SYM = tuple(tl.constexpr(_sym_lut(zp, zn, ph)) for zp in (0, 1) for zn in (0, 1)
            for ph in range(4))
(S00, S01, S02, S03, S10, S11, S12, S13, S20, S21, S22, S23, S30, S31, S32, S33) = SYM
# The same with both zeros' nibbles 8 (offset 0: base + 0 is an exponent of
# the dtype), for the full-chunk decoder, which tells zeros by _kept_esc_word.
SYMF = tuple(tl.constexpr(_sym_lut(zp, zn, ph, (8, 8))) for zp in (0, 1) for zn in (0, 1)
             for ph in range(4))
(F00, F01, F02, F03, F10, F11, F12, F13, F20, F21, F22, F23, F30, F31, F32, F33) = SYMF
# SYMF's nibbles 0..10 are DENSE_ORDER[phase]'s (offset + 8) shifted up by
# one nibble per coded zero, with 8 below them (the zeros) and, with neither
# flag, in nibble 10 (+0.0) above: the four orders with an 8 in nibble 10
# are enough to build them (_sym_full). Nibble 11 (ESC) is not read in a
# full chunk, whose escapes take the escape byte.
ORD = tuple(tl.constexpr(sum((o + 8) << (4 * r) for r, o in enumerate(order)) | 8 << 40)
            for order in F.DENSE_ORDER)
(O0, O1, O2, O3) = ORD
assert all(_sym_lut(zp, zn, ph, (8, 8)) & ((1 << 44) - 1) == (
    (ORD[ph].value << (4 * (zp + zn))) | (0x88 >> (4 * (2 - zp - zn)))) & ((1 << 44) - 1)
    for zp in (0, 1) for zn in (0, 1) for ph in range(4))


@triton.jit
def _pick_i64(i, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr):
    """A, B, C or D for i = 0, 1, 2, 3 (i is a checked phase: 0..3), by i's two bits."""
    odd = (i & 1) != 0
    return tl.where((i & 2) == 0,
                    tl.where(odd, tl.full([], B, tl.int64), tl.full([], A, tl.int64)),
                    tl.where(odd, tl.full([], D, tl.int64), tl.full([], C, tl.int64)))


@triton.jit
def _sym_full(zp, zn, phase):
    """SYMF's table of (zp, zn, phase) in nibbles 0..10 (ranks 0..10), built
    from the phase's order (ORD); nibbles 11 and above are not SYMF's."""
    z = zp + zn
    o = _pick_i64(phase, O0, O1, O2, O3)
    return (o << (4 * z).to(tl.int64)) | (0x88 >> (8 - 4 * z))


@triton.jit
def _sym_table(zp, zn, phase, FULL: tl.constexpr):
    """The chunk's rank -> symbol nibbles (_sym_lut): SYM's, or for a full
    chunk SYMF's (the zeros' nibbles 8)."""
    if FULL:
        t0 = _pick_i64(phase, F00, F01, F02, F03)
        t1 = _pick_i64(phase, F10, F11, F12, F13)
        t2 = _pick_i64(phase, F20, F21, F22, F23)
        t3 = _pick_i64(phase, F30, F31, F32, F33)
    else:
        t0 = _pick_i64(phase, S00, S01, S02, S03)
        t1 = _pick_i64(phase, S10, S11, S12, S13)
        t2 = _pick_i64(phase, S20, S21, S22, S23)
        t3 = _pick_i64(phase, S30, S31, S32, S33)
    return tl.where(zp != 0, tl.where(zn != 0, t3, t2), tl.where(zn != 0, t1, t0))


def _kx(zp: int, zn: int, sign_at: int) -> int:
    """_kept_esc_word's value for the zero flags (zp, zn)."""
    table = F.dense_symbol_table(bool(zp), bool(zn), 0)
    zeros = [r for r, s in enumerate(table) if s in (F.ZERO_SYMBOL, F.NEG_ZERO_SYMBOL)]
    kept = sum(1 << r for r in range(F.DENSE_SLOTS + 1) if r not in zeros)
    neg = [r for r, s in enumerate(table) if s == F.NEG_ZERO_SYMBOL]
    return kept | ESC_KX.value | sum(1 << (sign_at + r) for r in neg)


KX15 = tuple(tl.constexpr(_kx(zp, zn, 15)) for zp in (0, 1) for zn in (0, 1))
KX31 = tuple(tl.constexpr(_kx(zp, zn, 31)) for zp in (0, 1) for zn in (0, 1))
(KA00, KA01, KA10, KA11), (KB00, KB01, KB10, KB11) = KX15, KX31
assert all(k.value < 1 << 31 for k in KX15)
# A chunk without zeros (_decode_full's HOT): shifted right by a rank r, bit 0
# says r is the rank of +0.0 (10: with no zero flag it has no sm byte, so
# in a chunk whose n_zero is 0 no element has it), bit ESC_AT that r is ESC.
KX_HOT = tl.constexpr((1 << F.dense_symbol_table(False, False, 0).index(F.ZERO_SYMBOL))
                      | ESC_KX.value)


@triton.jit
def _kept_esc_word(zp, zn, SIGN_AT: tl.constexpr):
    """Shifted right by a rank r: bit 0 says r is kept (has an sm byte: all
    ranks 0..11 but the coded zeros', format.dense_symbol_table: +0.0 at
    rank 0 with ZPOS, at 10 with neither flag, none with ZNEG only; -0.0 at
    rank zpos with ZNEG), bit ESC_AT that r is ESC (bit 28: only r = 11
    lands it there, bits 17..27 are clear), and bit 15, for a zero, its
    sign (bit 15 + r: -0.0 has rank 0 or 1; the rank 10 of +0.0 reads bit
    25, clear), so a zero's 16-bit word is the shifted word's bit 15. With
    SIGN_AT 31 (32-bit words) the sign is at bit 31 + r of an int64 instead
    (bits 31, 32 and 41 are otherwise clear), and the low 32 bits of the
    shifted word hold a zero's word. One of four constants (_kx), picked
    by the two flags."""
    if SIGN_AT == 31:
        k00 = tl.full([], KB00, tl.int64)
        k01 = tl.full([], KB01, tl.int64)
        k10 = tl.full([], KB10, tl.int64)
        k11 = tl.full([], KB11, tl.int64)
    else:
        k00 = tl.full([], KA00, tl.int32)
        k01 = tl.full([], KA01, tl.int32)
        k10 = tl.full([], KA10, tl.int32)
        k11 = tl.full([], KA11, tl.int32)
    return tl.where(zp != 0, tl.where(zn != 0, k11, k10), tl.where(zn != 0, k01, k00))


@triton.jit
def _pad_bad(ptr, start, end):
    """Whether a byte of [start, end) at ptr is not zero, where ptr is 16-byte
    aligned, end a multiple of 16 and end - start < 16 (the padding after a
    sub-stream): the two 8-byte words before end, read by every thread."""
    live = start < end
    blk = tl.maximum(end - 16, 0)
    w = (ptr + blk).to(tl.pointer_type(tl.int64))
    lo = tl.load(w, mask=live, other=0).to(tl.uint64, bitcast=True)
    hi = tl.load(w + 1, mask=live, other=0).to(tl.uint64, bitcast=True)
    sh = 8 * (start - blk)  # bits of data below the padding: 8..120 when live
    lo_bad = (sh < 64) & ((lo >> tl.minimum(sh, 63).to(tl.uint64)) != 0)
    hi_bad = (hi >> tl.maximum(sh - 64, 0).to(tl.uint64)) != 0
    return (live & (lo_bad | hi_bad)).to(tl.int32)


@triton.jit
def _excl(f, G: tl.constexpr):
    """In-thread exclusive prefix sums (element order) of a [T, G, 8] tile,
    the thread's total ([T]) and the prefix of each row ([T, G, 1]). (The
    rows' scan runs on [T, G, 1], not on the [T, G] of a plain sum: a scan
    of a sliced layout is moved to another layout through shared memory.)"""
    inc = tl.cumsum(f, axis=2)
    row = tl.sum(f, axis=2, keep_dims=True)  # [T, G, 1]
    rinc = tl.cumsum(row, axis=1)
    tot = tl.sum(tl.sum(row, axis=2), axis=1)
    rpre = rinc - row
    return inc - f + rpre, tot, rpre


@triton.jit
def _tier(codes64, nwords, pos, opened, G: tl.constexpr, BITS: tl.constexpr):
    """One tier: the digits of the open elements (``opened``: 0/1; 0 where
    not open) from the tier's bit stream, which continues at bit ``pos`` of
    the codes sub-stream (``nwords`` 8-byte words, padding included; no
    read goes past them), and where each thread's run ends ([T] bit positions).
    A thread's run (<= 64 bits) is shifted to each row's first digit once
    per row, so an element's digit sits at its in-row exclusive count."""
    inc = tl.cumsum(opened, axis=2)
    ex = inc - opened  # in-row exclusive counts (the scan's previous sum)
    row = tl.sum(opened, axis=2, keep_dims=True)  # [T, G, 1]
    rinc = tl.cumsum(row, axis=1)
    cnt = tl.sum(tl.sum(row, axis=2), axis=1)
    rpre = rinc - row
    bits = cnt * BITS
    incl = tl.cumsum(bits, axis=0)
    P = pos + incl - bits
    # Word indexes clamped to the last word instead of masked loads: a run's
    # bits are inside the stream, so a clamped word only feeds bits past the
    # thread's run, which no digit reads.
    if BITS == 1:  # a run of <= 32 bits: two 4-byte words and one funnel shift
        codes32 = codes64.to(tl.pointer_type(tl.uint32))
        wi = P >> 5
        v0 = tl.load(codes32 + tl.minimum(wi, 2 * nwords - 1)).to(tl.uint64)
        v1 = tl.load(codes32 + tl.minimum(wi + 1, 2 * nwords - 1)).to(tl.uint64)
        run = ((v0 | (v1 << 32)) >> (P & 31).to(tl.uint64)).to(tl.uint32)
        r = run[:, None, None] >> rpre.to(tl.uint32)  # [T, G, 1]
        digit = ((r >> ex.to(tl.uint32)) & opened.to(tl.uint32)).to(tl.int32)
    else:
        wi = P >> 6
        s = (P & 63).to(tl.uint64)
        w0 = tl.load(codes64 + tl.minimum(wi, nwords - 1)).to(tl.uint64, bitcast=True)
        w1 = tl.load(codes64 + tl.minimum(wi + 1, nwords - 1)).to(tl.uint64, bitcast=True)
        run = (w0 >> s) | ((w1 << 1) << (63 - s))
        r = (run[:, None, None] >> (2 * rpre).to(tl.uint64)).to(tl.uint32)
        digit = ((r >> (2 * ex).to(tl.uint32)) & (3 * opened).to(tl.uint32)).to(tl.int32)
    return digit, pos + incl


@triton.jit
def _is3(d):
    """1 where the 2-bit digit d (0..3) is 3, else 0: the high word of
    d * 0x55555556 (3 * 0x55555556 = 2^32 + 2, 2 * 0x55555556 < 2^32), one
    instruction where ``(d + 1) >> 2`` is two."""
    return tl.umulhi(d, 0x55555556)


@triton.jit(noinline=True)
def _decode_raw(src, dst, n, seg, ITEMSIZE: tl.constexpr, C: tl.constexpr, T: tl.constexpr):
    """A RAW chunk: its segment (seg bytes) holds its words, then zero
    padding; returns ERR_PADDING if a padding byte is not zero (cold code)."""
    G: tl.constexpr = C // (8 * T)
    i = ttile(G, T)
    valid = i < n
    w = tl.load(src.to(dst.dtype) + i, mask=valid, other=0)  # inside the segment: checked
    tl.store(dst + i, w, mask=valid)
    return tl.where(_pad_bad(src, n * ITEMSIZE, seg) != 0, ERR_PADDING, 0)


@triton.jit
def _decode_block(src, dst, k0, n, base, lut, kx, low16, lowbyte, a_sm, a_rem, a_esc, nkept,
                  rem_nb, esc_nb, p1, p2, p3, p4, ebase, kbase, ITEMSIZE: tl.constexpr,
                  EXP_BITS: tl.constexpr,
                  MAN_BITS: tl.constexpr, G: tl.constexpr, T: tl.constexpr,
                  FULL: tl.constexpr, HOT: tl.constexpr = False):
    """Decode elements k0 .. k0 + 8GT - 1 (those below n) of a CODED chunk
    whose entry and offset were checked: tier t's stream continues at bit
    p<t> of the codes, the block's first escape and kept element have ranks
    ebase and kbase; the table says nkept elements are kept and esc_nb
    escaped (loads past them are not made, so a corrupt segment is never
    read past its end). FULL: all 8GT elements exist (no masks). HOT (a
    full chunk without zeros: _decode_full): every element is kept, so its
    sm byte(s) and rem bits are at its own index, read as words thread by
    thread, and the low field of ``kx`` counts the elements of a zero's rank
    instead of the kept ones (none in a valid segment). Returns, per
    thread: ERR_EXPONENT where an element names an exponent the dtype lacks,
    the four tiers' run ends (bits) and the inclusive prefix of (escapes,
    kept elements << 16) over the block's threads."""
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    i = k0 + ttile(G, T)
    # Tier 0: a row's eight 2-bit digits are the 16-bit word 2 * row. The
    # [T, G, 1] load, broadcast, fixes the layout every later step inherits:
    # a thread's elements in its own registers.
    rows = k0 // 8 + tl.arange(0, T)[:, None, None] * G + tl.arange(0, G)[None, :, None]
    q = tl.arange(0, 8)[None, None, :]
    if FULL:
        w0 = tl.load(src.to(tl.pointer_type(tl.int16)) + rows).to(tl.int32)
        d0 = (w0 >> (2 * q)) & 3
        vi = 1
    else:
        w0 = tl.load(src.to(tl.pointer_type(tl.int16)) + rows, mask=2 * rows < a_sm,
                     other=0).to(tl.int32)
        vi = (i < n).to(tl.int32)
        d0 = ((w0 >> (2 * q)) & 3) * vi
    codes64 = src.to(tl.pointer_type(tl.int64))
    nwords = a_sm >> 3
    b1, e1 = _tier(codes64, nwords, p1, _is3(d0), G, 1)
    b2, e2 = _tier(codes64, nwords, p2, b1, G, 1)
    d3, e3 = _tier(codes64, nwords, p3, b2, G, 2)
    d4, e4 = _tier(codes64, nwords, p4, _is3(d3), G, 2)
    rank = d0 + b1 + b2 + d3 + d4  # 11: an escape
    nib = ((lut >> (4 * rank).to(tl.int64)) & 15).to(tl.int32)
    if HOT:
        # A thread's tier-4 digits, element k's at bits 2k, 2k + 1 of two
        # words (elements 0..15, 16..31): 3 is an escape, 2 is rank 10
        # (+0.0, which has no sm byte: none in a chunk whose n_zero is 0).
        # The escaped elements' exponents come after the store
        # (_patch_escapes); until then they are base (ESC's nibble, 8).
        kq = tl.arange(0, 4 * G)[None, None, :]
        dd = tl.sum(tl.reshape(d4, (T, 2, 4 * G)) << (2 * kq), axis=2)  # [T, 2]
        d_lo, d_hi = tl.split(dd)
        esc_lo = d_lo & (d_lo >> 1) & 0x55555555
        esc_hi = d_hi & (d_hi >> 1) & 0x55555555
        zeros = ((d_lo >> 1) & ~d_lo) | ((d_hi >> 1) & ~d_hi)
        # A thread's escapes: the fields' sum, then SWAR (no popc in the interpreter).
        x = esc_lo + esc_hi
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        tot = (x * 0x01010101) >> 24
        incl = tl.cumsum(tot, axis=0) << ESC_AT
        e = base + nib - 8
    else:
        if FULL:
            # Kept (bit 0) and escape (bit ESC_AT) flags of the rank, from the
            # chunk's word kx (_kept_esc_word).
            kxr = (kx >> rank).to(tl.int32)  # (an int64 kx: its low word, one funnel shift)
            ek = kxr & (KEPT_MASK + 1 + 1)
            keep = ek & 1
        else:
            zero = ((nib + 2) >> 4) * vi  # nibbles 14 (-0.0) and 15 (+0.0)
            keep = vi - zero
            # Ranks among the block's kept elements (low bits) and escapes (high).
            ek = keep | (_is3(d4) << ESC_AT)
        pre, tot, rpre = _excl(ek, G)
        incl = tl.cumsum(tot, axis=0)
        if FULL:
            # A pointer per thread, one byte before its first escape and kept
            # element, plus the in-thread inclusive rank: an element that has
            # one reads its own byte, any other a byte of the thread's run or
            # the one before it (the value is not used), so no load needs a
            # mask or a clamp. A thread whose run would end past the table's
            # count (a corrupt segment; the count check fails) reads from byte
            # 32 of the segment instead: ranks are <= 32 and a full chunk's
            # codes alone are 8T bytes, so every load stays inside the segment.
            ex = incl - tot
            tbe = ebase + (ex >> ESC_AT)
            tbk = kbase + (ex & KEPT_MASK)
            e_at = tl.where(tbe + (tot >> ESC_AT) <= esc_nb, a_esc + tbe - 1, 32)
            kin = pre + ek  # in-thread inclusive ranks
            ebyte = tl.load((src + e_at)[:, None, None] + (kin >> ESC_AT))
            krank = kin
        else:
            at = pre + (incl - tot)[:, None, None]
            # Ranks past the table's counts (a corrupt segment; the count check
            # fails) are clamped to the sub-stream's last byte, or the byte before
            # it when empty: still inside the segment (its codes start it).
            erank = tl.minimum(ebase + (at >> ESC_AT), esc_nb - 1)
            krank = tl.minimum(kbase + (at & KEPT_MASK), nkept - 1)
            ebyte = tl.load(src + a_esc + erank)  # (erank clamped: inside the segment)
            tbk = krank
            kin = krank
        e = tl.where(d4 == 3, ebyte.to(tl.int32) & 0xFF, base + nib - 8)
        if not FULL:  # (a full chunk's zeros have nibble 8: e = base, in range)
            e = tl.where(keep != 0, e, 0)
    bad = tl.reduce(tl.reshape(e, (T, 8 * G)), 1, _or)
    ev = tl.where((bad >> EXP_BITS) != 0, ERR_EXPONENT, 0)  # (negative: set too)
    if HOT:
        ev = ev | tl.where((zeros & 0x55555555) != 0, ERR_COUNTS, 0)
    # sm: the kept elements' bytes at their rank; a zero's sign from its symbol.
    if HOT:  # every element kept: its bytes at its index
        sm = _load_sm_rows(src + 16 * (a_sm >> 4), src + 16 * (a_rem >> 4), low16, ITEMSIZE,
                           EXP_BITS, G, T)
    else:
        sm = _gather_sm(src, a_sm, a_rem, a_esc, low16, lowbyte, nkept, kbase, incl, tot, tbk,
                        kin, krank, pre, rpre, ITEMSIZE, EXP_BITS, G, T, FULL)
    if not FULL:
        if IS_FP16:
            sm = tl.where(zero != 0, (15 - nib) << 15, sm)
        else:
            sm = tl.where(zero != 0, (15 - nib) << MAN_BITS, sm)
    if ITEMSIZE == 2 and MAN_BITS == 7:  # bf16: sm * 0x101 is sm | sm << 8 (8-bit sm)
        w = ((sm * 0x101) & 0x807F) | (e << MAN_BITS)
    elif ITEMSIZE == 4:  # sm's sign bit moved up by EXP_BITS (sm + s (2^E - 1)), e added below
        w = (sm + (sm & (1 << MAN_BITS)) * ((1 << EXP_BITS) - 1)) + e * (1 << MAN_BITS)
    else:  # fp16: sm is the word but its exponent
        w = sm | (e << MAN_BITS)
    if FULL:
        if not HOT:  # a zero: its sign alone (kx)
            if ITEMSIZE == 4:
                w = tl.where(keep != 0, w, kxr & (-0x7FFFFFFF - 1))
            else:
                w = tl.where(keep != 0, w, kxr & 0x8000)
        if ITEMSIZE == 2:
            tl.store(dst + i, w.to(tl.int16))
        else:  # a row of 8 words is two 16-byte stores: [T, 2G, 4]
            i4 = k0 + tl.arange(0, T)[:, None, None] * (8 * G) + (
                tl.arange(0, 2 * G)[None, :, None] * 4 + tl.arange(0, 4)[None, None, :])
            tl.store(dst + i4, tl.reshape(w, (T, 2 * G, 4)))
        if HOT:
            ev = ev | _patch_escapes(src, dst + k0, a_esc, esc_nb, (incl >> ESC_AT) - tot, tot,
                                     esc_lo, esc_hi, EXP_BITS, MAN_BITS, G, T)
    else:
        tl.store(dst + i, w.to(dst.dtype.element_ty), mask=vi != 0)
    return ev, e1, e2, e3, e4, incl


@triton.jit
def _gather_sm(src, a_sm, a_rem, a_esc, low16, lowbyte, nkept, kbase, incl, tot, tbk, kin, krank,
               pre, rpre, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr, G: tl.constexpr,
               T: tl.constexpr, FULL: tl.constexpr):
    """The kept elements' sm values (fp16: with their rem bits), each read
    at its rank among the kept (FULL: the per-thread pointer ``tbk`` and
    in-thread inclusive ranks ``kin`` of _decode_block; else the clamped
    ranks ``krank``); an element that is not kept reads some byte of the
    segment, whose value the caller replaces."""
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    if ITEMSIZE == 4:
        smb = 3 - 2 * low16 - lowbyte
    else:
        smb = 1
    if FULL:
        k_ok = tbk + (tot & KEPT_MASK) <= nkept
        sm_src = (src + tl.where(k_ok, a_sm + (tbk - 1) * smb, 32))[:, None, None]
        kr = kin & KEPT_MASK
    else:
        sm_src = src + a_sm
        kr = krank
    if ITEMSIZE == 4:
        # Three unmasked byte loads; with LOW16 (one sm byte, the word's bits
        # 16..23) they start two bytes early, so the third reads it and the
        # first two read bytes before it, still inside the segment (its codes
        # come first), whose bits the mask drops; with LOWBYTE (two, bits
        # 8..23) one byte early.
        word = tl.zeros(kr.shape, tl.int32)
        at = sm_src - 2 * low16 - lowbyte + kr * smb
        for b in tl.static_range(3):
            byte = tl.load(at + b)
            word = word | ((byte.to(tl.int32) & 0xFF) << (8 * b))
        sm = word & (0xFFFFFF - 0xFFFF * low16 - 0xFF * lowbyte)
    else:
        sm = tl.load(sm_src + kr).to(tl.int32) & 0xFF  # (a zero's: replaced by the caller)
        if IS_FP16:
            # rem: a row's kept elements' 3-bit values are <= 24 bits from
            # bit 3 k of the rem stream (k: the row's first kept rank), read
            # as two aligned words a row (words past the padded rem not read).
            rk = tl.minimum(kbase + (((incl - tot)[:, None, None] + rpre) & KEPT_MASK), nkept)
            bit = 3 * rk  # [T, G, 1]
            wi = bit >> 5
            rem32 = (src + a_rem).to(tl.pointer_type(tl.int32))
            room = (a_esc - a_rem) >> 2
            r0w = tl.load(rem32 + wi, mask=wi < room, other=0).to(tl.uint32).to(tl.uint64)
            r1w = tl.load(rem32 + wi + 1, mask=wi + 1 < room, other=0).to(tl.uint32).to(tl.uint64)
            run = ((r0w | (r1w << 32)) >> (bit & 31).to(tl.uint64)).to(tl.uint32)
            rem = ((run >> (3 * ((pre - rpre) & KEPT_MASK)).to(tl.uint32)) & 7).to(tl.int32)
            sm = sm | _rem_bits(rem)
    return sm


@triton.jit
def _rem_bits(rem):
    """fp16: the word's sign (rem bit 2, to bit 15) and top mantissa bits
    (rem bits 0, 1, to bits 8, 9) by one multiply: rem << 8 and rem << 13
    are disjoint. sm | this is the word but its exponent."""
    return (rem * 0x2100) & 0x8300


@triton.jit
def _load_sm_rows(sm_at, rem_at, low16, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                  G: tl.constexpr, T: tl.constexpr):
    """A hot chunk's sm values as the [T, G, 8] tile (every element kept:
    element k's sm byte(s) at k times their count from ``sm_at``, fp16's
    rem bits at bit 3k from ``rem_at``; both 16-byte aligned), read as
    words thread by thread: 16-bit words' sm bytes four to a word (fp16:
    with the rem bits, a row's 24 bits, a thread's four rows in three
    words); fp32's 3-byte values four to three words, or with LOW16 their
    top bytes (the value's bits 16..23) four to a word."""
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    wd = sm_at.to(tl.pointer_type(tl.int32))
    if ITEMSIZE == 4:
        h = tl.arange(0, T)[:, None, None] * (2 * G) + tl.arange(0, G)[None, :, None] * 2 + (
            tl.arange(0, 2)[None, None, :])  # a row's two halves of 4 elements: [T, G, 2]
        if low16 != 0:
            x = tl.load(wd + h)
            v0 = (x & 0xFF) << 16
            v1 = (x & 0xFF00) << 8
            v2 = x & 0xFF0000
            v3 = (x >> 8) & 0xFF0000
        else:
            w0 = tl.load(wd + 3 * h)
            w1 = tl.load(wd + 3 * h + 1)
            w2 = tl.load(wd + 3 * h + 2)
            v0 = w0 & 0xFFFFFF
            v1 = ((w0 >> 24) & 0xFF) | ((w1 & 0xFFFF) << 8)
            v2 = ((w1 >> 16) & 0xFFFF) | ((w2 & 0xFF) << 16)
            v3 = (w2 >> 8) & 0xFFFFFF
        sm = tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), (T, G, 8))
    else:
        k = tl.arange(0, T)[:, None, None] * (2 * G) + tl.arange(0, G)[None, :, None] * 2 + (
            tl.arange(0, 2)[None, None, :])
        x = tl.load(wd + k)  # [T, G, 2]: a row's two words
        sm = tl.reshape((x[:, :, :, None] >> (8 * tl.arange(0, 4)[None, None, None, :])) & 0xFF,
                        (T, G, 8))
        if IS_FP16:
            tl.static_assert(G == 4)
            row = load_words24(rem_at, 12 * T, T, 1)  # [T, 4]: row g's 24 bits
            rem = (row[:, :, None] >> (3 * tl.arange(0, 8)[None, None, :])) & 7
            sm = sm | _rem_bits(rem)
    return sm


@triton.jit
def _patch_escapes(src, dst, a_esc, esc_nb, first, cnt, esc_lo, esc_hi, EXP_BITS: tl.constexpr,
                   MAN_BITS: tl.constexpr, G: tl.constexpr, T: tl.constexpr):
    """A hot chunk's escaped elements' exponents, written into the words the
    block stored: escapes are rare (Gaussian data: about one a thread in
    eight), so each thread takes its own in rounds, one a round (the
    lowest set bit of its escape words ``esc_lo``, ``esc_hi``: bit 2k for
    element k of each half), reading its escape byte (ranks from ``first``,
    the thread's first; past the table's count, a corrupt segment, clamped
    to the sub-stream's last byte or the byte before it, inside the
    segment) and reading back and rewriting the element's word. Returns
    ERR_EXPONENT where an escape byte names no exponent of the dtype."""
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    kmax = tl.max(cnt, axis=0)
    bad = cnt * 0
    if kmax > 0:
        # The block's stores before the read-backs (a word may have been
        # stored by another thread of the block).
        tl.debug_barrier()
        words = dst + tl.arange(0, T) * (8 * G)
        at = a_esc + first
        last = a_esc + esc_nb - 1
        k = kmax * 0
        one = (a_esc > 0).to(tl.int32)  # 1, but not to the compiler: it does not unroll the loop
        while k < kmax:  # offline: dense escape rounds
            lo = esc_lo != 0
            m = tl.where(lo, esc_lo, esc_hi)
            live = m != 0
            b = m & -m
            el = (low_bit_index(b) >> 1) + tl.where(lo, 0, 8 * G // 2)
            esc_lo = tl.where(lo, esc_lo ^ b, esc_lo)
            esc_hi = tl.where(lo, esc_hi, esc_hi ^ b)
            byte = tl.load(src + tl.minimum(at, last), mask=live, other=0).to(tl.int32) & 0xFF
            old = tl.load(words + el, mask=live, other=0).to(tl.int32)
            new = (old & ~(EMAX << MAN_BITS)) | (byte << MAN_BITS)
            tl.store(words + el, new.to(dst.dtype.element_ty), mask=live)
            bad = bad | byte
            at = at + 1
            k = k + one
    return tl.where((bad >> EXP_BITS) != 0, ERR_EXPONENT, 0)


@triton.jit
def _chunk_layout(n, flags, nz, nesc, n_low, o1, o2, o3, o4, ITEMSIZE: tl.constexpr,
                  IS_FP16: tl.constexpr):
    """Byte starts of the four tier streams inside the codes, and layout()'s fields."""
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = layout(
        n, True, flags & 1, (flags >> 3) & 1, nz, nesc, n_low, o1, o2, o3, o4, ITEMSIZE, IS_FP16)
    b1 = (2 * n + 7) >> 3
    b2 = b1 + ((o1 + 7) >> 3)
    b3 = b2 + ((o2 + 7) >> 3)
    b4 = b3 + ((2 * o3 + 7) >> 3)
    return b1, b2, b3, b4, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg


@triton.jit
def _pads_bad(src, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg):
    bad = _pad_bad(src, codes_nb, a_sm) | _pad_bad(src, a_sm + sm_nb, a_rem)
    return bad | _pad_bad(src, a_rem + rem_nb, a_esc) | _pad_bad(src, a_esc + esc_nb, seg)


@triton.jit
def _pads_bad_spread(src, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc,
                     T: tl.constexpr):
    """_pads_bad with the four paddings' bytes spread over the threads, for
    a full chunk: thread t reads byte t % 16 of the 16-byte block that holds
    the last data byte of part (t // 16) % 4 (codes, sm, rem, esc; each part
    is padded to the next multiple of 16, and every part's data ends at or
    after byte 16 of the segment: the codes alone are 8T bytes) and says
    whether it is padding (past that byte) and not zero: [T], to be OR-ed
    over the threads. A part whose data ends on a multiple of 16 has no
    padding: its block is the one before, none of whose bytes is past."""
    k = tl.arange(0, T)
    j = k & 15
    hi = (k & 16) != 0  # part (k >> 4) & 3 by its two bits
    last = tl.where((k & 32) == 0, tl.where(hi, a_sm + sm_nb, codes_nb),
                    tl.where(hi, a_esc + esc_nb, a_rem + rem_nb)) - 1
    byte = tl.load(src + (last & -16) + j)
    return ((j > (last & 15)) & (byte != 0)).to(tl.int32)


@triton.jit
def _decode_full(src, dst, n, flags, base, phase, nz, nesc, o1, o2, o3, o4,
                 ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                 CP: tl.constexpr, T: tl.constexpr, HOT: tl.constexpr):
    """A full CODED chunk of CP = 32 T elements; returns ERR_* bits. HOT: a
    chunk without zeros (no zero flag, n_zero 0: Gaussian data), the hot
    path; else the cold _decode_zeros'."""
    G: tl.constexpr = CP // (8 * T)
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    b1, b2, b3, b4, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = _chunk_layout(
        n, flags, nz, nesc, 0, o1, o2, o3, o4, ITEMSIZE, IS_FP16)
    zp = (flags >> 1) & 1
    zn = (flags >> 2) & 1
    if HOT:
        lut = _pick_i64(phase, F00, F01, F02, F03)
        kx = tl.full([], KX_HOT, tl.int32)
        kept = 0  # the low field counts zeros' ranks: none
    else:
        lut = _sym_full(zp, zn, phase)
        kx = _kept_esc_word(zp, zn, 31 if ITEMSIZE == 4 else 15)
        kept = n - nz
    ev, e1, e2, e3, e4, incl = _decode_block(
        src, dst, 0, n, base, lut, kx, flags & 1, 0, a_sm, a_rem, a_esc, n - nz, rem_nb, esc_nb,
        8 * b1, 8 * b2, 8 * b3, 8 * b4, 0, 0, ITEMSIZE, EXP_BITS, MAN_BITS, G, T, True, HOT)
    # The thread holding the last element checks the chunk's totals.
    last = tl.arange(0, T) == T - 1
    # (Each run end against the table's, by one OR of XORs; the escape and
    # kept counts as one word, fields that cannot carry into each other.)
    tiers = ((e1 ^ (8 * b1 + o1)) | (e2 ^ (8 * b2 + o2)) | (e3 ^ (8 * b3 + 2 * o3)) | (
        e4 ^ (8 * b4 + 2 * o4))) != 0
    counts = incl != (nesc << ESC_AT) + kept
    ev = ev | tl.where(last & tiers, ERR_TIERS, 0) | tl.where(last & counts, ERR_COUNTS, 0)
    pad = _pads_bad_spread(src, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, T)
    return tl.reduce(ev | tl.where(pad != 0, ERR_PADDING, 0), 0, _or)


@triton.jit(noinline=True)
def _decode_zeros(src, dst, n, flags, base, phase, nz, nesc, o1, o2, o3, o4,
                  ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                  CP: tl.constexpr, T: tl.constexpr):  # offline: zero path
    """Cold code: a full CODED chunk with zeros (a zero flag or n_zero > 0),
    whose kept elements' sm bytes are read at their rank among the kept."""
    return _decode_full(src, dst, n, flags, base, phase, nz, nesc, o1, o2, o3, o4, ITEMSIZE,
                        EXP_BITS, MAN_BITS, CP, T, False)


@triton.jit(noinline=True)
def _decode_general(src, dst, n, flags, base, phase, nz, nesc, o1, o2, o3, o4, n_low,
                    ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                    CP: tl.constexpr, T: tl.constexpr):
    """Cold code: a CODED chunk that is not a full [T, 4, 8] tile, or one
    with LOWBYTE (``n_low``: its bitmap's set bits, counted by the caller),
    in sub-blocks of up to 32 T elements; returns ERR_* bits."""
    G: tl.constexpr = CP // (8 * T)
    GS: tl.constexpr = 4 if G >= 4 else G
    NSUB: tl.constexpr = G // GS
    SUB: tl.constexpr = 8 * GS * T
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    b1, b2, b3, b4, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = _chunk_layout(
        n, flags, nz, nesc, n_low, o1, o2, o3, o4, ITEMSIZE, IS_FP16)
    lut = _sym_table((flags >> 1) & 1, (flags >> 2) & 1, phase, False)
    lowbyte = (flags >> 3) & 1
    p1 = 8 * b1
    p2 = 8 * b2
    p3 = 8 * b3
    p4 = 8 * b4
    ebase = n * 0
    kbase = n * 0
    err = n * 0
    for k in range(NSUB):
        if k * SUB < n:
            ev, e1, e2, e3, e4, incl = _decode_block(
                src, dst, k * SUB, n, base, lut, 0, flags & 1, lowbyte, a_sm, a_rem, a_esc,
                n - nz, rem_nb, esc_nb, p1, p2, p3, p4, ebase, kbase, ITEMSIZE, EXP_BITS,
                MAN_BITS, GS, T, False)
            err = err | tl.reduce(ev, 0, _or)
            p1 = tl.max(e1, 0)
            p2 = tl.max(e2, 0)
            p3 = tl.max(e3, 0)
            p4 = tl.max(e4, 0)
            top = tl.max(incl, 0)
            ebase = ebase + (top >> ESC_AT)
            kbase = kbase + (top & KEPT_MASK)
    tiers = (p1 != 8 * b1 + o1) | (p2 != 8 * b2 + o2) | (p3 != 8 * b3 + 2 * o3) | (
        p4 != 8 * b4 + 2 * o4)
    err = err | tl.where(tiers, ERR_TIERS, 0)
    err = err | tl.where((ebase != nesc) | (kbase != n - nz), ERR_COUNTS, 0)
    a_low = a_esc + ((esc_nb + 15) & -16)
    pad = _pads_bad(src, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, a_low)
    if ITEMSIZE == 4:
        if lowbyte != 0:
            pad = pad | _pad_bad(src, a_low + n_low, seg)
            _patch_low(src + a_rem, src + a_low, dst, n, n_low, rem_nb, CP, T)
    return err | tl.where(pad != 0, ERR_PADDING, 0)


@triton.jit
def _patch_low(bitmap, low, dst, n, n_low, rem_nb, CP: tl.constexpr, T: tl.constexpr):
    """LOWBYTE: the next byte of ``low`` ORed into each decoded word (read
    back from dst) whose bitmap bit is set, a thread's G rows of 8 at a
    time: the rows' set bits counted, one scan over the threads."""
    G: tl.constexpr = CP // (8 * T)
    t = tl.arange(0, T)[:, None]
    rows = t * G + tl.arange(0, G)[None, :]  # [T, G]
    bm = bitmap_row(bitmap, rows, n, rem_nb)
    cnt = popc32(bm)
    rpre, ttot = row_excl(cnt, G)
    lex = tl.cumsum(ttot, axis=0) - ttot
    q = tl.arange(0, 8)[None, None, :]
    has = ((bm[:, :, None] >> q) & 1) != 0
    lrank = (lex[:, None] + rpre)[:, :, None] + popc32(bm[:, :, None] & ((1 << q) - 1))
    i = rows[:, :, None] * 8 + q
    # The words' stores came from other threads of the program: a barrier
    # orders them before the read back.
    tl.debug_barrier()
    byte = tl.load(low + lrank, mask=has & (lrank < n_low), other=0).to(tl.int32)
    old = tl.load(dst + i, mask=has, other=0, volatile=True)
    tl.store(dst + i, old | byte, mask=has)


@triton.jit
def dense_decode_chunk(p_ptr, dst, c, n, nch, table_off, offsets_off, body_off, body_nbytes,
                       ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                       CP: tl.constexpr, T: tl.constexpr):
    """Decode dense chunk c (n elements) of a payload whose header was
    checked, into ``dst`` (the chunk's first output word); returns the
    ERR_* bits it found. A ``[T, G, 8]`` tile of CP elements, G = CP / 8T."""
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    body_units = body_nbytes >> 4
    # --- the entry and the offsets ---
    ent = p_ptr.to(tl.pointer_type(tl.int32)) + (table_off >> 2) + 4 * c.to(tl.int64)
    e0 = tl.load(ent)
    e1 = tl.load(ent + 1)
    e2 = tl.load(ent + 2)
    e3 = tl.load(ent + 3)
    offs = p_ptr.to(tl.pointer_type(tl.int32)) + (offsets_off >> 2)
    off = tl.load(offs + c).to(tl.int64) & 0xFFFFFFFF
    nxt = tl.load(offs + c + 1, mask=c + 1 < nch, other=0).to(tl.int64) & 0xFFFFFFFF
    nxt = tl.where(c + 1 < nch, nxt, body_units)
    mode = e0 & 0xFF
    flags = (e0 >> 8) & 0xFF
    base = (e0 >> 16) & 0xFF
    phase = (e0 >> 24) & 0xFF
    nz = e1 & 0xFFFF
    nesc = (e1 >> 16) & 0xFFFF
    o1 = e2 & 0xFFFF
    o2 = (e2 >> 16) & 0xFFFF
    o3 = e3 & 0xFFFF
    o4 = (e3 >> 16) & 0xFFFF
    # format.validate_table: mode > 3, flags outside 15 (LOW16 and LOWBYTE too
    # for 16-bit dtypes), base > EMAX and phase > 3 are bits of the entry's
    # first word (mode 3 is tested apart); nesc <= n follows from the chain
    # n >= o1 >= .. >= o4 >= nesc.
    E0_BAD: tl.constexpr = (0xFC00F0FC | (0x900 if ITEMSIZE != 4 else 0)
                            | ((0xFF & ~EMAX) << 16)) - (1 << 32)  # (as an int32)
    bad = ((e0 & E0_BAD) != 0) | ((flags & 9) == 9)  # (LOW16 and LOWBYTE)
    # (The fields are 16-bit: no difference overflows, one sign test for all.)
    bad = bad | (((n - nz) | (n - o1) | (o1 - o2) | (o2 - o3) | (o3 - o4) | (o4 - nesc)) < 0)
    bad = bad | (mode == 3) | ((mode != 1) & (((e0 >> 8) | e1 | e2 | e3) != 0))  # RAW, ZERO
    coded = mode == 1
    if ITEMSIZE == 4:
        if ((flags & 8) != 0) & ~bad:
            err = _decode_lowbyte(p_ptr, dst, c, n, off, nxt, body_off, body_nbytes, flags, base,
                                  phase, nz, nesc, o1, o2, o3, o4, ITEMSIZE, EXP_BITS, MAN_BITS,
                                  CP, T)
        else:
            err = _decode_other(p_ptr, dst, c, n, off, nxt, body_off, body_units, bad, mode,
                                coded, flags, base, phase, nz, nesc, o1, o2, o3, o4, ITEMSIZE,
                                EXP_BITS, MAN_BITS, CP, T)
    else:
        err = _decode_other(p_ptr, dst, c, n, off, nxt, body_off, body_units, bad, mode, coded,
                            flags, base, phase, nz, nesc, o1, o2, o3, o4, ITEMSIZE, EXP_BITS,
                            MAN_BITS, CP, T)
    return err


@triton.jit
def _decode_other(p_ptr, dst, c, n, off, nxt, body_off, body_units, bad, mode, coded, flags, base,
                  phase, nz, nesc, o1, o2, o3, o4, ITEMSIZE: tl.constexpr,
                  EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr, CP: tl.constexpr,
                  T: tl.constexpr):
    """A chunk without LOWBYTE (or with a bad entry): its offsets checked,
    then decoded by the path its kind takes."""
    G: tl.constexpr = CP // (8 * T)
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = layout(
        n, coded, flags & 1, 0, nz, nesc, 0, o1, o2, o3, o4, ITEMSIZE, IS_FP16)
    units = tl.where(mode == 2, 0, seg >> 4).to(tl.int64)  # ZERO: no segment
    # format.validate_offsets, chained: offset[0] = 0, offset[c + 1] = offset[c] + units.
    bad_off = (nxt != off + units) | (off + units > body_units)  # the segment inside the body
    bad_off = bad_off | ((c == 0) & (off != 0))
    # (body_off is a multiple of 16; written so, the compiler knows the segment
    # 16-byte aligned, and the tier-0 load, whose layout the tile inherits, is
    # one 8-byte load per thread.)
    src = p_ptr + ((body_off >> 4) << 4) + 16 * off
    err = tl.where(bad, ERR_TABLE, 0) | tl.where(bad_off, ERR_OFFSETS, 0)

    if (err & (ERR_TABLE | ERR_OFFSETS)) == 0:
        if mode == 0:
            err = err | _decode_raw(src, dst, n, seg, ITEMSIZE, CP, T)
        elif mode == 2:
            store_zero_words(dst, n, CP, T)
        elif G == 4:
            if n == CP:
                if (nz | (flags & 6)) == 0:
                    err = err | _decode_full(src, dst, n, flags, base, phase, nz, nesc, o1, o2,
                                             o3, o4, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T, True)
                else:
                    err = err | _decode_zeros(src, dst, n, flags, base, phase, nz, nesc, o1, o2,
                                              o3, o4, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
            else:
                err = err | _decode_general(src, dst, n, flags, base, phase, nz, nesc, o1, o2,
                                            o3, o4, 0, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
        else:
            err = err | _decode_general(src, dst, n, flags, base, phase, nz, nesc, o1, o2, o3,
                                        o4, 0, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
    return err


@triton.jit(noinline=True)
def _decode_lowbyte(p_ptr, dst, c, n, off, nxt, body_off, body_nbytes, flags, base, phase, nz,
                    nesc, o1, o2, o3, o4, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                    MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr):
    """A CODED fp32 LOWBYTE chunk whose entry is valid (cold code): the low
    stream, the segment's last, is the bitmap's set bits (read inside the
    body; the offset checks then hold only for the true offsets), its bits
    from n on padding; then _decode_general."""
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = layout(
        n, True, 0, 1, nz, nesc, 0, o1, o2, o3, o4, ITEMSIZE, False)
    n_low, bad_bits = bitmap_count(p_ptr + body_off, 16 * off + a_rem, n, body_nbytes, CP)
    units = ((seg + ((n_low + 15) & -16)) >> 4).to(tl.int64)
    bad_off = (nxt != off + units) | (off + units > (body_nbytes >> 4)) | ((c == 0) & (off != 0))
    err = tl.where(bad_off, ERR_OFFSETS, tl.where(bad_bits, ERR_PADDING, 0))
    if err == 0:
        src = p_ptr + ((body_off >> 4) << 4) + 16 * off
        err = _decode_general(src, dst, n, flags, base, phase, nz, nesc, o1, o2, o3, o4, n_low,
                              ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
    return err
