"""dense against fixed3 and the bound, over zero fractions, zero signs and dtypes.

Inputs (2**22 elements each by default): Gaussian bf16 times a mask at 0, 5,
10, 30, 50 and 90% zeros (``x * mask``: both zero signs), Gaussian bf16 with
30% exact +0.0, Gaussian bf16 at a small sigma, and fp32 exact bf16 casts.
For each: fixed3's and dense's ratio (input bytes / payload bytes), the
bound of ``real_traffic.bound_bits`` (exponent entropy with the zeros as
symbols of their own, raw sign+mantissa, 8 bits for the mantissa of a bf16
cast), and dense's shortfall from it. ``HUF``: what a format with a
per-chunk Huffman code of the same symbols would reach
(``structure_prototype.huf_nbytes``, tables and padding counted): the best
a prefix code per chunk can do; ``ANS``: the same symbols under a static
rANS code per chunk (``structure_prototype.ans_nbytes``: tables, final
states and padding counted), ``ANS/msg`` with one table a message.

Usage::

    python benchmarks/ratio_sweep.py [--log2n 22]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from real_traffic import bound_bits  # noqa: E402
from structure_prototype import ans_nbytes, huf_nbytes  # noqa: E402

import zipccl_fsdp as z  # noqa: E402


def inputs(n: int, g: torch.Generator):
    for p in (0, 5, 10, 30, 50, 90):
        x = torch.randn(n, generator=g).bfloat16()
        yield f"x*mask {p}%", x * (torch.rand(n, generator=g) >= p / 100).bfloat16()
    x = torch.randn(n, generator=g).bfloat16()
    x[torch.rand(n, generator=g) < 0.3] = 0
    yield "+0.0 only 30%", x
    yield "Gaussian sigma 3e-4", (torch.randn(n, generator=g) * 3e-4).bfloat16()
    yield "fp32 bf16 casts", torch.randn(n, generator=g).bfloat16().float()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--log2n", type=int, default=22)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    print("| input | fixed3 | dense | bound | dense / bound | dense >= fixed3 | HUF | HUF / bound "
          "| ANS | ANS / bound | ANS/msg / bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, x in inputs(1 << args.log2n, g):
        raw = x.numel() * x.element_size()
        r = {c: raw / z.encode(x, codec=c).numel() for c in ("fixed3", "dense")}
        bound = 8 * raw / bound_bits(x)
        huf = raw / huf_nbytes(x)
        ans = raw / ans_nbytes(x)
        ans_m = raw / ans_nbytes(x, per_message=True)
        print(f"| {name} | {r['fixed3']:.3f} | {r['dense']:.3f} | {bound:.3f} | "
              f"{r['dense'] / bound:.3f} | {'yes' if r['dense'] >= r['fixed3'] else 'NO'} | "
              f"{huf:.3f} | {huf / bound:.3f} | {ans:.3f} | {ans / bound:.3f} | "
              f"{ans_m / bound:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
