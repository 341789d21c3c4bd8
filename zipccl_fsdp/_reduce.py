"""The reduction of a reduce-scatter and of an all-reduce (``pipeline.py``).

The chunks are summed in fp32 in rank order 0..world-1, then AVG divides by
the world size, every NaN becomes the canonical quiet NaN, and the sum is
cast to the output's dtype.

Why the NaNs: which NaN an add returns depends on where the element falls in
the kernel (torch's vectorised CPU add keeps an operand's payload, its scalar
tail and CUDA return a default NaN), so without it the bits of a NaN result
would depend on how a call is cut into pieces and on the device.
"""
from __future__ import annotations

import torch

from ._layout import overlaps


class RankOrderSum:
    """An fp32 accumulator for ``out`` (flat), fed one rank's chunk at a time.

    ``op`` is a parsed reduce op (``kind`` in sum/avg/premul_sum, ``factor``).
    The accumulator is ``out`` itself when that is fp32 and does not overlap
    ``flat_in`` (the reduce's input, still to be read)."""

    def __init__(self, out: torch.Tensor, flat_in: torch.Tensor, op) -> None:
        self.out = out
        self.op_kind = op.kind
        self.acc = out if (out.dtype == torch.float32 and not overlaps(out, flat_in)) else \
            torch.empty(out.numel(), dtype=torch.float32, device=out.device)
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.to(device=self.acc.device, dtype=torch.float32).reshape(())
        self.factor = factor

    def add(self, src: torch.Tensor, r: int, a: int = 0, b: int | None = None) -> None:
        """Add rank ``r``'s ``src`` into elements ``[a, b)`` (all by default)."""
        # Multiply and add as separate roundings (no fused alpha), like NCCL's
        # PREMUL_SUM and like the reference the tests use.
        dst = self.acc[a:b]
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
            # fp32 is exact), and faster on a CPU (docs/benchmarks.md).
            dst.add_(src.to(torch.float32))

    def finish(self, world: int) -> None:
        """Scale (AVG) and cast the sum into ``out``."""
        if self.op_kind == "avg":
            self.acc.div_(world)
        self.acc.masked_fill_(self.acc.isnan(), float("nan"))
        if self.acc is not self.out:
            self.out.copy_(self.acc)
