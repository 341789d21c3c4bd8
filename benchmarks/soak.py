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
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from _common import run_gloo_ranks  # noqa: E402
from soak_cases import soak  # noqa: E402


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
