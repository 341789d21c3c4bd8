"""fixed3 (format v3) for any chunk, element by element: the cold path of
fixed3_encode.py and fixed3_decode.py.

The hot kernels code the chunks Gaussian data makes (too few exponent
fields 0 for a zero sign to be flagged) with the whole chunk in registers,
and their zero paths the chunks with zeros to flag (but fp16's in
encode). Every other chunk comes here: fp16's zeros to flag in encode,
tiles of more than 64 elements a thread, RAW chunks, and fp32 LOWBYTE
chunks (a row's bitmap byte at its row index, the nonzero low bytes
ranked like the escapes).
These functions are ``noinline``, so their code is not on the hot
kernels' path (tools/offline.py counts them apart), and they take scalars
only: each reads what it needs again (the chunk from L1/L2: the input is
read from memory once).

They walk the chunk's thread-major tile (thread t holds the E = CP / T
consecutive elements from E t, as in the hot kernels) one row of 8
elements a thread at a time, so their registers stay below the hot path's
(a kernel's register allocation is that of its largest function, and a
whole chunk in registers would lower the hot path's occupancy for code
that rarely runs). What crosses threads is once a chunk: the statistics'
sums, and one scan of each thread's kept and escaped counts, from which a
thread carries its ranks from row to row. The bytes are format.py's, as
every backend writes them.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._codec_common import (ERR_COUNTS, ERR_EXPONENT, ERR_PADDING, align16,
                            bitmap_row, fixed3_layout, fixed_window, fixed_zero_flags,
                            load_rows3, lowbyte_wins,
                            pad_nonzero, pads_nonzero, popc32, row_mask, store_rows3, zero_pad)
from ._lookback import chunk_offset, place_zero_chunk


@triton.jit
def _load_elements(x_ptr, start, i, valid, ITEMSIZE: tl.constexpr):
    """Elements ``start + i`` as int32 words: 16-bit words zero-extended
    (-0.0 is 0x8000), 32-bit words as they are; 0 where not valid."""
    w = tl.load(x_ptr + start + i, mask=valid, other=0).to(tl.int32)
    if ITEMSIZE == 2:
        w = w & 0xFFFF
    return w


@triton.jit
def _row(x_ptr, start, n, g, G: tl.constexpr, T: tl.constexpr, ITEMSIZE: tl.constexpr,
         EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr):
    """Row g of each thread ([T, 8]: elements 8 G t + 8 g + q): the element
    indices, whether each is below n, its word (_load_elements) and exponent."""
    i = tl.arange(0, T)[:, None] * (8 * G) + (tl.arange(0, 8)[None, :] + 8 * g)
    valid = i < n
    w = _load_elements(x_ptr, start, i, valid, ITEMSIZE)
    return i, valid, w, (w >> MAN_BITS) & ((1 << EXP_BITS) - 1)


@triton.jit
def _row_codes(w, e, n, g, lo, width, zp, zn, SIGN_SHIFT: tl.constexpr, G: tl.constexpr,
               T: tl.constexpr):
    """Row g of each thread (its words and exponents) as its code word
    (eight 3-bit codes, 0 past n) and its kept and escape flags
    (_row_flags)."""
    code = codes_of(w, e, lo, width, zp, zn, SIGN_SHIFT)
    r = tl.arange(0, T) * G + g
    acc = tl.sum(code << (3 * tl.arange(0, 8)[None, :]), axis=1) & row_mask(n, r)
    kf, ef = _row_flags(acc, zp + zn, n, r)
    return acc, kf, ef


@triton.jit
def _row_flags(acc, z, n, r):
    """Rows of eight 3-bit codes (24-bit words, row r of the chunk): a bit
    at 3 q for each element q below n that is kept (code z or more: not a
    flagged zero) and for each that escapes (code 7)."""
    inside = row_mask(n, r) & 0x249249
    esc = acc & (acc >> 1) & (acc >> 2) & inside
    one = acc | (acc >> 1)
    kept = tl.where(z == 0, 0x249249, tl.where(z == 1, one | (acc >> 2), (acc >> 1) | (acc >> 2)))
    return kept & inside, esc


@triton.jit
def _excl3(f):
    """Flags a bit at 3 q (q < 8) -> the count of flags before each field
    (field q of the word: (f << 3) times 0x249249 adds the flags of fields
    0 .. q - 1 into field q, at most 7: no carry) and the row's count."""
    pre = (f << 3) * 0x249249
    return pre, ((pre >> 21) & 7) + ((f >> 21) & 1)


@triton.jit
def codes_of(w, e, lo, width, zp, zn, SIGN_SHIFT: tl.constexpr):
    """The fixed3 code of each element (format.py, "fixed3"): d + z in the
    window (d = e - lo < width), ESC (width + z = 7) outside it, 0 (+0.0)
    and zp (-0.0) for a zero of a flagged sign."""
    z = zp + zn
    code = tl.minimum((e - lo).to(tl.uint32), width.to(tl.uint32)).to(tl.int32) + z
    # A zero (every bit but the sign clear) has exponent 0: the code c0
    # unless its sign is flagged; so the code of +0.0 and of -0.0 is a
    # scalar each, picked by the sign bit.
    c0 = tl.minimum((0 - lo).to(tl.uint32), width.to(tl.uint32)).to(tl.int32) + z
    cpos = tl.where(zp != 0, 0, c0)
    cneg = tl.where(zn != 0, zp, c0)
    zc = (((w >> SIGN_SHIFT) & 1) * (cneg ^ cpos)) ^ cpos
    return tl.where((w & ((1 << SIGN_SHIFT) - 1)) == 0, zc, code)


@triton.jit
def is_coded(n, low16, lowbyte, nz, n_esc, n_low, ITEMSIZE: tl.constexpr, IS_FP16: tl.constexpr):
    """Whether a chunk with these fields is stored CODED: its padded segment
    smaller than its padded raw bytes (format.py)."""
    return fixed3_layout(n, True, low16, lowbyte, nz, n_esc, n_low, ITEMSIZE,
                         IS_FP16)[7] < align16(n * ITEMSIZE)


@triton.jit
def place_chunk(out_ptr, status_ptr, c, n, table_off, offsets_off, body_off,
                low16, lowbyte, zp, zn, base, phase, nz, n_esc, n_low, ITEMSIZE: tl.constexpr,
                IS_FP16: tl.constexpr):
    """A chunk's place in the payload once its fields are known: RAW or
    CODED (coded only when the padded segment is smaller than the padded
    raw bytes), its offset by the decoupled look-back (which publishes its
    size), ``offsets[c]`` and its table entry (zero for RAW). Returns the
    segment's address (16-byte aligned), whether it is coded, the layout of
    a coded one (fixed3_layout), and where the segment ends (16-byte units
    from the body's start: for the last chunk the body length, which the
    kernel's ``finish_payload`` stores after the chunk's writes)."""
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg_c = fixed3_layout(
        n, True, low16, lowbyte, nz, n_esc, n_low, ITEMSIZE, IS_FP16)
    raw_seg = align16(n * ITEMSIZE)
    coded = seg_c < raw_seg
    units = tl.where(coded, seg_c, raw_seg) >> 4
    off = chunk_offset(status_ptr, c, units)
    tl.store(out_ptr.to(tl.pointer_type(tl.int32)) + (offsets_off >> 2) + c, off.to(tl.int32))
    ci = coded.to(tl.int32)
    flags = low16 | (zp << 1) | (zn << 2) | (lowbyte << 3)
    ent = out_ptr.to(tl.pointer_type(tl.int32)) + (table_off >> 2) + 4 * c.to(tl.int64)
    tl.store(ent, ci * (1 | (flags << 8) | (base << 16) | (phase << 24)))
    tl.store(ent + 1, ci * (nz | (n_esc << 16)))
    tl.store(ent + 2, 0)
    tl.store(ent + 3, 0)
    return (out_ptr + body_off + 16 * off, coded, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem,
            a_esc, off + units)


@triton.jit(noinline=True)
def encode_chunk_general(x_ptr, out_ptr, status_ptr, c, start, n, table_off,
                         offsets_off, body_off, known, base, phase, zeros, low16,
                         ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                         CP: tl.constexpr, T: tl.constexpr):  # offline: zero path
    """_encode_general for any chunk the hot path leaves, where the kernel
    has no zero path (fp16: this is its zero path)."""
    return _encode_general(x_ptr, out_ptr, status_ptr, c, start, n, table_off, offsets_off,
                           body_off, known, base, phase, zeros, low16, ITEMSIZE, EXP_BITS,
                           MAN_BITS, CP, T)


@triton.jit(noinline=True)
def encode_cold_chunk_general(x_ptr, out_ptr, status_ptr, c, start, n, table_off,
                              offsets_off, body_off, known, base, phase, zeros, low16,
                              ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                              MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr):
    """_encode_general for a chunk that neither the hot path nor a zero path
    of fixed3_encode.py takes (ZERO, RAW, LOWBYTE, exponents 0 that are not
    zeros to flag; cold code)."""
    return _encode_general(x_ptr, out_ptr, status_ptr, c, start, n, table_off, offsets_off,
                           body_off, known, base, phase, zeros, low16, ITEMSIZE, EXP_BITS,
                           MAN_BITS, CP, T)


@triton.jit
def _encode_general(x_ptr, out_ptr, status_ptr, c, start, n, table_off, offsets_off, body_off,
                    known, base, phase, zeros, low16, ITEMSIZE: tl.constexpr,
                    EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr, CP: tl.constexpr,
                    T: tl.constexpr):
    """Encode chunk c (``n`` elements from ``start``) completely: its fields
    (the locator, the +0.0 and -0.0 counts (low and high 16 bits of
    ``zeros``) and LOW16 given when ``known``, else chunk_statistics'),
    each thread's kept and escaped counts and (fp32) its elements whose low
    byte is not zero, whence LOWBYTE (a walk), its place (place_chunk), its
    segment (a walk)."""
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    if known == 0:
        stats = chunk_statistics(x_ptr, start, n, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
        base = (stats & 0xFF).to(tl.int32)
        phase = ((stats >> 8) & 3).to(tl.int32)
        low16 = ((stats >> 10) & 1).to(tl.int32)
        zeros = (stats >> 32).to(tl.int32)
    npos = zeros & 0xFFFF
    nneg = (zeros >> 16) & 0xFFFF
    zp, zn = fixed_zero_flags(zeros, n)
    nz = zp * npos + zn * nneg
    z = zp + zn
    lo, width = fixed_window(base, phase, z, EMAX)

    end = tl.zeros([], tl.int64)
    if npos == n:  # every element +0.0: a ZERO chunk, no segment (format.py)
        end = place_zero_chunk(out_ptr, status_ptr, c, table_off, offsets_off)
    else:
        # --- each thread's kept, escaped and (fp32) nonzero low byte counts;
        # their exclusive scans ---
        ke_t = tl.zeros([T], tl.int32)  # kept, escaped << 16
        lb_t = tl.zeros([T], tl.int32)  # elements whose low byte is not zero
        for g in range(G):  # offline: chunk rows
            i, valid, w, e = _row(x_ptr, start, n, g, G, T, ITEMSIZE, EXP_BITS, MAN_BITS)
            acc, kf, ef = _row_codes(w, e, n, g, lo, width, zp, zn, MAN_BITS + EXP_BITS, G, T)
            ke_t += _excl3(kf)[1] | (_excl3(ef)[1] << 16)
            if ITEMSIZE == 4:
                lb_t += tl.sum(((w & 0xFF) != 0).to(tl.int32), axis=1)
        before = tl.cumsum(ke_t, axis=0) - ke_t
        n_esc = (tl.sum(ke_t, axis=0) >> 16) & 0xFFFF
        lb_before = tl.cumsum(lb_t, axis=0) - lb_t
        n_low = tl.sum(lb_t, axis=0)
        lowbyte = tl.zeros([], tl.int32)
        if ITEMSIZE == 4:
            lowbyte = ((low16 == 0) & lowbyte_wins(n, n - nz, n_low)).to(tl.int32)
        n_low = n_low * lowbyte

        dst, coded, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, end = place_chunk(
            out_ptr, status_ptr, c, n, table_off, offsets_off, body_off, low16, lowbyte, zp, zn,
            base, phase, nz, n_esc, n_low, ITEMSIZE, IS_FP16)
        if coded:
            _write_coded(x_ptr, start, n, dst, lo, width, zp, zn, low16, lowbyte, before,
                         lb_before, n_low, codes_nb, sm_nb, a_sm, a_rem, a_esc, esc_nb, ITEMSIZE,
                         EXP_BITS, MAN_BITS, CP, T)
        else:
            for g in range(G):  # offline: chunk rows
                i = tl.arange(0, T)[:, None] * (8 * G) + (tl.arange(0, 8)[None, :] + 8 * g)
                w = tl.load(x_ptr + start + i, mask=i < n, other=0)
                tl.store(dst.to(x_ptr.dtype) + i, w, mask=i < n)
            nb = n * ITEMSIZE
            zero_pad(dst, nb, align16(nb))
    return end


@triton.jit(noinline=True)
def chunk_statistics(x_ptr, start, n, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                     MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr):
    """A chunk's fields for a tile the hot path does not take, in a walk:
    base (bits 0..7), phase (8, 9), LOW16 (10), the +0.0 and -0.0 counts
    (32..47, 48..63), as one int64 (sums a thread, then one reduction)."""
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    SIGNW: tl.constexpr = -(1 << 31) if ITEMSIZE == 4 else (1 << 15)  # -0.0's word
    s_t = tl.zeros([T], tl.int32)
    k_t = tl.zeros([T], tl.int32)
    zeros_t = tl.zeros([T], tl.int32)  # +0.0 count, -0.0 count << 16
    low_t = tl.zeros([T], tl.int32)
    for g in range(G):  # offline: chunk rows
        i, valid, w, e = _row(x_ptr, start, n, g, G, T, ITEMSIZE, EXP_BITS, MAN_BITS)
        normal = valid & (e > 0) & (e < EMAX)
        s_t += tl.sum(tl.where(normal, e, 0), axis=1)
        k_t += tl.sum(normal.to(tl.int32), axis=1)
        zeros_t += tl.sum((valid & (w == 0)).to(tl.int32) | (
            (valid & (w == SIGNW)).to(tl.int32) << 16), axis=1)
        low_t = low_t | tl.max(w & 0xFFFF, axis=1)
    st = tl.sum(s_t.to(tl.int64) | (k_t.to(tl.int64) << 32), axis=0)
    zt = tl.sum(zeros_t.to(tl.int64) | ((low_t != 0).to(tl.int64) << 32), axis=0)
    s_sum = (st & 0xFFFFFFFF).to(tl.int32)
    k_norm = (st >> 32).to(tl.int32)
    qq = tl.where(k_norm > 0, (4 * s_sum) // tl.maximum(k_norm, 1), 0)
    low16 = tl.zeros([], tl.int64)
    if ITEMSIZE == 4:
        low16 = ((zt >> 32) == 0).to(tl.int64)
    return (qq >> 2).to(tl.int64) | ((qq & 3).to(tl.int64) << 8) | (low16 << 10) | (
        (zt & 0xFFFFFFFF) << 32)


@triton.jit
def _write_coded(x_ptr, start, n, dst, lo, width, zp, zn, low16, lowbyte, before, lb_before,
                 n_low, codes_nb, sm_nb, a_sm, a_rem, a_esc, esc_nb, ITEMSIZE: tl.constexpr,
                 EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr, CP: tl.constexpr,
                 T: tl.constexpr):
    """A coded chunk's segment: codes in rows of 8 (3 bytes a row), each
    kept element's sm at its rank among the kept (smb bytes), fp16's rem
    bits at 3 x that rank (a row's run OR-ed into the zeroed stream), each
    escape's exponent byte at its rank among the escapes; with LOWBYTE, a
    row's bitmap byte at its row index and each nonzero low byte at its rank
    among them (like an escape); every padding byte zero. ``before``: each
    thread's kept (low 16 bits) and escaped (high) elements before it;
    ``lb_before``: its nonzero low bytes before it."""
    G: tl.constexpr = CP // (8 * T)
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    q = tl.arange(0, 8)[None, :]
    sm_dst = dst + a_sm
    esc_dst = dst + a_esc
    rem_dst = dst + a_rem
    if IS_FP16:
        # The rem stream zeroed first (its bits are OR-ed in), every thread's
        # stores ordered before any atomic by the barrier.
        RB: tl.constexpr = 16 * T
        for b in range((3 * CP // 8 + 16 + RB - 1) // RB):  # at least the padded stream
            j = tl.arange(0, RB) + b * RB
            tl.store(rem_dst + j, tl.zeros([RB], tl.uint8), mask=j < a_esc - a_rem)
        tl.debug_barrier()
    smb = 1
    if ITEMSIZE == 4:
        smb = 3 - 2 * low16 - lowbyte
    kr = before & 0xFFFF  # the thread's next kept rank
    er = (before >> 16) & 0xFFFF  # and escape rank
    lr = lb_before  # and nonzero low byte rank (LOWBYTE)
    low_dst = dst + a_esc + align16(esc_nb)
    for g in range(G):  # offline: chunk rows
        i, valid, w, e = _row(x_ptr, start, n, g, G, T, ITEMSIZE, EXP_BITS, MAN_BITS)
        acc, kf, ef = _row_codes(w, e, n, g, lo, width, zp, zn, MAN_BITS + EXP_BITS, G, T)
        store_rows3(dst, acc, tl.arange(0, T) * G + g, codes_nb)
        kpre, kc = _excl3(kf)
        epre, ec = _excl3(ef)
        kept = (kf[:, None] >> (3 * q)) & 1
        kin = (kpre[:, None] >> (3 * q)) & 7  # kept before the element, in the row
        krank = kr[:, None] + kin
        sm = ((w >> EXP_BITS) & (1 << MAN_BITS)) | (w & ((1 << MAN_BITS) - 1))
        if ITEMSIZE == 4:
            sm = sm >> (16 * low16 + 8 * lowbyte)
            if lowbyte != 0:
                lb = (valid & ((w & 0xFF) != 0)).to(tl.int32)
                r = tl.arange(0, T) * G + g
                tl.store(rem_dst + r, tl.sum(lb << q, axis=1).to(tl.uint8), mask=8 * r < n)
                lpre, lc = _excl3(tl.sum(lb << (3 * q), axis=1))
                tl.store(low_dst + lr[:, None] + ((lpre[:, None] >> (3 * q)) & 7),
                         (w & 0xFF).to(tl.uint8), mask=lb != 0)
                lr += lc
        for j in tl.static_range(3 if ITEMSIZE == 4 else 1):
            # (bytes 1 and 2 only without LOW16; as a product: a scalar
            # condition combined into a tile's mask is not a mask to every
            # triton's interpreter)
            live = (kept * (smb > j).to(tl.int32)) != 0
            tl.store(sm_dst + smb * krank + j, ((sm >> (8 * j)) & 0xFF).to(tl.uint8), mask=live)
        if IS_FP16:
            # The row's kept rem values, 3 bits each from bit 3 kr: at most
            # 24 bits, so two 32-bit words (atomics: a word may be shared
            # with the thread's previous row and the neighbouring threads).
            run = tl.sum(((sm >> 8) & 7) * kept << (3 * kin), axis=1).to(tl.int64)
            bit = 3 * kr
            two = run << (bit & 31)
            words = rem_dst.to(tl.pointer_type(tl.int32))
            lo_w = (two & 0xFFFFFFFF).to(tl.int32)
            hi_w = (two >> 32).to(tl.int32)
            tl.atomic_or(words + (bit >> 5), lo_w, mask=lo_w != 0)
            tl.atomic_or(words + (bit >> 5) + 1, hi_w, mask=hi_w != 0)
        tl.store(esc_dst + er[:, None] + ((epre[:, None] >> (3 * q)) & 7), e.to(tl.uint8),
                 mask=((ef[:, None] >> (3 * q)) & 1) != 0)
        kr += kc
        er += ec
    zero_pad(dst, codes_nb, a_sm)
    zero_pad(sm_dst, sm_nb, a_rem - a_sm)
    zero_pad(esc_dst, esc_nb, align16(esc_nb))
    if ITEMSIZE == 4:
        if lowbyte != 0:
            zero_pad(rem_dst, (n + 7) >> 3, a_esc - a_rem)
            zero_pad(low_dst, n_low, align16(n_low))


@triton.jit(noinline=True)
def decode_chunk_general(src, dst, n, lim, flags, base, phase, nz, nesc, n_low,
                         ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                         CP: tl.constexpr, T: tl.constexpr):
    """_decode_general for a chunk without zeros to flag (LOWBYTE, or a tile
    wider than the hot path's; cold code)."""
    return _decode_general(src, dst, n, lim, flags, base, phase, nz, nesc, n_low, ITEMSIZE,
                           EXP_BITS, MAN_BITS, CP, T)


@triton.jit(noinline=True)
def decode_zero_chunk_general(src, dst, n, lim, flags, base, phase, nz, nesc, n_low,
                              ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                              MAN_BITS: tl.constexpr, CP: tl.constexpr,
                              T: tl.constexpr):  # offline: zero path
    """_decode_general for a chunk with flagged zeros that no zero path of
    fixed3_decode.py takes (a tile wider than theirs)."""
    return _decode_general(src, dst, n, lim, flags, base, phase, nz, nesc, n_low, ITEMSIZE,
                           EXP_BITS, MAN_BITS, CP, T)


@triton.jit
def _decode_general(src, dst, n, lim, flags, base, phase, nz, nesc, n_low,
                    ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                    CP: tl.constexpr, T: tl.constexpr):
    """Decode a CODED chunk whose entry and offsets are checked (its segment
    at ``src``, ``lim`` body bytes from there; every load is masked to its
    sub-stream and to the body), in two walks: each thread's kept and
    escaped counts (and with LOWBYTE its bitmap's set bits), then each
    element from its code, its sm at its rank among the kept, fp16's rem
    bits at 3 x that rank, an escape's exponent at its rank among the
    escapes, and with LOWBYTE the low byte at its rank among the set bits
    (``n_low`` of them, counted by the caller) ORed in. Returns the error
    bits: decoded escape and zero counts against the entry, escapes naming
    no exponent of the dtype, padding bytes not zero."""
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    SIGN_SHIFT: tl.constexpr = MAN_BITS + EXP_BITS
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    SIGNW: tl.constexpr = -(1 << 31) if ITEMSIZE == 4 else (1 << 15)  # -0.0's word
    q = tl.arange(0, 8)[None, :]
    t = tl.arange(0, T)
    low16 = flags & 1
    zp = (flags >> 1) & 1
    zn = (flags >> 2) & 1
    lowbyte = (flags >> 3) & 1
    z = zp + zn
    cneg = zp  # -0.0's code when ZNEG is set (+0.0, when flagged, is 0)
    lo, width = fixed_window(base, phase, z, EMAX)
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = fixed3_layout(
        n, True, low16, lowbyte, nz, nesc, n_low, ITEMSIZE, IS_FP16)
    lim = tl.minimum(tl.maximum(lim, 0), 1 << 30).to(tl.int32)
    codes_l = tl.minimum(codes_nb, lim)
    sm_l = tl.minimum(sm_nb, lim - a_sm)
    rem_l = tl.minimum(rem_nb, lim - a_rem)
    esc_l = tl.minimum(esc_nb, lim - a_esc)
    a_low = a_esc + align16(esc_nb)
    low_l = tl.minimum(n_low * lowbyte, lim - a_low)
    smb = 1
    if ITEMSIZE == 4:
        smb = 3 - 2 * low16 - lowbyte
    # --- each thread's kept and escaped counts, checked against the entry ---
    # (From the rows' code words: a flag a 3-bit field, counted by a
    # multiply; a scan along a row of the [T, 8] tile would cross lanes.)
    ke_t = tl.zeros([T], tl.int32)  # kept, escaped << 16
    lb_t = tl.zeros([T], tl.int32)  # set bitmap bits (LOWBYTE)
    for g in range(G):  # offline: chunk rows
        r = t * G + g
        kf, ef = _row_flags(load_rows3(src, r, codes_l), z, n, r)
        ke_t += _excl3(kf)[1] | (_excl3(ef)[1] << 16)
        if ITEMSIZE == 4:
            if lowbyte != 0:
                lb_t += popc32(bitmap_row(src + a_rem, r, n, rem_l))
    before = tl.cumsum(ke_t, axis=0) - ke_t
    tot = tl.sum(ke_t, axis=0)
    err = tl.where((((tot >> 16) & 0xFFFF) != nesc) | (n - (tot & 0xFFFF) != nz), ERR_COUNTS, 0)
    # --- the elements ---
    kr = before & 0xFFFF
    er = (before >> 16) & 0xFFFF
    lr = tl.cumsum(lb_t, axis=0) - lb_t
    bad_e = tl.zeros([T, 8], tl.int32)
    for g in range(G):  # offline: chunk rows
        r = t * G + g
        i = t[:, None] * (8 * G) + (q + 8 * g)
        valid = i < n
        acc = load_rows3(src, r, codes_l)
        code = (acc[:, None] >> (3 * q)) & 7
        kf, ef = _row_flags(acc, z, n, r)
        kpre, kc = _excl3(kf)
        epre, ec = _excl3(ef)
        kept = ((kf[:, None] >> (3 * q)) & 1) != 0
        esc = ((ef[:, None] >> (3 * q)) & 1) != 0
        zero = valid & ~kept
        krank = kr[:, None] + ((kpre[:, None] >> (3 * q)) & 7)
        erank = er[:, None] + ((epre[:, None] >> (3 * q)) & 7)
        eb = tl.load(src + a_esc + erank, mask=esc & (erank < esc_l), other=0).to(tl.int32)
        bad_e = bad_e | eb
        e = tl.where(esc, eb, lo + code - z) & EMAX
        sm = tl.zeros([T, 8], tl.int32)
        for j in tl.static_range(3 if ITEMSIZE == 4 else 1):
            at = smb * krank + j
            live = kept & (at < sm_l * (smb > j).to(tl.int32))  # (see _write_coded)
            sm = sm | (tl.load(src + a_sm + at, mask=live, other=0).to(tl.int32) << (8 * j))
        if ITEMSIZE == 4:
            sm = sm << (16 * low16 + 8 * lowbyte)
        if IS_FP16:
            bit = 3 * krank
            at = bit >> 3
            two = tl.load(src + a_rem + at, mask=kept & (at < rem_l), other=0).to(tl.int32) | (
                tl.load(src + a_rem + at + 1, mask=kept & (at + 1 < rem_l),
                        other=0).to(tl.int32) << 8)
            sm = sm | (((two >> (bit & 7)) & 7) << 8)
        word = (((sm >> MAN_BITS) & 1) << SIGN_SHIFT) | (e << MAN_BITS) | (
            sm & ((1 << MAN_BITS) - 1))
        word = tl.where(zero, tl.where(code == cneg, SIGNW, 0), word)
        if ITEMSIZE == 4:
            if lowbyte != 0:
                # The row's bitmap byte; a set bit ORs in the next low byte.
                bm = bitmap_row(src + a_rem, r, n, rem_l)
                has = ((bm[:, None] >> q) & 1) != 0
                lrank = lr[:, None] + popc32(bm[:, None] & ((1 << q) - 1))
                word = word | tl.load(src + a_low + lrank, mask=has & (lrank < low_l),
                                      other=0).to(tl.int32)
                lr += popc32(bm)
        tl.store(dst + i, word.to(dst.dtype.element_ty), mask=valid)
        kr += kc
        er += ec
    if EXP_BITS < 8:  # (an escape's byte may name no exponent)
        err = err | tl.where(tl.max(tl.max(bad_e, axis=1), axis=0) > EMAX, ERR_EXPONENT, 0)
    err = err | padding_error(src, codes_nb, a_sm, sm_nb, a_rem, rem_nb, a_esc, esc_nb, a_low,
                              lim)
    if ITEMSIZE == 4:
        if lowbyte != 0:
            err = err | tl.where(pad_nonzero(src, a_low + n_low, seg, lim), ERR_PADDING, 0)
    return err



@triton.jit
def padding_error(src, codes_nb, a_sm, sm_nb, a_rem, rem_nb, a_esc, esc_nb, seg, lim):
    """ERR_PADDING when a padding byte of a coded segment's first four
    sub-streams is not zero (bytes at or past ``lim`` not read); ``seg``:
    where esc's padding ends (the segment's end without LOWBYTE)."""
    padbad = pads_nonzero(src, codes_nb, a_sm, a_sm + sm_nb, a_rem, a_rem + rem_nb, a_esc,
                          a_esc + esc_nb, seg, lim)
    return tl.where(padbad, ERR_PADDING, 0)
