"""Size model of two format extensions for the structure real gradients carry.

Not an encoder: it computes, from the captured messages, what the dense
payload would weigh with each extension, so the format change can be judged
before three backends implement it. Both are per-chunk options a chunk takes
only when they make it smaller, so no payload grows.

ZBLOCK (zero blocks). A chunk flag plus a 128-bit bitmap (16 B, one bit per
32-element block, the SIMD and GPU-thread block of the kernels): a set bit
means the block is all +0.0 and codes nothing; the other blocks code as
today. Model: the dense payload of the surviving blocks of every chunk, plus
16 B per flagged chunk, with the table overhead of the original chunks.

LOWBYTE (fp32 mantissa tails). For fp32 chunks that are not LOW16: a flag,
and the sm plane ships 2 bytes per kept element (sign and top 15 mantissa
bits) plus a bitmap of the elements whose low byte is nonzero (n / 8 bytes)
and those bytes. TAIL2 generalises it: a 2-bit class per kept element says
whether its sm has 1, 2 or 3 significant bytes (trailing zero bytes dropped)
and only those are shipped. Model: the dense payload minus, per chunk, the
bytes the better of the two saves against 3 bytes per kept element.

Usage::

    python benchmarks/structure_prototype.py --captures DIR
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import real_traffic as rt  # noqa: E402
from zipccl_fsdp import codec_cpp  # noqa: E402
from zipccl_fsdp import format as F  # noqa: E402

BLOCK = 32


def dense_nbytes(x: torch.Tensor) -> int:
    return codec_cpp.encode(x, "dense").numel() if x.numel() else F.HEADER_NBYTES


def zblock_nbytes(x: torch.Tensor) -> int:
    """Dense payload with ZBLOCK (see the module docstring)."""
    C = F.CHUNK_ELEMS
    n = x.numel()
    pad = -n % BLOCK
    w = torch.nn.functional.pad(x.reshape(-1).view(torch.int16 if x.element_size() == 2 else torch.int32),
                                (0, pad), value=1)
    zero_block = (w.view(-1, BLOCK) == 0).all(1)
    if not bool(zero_block.any()):
        return dense_nbytes(x)
    keep = (~zero_block).repeat_interleave(BLOCK)[:n]
    survivors = x.reshape(-1)[keep]
    nch = F.nchunks_for(n)
    flagged = int(torch.nn.functional.pad(zero_block, (0, -zero_block.numel() % (C // BLOCK)))
                  .view(-1, C // BLOCK).any(1).sum())
    table = (F.CHUNK_ENTRY_NBYTES + F.OFFSET_NBYTES)
    return (dense_nbytes(survivors) + table * (nch - F.nchunks_for(survivors.numel()))
            + 16 * flagged)


def lowbyte_saving(x: torch.Tensor) -> int:
    """Bytes LOWBYTE / TAIL2 save against the dense payload (fp32, non-LOW16 chunks)."""
    if x.dtype != torch.float32 or not x.numel():
        return 0
    C = F.CHUNK_ELEMS
    w = x.reshape(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    pad = -w.numel() % C
    valid = torch.nn.functional.pad(torch.ones_like(w, dtype=torch.bool), (0, pad)).view(-1, C)
    w = torch.nn.functional.pad(w, (0, pad)).view(-1, C)
    kept = valid & (w != 0) & (w != 0x80000000)  # zeros ship no sm (flagged or not, roughly)
    low16 = ((w & 0xFFFF) == 0).logical_or(~valid).all(1)
    nk = kept.sum(1)
    nz_low = (kept & ((w & 0xFF) != 0)).sum(1)
    lowbyte = 2 * nk + C // 8 + nz_low
    sig = torch.where((w & 0xFFFF) == 0, 1, torch.where((w & 0xFF) == 0, 2, 3))
    tail2 = (kept * sig).sum(1) + (2 * nk + 7) // 8
    best = torch.minimum(torch.minimum(lowbyte, tail2), 3 * nk)
    return int(torch.where(low16, 0, 3 * nk - best).sum())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--captures", required=True, type=Path)
    p.add_argument("--recipes", default=",".join(rt.RECIPES))
    args = p.parse_args()
    torch.set_num_threads(1)
    ms = [m for m in rt.methods() if m.name in ("ZipNN", "zstd-3")]
    print("| layout | kind | dtype | raw MB | dense | +ZBLOCK | +LOWBYTE/TAIL2 | +both | "
          + " | ".join(m.name for m in ms) + " |")
    print("|" + "---|" * (9 + len(ms) - 1))
    for recipe in args.recipes.split(","):
        groups: dict = {}
        for (kind, dtype, _step), msgs in rt.messages(args.captures / recipe).items():
            groups.setdefault((kind, dtype), []).extend(msgs)
        for (kind, dtype), msgs in sorted(groups.items()):
            raw = sum(m.numel() * m.element_size() for m in msgs)
            dense = sum(dense_nbytes(m) for m in msgs)
            zb = sum(zblock_nbytes(m) for m in msgs)
            lb = sum(lowbyte_saving(m) for m in msgs)
            peers = [raw / sum(meth.size(meth.compress(m)) for m in msgs) for meth in ms]
            print(f"| {rt.LAYOUTS.get(recipe, recipe)} | {kind} | {dtype} | {raw / 1e6:.2f} | "
                  f"{raw / dense:.3f} | {raw / zb:.3f} | {raw / (dense - lb):.3f} | "
                  f"{raw / (zb - lb):.3f} | " + " | ".join(f"{r:.3f}" for r in peers) + " |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
