"""The reduction of a reduce-scatter and of an all-reduce (``pipeline.py``).

The chunks are summed in fp32 in rank order 0..world-1, then AVG divides by
the world size, the sum is cast to the output's dtype, and every NaN becomes
the canonical one: the positive quiet NaN without payload (``CANONICAL_NAN``).

Why the NaNs: which NaN an add or a cast returns depends on where the element
falls in the kernel and on the device (torch's vectorised CPU add keeps an
operand's payload, its scalar tail and CUDA return a default NaN; its
vectorised bf16 cast writes 0xFFFF, c10's scalar one 0x7FC0, CUDA's 0x7FFF),
so without it the bits of a NaN result would depend on how a call is cut into
pieces and on the machine. The canonical bits are written through an integer
view, so they are the same on every device.

``torch_sums_alike`` says when torch's own all-reduce gives the same bits
(two ranks, SUM, gloo), so that a raw all-reduce can be torch's.
"""
from __future__ import annotations

import torch

from . import codec_cpp as _codec_cpp
from ._layout import overlaps


class Op:
    """A parsed reduce op (``collectives.dispatch.parse_op``): ``kind`` in
    sum/avg/premul_sum, and PREMUL_SUM's ``factor``."""

    __slots__ = ("kind", "factor")

    def __init__(self, kind: str, factor=None) -> None:
        self.kind = kind
        self.factor = factor


SUM = Op("sum")
AVG = Op("avg")


class RankOrderSum:
    """An fp32 accumulator for ``out`` (flat), fed one rank's chunk at a time,
    ranks 0..world-1 in order for every element.

    ``op`` is a parsed reduce op (``kind`` in sum/avg/premul_sum, ``factor``).
    The accumulator is ``out`` itself when that is fp32 and does not overlap
    ``flat_in`` (the reduce's input, still to be read).

    On a CPU whose C++ library is loaded (``codec_cpp.loaded``: a codec call
    of this process built it; the sum never builds it), a SUM or AVG of bf16
    or fp32 chunks widens, adds and asks for NaNs in one pass (``codec_cpp.sum_add``), and a bf16
    result is cast with its NaNs made canonical in the same pass
    (``codec_cpp.sum_to_bf16``): the same bits as the torch ops below, with
    no pass of its own for the NaN test (docs/benchmarks.md, "Rank-order
    sum")."""

    def __init__(self, out: torch.Tensor, flat_in: torch.Tensor, op, world: int) -> None:
        self.out = out
        self.op_kind = op.kind
        self.world = world
        self.acc = out if (out.dtype == torch.float32 and not overlaps(out, flat_in)) else \
            torch.empty(out.numel(), dtype=torch.float32, device=out.device)
        self.factor = _fp32_factor(op.factor, self.acc.device)
        self.ext = _sum_library(self.acc) if op.kind != "premul_sum" else None
        self.nan = False   # some element's final sum is NaN (of those in `probed`)
        self.probed = 0    # elements whose last add said whether it is NaN

    def add(self, src: torch.Tensor, r: int, a: int = 0, b: int | None = None) -> None:
        """Add rank ``r``'s ``src`` into elements ``[a, b)`` (all by default)."""
        dst = self.acc[a:b]
        if self.ext is not None and src.dtype in _LOOP_DTYPES and src.is_contiguous():
            nan = _codec_cpp.sum_add(self.ext, dst, src, first=r == 0)
            if r == self.world - 1:
                self.nan = self.nan or nan
                self.probed += dst.numel()
            return
        # Multiply and add as separate roundings (no fused alpha), like NCCL's
        # PREMUL_SUM and like the reference the tests use.
        if r == 0:
            dst.copy_(src)
            if self.op_kind == "premul_sum":
                dst.mul_(self.factor)
        elif self.op_kind == "premul_sum":
            term = src.to(torch.float32, copy=True)
            term.mul_(self.factor)
            dst.add_(term)
        else:
            # Widen first: the same bits as a mixed-dtype add_ (bf16/fp16 ->
            # fp32 is exact), and faster on a CPU (docs/benchmarks.md, "Rank-order sum").
            dst.add_(src.to(torch.float32))

    def finish(self) -> None:
        """Scale (AVG) and cast the sum into ``out``."""
        known = self.nan if self.probed == self.acc.numel() else None
        _finish(self.acc, self.out, self.op_kind, self.world, known, self.ext)


_LOOP_DTYPES = (torch.bfloat16, torch.float32)
"""What the C++ loops add; fp16 keeps torch's ops, whose own widening is faster
than widening for the loops."""


def _sum_library(acc: torch.Tensor):
    """The loaded C++ library where the sum's loops may run on ``acc``, else None."""
    if acc.device.type != "cpu" or not acc.is_contiguous():
        return None
    return _codec_cpp.loaded()


def sum_rows(out: torch.Tensor, rows: torch.Tensor, op) -> None:
    """``out`` (flat) := the rank-order sum of ``rows`` (one row per rank, the
    whole tensors of an all-gather), which it may overwrite: element by
    element the operations of ``RankOrderSum`` (widen, premultiply, add in
    rank order 0..world-1, scale, cast, make NaNs canonical), so the same
    bits, in a few whole-tensor ops instead of a few per rank."""
    world = rows.shape[0]
    if rows.dtype != torch.float32:
        rows = rows.float()  # exact
    if op.kind == "premul_sum":
        rows.mul_(_fp32_factor(op.factor, rows.device))
    acc = rows[0]
    for r in range(1, world):
        acc.add_(rows[r])
    _finish(acc, out, op.kind, world)


def torch_sums_alike(world: int, op, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether torch's SUM all-reduce of ``world`` ranks, finished by
    ``finish_torch_sum``, gives the bits of the rank-order reduction with ``op``.

    On two ranks every element is one addition, ``a + b``, and addition is
    commutative, so no order can differ. In fp32 that addition is the
    rank-order sum's own (and AVG then divides it as ``RankOrderSum`` does);
    in bf16 and fp16 gloo adds in c10's scalar types (widen to fp32, add,
    round once to nearest even), and the rank-order sum adds in fp32 and
    rounds the result: the same value, since fp32 carries at least twice
    their precision plus two bits (rounding twice then equals rounding once).
    Their AVG would divide a rounded sum, so it is not alike; nor is
    PREMUL_SUM, which multiplies before adding. Only gloo (CPU tensors):
    NCCL's algorithms (NVLS reduces in the switch) are not checked here.
    The NaNs' bits are ``finish_torch_sum``'s."""
    return (world == 2 and device.type == "cpu"
            and (op.kind == "sum" or (op.kind == "avg" and dtype == torch.float32)))


def finish_torch_sum(t: torch.Tensor, op, world: int) -> None:
    """What turns torch's SUM of ``t`` (flat) into the rank-order reduction
    where ``torch_sums_alike``: AVG's division, then canonical NaNs. A bf16
    sum is left as it is: gloo adds bf16 in c10's scalar type, whose cast
    from fp32 returns ``CANONICAL_NAN`` for every NaN (its payload and sign
    dropped), so there is nothing to rewrite and no pass over the result;
    fp16's cast keeps the sign and fp32 the operand's payload."""
    if op.kind == "avg":
        t.div_(world)
    if t.dtype != torch.bfloat16:
        canonical_nans(t)


CANONICAL_NAN = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00, torch.float32: 0x7FC00000}
"""Per dtype, the bits every NaN of a reduction's result has: the positive
quiet NaN without payload (what c10's scalar casts from fp32 return)."""

_BITS = {2: torch.int16, 4: torch.int32}


def canonical_nans(t: torch.Tensor, source: torch.Tensor | None = None) -> None:
    """Make every NaN of ``t`` (flat, bf16, fp16 or fp32) ``CANONICAL_NAN``'s
    bits, written through an integer view (a float fill would go through the
    device's cast, whose NaN differs between devices). ``source``: an fp32
    tensor ``t`` was cast from, which holds a NaN where ``t`` does (a cast
    makes no NaN of a number, nor a number of a NaN), asked instead of ``t``
    whether there is any: its maximum is the cheaper one to take on a CPU
    (docs/benchmarks.md, "Rank-order sum")."""
    if not _may_hold_nan(t if source is None else source):
        return
    t.view(_BITS[t.element_size()]).masked_fill_(t.isnan(), CANONICAL_NAN[t.dtype])


def _may_hold_nan(t: torch.Tensor) -> bool:
    """False only when ``t`` holds no NaN. On a CPU its maximum tells (torch's
    propagates NaN, and only a NaN element makes it NaN), in one vectorised
    pass, without the mask ``isnan`` writes. Elsewhere reading it would be
    a host sync, so always True."""
    if t.device.type != "cpu":
        return True
    return t.numel() > 0 and bool(torch.isnan(t.amax()))


def _fp32_factor(factor, device):
    """A PREMUL_SUM factor as the sums use it: a Python number, or a 0-dim fp32 tensor."""
    if isinstance(factor, torch.Tensor):
        return factor.to(device=device, dtype=torch.float32).reshape(())
    return factor


def _finish(acc: torch.Tensor, out: torch.Tensor, kind: str, world: int,
            nan: bool | None = None, ext=None) -> None:
    """Scale (AVG) the fp32 sum ``acc``, cast it into ``out``, make the NaNs
    canonical (after the cast, which may change them). ``nan``: whether
    ``acc`` holds a NaN, where the adds found out (None: not known, asked
    here); ``ext``: the C++ library for a bf16 cast, which writes canonical
    NaNs itself."""
    if kind == "avg":
        acc.div_(world)  # a NaN stays one, and no number becomes one
    if acc is not out:
        if ext is not None and out.dtype == torch.bfloat16 and out.is_contiguous():
            _codec_cpp.sum_to_bf16(ext, out, acc)
            return
        out.copy_(acc)
    if nan is None:
        canonical_nans(out, acc)
    elif nan:
        canonical_nans(out)
