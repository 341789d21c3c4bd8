"""Soak: a tiny FSDP2 model trained for many steps with the zipccl hook; RSS must stay flat.

Two gloo ranks train a 2-block MLP (dim 128; ``fully_shard`` per block and on
the root, bf16 parameters, fp32 reduce) with ``ZipCCLHook(ZipCCLConfig(
policy="always", min_bytes=0, verify=True))``, so every all-gather and reduce-scatter is
compressed and checksummed. Each rank samples its resident set size
(``/proc/self/statm``, after a ``gc.collect()``) at a few steps and checks the
hook's statistics: calls == steps x calls per step (counted after step 1),
every call compressed, no fallback.

Pass: RSS at the last step within ``--rss-tolerance`` (2%) of RSS at step 100.

Usage::

    python benchmarks/soak.py --steps 1000
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import run_gloo_ranks  # noqa: E402

DIM, HIDDEN, BATCH = 128, 256, 16
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def soak(steps: int, samples: tuple = (1, 100), verify: bool = True, hook: bool = True) -> dict:
    """Run inside an initialized gloo group; return RSS samples and stats checks.
    ``hook=False`` trains with torch's own comms (the baseline)."""
    import zipccl_fsdp.hooks.fsdp2  # noqa: F401  (adds FSDPModule.register_comm_hook)
    from zipccl_fsdp.hooks.registry import ZipCCLHook
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from zipccl_fsdp.config import ZipCCLConfig

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.Linear(DIM, 1))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    mpp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model[:2]:
        fully_shard(block, mesh=mesh, mp_policy=mpp)
    fully_shard(model, mesh=mesh, mp_policy=mpp)
    zhook = ZipCCLHook(ZipCCLConfig(policy="always", min_bytes=0, verify=verify))
    if hook:
        model.register_comm_hook(zhook)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)
    data = [torch.randn(BATCH, DIM, generator=g) for _ in range(8)]
    rss, per_step = {}, None
    wanted = set(samples) | {steps}
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        x = data[step % len(data)]
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 1:
            s = zhook.stats()
            per_step = {k: s[k]["calls"] for k in ("all_gather", "reduce_scatter")}
        if step in wanted:
            gc.collect()
            rss[step] = rss_bytes()
    elapsed = time.perf_counter() - t0
    s = zhook.stats()
    stats = {k: {f: s[k][f] for f in ("calls", "compressed_calls", "fallback_calls")}
             for k in ("all_gather", "reduce_scatter")}
    consistent = not hook or all(stats[k]["calls"] == steps * per_step[k]
                     and stats[k]["compressed_calls"] == stats[k]["calls"]
                     and stats[k]["fallback_calls"] == 0 for k in stats)
    return dict(rss=rss, per_step=per_step, stats=stats, consistent=consistent,
                step_ms=1e3 * elapsed / steps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--no-hook", action="store_true", help="torch's comms (baseline)")
    ap.add_argument("--rss-tolerance", type=float, default=0.02)
    args = ap.parse_args(argv)
    world = 2
    samples = tuple(s for s in (1, 10, 100, 250, 500, 750) if s < args.steps)
    results = run_gloo_ranks("soak", soak, (args.steps, samples, not args.no_verify,
                                            not args.no_hook), world=world, timeout_s=60)
    if results is None:
        return 2
    ok = True
    ref = 100 if args.steps >= 100 else 1
    print(f"soak: {args.steps} steps, 2 gloo ranks, FSDP2 + "
          + ("torch's comms" if args.no_hook else
             f"zipccl hook (min_bytes=0, verify={not args.no_verify})"))
    for rank in range(world):
        res = results[rank]
        rss = res["rss"]
        growth = rss[args.steps] / rss[ref] - 1
        ok &= abs(growth) <= args.rss_tolerance and res["consistent"]
        print(f"rank {rank}: RSS MiB " + ", ".join(f"step {k}: {v / 2**20:.1f}"
                                                   for k, v in sorted(rss.items()))
              + f"; step {args.steps} vs {ref}: {100 * growth:+.2f}%")
        print(f"rank {rank}: calls per step {res['per_step']}, totals {res['stats']}, "
              f"consistent={res['consistent']}, {res['step_ms']:.1f} ms/step")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
