"""fixed3 decode (format v3) of one chunk, called by codec_decode.decode_kernel
(one program per chunk, or a few in turn, in the thread-major ``[T, G, 8]``
tile of _codec_common.py).

The chunk reads its table entry and its offset, and the next chunk's offset
(or the body's length) to check its own segment's size, and nothing else
of other chunks: no scan. The entry is checked by the rules of
``format.validate_table``; every load is masked to its sub-stream and to
the body.

The hot path is the chunk fixed3_encode.py's hot path writes: CODED, no
flagged zero (every element's sign+mantissa at its own position), a tile of
at most 64 elements a thread:

- codes: a thread's 3 G bytes as 32-bit words, unpacked in the thread;
- sm: whole 16-byte words (fp32: one byte an element with LOW16, three
  without); fp16's rem bits in rows like the codes;
- the words, stored with the window's exponent; then each thread patches
  its escaped elements, one a trip of a loop over the thread with the most
  (from a mask of them): the escape byte at the thread's exclusive escape
  count replaces the exponent of the word read back from the output (a
  volatile load, after the program's stores);
- the decoded escape count against the entry, escapes naming an exponent
  the dtype has, and every padding byte zero.

A chunk with flagged zeros takes a zero path: bf16 and fp32
(``_decode_zero_pairs``, ``_decode_zero_words``) gather each kept element's
sm bytes at its rank among the kept (tl.gather from the stream read whole),
the whole tile at once like the hot path; fp16 (``_decode_zero_rem``)
reads a row's kept sm bytes and rem bits from the payload by address, a
row at a time; a zero's word is its sign. They are noinline (they take
scalars and read their streams from the payload like the hot path), so
that their registers are not the hot path's. A LOWBYTE chunk (whose low
length, the bitmap's set bits, is counted before the offsets are checked)
is decoded by fixed3_general.decode_chunk_general, a chunk with flagged
zeros of a wider tile by decode_zero_chunk_general, a RAW chunk by
decode_raw_words: all noinline, off the hot path.

Error bits (``ERR_*`` of _codec_common.py) are returned to the caller, which
ORs them into the launch's error word.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._codec_common import (ERR_COUNTS, ERR_EXPONENT, ERR_OFFSETS, ERR_PADDING, ERR_TABLE,
                            align16, bitmap_count, fixed3_layout, fixed_window, load_rows3,
                            load_words, load_words24, low_bit_index, pad_nonzero, row_excl,
                            row_mask, store_rows, store_zero_words, ttile, unpack_bytes)
from .fixed3_encode import L2, escape_masks, popc_mask
from .fixed3_general import (decode_chunk_general, decode_zero_chunk_general,
                             padding_error)


@triton.jit(noinline=True)
def decode_raw_words(src, dst, n, lim, ITEMSIZE: tl.constexpr, CP: tl.constexpr,
                     T: tl.constexpr):
    """A RAW chunk's n words, little-endian bytes at src (bytes at or past
    lim read as 0), stored at dst (cold code)."""
    G: tl.constexpr = CP // (8 * T)
    i = tl.arange(0, T)[None, :, None] * (8 * G) + tl.arange(0, G)[:, None, None] * 8 + (
        tl.arange(0, 8)[None, None, :])
    valid = i < n
    w = tl.zeros(i.shape, tl.int32)
    for b in tl.static_range(ITEMSIZE):
        at = i * ITEMSIZE + b
        w = w | (tl.load(src + at, mask=valid & (at < lim), other=0).to(tl.int32) << (8 * b))
    tl.store(dst + i, w.to(dst.dtype.element_ty), mask=valid)


@triton.jit
def fixed3_decode_chunk(p_ptr, dst, c, n, nch, table_off, offsets_off, body_off, body_nbytes,
                        ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                        MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr):
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5

    # --- the entry, the offsets, the layout ---
    # The payload is 16-byte aligned (codec_decode._aligned): the entry is 4 words.
    ent = p_ptr.to(tl.pointer_type(tl.int32)) + (table_off >> 2) + 4 * c.to(tl.int64)
    e0 = tl.load(ent)
    e1 = tl.load(ent + 1)
    opens = tl.load(ent + 2) | tl.load(ent + 3)
    mode = e0 & 0xFF
    flags = (e0 >> 8) & 0xFF
    base = (e0 >> 16) & 0xFF
    phase = (e0 >> 24) & 0xFF
    nz = e1 & 0xFFFF
    nesc = (e1 >> 16) & 0xFFFF
    bad = (mode > 2) | (phase > 3) | (base > EMAX) | ((flags & ~15) != 0) | ((flags & 9) == 9)
    if ITEMSIZE != 4:
        bad = bad | ((flags & 9) != 0)
    bad = bad | (nz > n) | (nesc > n) | (opens != 0) | (((flags & 6) == 0) & (nz != 0))
    coded = mode == 1
    bad = bad | ((mode != 1) & ((flags | base | phase | nz | nesc) != 0))  # RAW, ZERO
    low16 = flags & 1
    if ITEMSIZE == 4:
        if ((flags & 8) != 0) & ~bad:
            err = _decode_lowbyte(p_ptr, dst, c, n, nch, offsets_off, body_off, body_nbytes,
                                  flags, base, phase, nz, nesc, ITEMSIZE, EXP_BITS, MAN_BITS, CP,
                                  T)
        else:
            err = _decode_other(p_ptr, dst, c, n, nch, offsets_off, body_off, body_nbytes, bad,
                                mode, flags, base, phase, nz, nesc, coded, low16, ITEMSIZE,
                                EXP_BITS, MAN_BITS, CP, T)
    else:
        err = _decode_other(p_ptr, dst, c, n, nch, offsets_off, body_off, body_nbytes, bad, mode,
                            flags, base, phase, nz, nesc, coded, low16, ITEMSIZE, EXP_BITS,
                            MAN_BITS, CP, T)
    return err


@triton.jit
def _decode_other(p_ptr, dst, c, n, nch, offsets_off, body_off, body_nbytes, bad, mode, flags,
                  base, phase, nz, nesc, coded, low16, ITEMSIZE: tl.constexpr,
                  EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr, CP: tl.constexpr,
                  T: tl.constexpr):
    """A chunk without LOWBYTE (or with a bad entry): its offsets checked,
    then decoded by the hot path, the zero path (bf16), the general one or
    decode_raw_words."""
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    ZERO_PAIRS: tl.constexpr = G <= 8 and ITEMSIZE == 2 and not IS_FP16
    ZERO_WORDS: tl.constexpr = G <= 8 and ITEMSIZE == 4
    ZERO_REM: tl.constexpr = G <= 8 and IS_FP16
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = fixed3_layout(
        n, coded, low16, 0, nz, nesc, 0, ITEMSIZE, IS_FP16)
    seg = tl.where(mode == 2, 0, seg)  # ZERO: no segment
    offs = p_ptr.to(tl.pointer_type(tl.int32)) + (offsets_off >> 2)
    off = tl.load(offs + c).to(tl.int64) & 0xFFFFFFFF
    is_last = c == nch - 1
    nxt = tl.load(offs + c + 1, mask=~is_last, other=0).to(tl.int64) & 0xFFFFFFFF
    nxt = tl.where(is_last, body_nbytes >> 4, nxt)
    bad_off = (off + (seg >> 4) != nxt) | ((c == 0) & (off != 0))
    err = tl.where(bad, ERR_TABLE, tl.where(bad_off, ERR_OFFSETS, 0))
    if err == 0:
        src = p_ptr + 16 * ((body_off >> 4) + off)  # a product: 16-byte aligned (wide loads)
        lim = body_nbytes - 16 * off  # body bytes from the segment's start (>= seg: checked)
        if mode == 0:
            decode_raw_words(src, dst, n, lim, ITEMSIZE, CP, T)
            nb = n * ITEMSIZE
            err = tl.where(pad_nonzero(src, nb, align16(nb), lim), ERR_PADDING, 0)
        elif mode == 2:
            store_zero_words(dst, n, CP, T)
        elif (flags & 6) == 0:
            if G <= 8:  # (a thread's escapes fit one 64-bit mask)
                lo, _ = fixed_window(base, phase, 0, EMAX)
                err = _decode_hot(src, dst, n, lim, lo, low16, codes_nb, sm_nb, rem_nb, esc_nb,
                                  a_sm, a_rem, a_esc, seg, ITEMSIZE, EXP_BITS, MAN_BITS, G, T)
            else:
                err = decode_chunk_general(src, dst, n, lim, flags, base, phase, nz, nesc, 0,
                                           ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
        elif ZERO_PAIRS:
            err = _decode_zero_pairs(src, dst, n, lim, base, phase, flags, nz, codes_nb, sm_nb,
                                     rem_nb, esc_nb, a_sm, a_rem, a_esc, seg, EXP_BITS,
                                     MAN_BITS, G, T)
        elif ZERO_WORDS:
            err = _decode_zero_words(src, dst, n, lim, base, phase, flags, nz, nesc, EXP_BITS,
                                     MAN_BITS, G, T)
        elif ZERO_REM:
            err = _decode_zero_rem(src, dst, n, lim, base, phase, flags, nz, codes_nb, sm_nb,
                                   rem_nb, esc_nb, a_sm, a_rem, a_esc, seg, EXP_BITS, MAN_BITS,
                                   G, T)
        else:
            err = decode_zero_chunk_general(src, dst, n, lim, flags, base, phase, nz, nesc, 0,
                                            ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
    return err


@triton.jit(noinline=True)
def _decode_lowbyte(p_ptr, dst, c, n, nch, offsets_off, body_off, body_nbytes, flags, base,
                    phase, nz, nesc, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                    MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr):
    """A CODED fp32 LOWBYTE chunk whose entry is valid: the low stream, the
    segment's last, is the bitmap's set bits (read inside the body; the
    offset checks then hold only for the true offsets), its bits from n on
    padding; then decode_chunk_general (cold code)."""
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = fixed3_layout(
        n, True, 0, 1, nz, nesc, 0, ITEMSIZE, False)
    offs = p_ptr.to(tl.pointer_type(tl.int32)) + (offsets_off >> 2)
    off = tl.load(offs + c).to(tl.int64) & 0xFFFFFFFF
    n_low, bad_bits = bitmap_count(p_ptr + body_off, 16 * off + a_rem, n, body_nbytes, CP)
    seg = seg + align16(n_low)
    is_last = c == nch - 1
    nxt = tl.load(offs + c + 1, mask=~is_last, other=0).to(tl.int64) & 0xFFFFFFFF
    nxt = tl.where(is_last, body_nbytes >> 4, nxt)
    bad_off = (off + (seg >> 4) != nxt) | ((c == 0) & (off != 0))
    err = tl.where(bad_off, ERR_OFFSETS, tl.where(bad_bits, ERR_PADDING, 0))
    if err == 0:
        src = p_ptr + 16 * ((body_off >> 4) + off)
        err = decode_chunk_general(src, dst, n, body_nbytes - 16 * off, flags, base, phase, nz,
                                   nesc, n_low, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
    return err



@triton.jit
def _decode_hot(src, dst, n, lim, lo, low16, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem,
                a_esc, seg, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                MAN_BITS: tl.constexpr, G: tl.constexpr, T: tl.constexpr):
    """A CODED chunk without flagged zeros, its layout checked against the
    body (``lim`` bytes from the segment's start at ``src``): its error bits."""
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    FIELD: tl.constexpr = EMAX << MAN_BITS
    # Sub-streams start 16-aligned and the body ends 16-aligned, so a word
    # that starts inside a padded sub-stream and below lim ends inside both.
    lim = tl.minimum(tl.maximum(lim, 0), 1 << 30).to(tl.int32)
    a_sm = 16 * (a_sm >> 4)  # products: their divisibility is known (wide loads)
    a_rem = 16 * (a_rem >> 4)
    a_esc = 16 * (a_esc >> 4)
    r = tl.arange(0, T)[:, None] * G + tl.arange(0, G)[None, :]  # row index, [T, G]
    acc = load_codes(src, r, tl.minimum(codes_nb, lim), tl.minimum(a_sm, lim), T, G)
    # Escapes: each thread's mask of them, bits of elements past n cleared
    # (the codes there may be anything), its count, the escapes before it.
    # The chunk's count is the last thread's inclusive one: checked there,
    # a mismatch flagged above the counts in the one reduction, the largest.
    t = tl.arange(0, T)
    inside = tl.minimum(tl.maximum(n - 8 * G * t, 0), 8 * G)  # elements a thread holds below n
    emask = escape_masks(acc, T, G)
    if G == 8:
        emask = emask & tl.where(inside >= 64, -1, (tl.full([T], 1, tl.int64) << inside) - 1)
    else:
        emask = emask & ((tl.full([T], 1, tl.int64) << inside) - 1).to(tl.int32)
    esc_t = popc_mask(emask)
    incl = tl.cumsum(esc_t, axis=0)
    e_at = incl - esc_t
    top = tl.max(esc_t | (((t == T - 1) & (incl != esc_nb)).to(tl.int32) << 16), axis=0)
    err = tl.where(top > 0xFFFF, ERR_COUNTS, 0)
    kmax = top & 0xFFFF
    room = tl.minimum(a_rem - a_sm, lim - a_sm)
    if ITEMSIZE == 2:
        # Two words a 32-bit register (lanes: element 2j low, 2j + 1 high),
        # by lane arithmetic that carries nothing across bit 16.
        SGN: tl.constexpr = 1 << MAN_BITS
        wd = load_words(src + a_sm, room, T, 2 * G)  # (bytes past sm_nb are padding: zero)
        k2 = tl.arange(0, 2)[None, None, :]
        x = wd[:, :, None] >> (16 * k2)
        s2 = tl.reshape((x & 0xFF) | ((x << 8) & 0xFF0000), (T, G, 4)).to(tl.uint32)
        if IS_FP16:
            racc = load_codes(src + a_rem, r, tl.minimum(rem_nb, lim - a_rem),
                              tl.minimum(a_esc - a_rem, lim - a_rem), T, G)
            s2 = s2 | (_code_pairs(racc) << 8)
        # The exponent: code + lo per lane (at most (EMAX + 1) << MAN_BITS,
        # 0x8000, for an escape's 7: masked to its field, and patched
        # later); the sign moved from bit MAN_BITS to 15 by adding EMAX
        # copies of it.
        e2 = _code_pairs(acc) * SGN + ((lo << MAN_BITS) * L2).to(tl.uint32)
        w2 = (s2 + (s2 & (SGN * L2)) * EMAX) | (e2 & (FIELD * L2))
        word = tl.reshape(tl.join(w2, w2 >> 16), (T, G, 8)).to(tl.int16)
    else:
        q = tl.arange(0, 8)[None, None, :]
        code = (acc[:, :, None] >> (3 * q)) & 7
        if low16 != 0:
            sm = unpack_bytes(load_words(src + a_sm, room, T, 2 * G), T, G) << 16
        else:
            sm = tl.reshape(load_words24(src + a_sm, room, T, 2 * G), (T, G, 8))
        e_f = (code + lo) << MAN_BITS
        word = (sm + (sm & (1 << MAN_BITS)) * EMAX) | (e_f & FIELD)
    store_rows(dst, ttile(G, T), n, word, ITEMSIZE, G, T)
    err = err | padding_error(src, codes_nb, a_sm, sm_nb, a_rem, rem_nb, a_esc, esc_nb, seg,
                              lim)
    err = err | _patch_escapes(dst, src + a_esc, tl.minimum(esc_nb, lim - a_esc), emask, esc_t,
                               e_at, kmax, n, EXP_BITS, MAN_BITS, T, G)
    return err


@triton.jit(noinline=True)
def _decode_zero_pairs(src, dst, n, lim, base, phase, flags, nz, codes_nb, sm_nb, rem_nb, esc_nb,
                       a_sm, a_rem, a_esc, seg, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                       G: tl.constexpr, T: tl.constexpr):  # offline: zero path
    """The zero path of 16-bit words without a rem stream (bf16): a CODED
    chunk with flagged zeros (ZPOS, ZNEG or both), its layout checked
    against the body: its error bits. A kept element (code z or more) takes
    the sm byte at its rank among the kept (an exclusive count in the row by
    a multiply, over the thread's rows in the thread, over the threads by
    one scan: the ranks fixed3_general's encoder stores them at), gathered
    from the sm stream, read whole with wide loads (tl.gather: through
    shared memory, an element's load addressed by its rank alone); a zero's
    word is its sign alone. The kept and escape counts are checked against the entry first;
    escapes are patched as on the hot path. Noinline: it takes scalars only,
    and its registers (more than the hot path's) do not become the kernel's
    allocation around the hot path."""
    CP: tl.constexpr = 8 * G * T
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    FIELD: tl.constexpr = EMAX << MAN_BITS
    SGN: tl.constexpr = 1 << MAN_BITS
    lim, a_sm, zp, zn, z, lo, acc, emask, esc_t, e_incl, top, err, pre, rc, rt, k_incl = (
        _zero_counts(src, n, lim, flags, base, phase, codes_nb, a_sm, esc_nb, nz, EXP_BITS, G, T))
    if err == 0:
        rank = _kept_rank(pre, rc, rt, k_incl)
        # The sm stream and its zero padding (inside the body: checked).
        j = tl.arange(0, CP)
        sm = tl.load(src + a_sm + j, mask=j < 16 * ((a_rem - a_sm) >> 4), other=0)
        b = tl.reshape(tl.gather(sm, tl.reshape(rank, (CP, )), 0), (T, G, 8)).to(tl.uint32)
        b0, b1 = tl.split(tl.reshape(b, (T, G, 4, 2)))
        s2 = b0 | (b1 << 16)
        # Kept where code + 8 - z sets bit 3 of the lane. A zero: -0.0 when
        # ZNEG and not ZPOS, or both and its code is 1 (zp): bit 15 of
        # (code << 15 | all when not ZPOS) & (all when ZNEG).
        c2 = _code_pairs(acc)
        keep = (((c2 + ((8 - z) * L2).to(tl.uint32)) >> 3) & L2) * 0xFFFF
        neg = ((c2 << 15) | ((1 - zp).to(tl.uint32) * (0x8000 * L2))) & (zn.to(tl.uint32) * (
            0x8000 * L2))
        # The exponent lo - z + code, to its field (lo - z may be below 0).
        lane = ((((lo - z) & EMAX) << MAN_BITS) * L2).to(tl.uint32)
        e2 = (c2 * SGN + lane) & (FIELD * L2)
        w = (((s2 + (s2 & (SGN * L2)) * EMAX) | e2) & keep) | (neg & (keep ^ 0xFFFFFFFF))
        word = tl.reshape(tl.join(w, w >> 16), (T, G, 8)).to(tl.int16)
        store_rows(dst, ttile(G, T), n, word, 2, G, T)
        err = _zero_checks(src, dst, n, lim, codes_nb, a_sm, sm_nb, a_rem, rem_nb, a_esc,
                           esc_nb, seg, emask, esc_t, e_incl, top, EXP_BITS, MAN_BITS, G, T)
    return err


@triton.jit(noinline=True)
def _decode_zero_words(src, dst, n, lim, base, phase, flags, nz, nesc, EXP_BITS: tl.constexpr,
                       MAN_BITS: tl.constexpr, G: tl.constexpr,
                       T: tl.constexpr):  # offline: zero path
    """_decode_zero_pairs for fp32 words (no LOWBYTE): a kept element's sm
    (3 bytes, or with LOW16 1) at its rank among the kept, gathered from the
    stream read as the hot path reads it; a zero's word its sign alone. It
    takes the entry's fields, as decode_chunk_general does, and finds the
    layout itself. Its error bits."""
    CP: tl.constexpr = 8 * G * T
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    FIELD: tl.constexpr = EMAX << MAN_BITS
    low16 = flags & 1
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = fixed3_layout(
        n, True, low16, 0, nz, nesc, 0, 4, False)
    lim, a_sm, zp, zn, z, lo, acc, emask, esc_t, e_incl, top, err, pre, rc, rt, k_incl = (
        _zero_counts(src, n, lim, flags, base, phase, codes_nb, a_sm, esc_nb, nz, EXP_BITS, G, T))
    if err == 0:
        q = tl.arange(0, 8)[None, None, :]
        rank = _kept_rank(pre, rc, rt, k_incl)
        # The sm stream read as the hot path reads it (group k at element
        # k: as if every element were kept; past the stream its zero
        # padding, inside the body: checked), each kept element's group
        # gathered at its rank.
        room = tl.minimum(a_rem - a_sm, lim - a_sm)
        if low16 != 0:  # one byte: sign and the top 7 mantissa bits
            grp = unpack_bytes(load_words(src + a_sm, room, T, 2 * G), T, G) << 16
        else:
            grp = tl.reshape(load_words24(src + a_sm, room, T, 2 * G), (T, G, 8))
        s = tl.reshape(tl.gather(tl.reshape(grp, (CP, )), tl.reshape(rank, (CP, )), 0),
                       (T, G, 8)).to(tl.uint32)
        code = ((acc[:, :, None] >> (3 * q)) & 7).to(tl.uint32)
        keep = code >= z
        # A zero: -0.0 when ZNEG and its code is ZPOS's count (0 or 1).
        neg = (zn != 0) & (code == zp)
        e_f = ((code + (lo - z)) << MAN_BITS) & FIELD
        word = tl.where(keep, (s + (s & (1 << MAN_BITS)) * EMAX) | e_f,
                        tl.where(neg, 0x80000000, 0).to(tl.uint32))
        store_rows(dst, ttile(G, T), n, word.to(tl.int32), 4, G, T)
        err = _zero_checks(src, dst, n, lim, codes_nb, a_sm, sm_nb, a_rem, rem_nb, a_esc,
                           esc_nb, seg, emask, esc_t, e_incl, top, EXP_BITS, MAN_BITS, G, T)
    return err


@triton.jit(noinline=True)
def _decode_zero_rem(src, dst, n, lim, base, phase, flags, nz, codes_nb, sm_nb, rem_nb, esc_nb,
                     a_sm, a_rem, a_esc, seg, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                     G: tl.constexpr, T: tl.constexpr):  # offline: zero path
    """_decode_zero_pairs for 16-bit words with a rem stream (fp16), a row at
    a time: a kept element's sm byte at its rank among the kept and its 3
    rem bits at 3 x that rank, each loaded from the payload (L1) at that
    place; a zero's word its sign. Loads by address a row at a time, not a
    gather of the whole tile through shared memory, so that its registers
    stay within the hot path's."""
    lim, a_sm, zp, zn, z, lo, acc, emask, esc_t, e_incl, top, err, pre, rc, rt, k_incl = (
        _zero_counts(src, n, lim, flags, base, phase, codes_nb, a_sm, esc_nb, nz, EXP_BITS, G, T))
    if err == 0:
        EMAX: tl.constexpr = (1 << EXP_BITS) - 1
        FIELD: tl.constexpr = EMAX << MAN_BITS
        SGN: tl.constexpr = 1 << MAN_BITS
        rb = _row_bases(rc, rt, k_incl)
        # The streams' ends (their padding inside the segment, inside the body: checked).
        sm_end = tl.minimum(16 * (a_rem >> 4), lim)
        rem_at = 16 * (a_rem >> 4)
        rem_end = tl.minimum(16 * (a_esc >> 4), lim)
        q = tl.arange(0, 8)[None, :]
        col = tl.arange(0, G)[None, :]
        i0 = tl.arange(0, T)[:, None] * (8 * G) + q
        w32 = src.to(tl.pointer_type(tl.int32))  # (16-byte aligned)
        for g in tl.static_range(G):
            accg = tl.sum(tl.where(col == g, acc, 0), axis=1)
            preg = tl.sum(tl.where(col == g, pre, 0), axis=1)
            rbg = tl.sum(tl.where(col == g, rb, 0), axis=1)
            code = (accg[:, None] >> (3 * q)) & 7
            keep = code >= z
            k = ((preg[:, None] >> (3 * q)) & 7).to(tl.uint32)  # the kept before it in the row
            # The row's kept sm bytes are the stream's bytes from rbg on (at
            # most 8: three aligned words) and its rem bits the stream's
            # bits from 3 rbg on (at most 24: two aligned words).
            wb = (a_sm + rbg) >> 2
            sm_run = _run64(w32, wb, (a_sm + rbg) & 3, sm_end >> 2, True)
            rb3 = 3 * rbg
            rem_run = _run64(w32, (rem_at >> 2) + (rb3 >> 5), (rb3 & 31) >> 3, rem_end >> 2, False)
            rem_run = (rem_run >> (rb3 & 7).to(tl.uint64)).to(tl.uint32)
            sm_half = tl.where(k < 4, sm_run.to(tl.uint32)[:, None],
                               (sm_run >> 32).to(tl.uint32)[:, None])
            s = ((sm_half >> (8 * (k & 3))) & 0xFF) | (((rem_run[:, None] >> (3 * k)) & 7) << 8)
            s = s.to(tl.int32)
            # A zero: -0.0 when ZNEG and its code is ZPOS's count (0 or 1).
            neg = (zn != 0) & (code == zp)
            e_f = ((code + (lo - z)) << MAN_BITS) & FIELD
            word = tl.where(keep, (s + (s & SGN) * EMAX) | e_f, tl.where(neg, 0x8000, 0))
            i = i0 + 8 * g
            tl.store(dst + i, word.to(tl.int16), mask=i < n)
        err = _zero_checks(src, dst, n, lim, codes_nb, a_sm, sm_nb, a_rem, rem_nb, a_esc,
                           esc_nb, seg, emask, esc_t, e_incl, top, EXP_BITS, MAN_BITS, G, T)
    return err


@triton.jit
def _run64(w32, wi, byte, end, THREE: tl.constexpr):
    """The 64 bits of a stream from byte ``byte`` (0..3) of 32-bit word
    ``wi`` on, per thread, from aligned word loads (two, or three when
    ``THREE``; words at or past ``end`` read as 0)."""
    w0 = tl.load(w32 + wi, mask=wi < end, other=0).to(tl.uint32).to(tl.uint64)
    w1 = tl.load(w32 + wi + 1, mask=wi + 1 < end, other=0).to(tl.uint32).to(tl.uint64)
    v = (w0 | (w1 << 32)) >> (8 * byte).to(tl.uint64)
    if THREE:
        w2 = tl.load(w32 + wi + 2, mask=wi + 2 < end, other=0).to(tl.uint32).to(tl.uint64)
        v = v | ((w2 << 32) << (32 - 8 * byte).to(tl.uint64))
    return v


@triton.jit
def _zero_counts(src, n, lim, flags, base, phase, codes_nb, a_sm, esc_nb, nz,
                 EXP_BITS: tl.constexpr, G: tl.constexpr, T: tl.constexpr):
    """What a zero path counts before it decodes: ``lim`` clamped and
    ``a_sm`` as a multiple of 16 (wide loads), the ZPOS and ZNEG flags and
    their count z, the window's lowest exponent, the [T, G] rows of codes
    (bits of rows past n cleared), each thread's
    escape mask and count, its inclusive escape count, the kept elements
    before each element of a row (``pre``, fields of 3 bits) and in each
    row (``rc``), in the thread (``rt``) and through the thread
    (``k_incl``), and ``top``: the largest escape count of a thread, with
    bit 16 set when the chunk's escape or kept count disagrees with the
    entry (``esc_nb``, ``n - nz``: then ``err`` is ERR_COUNTS). One scan
    over the threads."""
    zp = (flags >> 1) & 1
    zn = (flags >> 2) & 1
    lo, _ = fixed_window(base, phase, zp + zn, (1 << EXP_BITS) - 1)
    lim = tl.minimum(tl.maximum(lim, 0), 1 << 30).to(tl.int32)
    a_sm = 16 * (a_sm >> 4)
    t = tl.arange(0, T)
    r = t[:, None] * G + tl.arange(0, G)[None, :]  # row index, [T, G]
    acc = load_codes(src, r, tl.minimum(codes_nb, lim), tl.minimum(a_sm, lim), T, G) & row_mask(
        n, r)
    emask = escape_masks(acc, T, G)
    esc_t = popc_mask(emask)
    pre, rc = _row_kept(_kept_flags(acc, zp + zn))
    rt = tl.sum(rc, axis=1)
    ek = tl.cumsum(esc_t | (rt << 16), axis=0)  # one scan: escapes, kept << 16 (each < 2**16)
    e_incl = ek & 0xFFFF
    k_incl = ek >> 16
    bad_t = (t == T - 1) & ((e_incl != esc_nb) | (k_incl != n - nz))
    top = tl.max(esc_t | (bad_t.to(tl.int32) << 16), axis=0)
    err = tl.where(top > 0xFFFF, ERR_COUNTS, 0)
    return lim, a_sm, zp, zn, zp + zn, lo, acc, emask, esc_t, e_incl, top, err, pre, rc, rt, k_incl


@triton.jit
def _zero_checks(src, dst, n, lim, codes_nb, a_sm, sm_nb, a_rem, rem_nb, a_esc, esc_nb, seg,
                 emask, esc_t, e_incl, top, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                 G: tl.constexpr, T: tl.constexpr):
    """A zero path's work after its words are stored (_zero_counts' escape
    counts): the padding checked, the escapes patched; the error bits."""
    err = padding_error(src, codes_nb, a_sm, sm_nb, a_rem, rem_nb, a_esc, esc_nb, seg, lim)
    a_esc = 16 * (a_esc >> 4)
    return err | _patch_escapes(dst, src + a_esc, tl.minimum(esc_nb, lim - a_esc), emask,
                                esc_t, e_incl - esc_t, top & 0xFFFF, n, EXP_BITS, MAN_BITS, T, G)


@triton.jit
def _kept_flags(acc, z):
    """Rows of eight 3-bit codes (24-bit words) -> a flag at 3 q for each
    code of at least z (z = 1 or 2: not a flagged zero)."""
    return tl.where(z == 1, acc | (acc >> 1) | (acc >> 2), (acc >> 1) | (acc >> 2)) & 0x249249


@triton.jit
def _kept_rank(pre, rc, rt, k_incl):
    """Each element's rank among the kept: the kept before it in the chunk
    (less than the chunk's size), [T, G, 8], from _row_kept's counts, each
    thread's kept (``rt``) and the kept through it (``k_incl``, a scan)."""
    rb = _row_bases(rc, rt, k_incl)
    q = tl.arange(0, 8)[None, None, :]
    return rb[:, :, None] + ((pre[:, :, None] >> (3 * q)) & 7)


@triton.jit
def _row_kept(kf):
    """Flags at 3 q (q < 8) -> the flags before each q (field q of the word,
    at most 7: (kf << 3) times 0x249249 sums fields 0 .. q - 1 into field q
    without a carry) and the row's count."""
    pre = (kf << 3) * 0x249249
    return pre, ((pre >> 21) & 7) + ((kf >> 21) & 1)


@triton.jit
def _row_bases(rc, rt, k_incl):
    """The kept before each row of the chunk, [T, G], from the kept in each
    row (``rc``), in the thread (``rt``) and through it (``k_incl``)."""
    return row_excl(rc, rc.shape[1])[0] + (k_incl - rt)[:, None]


@triton.jit
def load_codes(src, r, nbytes, limit, T: tl.constexpr, G: tl.constexpr):
    """fixed3_encode.store_codes' inverse: the [T, G] rows of eight 3-bit
    values from a stream of ``nbytes`` bytes padded to ``limit``: whole
    32-bit words below ``limit`` (bytes past ``nbytes`` are the padding,
    which the caller checks is zero, or not read)."""
    if G % 4 == 0:
        return load_words24(src, limit, T, G // 4)
    else:
        return load_rows3(src, r, nbytes)


@triton.jit
def _code_pairs(acc):
    """Rows of eight 3-bit values ([T, G] 24-bit words) as [T, G, 4] pairs
    (value 2p at bit 0, 2p + 1 at bit 16): values 0..5 spread once a row
    (odd values 13 bits up: value 2p + 1 16 bits above value 2p), pairs
    0..2 one shift and mask each; pair 3's odd value would pass bit 31 and
    its even one meet value 1 there."""
    p2 = tl.arange(0, 4)[None, None, :]
    w = (acc & 0x71C7) | ((acc & 0x38E38) << 13)
    return tl.where(p2 == 3, (((acc >> 18) & 7) | ((acc >> 5) & 0x70000))[:, :, None],
                    (w[:, :, None] >> (6 * p2)) & 0x70007).to(tl.uint32)


@triton.jit
def _patch_escapes(dst, esc_src, esc_l, emask, esc_t, e_at, kmax, n, EXP_BITS: tl.constexpr,
                   MAN_BITS: tl.constexpr, T: tl.constexpr, G: tl.constexpr):
    """Each thread's escaped elements, in order, take the exponent bytes
    from byte e_at of the esc stream (``esc_l`` bytes: past it only when
    the counts disagree with the entry, an error already): trip k patches
    each thread's k-th escape (the lowest bit left in its mask) into its
    word, read back from dst. Returns ERR_EXPONENT when a byte names no
    exponent of the dtype."""
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    tw = tl.arange(0, T) * (8 * G)
    # The words' store may come from another thread of the program (a
    # layout conversion before a wide store): a barrier orders it before
    # every read back.
    tl.debug_barrier()
    bad = tl.zeros([T], tl.int32)
    m = emask
    one = (n >> 31) + 1  # 1 (n >= 0), but not to the compiler: it does not unroll the loop
    top = esc_l - 1
    k = tl.zeros([], tl.int32)
    while k < kmax:  # offline: escape rounds
        act = k < esc_t
        b = m & (0 - m)
        if m.dtype == tl.int64:
            j = _low_bit_index64(b)
        else:
            j = low_bit_index(b)
        # Unmasked, clamped to the stream's last byte: past it only for a
        # thread without a k-th escape, or counts that disagree with the
        # entry (an error already); kmax > 0 means the stream is not empty.
        eb = tl.load(esc_src + tl.minimum(e_at + k, top)).to(tl.int32)
        # The read back is unmasked: a thread without a k-th escape reads
        # the chunk's first word instead (it exists; the store is masked off).
        p = dst + tl.where(act, tw + j, 0)
        old = tl.load(p, volatile=True).to(tl.int32)
        new = (old & ~(EMAX << MAN_BITS)) | ((eb & EMAX) << MAN_BITS)
        tl.store(p, new.to(dst.dtype.element_ty), mask=act)
        bad = bad | eb  # (above EMAX if any byte is)
        m = m ^ b
        k += one
    err = tl.zeros([], tl.int32)
    if EXP_BITS < 8:
        err = tl.where(tl.max(bad, axis=0) > EMAX, ERR_EXPONENT, 0)
    return err


@triton.jit
def _low_bit_index64(b):
    """The index of the one set bit of each int64 ``b`` (a power of two),
    from the exponent of its float value (exact: one bit); 0 gives -127."""
    f = b.to(tl.uint64, bitcast=True).to(tl.float32)
    return ((f.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
