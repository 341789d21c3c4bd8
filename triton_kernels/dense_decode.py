"""dense decode kernel: one program per chunk, in sub-blocks of ``SUB``
elements (see codec_decode.py for the steps around it and the checks).

It decodes the codes (tier 0, then each open tier in turn: five dependent
passes per sub-block, by the dense code's design), checks the decoded
tier-open, escape and zero counts against the table and the exponent range,
and writes the words. Every load is masked to its chunk's segment and to its
stream's end in the header (one bound per part, ``_room``).

Like the encoder it works on rows of 8 elements, each in one thread: a
tier's pass scans the rows' open counts, loads the 3 bytes that hold each
row's digits and takes them apart inside the thread.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import _codec_common as K
from ._codec_common import (ERR_COUNTS, ERR_EXPONENT, ERR_TABLE, ERR_TIERS, check_stream_ends,
                            decode_raw_chunk, dense_symbols, join_fields, load_entry,
                            segment_lengths_offsets, store_words, tier_nbytes)
from ._rows import row_ranks


@triton.jit
def _room(part_off, part_len, stream_len):
    """Bytes of a part (part_len bytes at part_off of a stream of stream_len
    bytes) that lie inside the stream, as an int32: one bound per load
    instead of two, the stream's a 64-bit compare."""
    return tl.maximum(tl.minimum(stream_len - part_off, part_len), 0).to(tl.int32)


@triton.jit
def _load_bytes(part, at, room, NB: tl.constexpr):
    """NB bytes from byte ``at`` of a part, little-endian in an int32, each
    load masked to the part's ``room`` (see _room); ``at`` is a [rows, 1]
    column (a 2-D load keeps the rows' layout)."""
    acc = tl.zeros(at.shape, tl.int32)
    for b in tl.static_range(NB):
        byte = tl.load(part + at + b, mask=at + b < room, other=0)
        acc = acc | (byte.to(tl.int32) << (8 * b))
    return acc


@triton.jit
def _decode_tier(part, room, rank, opened, before, BITS: tl.constexpr, CAP: tl.constexpr):
    """Read one dense tier for a [rows, 8] sub-block: the open elements'
    digits, in order, from the tier's packed part of the codes stream (its
    ``room`` bytes inside the stream, see _room); ``before`` open elements
    of this tier came in earlier sub-blocks. A row's digits are at most 16
    bits from any bit: 3 bytes. ``opened`` (which elements this tier holds)
    is 0/1 in int32, not a mask: selects and predicate moves cost more than
    the arithmetic."""
    cnt = tl.sum(opened, axis=1)
    first = (before + tl.cumsum(cnt, 0) - cnt) * BITS  # each row's first bit
    acc = _load_bytes(part, (first >> 3)[:, None], room, 3) >> (first & 7)[:, None]
    in_row = tl.cumsum(opened, 1) - opened
    digit = (acc >> (in_row * BITS)) & (CAP & -opened)  # 0 where the tier is closed
    if BITS == 1:
        still = digit  # CAP (all ones) continues into the next tier
    else:
        still = (digit >> 1) & digit
    return rank + digit, still, before + tl.sum(cnt, axis=0)


@triton.jit
def dense_decode_kernel(p_ptr, seg_ptr, cum_ptr, out_ptr, err_ptr, table_off, nch, numel, C,
                        streams_off, codes_end, sm_end, rem_end, esc_end,
                        ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                        MAN_BITS: tl.constexpr, SUB: tl.constexpr, NSUB: tl.constexpr):
    c = tl.program_id(0)
    EMAX: tl.constexpr = (1 << EXP_BITS) - 1
    IS_FP16: tl.constexpr = ITEMSIZE == 2 and EXP_BITS == 5
    if c == 0:
        check_stream_ends(cum_ptr, nch, err_ptr, codes_end, sm_end, rem_end, esc_end)
    # Loaded before the branch on the error word, so their latencies overlap.
    mode, flags, base, phase, nz, nesc, o1, o2, o3, o4 = load_entry(
        p_ptr + table_off + c.to(tl.int64) * 16, c < nch)
    # A load at offset idx of stream s is masked by idx < s's end.
    (seg_codes, seg_sm, seg_rem, seg_esc, codes_off, sm_off, rem_off,
     esc_off) = segment_lengths_offsets(seg_ptr, cum_ptr, nch, c)
    src = p_ptr + streams_off
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)
    dst = out_ptr + start

    # The table kernel ran before this one on the stream: bit ERR_TABLE is final.
    if (tl.load(err_ptr) & ERR_TABLE) == 0:
        if mode == 0:
            decode_raw_chunk(src, sm_off, seg_sm, sm_end, dst, n, SUB, NSUB, ITEMSIZE)
        else:
            zf = (flags >> 1) & 1
            # Each tier's part of the codes segment and its bytes inside the
            # stream, once per chunk.
            len0 = (2 * n + 7) >> 3
            len1 = tier_nbytes(o1, K.T1_BITS)
            len2 = tier_nbytes(o2, K.T2_BITS)
            len3 = tier_nbytes(o3, K.T3_BITS)
            part1 = codes_off + len0
            part2 = part1 + len1
            part3 = part2 + len2
            part4 = part3 + len3
            room0 = _room(codes_off, len0, codes_end)
            room1 = _room(part1, len1, codes_end)
            room2 = _room(part2, len2, codes_end)
            room3 = _room(part3, len3, codes_end)
            room4 = _room(part4, tier_nbytes(o4, K.T4_BITS), codes_end)
            # Open elements of tiers 1..4 in earlier sub-blocks.
            t1 = tl.zeros([], tl.int32)
            t2 = tl.zeros([], tl.int32)
            t3 = tl.zeros([], tl.int32)
            t4 = tl.zeros([], tl.int32)
            q_base = tl.zeros([], tl.int32)  # kept elements | escapes << 16 so far
            zeros_got = tl.zeros([], tl.int32)
            bad_exp = tl.zeros([], tl.int32)
            low16 = flags & 1
            esc_room = _room(esc_off, seg_esc, esc_end)
            sm_room = _room(sm_off, seg_sm, sm_end)
            rem_room = _room(rem_off, seg_rem, rem_end)
            for k in range(0, NSUB):
                r = tl.arange(0, SUB // 8)
                q = tl.arange(0, 8)
                i = k * SUB + r[:, None] * 8 + q[None, :]
                valid = i < n
                # Tier 0: a row's eight 2-bit digits are 2 bytes.
                two = _load_bytes(src + codes_off, k * (SUB // 4) + 2 * r[:, None], room0, 2)
                rank = (two >> (2 * q)[None, :]) & 3
                opened = (rank >> 1) & rank & valid.to(tl.int32)  # T0_CAP (3) continues
                rank, opened, t1 = _decode_tier(src + part1, room1, rank, opened, t1,
                                                K.T1_BITS, K.T1_CAP)
                rank, opened, t2 = _decode_tier(src + part2, room2, rank, opened, t2,
                                                K.T2_BITS, K.T2_CAP)
                rank, opened, t3 = _decode_tier(src + part3, room3, rank, opened, t3,
                                                K.T3_BITS, K.T3_CAP)
                rank, opened, t4 = _decode_tier(src + part4, room4, rank, opened, t4,
                                                K.T4_BITS, K.T4_CAP)
                esc = opened != 0
                e, zsym = dense_symbols(rank, base, phase, zf)
                is_zero = valid & zsym & ~esc
                keep = valid & ~is_zero
                zeros_got += tl.sum(tl.sum(is_zero.to(tl.int32), axis=1), axis=0)
                Q, q_tot = row_ranks(keep.to(tl.int32) | (esc.to(tl.int32) << 16), q_base)
                q_base += q_tot
                krank = (Q & 0xFFFF) - 1
                erank = (Q >> 16) - 1
                ebyte = tl.load(src + esc_off + erank, mask=esc & (erank < esc_room), other=0)
                e = tl.where(esc, ebyte.to(tl.int32), e)
                bad = (keep & ((e < 0) | (e > EMAX))).to(tl.int32)
                bad_exp += tl.sum(tl.sum(bad, axis=1), axis=0)

                if ITEMSIZE == 4:
                    smb = 3 - 2 * low16
                    word = tl.zeros([SUB // 8, 8], tl.int32)
                    for b in tl.static_range(3):
                        at = krank * smb + b
                        byte = tl.load(src + sm_off + at, other=0,
                                       mask=tl.where(b < smb, keep & (at < sm_room), False))
                        word = word | (byte.to(tl.int32) << (8 * b))
                    sm = tl.where(low16 != 0, word << 16, word)
                else:
                    sm = tl.load(src + sm_off + krank, mask=keep & (krank < sm_room),
                                 other=0).to(tl.int32)
                if IS_FP16:
                    # rem: 3 bits at bit 3*krank of the chunk's rem segment (may span 2 bytes).
                    bit = 3 * krank
                    at = bit >> 3
                    rem = src + rem_off + at
                    lo_b = tl.load(rem, mask=keep & (at < rem_room), other=0)
                    hi_b = tl.load(rem + 1, mask=keep & (at + 1 < rem_room), other=0)
                    two = lo_b.to(tl.int32) | (hi_b.to(tl.int32) << 8)
                    sm = sm | (((two >> (bit & 7)) & 7) << 8)
                w = join_fields(tl.minimum(tl.maximum(e, 0), EMAX), sm, EXP_BITS, MAN_BITS)
                store_words(dst + i, tl.where(is_zero, 0, w), valid, ITEMSIZE)

            err = tl.where(((q_base >> 16) != nesc) | (zeros_got != nz), ERR_COUNTS, 0)
            err = err | tl.where(bad_exp != 0, ERR_EXPONENT, 0)
            err = err | tl.where((t1 != o1) | (t2 != o2) | (t3 != o3) | (t4 != o4), ERR_TIERS, 0)
            tl.atomic_or(err_ptr, err, mask=err != 0)
