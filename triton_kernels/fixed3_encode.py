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
(16-byte units) for the host and zeroes the gap after the offsets. The
header is the launcher's (codec_encode.py).

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
- esc: each thread's escapes from a 32-bit mask of them, one per round
  (``ROUNDS`` inline; the element's word read again, from L1/L2), at the
  thread's exclusive escape count; a chunk with a thread of more escapes
  stores all of them by rank in a cold function.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._codec_common import (FIXED_ZERO_SHIFT, ROUNDS, align16, fixed3_thread_counts,
                            fixed3_layout, fixed_window, low_bit_index, pack_bytes, popc32,
                            load_rows, store_rows3, store_words, store_words24, sum3, tile3, ttile,
                            zero_pad)
from ._lookback import chunk_offset, ticket




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
    SPARSE: tl.constexpr = G <= 4  # a thread's escapes fit one 32-bit mask
    NEGZ: tl.constexpr = -(1 << (8 * ITEMSIZE - 1))  # -0.0's word, sign-extended
    c = ticket(ticket_ptr)
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)

    # --- load and analyze (the input's only read) ---
    i = ttile(G, T)
    valid = i < n
    # 16-bit words sign-extended: every field below is read with a mask, and
    # -0.0 is -32768.
    w = load_rows(x_ptr + start, i, n, ITEMSIZE, G, T)
    is_neg = w == NEGZ
    e = (w >> MAN_BITS) & EMAX
    normal = (e - 1).to(tl.uint32) < EMAX - 1  # 0 < e < EMAX (the padding has e = 0)
    if PACK:
        # Per thread: exponent sum (13 bits), normals, +0.0, -0.0 (6 bits
        # each), widened to 20 + 13 + 13 + 13 bits for one int64 sum.
        # (Normals and zeros exclude each other: one value per element. The
        # padding reads as +0.0 and is taken out of npos below.)
        v = tl.where(normal, e + (1 << 13),
                     tl.where(w == 0, 1 << 19, tl.where(is_neg, 1 << 25, 0)))
        per = tl.sum(tl.sum(v, axis=2), axis=1)
        wide = (per & 0x1FFF).to(tl.int64) | (((per >> 13) & 63).to(tl.int64) << 20) | (
            ((per >> 19) & 63).to(tl.int64) << 33) | ((per >> 25).to(tl.int64) << 46)
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
    qq = tl.where(k_norm > 0, (4 * s_sum) // tl.maximum(k_norm, 1), 0)
    base = qq >> 2
    phase = qq & 3
    low16 = 0
    if ITEMSIZE == 4:
        low16 = (tl.max(tl.max(tl.max(w & 0xFFFF, axis=2), axis=1), axis=0) == 0).to(tl.int32)
    zp = ((npos << FIXED_ZERO_SHIFT) >= n).to(tl.int32)
    zn = ((nneg << FIXED_ZERO_SHIFT) >= n).to(tl.int32)
    nz = zp * npos + zn * nneg  # elements coded as a flagged zero: no sm

    # --- codes (format.py, "fixed3") ---
    z = zp + zn
    lo, width = fixed_window(base, phase, z, EMAX)
    code = _codes(w, e, valid, lo, width, zp, zn, NEGZ)
    esc = code == 7
    # Per thread: kept elements (codes z and up; the padding's code 0 is
    # one only when z = 0, where no kept rank is used) and escapes (a mask,
    # bit 8 g + q, when a thread's 8 G elements fit 32 bits).
    q = tl.arange(0, 8)[None, None, :]
    acc = tl.sum(code << (3 * q), axis=2)  # a row's eight codes, [T, G]
    kp = (code >= z).to(tl.int32)
    krow = tl.sum(kp, axis=2)
    tex, emask, esc_t, _, n_esc, kmax = fixed3_thread_counts(krow, acc, esc, T, G)

    # --- raw or coded; the segment's size and offset ---
    codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, seg_c = fixed3_layout(
        n, True, low16, nz, n_esc, ITEMSIZE, IS_FP16)
    raw_seg = align16(n * ITEMSIZE)
    coded = seg_c < raw_seg
    units = tl.where(coded, seg_c, raw_seg) >> 4
    off = chunk_offset(status_ptr, c, units)
    tl.store(out_ptr.to(tl.pointer_type(tl.int32)) + (offsets_off >> 2) + c, off.to(tl.int32))
    if c == nch - 1:
        tl.store(total_ptr, off + units)
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
        r = tl.arange(0, T)[:, None] * G + tl.arange(0, G)[None, :]  # row index, [T, G]
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
        if ITEMSIZE == 4:
            smv = ((((w >> SIGN_SHIFT) & 1) << MAN_BITS) | (w & ((1 << MAN_BITS) - 1))) >> (
                16 * low16)
        else:
            smv = ((w >> EXP_BITS) & (1 << MAN_BITS)) | (w & ((1 << MAN_BITS) - 1))
        if nz == 0:
            # Every element's sm at its own position: whole words.
            room = a_rem - a_sm
            if (ITEMSIZE == 2) | (low16 != 0):
                store_words(sm_dst, pack_bytes(smv & 0xFF, T, G), room, T, 2 * G)
            else:
                s4 = tl.reshape(smv, (T, 8 * G))
                store_words24(sm_dst, s4, room, T, 2 * G)
            if CP < 16:
                zero_pad(sm_dst, sm_nb, room)
            if IS_FP16:
                rem_dst = dst + a_rem
                racc = tl.sum(((smv >> 8) & 7) << (3 * q), axis=2)
                if WIDE:
                    store_words24(rem_dst, racc, a_esc - a_rem, T, G // 4)
                else:
                    store_rows3(rem_dst, racc, r, rem_nb)
                    zero_pad(rem_dst, rem_nb, a_esc - a_rem)
        else:
            # Zeros omitted: each kept element's sm at its rank among the kept.
            keep = kp != 0  # (z > 0 here: the padding's code 0 is not kept)
            kstart = tex & 0xFFFF  # kept elements before the thread
            rowx = tl.cumsum(krow, axis=1) - krow  # kept before the row, in the thread
            inrow = tl.cumsum(kp, axis=2) - kp  # kept before the element, in the row
            krank = kstart[:, None, None] + rowx[:, :, None] + inrow
            if ITEMSIZE == 4:
                if low16 != 0:
                    tl.store(sm_dst + krank, (smv & 0xFF).to(tl.uint8), mask=keep)
                else:
                    p3 = sm_dst + 3 * krank
                    for b in tl.static_range(3):
                        tl.store(p3 + b, ((smv >> (8 * b)) & 0xFF).to(tl.uint8), mask=keep)
            else:
                tl.store(sm_dst + krank, (smv & 0xFF).to(tl.uint8), mask=keep)
            zero_pad(sm_dst, sm_nb, a_rem - a_sm)
            if IS_FP16:
                r3 = ((smv >> 8) & 7) * kp  # (0 where not kept: padding has kp 0 here, z > 0)
                if SPARSE:
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
            xw = x_ptr + start + tl.arange(0, T) * (8 * G)
            m = emask
            for k in tl.static_range(ROUNDS):
                if k < kmax:
                    m = _store_escape(xw, esc_dst, m, e_at + k, k < esc_t, MAN_BITS, EMAX)
            if kmax > ROUNDS:
                _escapes_all(x_ptr, start, n, esc_dst, lo, width, zp, zn, ITEMSIZE, EXP_BITS,
                             MAN_BITS, CP, T)
        else:
            _escapes_by_rank(esc_dst, e, esc, e_at)
        zero_pad(esc_dst, esc_nb, align16(esc_nb))


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
    code = tl.where(w == 0, cpos, tl.where(w == NEGZ, cneg, code))
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
def _store_escape(xw, esc_dst, m, at, act, MAN_BITS: tl.constexpr, EMAX: tl.constexpr):
    """One round of the escape stores: each thread whose ``act`` holds
    takes the lowest set bit j of its mask m and stores the exponent of its
    element j (x read again at xw + j) at esc byte ``at``."""
    b = m & (0 - m)
    j = low_bit_index(b)
    w = tl.load(xw + j, mask=act, other=0).to(tl.int32)
    tl.store(esc_dst + at, ((w >> MAN_BITS) & EMAX).to(tl.uint8), mask=act)
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
    bit = 3 * kstart
    sh = (bit & 31).to(tl.uint64)
    at = bit >> 5
    # The 96-bit run (hi:lo) shifted left by sh: four words from word at
    # (logical shifts: (lo >> 1) >> (63 - sh) is 0 for sh = 0).
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
