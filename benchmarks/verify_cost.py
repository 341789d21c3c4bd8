"""What integrity mode costs: encode + decode with and without ``verify``, side by side.

One tensor (64 MiB of Gaussian bf16 by default), every backend available on
this machine, codecs dense and fixed3. Runs are interleaved (verify off, on,
off, on, ...) and the best of ``--repeats`` is kept, so a busy machine hurts
both columns alike; compare the ratios, not the absolute GB/s across runs.
On a machine shared with other busy processes, ``--threads 1`` is steadier:
the checksum is many small torch ops, and each parallel region waits for a
descheduled thread (a run next to two other codec processes measured verify
40x slower with 2 threads).
GB/s are of tensor bytes. ``chunk_sums`` alone is the checksum pass each side
adds (once on encode, once on decode).

Usage::

    python benchmarks/verify_cost.py [--mib 64] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import zipccl_fsdp as z  # noqa: E402
from zipccl_fsdp import codec as zcodec  # noqa: E402


def backends() -> list:
    out = ["torch"]
    from zipccl_fsdp import codec_cpp
    if codec_cpp.available():
        out.insert(0, "cpp")
    return out


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(x: torch.Tensor, backend: str, codec: str, repeats: int) -> dict:
    """Best encode and decode seconds with verify off and on, interleaved."""
    res = {}
    payloads = {v: z.encode(x, codec=codec, backend=backend, verify=v) for v in (False, True)}
    out = torch.empty_like(x)
    for _ in range(repeats):
        for v in (False, True):
            e = _best(lambda: z.encode(x, codec=codec, backend=backend, verify=v), 1)
            d = _best(lambda: z.decode(payloads[v], out=out, backend=backend), 1)
            prev = res.get(v, (float("inf"), float("inf")))
            res[v] = (min(prev[0], e), min(prev[1], d))
    res["nbytes"] = {v: payloads[v].numel() for v in (False, True)}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    x = torch.randn(args.mib << 19, generator=torch.Generator().manual_seed(0)).bfloat16()
    gb = x.numel() * x.element_size() / 1e9
    print(f"verify_cost: {args.mib} MiB Gaussian bf16, torch threads {torch.get_num_threads()}, "
          f"best of {args.repeats} (interleaved)")
    print(f"{'backend':<7} {'codec':<7} {'enc GB/s':>9} {'+verify':>8} {'dec GB/s':>9} "
          f"{'+verify':>8} {'enc+dec s':>10} {'+verify':>8} {'cost':>7} {'bytes +':>8}")
    for backend in backends():
        for codec in ("dense", "fixed3"):
            r = measure(x, backend, codec, args.repeats)
            (e0, d0), (e1, d1) = r[False], r[True]
            grow = r["nbytes"][True] / r["nbytes"][False] - 1
            print(f"{backend:<7} {codec:<7} {gb / e0:>9.3f} {gb / e1:>8.3f} {gb / d0:>9.3f} "
                  f"{gb / d1:>8.3f} {e0 + d0:>10.3f} {e1 + d1:>8.3f} "
                  f"{(e1 + d1) / (e0 + d0):>6.2f}x {100 * grow:>7.3f}%")
    t = _best(lambda: zcodec.chunk_sums(x), args.repeats)
    print(f"chunk_sums alone: {gb / t:.3f} GB/s ({t:.3f} s per pass; encode and decode each "
          f"add one)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
