"""Data and references for the collective tests, shared by the test modules
and by benchmarks/gpu_check.py (which may run where pytest is not installed,
so nothing here imports it).

``make_data`` is deterministic per (seed, rank): a rank can rebuild any other
rank's input, which lets a check compute its reference without trusting a
collective. References reduce in fp32 in rank order with numpy, independent
of the implementation; comparisons are of integer views, never float values.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from zipccl_fsdp.config import ZipCCLConfig

# torch's own all-gather, the reference (bound here, before any test wraps it).
from zipccl_fsdp.protocol import all_gather_single as torch_all_gather_single  # noqa: E402
INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


# --------------------------------------------------------------------------
# Data and rank bodies (run inside the ranks)
# --------------------------------------------------------------------------
def make_data(n: int, dtype: torch.dtype, seed: int, rank: int,
              kind: str = "gauss") -> torch.Tensor:
    """Rank-specific data: Gaussian at a rank-dependent scale, with specials
    (NaN, +-inf, -0.0, zeros, a subnormal) at positions no other rank uses, so
    every fp32 sum has at most one special operand per element."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(n, generator=g) * (0.02 * (rank + 1))
    specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-40])
    for i, v in enumerate(specials):
        pos = 13 * (i * 8 + rank) + 5
        if pos < n:
            x[pos] = v
    if kind == "bf16cast":  # FSDP2's fp32 reduce input: exact casts of bf16 gradients
        x = x.bfloat16().float()
    return x.to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(INT_VIEW[t.dtype])


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype)
    g, w = bits(got), bits(want)
    if not torch.equal(g, w):
        bad = (g != w).nonzero().flatten()[:5].tolist()
        raise AssertionError(f"{what}: {int((g != w).sum())} elements differ, first at {bad}: "
                             f"{g[bad].tolist()} vs {w[bad].tolist()}")


def gather_all(x: torch.Tensor, group=None) -> list:
    """Every rank's ``x`` (equal numel), moved as raw bytes by torch."""
    world = dist.get_world_size(group)
    raw = x.contiguous().view(torch.uint8)
    out = torch.empty(world * raw.numel(), dtype=torch.uint8)
    torch_all_gather_single(out, raw, group=group)
    return [p.view(x.dtype) for p in out.chunk(world)] if raw.numel() else [x[:0]] * world


def reference_reduce(parts: list, op: str, factor: float, dtype: torch.dtype) -> torch.Tensor:
    """fp32 sum in rank order (numpy float32), then AVG / PREMUL_SUM, cast, and
    every NaN made the positive quiet NaN without payload (``NAN_BITS``)."""
    acc = None
    for p in parts:
        v = p.float().numpy().astype(np.float32)
        if op == "premul_sum":
            v = v * np.float32(factor)
        acc = v.copy() if acc is None else acc + v
    if op == "avg":
        acc = acc / np.float32(len(parts))
    out = torch.from_numpy(acc).to(dtype)
    out.view(BITS[dtype.itemsize])[out.isnan()] = NAN_BITS[dtype]
    return out


NAN_BITS = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00, torch.float32: 0x7FC00000}
"""The one NaN a reduction returns, per dtype."""
BITS = {2: torch.int16, 4: torch.int32}


def make_op(op: str, factor: float):
    if op == "sum":
        return ReduceOp.SUM
    if op == "avg":
        return ReduceOp.AVG
    return dist._make_nccl_premul_sum(factor)


OPS = (("sum", 1.0), ("avg", 1.0), ("premul_sum", 0.37))
"""(op, factor) pairs the reduction tests cover."""


def forced(pieces: int, codec: str) -> ZipCCLConfig:
    """A config that compresses every message with ``codec`` in ``pieces`` pieces."""
    return ZipCCLConfig(policy="always", min_bytes=0, codec=codec, pipeline_pieces=pieces)


def check_reduce_scatter(x: torch.Tensor, n: int, op: str, factor: float, what: str,
                         **kwargs) -> None:
    """zipccl's ``reduce_scatter_single`` of ``x`` (world x ``n`` elements, into
    an output prefilled with 7.0) equals the rank-order reference bit for bit;
    ``kwargs`` go to the call (``config``, ``stats``)."""
    from zipccl_fsdp.collectives import reduce_scatter_single

    rank = dist.get_rank()
    parts = [p[rank * n:(rank + 1) * n] for p in gather_all(x)]
    want = reference_reduce(parts, op, factor, x.dtype)
    got = torch.full((n,), 7.0, dtype=x.dtype)
    reduce_scatter_single(got, x, make_op(op, factor), **kwargs)
    assert_bits_equal(got, want, what)
