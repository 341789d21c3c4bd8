"""fixed3 encode (format v3): one kernel, one program per chunk.

A program takes its chunk id from an atomic ticket (``_lookback.ticket``:
every chunk it may wait on belongs to a program that has started) and
loads its chunk once (the only read of the input from memory) into the
thread-major ``[T, G, 8]`` tile (``_codec_common.ttile``: thread t holds
the 8 G consecutive elements from 8 G t).

The hot path is the chunk Gaussian data makes: fewer exponent fields 0
than 1/64 of the chunk, so no zero sign can be flagged (format.py flags a
sign that is at least 1/64 of the chunk), every element ships its
sign+mantissa at its own position, and the segment is whole words of
registers:

- the statistics: each thread's exponent sum and counts of exponent
  fields not 0 and EMAX (the locator is the mean over the normals: exact,
  so subnormals, infinities, NaNs and a few zeros stay hot, as escapes),
  one reduction over the threads;
- codes: the window's code of each exponent, rows of eight 3-bit codes
  (3 bytes), stored as 32-bit words;
- sm: each element's sign+mantissa byte, stored in 16-byte granules
  (fp32: one byte with LOW16, three without); fp16's top 3 bits (rem)
  packed like the codes;
- esc: each thread takes its escapes from a mask of them, one a trip of a
  loop over the thread with the most, at the thread's exclusive escape
  count (one scan over the threads); the element's word is read again
  (from L1/L2);
- the segment's offset by the decoupled look-back (``_lookback``), its
  table entry and offset (fixed3_general.place_chunk), and for the last
  chunk, after its writes, the body length and the header
  (``_lookback.finish_payload``).

A bf16 or fp32 chunk with zeros to flag takes a zero path,
``_encode_zero_pairs`` / ``_encode_zero_words`` (noinline: the chunk read
again, the codes with the zero codes, each kept element's sm stored at its
rank among the kept). Every other chunk (fp16's zeros to flag, a chunk
stored RAW, an fp32 chunk that takes LOWBYTE: the hot path counts its
nonzero low bytes to know) and tiles of more than 64 elements a thread
are encoded by fixed3_general, noinline functions off the hot path that
read the chunk again; the hot path hands them the statistics and the
counts of +0.0 and -0.0 they need.

16-bit words are handled two to a 32-bit register (lanes: element 2j low,
2j + 1 high), whose fields are computed by lane arithmetic that carries
nothing across bit 16; 32-bit words one a register.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._codec_common import (FIXED_ZERO_SHIFT, align16, cols_or, esc_bits, fixed_window,
                            fixed_zero_flags,
                            low_bit_index, lowbyte_wins, pack_bytes, popc32, row_mask,
                            store_rows3, store_words, store_words24, ttile, zero_pad)
from ._lookback import finish_payload, ticket
from .fixed3_general import (encode_chunk_general, encode_cold_chunk_general, is_coded,
                             place_chunk)

L2 = tl.constexpr(0x10001)  # one in each 16-bit lane


@triton.jit
def fixed3_encode_kernel(x_ptr, out_ptr, ticket_ptr, status_ptr, total_ptr, numel, nch, C,
                         table_off, offsets_off, body_off,
                         ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                         MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr):
    G: tl.constexpr = CP // (8 * T)
    c = ticket(ticket_ptr)
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)
    done = n < 0  # (False)
    # The chunk's statistics, when the hot path found them (else the general does).
    known = tl.zeros([], tl.int32)
    base = tl.zeros([], tl.int32)
    phase = tl.zeros([], tl.int32)
    zeros = tl.zeros([], tl.int32)
    low16 = tl.zeros([], tl.int32)
    # The zero paths (bf16, fp32); fp16's zeros to flag are fixed3_general's.
    ZERO_PAIRS: tl.constexpr = G <= 8 and ITEMSIZE == 2 and EXP_BITS == 8
    ZERO_WORDS: tl.constexpr = G <= 8 and ITEMSIZE == 4
    if G <= 8:  # a thread's escapes fit one 64-bit mask
        if ITEMSIZE == 2:
            done, base, phase, zeros, end = _encode_pairs(
                x_ptr, out_ptr, status_ptr, total_ptr, c, start, n, nch, table_off, offsets_off,
                body_off, EXP_BITS, MAN_BITS, CP, T)
        else:
            done, base, phase, zeros, low16, end = _encode_words(
                x_ptr, out_ptr, status_ptr, total_ptr, c, start, n, nch, table_off, offsets_off,
                body_off, EXP_BITS, MAN_BITS, CP, T)
        known = known + 1
    if ZERO_PAIRS or ZERO_WORDS:
        if not done:
            # A zero sign to flag, in a chunk not all +0.0 (ZERO: fixed3_general's).
            zp, zn = fixed_zero_flags(zeros, n)
            if ((zp | zn) != 0) & ((zeros & 0xFFFF) != n):
                if ZERO_PAIRS:
                    end = _encode_zero_pairs(x_ptr, out_ptr, status_ptr, c, start, n,
                                             table_off, offsets_off, body_off, base, phase,
                                             zeros, EXP_BITS, MAN_BITS, CP, T)
                else:
                    end = _encode_zero_words(x_ptr, out_ptr, status_ptr, c, start, n,
                                             table_off, offsets_off, body_off, base, phase,
                                             zeros, low16, EXP_BITS, MAN_BITS, CP, T)
                done = end >= 0
        if not done:
            end = encode_cold_chunk_general(x_ptr, out_ptr, status_ptr, c, start, n, table_off,
                                            offsets_off, body_off, known, base, phase, zeros,
                                            low16, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
    elif not done:
        end = encode_chunk_general(x_ptr, out_ptr, status_ptr, c, start, n, table_off,
                                   offsets_off, body_off, known, base, phase, zeros, low16,
                                   ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
    if c == nch - 1:
        # After the chunk's writes: a call saves what is live across it.
        finish_payload(total_ptr, out_ptr, end, offsets_off, nch)


@triton.jit
def _encode_pairs(x_ptr, out_ptr, status_ptr, total_ptr, c, start, n, nch, table_off,
                  offsets_off, body_off, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                  CP: tl.constexpr, T: tl.constexpr):
    """The hot path of 16-bit words (bf16, fp16): a chunk without a flagged
    zero, stored CODED. Returns whether it took the chunk (any other is
    fixed3_general's), the locator, and the counts of +0.0 and -0.0 (low
    and high 16 bits; counted only for a chunk it leaves, whose zeros may
    be flagged)."""
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = EXP_BITS == 5
    SGN: tl.constexpr = 1 << MAN_BITS  # the sign's place in sign+mantissa
    i = ttile(G, T)
    # The padding reads as 2**(1 - bias): exponent 1 (taken out of the sum
    # below), sign and mantissa 0 (its sm and rem are the streams' zero
    # padding); its codes are masked off.
    pr = _pairs(tl.load(x_ptr + start + i, mask=i < n, other=SGN), G, T)
    u = (pr >> MAN_BITS) & (EMAX * L2)  # the exponent fields
    # Bit EXP_BITS of a lane of u + EMAX is set when e != 0, of u + 1 when
    # e = EMAX (no carry leaves a lane): counted as 8-bit fields, e != 0 at
    # bits 8 and 24, e = EMAX at 0 and 16 (at most 4 G a thread each).
    H: tl.constexpr = (EMAX + 1) * L2
    flags = (((u + EMAX * L2) & H) << (8 - EXP_BITS)) + (((u + L2) & H) >> EXP_BITS)
    su = tl.sum(tl.sum(u, axis=2), axis=1)  # lanes of at most 4 G EMAX
    sf = tl.sum(tl.sum(flags, axis=2), axis=1)
    hot, base, phase, lo, _none = _statistics(
        (su & 0xFFFF) + (su >> 16), ((sf >> 8) & 0xFF) + (sf >> 24),
        (sf & 0xFF) + ((sf >> 16) & 0xFF), tl.zeros([T], tl.int32), n, EMAX, CP)
    done = n < 0  # (False)
    end = tl.zeros([], tl.int64)  # the chunk's segment end, when taken
    if hot:
        # The code of each lane: v = (e - lo) mod 2**15 is in the window when
        # v < 7, i.e. when v + 0x8000 - 7 leaves bit 15 clear; the code is
        # v there and 7 (ESC) outside.
        v = (u + (((0x8000 - lo) & 0x7FFF) * L2).to(tl.uint32)) & 0x7FFF7FFF
        out = ((v + ((0x8000 - 7) * L2)) >> 15) & L2
        c2 = (v & (7 * L2)) | (out * 7)
        r = tl.arange(0, T)[:, None] * G + tl.arange(0, G)[None, :]  # row index, [T, G]
        acc = _pair_rows3(c2) & row_mask(n, r)  # a row's eight codes; 0 past n
        emask, esc_t, e_at, n_esc, kmax = escape_counts(acc, T, G)
        if is_coded(n, 0, 0, 0, n_esc, 0, 2, IS_FP16):
            dst, coded, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, end = place_chunk(
                out_ptr, status_ptr, c, n, table_off, offsets_off, body_off, 0, 0, 0, 0, base,
                phase, 0, n_esc, 0, 2, IS_FP16)
            a_sm = 16 * (a_sm >> 4)  # products: their divisibility is known (wide stores)
            a_rem = 16 * (a_rem >> 4)
            a_esc = 16 * (a_esc >> 4)
            store_codes(dst, acc, r, codes_nb, a_sm, T, G)
            if IS_FP16:
                sm2 = pr & (0xFF * L2)  # the mantissa's low byte; the rest is rem
            else:
                sm2 = ((pr >> EXP_BITS) & (SGN * L2)) | (pr & ((SGN - 1) * L2))
            room = a_rem - a_sm
            if G >= 2:
                _store_pair_bytes(dst + a_sm, sm2, room, T, G)
            else:
                store_words(dst + a_sm, _pair_bytes(sm2, T, G), room, T, 2 * G)
            if CP < 16:
                zero_pad(dst + a_sm, sm_nb, room)
            if IS_FP16:
                # rem: the sign (bit 15) and the mantissa's top two bits, rows
                # of eight like the codes.
                r2 = ((pr >> 8) & (3 * L2)) | ((pr >> 13) & (4 * L2))
                store_codes(dst + a_rem, _pair_rows3(r2), r, rem_nb, a_esc - a_rem, T, G)
            store_escapes(x_ptr + start, dst + a_esc, emask, esc_t, e_at, kmax, n, esc_nb,
                          MAN_BITS, EMAX, T, G)
            done = n >= 0  # (True)
    zeros = tl.zeros([], tl.int32)
    if not hot:
        pz, ng = _zero_lanes(pr)  # +0.0 and -0.0
        zt = tl.sum(tl.sum((pz >> 15) + (ng >> 7), axis=2), axis=1)  # 8-bit fields
        zeros = tl.sum((((zt & 0xFF) + ((zt >> 16) & 0xFF)) | (
            (((zt >> 8) & 0xFF) + (zt >> 24)) << 16)).to(tl.int32), axis=0)
    return done, base, phase, zeros, end


@triton.jit(noinline=True)
def _encode_zero_pairs(x_ptr, out_ptr, status_ptr, c, start, n, table_off, offsets_off,
                       body_off, base, phase, zeros, EXP_BITS: tl.constexpr,
                       MAN_BITS: tl.constexpr, CP: tl.constexpr,
                       T: tl.constexpr):  # offline: zero path
    """The zero path of 16-bit words without a rem stream (bf16): a chunk
    with a zero sign to flag (the +0.0 and -0.0 counts are ``zeros``' low
    and high 16 bits) that is not all +0.0, stored CODED. The codes by the
    hot path's lane arithmetic with the window moved up by the z zero
    codes; a flagged zero takes its code (+0.0 0, then -0.0) and no sm
    byte. The sm bytes a row at a time (the row read again, from L1): each
    kept element's at its rank among the kept (the kept before the thread,
    by one scan, before the row, and before it in the row: the ranks
    _decode_zero_pairs gathers at), one byte store each. Returns the
    segment's end as the hot path does, or -1 for a chunk to store RAW
    (fixed3_general's). Noinline: it takes scalars only and reads the chunk
    again (from L1/L2), and a row at a time, so that its registers do not
    become the kernel's allocation around the hot path."""
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    SGN: tl.constexpr = 1 << MAN_BITS
    zp, zn, z, nz, lo = _zero_fields(zeros, n, base, phase, EMAX)
    i = ttile(G, T)
    # The padding as the hot path reads it; its codes and kept flags are masked off.
    pr = _pairs(tl.load(x_ptr + start + i, mask=i < n, other=SGN), G, T)
    u = (pr >> MAN_BITS) & (EMAX * L2)
    # v = (e - lo) mod 2**15: in the window when v < 7 - z (v + 0x8000 - 7 + z
    # leaves bit 15 clear), whose code is v + z; 7 (ESC) outside.
    v = (u + (((0x8000 - lo) & 0x7FFF) * L2).to(tl.uint32)) & 0x7FFF7FFF
    out = ((v + ((0x8000 - 7 + z) * L2).to(tl.uint32)) >> 15) & L2
    c2 = ((v + (z * L2).to(tl.uint32)) & (7 * L2)) | (out * 7)
    # A flagged zero's code is 0 for +0.0, zp for -0.0.
    zpm = (0 - zp).to(tl.uint32)  # all ones when ZPOS
    znm = (0 - zn).to(tl.uint32)
    pz, ng = _zero_lanes(pr)
    fz = ((pz & zpm) | (ng & znm)) >> 15  # 1 in a flagged zero's lane
    c2 = (c2 & ((fz * 7) ^ (7 * L2))) | ((ng & znm & zpm) >> 15)
    r = tl.arange(0, T)[:, None] * G + tl.arange(0, G)[None, :]  # row index, [T, G]
    acc = _pair_rows3(c2) & row_mask(n, r)  # a row's eight codes; 0 past n
    # The thread's kept: its elements below n but the flagged zeros (the
    # padding reads as no zero).
    fz_t = tl.sum(tl.sum(fz, axis=2), axis=1)
    tw = tl.arange(0, T) * (8 * G)
    rt = tl.minimum(tl.maximum(n - tw, 0), 8 * G) - ((fz_t & 0xFFFF) + (fz_t >> 16)).to(tl.int32)
    emask, esc_t, e_at, n_esc, kmax, at = _escape_kept_counts(acc, rt, T, G)
    end = tl.zeros([], tl.int64) - 1
    if is_coded(n, 0, 0, nz, n_esc, 0, 2, False):
        dst, coded, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, end = place_chunk(
            out_ptr, status_ptr, c, n, table_off, offsets_off, body_off, 0, 0, zp, zn, base,
            phase, nz, n_esc, 0, 2, False)
        a_sm = 16 * (a_sm >> 4)
        a_esc = 16 * (a_esc >> 4)
        store_codes(dst, acc, r, codes_nb, a_sm, T, G)
        # The sm bytes a row at a time: at the kept before the row (``at``)
        # and before the element in the row.
        sm_dst = dst + a_sm
        q8 = tl.arange(0, 8)[None, :]
        for g in range(G):  # offline: chunk rows
            ig = tl.arange(0, T)[:, None] * (8 * G) + 8 * g + q8
            valid = ig < n
            a, b = tl.split(tl.reshape(tl.load(x_ptr + start + ig, mask=valid, other=SGN).to(
                tl.uint16, bitcast=True), (T, 4, 2)))
            p = a.to(tl.uint32) | (b.to(tl.uint32) << 16)  # pairs, as in _pairs
            pzr, ngr = _zero_lanes(p)
            k2 = (((pzr & zpm) | (ngr & znm)) >> 15) ^ L2  # 1 in a kept lane
            smp = ((p >> EXP_BITS) & (SGN * L2)) | (p & ((SGN - 1) * L2))
            k = (tl.reshape(tl.join(k2, k2 >> 16), (T, 8)) & 1).to(tl.int32)
            sm = tl.reshape(tl.join(smp, smp >> 16), (T, 8)).to(tl.uint8)
            tl.store((sm_dst + at)[:, None] + (tl.cumsum(k, axis=1) - k), sm,
                     mask=valid & (k != 0))
            at += tl.sum(k, axis=1)
        zero_pad(dst + a_sm, sm_nb, a_rem - a_sm)
        store_escapes(x_ptr + start, dst + a_esc, emask, esc_t, e_at, kmax, n, esc_nb, MAN_BITS,
                      EMAX, T, G)
    return end


@triton.jit(noinline=True)
def _encode_zero_words(x_ptr, out_ptr, status_ptr, c, start, n, table_off, offsets_off,
                       body_off, base, phase, zeros, low16, EXP_BITS: tl.constexpr,
                       MAN_BITS: tl.constexpr, CP: tl.constexpr,
                       T: tl.constexpr):  # offline: zero path
    """_encode_zero_pairs for 32-bit words (fp32): a kept element's sm (one
    byte with LOW16, else three) at its rank among the kept (three bytes
    at 3 x rank), the groups _decode_zero_words gathers. A chunk that takes
    LOWBYTE, or is stored RAW, is fixed3_general's: -1."""
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    zp, zn, z, nz, lo = _zero_fields(zeros, n, base, phase, EMAX)
    i = ttile(G, T)
    w = load_rows32(x_ptr + start, i, n, 1 << MAN_BITS, G, T)  # the padding as the hot path's
    flagged = _flagged_words(w, zp, zn)
    # Window codes z..6 for the exponents lo..lo + 6 - z, 7 (ESC) outside; a
    # flagged zero's code 0 (+0.0) or zp (-0.0).
    d = ((w >> MAN_BITS) & EMAX) - lo
    code = tl.where((d >= 0) & (d < 7 - z), d + z, 7)
    code = tl.where(flagged, (w >> 31) & zp, code)
    r = tl.arange(0, T)[:, None] * G + tl.arange(0, G)[None, :]  # row index, [T, G]
    q = tl.arange(0, 8)[None, None, :]
    acc = tl.sum(code << (3 * q), axis=2) & row_mask(n, r)
    # The thread's kept (its elements below n but the flagged zeros) and its
    # low bytes that are not 0 (LOWBYTE's count; the padding's is 0).
    tw = tl.arange(0, T) * (8 * G)
    rt = tl.minimum(tl.maximum(n - tw, 0), 8 * G) - tl.sum(tl.sum(flagged.to(tl.int32), axis=2),
                                                           axis=1)
    n_low = tl.sum(tl.sum(((w & 0xFF) != 0).to(tl.int32), axis=2), axis=1)
    emask, esc_t, e_at, n_esc, kmax, at = _escape_kept_counts(acc, rt, T, G)
    end = tl.zeros([], tl.int64) - 1
    lowbyte = (low16 == 0) & lowbyte_wins(n, n - nz, tl.sum(n_low, axis=0))
    if is_coded(n, low16, 0, nz, n_esc, 0, 4, False) & ~lowbyte:
        dst, coded, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, end = place_chunk(
            out_ptr, status_ptr, c, n, table_off, offsets_off, body_off, low16, 0, zp, zn, base,
            phase, nz, n_esc, 0, 4, False)
        a_sm = 16 * (a_sm >> 4)
        a_esc = 16 * (a_esc >> 4)
        store_codes(dst, acc, r, codes_nb, a_sm, T, G)
        # The sm a row at a time, as _encode_zero_pairs stores it.
        sm_dst = dst + a_sm
        h = tl.arange(0, T)[:, None] * (8 * G) + tl.arange(0, 4)[None, :]
        for g in range(G):  # offline: chunk rows
            for half in tl.static_range(2):  # 16 bytes a load: a half row in the thread
                wr = tl.load(x_ptr + start + h, mask=h < n, other=0).to(tl.int32)
                k = ((h < n) & ~_flagged_words(wr, zp, zn)).to(tl.int32)
                rank = at[:, None] + tl.cumsum(k, axis=1) - k
                if low16 != 0:  # sign and the mantissa's top 7 bits
                    sm = ((wr >> 24) & 0x80) | ((wr >> 16) & 0x7F)
                    tl.store(sm_dst + rank, sm.to(tl.uint8), mask=k != 0)
                else:  # sign << 23 | mantissa, three bytes little-endian
                    p = sm_dst + 3 * rank
                    tl.store(p, wr.to(tl.uint8), mask=k != 0)
                    tl.store(p + 1, (wr >> 8).to(tl.uint8), mask=k != 0)
                    tl.store(p + 2, (((wr >> 16) & 0x7F) | ((wr >> 24) & 0x80)).to(tl.uint8),
                             mask=k != 0)
                at += tl.sum(k, axis=1)
                h += 4
        zero_pad(dst + a_sm, sm_nb, a_rem - a_sm)
        store_escapes(x_ptr + start, dst + a_esc, emask, esc_t, e_at, kmax, n, esc_nb, MAN_BITS,
                      EMAX, T, G)
    return end


@triton.jit
def _zero_fields(zeros, n, base, phase, EMAX: tl.constexpr):
    """A zero path's chunk fields from the +0.0 and -0.0 counts (``zeros``'
    low and high 16 bits): ZPOS, ZNEG, their count z, the flagged zeros,
    the window's lowest exponent."""
    zp, zn = fixed_zero_flags(zeros, n)
    z = zp + zn
    lo, _ = fixed_window(base, phase, z, EMAX)
    return zp, zn, z, zp * (zeros & 0xFFFF) + zn * ((zeros >> 16) & 0xFFFF), lo


@triton.jit
def _zero_lanes(p):
    """Bit 15 of each 16-bit lane of p set where the lane is +0.0 (first)
    and -0.0 (second): the low 15 bits m set bit 15 of m + 0x7FFF only when
    they are not 0."""
    HI: tl.constexpr = 0x8000 * L2
    nzf = (p & 0x7FFF7FFF) + 0x7FFF7FFF
    return ((nzf | p) ^ HI) & HI, (p & (nzf ^ HI)) & HI


@triton.jit
def _flagged_words(w, zp, zn):
    """The 32-bit words (int32) that are a flagged zero: +0.0 when ZPOS,
    -0.0 when ZNEG."""
    return ((w == 0) & (zp != 0)) | ((w == -(1 << 31)) & (zn != 0))


@triton.jit
def _escape_kept_counts(acc, rt, T: tl.constexpr, G: tl.constexpr):
    """escape_counts for a zero path, whose threads also count their kept
    elements (``rt``): the escape masks, counts and places, the chunk's
    escapes and largest count of a thread, and the kept before each thread
    (one scan of both counts)."""
    emask = escape_masks(acc, T, G)
    esc_t = popc_mask(emask)
    ek = tl.cumsum(esc_t | (rt << 16), axis=0)  # escapes, kept << 16 (each < 2**16)
    n_esc, kmax = tl.reduce((esc_t, esc_t), 0, _sum_max)
    return emask, esc_t, (ek & 0xFFFF) - esc_t, n_esc, kmax, (ek >> 16) - rt


@triton.jit
def _encode_words(x_ptr, out_ptr, status_ptr, total_ptr, c, start, n, nch, table_off,
                  offsets_off, body_off, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                  CP: tl.constexpr, T: tl.constexpr):
    """The hot path of 32-bit words (fp32), LOW16 chunks (exact bf16
    casts: one sm byte an element) and others (three): a chunk without a
    flagged zero, stored CODED. Returns what _encode_pairs does, and LOW16."""
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    ONE: tl.constexpr = 1 << MAN_BITS  # the padding (see _encode_pairs)
    i = ttile(G, T)
    w = load_rows32(x_ptr + start, i, n, ONE, G, T)
    e = (w >> MAN_BITS) & EMAX
    # e + EMAX + (e + 1) << 16: bit 8 set when e != 0, bit 24 when e = EMAX.
    flags = (e * L2 + (EMAX + (1 << 16))) & 0x1000100
    sf = tl.sum(tl.sum(flags, axis=2), axis=1)
    low = (tl.reduce(tl.reduce(w, 2, _or), 1, _or) & 0xFFFF) != 0  # not a bf16 cast
    # The half rows (4 elements) whose low bytes are all nonzero (their least
    # is not 0; the padding's are 0): 4 of them bound LOWBYTE's count of
    # nonzero low bytes from below (a zero, or another word whose low byte
    # is 0, costs the bound 4 at most: the 63 a hot chunk may hold, 252).
    halves = tl.sum(tl.sum((tl.min(tl.reshape(w & 0xFF, (T, G, 2, 4)), axis=3) != 0).to(
        tl.int32), axis=2), axis=1)
    # x = 2 halves + (threads holding a word that is not a bf16 cast),
    # summed over the threads: LOW16 when 0.
    hot, base, phase, lo, x = _statistics(tl.sum(tl.sum(e, axis=2), axis=1),
                                          (sf >> 8) & 0xFF, sf >> 24,
                                          2 * halves + low.to(tl.int32), n, EMAX, CP)
    low16 = (x == 0).to(tl.int32)
    # A chunk that may take LOWBYTE (format.py) is fixed3_general's: one
    # whose lower bound, 4 (x - tv) / 2 with tv the threads that hold any of
    # its n elements (the others count no half row and are no such thread),
    # already fails the rule (it holds for fewer bytes only) stays.
    tv = tl.minimum((n + 8 * G - 1) // (8 * G), T)
    hot = hot & ((low16 != 0) | ~lowbyte_wins(n, n, 4 * ((x - tv) >> 1)))
    done = n < 0  # (False)
    end = tl.zeros([], tl.int64)  # the chunk's segment end, when taken
    if hot:
        code = tl.minimum((e - lo).to(tl.uint32), 7).to(tl.int32)
        r = tl.arange(0, T)[:, None] * G + tl.arange(0, G)[None, :]
        q = tl.arange(0, 8)[None, None, :]
        acc = tl.sum(code << (3 * q), axis=2) & row_mask(n, r)
        emask, esc_t, e_at, n_esc, kmax = escape_counts(acc, T, G)
        if is_coded(n, low16, 0, 0, n_esc, 0, 4, False):
            dst, coded, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, end = place_chunk(
                out_ptr, status_ptr, c, n, table_off, offsets_off, body_off, low16, 0, 0, 0, base,
                phase, 0, n_esc, 0, 4, False)
            a_sm = 16 * (a_sm >> 4)
            a_rem = 16 * (a_rem >> 4)
            a_esc = 16 * (a_esc >> 4)
            store_codes(dst, acc, r, codes_nb, a_sm, T, G)
            room = a_rem - a_sm
            if low16 != 0:
                # sign and the mantissa's top 7 bits: byte 3's top bit, byte 2's low 7
                sm = ((w >> 24) & 0x80) | ((w >> 16) & 0x7F)
                store_words(dst + a_sm, pack_bytes(sm, T, G), room, T, 2 * G)
            else:
                sm = ((w >> 8) & 0x800000) | (w & 0x7FFFFF)
                store_words24(dst + a_sm, tl.reshape(sm, (T, 8 * G)), room, T, 2 * G)
            if CP < 16:
                zero_pad(dst + a_sm, sm_nb, room)
            store_escapes(x_ptr + start, dst + a_esc, emask, esc_t, e_at, kmax, n, esc_nb,
                          MAN_BITS, EMAX, T, G)
            done = n >= 0  # (True)
    zeros = tl.zeros([], tl.int32)
    if not hot:
        zt = tl.sum(tl.sum((w == 0).to(tl.int32) | ((w == -(1 << 31)).to(tl.int32) << 16),
                           axis=2), axis=1)
        zeros = tl.sum(zt, axis=0)
    return done, base, phase, zeros, low16, end


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _statistics(s_t, nz_t, mx_t, x_t, n, EMAX: tl.constexpr, CP: tl.constexpr):
    """From each thread's exponent sum, count of exponents not 0, count of
    exponents EMAX (the padding: exponent 1) and a count of the caller's
    (x_t, less than 2**16 in all), one reduction over the threads: whether the
    chunk can take the hot path (too few exponents 0 for a zero sign to be
    flagged: format.py flags a sign that is at least 1/64 of the chunk),
    format.py's locator (q = floor(4 S / K) over the K normals, exponent
    sum S: base q >> 2, phase q & 3), the start of the window without zero
    codes, and the sum of x_t."""
    per = s_t.to(tl.int64) | (nz_t.to(tl.int64) << 20) | (mx_t.to(tl.int64) << 33) | (
        x_t.to(tl.int64) << 46)
    tot = tl.sum(per, axis=0)
    pad = CP - n
    nonzero = ((tot >> 20) & 0x1FFF).to(tl.int32)
    nmax = ((tot >> 33) & 0x1FFF).to(tl.int32)
    k = nonzero - nmax - pad
    s = (tot & 0xFFFFF).to(tl.int32) - EMAX * nmax - pad
    qq = tl.where(k > 0, (4 * s) // tl.maximum(k, 1), 0)
    base = qq >> 2
    phase = qq & 3
    lo, _ = fixed_window(base, phase, 0, EMAX)
    return ((CP - nonzero) << FIXED_ZERO_SHIFT) < n, base, phase, lo, (tot >> 46).to(tl.int32)


@triton.jit
def load_rows32(src, i, n, other, G: tl.constexpr, T: tl.constexpr):
    """The [T, G, 8] tile of 32-bit words at src + i (i: ttile), ``other``
    at or past n, as two [T, G, 4] halves (one 16-byte load each) joined in
    the thread: one load of the whole tile would be split into 16-byte
    vectors with a row's halves in two threads."""
    h = tl.arange(0, T)[:, None, None] * (8 * G) + tl.arange(0, G)[None, :, None] * 8 + (
        tl.arange(0, 4)[None, None, :])
    a = tl.load(src + h, mask=h < n, other=other)
    b = tl.load(src + h + 4, mask=h + 4 < n, other=other)
    return tl.reshape(tl.permute(tl.join(a, b), (0, 1, 3, 2)), (T, G, 8)).to(tl.int32)


@triton.jit
def store_codes(dst, acc, r, nbytes, limit, T: tl.constexpr, G: tl.constexpr):
    """Rows of eight 3-bit values (a [T, G] tile of 24-bit words, row r at
    byte 3 r) as a stream of ``nbytes`` bytes padded with zeros to
    ``limit``: 32-bit words when a thread's rows make whole words (G a
    multiple of 4), else bytes and the padding apart."""
    if G % 4 == 0:
        store_words24(dst, acc, limit, T, G // 4)
    else:
        store_rows3(dst, acc, r, nbytes)
        zero_pad(dst, nbytes, limit)


@triton.jit
def escape_masks(acc, T: tl.constexpr, G: tl.constexpr):
    """From the rows of codes ([T, G] 24-bit words): each thread's mask of
    its escapes, bit 8 g + q for element q of row g (the element's index in
    the thread; int64 at G = 8)."""
    if G == 8:
        a, b = tl.split(tl.reshape(esc_bits(acc).to(tl.int64), (T, 4, 2)))  # rows 2j, 2j + 1
        return cols_or(a, 16, T, 4) | (cols_or(b, 16, T, 4) << 8)
    else:
        return cols_or(esc_bits(acc), 8, T, G)


@triton.jit
def popc_mask(m):
    """Set bits of each escape mask (int32, or int64 as two halves)."""
    if m.dtype == tl.int64:
        return popc32(m.to(tl.int32)) + popc32((m >> 32).to(tl.int32))
    else:
        return popc32(m)


@triton.jit
def escape_counts(acc, T: tl.constexpr, G: tl.constexpr):
    """From the rows of codes ([T, G] 24-bit words, 0 past n): each
    thread's mask of its escapes (escape_masks), its escape count and the
    escapes of the threads before it, and the chunk's escape count and
    largest count of a thread (one scan and one reduction over the threads)."""
    emask = escape_masks(acc, T, G)
    esc_t = popc_mask(emask)
    e_at = tl.cumsum(esc_t, axis=0) - esc_t
    n_esc, kmax = tl.reduce((esc_t, esc_t), 0, _sum_max)
    return emask, esc_t, e_at, n_esc, kmax


@triton.jit
def store_escapes(x, esc_dst, emask, esc_t, e_at, kmax, n, n_esc, MAN_BITS: tl.constexpr,
                  EMAX: tl.constexpr, T: tl.constexpr, G: tl.constexpr):
    """The esc stream of ``n_esc`` bytes, padded with zeros: each thread's
    escapes' exponent bytes in order from byte e_at of esc_dst; trip k
    stores each thread's k-th escape (the lowest bit left in its mask),
    reading its word again at x (the chunk's first element)."""
    tw = tl.arange(0, T) * (8 * G)
    xw = x + tw
    m = emask
    one = (n >> 31) + 1  # 1 (n >= 0), but not to the compiler: it does not unroll the loop
    k = tl.zeros([], tl.int32)
    while k < kmax:  # offline: escape rounds
        m = _store_escape(xw, tw, esc_dst, m, e_at + k, k < esc_t, MAN_BITS, EMAX)
        k += one
    zero_pad(esc_dst, n_esc, align16(n_esc))


@triton.jit
def _sum_max(a0, a1, b0, b1):
    """Combine of (sum, max) pairs."""
    return a0 + b0, tl.maximum(a1, b1)


@triton.jit
def _pairs(wl, G: tl.constexpr, T: tl.constexpr):
    """The [T, G, 8] tile of 16-bit words as [T, G, 4] uint32 pairs:
    element 2j in the low lane, 2j + 1 in the high lane."""
    a, b = tl.split(tl.reshape(wl.to(tl.uint16, bitcast=True), (T, G, 4, 2)))
    return a.to(tl.uint32) | (b.to(tl.uint32) << 16)


@triton.jit
def _pair_rows3(v2):
    """Rows of eight 3-bit values from a [T, G, 4] tile of pairs (a value
    of at most 7 a lane): the rows' 24-bit words, int32 [T, G]."""
    v6 = (v2 | (v2 >> 13)) & 0x3F
    return tl.sum(v6 << (6 * tl.arange(0, 4)[None, None, :]).to(tl.uint32), axis=2).to(tl.int32)


@triton.jit
def _pair_bytes(v2, T: tl.constexpr, G: tl.constexpr):
    """The low byte of each lane of a [T, G, 4] tile of pairs, packed into
    the [T, 2 G] tile of little-endian words they make, in order."""
    a, b = tl.split(tl.reshape(v2, (T, G, 2, 2)))  # pairs 2m and 2m + 1
    wd = (a & 0xFF) | ((a >> 8) & 0xFF00) | ((b & 0xFF) << 16) | ((b << 8) & 0xFF000000)
    return tl.reshape(wd.to(tl.int32, bitcast=True), (T, 2 * G))


@triton.jit
def _store_pair_bytes(dst, v2, limit, T: tl.constexpr, G: tl.constexpr):
    """Store the low byte of each lane of a [T, G, 4] tile of pairs (thread
    t's 8 G bytes at byte 8 G t of dst, dst 16-byte aligned) in 16-byte
    granules (G a multiple of 2), those that start below ``limit`` (a
    multiple of 16)."""
    a, b = tl.split(tl.reshape(v2, (T, G, 2, 2)))  # pairs 2m and 2m + 1
    a0 = a.to(tl.uint8)
    a2 = (a >> 16).to(tl.uint8)
    b0 = b.to(tl.uint8)
    b2 = (b >> 16).to(tl.uint8)
    by = tl.reshape(tl.join(tl.join(a0, b0), tl.join(a2, b2)), (T, G // 2, 16))
    at = tl.arange(0, T)[:, None, None] * (8 * G) + tl.arange(0, G // 2)[None, :, None] * 16
    k = tl.arange(0, 16)[None, None, :]
    tl.store(dst + at + k, by, mask=at < limit)


@triton.jit
def _low_bit_index64(b):
    """The index of the one set bit of each int64 ``b`` (a power of two),
    from the exponent of its float value (exact: one bit); 0 gives -127."""
    f = b.to(tl.uint64, bitcast=True).to(tl.float32)
    return ((f.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def _store_escape(xw, tw, esc_dst, m, at, act, MAN_BITS: tl.constexpr, EMAX: tl.constexpr):
    """One trip of the escape stores: each thread whose ``act`` holds
    takes the lowest set bit j of its mask m and stores the exponent of its
    element j (x read again at xw + j; xw - tw is the chunk's first
    element) at esc byte ``at``."""
    b = m & (0 - m)
    if m.dtype == tl.int64:
        j = _low_bit_index64(b)
    else:
        j = low_bit_index(b)
    # Unmasked: a thread without a k-th escape reads the chunk's first
    # element (xw + j - tw), which exists.
    w = tl.load(xw + tl.where(act, j, 0 - tw))
    v = w >> MAN_BITS
    if EMAX != 255:  # (else the byte's truncation drops the sign)
        v = v & EMAX
    tl.store(esc_dst + at, v.to(tl.uint8), mask=act)
    return m ^ b
