"""What a raw zipccl call costs beside torch's own, measured inside real calls.

Two gloo ranks on the plain (unthrottled) loopback, where the adaptive policy
sends everything raw. Each round, after a ``dist.barrier()``, makes the same
call one of four ways, in an order drawn from a seeded generator (the same
on both ranks; a fixed cycle skewed the all-reduce by 10-20% in one run):
torch's own collective, twice over (``torch_again``: the same call, counted
apart, so its ratio to ``torch`` shows the noise of the measurement);
zipccl's with a default config, which after its first call takes the raw
lane (``zipccl_fsdp/collectives/_lanes.py``); and zipccl's general path, with a
default config counted in a stats object whose runtime never keeps a lane
(every raw call's general path, plus one lane lookup). Medians of each, and their ratios to torch's.
A real call follows a blocking collective, and Python right after one runs
several times slower than in a hot loop, which is why this measures inside
real calls.

    python benchmarks/raw_call_overhead.py            # 1 and 4 MiB, three collectives
    python benchmarks/raw_call_overhead.py --mib 1 --kinds all_to_all --rounds 6000
    python benchmarks/raw_call_overhead.py --kinds all_reduce --dtype fp32 --mib 4,16
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import run_gloo_ranks  # noqa: E402

import zipccl_fsdp.collectives as C  # noqa: E402
from zipccl_fsdp.config import ZipCCLConfig  # noqa: E402
from zipccl_fsdp.stats import CommStats  # noqa: E402

KINDS = ("all_to_all", "all_gather", "all_reduce")
WAYS = ("torch", "torch_again", "lane", "general")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_GENERAL = CommStats()
"""The general way's counters, whose runtime keeps no lane."""


class _NoLanes(dict):
    """A ``ConfigState.lanes`` that keeps nothing: every call takes the general path."""

    def __setitem__(self, key, value) -> None:
        pass


def _calls(kind: str, numel: int, world: int, dtype: torch.dtype) -> dict:
    """way -> a no-argument call of ``kind`` on fresh buffers of ``numel`` ``dtype``."""
    cfg = ZipCCLConfig()
    _GENERAL.runtime.state(cfg).lanes = _NoLanes()
    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor
    x = torch.randn(numel).to(dtype)
    # One lambda per way around one call each: an extra Python frame costs
    # several microseconds here, which would show as overhead.
    if kind == "all_gather":
        out = torch.empty(world * numel, dtype=x.dtype)
        return {"torch": lambda: C._all_gather_single(out, x),
                "torch_again": lambda: C._all_gather_single(out, x),
                "lane": lambda: C.all_gather_single(out, x, config=cfg),
                "general": lambda: C.all_gather_single(out, x, config=cfg, stats=_GENERAL)}
    if kind == "all_to_all":
        out = torch.empty_like(x)
        return {"torch": lambda: dist.all_to_all_single(out, x),
                "torch_again": lambda: dist.all_to_all_single(out, x),
                "lane": lambda: C.all_to_all_single(out, x, config=cfg),
                "general": lambda: C.all_to_all_single(out, x, config=cfg, stats=_GENERAL)}
    # All-reduce: the tensor is refilled before each timed call (``refill``),
    # so every call sums the same bytes (repeated sums grow to inf and NaN).
    return {"torch": lambda: dist.all_reduce(x),
            "torch_again": lambda: dist.all_reduce(x),
            "lane": lambda: C.all_reduce(x, config=cfg),
            "general": lambda: C.all_reduce(x, config=cfg, stats=_GENERAL),
            "refill": (x, x.clone())}


def measure(kind: str, mib: float, rounds: int, gap_ms: float = 0.0,
            dtype: str = "bf16") -> dict:
    """On each rank: median microseconds of each way, rounds interleaved."""
    world = dist.get_world_size()
    t = DTYPES[dtype]
    calls = _calls(kind, int(mib * (1 << 20)) // t.itemsize, world, t)
    for _ in range(5):  # calibrates the policies, which then keep this loopback raw
        calls["lane"]()
        calls["general"]()
    refill = calls.get("refill")
    times = {way: [] for way in WAYS}
    order = random.Random(0)  # the same sequence on every rank
    for _ in range(rounds):
        way = order.choice(WAYS)
        if refill is not None:
            refill[0].copy_(refill[1])
        if gap_ms:
            dist.barrier()
            time.sleep(gap_ms / 1e3)
        dist.barrier()
        t0 = time.perf_counter()
        calls[way]()
        times[way].append(time.perf_counter() - t0)
    for snap in (C.stats()[kind], _GENERAL.snapshot()[kind]):
        assert snap["compressed_calls"] == 0, f"{kind} compressed on the plain loopback: {snap}"
    return {way: statistics.median(t) * 1e6 for way, t in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {KINDS}")
    p.add_argument("--mib", default="1,4",
                   help="message sizes in MiB, comma-separated: the all-to-all and all-reduce "
                        "input, the all-gather shard (default 1,4)")
    p.add_argument("--rounds", type=int, default=1200, help="rounds, about a quarter per way")
    p.add_argument("--gap-ms", type=float, default=0.0,
                   help="idle milliseconds before each call's barrier (zipccl bench link "
                        "waits 10 ms: the code after it runs colder still)")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    args = p.parse_args(argv)
    print(f"raw_call_overhead: 2 gloo ranks, plain loopback, {args.dtype}, {args.rounds} rounds "
          f"interleaved (medians in us; ratios to torch's; rank 0 | rank 1)")
    print(f"{'collective':<12}{'MiB':>5}{'torch':>9}{'lane':>9}{'general':>9}"
          f"{'torch_again/torch':>19}{'lane/torch':>19}{'general/torch':>19}")
    for kind in args.kinds.split(","):
        for mib in (float(m) for m in args.mib.split(",")):
            results = run_gloo_ranks("raw_call_overhead", measure,
                                     (kind, mib, args.rounds, args.gap_ms, args.dtype))
            if results is None:
                return 2
            r = results[0]
            ratios = [" | ".join(f"{res[way] / res['torch']:.3f}" for res in results.values())
                      for way in ("torch_again", "lane", "general")]
            print(f"{kind:<12}{mib:>5g}{r['torch']:>9.0f}{r['lane']:>9.0f}{r['general']:>9.0f}"
                  + "".join(f"{x:>19}" for x in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
