"""Decode (format v3): one kernel, no host read before it when the caller
holds the output.

``decode_into(payload, out)`` (every collective's call: ``out`` given)
launches ``decode_kernel`` on what the host already holds: the payload's
length and ``out``'s dtype and numel; the chunk count follows from numel and
``format.CHUNK_ELEMS``. Every program checks the header on the device
(magic, version, codec, dtype and numel against ``out``, chunk geometry,
body length, flags, reserved bytes, and the total length against the
payload's); program 0 also checks the header's CRC-32 (a bitwise loop over
its 60 + 8 ndim bytes, in one program while the others decode their
chunks), the dims (their product is numel) and the zero padding
after the dims and after the offsets. Then each program decodes its chunks
(``PER`` of them: one, or several for fixed3 calls of many chunks,
``chunks_per_program``; fixed3_decode.py, dense_decode.py; RAW payloads are
copied) and ORs what it found wrong into one error word, which the host
reads once, at the end (the call's one sync). Nothing is decoded by a
program whose header check failed, and every load is masked to the
payload, so no payload, however corrupt, reads out of bounds; a payload
whose header is valid but whose body is not may leave ``out`` partially
written before the error is raised.

``DENSE`` and ``FIXED3`` say which codecs' branches the kernel is compiled
with. A kernel holds the registers of its largest path, so the kernel of
both runs fixed3 at dense's occupancy: a decode launches the kernel of the
codec its geometry's payloads have had, which program 0 reports in the
error word (``_Plan``); the first call of a geometry, and a geometry that
has had both, take the kernel of both. tools/offline.py counts each codec's
kernel, the one a collective's calls run.

The error path is not hot: it reads the header on the host
(``format.parse_header``) and runs the torch reference's checks, so the
messages are the torch backend's.

A payload whose chunk size is not ``format.CHUNK_ELEMS`` (no encoder of
this build writes one unless the constant is patched) sets ERR_GEOMETRY and
nothing is decoded; the host then reads the header and launches again with
its chunk size. ``decode(payload, header, out)``, for a header the caller
has parsed (``zipccl_fsdp.decode`` without ``out``: it reads the header
once to allocate), launches with the header's geometry directly.
"""
from __future__ import annotations

import dataclasses
import functools
import threading

import torch
import triton
import triton.language as tl

from zipccl_fsdp import format as F
from zipccl_fsdp.errors import CorruptPayloadError

from . import _codec_common as K
from ._codec_common import (ERR_CODEC, ERR_GEOMETRY, ERR_HEADER, ERR_PADDING, INFO_CODEC_SHIFT,
                            INFO_SUMS, align16, byte_field, pad_nonzero, tile_shape)
from ._launch import Launcher
from .dense_decode import dense_decode_chunk
from .fixed3_decode import decode_raw_words, fixed3_decode_chunk

_INT_VIEW = {2: torch.int16, 4: torch.int32}


@dataclasses.dataclass(frozen=True)
class Tuning:
    """How decode programs are shaped. ``TUNING`` is what every call uses
    unless it passes another (``decode_into``, ``decode``): gpu_check.py
    --sweep times others, and the kernel tests force each path."""

    warps: int = 4
    """Warps a program of the kernel of both codecs (a geometry's first
    call) and of dense's own."""
    fixed3_warps_16: int = 2
    """Warps a program of fixed3's own kernel for 16-bit elements: 64
    elements a thread (its per-thread work, the entry and header checks and
    the scan, over twice the elements)."""
    fixed3_warps_32: int = 4
    """The same for fp32: 32 elements a thread, whose tile of twice the
    bytes spills at 64 (docs/benchmarks.md, "Kernel cost (offline SASS)")."""
    per_choices: tuple = (4,)
    """Chunks a fixed3 program may take (``chunks_per_program``), most
    first: 4 once a call still leaves ``programs_wanted`` programs of 4,
    several waves of programs over a large GPU's SMs, so the last wave's
    idle SMs cost little; a program checks the header once for all its
    chunks (docs/benchmarks.md, "Kernel cost (offline SASS)": the counts at
    1, 2, 4 and 8)."""
    programs_wanted: int = 2048
    """Programs a call keeps at least when its programs take several chunks."""


TUNING = Tuning()
MAGIC_U32 = tl.constexpr(int.from_bytes(F.MAGIC, "little"))
VERSION = tl.constexpr(F.VERSION)
CRC_POLY = tl.constexpr(0xEDB88320)  # zlib's CRC-32, reflected
assert F.CODEC_IDS == {"raw": 0, "fixed3": 1, "dense": 2}
_KERNEL_OF_CODEC = (None, "fixed3", "dense", None)  # by codec id (RAW: any kernel)


@triton.jit
def _crc32(p_ptr, nbytes, pay_nbytes):
    """zlib.crc32 of the header's first 60 bytes and the dims that follow its
    CRC field (``nbytes`` = 60 + 8 ndim of them), bit by bit."""
    crc = tl.full([], 0xFFFFFFFF, tl.int64)
    # A constant trip count with a branch: the interpreter takes no reduced
    # value as a loop bound.
    for k in range(0, 60 + 8 * 16):
        if k < nbytes:
            at = tl.where(k < 60, k, k + 4)
            crc = crc ^ tl.load(p_ptr + at, mask=at < pay_nbytes, other=0).to(tl.int64)
            for _ in tl.static_range(8):
                crc = (crc >> 1) ^ (CRC_POLY & (0 - (crc & 1)))
    return crc ^ 0xFFFFFFFF


@triton.jit
def _dims_bad(p_ptr, ndim, numel, pay_nbytes):
    """Whether the dims' product is not numel (format.parse_header), without
    overflow: with numel 0 some dim must be 0; else each partial product
    stays at most numel."""
    k = tl.arange(0, 128)
    v = tl.load(p_ptr + 64 + k, mask=(k < 8 * ndim) & (64 + k < pay_nbytes), other=0)
    prod = tl.full([], 1, tl.int64)
    over = prod == 0
    zero = prod == 0
    for j in tl.static_range(16):
        d = byte_field(v, k, 8 * j, 8)
        live = j < ndim
        zero = zero | (live & (d == 0))
        over = over | (live & ((d < 0) | ((d != 0) & (prod > numel // tl.maximum(d, 1)))))
        prod = tl.where(live & ~over, prod * d, prod)
    return tl.where(numel == 0, ~zero, over | (prod != numel))


@triton.jit(noinline=True)
def _header_rest(p_ptr, ndim, numel, pay_nbytes, table_off, gap, body_off, crc):
    """Program 0's part of the header check (cold code: once per call): the
    CRC-32, the dims, the zero padding after the dims and after the offsets."""
    hdr = (_crc32(p_ptr, 60 + 8 * ndim, pay_nbytes) != crc) | _dims_bad(p_ptr, ndim, numel,
                                                                          pay_nbytes)
    padbad = pad_nonzero(p_ptr, 64 + 8 * ndim, table_off, pay_nbytes)
    padbad = padbad | pad_nonzero(p_ptr, gap, body_off, pay_nbytes)
    return tl.where(hdr, ERR_HEADER, 0) | tl.where(padbad, ERR_PADDING, 0)


@triton.jit
def decode_kernel(p_ptr, out_ptr, err_ptr, pay_nbytes, numel, nch, C, nsums, body_only,
                  DTYPE_CODE: tl.constexpr, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                  MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr,
                  DENSE: tl.constexpr, FIXED3: tl.constexpr = True, PER: tl.constexpr = 1):
    g = tl.program_id(0)  # this program's chunks: PER g .. PER g + PER - 1
    numel = numel + tl.zeros([], tl.int64)  # int64 products below (numel may be a constexpr 1)
    # --- the header, checked against the payload and the caller ---
    # The payload is 16-byte aligned (_aligned): words, not bytes.
    w32 = p_ptr.to(tl.pointer_type(tl.int32))
    w64 = p_ptr.to(tl.pointer_type(tl.int64))
    m = pay_nbytes >= 64
    word1 = tl.load(w32 + 1, mask=m, other=0)
    codec = (word1 >> 8) & 0xFF
    ndim = (word1 >> 24) & 0xFF
    ce = tl.load(w32 + 4, mask=m, other=0).to(tl.int64) & 0xFFFFFFFF
    hnch = tl.load(w32 + 5, mask=m, other=0).to(tl.int64) & 0xFFFFFFFF
    body = tl.load(w64 + 3, mask=m, other=0)
    flags = tl.load(w32 + 14, mask=m, other=0)
    reserved = tl.load(w64 + 4, mask=m, other=0) | tl.load(w64 + 5, mask=m, other=0) | tl.load(
        w64 + 6, mask=m, other=0)
    bad = ~m | (tl.load(w32, mask=m, other=0) != MAGIC_U32)
    bad = bad | ((word1 & 0xFF) != VERSION) | (codec > 2) | (ndim > 16)
    bad = bad | (((word1 >> 16) & 0xFF) != DTYPE_CODE) | (tl.load(w64 + 1, mask=m, other=0) != numel)
    bad = bad | (reserved != 0) | ((flags & ~1) != 0)
    is_raw = codec == 0
    bad = bad | (is_raw & ((ce != 0) | (hnch != 0) | (body != numel * ITEMSIZE)))
    geometry = ~is_raw & (ce != C)
    bad = bad | (~is_raw & ~geometry & ((hnch != nch) | ((body & 15) != 0) | (body < 0)
                                        | (body > align16(numel * ITEMSIZE) + 16 * nch)))
    table_off = align16(64 + 8 * ndim)
    nchunks = tl.where(is_raw, 0, nch)
    offsets_off = table_off + 16 * nchunks
    body_off = align16(offsets_off + 4 * nchunks)
    end = body_off + body
    total = end + 4 * nsums * (flags & 1)
    bad = bad | (~geometry & (pay_nbytes != total) & ((body_only == 0) | (pay_nbytes != end)))
    err = tl.where(bad, ERR_HEADER, tl.where(geometry, ERR_GEOMETRY, 0))
    if g == 0:
        if err == 0:
            err = _header_rest(p_ptr, ndim, numel, pay_nbytes, table_off, offsets_off + 4 * nchunks,
                               body_off, tl.load(w32 + 15).to(tl.int64) & 0xFFFFFFFF)
        err = err | tl.where((flags & 1) != 0, INFO_SUMS, 0)
        err = err | ((codec & 3) << INFO_CODEC_SHIFT)

    # --- the chunks ---
    if (err & (ERR_HEADER | ERR_GEOMETRY)) == 0:
        for j in range(PER):
            c = g * PER + j
            if c < nch:
                err = err | _decode_chunk(p_ptr, out_ptr, c, numel, nch, C, is_raw, codec,
                                          table_off, offsets_off, body_off, body, ITEMSIZE,
                                          EXP_BITS, MAN_BITS, CP, T, DENSE, FIXED3)
    # Every thread ORs the same bits in: a scalar atomic is thread 0's, whose
    # id the compiler then keeps across the chunk loop (a spill on sm_80).
    lanes = err + tl.zeros([T], tl.int32)
    tl.atomic_or(err_ptr + tl.zeros([T], tl.int32), lanes, mask=lanes != 0)


@triton.jit
def _decode_chunk(p_ptr, out_ptr, c, numel, nch, C, is_raw, codec, table_off, offsets_off,
                  body_off, body, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                  MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr,
                  DENSE: tl.constexpr, FIXED3: tl.constexpr):
    """Chunk c of a payload whose header has been checked: its error bits."""
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)
    dst = out_ptr + start
    err = tl.zeros([], tl.int32)
    if is_raw:
        decode_raw_words(p_ptr + body_off + start * ITEMSIZE, dst, n, n * ITEMSIZE,
                         ITEMSIZE, CP, T)
    elif (codec == 1) & FIXED3:
        err = fixed3_decode_chunk(p_ptr, dst, c, n, nch, table_off, offsets_off, body_off,
                                  body, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
    elif codec == 2:
        if DENSE:
            err = dense_decode_chunk(p_ptr, dst, c, n, nch, table_off, offsets_off, body_off,
                                     body, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
        else:
            err = err | ERR_CODEC
    else:
        err = err | ERR_CODEC
    return err


@functools.lru_cache(maxsize=64)
def launcher(info: F.DTypeInfo, C: int, per: int = 1, codecs: str = "both",
             tuning: Tuning = TUNING) -> Launcher:
    """The decode ``Launcher`` for chunks of C elements, ``per`` chunks a
    program, with the branches of ``codecs`` ("fixed3", "dense" or "both";
    RAW payloads decode in each; the dense chunk decoder takes any tile: a
    chunk of 4096 elements is its hot path, others decode in sub-blocks,
    dense_decode.py), at ``tuning``'s warps. Compiled kernels and fixed
    arguments are kept per dtype, chunk size, ``per``, ``codecs`` and
    warps; the size class is the specialization key each Launcher keeps."""
    warps = decode_warps(info, codecs, tuning)
    cp, t = tile_shape(C, warps)
    return Launcher(decode_kernel, dict(DTYPE_CODE=info.code, ITEMSIZE=info.itemsize,
                                        EXP_BITS=info.exp_bits, MAN_BITS=info.man_bits, CP=cp,
                                        T=t, DENSE=codecs != "fixed3", FIXED3=codecs != "dense",
                                        PER=per), warps)


def decode_warps(info: F.DTypeInfo, codecs: str, tuning: Tuning = TUNING) -> int:
    """Warps a program of the kernel of ``codecs`` for ``info``'s dtype."""
    if codecs != "fixed3":
        return tuning.warps
    return tuning.fixed3_warps_16 if info.itemsize == 2 else tuning.fixed3_warps_32


def _aligned(payload: torch.Tensor) -> torch.Tensor:
    """The payload, or a copy at a 16-byte aligned address (a device copy, no
    sync): the dense decoder reads the table and codes in 4- and 8-byte words."""
    return payload if payload.data_ptr() % 16 == 0 else payload.clone()


def chunks_per_program(nch: int, codecs: str = "fixed3", tuning: Tuning = TUNING) -> int:
    """How many chunks one decode program takes: for the fixed3 kernel the
    most of ``tuning.per_choices`` that still leaves at least
    ``tuning.programs_wanted`` programs, else 1. Every program checks the header before its chunks,
    so a program of several chunks checks it once for all of them; a call
    of few chunks keeps one a program, so its programs still fill every SM
    of the GPU at once. The dense kernel, and the kernel of both codecs, are
    near the register limit at one chunk a program: a chunk loop makes them
    spill."""
    if codecs == "fixed3":
        for per in tuning.per_choices:
            if nch >= per * tuning.programs_wanted:
                return per
    return 1


class _Plan:
    """A decode geometry (dtype, numel, chunk size, whether the payload stops
    at its sums, warps): its launches, one per kernel, made on first use,
    and which kernel its next call takes.

    The host does not know a payload's codec before the launch (reading it
    would be a sync), but a geometry's payloads nearly always share one: the
    first call launches the kernel of both codecs, whose program 0 reports
    the header's codec in the error word (INFO_CODEC_SHIFT), and
    later calls launch that codec's own kernel. The kernel of one codec
    holds fewer registers a thread than the kernel of both (more programs
    an SM) and, for fixed3, takes several chunks a program. A payload of
    the other codec decodes nothing in it (ERR_CODEC, no chunk written) and
    is decoded again by the kernel of both, which that geometry then keeps:
    one extra launch, once."""
    __slots__ = ("info", "C", "nch", "fixed", "word", "kernel", "tuning", "_launches")

    def __init__(self, dtype: torch.dtype, numel: int, C: int, body_only: int, tuning: Tuning):
        self.info = F.dtype_info(dtype)
        self.C = C
        self.tuning = tuning
        self.nch = F.nchunks_for(numel, C)
        self.fixed = (numel, self.nch, C, F.nchunks_for(numel), body_only)
        self.word = _INT_VIEW[self.info.itemsize]
        self.kernel = None  # None: not known yet; "fixed3", "dense"; "both": both seen
        self._launches = {}

    def launch(self, codecs: str) -> tuple:
        """(``launcher(...).bind(...)`` of the kernel of ``codecs``, its grid)."""
        hit = self._launches.get(codecs)
        if hit is None:
            per = chunks_per_program(self.nch, codecs, self.tuning)
            hit = self._launches[codecs] = (
                launcher(self.info, self.C, per, codecs, self.tuning).bind(self.fixed),
                -(-self.nch // per))
        return hit


@functools.lru_cache(maxsize=1024)
def _plan(dtype: torch.dtype, numel: int, C: int, body_only: int, tuning: Tuning) -> _Plan:
    """The ``_Plan`` of a geometry, made once per geometry and tuning."""
    return _Plan(dtype, numel, C, body_only, tuning)


def reset() -> None:
    """Forget compiled launchers and plans, and with them the kernel each
    geometry has learned to launch (``_Plan``): a benchmark that times each
    codec's own kernel at one size starts afresh."""
    launcher.cache_clear()
    _plan.cache_clear()


_TLS = threading.local()
ERR_RING = 64  # error words a thread's ring holds: calls per zeroing
ERR_STRIDE = 4  # int32 words between two (16 bytes: every word's address 16-byte aligned)


class _ErrRing:
    """A thread's error words on one device: ``ERR_RING`` words, each call
    the next (``take``); when all have been used, one ``zero_()`` clears
    them all for the next round."""
    __slots__ = ("words", "views", "addresses", "m", "next", "device")

    def __init__(self, device: torch.device):
        self.m = m = ERR_RING
        self.words = torch.zeros(m * ERR_STRIDE, dtype=torch.int32, device=device)
        self.views = [self.words[r * ERR_STRIDE:r * ERR_STRIDE + 1] for r in range(m)]
        base = self.words.data_ptr()
        self.addresses = [base + 4 * ERR_STRIDE * r for r in range(m)]
        self.next = 0
        self.device = device

    def take(self) -> int:
        r = self.next
        if r == self.m:
            self.words.zero_()
            r = 0
        self.next = r + 1
        return r


def _take_error_word(device: torch.device) -> tuple:
    """(this thread's error-word ring on ``device``, the index of this call's
    word, zero): the cache holds the ring only between calls
    (``_read_error`` puts it back once the kernel that ORs into its word is
    done), so no two calls in flight share one."""
    kept = _TLS.__dict__.get("err")
    if kept is None:
        kept = _TLS.err = {}
    ring = kept.pop(device, None)
    if ring is None:
        ring = _ErrRing(device)
    return ring, ring.take()


def _launch(plan: _Plan, codecs: str, payload, out) -> tuple:
    launch, programs = plan.launch(codecs)
    payload = _aligned(payload)
    err = _take_error_word(payload.device)
    if programs:
        # the pointers as addresses (no view of out as words): _launch.Bound
        ring, r = err
        launch(programs, (payload.data_ptr(), out.data_ptr(), ring.addresses[r], payload.numel()),
               _launch_tensors, payload, out, ring.views[r], plan.word, launch.fixed)
    return err


def _run(plan: _Plan, payload, out) -> int:
    """Launch the kernel the plan holds for its next call and read the error
    word; learn the payload's codec from it (see ``_Plan``)."""
    codecs = plan.kernel or "both"
    bits = _read_error(_launch(plan, codecs, payload, out))
    if bits & (ERR_HEADER.value | ERR_GEOMETRY.value):
        return bits
    seen = _KERNEL_OF_CODEC[(bits >> INFO_CODEC_SHIFT.value) & 3]  # None: a RAW payload
    if bits & ERR_CODEC.value and codecs != "both":
        plan.kernel = "both"  # this geometry's payloads have had both codecs
        bits = _read_error(_launch(plan, "both", payload, out))
    elif plan.kernel is None and seen is not None:
        plan.kernel = seen
    return bits


def _launch_tensors(payload, out, err, word, fixed) -> tuple:
    """The decode launch's arguments with tensors (triton's path)."""
    return (payload, out.view(word), err, payload.numel()) + fixed


def _read_error(err: tuple) -> int:
    """The error word: the call's one device-to-host read. The ring goes
    back to this thread's cache after it."""
    ring, r = err
    bits = int(ring.views[r].item())
    _TLS.err[ring.device] = ring
    return bits


def decode_into(payload: torch.Tensor, out: torch.Tensor, tuning: Tuning = TUNING) -> bool:
    """Decode into ``out`` (contiguous, on the payload's device, a dtype of the
    format), reading nothing before the launch; CorruptPayloadError (or the
    ValueError of a payload that holds another dtype or numel) after it.
    Returns whether the payload carries checksums (the caller checks them).
    ``tuning``: how the programs are shaped."""
    numel = out.numel()
    if numel == 0:  # no chunk, no program: the host checks the header
        F.dtype_info(out.dtype)
        return _decode_empty(payload, out)
    bits = _run(_plan(out.dtype, numel, F.CHUNK_ELEMS, 0, tuning), payload, out)
    if bits & ERR_GEOMETRY.value and not bits & ERR_HEADER.value:
        header = F.parse_header(payload)
        bits = _run(_plan(out.dtype, numel, header.chunk_elems, 0, tuning), payload, out)
    if bits & K.ERROR_MASK:
        _raise(payload, out, bits)
    return bool(bits & INFO_SUMS.value)


def _decode_empty(payload, out) -> bool:
    header = F.parse_header(payload)
    _check_out(header, out)
    return bool(header.flags & F.HEADER_FLAG_CHECKSUM)


def decode(payload: torch.Tensor, header: F.Header, out: torch.Tensor,
           tuning: Tuning = TUNING) -> torch.Tensor:
    """Decode a payload whose header the caller parsed (``payload`` may stop
    at the sums, as zipccl_fsdp.decode passes it)."""
    if header.numel == 0:
        return out
    C = header.chunk_elems or F.CHUNK_ELEMS
    bits = _run(_plan(out.dtype, header.numel, C, 1, tuning), payload, out)
    if bits & K.ERROR_MASK:
        _raise(payload, out, bits)
    return out


def _check_out(header: F.Header, out: torch.Tensor) -> None:
    if out.dtype != header.dtype or out.numel() != header.numel:
        raise ValueError(f"out is {out.dtype}[{out.numel()}], payload holds "
                         f"{header.dtype}[{header.numel}]")


def _raise(payload: torch.Tensor, out: torch.Tensor, bits: int):
    """The error path: the torch backend's checks, for its message."""
    from zipccl_fsdp import codec_torch
    header = F.parse_header(payload)  # raises for a damaged header
    _check_out(header, out)
    body, plain = payload, header
    if header.flags & F.HEADER_FLAG_CHECKSUM:
        body, plain = payload[:header.sums_offset], dataclasses.replace(header, flags=0)
    codec_torch.decode(body, plain, torch.empty_like(out))  # raises with the torch message
    if bits & ERR_CODEC.value:
        raise NotImplementedError(f"the Triton decoder of this build has no {header.codec} "
                                  f"kernel for chunks of {header.chunk_elems} elements")
    raise CorruptPayloadError(f"corrupt payload (error bits {bits:#x})")


__all__ = ["Tuning", "TUNING", "chunks_per_program", "decode", "decode_into", "decode_kernel",
           "launcher", "reset"]
_ = ERR_PADDING  # re-exported for tests
