"""What a raw zipccl call costs on top of torch's own, measured inside real calls.

Two gloo ranks on the plain (unthrottled) loopback, where the adaptive policy
sends everything raw. Per round, after a ``dist.barrier()``, either torch's
own collective or zipccl's (default config) runs; zipccl's rounds record time
stamps at its entry, just before and just after the torch call it hands over
to, and at its exit. A real call follows a blocking collective, and Python
right after one runs several times slower than in a hot loop (cold caches),
so the hot loop alone (``--hot``, the torch call stubbed out) understates the
cost.

    python benchmarks/raw_call_overhead.py                   # all_to_all and all_gather, 1 MiB
    python benchmarks/raw_call_overhead.py --mib 4 --rounds 400
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import run_gloo_ranks  # noqa: E402

import zipccl_fsdp.collectives as C  # noqa: E402
from zipccl_fsdp.config import ZipCCLConfig  # noqa: E402

_TORCH = {"all_to_all": ("all_to_all_single", dist, "all_to_all_single"),
          "all_gather": ("all_gather_single", C, "_all_gather_single")}
"""kind -> (zipccl function, module holding the torch call it hands to, its name)."""


def _buffers(kind: str, numel: int, world: int):
    x = torch.randn(numel).bfloat16()
    out = torch.empty(numel if kind == "all_to_all" else world * numel, dtype=x.dtype)
    return x, out


def measure(kind: str, mib: float, rounds: int, hot: int) -> dict:
    """On each rank: median microseconds of torch's call alone, and of zipccl's
    Python before and after the torch call it makes; the hot-loop cost."""
    world = dist.get_world_size()
    x, out = _buffers(kind, int(mib * (1 << 20)) // 2, world)
    cfg = ZipCCLConfig()
    ours_name, holder, attr = _TORCH[kind]
    ours = getattr(C, ours_name)
    real = getattr(holder, attr)
    for _ in range(5):  # calibrates the policy, which then keeps this loopback raw
        ours(out, x, config=cfg)
    marks: dict = {}

    def timed(*args, **kwargs):
        marks["in"] = time.perf_counter()
        result = real(*args, **kwargs)
        marks["out"] = time.perf_counter()
        return result

    alone, before, after = [], [], []
    for i in range(rounds):
        dist.barrier()
        if i % 2:
            setattr(holder, attr, timed)
            try:
                t0 = time.perf_counter()
                ours(out, x, config=cfg)
                t1 = time.perf_counter()
            finally:
                setattr(holder, attr, real)
            before.append(marks["in"] - t0)
            after.append(t1 - marks["out"])
        else:
            t0 = time.perf_counter()
            real(out, x)
            alone.append(time.perf_counter() - t0)
    setattr(holder, attr, lambda *a, **k: None)
    try:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(hot):
                ours(out, x, config=cfg)
            best = min(best, (time.perf_counter() - t0) / hot)
    finally:
        setattr(holder, attr, real)
    med = statistics.median
    return dict(torch_us=med(alone) * 1e6, before_us=med(before) * 1e6,
                after_us=med(after) * 1e6, hot_us=best * 1e6)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default="all_to_all,all_gather",
                   help="comma-separated, of all_to_all, all_gather (default: both)")
    p.add_argument("--mib", type=float, default=1.0,
                   help="message size: the all-to-all input, the all-gather shard (default 1)")
    p.add_argument("--rounds", type=int, default=300, help="rounds, half of them zipccl's")
    p.add_argument("--hot", type=int, default=2000, help="calls of the stubbed hot loop")
    args = p.parse_args(argv)
    print(f"raw_call_overhead: 2 gloo ranks, plain loopback, {args.mib:g} MiB bf16, "
          f"{args.rounds} rounds (medians, rank 0)")
    print(f"{'collective':<12}{'torch us':>10}{'zipccl before':>15}{'after':>8}"
          f"{'overhead':>10}{'hot loop':>10}")
    for kind in args.kinds.split(","):
        results = run_gloo_ranks("raw_call_overhead", measure,
                                 (kind, args.mib, args.rounds, args.hot))
        if results is None:
            return 2
        r = results[0]
        extra = r["before_us"] + r["after_us"]
        print(f"{kind:<12}{r['torch_us']:>10.0f}{r['before_us']:>15.1f}{r['after_us']:>8.1f}"
              f"{extra / r['torch_us']:>10.1%}{r['hot_us']:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
