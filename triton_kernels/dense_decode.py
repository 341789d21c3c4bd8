"""dense decode (format v2): one kernel, one program per chunk, no scan.

Program c reads its chunk-table entry and ``offsets[c]`` (format.py,
"Body"), checks both (the entry by format.validate_table's rules; the
offset against the next one, or the body's end for the last chunk, so the
chained checks of all chunks are format.validate_offsets; the segment inside
the body; every padding byte zero), and decodes its segment: tier 0 holds
every element's first digit at a fixed place; each later tier's digits are
found by an in-thread prefix of the elements still open plus one prefix sum
across the threads, and read with two aligned 8-byte loads per thread.
The decoded tier-open, escape and zero counts and the exponent range are
checked against the table. Errors set bits of a device word (``ERR_*``),
read by the caller once, at the end; nothing is decoded from a chunk whose
entry or offset is bad, and every load stays inside the chunk's segment.

Layout: the ``[T, G, 8]`` tile of dense_encode.py (thread t holds elements
t * 8G .. t * 8G + 8G - 1).
"""
from __future__ import annotations

import triton
import triton.language as tl

from zipccl_fsdp import format as F

from .dense_encode import layout, sum3, thread_excl, tile3

# Error bits: the decoders' shared word (_codec_common.py).
from ._codec_common import (ERR_COUNTS, ERR_EXPONENT, ERR_OFFSETS, ERR_PADDING,  # noqa: E402
                            ERR_TABLE, ERR_TIERS)


def _sym_lut(zp: int, zn: int, phase: int) -> int:
    """Nibble r: symbol of rank r (format.dense_symbol_table) as offset + 8,
    15 for +0.0, 14 for -0.0 (int64 constant)."""
    acc = 0
    for r, s in enumerate(F.dense_symbol_table(bool(zp), bool(zn), phase)):
        v = 15 if s == F.ZERO_SYMBOL else 14 if s == F.NEG_ZERO_SYMBOL else s + 8
        assert 0 <= v < 14 or s in (F.ZERO_SYMBOL, F.NEG_ZERO_SYMBOL)
        acc |= v << (4 * r)
    return acc - (1 << 64) if acc >= 1 << 63 else acc


SYM = tuple(tl.constexpr(_sym_lut(zp, zn, ph)) for zp in (0, 1) for zn in (0, 1)
            for ph in range(4))
(S00, S01, S02, S03, S10, S11, S12, S13, S20, S21, S22, S23, S30, S31, S32, S33) = SYM


@triton.jit
def _pick_i64(i, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr):
    return tl.where(i == 0, tl.full([], A, tl.int64),
                    tl.where(i == 1, tl.full([], B, tl.int64),
                             tl.where(i == 2, tl.full([], C, tl.int64), tl.full([], D, tl.int64))))


@triton.jit
def _sym_table(zp, zn, phase):
    """The chunk's rank -> symbol nibbles (_sym_lut)."""
    t0 = _pick_i64(phase, S00, S01, S02, S03)
    t1 = _pick_i64(phase, S10, S11, S12, S13)
    t2 = _pick_i64(phase, S20, S21, S22, S23)
    t3 = _pick_i64(phase, S30, S31, S32, S33)
    return tl.where(zp != 0, tl.where(zn != 0, t3, t2), tl.where(zn != 0, t1, t0))


@triton.jit
def _pad_bad(ptr, start, end):
    """1 if any byte of [start, end) is not zero (end - start < 16)."""
    k = tl.arange(0, 16)
    b = tl.load(ptr + start + k, mask=start + k < end, other=0)
    return (tl.max(b.to(tl.int32), axis=0) != 0).to(tl.int32)


@triton.jit
def _tier(codes64, nwords, part_bit, rank, opened, BITS: tl.constexpr, CAP: tl.constexpr):
    """Decode one tier: the open elements' digits, in order, from the tier's
    bit stream at bit ``part_bit`` of the codes sub-stream (``nwords`` 8-byte
    words, padding included). ``opened`` is 0/1 (int32). Returns the new
    rank, the elements still open, and the tier's open count."""
    pre, bits = thread_excl(opened * BITS)  # bit positions inside the thread's run
    P = part_bit + tl.cumsum(bits, axis=0) - bits  # [T] first bit of each thread's run
    wi = P >> 6
    s = (P & 63).to(tl.uint64)
    w0 = tl.load(codes64 + wi, mask=wi < nwords, other=0).to(tl.uint64, bitcast=True)
    w1 = tl.load(codes64 + wi + 1, mask=wi + 1 < nwords, other=0).to(tl.uint64, bitcast=True)
    run = (w0 >> s) | ((w1 << 1) << (63 - s))
    if BITS == 1:  # a thread's run is <= 32 bits: 32-bit shifts
        run32 = run.to(tl.uint32)[:, None, None]
        digit = ((run32 >> pre.to(tl.uint32)) & opened.to(tl.uint32)).to(tl.int32)
        still = digit
    else:
        digit = (run[:, None, None] >> pre.to(tl.uint64)).to(tl.uint32).to(tl.int32)
        digit = digit & (opened * CAP)
        still = (digit == CAP).to(tl.int32)
    return rank + digit, still, tl.sum(bits, axis=0) // BITS


@triton.jit(noinline=True)
def _decode_raw(src, dst, n, ITEMSIZE: tl.constexpr, C: tl.constexpr, T: tl.constexpr):
    """A RAW chunk: its segment holds its words (cold code)."""
    G: tl.constexpr = C // (8 * T)
    i = tile3(G, T)
    valid = i < n
    w = tl.load(src.to(dst.dtype) + i, mask=valid, other=0)  # inside the segment: checked
    tl.store(dst + i, w, mask=valid)


@triton.jit
def _decode_coded(src, dst, n, flags, base, phase, nz, nesc, o1, o2, o3, o4,
                  ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                  CP: tl.constexpr, T: tl.constexpr, HOT: tl.constexpr):
    """A CODED chunk whose entry and offset were checked; returns ERR_* bits.
    HOT: the chunk is full and nothing is omitted (n_zero = 0, no zero
    flag), so sm sits in place and no element decodes to a zero."""
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    low16 = flags & 1
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = layout(
        n, True, low16, nz, nesc, o1, o2, o3, o4, ITEMSIZE, IS_FP16)
    err = tl.zeros([], tl.int32)
    padbad = _pad_bad(src, codes_nb, a_sm) | _pad_bad(src, a_sm + sm_nb, a_rem)
    padbad = padbad | _pad_bad(src, a_rem + rem_nb, a_esc) | _pad_bad(src, a_esc + esc_nb,
                                                                     seg)
    i = tile3(G, T)
    if HOT:
        valid = None
        vi = 1
    else:
        valid = i < n
        vi = valid.to(tl.int32)
    codes64 = src.to(tl.pointer_type(tl.int64))
    nwords = a_sm >> 3
    # Tier 0: a row's eight 2-bit digits are the 16-bit word 2 * row.
    # The [T, G, 1] load, broadcast, fixes the layout every later step
    # inherits: a thread's elements in its own registers.
    rows = tl.arange(0, T)[:, None, None] * G + tl.arange(0, G)[None, :, None]
    if HOT:  # a full chunk's tier 0 fills the codes' first 2 * CP / 8 bytes
        w0 = tl.load(src.to(tl.pointer_type(tl.int16)) + rows).to(tl.int32)
    else:
        w0 = tl.load(src.to(tl.pointer_type(tl.int16)) + rows, mask=2 * rows < a_sm,
                     other=0).to(tl.int32)
    rank = ((w0 >> (2 * (i & 7))) & 3) * vi
    opened = ((rank + 13) >> 4) * vi  # digit 3 continues
    len0 = (2 * n + 7) >> 3
    b1 = len0
    b2 = b1 + ((o1 + 7) >> 3)
    b3 = b2 + ((o2 + 7) >> 3)
    b4 = b3 + ((2 * o3 + 7) >> 3)
    rank, opened, g1 = _tier(codes64, nwords, 8 * b1, rank, opened, 1, 1)
    rank, opened, g2 = _tier(codes64, nwords, 8 * b2, rank, opened, 1, 1)
    rank, opened, g3 = _tier(codes64, nwords, 8 * b3, rank, opened, 2, 3)
    rank, opened, g4 = _tier(codes64, nwords, 8 * b4, rank, opened, 2, 3)
    esc = opened
    err = err | tl.where((g1 != o1) | (g2 != o2) | (g3 != o3) | (g4 != o4), ERR_TIERS, 0)
    zp = (flags >> 1) & 1
    zn = (flags >> 2) & 1
    lut = _sym_table(zp, zn, phase)
    if HOT:  # nothing omitted: every element in place; rank 10 (+0.0) is an error
        nib = ((lut >> (4 * rank).to(tl.int64)) & 15).to(tl.int32)  # (rank 11: ESC)
        epre, etot = thread_excl(esc)
        erank = (tl.cumsum(etot, axis=0) - etot)[:, None, None] + epre
        nesc_got = tl.sum(etot, axis=0)
        nzero = sum3((rank == 10).to(tl.int32))
        keep = 1
        krank = i
    else:
        nib = ((lut >> (4 * tl.minimum(rank, 10)).to(tl.int64)) & 15).to(tl.int32)
        zero = ((nib >> 1) == 7).to(tl.int32) * (1 - esc) * vi  # 14 or 15
        neg = zero & (1 - (nib & 1))
        keep = vi - zero
        epre, etot = thread_excl(esc | (keep << 16))
        eex = tl.cumsum(etot, axis=0) - etot
        erank = (eex & 0xFFFF)[:, None, None] + (epre & 0xFFFF)
        krank = (eex >> 16)[:, None, None] + (epre >> 16)
        tot = tl.sum(etot, axis=0)
        nesc_got = tot & 0xFFFF
        nzero = n - (tot >> 16)
    # With the escape count right, every escape's rank is inside the esc sub-stream.
    esc_ok = (nesc_got == nesc).to(tl.int32)
    ebyte = tl.load(src + a_esc + erank, mask=esc * esc_ok != 0, other=0)
    e = tl.where(esc != 0, ebyte.to(tl.int32), base + nib - 8)
    err = err | tl.where((nesc_got != nesc) | (nzero != nz), ERR_COUNTS, 0)
    badexp = sum3(keep * (e.to(tl.uint32) > EMAX).to(tl.int32))
    err = err | tl.where(badexp != 0, ERR_EXPONENT, 0)
    sm_src = src + a_sm
    kmask = keep != 0
    if HOT:
        if ITEMSIZE == 4:
            smb = 3 - 2 * low16
            word = tl.zeros([T, G, 8], tl.int32)
            for b in tl.static_range(3):
                byte = tl.load(sm_src + i * smb + b, mask=i * 0 + (b < smb).to(tl.int32) != 0,
                               other=0)
                word = word | (byte.to(tl.int32) << (8 * b))
            sm = tl.where(low16 != 0, word << 16, word)
        else:
            sm = tl.load(sm_src + i).to(tl.int32) & 0xFF
        if IS_FP16:  # in place: a row's 24 rem bits at byte 12t + 3g
            rr = tl.zeros([T, G, 1], tl.int32)
            for b in tl.static_range(3):
                rr = rr | (tl.load(src + a_rem + 3 * rows + b).to(tl.int32) & 0xFF) << (8 * b)
            sm = sm | (((rr >> (3 * (i & 7))) & 7) << 8)
    elif ITEMSIZE == 4:
        smb = 3 - 2 * low16
        word = tl.zeros([T, G, 8], tl.int32)
        for b in tl.static_range(3):
            at = krank * smb + b
            byte = tl.load(sm_src + at, other=0,
                           mask=tl.where(b < smb, kmask & (at < sm_nb), False))
            word = word | (byte.to(tl.int32) << (8 * b))
        sm = tl.where(low16 != 0, word << 16, word)
    else:
        sm = tl.load(sm_src + krank, mask=kmask & (krank < sm_nb), other=0).to(tl.int32)
        sm = sm & 0xFF
    if IS_FP16 and not HOT:
        bit = 3 * krank
        at = bit >> 3
        rsrc = src + a_rem + at
        lo_b = tl.load(rsrc, mask=kmask & (at < rem_nb), other=0).to(tl.int32) & 0xFF
        hi_b = tl.load(rsrc + 1, mask=kmask & (at + 1 < rem_nb), other=0).to(tl.int32)
        two = lo_b | ((hi_b & 0xFF) << 8)
        sm = sm | (((two >> (bit & 7)) & 7) << 8)
    if HOT:  # (an exponent out of range is an error: the word does not matter)
        ec = e
    else:
        ec = tl.minimum(tl.maximum(e, 0), EMAX)
    w = ((sm & (1 << MAN_BITS)) << EXP_BITS) | (ec << MAN_BITS) | (sm & ((1 << MAN_BITS) - 1))
    if not HOT:
        w = tl.where(zero != 0, neg << (MAN_BITS + EXP_BITS), w)
    if ITEMSIZE == 2:
        tl.store(dst + i, w.to(tl.int16), mask=valid)
    elif HOT:  # a row of 8 words is two 16-byte stores: [T, 2G, 4]
        i4 = tl.arange(0, T)[:, None, None] * (8 * G) + tl.arange(0, 2 * G)[None, :, None] * 4 + (
            tl.arange(0, 4)[None, None, :])
        tl.store(dst + i4, tl.reshape(w, (T, 2 * G, 4)))
    else:
        tl.store(dst + i, w, mask=valid)
    err = err | tl.where(padbad != 0, ERR_PADDING, 0)
    return err


@triton.jit(noinline=True)
def _decode_general(src, dst, n, flags, base, phase, nz, nesc, o1, o2, o3, o4,
                    ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                    CP: tl.constexpr, T: tl.constexpr):
    """Cold code: a ragged chunk, or one with omitted zeros."""
    return _decode_coded(src, dst, n, flags, base, phase, nz, nesc, o1, o2, o3, o4, ITEMSIZE,
                         EXP_BITS, MAN_BITS, CP, T, False)


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
    # format.validate_table
    bad = (mode > 1) | (phase > 3) | (base > EMAX) | ((flags & ~7) != 0)
    if ITEMSIZE != 4:
        bad = bad | ((flags & 1) != 0)
    bad = bad | (nz > n) | (nesc > n) | (o1 > n) | (o2 > o1) | (o3 > o2) | (o4 > o3) | (
        nesc > o4)
    bad = bad | ((mode == 0) & ((e0 | e1 | e2 | e3) != 0))
    coded = mode == 1
    low16 = flags & 1
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = layout(
        n, coded, low16, nz, nesc, o1, o2, o3, o4, ITEMSIZE, IS_FP16)
    units = (seg >> 4).to(tl.int64)
    # format.validate_offsets, chained: offset[0] = 0, offset[c + 1] = offset[c] + units.
    bad_off = (nxt != off + units) | (off + units > body_units)  # the segment inside the body
    bad_off = bad_off | ((c == 0) & (off != 0))
    src = p_ptr + body_off + 16 * off
    err = tl.where(bad, ERR_TABLE, 0) | tl.where(bad_off, ERR_OFFSETS, 0)

    if (err & (ERR_TABLE | ERR_OFFSETS)) == 0:
        if mode == 0:
            _decode_raw(src, dst, n, ITEMSIZE, CP, T)
            nb = n * ITEMSIZE
            err = err | tl.where(_pad_bad(src, nb, seg) != 0, ERR_PADDING, 0)
        else:
            if (n == CP) & (nz == 0) & ((flags & 6) == 0):
                err = err | _decode_coded(src, dst, n, flags, base, phase, nz, nesc, o1, o2, o3,
                                          o4, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T, True)
            else:
                err = err | _decode_general(src, dst, n, flags, base, phase, nz, nesc, o1, o2,
                                            o3, o4, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
    return err


@triton.jit
def dense_decode_kernel(p_ptr, out_ptr, err_ptr, numel, nch, table_off, offsets_off, body_off,
                        body_nbytes, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                        MAN_BITS: tl.constexpr, C: tl.constexpr, T: tl.constexpr):
    """The chunks of a dense payload whose header the host parsed (codec_decode.py's
    decode_kernel checks the header on the device and calls dense_decode_chunk too)."""
    c = tl.program_id(0)
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)
    err = dense_decode_chunk(p_ptr, out_ptr + start, c, n, nch, table_off, offsets_off, body_off,
                             body_nbytes, ITEMSIZE, EXP_BITS, MAN_BITS, C, T)
    tl.atomic_or(err_ptr, err, mask=err != 0)


def decode_launch(payload, words, err, numel: int, nch: int, table_off: int, offsets_off: int,
                  body_off: int, body_nbytes: int, info: F.DTypeInfo, num_warps: int = 4):
    """Launch the dense decode of a parsed payload (uint8, 16-byte aligned)
    into ``words`` (the output's int16/int32 view); ``err`` (int32, 1) must
    be zero and gets the OR of the ERR_* bits. No host sync."""
    assert F.CHUNK_ELEMS % (8 * 32 * num_warps) == 0
    dense_decode_kernel[(nch,)](
        payload, words, err, numel, nch, table_off, offsets_off, body_off, body_nbytes,
        ITEMSIZE=info.itemsize, EXP_BITS=info.exp_bits, MAN_BITS=info.man_bits,
        C=F.CHUNK_ELEMS, T=32 * num_warps, num_warps=num_warps)
