"""Flip one random bit of a compressed payload in transit; count how verify mode fares.

Two gloo ranks run the compressed collectives with
``ZipCCLConfig(policy="always", verify=True, min_bytes=0)``. On rank 1 a test
transport (``FlipTransport``) wraps the ``torch.distributed`` calls the collectives send
payload bytes with (uint8 tensors; the int64 size exchanges are left alone)
and, once per call, flips one random bit inside one payload it sends to rank 0.
Rank 0 compares what it got with the exact result, computed locally from every
rank's (seeded) input. Each injection ends one of three ways:

* caught: rank 0 raised ``CorruptPayloadError`` naming the collective and rank 1;
* harmless: the result is bit-exact (the bit carried no information: stream
  padding at the end of a bit-packed segment);
* missed: a wrong result came back silently. Verify mode must make this 0.

The catch rate is caught / (caught + missed). Cases cycle over all-gather,
reduce-scatter, all-reduce (either half) and all-to-all, bf16 / fp16 / fp32 /
fp32 exact bf16 casts, and the codecs dense, fixed3 and raw.

Usage::

    python benchmarks/bitflip_transit.py --injections 1000
    python benchmarks/bitflip_transit.py --injections 1000 --no-verify  # for contrast
"""
from __future__ import annotations

import argparse
import datetime
import os
import queue
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from bitflip_cases import worker_loop  # noqa: E402
from zipccl_fsdp.stats import KINDS  # noqa: E402


def _proc(rank: int, world: int, init_file: str, injections: int, seed: int, verify: bool,
          q) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        q.put((rank, worker_loop(rank, world, injections, seed, verify=verify)))
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--injections", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-verify", action="store_true",
                    help="without checksums: what the format's own checks catch")
    args = ap.parse_args(argv)
    world = 2
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="zipccl_bitflip_") as d:
        procs = [ctx.Process(target=_proc, args=(r, world, os.path.join(d, "rdv"),
                                                 args.injections, args.seed,
                                                 not args.no_verify, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        results = {}
        while len(results) < world:
            try:
                rank, res = q.get(timeout=5)
            except queue.Empty:
                if any(not p.is_alive() for p in procs):
                    for p in procs:
                        p.kill()
                    print("bitflip_transit: a rank died (its traceback is above)")
                    return 2
                continue
            results[rank] = res
        for p in procs:
            p.join()
    res = results[0]
    o = res["outcomes"]
    caught, missed = o.get("caught", 0), o.get("missed", 0)
    print(f"bitflip_transit: {args.injections} injections (one bit flipped in transit per "
          f"call, rank 1 -> rank 0), verify={not args.no_verify}, "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"{'collective':<16} {'caught':>8} {'harmless':>9} {'missed':>8}")
    for kind in KINDS:
        row = [res["per_kind"].get((kind, k), 0) for k in ("caught", "harmless", "missed")]
        print(f"{kind:<16} {row[0]:>8} {row[1]:>9} {row[2]:>8}")
    print(f"{'total':<16} {caught:>8} {o.get('harmless', 0):>9} {missed:>8}")
    rate = caught / max(caught + missed, 1)
    print(f"catch rate (caught / damaging flips): {100 * rate:.2f}%")
    for k, v in res["examples"].items():
        print(f"example {k}: {v}")
    flipper = {k: v for k, v in results[1]["outcomes"].items()}
    if flipper:
        print(f"flipper rank outcomes: {flipper}")
    bad = (0 if args.no_verify else missed) + o.get("caught_misattributed", 0)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
