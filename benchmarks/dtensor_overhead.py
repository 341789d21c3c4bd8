"""What turning on DTensor compression costs where every collective goes raw.

Two gloo ranks, a tensor-parallel stack of blocks (sequence-parallel norm,
colwise and rowwise linears: all-gathers, reduce-scatters and all-reduces
through DTensor), on the plain loopback, where the default config's adaptive
policy sends every collective raw. Steps alternate in a seeded random order
(the same on both ranks) between torch alone and inside
``compress_dtensor_comms()``; the table gives median forward + backward
times. Beside it, the cost per non-collective op: a loop of small ``add``
ops with compression on and off.

    python benchmarks/dtensor_overhead.py
    python benchmarks/dtensor_overhead.py --blocks 4 --dim 256 --steps 200
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import run_gloo_ranks  # noqa: E402

import zipccl_fsdp  # noqa: E402
from zipccl_fsdp.config import ZipCCLConfig  # noqa: E402


class _Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.w1 = nn.Linear(dim, 4 * dim)
        self.w2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.w2(torch.relu(self.w1(self.norm(x))))


def _model(blocks: int, dim: int, mesh) -> nn.Module:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    torch.manual_seed(0)
    model = nn.Sequential(*[_Block(dim) for _ in range(blocks)])
    plan = {}
    for i in range(blocks):
        plan.update({f"{i}.norm": SequenceParallel(),
                     f"{i}.w1": ColwiseParallel(input_layouts=Shard(1)),
                     f"{i}.w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)})
    return parallelize_module(model, mesh, plan)


def measure(blocks: int, dim: int, seq: int, steps: int, ops: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _model(blocks, dim, mesh)
    cfg = ZipCCLConfig()
    torch.manual_seed(1)
    x = distribute_tensor(torch.randn(4, seq, dim), mesh, [Shard(1)])

    def step():
        model.zero_grad(set_to_none=True)
        model(x).to_local().square().sum().backward()

    def compressed_step():
        with zipccl_fsdp.compress_dtensor_comms(cfg):
            step()

    ways = {"torch": step, "zipccl": compressed_step}
    for fn in ways.values():  # warm-up; the policy calibrates
        fn()
        fn()
    times = {way: [] for way in ways}
    order = random.Random(0)
    for _ in range(steps):
        way = order.choice(list(ways))
        dist.barrier()
        t0 = time.perf_counter()
        ways[way]()
        times[way].append(time.perf_counter() - t0)
    a, b = torch.randn(16), torch.randn(16)
    per_op = {}
    for way in ("torch", "zipccl", "torch", "zipccl"):
        ctx = zipccl_fsdp.compress_dtensor_comms(cfg) if way == "zipccl" else None
        if ctx is not None:
            ctx.__enter__()
        t0 = time.perf_counter()
        for _ in range(ops):
            torch.add(a, b)
        per_op[way] = min(per_op.get(way, 1e9), (time.perf_counter() - t0) / ops)
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return {"step_ms": {w: statistics.median(t) * 1e3 for w, t in times.items()},
            "n": {w: len(t) for w, t in times.items()},
            "op_us": {w: v * 1e6 for w, v in per_op.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=200, help="timed steps, both ways together")
    p.add_argument("--ops", type=int, default=20000, help="add ops per per-op timing")
    args = p.parse_args(argv)
    print(f"dtensor_overhead: 2 gloo ranks, plain loopback, {args.blocks} TP blocks of dim "
          f"{args.dim}, batch 4 x seq {args.seq}, {args.steps} steps in a seeded random order "
          f"(medians); per-op cost: best of 2 loops of {args.ops} small adds")
    results = run_gloo_ranks("dtensor_overhead", measure,
                             (args.blocks, args.dim, args.seq, args.steps, args.ops),
                             timeout_s=300)
    if results is None:
        return 2
    print(f"{'rank':<6}{'torch step ms':>15}{'zipccl step ms':>16}{'zipccl/torch':>14}"
          f"{'add us':>9}{'add us, on':>12}")
    for rank, r in sorted(results.items()):
        s, o = r["step_ms"], r["op_us"]
        print(f"{rank:<6}{s['torch']:>10.2f} ({r['n']['torch']:>3}){s['zipccl']:>11.2f} "
              f"({r['n']['zipccl']:>3}){s['zipccl'] / s['torch']:>14.3f}{o['torch']:>9.2f}"
              f"{o['zipccl']:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
