"""fixed3 encode (format v2): one kernel, one program per chunk.

A program takes its chunk id from an atomic ticket (``_lookback.ticket``:
every chunk it may wait on belongs to a program that has started), loads its
chunk once (the only read of the input from memory) into the thread-major
``[T, G, 8]`` tile (``_codec_common.ttile``: thread t holds 8 G consecutive
elements), analyzes it (locator, +0.0 / -0.0 counts, fp32 LOW16: one
in-thread sum and one int64 sum across threads), codes it, writes its
chunk-table entry, computes its padded segment size in 16-byte units, gets
its segment offset by the decoupled look-back (``_lookback.chunk_offset``),
writes ``offsets[c]`` and then its whole segment, padding included
(format.py, "Body"). The last chunk's program also stores the body length
(16-byte units) for the host, writes the header from the launcher's template
(``_lookback.store_total``) and zeroes the gap after the offsets.

Sub-streams (every store covers the padded sub-stream, so no padding is
written apart when the tile covers it):

- codes: a thread's 8 G codes are 3 G bytes at 3 G t, stored as 32-bit
  words (three per 4 rows);
- sm, no zero omitted: element i's byte(s) at position i, packed into
  words in the thread and stored in 16-byte granules (3 bytes an element,
  fp32 without LOW16: three words per 4 elements); zeros omitted: each kept
  element's bytes at its rank among the kept (a byte scatter);
- rem (fp16): the top 3 sm bits; packed like the codes when no zero is
  omitted, else OR-ed into the zeroed segment by 32-bit atomics;
- esc: each thread's escapes from a mask of them (32 bits; 64 at G = 8),
  one per round (``ROUNDS`` inline, ``ROUNDS64`` at G = 8; the element's
  word read again, from L1/L2), at the thread's exclusive escape count; a
  chunk with a thread of more escapes stores all of them by rank in a cold
  function.

The tile's G (8 G elements a thread) follows the launch's warps
(codec_encode.SETTINGS): the fast paths (pairs of 16-bit words, escape
masks, rem runs, packed counts) take G <= 4 and G = 8; other G take the
general paths.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._codec_common import (FIXED_ZERO_SHIFT, ROUNDS, align16, cols_or, esc_bits,
                            fixed3_layout, fixed_window, kept_bits, low_bit_index, pack_bytes, popc32,
                            load_rows, store_rows3, store_words, store_words24, sum3, tile3, ttile,
                            zero_pad)
from ._lookback import chunk_offset, store_total, ticket




@triton.jit
def fixed3_encode_kernel(x_ptr, out_ptr, ticket_ptr, status_ptr, total_ptr, numel, nch, C,
                         table_off, offsets_off, body_off,
                         ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                         MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr):
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    SIGN_SHIFT: tl.constexpr = MAN_BITS + EXP_BITS
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    # Per-thread counts packed in one int32 (8 G <= 32 elements a thread).
    PACK: tl.constexpr = G <= 4
    # Whole words for the codes (groups of 4 rows) and sm (the tile covers
    # every padded sub-stream).
    WIDE: tl.constexpr = G % 4 == 0
    # A thread's escapes fit one mask: 32 bits, or 64 at G = 8.
    SPARSE: tl.constexpr = G <= 8
    PAIRS: tl.constexpr = (ITEMSIZE == 2) and (G <= 8)  # (_pair_stats' lane fields)
    NROUNDS: tl.constexpr = ROUNDS if G <= 4 else ROUNDS64
    NEGZ: tl.constexpr = -(1 << (8 * ITEMSIZE - 1))  # -0.0's word, sign-extended
    c = ticket(ticket_ptr)
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)

    # --- load and analyze (the input's only read) ---
    i = ttile(G, T)
    valid = i < n
    q = tl.arange(0, 8)[None, None, :]
    low16 = 0
    if PAIRS:
        # 16-bit words two to a register (lanes: element 2j low, 2j + 1
        # high): the analysis and the codes by lane arithmetic (SWAR).
        wl = tl.load(x_ptr + start + i, mask=valid, other=0)
        pr = _pairs(wl, G, T)
        s_sum, k_norm, npos, nneg = _pair_stats(pr, MAN_BITS, EMAX, G, T)
        npos = npos - (CP - n)  # the padding reads as +0.0
    else:
        # 16-bit words sign-extended: every field below is read with a mask, and
        # -0.0 is -32768.
        w = load_rows(x_ptr + start, i, n, ITEMSIZE, G, T)
        is_neg = w == NEGZ
        e = (w >> MAN_BITS) & EMAX
        normal = (e - 1).to(tl.uint32) < EMAX - 1  # 0 < e < EMAX (the padding has e = 0)
        if PACK or (G == 8):
            # Per thread (at G = 8, per half of its rows: 32 elements): exponent
            # sum (13 bits), normals, +0.0, -0.0 (6 bits each), widened to
            # 20 + 13 + 13 + 13 bits for one int64 sum.
            # (Normals and zeros exclude each other: one value per element. The
            # padding reads as +0.0 and is taken out of npos below.)
            # A zero's value by its sign bit (w >> 31: -1 or 0): 1 << 25 for
            # -0.0, 1 << 19 for +0.0, one test of the other bits for both.
            zv = ((w >> 31) & ((1 << 25) ^ (1 << 19))) ^ (1 << 19)
            v = tl.where(normal, e + (1 << 13), tl.where((w & ~NEGZ) == 0, zv, 0))
            if G == 8:
                per = tl.sum(tl.reshape(tl.sum(v, axis=2), (T, 2, 4)), axis=2)  # [T, 2]
            else:
                per = tl.sum(tl.sum(v, axis=2), axis=1)
            wide = (per & 0x1FFF).to(tl.int64) | (((per >> 13) & 63).to(tl.int64) << 20) | (
                ((per >> 19) & 63).to(tl.int64) << 33) | ((per >> 25).to(tl.int64) << 46)
            if G == 8:
                wide = tl.sum(wide, axis=1)
            tot = tl.sum(wide, axis=0)
            s_sum = (tot & 0xFFFFF).to(tl.int32)
            k_norm = ((tot >> 20) & 0x1FFF).to(tl.int32)
            npos = ((tot >> 33) & 0x1FFF).to(tl.int32) - (CP - n)
            nneg = ((tot >> 46) & 0x1FFF).to(tl.int32)
        else:
            s_sum = sum3(tl.where(normal, e, 0))
            cnt = sum3(normal.to(tl.int32) | ((valid & (w == 0)).to(tl.int32) << 16))
            nneg = sum3(is_neg.to(tl.int32))
            k_norm = cnt & 0xFFFF
            npos = (cnt >> 16) & 0xFFFF
        if ITEMSIZE == 4:
            low16 = (tl.max(tl.max(tl.max(w & 0xFFFF, axis=2), axis=1), axis=0) == 0).to(tl.int32)
    qq = tl.where(k_norm > 0, (4 * s_sum) // tl.maximum(k_norm, 1), 0)
    base = qq >> 2
    phase = qq & 3
    zp = ((npos << FIXED_ZERO_SHIFT) >= n).to(tl.int32)
    zn = ((nneg << FIXED_ZERO_SHIFT) >= n).to(tl.int32)
    nz = zp * npos + zn * nneg  # elements coded as a flagged zero: no sm

    # --- codes (format.py, "fixed3") ---
    z = zp + zn
    lo, width = fixed_window(base, phase, z, EMAX)
    r = tl.arange(0, T)[:, None] * G + tl.arange(0, G)[None, :]  # row index, [T, G]
    if PAIRS:
        c2 = _pair_codes(pr, lo, width, zp, zn, MAN_BITS, EMAX)
        # A row's eight codes (3 bits each) from its four pairs; codes past
        # n are 0.
        acc = _pair_rows3(c2) & row_mask(n, r)
        krow = kept_bits(acc, z)
        esc = acc == -1  # (not SPARSE only; PAIRS implies SPARSE)
    else:
        code = _codes(w, e, valid, lo, width, zp, zn, NEGZ)
        esc = code == 7
        # Per thread: kept elements (codes z and up; the padding's code 0 is
        # one only when z = 0, where no kept rank is used) and escapes (a mask,
        # bit 8 g + q, when a thread's 8 G elements fit 32 bits).
        acc = tl.sum(code << (3 * q), axis=2)  # a row's eight codes, [T, G]
        kp = (code >= z).to(tl.int32)
        krow = tl.sum(kp, axis=2)
    if G == 8:
        tex, emask, esc_t, n_esc, kmax = _thread_counts64(krow, acc, T)
    else:
        tex, emask, esc_t, _, n_esc, kmax, _ = thread_counts(krow, acc, esc, T, G)

    # --- raw or coded; the segment's size and offset ---
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
    dst = out_ptr + body_off + 16 * off

    if seg_c >= raw_seg:
        _write_raw(x_ptr, start, n, dst, ITEMSIZE, CP, T)
    else:
        a_sm = 16 * (a_sm >> 4)  # a product: its divisibility is known (wide stores)
        a_rem = 16 * (a_rem >> 4)
        a_esc = 16 * (a_esc >> 4)
        # codes: a row's eight 3-bit codes are 3 bytes at 3 r.
        if WIDE:
            store_words24(dst, acc, a_sm, T, G // 4)
        else:
            store_rows3(dst, acc, r, codes_nb)
            zero_pad(dst, codes_nb, a_sm)
        sm_dst = dst + a_sm
        if PAIRS:
            # A lane's sign+mantissa (sign at bit MAN_BITS), two a register.
            sm2 = ((pr >> EXP_BITS) & ((1 << MAN_BITS) * 0x10001)) | (
                pr & (((1 << MAN_BITS) - 1) * 0x10001))
        elif ITEMSIZE == 4:
            smv = ((((w >> SIGN_SHIFT) & 1) << MAN_BITS) | (w & ((1 << MAN_BITS) - 1))) >> (
                16 * low16)
        else:
            smv = ((w >> EXP_BITS) & (1 << MAN_BITS)) | (w & ((1 << MAN_BITS) - 1))
        if nz == 0:
            # Every element's sm at its own position: whole words.
            room = a_rem - a_sm
            if PAIRS and G >= 2:
                _store_pair_bytes(sm_dst, sm2, room, T, G)
            elif PAIRS:
                store_words(sm_dst, _pair_bytes(sm2, T, G), room, T, 2 * G)
            elif (ITEMSIZE == 2) | (low16 != 0):
                store_words(sm_dst, pack_bytes(smv & 0xFF, T, G), room, T, 2 * G)
            else:
                s4 = tl.reshape(smv, (T, 8 * G))
                store_words24(sm_dst, s4, room, T, 2 * G)
            if CP < 16:
                zero_pad(sm_dst, sm_nb, room)
            if IS_FP16:
                rem_dst = dst + a_rem
                if PAIRS:
                    racc = _pair_rows3((sm2 >> 8) & 0x70007)
                else:
                    racc = tl.sum(((smv >> 8) & 7) << (3 * q), axis=2)
                if WIDE:
                    store_words24(rem_dst, racc, a_esc - a_rem, T, G // 4)
                else:
                    store_rows3(rem_dst, racc, r, rem_nb)
                    zero_pad(rem_dst, rem_nb, a_esc - a_rem)
        else:
            # Zeros omitted: each kept element's sm at its rank among the kept.
            if PAIRS:
                kp = _pair_kept(c2, z, valid, G, T)
                smv = tl.reshape(tl.join((sm2 & 0xFFFF).to(tl.int32), (sm2 >> 16).to(tl.int32)),
                                 (T, G, 8))
            keep = kp != 0  # (z > 0 here: the padding's code 0 is not kept)
            kstart = tex & 0xFFFF  # kept elements before the thread
            rowx = tl.cumsum(krow, axis=1) - krow  # kept before the row, in the thread
            if PAIRS:
                inrow = tl.cumsum(kp, axis=2) - kp  # kept before the element, in the row
            else:
                # The same from the row's code word (a scan over this tile,
                # joined from two loads, would cross lanes).
                inrow = (_row_excl(acc, z)[:, :, None] >> (3 * q)) & 7
            krank = kstart[:, None, None] + rowx[:, :, None] + inrow
            if ITEMSIZE == 4:
                # One path for both sm widths: smb bytes an element from byte
                # smb * rank (LOW16: one; its two after it masked off).
                p3 = sm_dst + (3 - 2 * low16) * krank
                tl.store(p3, (smv & 0xFF).to(tl.uint8), mask=keep)
                if low16 == 0:
                    for b in tl.static_range(1, 3):
                        tl.store(p3 + b, ((smv >> (8 * b)) & 0xFF).to(tl.uint8), mask=keep)
            else:
                # (one pointer a row, the element's offset in the row added)
                rp = sm_dst + (kstart[:, None] + rowx)
                tl.store(rp[:, :, None] + inrow, (smv & 0xFF).to(tl.uint8), mask=keep)
            zero_pad(sm_dst, sm_nb, a_rem - a_sm)
            if IS_FP16:
                if PAIRS and (G == 8):
                    # From the pairs: not kept are the flagged zeros and the
                    # padding, whose rem is 0 but a flagged -0.0's (its sign,
                    # sm bit MAN_BITS = rem bit 2), cleared by its lane flag.
                    # (At G = 8 the joined sm tile then holds bytes only; at
                    # G <= 4 the compiler does better with the tile's form.)
                    f_ng = _pair_zeros(pr)[1]
                    zmask = (0 - zn).to(tl.uint32)
                    r2 = ((sm2 ^ ((f_ng >> (15 - MAN_BITS)) & zmask)) >> 8) & 0x70007
                    r3 = tl.reshape(tl.join((r2 & 7).to(tl.int32), (r2 >> 16).to(tl.int32)),
                                    (T, G, 8))
                else:
                    r3 = ((smv >> 8) & 7) * kp  # (0 where not kept: padding has kp 0, z > 0)
                if G == 8:
                    _rem_runs_halves(dst + a_rem, r3, inrow, krow, kstart, a_esc - a_rem, CP, T)
                elif SPARSE:
                    _rem_runs(dst + a_rem, r3, inrow, rowx, kstart, a_esc - a_rem, CP, T)
                else:
                    _rem_scatter(dst + a_rem, r3, krank, keep, a_esc - a_rem, i, CP)
        # esc: the escaped elements' exponent bytes at their rank among the escapes.
        esc_dst = dst + a_esc
        e_at = (tex >> 16) & 0xFFFF
        if SPARSE:
            # Thread t's k-th escape (the k-th set bit of its mask) goes to
            # byte e_at + k; its word is read again (from L1/L2: the input is
            # read from memory once). ROUNDS rounds inline (a round is skipped
            # when no thread has that many escapes); a chunk with a thread of
            # more (rare, see ROUNDS) stores all its escapes again in a cold
            # function.
            tw = tl.arange(0, T) * (8 * G)
            xw = x_ptr + start + tw
            m = emask
            for k in tl.static_range(NROUNDS):
                if k < kmax:
                    m = _store_escape(xw, tw, esc_dst, m, e_at + k, k < esc_t, MAN_BITS, EMAX)
            if kmax > NROUNDS:
                _escapes_all(x_ptr, start, n, esc_dst, lo, width, zp, zn, ITEMSIZE, EXP_BITS,
                             MAN_BITS, CP, T)
        else:
            _escapes_by_rank(esc_dst, e, esc, e_at)
        zero_pad(esc_dst, esc_nb, align16(esc_nb))


@triton.jit
def thread_counts(krow, acc, esc, T: tl.constexpr, G: tl.constexpr):
    """The per-thread counts both fixed3 kernels take from a chunk's codes
    (krow: kept codes a row, [T, G]; acc: the rows' code words; esc: the
    [T, G, 8] tile of escapes): ``tex``, each thread's exclusive kept count
    (low 16 bits) and escape count (high 16 bits); the thread's escape mask
    (bit 8 g + q; when its 8 G elements fit 32 bits, else 0) and count; the
    chunk's kept and escape totals and its largest per-thread escape count
    (0 without a mask). The totals and the largest count come from one
    reduction of two tensors (a sum and a max: one shuffle each a step, no
    packed fields to take apart in every combine)."""
    SPARSE: tl.constexpr = G <= 4
    kept_t = tl.sum(krow, axis=1)
    if SPARSE:
        emask = cols_or(esc_bits(acc), 8, T, G)
        esc_t = popc32(emask)
    else:
        emask = tl.zeros([T], tl.int32)
        esc_t = tl.sum(tl.sum(esc.to(tl.int32), axis=2), axis=1)
    packed = kept_t | (esc_t << 16)
    tex = tl.cumsum(packed, axis=0) - packed
    if SPARSE:  # (counts <= CP <= 4096)
        tot, kmax = tl.reduce((packed, esc_t), 0, _sum_max)
        kept = tot & 0xFFFF
        n_esc = (tot >> 16) & 0xFFFF
    else:
        kept = tl.sum(kept_t, axis=0)
        n_esc = tl.sum(esc_t, axis=0)
        kmax = 0 * kept
    return tex, emask, esc_t, kept, n_esc, kmax, kept_t


# Escape rounds inline at G = 8 (64 elements a thread; ROUNDS is for 32):
# chunks with a thread of more than 16 escapes, x * mask with 10% zeros,
# 0.2% (docs/benchmarks.md).
ROUNDS64 = tl.constexpr(16)


@triton.jit
def _thread_counts64(krow, acc, T: tl.constexpr):
    """thread_counts at G = 8 (64 elements a thread): the escape mask is
    64 bits (int64, bit 8 g + q), its count the two halves' popc32.
    Returns tex, the mask, the thread's escape count, the chunk's escape
    total and its largest per-thread escape count."""
    kept_t = tl.sum(krow, axis=1)
    # Rows 2j in a, 2j + 1 in b: row g's 8 bits at bit 16 j (+ 8 for b).
    a, b = tl.split(tl.reshape(esc_bits(acc).to(tl.int64), (T, 4, 2)))
    emask = cols_or(a, 16, T, 4) | (cols_or(b, 16, T, 4) << 8)
    esc_t = popc32(emask.to(tl.int32)) + popc32((emask >> 32).to(tl.int32))
    packed = kept_t | (esc_t << 16)  # (counts <= CP <= 4096)
    tex = tl.cumsum(packed, axis=0) - packed
    tot, kmax = tl.reduce((packed, esc_t), 0, _sum_max)
    return tex, emask, esc_t, (tot >> 16) & 0xFFFF, kmax


@triton.jit
def _low_bit_index64(b):
    """The index of the one set bit of each int64 ``b`` (a power of two),
    from the exponent of its float value (exact: one bit); 0 gives -127."""
    f = b.to(tl.uint64, bitcast=True).to(tl.float32)
    return ((f.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def row_mask(n, r):
    """The bits of row r's 24-bit code word that belong to elements below n
    (rows of 8 elements, 3 bits each): 24 - 3 (n - 8 r) clamped to 0..24
    bits shifted off the top of 0xFFFFFF."""
    return 0xFFFFFF >> tl.minimum(tl.maximum(24 * r + 24 - 3 * n, 0), 24)


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
def _pair_stats(pr, MAN_BITS: tl.constexpr, EMAX: tl.constexpr, G: tl.constexpr,
                T: tl.constexpr):
    """The chunk's exponent sum and count of normals, +0.0 and -0.0 counts
    (the padding's too) from its pairs, by lane arithmetic: a lane's
    exponent field u (EMAX << MAN_BITS at most) sets bit 15 of u + (1 <<
    MAN_BITS) only when it is EMAX, and of u + (EMAX << MAN_BITS) only when
    it is not 0; a lane's low 15 bits m set bit 15 of m + 0x7FFF only when
    they are not 0 (no carry leaves a lane)."""
    L2: tl.constexpr = 0x10001
    EMM: tl.constexpr = (EMAX << MAN_BITS) * L2
    H: tl.constexpr = 0x80008000
    u = pr & EMM
    a = tl.sum(tl.sum(u >> MAN_BITS, axis=2), axis=1)  # lanes: exponent sums (<= 16 EMAX)
    f_emax = (u + (1 << MAN_BITS) * L2) & H
    f_enz = (u + EMM) & H
    f_pz, f_ng = _pair_zeros(pr)
    # Four 4-bit counters a lane (e != 0, e == EMAX, +0.0, -0.0): a row's
    # four pairs count at most 4 each.
    t = (f_enz >> 15) + (f_emax >> 11) + (f_pz >> 7) + (f_ng >> 3)
    rs = tl.sum(t, axis=2)  # [T, G]
    c = (rs & 0xFFFF) + (rs >> 16)  # both lanes: at most 8 each
    c = (c & 0x0F0F) | (((c >> 4) & 0x0F0F) << 16)  # 8-bit fields: e != 0, +0.0, e == EMAX, -0.0
    per = tl.sum(c, axis=1).to(tl.int32)  # at most 32 each
    s_t = ((a & 0xFFFF) + (a >> 16)).to(tl.int32) - EMAX * ((per >> 16) & 0xFF)
    k_t = (per & 0xFF) - ((per >> 16) & 0xFF)
    wide = s_t.to(tl.int64) | (k_t.to(tl.int64) << 20) | (((per >> 8) & 0xFF).to(tl.int64) << 33) | (
        ((per >> 24) & 0xFF).to(tl.int64) << 46)
    tot = tl.sum(wide, axis=0)
    return ((tot & 0xFFFFF).to(tl.int32), ((tot >> 20) & 0x1FFF).to(tl.int32),
            ((tot >> 33) & 0x1FFF).to(tl.int32), ((tot >> 46) & 0x1FFF).to(tl.int32))


@triton.jit
def _pair_codes(pr, lo, width, zp, zn, MAN_BITS: tl.constexpr, EMAX: tl.constexpr):
    """The fixed3 codes of a tile of pairs (format.py, "fixed3"), a code a
    lane (uint32 [T, G, 4]), by lane arithmetic: v = (e - lo) mod 2**15
    (e + 0x8000 - lo below 0x10000: no carry leaves a lane) is in the
    window when v < width, i.e. when v + 0x8000 - width leaves bit 15
    clear; in the window the code is v + z, else 7 (ESC). A zero's
    exponent is 0, so the window gives every zero the same code c0; a
    flagged zero's code is 0 (+0.0) or zp (-0.0): its lane gets the uniform
    difference added (the lane holds c0 exactly, so the sum neither
    borrows from nor carries into the other lane)."""
    L2: tl.constexpr = 0x10001
    EMM: tl.constexpr = (EMAX << MAN_BITS) * L2
    z = zp + zn
    v = (((pr & EMM) >> MAN_BITS) + (((0x8000 - lo) & 0x7FFF) * L2).to(tl.uint32)) & 0x7FFF7FFF
    out = ((v + ((0x8000 - width) * L2).to(tl.uint32)) >> 15) & L2
    code = ((v + (z * L2).to(tl.uint32)) & 0x70007) | (out * 7)
    c0 = tl.minimum((0 - lo).to(tl.uint32), width.to(tl.uint32)).to(tl.int32) + z
    f_pz, f_ng = _pair_zeros(pr)
    return (code + (f_pz >> 15) * (zp * (0 - c0)).to(tl.uint32) + (f_ng >> 15) * (
        zn * (zp - c0)).to(tl.uint32)) & 0x70007


@triton.jit
def _pair_zeros(pr):
    """Lane flags (bit 15 of each lane) of the pairs that are +0.0 and
    -0.0: a lane's low 15 bits m set bit 15 of m + 0x7FFF only when they
    are not 0 (no carry leaves a lane)."""
    H: tl.constexpr = 0x80008000
    nzf = (pr & 0x7FFF7FFF) + 0x7FFF7FFF
    return ((nzf | pr) ^ H) & H, (pr & (nzf ^ H)) & H


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
def _row_excl(acc, z):
    """Rows of eight 3-bit codes (int32, 24 bits) -> each code's count of
    kept codes (at least z) before it in its row, as 3-bit field q (at
    most 7), by one multiply: with the kept flags at bits 3q, field q of
    (flags << 3) * 0x249249 sums the flags of codes 0 .. q - 1."""
    one = acc | (acc >> 1)
    kf = tl.where(z == 0, 0x249249, tl.where(z == 1, one | (acc >> 2), (acc >> 1) | (acc >> 2)))
    return (((kf & 0x249249) << 3) * 0x249249) & 0xFFFFFF


@triton.jit
def _pair_kept(c2, z, valid, G: tl.constexpr, T: tl.constexpr):
    """Kept elements (code z and up, within n) of a tile of pair codes, as the
    [T, G, 8] int32 tile of 0 / 1."""
    lo = (c2 & 7).to(tl.int32)
    hi = ((c2 >> 16) & 7).to(tl.int32)
    code = tl.reshape(tl.join(lo, hi), (T, G, 8))
    return (valid & (code >= z)).to(tl.int32)


@triton.jit
def _codes(w, e, valid, lo, width, zp, zn, NEGZ: tl.constexpr):
    """The fixed3 codes of a tile (format.py, "fixed3"); 0 past n."""
    z = zp + zn
    # In the window: d + z; below or above it: width + z = 7 (ESC).
    code = tl.minimum((e - lo).to(tl.uint32), width.to(tl.uint32)).to(tl.int32) + z
    # A zero's exponent is 0, so its code when its sign is not flagged is
    # the scalar c0; flagged, 0 (+0.0) or zp (-0.0).
    c0 = tl.minimum((0 - lo).to(tl.uint32), width.to(tl.uint32)).to(tl.int32) + z
    cpos = tl.where(zp != 0, 0, c0)
    cneg = tl.where(zn != 0, zp, c0)
    # (either zero by one test of the bits below the sign, its code by the
    # sign: w >> 31 is -1 or 0)
    code = tl.where((w & ~NEGZ) == 0, ((w >> 31) & (cneg ^ cpos)) ^ cpos, code)
    return tl.where(valid, code, 0)


@triton.jit
def _escapes_by_rank(esc_dst, e, esc, e_at):
    """Each escaped element's exponent byte at its rank among the escapes
    (e_at: the escapes of the threads before, [T])."""
    f = esc.to(tl.int32)
    row = tl.sum(f, axis=2)
    erank = e_at[:, None, None] + (tl.cumsum(row, axis=1) - row)[:, :, None] + (
        tl.cumsum(f, axis=2) - f)
    tl.store(esc_dst + erank, e.to(tl.uint8), mask=esc)


@triton.jit(noinline=True)
def _escapes_all(x_ptr, start, n, esc_dst, lo, width, zp, zn, ITEMSIZE: tl.constexpr,
                 EXP_BITS: tl.constexpr, MAN_BITS: tl.constexpr, CP: tl.constexpr,
                 T: tl.constexpr):
    """Every escape byte of the chunk by rank (cold code: chunks with a
    thread of more than ROUNDS escapes; it reads the chunk again, from L2,
    and stores again the bytes the rounds stored, with the same values)."""
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    NEGZ: tl.constexpr = -(1 << (8 * ITEMSIZE - 1))
    i = ttile(G, T)
    valid = i < n
    w = tl.load(x_ptr + start + i, mask=valid, other=0).to(tl.int32)
    e = (w >> MAN_BITS) & EMAX
    esc = _codes(w, e, valid, lo, width, zp, zn, NEGZ) == 7
    per = tl.sum(tl.sum(esc.to(tl.int32), axis=2), axis=1)
    _escapes_by_rank(esc_dst, e, esc, tl.cumsum(per, axis=0) - per)


@triton.jit
def _store_escape(xw, tw, esc_dst, m, at, act, MAN_BITS: tl.constexpr, EMAX: tl.constexpr):
    """One round of the escape stores: each thread whose ``act`` holds
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


@triton.jit(noinline=True)
def _write_raw(x_ptr, start, n, dst, ITEMSIZE: tl.constexpr, CP: tl.constexpr,
               T: tl.constexpr):
    """A RAW chunk: its words, then zeros up to the segment's end (cold code:
    it reads the chunk again, from L2)."""
    G: tl.constexpr = CP // (8 * T)
    i = tile3(G, T)
    valid = i < n
    w = tl.load(x_ptr + start + i, mask=valid, other=0)
    tl.store(dst.to(x_ptr.dtype) + i, w, mask=valid)
    nb = n * ITEMSIZE
    zero_pad(dst, nb, align16(nb))


@triton.jit
def _rem_scatter(rem_dst, r3, krank, keep, room, i, CP: tl.constexpr):
    """fp16 rem with zeros omitted: kept element k's 3 bits at bit 3 k of a
    zeroed segment of ``room`` bytes (a multiple of 16), OR-ed in with 32-bit
    atomics (a value may straddle two words)."""
    tl.store(rem_dst + i, tl.zeros(i.shape, tl.uint8), mask=i < room)
    zero_pad(rem_dst, CP, room)
    tl.debug_barrier()
    words = rem_dst.to(tl.pointer_type(tl.int32))
    bit = 3 * krank
    sh = bit & 31
    at = bit >> 5
    tl.atomic_or(words + at, r3 << sh, mask=keep & (r3 != 0))
    hi = r3 >> ((32 - sh) & 31)  # the bits past the word, when sh > 29
    tl.atomic_or(words + at + 1, hi, mask=keep & (sh > 29) & (hi != 0))


@triton.jit
def _or_run(rem_dst, lo, hi, bit):
    """OR the run of up to 96 bits (hi:lo) into ``rem_dst``'s 32-bit words
    from bit ``bit`` on: the run shifted left by ``bit & 31`` is four words
    from word ``bit >> 5`` (logical shifts: ``(lo >> 1) >> (63 - sh)`` is 0
    for sh = 0), OR-ed by relaxed atomics, since a run's first and last
    words are shared with the neighbouring threads'. The barrier orders them
    after the segment's zeroing stores."""
    sh = (bit & 31).to(tl.uint64)
    at = bit >> 5
    o01 = lo << sh
    o23 = (hi << sh) | ((lo >> 1) >> (63 - sh))
    tl.debug_barrier()
    words = rem_dst.to(tl.pointer_type(tl.int32))
    for k in tl.static_range(4):
        if k < 2:
            v = ((o01 >> (32 * k)) & 0xFFFFFFFF).to(tl.int32)
        else:
            v = ((o23 >> (32 * (k - 2))) & 0xFFFFFFFF).to(tl.int32)
        tl.atomic_or(words + at + k, v, mask=v != 0, sem="relaxed")


@triton.jit
def _rem_runs_halves(rem_dst, r3, inrow, krow, kstart, room, CP: tl.constexpr, T: tl.constexpr):
    """_rem_runs at G = 8 (64 elements a thread): each half of the
    thread's rows (4 rows, 32 elements) is one run of at most 96 bits from
    bit 3 (kstart + the kept elements of the rows before it), packed as in
    _rem_runs and OR-ed in as four 32-bit atomics a half (the halves share
    a boundary word as neighbouring threads do)."""
    NG: tl.constexpr = (3 * CP // 8 + 16 * T - 1) // (16 * T)  # 16-byte granules a thread zeroes
    store_words(rem_dst, tl.zeros([T, 4 * NG], tl.int32), room, T, 4 * NG)
    rv = tl.reshape(tl.sum(r3 << (3 * inrow), axis=2).to(tl.uint64), (T, 2, 4))
    k2 = tl.reshape(krow, (T, 2, 4))
    hk = tl.sum(k2, axis=2)  # kept a half, [T, 2]
    s = 3 * (tl.cumsum(k2, axis=2) - k2)  # a row's first bit in its half's run (< 96)
    lo = tl.sum(tl.where(s < 64, rv << tl.minimum(s, 63).to(tl.uint64), 0), axis=2)
    hi = tl.sum(tl.where(s >= 64, rv << tl.maximum(s - 64, 0).to(tl.uint64),
                         tl.where(s > 40, rv >> tl.minimum(64 - s, 63).to(tl.uint64), 0)), axis=2)
    _or_run(rem_dst, lo, hi, 3 * (kstart[:, None] + tl.cumsum(hk, axis=1) - hk))  # [T, 2]


@triton.jit
def _rem_runs(rem_dst, r3, inrow, rowx, kstart, room, CP: tl.constexpr, T: tl.constexpr):
    """fp16 rem with zeros omitted, a thread's 8 G <= 32 elements: its kept
    elements' 3-bit values are one run of bits from bit 3 kstart (kept
    ranks are consecutive in a thread), packed in the thread (each row's
    run, then the rows' runs joined: at most 96 bits) and OR-ed into the
    zeroed segment of ``room`` bytes (a multiple of 16) as four 32-bit
    atomics per thread (the run's first and last words are shared with
    the neighbouring threads)."""
    G: tl.constexpr = CP // (8 * T)
    NG: tl.constexpr = (3 * CP // 8 + 16 * T - 1) // (16 * T)  # 16-byte granules a thread zeroes
    store_words(rem_dst, tl.zeros([T, 4 * NG], tl.int32), room, T, 4 * NG)
    # A row's kept values at 3 bits each from its bit 0 (24 bits at most).
    rv = tl.sum(r3 << (3 * inrow), axis=2).to(tl.uint64)  # [T, G]
    s = 3 * rowx  # the row's first bit in the thread's run (< 96)
    lo = tl.sum(tl.where(s < 64, rv << tl.minimum(s, 63).to(tl.uint64), 0), axis=1)
    hi = tl.sum(tl.where(s >= 64, rv << tl.maximum(s - 64, 0).to(tl.uint64),
                         tl.where(s > 40, rv >> tl.minimum(64 - s, 63).to(tl.uint64), 0)), axis=1)
    _or_run(rem_dst, lo, hi, 3 * kstart)
