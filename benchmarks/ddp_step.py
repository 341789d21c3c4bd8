"""DDP step time on the plain loopback: DDP's own all-reduce, torch's Python
``allreduce_hook``, zipccl's hook, and zipccl's hook made to wait for each
bucket (how it ran before raw buckets returned torch's pending Work).

Two gloo ranks of one thread each train four copies of one MLP (the same
initial weights and data), each wrapped in DDP with small buckets so that
communication can overlap backward. Each step picks a copy from a seeded
generator (the same on both ranks); the table gives median step times and
their ratios to DDP's own. On this link the adaptive policy sends every
bucket raw, so the hook's results equal DDP's default bit for bit on two
ranks (checked at the end).

    python benchmarks/ddp_step.py                    # 8 x 1024 wide, 120 steps
    python benchmarks/ddp_step.py --width 512 --steps 60
"""
from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import run_gloo_ranks  # noqa: E402

from zipccl_fsdp import zipccl_hook  # noqa: E402

WAYS = ("ddp", "torch_hook", "zipccl", "zipccl_waits")


def _waiting_hook(state, bucket):
    """zipccl's hook, blocking until the bucket is reduced."""
    fut = zipccl_hook(state, bucket)
    fut.wait()
    return fut


def measure(width: int, layers: int, batch: int, steps: int, bucket_mb: float) -> dict:
    torch.manual_seed(0)
    base = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])
    models = {way: DDP(copy.deepcopy(base), bucket_cap_mb=bucket_mb) for way in WAYS}
    models["torch_hook"].register_comm_hook(None, default_hooks.allreduce_hook)
    models["zipccl"].register_comm_hook(None, zipccl_hook)
    models["zipccl_waits"].register_comm_hook(None, _waiting_hook)
    opts = {way: torch.optim.SGD(m.parameters(), lr=1e-3) for way, m in models.items()}
    data = {way: torch.Generator().manual_seed(dist.get_rank()) for way in WAYS}
    times = {way: [] for way in WAYS}
    order = random.Random(0)
    for i in range(steps + 3 * len(WAYS)):
        way = WAYS[i % len(WAYS)] if i < 3 * len(WAYS) else order.choice(WAYS)  # warm-up first
        x = torch.randn(batch, width, generator=data[way])
        dist.barrier()
        t0 = time.perf_counter()
        opts[way].zero_grad(set_to_none=True)
        models[way](x).square().mean().backward()
        opts[way].step()
        if i >= 3 * len(WAYS):
            times[way].append(time.perf_counter() - t0)
    # Equal step counts per way would make the weights comparable; the draw
    # does not, so compare one more step of each from equal weights instead.
    same = True
    for way in WAYS[1:]:
        models[way].module.load_state_dict(models["ddp"].module.state_dict())
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(7 + dist.get_rank()))
    grads = {}
    for way in WAYS:
        models[way].zero_grad(set_to_none=True)
        models[way](x).square().mean().backward()
        grads[way] = [p.grad.view(torch.int32).clone() for p in models[way].parameters()]
    for way in WAYS[1:]:
        same &= all(torch.equal(a, b) for a, b in zip(grads["ddp"], grads[way]))
    return {**{way: statistics.median(t) * 1e3 for way, t in times.items()},
            "n": {way: len(t) for way, t in times.items()}, "bitwise_equal": same}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=120, help="timed steps, all ways together")
    p.add_argument("--bucket-mb", type=float, default=4.0, help="DDP's bucket_cap_mb")
    args = p.parse_args(argv)
    params = args.layers * (args.width * args.width + args.width)
    print(f"ddp_step: 2 gloo ranks, plain loopback, {args.layers} x Linear({args.width}) fp32 "
          f"({params * 4 / 2**20:.0f} MiB of gradients, {args.bucket_mb:g} MiB buckets), "
          f"batch {args.batch}, {args.steps} timed steps in a seeded random order")
    results = run_gloo_ranks("ddp_step", measure, (args.width, args.layers, args.batch,
                                                   args.steps, args.bucket_mb), timeout_s=300)
    if results is None:
        return 2
    print("median step ms (steps timed) per way, and ratios to DDP's own")
    print(f"{'rank':<6}" + "".join(f"{w:>19}" for w in WAYS)
          + "".join(f"{w + '/ddp':>18}" for w in WAYS[1:]) + f"{'bitwise':>9}")
    for rank, r in sorted(results.items()):
        print(f"{rank:<6}" + "".join(f"{r[w]:>13.1f} ({r['n'][w]:>3})" for w in WAYS)
              + "".join(f"{r[w] / r['ddp']:>18.3f}" for w in WAYS[1:])
              + f"{str(r['bitwise_equal']):>9}")
    return 0 if all(r["bitwise_equal"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
