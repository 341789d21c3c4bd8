"""What finding a raw lane costs, in-process, without a collective.

The raw lanes (``zipccl_fsdp/collectives/_lanes.py``) live in the runtime of the
call's stats owner (``zipccl_fsdp/runtime.py``). This times that lookup,
``_lanes._lanes(config, stats).get(key)``, against a plain dict lookup
of a key of the same shape held on an object's attribute (how lanes were
found when they hung off the config), interleaved, and prints medians and
minimums in ns.

    python benchmarks/lane_lookup.py [--runs 15] [--number 200000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import timeit

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from zipccl_fsdp.collectives import _lanes as L  # noqa: E402
from zipccl_fsdp.config import ZipCCLConfig  # noqa: E402
from zipccl_fsdp.stats import CommStats  # noqa: E402


class _Holder:
    lanes: dict = {}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--number", type=int, default=200_000)
    args = p.parse_args(argv)
    cfg, st = ZipCCLConfig(), CommStats()
    pg, dtype, dev = object(), torch.bfloat16, torch.device("cpu")
    L._lanes(cfg, st)[("all_gather", pg, dtype, dev)] = "lane"
    L._lanes(None, None)[("all_gather", pg, dtype, dev)] = "lane"
    holder = _Holder()
    holder.lanes = {("all_gather", pg, st, dtype, dev): "lane"}
    ways = {
        "dict on an attribute": lambda: holder.lanes.get(("all_gather", pg, st, dtype, dev)),
        "the stats' runtime": lambda: L._lanes(cfg, st).get(("all_gather", pg, dtype, dev)),
        "the defaults (None, None)": lambda: L._lanes(None, None).get(
            ("all_gather", pg, dtype, dev)),
    }
    times: dict = {name: [] for name in ways}
    for _ in range(args.runs):
        for name, fn in ways.items():
            assert fn() == "lane"
            times[name].append(timeit.timeit(fn, number=args.number) / args.number * 1e9)
    print(f"lane lookup, {args.runs} runs of {args.number} (ns)")
    for name, t in times.items():
        print(f"{name:<28} median {statistics.median(t):7.1f}   min {min(t):7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
