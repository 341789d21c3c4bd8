"""fixed3 (format v2) for any chunk, element by element: the cold path of
fixed3_encode.py and fixed3_decode.py.

The hot kernels code the chunks Gaussian data makes (no exact zero,
subnormal, infinity or NaN in the chunk, so no flagged zero) with the whole
chunk in registers. Every other chunk comes here: zeros of either sign
flagged and their sign+mantissa omitted, exponents 0 and EMAX, RAW chunks,
and tiles the hot path does not take. These functions are ``noinline``,
so their code is not on the hot kernels' path (triton_kernels/offline.py
counts them apart), and they take scalars only: each reads what it needs
again (the chunk from L1/L2: the input is read from memory once).

They walk the chunk in sub-blocks of ``SB`` elements (two a thread of the
program's ``T``), a flat tile, carrying the running kept and escape counts
from one sub-block to the next, so their registers stay below the hot
path's: a kernel's register allocation is that of its largest function, and
a wider sub-block would lower the hot path's occupancy for code that rarely
runs.
The bytes are format.py's, as every backend writes them.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._codec_common import (ERR_COUNTS, ERR_EXPONENT, ERR_PADDING, FIXED_ZERO_SHIFT, align16,
                            fixed3_layout, fixed_window, load_rows3, pads_nonzero, store_rows3,
                            zero_pad)
from ._lookback import chunk_offset, store_total



@triton.jit
def load_words(x_ptr, start, i, valid, ITEMSIZE: tl.constexpr):
    """Elements ``start + i`` as int32 words: 16-bit words zero-extended
    (-0.0 is 0x8000), 32-bit words as they are; 0 where not valid."""
    w = tl.load(x_ptr + start + i, mask=valid, other=0).to(tl.int32)
    if ITEMSIZE == 2:
        w = w & 0xFFFF
    return w


@triton.jit
def _codes_at(x_ptr, start, i, n, lo, width, zp, zn, ITEMSIZE: tl.constexpr,
              EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr):
    """Elements ``start + i`` (below n): whether each is, its word (load_words),
    exponent field and code (codes_of)."""
    valid = i < n
    w = load_words(x_ptr, start, i, valid, ITEMSIZE)
    e = (w >> MAN_BITS) & ((1 << EXP_BITS) - 1)
    return valid, w, e, codes_of(w, e, valid, lo, width, zp, zn, MAN_BITS + EXP_BITS)


@triton.jit
def codes_of(w, e, valid, lo, width, zp, zn, SIGN_SHIFT: tl.constexpr):
    """The fixed3 code of each element (format.py, "fixed3"): d + z in the
    window (d = e - lo < width), ESC (width + z = 7) outside it, 0 (+0.0)
    and zp (-0.0) for a zero of a flagged sign; 0 past n."""
    z = zp + zn
    code = tl.minimum((e - lo).to(tl.uint32), width.to(tl.uint32)).to(tl.int32) + z
    zero = (w & ((1 << SIGN_SHIFT) - 1)) == 0
    neg = ((w >> SIGN_SHIFT) & 1) != 0
    code = tl.where(zero & ~neg & (zp != 0), 0, code)
    code = tl.where(zero & neg & (zn != 0), zp, code)
    return tl.where(valid, code, 0)


@triton.jit
def place_chunk(out_ptr, status_ptr, total_ptr, c, n, nch, table_off, offsets_off, body_off,
                low16, zp, zn, base, phase, nz, n_esc, ITEMSIZE: tl.constexpr,
                IS_FP16: tl.constexpr):
    """A chunk's place in the payload once its fields are known: RAW or
    CODED (coded only when the padded segment is smaller than the padded
    raw bytes), its offset by the decoupled look-back (which publishes its
    size), ``offsets[c]``, its table entry (zero for RAW), and for the last
    chunk the body length, the header and the zero gap after the offsets.
    Returns the segment's address (16-byte aligned), whether it is coded,
    and the layout of a coded one (fixed3_layout)."""
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg_c = fixed3_layout(
        n, True, low16, nz, n_esc, ITEMSIZE, IS_FP16)
    raw_seg = align16(n * ITEMSIZE)
    coded = seg_c < raw_seg
    units = tl.where(coded, seg_c, raw_seg) >> 4
    off = chunk_offset(status_ptr, c, units)
    tl.store(out_ptr.to(tl.pointer_type(tl.int32)) + (offsets_off >> 2) + c, off.to(tl.int32))
    if c == nch - 1:
        store_total(total_ptr, out_ptr, off + units)  # and the header
        gap = offsets_off + 4 * nch
        zero_pad(out_ptr, gap, align16(gap))
    ci = coded.to(tl.int32)
    flags = low16 | (zp << 1) | (zn << 2)
    ent = out_ptr.to(tl.pointer_type(tl.int32)) + (table_off >> 2) + 4 * c.to(tl.int64)
    tl.store(ent, ci * (1 | (flags << 8) | (base << 16) | (phase << 24)))
    tl.store(ent + 1, ci * (nz | (n_esc << 16)))
    tl.store(ent + 2, 0)
    tl.store(ent + 3, 0)
    return (out_ptr + body_off + 16 * off, coded, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem,
            a_esc)


@triton.jit(noinline=True)
def encode_chunk_general(x_ptr, out_ptr, status_ptr, total_ptr, c, start, n, nch, table_off,
                         offsets_off, body_off, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                         MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr):
    """Encode chunk c (``n`` elements from ``start``) completely: its fields
    from three walks over it (statistics; escapes; the writes, after its
    place is known), its place (place_chunk), its segment."""
    SB: tl.constexpr = CP if CP < 2 * T else 2 * T
    NSB: tl.constexpr = CP // SB
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    SIGN_SHIFT: tl.constexpr = MAN_BITS + EXP_BITS
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    SIGNW: tl.constexpr = -(1 << 31) if ITEMSIZE == 4 else (1 << 15)  # -0.0's word
    k = tl.arange(0, SB)

    # --- the locator, the zero counts, LOW16 ---
    s_sum = tl.zeros([], tl.int32)
    k_norm = tl.zeros([], tl.int32)
    npos = tl.zeros([], tl.int32)
    nneg = tl.zeros([], tl.int32)
    low_or = tl.zeros([], tl.int32)
    for b in range(NSB):
        if b * SB < n:
            i = k + b * SB
            valid = i < n
            w = load_words(x_ptr, start, i, valid, ITEMSIZE)
            e = (w >> MAN_BITS) & EMAX
            normal = valid & (e > 0) & (e < EMAX)
            s_sum += tl.sum(tl.where(normal, e, 0), axis=0)
            k_norm += tl.sum(normal.to(tl.int32), axis=0)
            npos += tl.sum((valid & (w == 0)).to(tl.int32), axis=0)
            nneg += tl.sum((valid & (w == SIGNW)).to(tl.int32), axis=0)
            low_or = low_or | tl.max(w & 0xFFFF, axis=0)
    qq = tl.where(k_norm > 0, (4 * s_sum) // tl.maximum(k_norm, 1), 0)
    base = qq >> 2
    phase = qq & 3
    zp = ((npos << FIXED_ZERO_SHIFT) >= n).to(tl.int32)
    zn = ((nneg << FIXED_ZERO_SHIFT) >= n).to(tl.int32)
    low16 = tl.zeros([], tl.int32)
    if ITEMSIZE == 4:
        low16 = (low_or == 0).to(tl.int32)
    nz = zp * npos + zn * nneg
    z = zp + zn
    lo, width = fixed_window(base, phase, z, EMAX)

    # --- escapes ---
    n_esc = tl.zeros([], tl.int32)
    for b in range(NSB):
        if b * SB < n:
            i = k + b * SB
            valid, w, e, code = _codes_at(x_ptr, start, i, n, lo, width, zp, zn, ITEMSIZE,
                                          EXP_BITS, MAN_BITS)
            n_esc += tl.sum((code == 7).to(tl.int32), axis=0)

    dst, coded, codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc = place_chunk(
        out_ptr, status_ptr, total_ptr, c, n, nch, table_off, offsets_off, body_off, low16, zp,
        zn, base, phase, nz, n_esc, ITEMSIZE, IS_FP16)
    if coded:
        _write_coded(x_ptr, start, n, dst, lo, width, zp, zn, low16, codes_nb, sm_nb, a_sm, a_rem,
                     a_esc, esc_nb, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
    else:
        for b in range(NSB):
            i = k + b * SB
            valid = i < n
            w = tl.load(x_ptr + start + i, mask=valid, other=0)
            tl.store(dst.to(x_ptr.dtype) + i, w, mask=valid)
        nb = n * ITEMSIZE
        zero_pad(dst, nb, align16(nb))


@triton.jit
def _write_coded(x_ptr, start, n, dst, lo, width, zp, zn, low16, codes_nb, sm_nb, a_sm, a_rem,
                 a_esc, esc_nb, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                 MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr):
    """A coded chunk's segment: codes in rows of 8 (3 bytes a row), each
    kept element's sm at its rank among the kept (smb bytes), fp16's rem
    bits at 3 x that rank (OR-ed into the zeroed stream), each escape's
    exponent byte at its rank among the escapes; every padding byte zero."""
    SB: tl.constexpr = CP if CP < 2 * T else 2 * T
    NSB: tl.constexpr = CP // SB
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    SIGN_SHIFT: tl.constexpr = MAN_BITS + EXP_BITS
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    RB: tl.constexpr = SB // 8
    k = tl.arange(0, SB)
    q = tl.arange(0, 8)[None, :]
    z = zp + zn
    sm_dst = dst + a_sm
    esc_dst = dst + a_esc
    rem_dst = dst + a_rem
    if IS_FP16:
        # The rem stream zeroed first (its bits are OR-ed in), every thread's
        # stores ordered before any atomic by the barrier.
        ZB: tl.constexpr = 3 * CP // 8 + 16  # at least the padded rem stream
        for b in range((ZB + SB - 1) // SB):
            j = k + b * SB
            tl.store(rem_dst + j, tl.zeros([SB], tl.uint8), mask=j < a_esc - a_rem)
        tl.debug_barrier()
    smb = 1
    if ITEMSIZE == 4:
        smb = 3 - 2 * low16
    kept_before = tl.zeros([], tl.int32)
    esc_before = tl.zeros([], tl.int32)
    for b in range(NSB):
        if b * SB < n:
            i = k + b * SB
            valid, w, e, code = _codes_at(x_ptr, start, i, n, lo, width, zp, zn, ITEMSIZE,
                                          EXP_BITS, MAN_BITS)
            acc = tl.sum(tl.reshape(code, (RB, 8)) << (3 * q), axis=1)
            store_rows3(dst, acc, tl.arange(0, RB) + b * RB, codes_nb)
            kept = (valid & (code >= z)).to(tl.int32)
            krank = kept_before + tl.cumsum(kept, axis=0) - kept
            sm = ((w >> EXP_BITS) & (1 << MAN_BITS)) | (w & ((1 << MAN_BITS) - 1))
            if ITEMSIZE == 4:
                sm = sm >> (16 * low16)
            for j in tl.static_range(3 if ITEMSIZE == 4 else 1):
                live = kept != 0
                if j > 0:
                    live = live & (j < smb)
                tl.store(sm_dst + smb * krank + j, ((sm >> (8 * j)) & 0xFF).to(tl.uint8),
                         mask=live)
            if IS_FP16:
                r3 = (sm >> 8) & 7
                bit = 3 * krank
                sh = bit & 31
                at = bit >> 5
                words = rem_dst.to(tl.pointer_type(tl.int32))
                tl.atomic_or(words + at, r3 << sh, mask=(kept != 0) & (r3 != 0))
                hi = r3 >> ((32 - sh) & 31)  # the bits past the word, when sh > 29
                tl.atomic_or(words + at + 1, hi, mask=(kept != 0) & (sh > 29) & (hi != 0))
            esc = (code == 7).to(tl.int32)
            erank = esc_before + tl.cumsum(esc, axis=0) - esc
            tl.store(esc_dst + erank, e.to(tl.uint8), mask=esc != 0)
            kept_before += tl.sum(kept, axis=0)
            esc_before += tl.sum(esc, axis=0)
    zero_pad(dst, codes_nb, a_sm)
    zero_pad(sm_dst, sm_nb, a_rem - a_sm)
    zero_pad(esc_dst, esc_nb, align16(esc_nb))


@triton.jit(noinline=True)
def decode_chunk_general(src, dst, n, lim, flags, base, phase, nz, nesc,
                         ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr,
                         CP: tl.constexpr, T: tl.constexpr):
    """Decode a CODED chunk whose entry and offsets are checked (its segment
    at ``src``, ``lim`` body bytes from there; every load is masked to its
    sub-stream and to the body): each element from its code, its sm at its
    rank among the kept, fp16's rem bits at 3 x that rank, an escape's
    exponent at its rank among the escapes. Returns the error bits: decoded
    escape and zero counts against the entry, escapes naming no exponent of
    the dtype, padding bytes not zero."""
    SB: tl.constexpr = CP if CP < 2 * T else 2 * T
    NSB: tl.constexpr = CP // SB
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    SIGN_SHIFT: tl.constexpr = MAN_BITS + EXP_BITS
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    SIGNW: tl.constexpr = -(1 << 31) if ITEMSIZE == 4 else (1 << 15)  # -0.0's word
    RB: tl.constexpr = SB // 8
    k = tl.arange(0, SB)
    q = tl.arange(0, 8)[None, :]
    low16 = flags & 1
    zp = (flags >> 1) & 1
    zn = (flags >> 2) & 1
    z = zp + zn
    cneg = zp  # -0.0's code when ZNEG is set (+0.0, when flagged, is 0)
    lo, width = fixed_window(base, phase, z, EMAX)
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = fixed3_layout(
        n, True, low16, nz, nesc, ITEMSIZE, IS_FP16)
    lim = tl.minimum(tl.maximum(lim, 0), 1 << 30).to(tl.int32)
    codes_l = tl.minimum(codes_nb, lim)
    sm_l = tl.minimum(sm_nb, lim - a_sm)
    rem_l = tl.minimum(rem_nb, lim - a_rem)
    esc_l = tl.minimum(esc_nb, lim - a_esc)
    smb = 1
    if ITEMSIZE == 4:
        smb = 3 - 2 * low16
    kept_before = tl.zeros([], tl.int32)
    esc_before = tl.zeros([], tl.int32)
    bad_e = tl.zeros([], tl.int32)
    for b in range(NSB):
        if b * SB < n:
            i = k + b * SB
            valid = i < n
            acc = load_rows3(src, tl.arange(0, RB) + b * RB, codes_l)
            code = tl.reshape((acc[:, None] >> (3 * q)) & 7, (SB,))
            zero = valid & (code < z)
            kept = (valid & (code >= z)).to(tl.int32)
            esc = (valid & (code == 7)).to(tl.int32)
            krank = kept_before + tl.cumsum(kept, axis=0) - kept
            erank = esc_before + tl.cumsum(esc, axis=0) - esc
            eb = tl.load(src + a_esc + erank, mask=(esc != 0) & (erank < esc_l),
                         other=0).to(tl.int32)
            bad_e = bad_e | tl.max(tl.where(esc != 0, eb, 0), axis=0)
            e = tl.where(esc != 0, eb, lo + code - z) & EMAX
            sm = tl.zeros([SB], tl.int32)
            for j in tl.static_range(3 if ITEMSIZE == 4 else 1):
                at = smb * krank + j
                live = (kept != 0) & (at < sm_l)
                if j > 0:
                    live = live & (j < smb)
                sm = sm | (tl.load(src + a_sm + at, mask=live, other=0).to(tl.int32) << (8 * j))
            if ITEMSIZE == 4:
                sm = sm << (16 * low16)
            if IS_FP16:
                bit = 3 * krank
                at = bit >> 3
                two = tl.load(src + a_rem + at, mask=(kept != 0) & (at < rem_l),
                              other=0).to(tl.int32) | (
                    tl.load(src + a_rem + at + 1, mask=(kept != 0) & (at + 1 < rem_l),
                            other=0).to(tl.int32) << 8)
                sm = sm | (((two >> (bit & 7)) & 7) << 8)
            word = (((sm >> MAN_BITS) & 1) << SIGN_SHIFT) | (e << MAN_BITS) | (
                sm & ((1 << MAN_BITS) - 1))
            word = tl.where(zero, tl.where(code == cneg, SIGNW, 0), word)
            tl.store(dst + i, word.to(dst.dtype.element_ty), mask=valid)
            kept_before += tl.sum(kept, axis=0)
            esc_before += tl.sum(esc, axis=0)
    err = tl.where((esc_before != nesc) | (n - kept_before != nz), ERR_COUNTS, 0)
    err = err | tl.where(bad_e > EMAX, ERR_EXPONENT, 0)
    padbad = pads_nonzero(src, codes_nb, a_sm, a_sm + sm_nb, a_rem, a_rem + rem_nb, a_esc,
                          a_esc + esc_nb, seg, lim)
    return err | tl.where(padbad, ERR_PADDING, 0)
