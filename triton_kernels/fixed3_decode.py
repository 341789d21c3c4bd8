"""fixed3 decode (format v2) of one chunk, called by codec_decode.decode_kernel
(one program per chunk, in the thread-major ``[T, G, 8]`` tile of
_codec_common.py).

The chunk reads its table entry and its offset, and the next chunk's offset
(or the body's length) to check its own segment's size, and nothing else
of other chunks: no scan. Then, with every load masked to the body:

- the entry is checked by the rules of ``format.validate_table``;
- codes: a thread's 3 G bytes as 32-bit words, unpacked in the thread;
- sm: element i's byte(s) at position i, loaded as 16-byte words, when no
  zero is omitted, else at its rank among the kept elements (byte loads);
  3 bytes an element for fp32 without LOW16;
- rem (fp16): 3 bits at bit 3 i (rows of 8, like the codes) or 3 rank;
- the words are stored with the window's exponent; then each thread patches
  its escaped elements, one per round over a 32-bit mask of them
  (``ROUNDS`` inline, a cold function for a chunk with a thread of more):
  the escape byte at the thread's exclusive escape count replaces the
  exponent of the word read back from the output (a volatile load, after
  this thread's store);
- the decoded escape and zero counts against the entry, escapes naming an
  exponent the dtype has, and every padding byte zero.

Error bits (``ERR_*`` of _codec_common.py) are returned to the caller, which
ORs them into the launch's error word.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._codec_common import (ROUNDS, ERR_COUNTS, ERR_EXPONENT, ERR_OFFSETS, ERR_PADDING, ERR_TABLE,
                            align16, fixed3_layout, fixed_window, load_rows3, load_words24,
                            load_words, low_bit_index, pad_nonzero, pads_nonzero, popc32,
                            ttile, unpack_bytes, esc_bits, store_rows,
                            kept_bits)
from .fixed3_encode import row_mask, thread_counts


@triton.jit
def load_u32(ptr, mask):
    """A little-endian u32 at any byte address (int64), 0 where not mask."""
    v = tl.zeros([], tl.int64)
    for b in tl.static_range(4):
        v = v | (tl.load(ptr + b, mask=mask, other=0).to(tl.int64) << (8 * b))
    return v


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
    SIGN: tl.constexpr = 1 << (MAN_BITS + EXP_BITS)

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
    bad = (mode > 1) | (phase > 3) | (base > EMAX) | ((flags & ~7) != 0)
    if ITEMSIZE != 4:
        bad = bad | ((flags & 1) != 0)
    bad = bad | (nz > n) | (nesc > n) | (opens != 0) | (((flags & 6) == 0) & (nz != 0))
    coded = mode == 1
    bad = bad | ((mode == 0) & ((flags | base | phase | nz | nesc) != 0))
    low16 = flags & 1
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg = fixed3_layout(
        n, coded, low16, nz, nesc, ITEMSIZE, IS_FP16)
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
        else:
            i = ttile(G, T)
            valid = i < n
            err = _decode_coded(src, dst, i, valid, lim, n, flags, base, phase, nz, nesc, low16,
                                codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg,
                                mode - 1, ITEMSIZE, EXP_BITS, MAN_BITS, G, T)
    return err


@triton.jit
def _decode_coded(src, dst, i, valid, lim, n, flags, base, phase, nz, nesc, low16, codes_nb,
                  sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg, zero, ITEMSIZE: tl.constexpr,
                  EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr, G: tl.constexpr,
                  T: tl.constexpr):
    """A CODED chunk's segment at src (its layout checked against the body).
    ``zero`` is 0 (the entry's mode - 1), a value the compiler cannot fold."""
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    SIGNW: tl.constexpr = -(1 << (8 * ITEMSIZE - 1))  # -0.0's word, sign-extended
    WIDE: tl.constexpr = G % 4 == 0
    SPARSE: tl.constexpr = G <= 4  # a thread's escapes fit one 32-bit mask
    CP: tl.constexpr = 8 * G * T
    # 16-bit words are assembled two a register (_pairs16); bf16's sm is
    # taken as pairs in both sm branches, fp16's (with its rem bits) after
    PAIRS: tl.constexpr = SPARSE & (ITEMSIZE == 2) & (not IS_FP16)
    # Every load is masked to its sub-stream and to the body (lim bytes left).
    # Sub-streams start 16-aligned and the body ends 16-aligned, so a word
    # that starts inside a padded sub-stream and below lim ends inside both.
    lim = tl.minimum(tl.maximum(lim, 0), 1 << 30).to(tl.int32)
    a_sm = 16 * (a_sm >> 4)  # products: their divisibility is known (wide loads)
    a_rem = 16 * (a_rem >> 4)
    a_esc = 16 * (a_esc >> 4)
    codes_l = tl.minimum(codes_nb, lim)
    sm_l = tl.minimum(sm_nb, lim - a_sm)
    rem_l = tl.minimum(rem_nb, lim - a_rem)
    esc_l = tl.minimum(esc_nb, lim - a_esc)

    # --- codes ---
    q = tl.arange(0, 8)[None, None, :]
    r = tl.arange(0, T)[:, None] * G + tl.arange(0, G)[None, :]  # row index, [T, G]
    if WIDE:
        acc = load_words24(src, tl.minimum(a_sm, lim), T, G // 4)
        acc = tl.where(3 * r < codes_l, acc, 0)  # the padding is checked below
    else:
        acc = load_rows3(src, r, codes_l)
    # The codes of elements past n read as 0 (bits past 3 n may be anything).
    acc = acc & row_mask(n, r)
    code = (acc[:, :, None] >> (3 * q)) & 7
    zp = (flags >> 1) & 1
    zn = (flags >> 2) & 1
    z = zp + zn
    lo, width = fixed_window(base, phase, z, EMAX)
    keep = code >= z  # past n too when z = 0: after every element, counted out below
    esc = code == 7
    kp = keep.to(tl.int32)
    krow = kept_bits(acc, z)  # (a sum of kp over rows would cross lanes: its layout)
    # Escapes (SPARSE): one bit per element in a thread mask; each thread
    # patches its escaped elements' exponents after the words are stored.
    tex, emask, esc_t, kept, got_esc, kmax, kept_t = thread_counts(krow, acc, esc, T, G)
    kept = kept - tl.where(z == 0, CP - n, 0)  # the padding's codes 0
    err = tl.where((got_esc != nesc) | (n - kept != nz), ERR_COUNTS, 0)
    esc_src = src + a_esc
    if not SPARSE:
        e = code + (lo - z)
        erank = (tex >> 16)[:, None, None] + _excl(esc.to(tl.int32))
        eb = tl.load(esc_src + erank, mask=valid & esc & (erank < esc_l), other=0).to(tl.int32)
        e = tl.where(esc, eb, e)
        if EXP_BITS < 8:
            err = err | tl.where(tl.max(tl.max(tl.max(tl.where(valid & esc, eb, 0), axis=2),
                                               axis=1), axis=0) > EMAX, ERR_EXPONENT, 0)

    # --- sign+mantissa ---
    sm_src = src + a_sm
    rem_src = src + a_rem
    if nz == 0:
        # Every element's sm at its own position: whole words.
        room = tl.minimum(a_rem - a_sm, lim - a_sm)
        if PAIRS:
            # bf16 pairs (see _pairs16): bytes 0, 1 and 2, 3 of each word
            # at bits 0 and 16 (bytes past sm_nb are padding: zero, or the
            # chunk is refused).
            wd = load_words(sm_src, room, T, 2 * G)
            k2 = tl.arange(0, 2)[None, None, :]
            x = wd[:, :, None] >> (16 * k2)
            smv = tl.reshape((x & 0xFF) | ((x << 8) & 0xFF0000), (T, G, 4))
        elif (ITEMSIZE == 2) | (low16 != 0):
            # (bytes past sm_nb are padding: zero, or the chunk is refused)
            wd = load_words(sm_src, room, T, 2 * G)
            if (ITEMSIZE == 2) & (not IS_FP16):
                # bf16: the byte masked with 0xFF | zero << 8 (``zero`` is 0,
                # but not to the compiler). With 0xFF both sides of this
                # branch give byte values and the compiler merges them as
                # bytes packed four to a register: a PRMT a byte to pack
                # the gathered bytes, and one after the merge to unpack.
                kk = tl.arange(0, 4)[None, None, :]
                smv = tl.reshape((wd[:, :, None] >> (8 * kk)) & (0xFF | (zero << 8)), (T, G, 8))
            else:
                smv = unpack_bytes(wd, T, G)
            if ITEMSIZE == 4:
                smv = smv << 16
        else:
            smv = tl.reshape(load_words24(sm_src, room, T, 2 * G), (T, G, 8))
        if IS_FP16:
            if WIDE:
                racc = load_words24(rem_src, tl.minimum(a_esc - a_rem, lim - a_rem), T, G // 4)
                racc = tl.where(3 * r < rem_l, racc, 0)
            else:
                racc = load_rows3(rem_src, r, rem_l)
            smv = smv | (((racc[:, :, None] >> (3 * q)) & 7) << 8)
    else:
        # Zeros omitted: each kept element's sm at its rank among the kept.
        kstart = tex & 0xFFFF  # kept elements before the thread
        rowx = tl.cumsum(krow, axis=1) - krow  # kept before the row, in the thread
        # Kept up to (incl) and before (inrow) the element, in the row: field
        # q of the row's kept flags (bits 3q) times 0x249249, from the row
        # word (no scan over the tile; incl's last field is the row count).
        kf = _kept_flags(acc, z)
        inrow = (((kf << 3) * 0x249249)[:, :, None] >> (3 * q)) & 7
        krank = kstart[:, None, None] + rowx[:, :, None] + inrow
        kv = keep  # (z > 0 here, the entry checked: codes past n read as 0, not kept)
        if ITEMSIZE == 4:
            # Three bytes from byte smb * rank (LOW16: one; the two after it
            # are the next elements' or padding, masked off below). Past the
            # first byte the loads are masked to the padded sm room only.
            smb = 3 - 2 * low16
            at = smb * krank
            room_l = tl.minimum(a_rem - a_sm, lim - a_sm)
            # Unmasked, each byte's position clamped to the room (room_l - 1
            # >= -1: a byte of the segment): past it only with counts that
            # disagree with the entry (ERR_COUNTS); bytes of elements not
            # kept, and LOW16's two after the first, are not used.
            top = room_l - 1
            smv = tl.load(sm_src + tl.minimum(at, top)).to(tl.int32)
            smv = smv | (tl.load(sm_src + tl.minimum(at + 1, top)).to(tl.int32) << 8)
            smv = smv | (tl.load(sm_src + tl.minimum(at + 2, top)).to(tl.int32) << 16)
            smv = (smv & tl.where(low16 != 0, 0xFF, 0xFFFFFF)) << (16 * low16)
        elif SPARSE & IS_FP16:
            # Unmasked, at the rank (inrow: 0 for the row's first element), so
            # a thread reads bytes kb .. kb + kept_t, the last one only for
            # elements not kept after the thread's last kept one (unused).
            # The rem stream follows sm in the segment, so for counts that
            # agree with the entry kstart + kept_t <= sm_nb < a_esc - a_sm;
            # kb is clamped once a thread to at most a_esc - a_sm - 1 -
            # kept_t (a_esc <= seg <= lim: the layout is checked against
            # the body), and kb >= -1 - 8 G reads inside the payload (the
            # segment starts with at least 16 code bytes, after the header).
            kb = tl.minimum(kstart, a_esc - a_sm - kept_t - 1)
            rp = sm_src + (kb[:, None] + rowx)  # (one pointer a row)
            smv = tl.load(rp[:, :, None] + inrow).to(tl.int32)
        elif SPARSE:
            # Unmasked, at the inclusive rank - 1: a kept element's own rank,
            # the previous kept element's byte for one not kept (unused),
            # so a thread reads from byte kb to kb + kept_t, kept_t its kept
            # count. kb is clamped once a thread, to at most sm_l - 1 - kept_t
            # (counts that disagree with the entry only: ERR_COUNTS), and
            # kb >= -1 - 8 G >= -33 reads inside the payload (the segment
            # starts with at least 16 code bytes, after the header). The
            # inclusive count is field q of the row's kept flags times
            # 0x249249 (at most 7 below the last element), the row's count
            # for the last.
            kb = tl.minimum(kstart, sm_l - kept_t) - 1
            rp = sm_src + (kb[:, None] + rowx)  # (one pointer a row)
            incl = tl.where(q == 7, krow[:, :, None],
                            ((kf * 0x249249)[:, :, None] >> (3 * q)) & 7)
            smv = tl.load(rp[:, :, None] + incl).to(tl.int32)
            if PAIRS:
                sa, sb = tl.split(tl.reshape(smv, (T, G, 4, 2)))
                smv = sa | (sb << 16)
        else:
            # Unmasked, the rank clamped to the stream (sm_l - 1 >= -1: a byte
            # of the segment): ranks past it only come with counts that
            # disagree with the entry (ERR_COUNTS), and the bytes of elements
            # not kept are not used.
            smv = tl.load(sm_src + tl.minimum(krank, sm_l - 1)).to(tl.int32)
        if IS_FP16:
            if SPARSE:
                smv = smv | (_rem_runs_load(rem_src, inrow, rowx, kstart, rem_l) << 8)
            else:
                bit = 3 * krank
                at = bit >> 3
                two = tl.load(rem_src + at, mask=kv & (at < rem_l), other=0).to(tl.int32) | (
                    tl.load(rem_src + at + 1, mask=kv & (at + 1 < rem_l), other=0).to(tl.int32)
                    << 8)
                smv = smv | (((two >> (bit & 7)) & 7) << 8)
    # The sign moved from bit MAN_BITS to the top by adding EMAX copies of
    # it (its bit plus EMAX << MAN_BITS carries into the sign's place); the
    # exponent field masked (an escape's e may be EMAX + 1: patched below).
    # --- padding --- (2-byte words, G <= 4: before the escape patch, so
    # that the sizes are not live across _patch_all's call; fp32, and G = 8
    # (its registers spill more), count fewer after)
    if (ITEMSIZE == 2) & SPARSE:
        err = err | _padding(src, codes_nb, a_sm, sm_nb, a_rem, rem_nb, a_esc, esc_nb, seg, lim)

    if PAIRS:
        word = _pairs16(acc, smv, z, zp, zn, lo, EMAX, MAN_BITS, T, G)
    elif SPARSE & IS_FP16:
        sa, sb = tl.split(tl.reshape(smv, (T, G, 4, 2)))
        word = _pairs16(acc, sa | (sb << 16), z, zp, zn, lo, EMAX, MAN_BITS, T, G)
    else:
        if SPARSE:
            # (n > 0: 1 in a coded chunk; a factor the compiler cannot see
            # through, so code * 2**MAN_BITS + k_f stays one multiply-add an
            # element instead of being refactored as (code + lo - z) << MAN_BITS)
            k_f = ((lo - z) << MAN_BITS) * (n > 0).to(tl.int32)
            e_f = code * (1 << MAN_BITS) + k_f
        else:
            e_f = e << MAN_BITS
        word = (smv + (smv & (1 << MAN_BITS)) * EMAX) | (e_f & (EMAX << MAN_BITS))
        # Flagged zeros (codes below z): -0.0 has code zp when ZNEG is set.
        word = tl.where(code < z, tl.where(code == zp, SIGNW * zn, 0), word)
    store_rows(dst, i, n, word.to(dst.dtype.element_ty), ITEMSIZE, G, T)

    if SPARSE:
        # Patch: thread t's k-th escape (the k-th set bit of its mask) takes
        # escape byte tex_hi + k. The word is read back from dst (a volatile
        # load: after this thread's store of it) and its exponent replaced.
        # ROUNDS rounds inline (a round is skipped when no thread has that
        # many escapes); a chunk with a thread of more (rare, see ROUNDS)
        # patches every escape again in a cold function.
        e_at = (tex >> 16) & 0xFFFF
        v0, v1, v2 = _escape_run(esc_src, e_at, esc_l)
        tw = tl.arange(0, T) * (8 * G)
        # The words' store may come from another thread of the program (a
        # layout conversion before a wide store): a barrier orders it
        # before every read back.
        tl.debug_barrier()
        bad_e = tl.zeros([T], tl.int32)
        m = emask
        for k in tl.static_range(ROUNDS):
            if k < kmax:
                if k < 4:
                    v = v0
                elif k < 8:
                    v = v1
                else:
                    v = v2
                m, bad_e = _patch_escape(dst, (v >> (8 * (k % 4))) & 0xFF, m, bad_e, tw,
                                         k < esc_t, EMAX, MAN_BITS)
        if EXP_BITS < 8:
            err = err | tl.where(tl.max(bad_e, axis=0) != 0, ERR_EXPONENT, 0)
        if kmax > ROUNDS:
            err = err | _patch_all(src, dst, n, tl.minimum(a_sm, lim), codes_l, esc_src, esc_l,
                                   lo - z, EXP_BITS, MAN_BITS, G, T)

    if (ITEMSIZE == 4) | (not SPARSE):
        err = err | _padding(src, codes_nb, a_sm, sm_nb, a_rem, rem_nb, a_esc, esc_nb, seg, lim)
    return err


@triton.jit
def _padding(src, codes_nb, a_sm, sm_nb, a_rem, rem_nb, a_esc, esc_nb, seg, lim):
    """ERR_PADDING when a padding byte of the segment's four sub-streams is not zero."""
    padbad = pads_nonzero(src, codes_nb, a_sm, a_sm + sm_nb, a_rem, a_rem + rem_nb, a_esc,
                          a_esc + esc_nb, seg, lim)
    return tl.where(padbad, ERR_PADDING, 0)


@triton.jit(noinline=True)
def _patch_all(src, dst, n, codes_w, codes_l, esc_src, esc_l, lo_z, EXP_BITS: tl.constexpr,
               MAN_BITS: tl.constexpr, G: tl.constexpr, T: tl.constexpr):
    """Every escaped element's exponent by its rank among the escapes
    (cold code: chunks with a thread of more than ROUNDS escapes; the
    words the rounds patched get the same value again). Returns
    ERR_EXPONENT when an escape names no exponent of the dtype."""
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    q = tl.arange(0, 8)[None, None, :]
    r = tl.arange(0, T)[:, None] * G + tl.arange(0, G)[None, :]
    i = ttile(G, T)
    if G % 4 == 0:
        acc = tl.where(3 * r < codes_l, load_words24(src, codes_w, T, G // 4), 0)
    else:
        acc = load_rows3(src, r, codes_l)
    acc = acc & row_mask(n, r)
    esc = ((acc[:, :, None] >> (3 * q)) & 7) == 7
    f = esc.to(tl.int32)
    per = tl.sum(tl.sum(f, axis=2), axis=1)
    erank = (tl.cumsum(per, axis=0) - per)[:, None, None] + _excl(f)
    eb = tl.load(esc_src + erank, mask=esc & (erank < esc_l), other=0).to(tl.int32)
    p = dst + i
    old = tl.load(p, mask=esc, other=0, volatile=True).to(tl.int32)
    new = (old & ~(EMAX << MAN_BITS)) | ((eb & EMAX) << MAN_BITS)
    tl.store(p, new.to(dst.dtype.element_ty), mask=esc)
    bad = tl.max(tl.max(tl.max(tl.where(esc, eb, 0), axis=2), axis=1), axis=0) > EMAX
    return tl.where(bad, ERR_EXPONENT, 0)


@triton.jit
def _pairs16(acc, s2, z, zp, zn, lo, EMAX: tl.constexpr, MAN_BITS: tl.constexpr,
             T: tl.constexpr, G: tl.constexpr):
    """bf16 / fp16 words of the [T, G, 8] tile, assembled two a 32-bit
    register (elements 2p and 2p + 1 of a row in the low and high 16 bits;
    s2: their sign+mantissa values, sign at bit MAN_BITS): the codes' pair
    C (code 2p at bit 0, 2p + 1 at bit 16) from the row word, then lane
    arithmetic that carries nothing across bit 16:

    - sign: S + (S & 2**MAN_BITS) * EMAX per lane moves the sign to bit 15;
    - exponent: (code + (lo - z) mod (EMAX + 1)) << MAN_BITS per lane
      (bf16 < 0x8400, fp16 < 0x9800), its field masked (the same value as
      the element-wise (code + lo - z) << MAN_BITS masked; an escape's is
      patched later);
    - flagged zeros: Y = C * 0x8010 + (8 - z) * 16 a lane has bit 7 set
      when the code is kept (code >= z) and bit 15 = the code's bit 0 (the
      code's bits 1, 2 land on bits 16, 17: below the high lane's bit 4,
      under its bit 7 without a carry; past bit 31 for the high lane).
      Kept lanes get the word, the others -0.0 where ``(Y & U) ^ V`` has
      bit 15: U selects the code's bit 0 (both zeros flagged: -0.0 is code
      1), V sets it (only ZNEG: every zero is -0.0).

    Returns the [T, G, 8] tile of words (the element's bits in the low 16)."""
    p2 = tl.arange(0, 4)[None, None, :]
    # Codes 0..5 spread once a row (odd codes 13 bits up: code 2p + 1 16
    # bits above code 2p), pairs 0..2 one shift and mask each; pair 3's
    # odd code would pass bit 31 and its even one meet code 1 there.
    w = (acc & 0x71C7) | ((acc & 0x38E38) << 13)
    c2 = tl.where(p2 == 3, (((acc >> 18) & 7) | ((acc >> 5) & 0x70000))[:, :, None],
                  (w[:, :, None] >> (6 * p2)) & 0x70007)
    lanes = 0x10001
    SGN: tl.constexpr = 1 << MAN_BITS
    FIELD: tl.constexpr = EMAX << MAN_BITS
    e2 = c2 * SGN + (((lo - z) & EMAX) << MAN_BITS) * lanes
    y = c2 * 0x8010 + ((8 - z) * 16) * lanes
    keep = ((y >> 7) & lanes) * 0xFFFF
    top = -0x7FFF8000  # 0x80008000: bit 15 of each lane
    u = tl.where((zp & zn) != 0, top, 0)
    v = tl.where(((1 - zp) & zn) != 0, top, 0)
    zw = (y & u) ^ v
    w2 = (s2 + (s2 & (SGN * lanes)) * EMAX) | (e2 & (FIELD * lanes))
    w2 = (w2 & keep) | (zw & ~keep)
    return tl.reshape(tl.join(w2, w2 >> 16), (T, G, 8))  # (stored as their low 16 bits)


@triton.jit
def _kept_flags(acc, z):
    """Rows of eight 3-bit codes -> a bit at 3q for each code q of at least
    z (0, 1 or 2): the flags _codec_common.kept_bits counts (the same
    expression, so the compiler computes it once)."""
    one = acc | (acc >> 1)
    f = tl.where(z == 0, 0x249249, tl.where(z == 1, one | (acc >> 2), (acc >> 1) | (acc >> 2)))
    return f & 0x249249


@triton.jit
def _excl(f):
    """In-thread exclusive prefix sums, element order, of a [T, G, 8] tile."""
    row = tl.sum(f, axis=2)
    return (tl.cumsum(row, axis=1) - row)[:, :, None] + tl.cumsum(f, axis=2) - f


@triton.jit
def _escape_run(esc_src, e_at, esc_l):
    """Each thread's escape bytes e_at .. e_at + 11 (its ``ROUNDS`` <= 12
    inline rounds' bytes, in order) as three little-endian 32-bit words,
    from four aligned words of the stream (esc_src is 16-byte aligned) and
    one funnel shift each: no load or address a round. A word index is
    clamped to the stream's last word ((esc_l - 1) >> 2 >= -1: a word of
    the segment); a byte a round uses (below esc_l when the counts agree
    with the entry, else ERR_COUNTS) is in a word below that, so only
    unused bytes come from a clamped word."""
    tl.static_assert(ROUNDS <= 12)
    wp = esc_src.to(tl.pointer_type(tl.int32))
    at = e_at >> 2
    top = (esc_l - 1) >> 2
    w0 = tl.load(wp + tl.minimum(at, top)).to(tl.int64) & 0xFFFFFFFF
    w1 = tl.load(wp + tl.minimum(at + 1, top)).to(tl.int64) & 0xFFFFFFFF
    w2 = tl.load(wp + tl.minimum(at + 2, top)).to(tl.int64) & 0xFFFFFFFF
    w3 = tl.load(wp + tl.minimum(at + 3, top)).to(tl.int64) & 0xFFFFFFFF
    sh = (8 * (e_at & 3)).to(tl.int64)
    v0 = ((w0 | (w1 << 32)) >> sh).to(tl.int32)
    v1 = ((w1 | (w2 << 32)) >> sh).to(tl.int32)
    v2 = ((w2 | (w3 << 32)) >> sh).to(tl.int32)
    return v0, v1, v2


@triton.jit
def _patch_escape(dst, eb, m, bad_e, tw, act, EMAX: tl.constexpr, MAN_BITS: tl.constexpr):
    """One round of the escape patch: each thread whose ``act`` holds takes
    the lowest set bit j of its mask m and writes its escape byte ``eb``
    (from _escape_run) into the exponent of its element tw + j (already
    stored)."""
    b = m & (0 - m)
    j = low_bit_index(b)
    # The read back is unmasked: a thread without a k-th escape reads the
    # chunk's first word instead (it exists; the store is masked off).
    p = dst + tl.where(act, tw + j, 0)
    old = tl.load(p, volatile=True).to(tl.int32)
    new = (old & ~(EMAX << MAN_BITS)) | ((eb & EMAX) << MAN_BITS)
    tl.store(p, new.to(dst.dtype.element_ty), mask=act)
    return m ^ b, bad_e | (act & (eb > EMAX)).to(tl.int32)


@triton.jit
def _rem_runs_load(rem_src, inrow, rowx, kstart, rem_l):
    """fp16 rem with zeros omitted, a thread's 8 G <= 32 elements (the
    encoder's _rem_runs): the thread's run of 3-bit values from bit 3 kstart,
    four 32-bit words loaded and shifted down (words at or past rem_l read
    as 0), each row's 24 bits cut from it, each element's 3 bits from its
    row's; elements not kept get what follows (their words are flagged
    zeros)."""
    bit = 3 * kstart
    sh = (bit & 31).to(tl.uint64)
    at = bit >> 5
    words = rem_src.to(tl.pointer_type(tl.uint32))
    w0 = tl.load(words + at, mask=4 * at < rem_l, other=0).to(tl.uint64)
    w1 = tl.load(words + at + 1, mask=4 * at + 4 < rem_l, other=0).to(tl.uint64)
    w2 = tl.load(words + at + 2, mask=4 * at + 8 < rem_l, other=0).to(tl.uint64)
    w3 = tl.load(words + at + 3, mask=4 * at + 12 < rem_l, other=0).to(tl.uint64)
    o01 = w0 | (w1 << 32)
    o23 = w2 | (w3 << 32)
    # The run's bits 0..63 and 64..: logical shifts ((o23 << 1) << (63 - sh) is 0 for sh = 0).
    lo = ((o01 >> sh) | ((o23 << 1) << (63 - sh)))[:, None]
    hi = (o23 >> sh)[:, None]
    s = 3 * rowx  # the row's first bit in the run (< 96)
    rv = tl.where(s < 64, lo >> tl.minimum(s, 63).to(tl.uint64), 0) | tl.where(
        s >= 64, hi >> tl.maximum(s - 64, 0).to(tl.uint64),
        tl.where(s > 40, hi << tl.maximum(64 - s, 0).to(tl.uint64), 0))
    rv = (rv & 0xFFFFFF).to(tl.int32)
    return (rv[:, :, None] >> (3 * inrow)) & 7
