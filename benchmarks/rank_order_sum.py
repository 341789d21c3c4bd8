"""The rank-order sum on the CPU: its C++ loops against its torch ops, side by side.

One reduce-scatter chunk's reduction as ``pipeline.scatter_reduce`` runs it
(``_reduce.RankOrderSum``: rank 0's part copied widened, the others added in
fp32, then the cast into the output and the NaN test), for each input dtype
and size, once with the C++ loops (``csrc/reduce.cpp``) and once with the
torch ops (the same object with its library taken away), in alternating
order. Prints the median over rounds of each, in microseconds, and their
ratio; the two results are compared bit for bit before anything is timed.

    python benchmarks/rank_order_sum.py                       # 2 ranks' parts, 1 thread
    python benchmarks/rank_order_sum.py --world 4 --threads 2 --sizes 262144,4194304
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from zipccl_fsdp import _reduce, codec_cpp

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _one(parts: list, out: torch.Tensor, fast: bool) -> float:
    t0 = time.perf_counter()
    total = _reduce.RankOrderSum(out, parts[0], _reduce.SUM, len(parts))
    if not fast:
        total.ext = None
    for r, p in enumerate(parts):
        total.add(p, r)
    total.finish()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2, help="parts summed (ranks)")
    p.add_argument("--sizes", default="262144,2097152", help="elements per part, comma separated")
    p.add_argument("--dtypes", default="bf16,fp16,fp32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=40)
    args = p.parse_args()
    if not codec_cpp.available():
        raise SystemExit(f"the C++ library is unavailable: {codec_cpp.unavailable_reason()}")
    torch.set_num_threads(args.threads)
    print(f"# rank-order sum, {args.world} parts, {args.threads} thread(s), "
          f"{args.rounds} rounds, load {os.getloadavg()[0]:.2f}; isa {codec_cpp.isa()}\n")
    print("| dtype | elements | torch ops, us | C++ loops, us | torch / C++ |")
    print("|---|---|---|---|---|")
    for name in args.dtypes.split(","):
        dtype = DTYPES[name]
        for n in (int(s) for s in args.sizes.split(",")):
            g = torch.Generator().manual_seed(n)
            parts = [torch.randn(n, generator=g).to(dtype) for _ in range(args.world)]
            a, b = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
            _one(parts, a, False)
            _one(parts, b, True)
            ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
            if not torch.equal(a.view(ints), b.view(ints)):
                raise SystemExit(f"{name} n={n}: the C++ loops and the torch ops disagree")
            times = {False: [], True: []}
            for i in range(args.rounds):
                for fast in ((False, True) if i % 2 else (True, False)):
                    times[fast].append(_one(parts, a, fast))
            slow, fast = (statistics.median(times[k]) * 1e6 for k in (False, True))
            print(f"| {name} | {n} | {slow:.0f} | {fast:.0f} | {slow / fast:.2f} |")


if __name__ == "__main__":
    main()
