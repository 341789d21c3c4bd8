"""Size model of the next format extension: fp32 mantissa tails to the bit.

Not an encoder: it computes, from the captured messages, what the dense
payload would weigh with each candidate, so a format change can be judged
before three backends implement it. Each candidate is a per-chunk option a
chunk takes only when it makes the chunk smaller, so no payload grows.

What it is for. Format v3 codes an fp32 mantissa tail to the byte: a chunk
that is not LOW16 ships 2 sm bytes an element, or with LOWBYTE 1 byte plus a
bitmap of the nonzero low bytes and those bytes. The fp32 messages that take
this path are sums of a few bf16 values (torchtitan's ``ChunkedLossWrapper``
runs lm_head once per sequence chunk with gradient sync off, so FSDP2 sums
the chunks' bf16 gradients in fp32 before one reduce-scatter; FSDP2's
gradient accumulation without sync does the same over microbatches). Such a
value's mantissa ends in ``tz`` zero bits that vary per element, so the bits
below the top 7 mantissa bits that carry information number ``need = 16 -
min(tz, 16)``, from 0 to 16.

Candidates, each replacing the v3 coding of the low 16 bits of every kept
element (non-zero word) of a non-LOW16 fp32 chunk; costs in bits, ``nk``
kept elements, ``n`` elements:

* ``W1``: one width ``W`` a chunk (the best one); the elements with ``need >
  W`` are escapes, marked in a bitmap of ``n`` bits (when there are any),
  and ship their other ``16 - W`` bits apart.
* ``W4``: a 2-bit class an element naming one of four widths a chunk (the
  best three below 16, and 16); each element ships its class's width.
* ``TIER``: dense's tiered prefix code (``format.TIER_BITS``) over the
  ``need`` values ranked by their count in the chunk: 2 bits for the three
  commonest, 3 and 4 for the next two, 6 and 8 for the next three each, and
  an escape (8 bits, then 5 for ``need``) past them; ``need - 1`` bits an
  element after it (its lowest set bit is implied); the ranking costs 5
  bits a value, 85 a chunk.
* ``ENT``: the bound of any per-element width code with an adaptive table:
  ``nk`` times the chunk's order-0 entropy of ``need``, plus ``need - 1``
  bits an element (its lowest set bit is implied), tables free.

The v3 cost it is set against: ``16 nk``, or with LOWBYTE ``8 nk + n + 8``
per nonzero low byte, whichever is less (the encoder decides on padded
sizes; the model ignores padding).

Usage::

    python benchmarks/structure_prototype.py --captures DIR
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import real_traffic as rt  # noqa: E402
from zipccl_fsdp import codec_cpp  # noqa: E402
from zipccl_fsdp import format as F  # noqa: E402

NEED = 17  # need = 0..16
# Every choice of W4's three widths below 16, as a (triples, 3) index tensor.
TRIPLES = torch.tensor(list(itertools.combinations(range(16), 3)))


def dense_nbytes(x: torch.Tensor) -> int:
    return codec_cpp.encode(x, "dense").numel() if x.numel() else F.HEADER_NBYTES


def need_histograms(x: torch.Tensor) -> tuple:
    """(hist, n, nz_low) of the non-LOW16 chunks of an fp32 message: hist[c, k]
    counts the kept elements of chunk c with need k, n[c] its length, nz_low[c]
    its kept elements with a nonzero low byte."""
    C = F.CHUNK_ELEMS
    w = x.reshape(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    pad = -w.numel() % C
    valid = torch.nn.functional.pad(torch.ones_like(w, dtype=torch.bool), (0, pad)).view(-1, C)
    w = torch.nn.functional.pad(w, (0, pad)).view(-1, C)
    low16 = ((w & 0xFFFF) == 0).logical_or(~valid).all(1)
    w, valid = w[~low16], valid[~low16]
    kept = valid & (w != 0) & (w != 0x80000000)
    t = w & 0xFFFF
    tz = torch.where(t == 0, 16, (t & -t).double().log2().round().long())
    need = torch.where(kept, 16 - tz, NEED)  # NEED: not kept, dropped below
    hist = torch.zeros(w.shape[0], NEED + 1, dtype=torch.int64).scatter_add_(
        1, need, torch.ones_like(need))[:, :NEED]
    return hist, valid.sum(1), (kept & ((w & 0xFF) != 0)).sum(1)


def costs(hist: torch.Tensor, n: torch.Tensor, nz_low: torch.Tensor) -> dict:
    """Bits per chunk of the low 16 bits: v3 and each candidate."""
    nk = hist.sum(1)
    k = torch.arange(NEED)
    v3 = torch.minimum(16 * nk, 8 * nk + n + 8 * nz_low)
    le = hist.cumsum(1)  # le[:, t]: kept elements with need <= t
    esc = nk[:, None] - le  # need > W, for W = 0..16
    W = torch.arange(NEED)
    w1 = (nk[:, None] * W + (esc > 0) * n[:, None] + esc * (16 - W)).min(1).values
    a, b, c = (TRIPLES[:, i] for i in range(3))
    la, lb, lc = le[:, a], le[:, b], le[:, c]
    w4 = 2 * nk + (a * la + b * (lb - la) + c * (lc - lb) + 16 * (nk[:, None] - lc)).min(1).values
    digits = torch.tensor(F.TIER_BITS).cumsum(0)  # bits of a symbol decided at tier t
    rank_bits = torch.cat([digits.repeat_interleave(torch.tensor(F.TIER_SYMBOLS)),
                           torch.full((NEED - F.DENSE_SLOTS,), int(digits[-1]) + 5)])
    ranked = hist.sort(1, descending=True).values
    raw_bits = (hist * (k - 1).clamp(min=0)).sum(1)
    tier = (ranked * rank_bits).sum(1) + raw_bits + 5 * NEED
    p = hist / nk.clamp(min=1)[:, None]
    h = -(p * torch.where(p > 0, p.log2(), torch.zeros_like(p))).sum(1)
    ent = nk * h + raw_bits
    return dict(v3=v3.double(), W1=w1.double(), W4=w4.double(), TIER=tier.double(), ENT=ent)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--captures", required=True, type=Path)
    p.add_argument("--recipes", default=",".join(rt.RECIPES))
    args = p.parse_args()
    torch.set_num_threads(1)
    ms = [m for m in rt.methods() if m.name in ("ZipNN", "zstd-3")]
    cands = ("W1", "W4", "TIER", "ENT")
    print("Ratio (raw / wire bytes, every message on its own) of the fp32 messages, all steps; "
          "'tail bits': bits an element of the non-LOW16 chunks' low 16 bits, v3 / W1 / W4 / TIER / ENT")
    head = ("| layout | kind | raw MB | tail elems | tail bits | dense v3 | "
            + " | ".join(f"+{c}" for c in cands) + " | " + " | ".join(m.name for m in ms) + " |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for recipe in args.recipes.split(","):
        groups: dict = {}
        for (kind, dtype, _step), msgs in rt.messages(args.captures / recipe).items():
            if dtype == "float32":
                groups.setdefault(kind, []).extend(msgs)
        for kind, msgs in sorted(groups.items()):
            raw = sum(m.numel() * m.element_size() for m in msgs)
            dense = sum(dense_nbytes(m) for m in msgs)
            saved = dict.fromkeys(cands, 0.0)
            bits = dict.fromkeys(("v3", *cands), 0.0)
            nk_all = 0
            for m in msgs:
                hist, n, nz_low = need_histograms(m)
                cost = costs(hist, n, nz_low)
                nk_all += int(hist.sum())
                for key in bits:
                    bits[key] += float(cost[key].sum())
                for cand in cands:  # a chunk takes the candidate only where it is smaller
                    saved[cand] += float((cost["v3"] - cost[cand]).clamp(min=0).sum()) / 8
            peers = [raw / sum(meth.size(meth.compress(m)) for m in msgs) for meth in ms]
            tail = " / ".join(f"{bits[key] / max(nk_all, 1):.1f}" for key in bits)
            print(f"| {rt.LAYOUTS.get(recipe, recipe)} | {kind} | {raw / 1e6:.2f} | {nk_all} | {tail} | "
                  f"{raw / dense:.3f} | " + " | ".join(f"{raw / (dense - saved[c]):.3f}" for c in cands)
                  + " | " + " | ".join(f"{r:.3f}" for r in peers) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
