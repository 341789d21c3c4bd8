"""Encode (format v3): ``encode(x, codec) -> payload``, byte-identical to
codec_torch.encode, in one kernel per call and one host sync.

The codec's kernel (fixed3_encode.py, dense_encode.py) runs one program per
chunk: each reads its chunk once, writes its table entry, places its segment
by the decoupled look-back over ``status`` (_lookback.py: no prefix sum in
a kernel of its own, no host read between kernels) and writes it, padding
included; the last chunk's program stores the body length. The payload is
allocated at its bound (``format.max_encoded_nbytes`` for x's ndim) before
the launch, so nothing the kernel computes is needed to allocate.

Host syncs: one. The body length is the value the host needs (the payload's
size): it is read once, after the kernel, through pinned memory
(``_read_units``). The header, which holds that length and a CRC-32 over it,
is written by the kernel's last program (``_lookback.store_total``) from a
template the plan packs once: the header with a body length of 0, and the
CRC's change per bit of the length (CRC-32 is affine over GF(2) for a fixed
message length), so the device does one xor-reduction of 64 lanes, not a
serial CRC loop, and the host writes no header bytes.

Scratch: one int64 buffer per (device, plan) and thread, a ring of ``m``
launch regions (``_Ring``): each region is the ticket counter, the body
length, the header template (``_region_words``) and one look-back status
word per chunk. A call uses the next region; when all are used, one copy
restores every region to its initial words (zeros, the template), so a
zeroing serves ``m`` calls. A call takes its ring out of the thread's cache
and puts it back only after its length read, when the kernel is done, so no
two calls in flight share one (another thread, another stream, a call that
raised).

Host work per call is otherwise the payload's allocation, the launch
(``_launch.Bound``: the plan's int arguments and their key computed once)
and the length read: what depends on the data.
"""
from __future__ import annotations

import ctypes
import functools
import itertools
import math
import struct
import threading
import zlib
from types import MappingProxyType
from typing import NamedTuple

import torch

from zipccl_fsdp import format as F
from zipccl_fsdp._layout import to_device

from ._codec_common import tile_shape
from ._launch import Bound, Launcher
from ._lookback import HEADER_WORDS
from .dense_encode import dense_encode_kernel
from .fixed3_encode import fixed3_encode_kernel

_INT_VIEW = {2: torch.int16, 4: torch.int32}
# Warps per program, by codec: fixed3 encode runs 2 warps, 64 elements a
# thread (its per-thread scans, look-back and statistics over twice the
# elements; the hot path takes up to 64 a thread: fixed3_encode.py); the
# dense kernels take 32 elements a thread of a 4096-element chunk, so 4.
# Read-only: a caller that wants another count (gpu_check.py --sweep)
# passes ``warps`` to ``encode``. Decode's are codec_decode.Tuning's.
WARPS = MappingProxyType({"fixed3": 2, "dense": 4})


def launch_plan(info: F.DTypeInfo, codec: str, C: int, warps: int | None = None) -> tuple:
    """(kernel, constexprs, num_warps) of the encode launch, at ``warps``
    warps a program (default ``WARPS[codec]``)."""
    return _launch_plan(info, codec, C, WARPS[codec] if warps is None else warps)


@functools.lru_cache(maxsize=256)
def _launch_plan(info: F.DTypeInfo, codec: str, C: int, warps: int) -> tuple:
    cp, t = tile_shape(C, warps)
    const = dict(ITEMSIZE=info.itemsize, EXP_BITS=info.exp_bits, MAN_BITS=info.man_bits)
    if codec == "fixed3":
        return fixed3_encode_kernel, dict(const, CP=cp, T=t), warps
    if C != 32 * 32 * warps:  # 32 elements a thread (dense_decode.py's tile)
        raise NotImplementedError(f"the Triton dense kernels take chunks of "
                                  f"{32 * 32 * warps} elements, not {C}")
    return dense_encode_kernel, dict(const, C=C, T=32 * warps), warps


@functools.lru_cache(maxsize=256)
def _launcher(info: F.DTypeInfo, codec: str, C: int, warps: int) -> Launcher:
    return Launcher(*_launch_plan(info, codec, C, warps))


def launcher(info: F.DTypeInfo, codec: str, C: int, warps: int | None = None) -> Launcher:
    """The encode ``Launcher`` (compiled kernels and fixed arguments kept per
    dtype, codec, chunk size and warps, default ``WARPS[codec]``; the size
    class is the specialization key each Launcher keeps)."""
    return _launcher(info, codec, C, WARPS[codec] if warps is None else warps)


# A launch region of the scratch, in int64 words: the ticket counter (its
# low int32), the body length, then what _lookback.store_total reads after
# it (the header template, its word count, the CRC terms), then the status
# words from STATUS on (16-byte aligned).
TICKET, TOTAL, TEMPLATE = 0, 1, 2
NWORDS = TEMPLATE + HEADER_WORDS.value
TERMS = NWORDS + 1
STATUS = TERMS + 64 + 1
assert STATUS % 2 == 0 and 8 * HEADER_WORDS.value == F.HEADER_NBYTES + 8 * F.MAX_NDIM


def launch_args(kernel, x_words, out, scratch, numel, nch, C, header) -> tuple:
    """The kernel's runtime arguments in order (``scratch``: one launch
    region of ``region_nwords(nch)`` int64 words)."""
    return _tensor_args(x_words, out, scratch, 0, nch) + _int_args(kernel, numel, nch, C, header)


def region_nwords(nch: int) -> int:
    """int64 words of one launch region of a plan of ``nch`` chunks (even, so
    each region starts 16-byte aligned)."""
    return STATUS + nch + (nch & 1)


def _tensor_args(x_words, out, words, base, nch) -> tuple:
    """The input, the payload, and the region of ``words`` at ``base`` as the
    ticket, the look-back status words and the body length (the kernel's
    order)."""
    return (x_words, out, words[base + TICKET:base + TICKET + 1].view(torch.int32),
            words[base + STATUS:base + STATUS + nch], words[base + TOTAL:base + TOTAL + 1])


def _int_args(kernel, numel, nch, C, header) -> tuple:
    """The int arguments (the dense kernel takes the chunk size as a
    constexpr, fixed3 as an argument)."""
    offs = (header.table_offset, header.offsets_offset, header.body_offset)
    return (numel, nch) + ((C,) if kernel is fixed3_encode_kernel else ()) + offs


def _region_words(header: F.Header) -> list:
    """A launch region's initial words before the status words (which start
    at zero, as the ticket and the body length do): the header packed with a
    body length of 0, zero after it, then how many words it takes, then for
    each bit i of the body-length field (bytes 24..31) the CRC-32 of the
    CRC'd bytes (format: the first 60 and the dims) with only that bit set
    xor that of as many zero bytes."""
    head = F.HeaderBytes(header).with_body(0)
    n = F.HEADER_NBYTES - 4 + 8 * len(header.shape)  # the CRC'd bytes
    zero = zlib.crc32(bytes(n))
    terms = []
    for i in range(64):
        m = bytearray(n)
        m[F._BODY_AT + i // 8] = 1 << (i % 8)
        terms.append(zlib.crc32(m) ^ zero)
    tpl = struct.unpack(f"<{HEADER_WORDS.value}q", bytes(head).ljust(8 * HEADER_WORDS.value, b"\0"))
    return [0, 0, *tpl, len(head) // 8, *terms, 0]


def initial_region(header: F.Header) -> torch.Tensor:
    """A launch region for ``header``'s plan in its initial words (CPU,
    int64, ``region_nwords(header.nchunks)``): ``_region_words``, then zero
    status words."""
    head = _region_words(header)
    region = torch.zeros(region_nwords(header.nchunks), dtype=torch.int64)
    region[:len(head)] = torch.tensor(head, dtype=torch.int64)
    return region


def _words(x: torch.Tensor, word: torch.dtype) -> torch.Tensor:
    """x's elements as integer words (a kernel indexes them flat, so a
    contiguous x of any shape is viewed in place)."""
    return x.view(word) if x.is_contiguous() else x.reshape(-1).view(word)


class _Plan(NamedTuple):
    """What an encode of one dtype, codec and shape launches with, computed
    once (the host work per call is then the payload's allocation, the
    launch and the length read)."""
    launch: Bound  # the int arguments (``ints``) bound
    nch: int
    bound: int  # payload bytes allocated: format.max_encoded_nbytes for this ndim
    body_offset: int
    ints: tuple
    region: torch.Tensor  # a launch region's initial words (CPU, int64)
    word: torch.dtype
    uid: int  # the plan's key in a thread's kept rings


def _check_size(numel: int, info: F.DTypeInfo) -> None:
    if numel * info.itemsize > F.MAX_BODY_NBYTES - F.ALIGN:
        raise ValueError(f"a tensor of {numel * info.itemsize} bytes exceeds what format "
                         f"version {F.VERSION} addresses ({F.MAX_BODY_NBYTES - F.ALIGN} bytes)")


@functools.lru_cache(maxsize=1024)
def _plan(dtype: torch.dtype, codec: str, shape: tuple, C: int, warps: int) -> _Plan:
    info = F.dtype_info(dtype)
    numel = math.prod(shape)
    _check_size(numel, info)  # raises each call: lru_cache keeps no exception
    nch = F.nchunks_for(numel, C)
    header = F.Header(codec, dtype, tuple(shape), numel, C, nch, 0)
    launch = _launcher(info, codec, C, warps)
    # The bound of format.max_encoded_nbytes, for this chunk size: a chunk
    # never takes more than its raw bytes rounded up to 16, and C * itemsize
    # is a multiple of 16 (C % 8 == 0).
    bound = header.body_offset + F.align16(numel * info.itemsize)
    ints = _int_args(launch.kernel, numel, nch, C, header)
    return _Plan(launch.bind(ints), nch, bound, header.body_offset, ints, initial_region(header),
                 _INT_VIEW[info.itemsize], next(_UIDS))


_UIDS = itertools.count()


_PINNED: dict = {}
_TLS = threading.local()
SCRATCH_KEPT = 64  # rings a thread keeps (distinct plans), the least recently used dropped
RING = 32  # launch regions a ring holds at most: calls per restoring copy
RING_WORDS = 1 << 13  # a ring's int64 words, beyond which it holds fewer regions (at least 1)


class _Ring:
    """A thread's scratch for one plan on one device: ``m`` launch regions
    of ``stride`` words in ``words``, each call the next (``take``)."""
    __slots__ = ("words", "init", "stride", "m", "next", "addresses", "totals", "cuda")

    def __init__(self, plan: _Plan, device: torch.device):
        stride = plan.region.numel()
        self.m = max(1, min(RING, RING_WORDS // stride))
        self.init = to_device(plan.region, device)  # a region's initial words, on the device
        self.words = self.init.repeat(self.m)
        self.stride = stride
        self.next = 0
        base = self.words.data_ptr()
        self.addresses = [base + 8 * stride * r for r in range(self.m)]
        self.totals = [self.words[r * stride + TOTAL:r * stride + TOTAL + 1] for r in range(self.m)]
        self.cuda = device.type == "cuda"

    def take(self) -> int:
        """The region of this call, each region in its initial words: when
        all have been used, one copy restores them all."""
        r = self.next
        if r == self.m:
            self.words.view(self.m, self.stride).copy_(self.init.expand(self.m, self.stride))
            r = 0
        self.next = r + 1
        return r


def _take_ring(device: torch.device, plan: _Plan) -> _Ring:
    """This thread's ring for ``plan`` on ``device`` (its cache holds it only
    between calls)."""
    kept = _TLS.__dict__.get("rings")
    if kept is None:
        kept = _TLS.rings = {}
    got = kept.pop((device, plan.uid), None)
    return _Ring(plan, device) if got is None else got


def _keep_ring(device: torch.device, plan: _Plan, ring: _Ring) -> None:
    """Back into this thread's cache (most recent last), once the kernel
    that used it is done."""
    kept = _TLS.rings
    if len(kept) >= SCRATCH_KEPT:
        del kept[next(iter(kept))]
    kept[(device, plan.uid)] = ring


def _read_units(ring: _Ring, r: int) -> int:
    """The body length in 16-byte units: the call's one device-to-host read,
    through a pinned buffer (one per device, reused: the read waits for it)."""
    total = ring.totals[r]
    if not ring.cuda:
        return int(total.item())
    got = _PINNED.get(total.device)
    if got is None:
        buf = torch.empty(1, dtype=torch.int64, pin_memory=True)
        # the value, read from host memory without a torch op
        got = _PINNED[total.device] = (buf, ctypes.c_int64.from_address(buf.data_ptr()))
    got[0].copy_(total)  # to pinned memory, not non_blocking: waits for the current stream
    return got[1].value


def encode(x: torch.Tensor, codec: str, warps: int | None = None) -> torch.Tensor:
    """The payload of ``x`` (contiguous) with ``codec``, the kernel at
    ``warps`` warps a program (default ``WARPS[codec]``)."""
    if x.numel() == 0 or codec == "raw":
        info = F.dtype_info(x.dtype)
        _check_size(x.numel(), info)
        return _encode_trivial(x, codec, info)
    plan = _plan(x.dtype, codec, x.shape, F.CHUNK_ELEMS,
                 WARPS[codec] if warps is None else warps)
    if not x.is_contiguous():
        x = x.reshape(-1)
    device = x.device
    out = torch.empty(plan.bound, dtype=torch.uint8, device=device)
    ring = _take_ring(device, plan)
    r = ring.take()
    # The kernel's pointers as addresses (no views; see _tensor_args for the
    # tensors): the ticket, the status words, the body length.
    s = ring.addresses[r]
    plan.launch(plan.nch, (x.data_ptr(), out.data_ptr(), s, s + 8 * STATUS, s + 8 * TOTAL),
                _launch_tensors, x, out, ring, r, plan)
    body = F.ALIGN * _read_units(ring, r)
    _keep_ring(device, plan, ring)
    # cut to its length in place (the storage stays the bound's, as a slice's
    # would; no view object)
    return out.resize_(plan.body_offset + body)


def _launch_tensors(x, out, ring, r, plan) -> tuple:
    """The encode launch's arguments with tensors (triton's path)."""
    return _tensor_args(_words(x, plan.word), out, ring.words, r * ring.stride, plan.nch) + plan.ints


def _encode_trivial(x: torch.Tensor, codec: str, info: F.DTypeInfo) -> torch.Tensor:
    """raw (header + the words) and empty tensors: no kernel needed."""
    raw = codec == "raw"
    body = x.numel() * info.itemsize if raw else 0
    header = F.Header(codec, x.dtype, tuple(x.shape), x.numel(), 0 if raw else F.CHUNK_ELEMS,
                      0, body)
    out = torch.empty(header.total_nbytes, dtype=torch.uint8, device=x.device)
    header.copy_into(out)
    if raw:
        out[header.body_offset:].copy_(x.reshape(-1).view(torch.uint8))
    return out
