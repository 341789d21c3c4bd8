"""The zipccl payload format (version 3), defined here and nowhere else.

A payload is one 1-D uint8 tensor. All integers are little-endian; every
offset named below is from the payload's first byte, and ``align16(x)`` is
``x`` rounded up to a multiple of 16::

    0                 header (64 B)
    64                dims (ndim x u64)
    table_offset      chunk table: nchunks entries of 16 B    table_offset = align16(64 + 8 ndim)
    offsets_offset    segment offsets: nchunks x u32          offsets_offset = table_offset + 16 nchunks
    body_offset       body: one segment per chunk, in order   body_offset = align16(offsets_offset + 4 nchunks)
    sums_offset       [sums: u32 per 4096 elements, with the header flag CHECKSUM]
                                                              sums_offset = body_offset + body_nbytes

The header ends with a CRC-32 of itself and the dims, so a damaged header is
refused before any field is used. Every padding byte is zero, so a tensor has
exactly one payload per codec (backends compare bytes).

Chunks. The tensor is cut into chunks of ``chunk_elems`` elements (4096; the
last may be shorter); each is coded on its own and stored CODED, RAW or
ZERO. A chunk whose every element is +0.0 (word 0) is ZERO: its segment is
empty (0 bytes) and it decodes to +0.0 (the all-zero rows of an embedding
gradient make whole chunks of them). Any other chunk is CODED or RAW.

Body (chunk-major). Chunk c's segment starts at ``body_offset + 16 *
offset[c]`` and is self-contained::

    codes | pad | sm | pad | rem | pad | esc | pad | low | pad

each sub-stream starting at a multiple of 16 bytes from the segment start (so
16 B aligned in the payload) and the segment ending at a multiple of 16. The
starts of all five and the lengths of the first four follow from the chunk's
table entry alone (``segment_nbytes``; ``segment_layout`` gives the starts);
``low`` is empty but in LOWBYTE chunks, where its length is the number of set
bits of the chunk's bitmap (``low_counts``, see "LOWBYTE"). So a decoder that
reads entry c and offset c can decode chunk c with no scan over other chunks;
``offset`` is the exclusive prefix sum of the padded segment sizes in 16-byte
units (``offset[0] = 0``) and ``body_nbytes`` their total, both checked by
every decoder (a bitmap that disagrees with the offsets is refused like any
other length fault). A RAW chunk's segment is its element bytes (in the
``sm`` position), padded to 16. A RAW or ZERO chunk's table entry is its mode
and zeros.

Element fields. A float word splits into an exponent field ``e`` (8 bits for
bf16/fp32, 5 for fp16) and the sign+mantissa field ``sm`` (the other bits,
sign on top). ``sm`` is shipped raw: 1 byte for bf16, 3 for fp32, and for fp16
its low 8 bits as a byte plus its top 3 bits in the 3-bit ``rem`` stream. An
fp32 chunk whose low 16 bits are all zero (exact bf16 casts, as FSDP2's fp32
reduce-scatter input) sets LOW16 and ships 1 byte of ``sm`` per element.

LOWBYTE (fp32 mantissa tails). fp32 values that are not bf16 casts but sums
of a few of them (an fp32 gradient accumulated from bf16 terms) end their
mantissas in many zero bits, so the low byte (bits 0..7 of the word, the low
byte of ``sm``) of most elements is zero. In a CODED fp32 chunk of ``n``
elements without LOW16, with ``k = n - n_zero`` kept elements (those that
ship ``sm``) and ``m`` elements whose low byte is not zero (a zero has none,
so all ``m`` are kept), the encoder sets LOWBYTE exactly when::

    align16(2 k) + align16(ceil(n / 8)) + align16(m) < align16(3 k)

(the padded segment shrinks; codes and esc are the same either way). With
LOWBYTE, ``sm`` holds 2 bytes per kept element, bits 8..23 of its 24-bit
``sm`` (sign and the top 15 mantissa bits), little-endian; ``rem`` (fp32 has
no other use for it) holds the bitmap, ceil(n / 8) bytes, bit i of byte j for
element 8 j + i of the chunk (a row of 8 elements a byte, as the codes are
rows of 8), set when its low byte is not zero, its bits from n on zero
(padding, checked); ``low`` holds those nonzero low bytes in element order
(like esc), so its length is the bitmap's number of set bits. A decoder ORs
the next byte of ``low`` into bits 0..7 of each element whose bit is set,
whatever its code (an encoder sets no bit on a zero, and writes no zero byte
in ``low``; decoders do not check either). LOWBYTE is legal only in CODED
fp32 chunks without LOW16.

Zeros. ``+0.0`` (word 0) and ``-0.0`` (only the sign bit set) each have a
chunk flag, ZPOS and ZNEG. A flagged zero sign gets a code of its own and no
``sm`` byte; ``n_zero`` counts the elements coded that way (both signs).

Exponent codes. No histogram is taken: the exponent pmf of Gaussian data has
a fixed shape whose position moves with sigma. A chunk's locator is the mean
exponent over its normal elements (0 < e < emax), computed exactly in integers
so every backend agrees: ``q = floor(4 * sum(e) / count)``, ``base = q >> 2``,
``phase = q & 3``. The tables below place the codes around ``base`` for each
quarter-exponent ``phase``.

* ``fixed3``: 3 bits per element, code 7 is ESC. ZPOS when at least 1/64 of
  the chunk is +0.0, ZNEG likewise for -0.0 (``n << FIXED_ZERO_SLOT_SHIFT >=
  n_elems``). With z = ZPOS + ZNEG zero codes, code 0 is +0.0 when ZPOS, the
  next code -0.0 when ZNEG, and codes z..6 are the exponents ``lo..lo+6-z``
  with ``lo = clamp(base + FIXED_LO_BY_ZEROS[z][phase], 0, emax + 1 -
  (7 - z))``. A zero of an unflagged sign is coded like any other element.
* ``dense``: a tiered prefix code. Tier ``t`` is a stream of ``TIER_BITS[t]``-bit
  digits, one per element still *open* at that tier; digit values below the
  all-ones value are symbols, all-ones means "continue". The DENSE_SLOTS
  symbols in rank order (``dense_symbol_table``) are: the flagged zeros (ZPOS
  when at least 1/32 of the chunk is +0.0, then ZNEG likewise for -0.0), then
  ``DENSE_ORDER[phase]`` (exponent offsets from ``base``), then +0.0 when ZPOS
  is not set, cut to DENSE_SLOTS. Without ZNEG a chunk codes as in version
  1 (but for the threshold, 1/8 there). An element still open after the last
  tier is ESC (a -0.0 without ZNEG is one, with ZNEG only a +0.0 is one).
  Decoding a tier is one vectorized step (prefix sum of the open mask), so the code is parallel.

ESC elements ship their exponent field as one byte in ``esc``. A chunk is
stored CODED only when its padded coded segment (with LOWBYTE when the rule
above sets it) is smaller than its padded raw segment, so no chunk grows
beyond its raw bytes rounded up to 16.

Integrity (``verify``): with the header flag CHECKSUM, ``sums`` holds, for
each run of CHUNK_ELEMS elements of the *original* tensor, the u32
``sum(mix(word_i ^ key_i)) mod 2**32`` over its unsigned words, where i counts
from 0 within the run, ``key_i = (i | dtype_code << 16) * SUM_KEY_MUL mod
2**32`` (so a payload relabelled to another dtype of the same width does not
verify) and ``mix`` is the bijection of 32-bit values ``h = h * SUM_MUL1; h ^=
h >> 15; h = h * SUM_MUL2; h ^= h >> 16`` (products mod 2**32). The decoder
recomputes it on what it produced. A change of one element always changes the
sum (mix is a bijection); a change of several elements escapes with
probability about 2**-32. The sum must not be linear in the words: a linear
one misses changes whose differences cancel against the weights.
"""
from __future__ import annotations

import math
import numbers
import struct
import zlib
from dataclasses import dataclass

import torch

from ._layout import staged, to_device
from .errors import CorruptPayloadError

MAGIC = b"ZCCL"
VERSION = 3
HEADER_NBYTES = 64
CHUNK_ENTRY_NBYTES = 16
OFFSET_NBYTES = 4  # one u32 per chunk: segment start in ALIGN-byte units from body_offset
ALIGN = 16  # every table, stream and segment start; padding bytes are zero
CHUNK_ELEMS = 4096  # one Triton encode program per chunk; table overhead 20 B per 8 KiB of bf16
MAX_CHUNK_ELEMS = 65535  # counts in the chunk table are u16
MAX_NDIM = 16
MAX_BODY_NBYTES = ALIGN * (1 << 32)  # what u32 offsets in ALIGN units can address

CODEC_IDS = {"raw": 0, "fixed3": 1, "dense": 2}
CODEC_NAMES = {v: k for k, v in CODEC_IDS.items()}

# Chunk modes and flags.
MODE_RAW = 0
MODE_CODED = 1
MODE_ZERO = 2  # every element +0.0: no segment
FLAG_LOW16 = 1  # fp32 chunk whose low 16 bits are all zero
FLAG_ZPOS = 2  # +0.0 has its own code and ships no sm
FLAG_ZNEG = 4  # -0.0 has its own code and ships no sm
FLAG_LOWBYTE = 8  # fp32 chunk whose nonzero low sm bytes ship apart (see "LOWBYTE")
CHUNK_FLAGS = FLAG_LOW16 | FLAG_ZPOS | FLAG_ZNEG | FLAG_LOWBYTE

# Thresholds, as integer comparisons every backend evaluates identically
# (per zero sign: count << SHIFT >= chunk length).
FIXED_ZERO_SLOT_SHIFT = 6  # fixed3: >= 1/64 of the chunk
# dense: >= 1/32. A flagged zero takes a 2-bit tier-0 code and moves every
# exponent one rank down; from 1/32 of the chunk on, in each sign, that pays
# for itself on x * mask data (with 1/16, x * mask at 10% zeros, 5% of each
# sign, coded smaller with fixed3 than with dense; tests/test_ratios.py sweeps
# the fractions).
DENSE_ZERO_FIRST_SHIFT = 5

FIXED_BITS = 3
FIXED_ESC = 7
REM_BITS = 3  # fp16: sign + top 2 mantissa bits

# Dense tiers: widths chosen by the Gaussian model below (2,1,1,2,2 codes 11
# symbols at 2.63 bits on average over sigma vs 2.64 for 2,2,2,2 and 2.71
# for 2,2,2; see tests/test_format.py, which recomputes them).
TIER_BITS = (2, 1, 1, 2, 2)
TIER_SYMBOLS = tuple((1 << b) - 1 for b in TIER_BITS)  # 3,1,1,3,3 = 11 slots
DENSE_SLOTS = sum(TIER_SYMBOLS)
DENSE_ESC = DENSE_SLOTS  # rank of an element that leaves every tier open
ZERO_SYMBOL = 127  # sentinel offset meaning "+0.0" in a symbol table
NEG_ZERO_SYMBOL = 126  # sentinel offset meaning "-0.0"

# Pinned tables (derived by ``derive_tables`` from the Gaussian model; a test
# checks they still agree). Offsets are relative to ``base``.
DENSE_ORDER = (
    (1, 0, 2, -1, -2, -3, -4, -5, 3, -6),
    (1, 2, 0, -1, -2, -3, 3, -4, -5, -6),
    (1, 2, 0, -1, 3, -2, -3, -4, -5, -6),
    (2, 1, 0, 3, -1, -2, -3, -4, -5, -6),
)
FIXED_LO = (-4, -3, -3, -3)  # 7-wide window start per phase (no zero code)
FIXED_LO_ZERO = (-3, -3, -2, -2)  # 6-wide window (one zero sign coded)
FIXED_LO_ZERO2 = (-2, -2, -1, -1)  # 5-wide window (both zero signs coded)
FIXED_LO_BY_ZEROS = (FIXED_LO, FIXED_LO_ZERO, FIXED_LO_ZERO2)


@dataclass(frozen=True)
class DTypeInfo:
    code: int
    dtype: torch.dtype
    itemsize: int
    exp_bits: int
    man_bits: int

    @property
    def emax(self) -> int:
        return (1 << self.exp_bits) - 1

    @property
    def sign_word(self) -> int:
        """The unsigned word of -0.0."""
        return 1 << (8 * self.itemsize - 1)


DTYPES = {
    torch.bfloat16: DTypeInfo(1, torch.bfloat16, 2, 8, 7),
    torch.float16: DTypeInfo(2, torch.float16, 2, 5, 10),
    torch.float32: DTypeInfo(3, torch.float32, 4, 8, 23),
}
DTYPE_BY_CODE = {info.code: info for info in DTYPES.values()}


def dtype_info(dtype: torch.dtype) -> DTypeInfo:
    try:
        return DTYPES[dtype]
    except KeyError:
        supported = ", ".join(str(d) for d in DTYPES)
        raise TypeError(f"zipccl codes {supported}; got {dtype}") from None


def align16(x):
    """``x`` rounded up to a multiple of ALIGN (ints or int tensors)."""
    return (x + (ALIGN - 1)) // ALIGN * ALIGN


# --------------------------------------------------------------------------
# Header
# --------------------------------------------------------------------------
# magic, version, codec, dtype, ndim, numel, chunk_elems, nchunks, body_nbytes,
# 24 reserved bytes (zero), flags, crc
_HEADER = struct.Struct("<4sBBBBQIIQ24sII")
assert _HEADER.size == HEADER_NBYTES
_RESERVED = bytes(24)
_BODY_AT = 24  # offset of body_nbytes in the header
_U64, _U32 = struct.Struct("<Q"), struct.Struct("<I")
assert _HEADER.unpack(bytes(_BODY_AT) + _U64.pack(7) + bytes(32))[8] == 7
HEADER_FLAG_CHECKSUM = 1
# The checksum mix (see "Integrity" above): odd constants below 2**30, so a
# 32-bit value times one fits an int64 exactly.
SUM_KEY_MUL = 0x1E3779B1
SUM_MUL1 = 0x2C1B3C6D
SUM_MUL2 = 0x297A2D39
_KNOWN_HEADER_FLAGS = HEADER_FLAG_CHECKSUM


@dataclass
class Header:
    codec: str
    dtype: torch.dtype
    shape: tuple
    numel: int
    chunk_elems: int
    nchunks: int
    body_nbytes: int
    flags: int = 0

    @property
    def nsums(self) -> int:
        """Checksums stored (one per CHUNK_ELEMS elements), 0 without CHECKSUM."""
        return nchunks_for(self.numel) if self.flags & HEADER_FLAG_CHECKSUM else 0

    @property
    def table_offset(self) -> int:
        return align16(HEADER_NBYTES + 8 * len(self.shape))

    @property
    def offsets_offset(self) -> int:
        return self.table_offset + CHUNK_ENTRY_NBYTES * self.nchunks

    @property
    def body_offset(self) -> int:
        return align16(self.offsets_offset + OFFSET_NBYTES * self.nchunks)

    @property
    def sums_offset(self) -> int:
        return self.body_offset + self.body_nbytes

    @property
    def total_nbytes(self) -> int:
        return self.sums_offset + 4 * self.nsums

    def pack(self) -> bytes:
        """Header, dims and the zero padding up to table_offset."""
        info = DTYPES[self.dtype]
        fields = (MAGIC, VERSION, CODEC_IDS[self.codec], info.code, len(self.shape),
                  self.numel, self.chunk_elems, self.nchunks, self.body_nbytes, _RESERVED,
                  self.flags)
        dims = struct.pack(f"<{len(self.shape)}Q", *self.shape)
        crc = zlib.crc32(_HEADER.pack(*fields, 0)[:HEADER_NBYTES - 4] + dims)
        head = _HEADER.pack(*fields, crc) + dims
        return head + bytes(self.table_offset - len(head))

    def to_tensor(self, device: torch.device) -> torch.Tensor:
        """``pack()`` as a uint8 tensor on ``device``, without a host sync."""
        return to_device(self._bytes(), device)

    def copy_into(self, out: torch.Tensor) -> None:
        """Write ``pack()`` at the start of the uint8 tensor ``out``, without a host sync."""
        copy_header_into(bytearray(self.pack()), out)

    def _bytes(self) -> torch.Tensor:
        return torch.frombuffer(bytearray(self.pack()), dtype=torch.uint8)


class HeaderBytes:
    """``pack()`` of a header whose body length is known only after encoding
    (a GPU encoder's kernel finds it): every other field packed once, per
    geometry; ``with_body(n)`` sets the length and the CRC-32."""
    __slots__ = ("_template", "_dims_end")

    def __init__(self, header: Header):
        self._template = header.pack()
        self._dims_end = HEADER_NBYTES + 8 * len(header.shape)

    def with_body(self, body_nbytes: int) -> bytearray:
        """The bytes ``pack()`` gives with ``body_nbytes`` as the body length."""
        b = bytearray(self._template)
        _U64.pack_into(b, _BODY_AT, body_nbytes)
        view = memoryview(b)
        crc = zlib.crc32(view[HEADER_NBYTES:self._dims_end], zlib.crc32(view[:HEADER_NBYTES - 4]))
        _U32.pack_into(b, HEADER_NBYTES - 4, crc)
        return b


def copy_header_into(head: bytearray, out: torch.Tensor) -> None:
    """Write the packed header ``head`` at the start of the uint8 tensor
    ``out``, without a host sync (pinned staging when ``out`` is on a GPU)."""
    src = staged(torch.frombuffer(head, dtype=torch.uint8), out.device)
    out[:len(head)].copy_(src, non_blocking=True)


def nchunks_for(numel: int, chunk_elems: int = CHUNK_ELEMS) -> int:
    return -(-numel // chunk_elems)


def parse_header(payload: torch.Tensor) -> Header:
    """Read and validate the header; raises CorruptPayloadError for anything off.

    The payload's length is checked against the table and offsets the
    header's numel needs (20 bytes a chunk: a ZERO chunk has no body), so a
    forged header cannot make a decoder allocate more than CHUNK_ELEMS x
    itemsize / 20 times the payload's own size (820 for fp32), what a tensor
    of zeros codes to."""
    if not isinstance(payload, torch.Tensor):
        raise TypeError(f"payload must be a torch.Tensor, got {type(payload).__name__}")
    if payload.dtype != torch.uint8 or payload.dim() != 1:
        raise TypeError(f"payload must be a 1-D uint8 tensor, got {payload.dtype} "
                        f"with shape {tuple(payload.shape)}")
    n = payload.numel()
    if n < HEADER_NBYTES:
        raise CorruptPayloadError(f"payload of {n} bytes is shorter than the "
                                  f"{HEADER_NBYTES}-byte header")
    raw = payload[:HEADER_NBYTES + 8 * MAX_NDIM].cpu().numpy().tobytes()
    (magic, version, codec_id, dtype_code, ndim, numel, chunk_elems, nchunks,
     body, reserved, flags, crc) = _HEADER.unpack(raw[:HEADER_NBYTES])
    if magic != MAGIC:
        raise CorruptPayloadError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise CorruptPayloadError(f"payload is format version {version}; this build reads "
                                  f"version {VERSION} only (re-encode with the same zipccl "
                                  f"on every rank)")
    if ndim <= MAX_NDIM and n >= HEADER_NBYTES + 8 * ndim:
        if zlib.crc32(raw[:HEADER_NBYTES - 4] + raw[HEADER_NBYTES:HEADER_NBYTES + 8 * ndim]) != crc:
            raise CorruptPayloadError("header checksum mismatch: the header is damaged")
    if reserved != _RESERVED:
        raise CorruptPayloadError("reserved header bytes are not zero")
    if flags & ~_KNOWN_HEADER_FLAGS:
        raise CorruptPayloadError(f"unknown header flags {flags:#x}")
    if codec_id not in CODEC_NAMES:
        raise CorruptPayloadError(f"unknown codec id {codec_id}")
    if dtype_code not in DTYPE_BY_CODE:
        raise CorruptPayloadError(f"unknown dtype code {dtype_code}")
    if ndim > MAX_NDIM:
        raise CorruptPayloadError(f"ndim {ndim} exceeds {MAX_NDIM}")
    if n < HEADER_NBYTES + 8 * ndim:
        raise CorruptPayloadError("payload truncated inside the shape")
    shape = struct.unpack_from(f"<{ndim}Q", raw, HEADER_NBYTES)
    dims_end = HEADER_NBYTES + 8 * ndim
    if n >= align16(dims_end) and any(raw[dims_end:align16(dims_end)]):
        raise CorruptPayloadError("padding after the dims is not zero")
    if math.prod(shape) != numel:
        raise CorruptPayloadError(f"shape {shape} does not hold numel {numel}")
    info = DTYPE_BY_CODE[dtype_code]
    codec = CODEC_NAMES[codec_id]
    if codec == "raw":
        if chunk_elems or nchunks or body != numel * info.itemsize:
            raise CorruptPayloadError("raw payload with inconsistent lengths")
    else:
        if not (8 <= chunk_elems <= MAX_CHUNK_ELEMS) or chunk_elems % 8:
            raise CorruptPayloadError(f"chunk_elems {chunk_elems} out of range")
        if nchunks != nchunks_for(numel, chunk_elems):
            raise CorruptPayloadError(f"nchunks {nchunks} disagrees with numel {numel}")
        if body % ALIGN or body > align16(numel * info.itemsize) + ALIGN * nchunks:
            raise CorruptPayloadError(f"body of {body} bytes is not what numel {numel} allows")
    header = Header(codec, info.dtype, tuple(shape), numel, chunk_elems, nchunks, body, flags)
    if header.total_nbytes != n:
        raise CorruptPayloadError(f"payload has {n} bytes, header says {header.total_nbytes}")
    return header


def _check_count(name: str, value, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def max_encoded_nbytes(numel: int, dtype: torch.dtype, ndim: int | None = None,
                       verify: bool = False) -> int:
    """A true upper bound on the payload size of any codec for any tensor of
    ``numel`` elements of ``dtype`` with ``ndim`` dims (None: any ndim up to
    MAX_NDIM), including every padding byte. A chunk never takes more than its
    raw bytes rounded up to ALIGN."""
    numel = _check_count("numel", numel)
    ndim = MAX_NDIM if ndim is None else _check_count("ndim", ndim, 0, MAX_NDIM)
    info = dtype_info(dtype)
    nch = nchunks_for(numel)
    head = align16(HEADER_NBYTES + 8 * ndim)
    tail = align16(head + (CHUNK_ENTRY_NBYTES + OFFSET_NBYTES) * nch) - head
    return head + tail + align16(numel * info.itemsize) + 4 * nch * bool(verify)


# --------------------------------------------------------------------------
# The Gaussian model the tables come from
# --------------------------------------------------------------------------
def gaussian_exponent_pmf(log2_sigma: float, lo: int = -80, hi: int = 24) -> dict:
    """P(floor(log2|x|) = e) for x ~ N(0, sigma^2)."""
    s = math.sqrt(2.0) * 2.0 ** log2_sigma
    pmf = {}
    for e in range(lo, hi):
        p = math.erf(2.0 ** (e + 1) / s) - math.erf(2.0 ** e / s)
        if p > 0:
            pmf[e] = p
    return pmf


def derive_tables(step: float = 1 / 64, span: float = 20.0):
    """Average the Gaussian exponent pmf over sigma per locator phase; return
    (DENSE_ORDER, FIXED_LO, FIXED_LO_ZERO, FIXED_LO_ZERO2) as pinned above."""
    acc = [dict() for _ in range(4)]
    for i in range(int(-span / step), 1):
        pmf = gaussian_exponent_pmf(i * step)
        mean = sum(e * p for e, p in pmf.items())
        q = math.floor(4 * mean)
        base, phase = q >> 2, q & 3
        for e, p in pmf.items():
            acc[phase][e - base] = acc[phase].get(e - base, 0.0) + p

    def best_window(d, width):
        return max(range(-12, 6), key=lambda lo: sum(d.get(lo + j, 0.0) for j in range(width)))

    order = tuple(tuple(sorted(d, key=lambda k: -d[k])[:DENSE_SLOTS - 1]) for d in acc)
    lo7, lo6, lo5 = (tuple(best_window(d, w) for d in acc) for w in (7, 6, 5))
    return order, lo7, lo6, lo5


def dense_symbol_table(zpos: bool, zneg: bool, phase: int) -> tuple:
    """Symbols in rank order: offsets from base, ZERO_SYMBOL for +0.0 and
    NEG_ZERO_SYMBOL for -0.0 (see "dense" above)."""
    first = (ZERO_SYMBOL,) * zpos + (NEG_ZERO_SYMBOL,) * zneg
    last = () if zpos else (ZERO_SYMBOL,)
    return (first + DENSE_ORDER[phase] + last)[:DENSE_SLOTS]


def rank_tiers(rank: int) -> list:
    """(tier, digit) pairs that code ``rank`` (DENSE_ESC: all tiers continue)."""
    out = []
    for t, cap in enumerate(TIER_SYMBOLS):
        if rank < cap:
            out.append((t, rank))
            return out
        out.append((t, cap))
        rank -= cap
    return out


def fixed_zero_codes(flags):
    """fixed3: (number of zero codes, code of +0.0, code of -0.0); a code of
    -1 means that sign has none. Ints or int tensors of chunk flags."""
    zp = (flags & FLAG_ZPOS) != 0
    zn = (flags & FLAG_ZNEG) != 0
    if isinstance(flags, torch.Tensor):
        zp, zn = zp.long(), zn.long()
    else:
        zp, zn = int(zp), int(zn)
    z = zp + zn
    return z, zp - 1, zn * (zp + 1) - 1


# --------------------------------------------------------------------------
# The chunk table, segment lengths and layout (torch ops: shared by every backend)
# --------------------------------------------------------------------------
TIER_START = tuple(sum(TIER_SYMBOLS[:t]) for t in range(len(TIER_BITS)))  # first rank of tier t


@dataclass
class ChunkTable:
    """Per-chunk fields as int64 tensors of length nchunks.

    Entry bytes: mode, flags, base, phase (u8 each), then n_zero, n_esc,
    n_open[0..3] (u16 each)."""
    mode: torch.Tensor
    flags: torch.Tensor
    base: torch.Tensor
    phase: torch.Tensor
    n_zero: torch.Tensor  # elements coded as a zero of a flagged sign (no sm)
    n_esc: torch.Tensor
    n_open: torch.Tensor  # (nchunks, 4): elements still open at tiers 1..4 (dense)

    def to_bytes(self) -> torch.Tensor:
        """(nchunks * 16,) uint8, little-endian per entry."""
        u16 = torch.stack([self.n_zero, self.n_esc, *self.n_open.unbind(1)], 1)
        lo = (u16 & 0xFF).to(torch.uint8)
        hi = (u16 >> 8).to(torch.uint8)
        u16_bytes = torch.stack([lo, hi], 2).flatten(1)
        head = torch.stack([self.mode, self.flags, self.base, self.phase], 1).to(torch.uint8)
        return torch.cat([head, u16_bytes], 1).flatten()

    @staticmethod
    def from_bytes(raw: torch.Tensor, nchunks: int) -> "ChunkTable":
        t = raw.view(nchunks, CHUNK_ENTRY_NBYTES).to(torch.int64)
        u16 = t[:, 4::2] | (t[:, 5::2] << 8)
        return ChunkTable(t[:, 0], t[:, 1], t[:, 2], t[:, 3], u16[:, 0], u16[:, 1], u16[:, 2:])


def read_table(payload: torch.Tensor, header: Header) -> tuple:
    """(ChunkTable, offsets as int64 in ALIGN units) of a parsed payload."""
    nch = header.nchunks
    table = ChunkTable.from_bytes(payload[header.table_offset:header.offsets_offset], nch)
    ob = payload[header.offsets_offset:header.offsets_offset + OFFSET_NBYTES * nch]
    ob = ob.view(nch, OFFSET_NBYTES).to(torch.int64)
    offsets = ob[:, 0] | (ob[:, 1] << 8) | (ob[:, 2] << 16) | (ob[:, 3] << 24)
    return table, offsets


def offsets_to_bytes(offsets: torch.Tensor) -> torch.Tensor:
    """(nchunks,) int64 offsets in ALIGN units -> (nchunks * 4,) uint8 little-endian."""
    shifts = torch.arange(0, 32, 8, device=offsets.device)
    return ((offsets[:, None] >> shifts) & 0xFF).to(torch.uint8).reshape(-1)


def chunk_lengths(numel: int, nchunks: int, chunk_elems: int, device) -> torch.Tensor:
    n = torch.full((nchunks,), chunk_elems, dtype=torch.int64, device=device)
    if nchunks:
        n[-1] = numel - (nchunks - 1) * chunk_elems
    return n


def packed_nbytes(count: torch.Tensor, bits: int) -> torch.Tensor:
    return (count * bits + 7) >> 3


def lowbyte_wins(n, kept, n_low):
    """The LOWBYTE rule (see "LOWBYTE"): whether shipping the nonzero low
    bytes apart makes the padded segment of a chunk of ``n`` elements,
    ``kept`` of them shipping sm and ``n_low`` with a nonzero low byte,
    strictly smaller than 3 sm bytes each. Ints or int tensors."""
    return align16(2 * kept) + align16((n + 7) // 8) + align16(n_low) < align16(3 * kept)


def segment_nbytes(codec: str, info: DTypeInfo, n: torch.Tensor, table: ChunkTable,
                   n_low: torch.Tensor | None = None):
    """Unpadded bytes of each chunk's sub-streams (codes, sm, rem, esc, low),
    each (nchunks,). ``n_low``: each chunk's count of set bitmap bits
    (``low_counts``; the low length of a LOWBYTE chunk), None for a table
    without LOWBYTE (low is then empty everywhere)."""
    coded = table.mode == MODE_CODED
    raw = table.mode == MODE_RAW
    kept = n - table.n_zero
    if codec == "fixed3":
        codes = packed_nbytes(n, FIXED_BITS)
    else:
        counts = torch.cat([n[:, None], table.n_open], 1)
        bits = torch.tensor(TIER_BITS, device=n.device)
        codes = packed_nbytes(counts, bits).sum(1)
    zero = torch.zeros_like(n)
    lowbyte = coded & ((table.flags & FLAG_LOWBYTE) != 0)
    if info.dtype == torch.float32:
        smb = torch.where((table.flags & FLAG_LOW16) != 0, 1, torch.where(lowbyte, 2, 3))
        rem = torch.where(lowbyte, (n + 7) // 8, zero)
        low = zero if n_low is None else torch.where(lowbyte, n_low, zero)
    else:
        smb = torch.ones_like(n)
        rem = packed_nbytes(kept, REM_BITS) if info.dtype == torch.float16 else zero
        low = zero
    sm = torch.where(coded, kept * smb, torch.where(raw, n * info.itemsize, zero))
    return (torch.where(coded, codes, zero), sm, torch.where(coded, rem, zero),
            torch.where(coded, table.n_esc, zero), low)


def segment_layout(codec: str, info: DTypeInfo, n: torch.Tensor, table: ChunkTable,
                   n_low: torch.Tensor | None = None):
    """Per chunk: the starts of codes, sm, rem, esc, low inside its segment,
    as an (nchunks, 5) tensor, and the padded segment size (nchunks,), in
    bytes. The starts need the table alone; the size of a LOWBYTE chunk its
    ``n_low`` too (segment_nbytes)."""
    codes, sm, rem, esc, low = segment_nbytes(codec, info, n, table, n_low)
    a_codes = align16(codes)
    a_sm = a_codes + align16(sm)
    a_rem = a_sm + align16(rem)
    a_low = a_rem + align16(esc)
    starts = torch.stack([torch.zeros_like(codes), a_codes, a_sm, a_rem, a_low], 1)
    return starts, a_low + align16(low)


def low_counts(payload: torch.Tensor, header: Header, table: ChunkTable,
               offsets: torch.Tensor) -> tuple:
    """Per chunk, from its bitmap (LOWBYTE chunks; 0 elsewhere): the number
    of set bits below its length n (its low length), and whether a bit from
    n on is set (bad padding). The offsets are not trusted
    yet: reads past the payload read 0, and a decoder then checks the offsets
    against the sizes these counts imply (validate_offsets), which only the
    true offsets pass (offset 0 is fixed, and each next one follows)."""
    info = DTYPES[header.dtype]
    dev = payload.device
    nch = header.nchunks
    n_low = torch.zeros(nch, dtype=torch.int64, device=dev)
    bad = torch.zeros(nch, dtype=torch.bool, device=dev)
    lowbyte = (table.mode == MODE_CODED) & ((table.flags & FLAG_LOWBYTE) != 0)
    if info.dtype != torch.float32 or not bool(lowbyte.any()):
        return n_low, bad
    rows = lowbyte.nonzero()[:, 0]
    n = chunk_lengths(header.numel, nch, header.chunk_elems, dev)
    starts, _ = segment_layout(header.codec, info, n, table)
    n = n[rows]
    at = header.body_offset + ALIGN * offsets[rows] + starts[rows, 2]
    width = (header.chunk_elems + 7) // 8
    cols = torch.arange(width, device=dev)
    inside = cols[None, :] < ((n + 7) // 8)[:, None]
    idx = at[:, None] + cols[None, :]
    inside &= (idx >= 0) & (idx < payload.numel())
    byte = torch.where(inside, payload[torch.where(inside, idx, 0)].to(torch.int64), 0)
    bit = (byte[:, :, None] >> torch.arange(8, device=dev)) & 1  # (rows, width, 8)
    below = (8 * cols[:, None] + torch.arange(8, device=dev))[None] < n[:, None, None]
    n_low[rows] = (bit * below).sum((1, 2))
    bad[rows] = ((bit != 0) & ~below).any(2).any(1)
    return n_low, bad


def segment_offsets(seg_nbytes: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum of padded segment sizes, in ALIGN units (the offsets stream)."""
    units = seg_nbytes // ALIGN
    return torch.cumsum(units, 0) - units


def validate_table(codec: str, info: DTypeInfo, n: torch.Tensor, table: ChunkTable) -> None:
    """Reject table entries no encoder writes; bounds every later index."""
    bad = (table.mode > MODE_ZERO) | (table.phase > 3) | (table.base > info.emax)
    bad |= (table.flags & ~CHUNK_FLAGS) != 0
    if info.dtype != torch.float32:
        bad |= (table.flags & (FLAG_LOW16 | FLAG_LOWBYTE)) != 0
    bad |= (table.flags & (FLAG_LOW16 | FLAG_LOWBYTE)) == (FLAG_LOW16 | FLAG_LOWBYTE)
    bad |= (table.n_zero > n) | (table.n_esc > n)
    fields = torch.cat([table.base[:, None], table.phase[:, None], table.flags[:, None],
                        table.n_zero[:, None], table.n_esc[:, None], table.n_open], 1)
    bad |= (table.mode != MODE_CODED) & (fields != 0).any(1)
    if codec == "fixed3":
        bad |= (table.n_open != 0).any(1)
        bad |= ((table.flags & (FLAG_ZPOS | FLAG_ZNEG)) == 0) & (table.n_zero != 0)
    else:
        chain = torch.cat([n[:, None], table.n_open, table.n_esc[:, None]], 1)
        bad |= (chain[:, 1:] > chain[:, :-1]).any(1)
    if bool(bad.any()):
        c = int(bad.nonzero()[0, 0])
        raise CorruptPayloadError(f"chunk table entry {c} is invalid")


def validate_offsets(offsets: torch.Tensor, seg_nbytes: torch.Tensor, body_nbytes: int) -> None:
    """The offsets stream must be the exclusive prefix sum of the segment sizes
    the table implies, and the body exactly their total."""
    want = segment_offsets(seg_nbytes)
    bad = (offsets != want).nonzero()
    if bad.numel():
        c = int(bad[0, 0])
        raise CorruptPayloadError(f"segment offset of chunk {c} disagrees with the chunk table")
    total = int(seg_nbytes.sum()) if seg_nbytes.numel() else 0
    if total != body_nbytes:
        raise CorruptPayloadError(f"body of {body_nbytes} bytes, the chunk table says {total}")


def check_padding(payload: torch.Tensor, header: Header, lengths, starts: torch.Tensor,
                  bad_bits: torch.Tensor | None = None) -> None:
    """Every padding byte must be zero (one payload per tensor; a damaged pad
    byte is caught like any other): the gap before the body, and after each
    sub-stream of every chunk. ``lengths``: segment_nbytes; ``starts``: the
    (nchunks, 5) absolute sub-stream starts (stream_starts); ``bad_bits``:
    low_counts' chunks with a bitmap bit set past the chunk's end (padding
    bits, refused as padding)."""
    gap = payload[header.offsets_offset + OFFSET_NBYTES * header.nchunks:header.body_offset]
    if bool((gap != 0).any()):
        raise CorruptPayloadError("padding after the segment offsets is not zero")
    if not header.nchunks:
        return
    ln = torch.stack(list(lengths), 1)  # (nchunks, 5)
    cols = torch.arange(ALIGN - 1, device=payload.device)
    inside = cols[None, None, :] < (align16(ln) - ln)[..., None]
    idx = torch.where(inside, (starts + ln)[..., None] + cols, 0)
    bad = (inside & (payload[idx] != 0)).any(2).any(1)
    if bad_bits is not None:
        bad |= bad_bits
    bad = bad.nonzero()
    if bad.numel():
        raise CorruptPayloadError(f"padding after a sub-stream of chunk {int(bad[0, 0])} "
                                  f"is not zero")


def stream_starts(header: Header, table: ChunkTable, offsets: torch.Tensor) -> torch.Tensor:
    """(nchunks, 5) absolute payload byte offsets of each chunk's codes, sm,
    rem, esc and low sub-streams, as a decoder locates them (entry + offset,
    no scan)."""
    info = DTYPES[header.dtype]
    n = chunk_lengths(header.numel, header.nchunks, header.chunk_elems, offsets.device)
    starts, _ = segment_layout(header.codec, info, n, table)
    return header.body_offset + ALIGN * offsets[:, None] + starts


def hot_path_chunks(header: Header, table: ChunkTable, offsets: torch.Tensor) -> torch.Tensor:
    """Which chunks take the aligned hot path: (nchunks,) bool, True where
    every sub-stream of the chunk starts ALIGN-aligned in the payload (so a
    kernel may use 16-byte loads and stores on it from a 16-byte aligned
    payload base). The layout makes this every chunk, the ragged last one
    included; launchers and tests ask rather than assume."""
    return (stream_starts(header, table, offsets) % ALIGN == 0).all(1)
