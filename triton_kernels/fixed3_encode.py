"""fixed3 encode (format v2): one kernel, one program per chunk.

A program takes its chunk id from an atomic ticket (``_lookback.ticket``:
every chunk it may wait on belongs to a program that has started), loads its
chunk once (the only read of the input) into the ``[G, T, 8]`` tile
(_codec_common.py), analyzes it (locator, +0.0 / -0.0 counts, fp32 LOW16),
codes it, writes its chunk-table entry, computes its padded segment size in
16-byte units, gets its segment offset by the decoupled look-back
(``_lookback.chunk_offset``), writes ``offsets[c]`` and then its whole
segment, padding included (format.py, "Body"). The last chunk's program
also stores the body length (16-byte units) for the host and zeroes the gap
after the offsets. The header is the launcher's (codec_encode.py).

Sub-streams:

- codes: a thread's 8 G codes are 3 G bytes at 3 G t, packed in the thread;
- sm: element i's byte at position i when no zero is omitted (contiguous
  per thread: wide stores), else at its rank among the kept elements (an
  exclusive prefix sum over the tile); fp32 without LOW16 ships 3 bytes;
- rem (fp16): the kept elements' top 3 sm bits; packed like the codes when
  no zero is omitted, else OR-ed into the zeroed segment by 32-bit atomics
  (a kept element's 3 bits land at bit 3 * rank, across threads);
- esc: the escaped elements' exponent bytes at their rank among the escapes.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._codec_common import (FIXED_ZERO_SHIFT, align16, fixed3_layout, fixed_window, store_rows3,
                            sum3, tile3, tile_excl, zero_pad)
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
    c = ticket(ticket_ptr)
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)

    # --- load and analyze (the input's only read) ---
    i = tile3(G, T)
    valid = i < n
    row_live = (tl.arange(0, T)[None, :, None] * (8 * G) + tl.arange(0, G)[:, None, None] * 8) < n
    w = tl.load(x_ptr + start + i, mask=valid, other=0).to(tl.int32)
    if ITEMSIZE == 2:
        w = w & 0xFFFF
        is_neg = w == 0x8000
    else:
        is_neg = (w != 0) & ((w & 0x7FFFFFFF) == 0)
    e = (w >> MAN_BITS) & EMAX
    sm = (((w >> SIGN_SHIFT) & 1) << MAN_BITS) | (w & ((1 << MAN_BITS) - 1))
    is_pos = valid & (w == 0)
    normal = (e - 1).to(tl.uint32) < EMAX - 1  # 0 < e < EMAX (the padding has e = 0)
    s_sum = sum3(tl.where(normal, e, 0))
    cnt = sum3(normal.to(tl.int32) | (is_pos.to(tl.int32) << 16))
    nneg = sum3(is_neg.to(tl.int32))
    k_norm = cnt & 0xFFFF
    npos = (cnt >> 16) & 0xFFFF
    qq = tl.where(k_norm > 0, (4 * s_sum) // tl.maximum(k_norm, 1), 0)
    base = qq >> 2
    phase = qq & 3
    low16 = 0
    if ITEMSIZE == 4:
        low16 = (sum3(((w & 0xFFFF) != 0).to(tl.int32)) == 0).to(tl.int32)
    zp = ((npos << FIXED_ZERO_SHIFT) >= n).to(tl.int32)
    zn = ((nneg << FIXED_ZERO_SHIFT) >= n).to(tl.int32)

    # --- codes (format.py, "fixed3") ---
    z = zp + zn
    cneg = zp  # the code of -0.0 when ZNEG is set
    lo, width = fixed_window(base, phase, z, EMAX)
    d = e - lo
    code = tl.where(d.to(tl.uint32) < width.to(tl.uint32), d + z, 7)
    zpos_c = tl.where(zp != 0, is_pos, False)  # not & with a scalar: triton 3.9
    zneg_c = tl.where(zn != 0, is_neg, False)
    code = tl.where(zpos_c, 0, code)
    code = tl.where(zneg_c, cneg, code)
    code = tl.where(valid, code, 0)
    esc = code == 7
    keep = valid & ~(zpos_c | zneg_c)
    pre, tot = tile_excl(keep.to(tl.int32) | (esc.to(tl.int32) << 16))
    kept = tot & 0xFFFF
    n_esc = (tot >> 16) & 0xFFFF
    nz = n - kept

    # --- raw or coded; the segment's size and offset ---
    _, _, _, _, _, _, _, seg_c = fixed3_layout(n, True, low16, nz, n_esc, ITEMSIZE, IS_FP16)
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
        codes_nb, sm_nb, rem_nb, esc_nb, a_sm, a_rem, a_esc, _ = fixed3_layout(
            n, True, low16, nz, n_esc, ITEMSIZE, IS_FP16)
        q = tl.arange(0, 8)[None, None, :]
        r = tl.arange(0, T)[None, :] * G + tl.arange(0, G)[:, None]  # row index, [G, T]
        store_rows3(dst, tl.sum(code << (3 * q), axis=2), r, codes_nb)
        zero_pad(dst, codes_nb, a_sm)
        if nz == 0:
            # Element i's sm at position i (i's rank among the kept elements).
            sm_dst = dst + tl.multiple_of(a_sm, 16)
            if ITEMSIZE == 4:
                smv = tl.where(low16 != 0, sm >> 16, sm)
            else:
                smv = sm
            if (ITEMSIZE == 2) | (low16 != 0):
                # Masked by row: a row that starts inside the chunk ends inside
                # its padded sm segment, and the tile holds zeros past n, so
                # the mask is constant along a row and the row is one store.
                tl.store(sm_dst + i, (smv & 0xFF).to(tl.uint8), mask=row_live)
            else:
                for b in tl.static_range(3):
                    tl.store(sm_dst + 3 * i + b, ((smv >> (8 * b)) & 0xFF).to(tl.uint8),
                             mask=valid)
            zero_pad(sm_dst, sm_nb, a_rem - a_sm)
            if IS_FP16:
                rem_dst = dst + tl.multiple_of(a_rem, 16)
                store_rows3(rem_dst, tl.sum(((sm >> 8) & 7) << (3 * q), axis=2), r, rem_nb)
                zero_pad(rem_dst, rem_nb, a_esc - a_rem)
            esc_dst = dst + tl.multiple_of(a_esc, 16)
            tl.store(esc_dst + ((pre >> 16) & 0xFFFF), e.to(tl.uint8), mask=esc)
            zero_pad(esc_dst, esc_nb, align16(esc_nb))
        else:
            _write_omitting(x_ptr, start, n, dst, lo, z, zp, zn, low16, sm_nb, rem_nb, esc_nb,
                            a_sm, a_rem, a_esc, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)


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


@triton.jit(noinline=True)
def _write_omitting(x_ptr, start, n, dst, lo, z, zp, zn, low16, sm_nb, rem_nb, esc_nb, a_sm,
                    a_rem, a_esc, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                    MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr):
    """sm, rem and esc of a coded chunk with zeros omitted (cold code: it
    reads the chunk again, from L2, and recomputes its codes): each kept
    element's sm bytes and rem bits at its rank among the kept elements."""
    G: tl.constexpr = CP // (8 * T)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    SIGN_SHIFT: tl.constexpr = MAN_BITS + EXP_BITS
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    i = tile3(G, T)
    valid = i < n
    w = tl.load(x_ptr + start + i, mask=valid, other=0).to(tl.int32)
    if ITEMSIZE == 2:
        w = w & 0xFFFF
        is_neg = w == 0x8000
    else:
        is_neg = (w != 0) & ((w & 0x7FFFFFFF) == 0)
    e = (w >> MAN_BITS) & EMAX
    sm = (((w >> SIGN_SHIFT) & 1) << MAN_BITS) | (w & ((1 << MAN_BITS) - 1))
    is_pos = valid & (w == 0)
    d = e - lo
    esc = valid & ~(d.to(tl.uint32) < (7 - z).to(tl.uint32))
    zpos_c = tl.where(zp != 0, is_pos, False)  # not & with a scalar: triton 3.9
    zneg_c = tl.where(zn != 0, is_neg, False)
    esc = esc & ~zpos_c & ~zneg_c
    keep = valid & ~(zpos_c | zneg_c)
    pre, tot = tile_excl(keep.to(tl.int32) | (esc.to(tl.int32) << 16))
    krank = pre & 0xFFFF
    sm_dst = dst + a_sm
    if ITEMSIZE == 4:
        smv = tl.where(low16 != 0, sm >> 16, sm)
        smb = 3 - 2 * low16
        for b in tl.static_range(3):
            tl.store(sm_dst + smb * krank + b, ((smv >> (8 * b)) & 0xFF).to(tl.uint8),
                     mask=tl.where(b < smb, keep, False))
    else:
        tl.store(sm_dst + krank, (sm & 0xFF).to(tl.uint8), mask=keep)
    zero_pad(sm_dst, sm_nb, a_rem - a_sm)
    if IS_FP16:
        _rem_scatter(dst + a_rem, tl.where(keep, (sm >> 8) & 7, 0), krank, keep, a_esc - a_rem, i,
                     CP)
    esc_dst = dst + a_esc
    tl.store(esc_dst + ((pre >> 16) & 0xFFFF), e.to(tl.uint8), mask=esc)
    zero_pad(esc_dst, esc_nb, align16(esc_nb))


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
