"""The zipccl payload format, defined here and nowhere else.

A payload is one 1-D uint8 tensor::

    header (64 B) | dims (ndim x u64) | chunk table (nchunks x 16 B) | codes | sm | rem | esc
    [| sums (u32 per 4096 elements, when the header flag CHECKSUM is set)]

All integers are little-endian. The header ends with a CRC-32 of itself and
the dims, so a damaged header is refused before any field is used. The tensor is cut into chunks of
``chunk_elems`` elements (the last may be shorter); each chunk is coded on its
own and stored either CODED or RAW. Every stream is the concatenation, in
chunk order, of each chunk's byte-aligned segment; a segment's length follows
from its chunk-table entry (``segment_nbytes``), so any chunk can be located
with a prefix sum and decoded independently (one Triton program per chunk).

Element fields. A float word splits into an exponent field ``e`` (8 bits for
bf16/fp32, 5 for fp16) and the sign+mantissa field ``sm`` (the other bits,
sign on top). ``sm`` is shipped raw: 1 byte for bf16, 3 for fp32, and for fp16
its low 8 bits as a byte plus its top 3 bits in the 3-bit ``rem`` stream. An
fp32 chunk whose low 16 bits are all zero (exact bf16 casts, as FSDP2's fp32
reduce-scatter input) sets LOW16 and ships 1 byte of ``sm`` per element.

Exponent codes. No histogram is taken: the exponent pmf of Gaussian data has
a fixed shape whose position moves with sigma. A chunk's locator is the mean
exponent over its normal elements (0 < e < emax), computed exactly in integers
so every backend agrees: ``q = floor(4 * sum(e) / count)``, ``base = q >> 2``,
``phase = q & 3``. The tables below place the codes around ``base`` for each
quarter-exponent ``phase``.

* ``fixed3``: 3 bits per element. Codes 0..6 are the exponents ``lo..lo+6``
  with ``lo = clamp(base + FIXED_LO[phase])``; code 7 is ESC. If at least 1/64
  of the chunk is exactly +0.0 the chunk sets ZERO_SLOT: code 0 means +0.0
  (its sm byte is not shipped) and codes 1..6 are ``lo..lo+5``.
* ``dense``: a tiered prefix code. Tier ``t`` is a stream of ``TIER_BITS[t]``-bit
  digits, one per element still *open* at that tier; digit values below the
  all-ones value are symbols, all-ones means "continue". The symbol order is
  ``DENSE_ORDER[phase]`` (10 exponent offsets from ``base``) with ZERO (+0.0)
  last, or first when at least 1/8 of the chunk is +0.0 (ZERO_FIRST). An
  element still open after the last tier is ESC. Decoding a tier is one
  vectorized step (prefix sum of the open mask), so the code is parallel.

ESC elements ship their exponent field as one byte in ``esc``. A chunk whose
coded size is not smaller than its raw size is stored RAW: its ``sm`` segment
holds the raw element bytes.

Integrity (``verify``): with the header flag CHECKSUM, ``sums`` holds, for
each run of CHUNK_ELEMS elements of the *original* tensor, the u32
``sum(mix(word_i ^ key_i)) mod 2**32`` over its unsigned words, where i counts
from 0 within the run, ``key_i = (i | dtype_code << 16) * SUM_KEY_MUL mod
2**32`` (so a payload relabelled to another dtype of the same width does not
verify) and ``mix`` is
the bijection of 32-bit values ``h = h * SUM_MUL1; h ^= h >> 15;
h = h * SUM_MUL2; h ^= h >> 16`` (products mod 2**32). The decoder recomputes
it on what it produced. A change of one element always changes the sum (mix is
a bijection); a change of several elements escapes with probability about
2**-32. (The first definition, ``sum(word_i * (2 i + 1))``, was linear: it
missed any change whose differences cancel against the weights, such as the
three-element change one damaged byte of the fp16 ``rem`` stream makes, two
fp32 sign flips in one chunk, or a chunk's exponents all shifted by an even
amount; the decode fuzzer found the first.)
"""
from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

import torch

from ._layout import staged, to_device
from .errors import CorruptPayloadError

MAGIC = b"ZCCL"
VERSION = 1
HEADER_NBYTES = 64
CHUNK_ENTRY_NBYTES = 16
CHUNK_ELEMS = 4096  # one Triton program per chunk; table overhead 16 B per 8 KiB of bf16
MAX_CHUNK_ELEMS = 65535  # counts in the chunk table are u16
MAX_NDIM = 16

CODEC_IDS = {"raw": 0, "fixed3": 1, "dense": 2}
CODEC_NAMES = {v: k for k, v in CODEC_IDS.items()}

# Chunk modes and flags.
MODE_RAW = 0
MODE_CODED = 1
FLAG_LOW16 = 1  # fp32 chunk whose low 16 bits are all zero
FLAG_ZERO = 2  # fixed3: ZERO_SLOT; dense: ZERO_FIRST

# Thresholds, as integer comparisons every backend evaluates identically.
FIXED_ZERO_SLOT_SHIFT = 6  # ZERO_SLOT when n_zero << 6 >= n   (>= 1/64 of the chunk)
DENSE_ZERO_FIRST_SHIFT = 3  # ZERO_FIRST when n_zero << 3 >= n  (>= 1/8)

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
ZERO_SYMBOL = 127  # sentinel offset meaning "+0.0" in an order table

# Pinned tables (derived by ``derive_tables`` from the Gaussian model; a test
# checks they still agree). Offsets are relative to ``base``.
DENSE_ORDER = (
    (1, 0, 2, -1, -2, -3, -4, -5, 3, -6),
    (1, 2, 0, -1, -2, -3, 3, -4, -5, -6),
    (1, 2, 0, -1, 3, -2, -3, -4, -5, -6),
    (2, 1, 0, 3, -1, -2, -3, -4, -5, -6),
)
FIXED_LO = (-4, -3, -3, -3)  # 7-wide window start per phase
FIXED_LO_ZERO = (-3, -3, -2, -2)  # 6-wide window start per phase (ZERO_SLOT)


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

    def sm_nbytes(self, low16: bool) -> int:
        """Bytes of the sm plane per coded element (fp16's top 3 bits go to rem)."""
        if self.dtype == torch.float32:
            return 1 if low16 else 3
        return 1


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


# --------------------------------------------------------------------------
# Header
# --------------------------------------------------------------------------
_HEADER = struct.Struct("<4sBBBBQII4QII")
assert _HEADER.size == HEADER_NBYTES
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
    codes_nbytes: int
    sm_nbytes: int
    rem_nbytes: int
    esc_nbytes: int
    flags: int = 0

    @property
    def nsums(self) -> int:
        """Checksums stored (one per CHUNK_ELEMS elements), 0 without CHECKSUM."""
        return nchunks_for(self.numel) if self.flags & HEADER_FLAG_CHECKSUM else 0

    @property
    def table_offset(self) -> int:
        return HEADER_NBYTES + 8 * len(self.shape)

    @property
    def streams_offset(self) -> int:
        return self.table_offset + CHUNK_ENTRY_NBYTES * self.nchunks

    @property
    def total_nbytes(self) -> int:
        return self.sums_offset + 4 * self.nsums

    @property
    def sums_offset(self) -> int:
        return (self.streams_offset + self.codes_nbytes + self.sm_nbytes
                + self.rem_nbytes + self.esc_nbytes)

    def pack(self) -> bytes:
        info = DTYPES[self.dtype]
        fields = (MAGIC, VERSION, CODEC_IDS[self.codec], info.code, len(self.shape),
                  self.numel, self.chunk_elems, self.nchunks, self.codes_nbytes,
                  self.sm_nbytes, self.rem_nbytes, self.esc_nbytes, self.flags)
        dims = struct.pack(f"<{len(self.shape)}Q", *self.shape)
        crc = zlib.crc32(_HEADER.pack(*fields, 0)[:HEADER_NBYTES - 4] + dims)
        return _HEADER.pack(*fields, crc) + dims

    def to_tensor(self, device: torch.device) -> torch.Tensor:
        """``pack()`` as a uint8 tensor on ``device``, without a host sync."""
        return to_device(self._bytes(), device)

    def copy_into(self, out: torch.Tensor) -> None:
        """Write ``pack()`` at the start of the uint8 tensor ``out``, without a host sync."""
        head = staged(self._bytes(), out.device)
        out[:head.numel()].copy_(head, non_blocking=True)

    def _bytes(self) -> torch.Tensor:
        return torch.frombuffer(bytearray(self.pack()), dtype=torch.uint8)


def nchunks_for(numel: int, chunk_elems: int = CHUNK_ELEMS) -> int:
    return -(-numel // chunk_elems)


def parse_header(payload: torch.Tensor) -> Header:
    """Read and validate the header; raises CorruptPayloadError for anything off."""
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
     codes, sm, rem, esc, flags, crc) = _HEADER.unpack(raw[:HEADER_NBYTES])
    if magic != MAGIC:
        raise CorruptPayloadError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise CorruptPayloadError(f"unknown format version {version} (this build reads {VERSION})")
    if ndim <= MAX_NDIM and n >= HEADER_NBYTES + 8 * ndim:
        if zlib.crc32(raw[:HEADER_NBYTES - 4] + raw[HEADER_NBYTES:HEADER_NBYTES + 8 * ndim]) != crc:
            raise CorruptPayloadError("header checksum mismatch: the header is damaged")
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
    if math.prod(shape) != numel:
        raise CorruptPayloadError(f"shape {shape} does not hold numel {numel}")
    info = DTYPE_BY_CODE[dtype_code]
    codec = CODEC_NAMES[codec_id]
    if codec == "raw":
        if chunk_elems or nchunks or codes or rem or esc or sm != numel * info.itemsize:
            raise CorruptPayloadError("raw payload with inconsistent lengths")
    else:
        if not (8 <= chunk_elems <= MAX_CHUNK_ELEMS) or chunk_elems % 8:
            raise CorruptPayloadError(f"chunk_elems {chunk_elems} out of range")
        if nchunks != nchunks_for(numel, chunk_elems):
            raise CorruptPayloadError(f"nchunks {nchunks} disagrees with numel {numel}")
        if max(sm, codes) > numel * info.itemsize or esc > numel or rem > numel:
            raise CorruptPayloadError("stream lengths exceed what numel allows")
    header = Header(codec, info.dtype, tuple(shape), numel, chunk_elems, nchunks,
                    codes, sm, rem, esc, flags)
    if header.total_nbytes != n:
        raise CorruptPayloadError(f"payload has {n} bytes, header says {header.total_nbytes}")
    return header


def max_encoded_nbytes(numel: int, dtype: torch.dtype, ndim: int = 1, verify: bool = False) -> int:
    """An upper bound on the payload size of any codec (chunks never expand)."""
    info = dtype_info(dtype)
    return (HEADER_NBYTES + 8 * ndim + (CHUNK_ENTRY_NBYTES + 4 * verify) * nchunks_for(numel)
            + numel * info.itemsize)


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
    (DENSE_ORDER, FIXED_LO, FIXED_LO_ZERO) as pinned above."""
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
    lo7 = tuple(best_window(d, 7) for d in acc)
    lo6 = tuple(best_window(d, 6) for d in acc)
    return order, lo7, lo6


def dense_symbol_table(zero_first: bool, phase: int) -> tuple:
    """Symbols in rank order: offsets from base, ZERO_SYMBOL for +0.0."""
    order = DENSE_ORDER[phase]
    return (ZERO_SYMBOL,) + order if zero_first else order + (ZERO_SYMBOL,)


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


# --------------------------------------------------------------------------
# The chunk table and segment lengths (torch ops: shared by every backend)
# --------------------------------------------------------------------------
TIER_START = tuple(sum(TIER_SYMBOLS[:t]) for t in range(len(TIER_BITS)))  # first rank of tier t


@dataclass
class ChunkTable:
    """Per-chunk fields as int64 tensors of length nchunks."""
    mode: torch.Tensor
    flags: torch.Tensor
    base: torch.Tensor
    phase: torch.Tensor
    n_zero: torch.Tensor
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


def chunk_lengths(numel: int, nchunks: int, chunk_elems: int, device) -> torch.Tensor:
    n = torch.full((nchunks,), chunk_elems, dtype=torch.int64, device=device)
    if nchunks:
        n[-1] = numel - (nchunks - 1) * chunk_elems
    return n


def packed_nbytes(count: torch.Tensor, bits: int) -> torch.Tensor:
    return (count * bits + 7) >> 3


def segment_nbytes(codec: str, info: DTypeInfo, n: torch.Tensor, table: ChunkTable):
    """Bytes of each chunk's segment in (codes, sm, rem, esc), each (nchunks,)."""
    coded = table.mode == MODE_CODED
    kept = n - table.n_zero
    if codec == "fixed3":
        codes = packed_nbytes(n, FIXED_BITS)
    else:
        counts = torch.cat([n[:, None], table.n_open], 1)
        bits = torch.tensor(TIER_BITS, device=n.device)
        codes = packed_nbytes(counts, bits).sum(1)
    if info.dtype == torch.float32:
        smb = torch.where((table.flags & FLAG_LOW16) != 0, 1, 3)
    else:
        smb = torch.ones_like(n)
    sm = torch.where(coded, kept * smb, n * info.itemsize)
    zero = torch.zeros_like(n)
    rem = packed_nbytes(kept, REM_BITS) if info.dtype == torch.float16 else zero
    return (torch.where(coded, codes, zero), sm, torch.where(coded, rem, zero),
            torch.where(coded, table.n_esc, zero))


def validate_table(codec: str, info: DTypeInfo, n: torch.Tensor, table: ChunkTable) -> None:
    """Reject table entries no encoder writes; bounds every later index."""
    bad = (table.mode > MODE_CODED) | (table.phase > 3) | (table.base > info.emax)
    bad |= (table.flags & ~(FLAG_LOW16 | FLAG_ZERO)) != 0
    if info.dtype != torch.float32:
        bad |= (table.flags & FLAG_LOW16) != 0
    bad |= (table.n_zero > n) | (table.n_esc > n)
    raw = table.mode == MODE_RAW
    fields = torch.cat([table.base[:, None], table.phase[:, None], table.flags[:, None],
                        table.n_zero[:, None], table.n_esc[:, None], table.n_open], 1)
    bad |= raw & (fields != 0).any(1)
    if codec == "fixed3":
        bad |= (table.n_open != 0).any(1)
        bad |= ((table.flags & FLAG_ZERO) == 0) & (table.n_zero != 0)
    else:
        chain = torch.cat([n[:, None], table.n_open, table.n_esc[:, None]], 1)
        bad |= (chain[:, 1:] > chain[:, :-1]).any(1)
    if bool(bad.any()):
        c = int(bad.nonzero()[0, 0])
        raise CorruptPayloadError(f"chunk table entry {c} is invalid")
