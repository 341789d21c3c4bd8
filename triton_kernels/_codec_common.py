"""Pieces the format v3 kernels share: the chunk tile, segment layout, zero
padding, the fixed3 window, word-wide stream loads and stores.

The chunk tile. A program handles one chunk of up to ``CP`` elements (a
power of 2, at least the chunk length) as a ``[T, G, 8]`` tile (``ttile``),
``T`` threads (32 per warp) and ``G = CP // (8 T)``: thread t holds the 8 G
consecutive elements ``t * 8G + g * 8 + q``, so its rows of 8 are one
16-byte load each for 16-bit words, packing its codes into bytes is a
shift-and-add inside the thread, and what crosses threads is one value per
thread (prefix sums of counts).

Every constant is derived from ``zipccl_fsdp.format`` at import time; the
asserts say which shape of the format the kernels assume (and fail loudly if
the format changes it).
"""
from __future__ import annotations

import triton
import triton.language as tl

from zipccl_fsdp import format as F

assert F.FIXED_BITS == 3 and F.FIXED_ESC == 7 and F.REM_BITS == 3 and F.ALIGN == 16
assert F.CHUNK_ENTRY_NBYTES == 16 and F.OFFSET_NBYTES == 4
assert (F.MODE_RAW, F.MODE_CODED, F.MODE_ZERO) == (0, 1, 2)
assert (F.FLAG_LOW16, F.FLAG_ZPOS, F.FLAG_ZNEG, F.FLAG_LOWBYTE) == (1, 2, 4, 8)
assert all(-8 <= d <= 7 for lo in F.FIXED_LO_BY_ZEROS for d in lo)
assert F.HEADER_NBYTES == 64 and F.MAX_NDIM == 16


def _nibbles(values) -> int:
    """Small non-negative ints, entry i at bits [4i, 4i+4), as an int64 constant."""
    acc = 0
    for i, v in enumerate(values):
        assert 0 <= v < 16
        acc |= v << (4 * i)
    assert acc < 1 << 63
    return acc


# fixed3 window start: nibble 4 z + phase holds FIXED_LO_BY_ZEROS[z][phase] + 8.
FIXED_LO_LUT = tl.constexpr(_nibbles([v + 8 for lo in F.FIXED_LO_BY_ZEROS for v in lo]))
FIXED_ZERO_SHIFT = tl.constexpr(F.FIXED_ZERO_SLOT_SHIFT)

# Bits of the decoders' error word (the low six are dense_decode.py's too).
ERR_TABLE = tl.constexpr(1)      # a chunk-table entry no encoder writes
ERR_OFFSETS = tl.constexpr(2)    # segment offsets disagree with the table / body length
ERR_TIERS = tl.constexpr(4)      # dense: tier open counts disagree with the table
ERR_COUNTS = tl.constexpr(8)     # decoded escape/zero counts disagree with the table
ERR_EXPONENT = tl.constexpr(16)  # an escape names no exponent of the dtype
ERR_PADDING = tl.constexpr(32)   # a padding byte is not zero
ERR_HEADER = tl.constexpr(64)    # a header field disagrees with the payload or the caller
ERR_GEOMETRY = tl.constexpr(128)  # chunk_elems is not the launch's: relaunch from the header
ERR_CODEC = tl.constexpr(256)    # a payload this build's kernel has no decoder for
INFO_SUMS = tl.constexpr(1 << 16)  # not an error: the payload carries checksums
# Not an error: the header's codec id at this bit, two bits (program 0 reports it,
# so the host learns which kernel a geometry's payloads take; codec_decode.py).
INFO_CODEC_SHIFT = tl.constexpr(17)
ERROR_MASK = (1 << 16) - 1


def tile_shape(chunk_elems: int, num_warps: int) -> tuple:
    """(CP, T) of the chunk tile for chunks of ``chunk_elems`` elements."""
    cp = max(8, triton.next_power_of_2(chunk_elems))
    return cp, min(32 * num_warps, cp // 8)


@triton.jit
def store_zero_words(dst, n, CP: tl.constexpr, T: tl.constexpr):
    """A ZERO chunk (format.py): its n elements, +0.0 (word 0), at dst."""
    i = tl.arange(0, T)[:, None] * (CP // T) + tl.arange(0, CP // T)[None, :]
    tl.store(dst + i, tl.zeros([T, CP // T], dst.dtype.element_ty), mask=i < n)


@triton.jit
def align16(x):
    return (x + 15) & -16


@triton.jit
def zero_pad(ptr, start, end):
    """Zero bytes [start, end) of ptr; end - start < 16."""
    k = tl.arange(0, 16)
    tl.store(ptr + start + k, tl.zeros([16], tl.uint8), mask=start + k < end)


@triton.jit
def pad_nonzero(ptr, start, end, limit):
    """Whether any byte in [start, end) of ptr is not zero (end - start < 16);
    bytes at or past ``limit`` are not read."""
    k = tl.arange(0, 16)
    at = start + k
    b = tl.load(ptr + at, mask=(at < end) & (at < limit), other=0)
    return tl.max(b.to(tl.int32), axis=0) != 0


@triton.jit
def fixed3_layout(n, coded, low16, lowbyte, nz, nesc, n_low, ITEMSIZE: tl.constexpr,
                  IS_FP16: tl.constexpr):
    """format.segment_layout of one fixed3 chunk: sub-stream lengths (codes,
    sm, rem, esc), the starts of sm, rem, esc inside the segment and the
    padded segment size, int32 bytes. With LOWBYTE (fp32), rem is the
    bitmap and the low stream of ``n_low`` bytes starts at a_esc +
    align16(esc), the segment's last."""
    kept = n - nz
    if ITEMSIZE == 4:
        smb = 3 - 2 * low16 - lowbyte
    else:
        smb = 1
    codes = tl.where(coded, (3 * n + 7) >> 3, 0)
    sm = tl.where(coded, kept * smb, n * ITEMSIZE)
    low = 0 * n
    if IS_FP16:
        rem = tl.where(coded, (3 * kept + 7) >> 3, 0)
    elif ITEMSIZE == 4:
        rem = tl.where(coded & (lowbyte != 0), (n + 7) >> 3, 0)
        low = tl.where(coded & (lowbyte != 0), n_low, 0)
    else:
        rem = 0 * n
    esc = tl.where(coded, nesc, 0)
    a_sm = align16(codes)
    a_rem = a_sm + align16(sm)
    a_esc = a_rem + align16(rem)
    return codes, sm, rem, esc, a_sm, a_rem, a_esc, a_esc + align16(esc) + align16(low)


@triton.jit
def lowbyte_wins(n, kept, n_low):
    """format.lowbyte_wins: LOWBYTE makes the padded segment smaller."""
    return align16(2 * kept) + align16((n + 7) >> 3) + align16(n_low) < align16(3 * kept)


@triton.jit(noinline=True)
def bitmap_count(body, at, n, body_nbytes, CP: tl.constexpr):
    """A LOWBYTE chunk's bitmap (ceil(n / 8) bytes from body byte ``at``,
    none read at or past the body's end): its set bits below n (the low
    stream's length), and whether a bit from n on is set (padding). Read
    before the chunk's offset is checked: the offset checks then hold only
    for the true offsets (offset 0 is fixed, each next one follows)."""
    k = tl.arange(0, CP // 8)
    pos = at + k
    b = tl.load(body + pos, mask=(8 * k < n) & (pos < body_nbytes), other=0).to(tl.int32)
    keep = 0xFF >> tl.minimum(tl.maximum(8 * k + 8 - n, 0), 8)
    return tl.sum(popc32(b & keep), axis=0), tl.max(b & ~keep, axis=0) != 0


@triton.jit
def bitmap_row(bitmap, r, n, nbytes):
    """The LOWBYTE bitmap byte of each row r (elements 8 r .. 8 r + 7), its
    bits from n on cleared (bitmap_count checks they are 0); 0 at or past
    ``nbytes``."""
    b = tl.load(bitmap + r, mask=(8 * r < n) & (r < nbytes), other=0).to(tl.int32)
    return b & (0xFF >> tl.minimum(tl.maximum(8 * r + 8 - n, 0), 8))


@triton.jit
def fixed_zero_flags(zeros, n):
    """fixed3's ZPOS and ZNEG (0 or 1) of a chunk of n elements from its
    +0.0 and -0.0 counts (``zeros``' low and high 16 bits): a sign is
    flagged when it is at least 1/64 of the chunk (format.py)."""
    zp = (((zeros & 0xFFFF) << FIXED_ZERO_SHIFT) >= n).to(tl.int32)
    zn = ((((zeros >> 16) & 0xFFFF) << FIXED_ZERO_SHIFT) >= n).to(tl.int32)
    return zp, zn


@triton.jit
def fixed_window(base, phase, z, EMAX: tl.constexpr):
    """fixed3: the exponent of code z (the first exponent code) and the
    window width 7 - z, with z flagged zero codes (format.py, "fixed3")."""
    lut = tl.full([], FIXED_LO_LUT, tl.int64)
    width = 7 - z
    lo = base + ((lut >> (4 * (4 * z + phase)).to(tl.int64)) & 15).to(tl.int32) - 8
    lo = tl.minimum(tl.maximum(lo, 0), EMAX + 1 - width)
    return lo, width


@triton.jit
def row_mask(n, r):
    """The bits of row r's 24-bit code word that belong to elements below n
    (rows of 8 elements, 3 bits each): 24 - 3 (n - 8 r) clamped to 0..24
    bits shifted off the top of 0xFFFFFF."""
    return 0xFFFFFF >> tl.minimum(tl.maximum(24 * r + 24 - 3 * n, 0), 24)


@triton.jit
def store_rows3(dst, acc, r, nbytes):
    """Store the 3 low bytes of each row's 24-bit value at dst + 3 * r, those
    below nbytes."""
    for b in tl.static_range(3):
        at = 3 * r + b
        tl.store(dst + at, ((acc >> (8 * b)) & 0xFF).to(tl.uint8), mask=at < nbytes)


@triton.jit
def load_rows3(src, r, nbytes):
    """The 24-bit values of 3 bytes at src + 3 * r, bytes at or past nbytes read as 0."""
    acc = tl.zeros(r.shape, tl.int32)
    for b in tl.static_range(3):
        at = 3 * r + b
        acc = acc | (tl.load(src + at, mask=at < nbytes, other=0).to(tl.int32) << (8 * b))
    return acc


@triton.jit
def byte_field(v, k, LO: tl.constexpr, NB: tl.constexpr):
    """The little-endian integer (int64) in bytes LO..LO+NB-1 of the byte vector v (index k)."""
    inside = (k >= LO) & (k < LO + NB)
    sh = tl.where(inside, 8 * (k - LO), 0).to(tl.int64)
    return tl.sum(tl.where(inside, v.to(tl.int64) << sh, 0), axis=0)


# ---------------------------------------------------------------------------
# Thread-major tile and word-wide stream functions (fixed3 kernels)
# ---------------------------------------------------------------------------
@triton.jit
def row_excl(row, G: tl.constexpr):
    """Exclusive prefix sums along the G rows of a thread ([T, G]) and their
    total ([T]), by G in-thread sums (they fold to adds: g is known per
    register). A tl.cumsum along axis 1 is given a layout with the rows
    across lanes: shuffles, and a layout conversion through shared memory
    each way (and one of the [T, G, 1] tile fails to compile)."""
    g = tl.arange(0, G)[None, :]
    acc = row * 0
    tot = tl.sum(acc, axis=1)
    for h in tl.static_range(G):
        rh = tl.sum(tl.where(g == h, row, 0), axis=1)
        acc = acc + tl.where(g > h, rh[:, None], 0)
        tot = tot + rh
    return acc, tot


@triton.jit
def ttile(G: tl.constexpr, T: tl.constexpr):
    """Element index of the [T, G, 8] chunk tile: thread t holds the 8 G
    consecutive elements t*8G .. t*8G + 8G - 1 (its G rows of 8)."""
    t = tl.arange(0, T)[:, None, None]
    g = tl.arange(0, G)[None, :, None]
    q = tl.arange(0, 8)[None, None, :]
    return t * (8 * G) + g * 8 + q


@triton.jit
def store_rows(dst, i, n, v, ITEMSIZE: tl.constexpr, G: tl.constexpr, T: tl.constexpr):
    """The [T, G, 8] tile v stored at dst + i (i: ttile), below n (the
    inverse of fixed3_encode.load_rows32); 32-bit words as two [T, G, 4]
    halves (one 16-byte store each), split in the thread: one store of the
    whole tile would be split into 16-byte vectors with a row's halves in
    two threads."""
    if ITEMSIZE == 4:
        h = tl.arange(0, T)[:, None, None] * (8 * G) + tl.arange(0, G)[None, :, None] * 8 + (
            tl.arange(0, 4)[None, None, :])
        a, b = tl.split(tl.permute(tl.reshape(v, (T, G, 2, 4)), (0, 1, 3, 2)))
        tl.store(dst + h, a, mask=h < n)
        tl.store(dst + h + 4, b, mask=h + 4 < n)
    else:
        tl.store(dst + i, v, mask=i < n)


@triton.jit
def cols_or(x, SH: tl.constexpr, T: tl.constexpr, G: tl.constexpr):
    """sum_g x[:, g] << (SH g) of a [T, G] tile (G = 1, 2 or 4), by splits:
    in the thread (a sum over an arange of g lays G across lanes)."""
    if G == 1:
        return tl.reshape(x, (T,))
    elif G == 2:
        a, b = tl.split(x)
        return a | (b << SH)
    else:
        a, b = tl.split(tl.reshape(x, (T, 2, 2)))  # a: columns 0, 2; b: 1, 3
        c0, c2 = tl.split(a)
        c1, c3 = tl.split(b)
        return c0 | (c1 << SH) | (c2 << (2 * SH)) | (c3 << (3 * SH))


@triton.jit
def split4(x, T: tl.constexpr, K: tl.constexpr):
    """The four entries of each group of 4 along the last axis of a [T, 4K]
    tile, as four [T, K] tiles (entry 4k + j in tile j)."""
    r = tl.reshape(x, (T, K, 2, 2))
    a, b = tl.split(r)  # a: entries 4k, 4k + 2; b: 4k + 1, 4k + 3
    r0, r2 = tl.split(a)
    r1, r3 = tl.split(b)
    return r0, r1, r2, r3


@triton.jit
def words24(r0, r1, r2, r3):
    """Four 24-bit values (non-negative int32) as the three little-endian
    32-bit words of their 12 bytes, in order."""
    w0 = r0 | (r1 << 24)
    w1 = (r1 >> 8) | (r2 << 16)
    w2 = (r2 >> 16) | (r3 << 8)
    return w0, w1, w2


@triton.jit
def store_words24(dst, acc, limit, T: tl.constexpr, K: tl.constexpr):
    """Store the [T, 4K] tile of 24-bit values (entry j of thread t at byte
    3 (4Kt + j) of dst, dst 4-byte aligned) as 32-bit words, those that
    start below ``limit`` (a multiple of 4)."""
    r0, r1, r2, r3 = split4(acc, T, K)
    w0, w1, w2 = words24(r0, r1, r2, r3)
    at = tl.arange(0, T)[:, None] * (3 * K) + 3 * tl.arange(0, K)[None, :]
    wp = dst.to(tl.pointer_type(tl.int32))
    tl.store(wp + at, w0, mask=4 * at < limit)
    tl.store(wp + at + 1, w1, mask=4 * at + 4 < limit)
    tl.store(wp + at + 2, w2, mask=4 * at + 8 < limit)


@triton.jit
def pack_bytes(b, T: tl.constexpr, G: tl.constexpr):
    """A [T, G, 8] tile of bytes (int32 0..255) as the [T, 2G] tile of the
    little-endian 32-bit words they make, in order."""
    b4 = tl.reshape(b, (T, G, 2, 4))
    k = tl.arange(0, 4)[None, None, None, :]
    return tl.reshape(tl.sum(b4 << (8 * k), axis=3), (T, 2 * G))


@triton.jit
def join4(r0, r1, r2, r3, T: tl.constexpr, K: tl.constexpr):
    """Four [T, K] tiles interleaved into one [T, 4K] tile (split4's inverse)."""
    return tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (T, 4 * K))


@triton.jit
def load_words24(src, limit, T: tl.constexpr, K: tl.constexpr):
    """store_words24's inverse: the [T, 4K] tile of 24-bit values from the
    32-bit words at src (4-byte aligned) that start below ``limit`` (a
    multiple of 4; words at or past it read as 0)."""
    at = tl.arange(0, T)[:, None] * (3 * K) + 3 * tl.arange(0, K)[None, :]
    wp = src.to(tl.pointer_type(tl.int32))
    w0 = tl.load(wp + at, mask=4 * at < limit, other=0)
    w1 = tl.load(wp + at + 1, mask=4 * at + 4 < limit, other=0)
    w2 = tl.load(wp + at + 2, mask=4 * at + 8 < limit, other=0)
    r0 = w0 & 0xFFFFFF
    r1 = ((w0 >> 24) & 0xFF) | ((w1 & 0xFFFF) << 8)
    r2 = ((w1 >> 16) & 0xFFFF) | ((w2 & 0xFF) << 16)
    r3 = (w2 >> 8) & 0xFFFFFF
    return join4(r0, r1, r2, r3, T, K)


@triton.jit
def unpack_bytes(wd, T: tl.constexpr, G: tl.constexpr):
    """pack_bytes' inverse: a [T, 2G] tile of words as the [T, G, 8] tile of their bytes."""
    k = tl.arange(0, 4)[None, None, :]
    return tl.reshape((wd[:, :, None] >> (8 * k)) & 0xFF, (T, G, 8))


@triton.jit
def pads_nonzero(ptr, s0, e0, s1, e1, s2, e2, s3, e3, limit):
    """Whether any byte of the four ranges [s_k, e_k) of ptr (each shorter
    than 16) is not zero, bytes at or past ``limit`` not read: one load and
    one reduction for all four."""
    k = tl.arange(0, 64)
    j = k >> 4
    s = tl.where(j == 0, s0, tl.where(j == 1, s1, tl.where(j == 2, s2, s3)))
    e = tl.where(j == 0, e0, tl.where(j == 1, e1, tl.where(j == 2, e2, e3)))
    at = s + (k & 15)
    b = tl.load(ptr + at, mask=(at < e) & (at < limit), other=0)
    return tl.max(b.to(tl.int32), axis=0) != 0


@triton.jit
def store_words(dst, wd, limit, T: tl.constexpr, W: tl.constexpr):
    """Store the [T, W] tile of 32-bit words (thread t's W words at word
    W t of dst, dst 16-byte aligned, W a multiple of 4 or less than 4) in
    16-byte granules, those that start below ``limit`` (a multiple of 16):
    the mask is constant over a granule, so each is one wide store."""
    V: tl.constexpr = 4 if W >= 4 else W
    w3 = tl.reshape(wd, (T, W // V, V))
    at = tl.arange(0, T)[:, None, None] * W + tl.arange(0, W // V)[None, :, None] * V
    k = tl.arange(0, V)[None, None, :]
    tl.store(dst.to(tl.pointer_type(tl.int32)) + at + k, w3, mask=4 * at < limit)


@triton.jit
def load_words(src, limit, T: tl.constexpr, W: tl.constexpr):
    """store_words' inverse: the [T, W] tile of words at src, granules at or
    past ``limit`` read as 0."""
    V: tl.constexpr = 4 if W >= 4 else W
    at = tl.arange(0, T)[:, None, None] * W + tl.arange(0, W // V)[None, :, None] * V
    k = tl.arange(0, V)[None, None, :]
    w3 = tl.load(src.to(tl.pointer_type(tl.int32)) + at + k, mask=4 * at < limit, other=0)
    return tl.reshape(w3, (T, W))


@triton.jit
def popc32(x):
    """Set bits of each int32 (SWAR: no popc in the interpreter)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24) & 0xFF


@triton.jit
def low_bit_index(b):
    """The index of the one set bit of each int32 ``b`` (a power of two, bit
    31 included), from the exponent of its float value; 0 gives -127."""
    f = b.to(tl.uint32, bitcast=True).to(tl.float32)
    return ((f.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def esc_bits(acc):
    """Rows of eight 3-bit codes (int32, 24 bits) -> the 8-bit mask of the
    codes that are 7 (ESC), bit q for code q."""
    x = acc & (acc >> 1) & (acc >> 2) & 0x249249  # bit 3q: code q is 7
    x = (x | (x >> 2)) & 0x0C30C3
    x = (x | (x >> 4)) & 0x00F00F
    return (x | (x >> 8)) & 0xFF
