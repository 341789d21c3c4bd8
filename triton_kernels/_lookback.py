"""Decoupled look-back: the exclusive prefix sum of one value per program,
in one pass, for kernels whose programs take their index from an atomic
ticket (``ticket``).

Each program publishes its own value (the *aggregate*) as soon as it has
it, then walks back over its predecessors' status words, adding aggregates
until it meets one that holds an *inclusive* prefix, and publishes its own
inclusive prefix. Status word of program c (int64, zero before the kernel)::

    bits 0..39   value (an aggregate or an inclusive prefix; < 2**40)
    bits 40..41  0 not yet published, AGGREGATE, INCLUSIVE

Forward progress: a program waits only on smaller indices, and with indices
handed out by ``ticket`` every smaller index belongs to a program that has
already started and publishes without waiting on a larger one, so no wait
is on a program that is not resident. (``tl.program_id`` gives no such
order: the hardware may schedule program c before c - 1.)

Under ``TRITON_INTERPRET=1`` programs run one after another in ticket order,
so every predecessor has published its inclusive prefix and the walk stops
at the first step.

The codec encoders use it to place chunk segments: ``chunk_offset(status,
c, nunits)`` with a chunk's padded segment size in 16-byte units gives the
segment's offset (format.segment_offsets) and publishes the chunk's size.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._codec_common import align16, zero_pad

VALUE_BITS = tl.constexpr(40)
VALUE_MASK = tl.constexpr((1 << 40) - 1)
AGGREGATE = tl.constexpr(1 << 40)
INCLUSIVE = tl.constexpr(2 << 40)


@triton.jit
def ticket(counter_ptr):
    """This program's index in start order: an atomic increment of a zeroed
    int32 counter (one per kernel launch)."""
    return tl.atomic_add(counter_ptr, 1)


@triton.jit
def chunk_offset(status_ptr, c, nunits):
    """The exclusive prefix sum (int64) of ``nunits`` over programs 0..c-1,
    publishing program c's ``nunits`` (0 <= nunits, every prefix < 2**40).
    ``status_ptr``: an int64 array of one word per program, zero before the
    launch; ``c``: this program's ticket."""
    nunits = nunits.to(tl.int64)
    first = c == 0
    # int64 constants made here: a module-level constexpr above 32 bits does
    # not combine with a tensor under triton 3.9's interpreter.
    agg = tl.full([], AGGREGATE, tl.int64)
    inc = tl.full([], INCLUSIVE, tl.int64)
    vmask = tl.full([], VALUE_MASK, tl.int64)
    # Program 0's inclusive prefix is its own value.
    tl.atomic_xchg(status_ptr + c, tl.where(first, inc, agg) | nunits,
                   sem="release")
    acc = tl.zeros([], tl.int64)
    j = c - 1
    go = c > 0
    while go:
        s = tl.atomic_add(status_ptr + j, tl.zeros([], tl.int64), sem="acquire")
        state = s >> VALUE_BITS
        acc += tl.where(state != 0, s & vmask, 0)
        go = state != 2
        j = tl.where(state == 1, j - 1, j)  # state 0: not published yet, read again
    # (Program 0 writes the same word again: no branch around a scalar atomic.)
    tl.atomic_xchg(status_ptr + c, inc | (acc + nunits), sem="release")
    return acc


@triton.jit
def place_zero_chunk(out_ptr, status_ptr, c, table_off, offsets_off):
    """A ZERO chunk's place (format.py: every element +0.0): no segment, so
    it publishes 0 units (its offset is the next chunk's too), ``offsets[c]``
    and its entry, the mode and zeros. Returns the offset, which is where
    the body ends after it (16-byte units)."""
    off = chunk_offset(status_ptr, c, tl.zeros([], tl.int64))
    words = out_ptr.to(tl.pointer_type(tl.int32))
    tl.store(words + (offsets_off >> 2) + c, off.to(tl.int32))
    ent = words + (table_off >> 2) + 4 * c.to(tl.int64)
    tl.store(ent, 2)  # format.MODE_ZERO
    tl.store(ent + 1, 0)
    tl.store(ent + 2, 0)
    tl.store(ent + 3, 0)
    return off


# The words after the body-length word (``total_ptr`` of ``store_total``), as
# the encode launcher fills them once per plan: the header template, then how
# many of its words the header takes, then the CRC's change per body-length
# bit (codec_encode.header_words).
HEADER_WORDS = tl.constexpr(24)  # format.HEADER_NBYTES + 8 * MAX_NDIM, in int64 words
BODY_WORD = tl.constexpr(3)  # format._BODY_AT // 8
CRC_WORD = tl.constexpr(7)  # the CRC-32 is the high half of bytes 56..63


@triton.jit(noinline=True)
def store_total(total_ptr, out_ptr, units):
    """The last chunk's program, once the body length (``units``, 16-byte
    units) is known: store it at ``total_ptr`` for the host's one read, and
    write the payload's header (``format.Header.pack()``) at ``out_ptr``.

    ``total_ptr + 1`` holds the plan's header with a body length of 0 and
    its CRC-32 (HEADER_WORDS words, zero after the header), then the number
    of words to write, then for each bit i of the 64-bit body-length field
    the CRC-32 of the header with only that bit set xor that of the header
    of all zero bytes. CRC-32 is affine over GF(2) for messages of one
    length, so the CRC with body length b is the template's xor the terms of
    b's set bits: 64 lanes and one xor-reduction, no serial byte loop."""
    tl.store(total_ptr, units)
    tpl = total_ptr + 1
    body = units.to(tl.int64) * 16
    bit = tl.arange(0, 64).to(tl.int64)
    terms = tl.load(tpl + HEADER_WORDS + 1 + bit)
    delta = tl.xor_sum(tl.where(((body >> bit) & 1) != 0, terms, 0), axis=0)
    k = tl.arange(0, 32)
    live = k < tl.load(tpl + HEADER_WORDS)
    w = tl.load(tpl + k, mask=live, other=0)
    w = tl.where(k == BODY_WORD, body, w)
    w = tl.where(k == CRC_WORD, w ^ (delta << 32), w)
    tl.store(out_ptr.to(tl.pointer_type(tl.int64)) + k, w, mask=live)


@triton.jit(noinline=True)
def finish_payload(total_ptr, out_ptr, units, offsets_off, nch):
    """The last chunk's program, once the body length (``units``) is known:
    the length and the header (store_total), and the zeros between the
    offsets and the body (cold code: one program a launch; called after the
    chunk's writes, where few values are live: a call saves those to local
    memory)."""
    store_total(total_ptr, out_ptr, units)
    gap = offsets_off + 4 * nch
    zero_pad(out_ptr, gap, align16(gap))
