"""Size models of what a format change would buy on captured traffic.

Not an encoder: it computes, from the captured messages, what a payload
would weigh with each candidate, so a format change can be judged before
three backends implement it. One table, per (layout, message kind, dtype),
all steps: the dense v3 payload, it with each tail code, HUF, ZipNN and
zstd-3 (as ``real_traffic.py`` runs them).

Tail codes. Format v3 codes an fp32 mantissa tail to the byte: a chunk that
is not LOW16 ships 2 sm bytes an element, or with LOWBYTE 1 byte plus a
bitmap of the nonzero low bytes and those bytes. The fp32 messages that take
this path are sums of a few bf16 values (torchtitan's ``ChunkedLossWrapper``
runs lm_head once per sequence chunk with gradient sync off, so FSDP2 sums
the chunks' bf16 gradients in fp32 before one reduce-scatter; FSDP2's
gradient accumulation without sync does the same over microbatches). Such a
value's mantissa ends in ``tz`` zero bits that vary per element, so the bits
below the top 7 mantissa bits that carry information number ``need = 16 -
min(tz, 16)``, from 0 to 16. Each candidate replaces the v3 coding of the
low 16 bits of every kept element (non-zero word) of a non-LOW16 fp32 chunk,
and a chunk takes it only where it is smaller; costs in bits, ``nk`` kept
elements, ``n`` elements:

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
  bits an element, tables free.

The v3 cost they are set against: ``16 nk``, or with LOWBYTE ``8 nk + n + 8``
per nonzero low byte, whichever is less (the encoder decides on padded
sizes; the model ignores padding).

HUF: a whole payload of an adaptive codec, any dtype: a per-chunk Huffman
code over each element's symbol (its exponent field, or +0.0 or -0.0), sign
and mantissa raw (8 bits for bf16 and LOW16 fp32 chunks, 11 for fp16), and
for the other fp32 chunks a per-chunk Huffman code over ``need`` and ``need
- 1`` raw bits; each code's table at 12 bits a symbol present; 20 B of chunk
table a chunk (a ZERO chunk nothing more), 24 B of padding a chunk that is
not ZERO and 64 B a message, as format v3 spends. HUF/msg: the same with one
table (each code's) for all the chunks of a message, from its histogram.

ANS: HUF with each per-chunk Huffman code replaced by a static rANS code of
the chunk's own counts (a full chunk's counts sum to 4096, a power of two,
so the frequencies are exact): ``c log2(n / c)`` bits for a symbol counted
``c`` times of ``n``, 20 bits a symbol present (its id and 12-bit
frequency), and ``ANS_LANES`` 32-bit final states a chunk that is not ZERO
(interleaved decoders: the parallelism a GPU decode of one chunk gets).

Usage::

    python benchmarks/structure_prototype.py --captures DIR
"""
from __future__ import annotations

import argparse
import heapq
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


def chunk_words(x: torch.Tensor) -> tuple:
    """(w, valid): the message's unsigned words as [chunks, CHUNK_ELEMS]
    rows, the last padded with 0, and which of them are elements."""
    C = F.CHUNK_ELEMS
    bits = 8 * x.element_size()
    w = x.reshape(-1).view(rt.INT[x.element_size()]).to(torch.int64) & ((1 << bits) - 1)
    pad = -w.numel() % C
    valid = torch.nn.functional.pad(torch.ones_like(w, dtype=torch.bool), (0, pad)).view(-1, C)
    return torch.nn.functional.pad(w, (0, pad)).view(-1, C), valid


def tail_need(t: torch.Tensor) -> torch.Tensor:
    """``need`` of each fp32 word's low 16 bits ``t``: 16 less its trailing zeros."""
    return 16 - torch.where(t == 0, 16, (t & -t).double().log2().round().long())


def need_histograms(x: torch.Tensor) -> tuple:
    """(hist, n, nz_low) of the non-LOW16 chunks of an fp32 message: hist[c, k]
    counts the kept elements of chunk c with need k, n[c] its length, nz_low[c]
    its kept elements with a nonzero low byte."""
    w, valid = chunk_words(x)
    low16 = ((w & 0xFFFF) == 0).logical_or(~valid).all(1)
    w, valid = w[~low16], valid[~low16]
    kept = valid & (w != 0) & (w != 0x80000000)
    need = torch.where(kept, tail_need(w & 0xFFFF), NEED)  # NEED: not kept, dropped below
    hist = torch.zeros(w.shape[0], NEED + 1, dtype=torch.int64).scatter_add_(
        1, need, torch.ones_like(need))[:, :NEED]
    return hist, valid.sum(1), (kept & ((w & 0xFF) != 0)).sum(1)


def costs(hist: torch.Tensor, n: torch.Tensor, nz_low: torch.Tensor) -> dict:
    """Bits per chunk of the low 16 bits: v3 and each candidate."""
    nk = hist.sum(1)
    k = torch.arange(NEED)
    v3 = torch.minimum(16 * nk, 8 * nk + n + 8 * nz_low)
    le = hist.cumsum(1)  # le[:, t]: kept elements with need <= t
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
    return dict(v3=v3.double(), W4=w4.double(), TIER=tier.double(), ENT=ent)


def huffman_bits(counts: torch.Tensor) -> torch.Tensor:
    """Bits of each row's symbols under its own Huffman code plus the code's
    table (12 bits a symbol present); rows of counts, one per chunk."""
    out = []
    for row in counts.tolist():
        live = [c for c in row if c]
        if len(live) < 2:
            out.append(sum(live) + 12 * len(live))  # one symbol: a bit an element
            continue
        heap = list(live)  # Huffman's total cost: the sum of every merge
        heapq.heapify(heap)
        total = 0
        while len(heap) > 1:
            a, b = heapq.heappop(heap), heapq.heappop(heap)
            total += a + b
            heapq.heappush(heap, a + b)
        out.append(total + 12 * len(live))
    return torch.tensor(out, dtype=torch.float64)


ANS_LANES = 4


def ans_bits(counts: torch.Tensor) -> torch.Tensor:
    """Bits of each row's symbols under a static rANS code of the row's own
    counts plus its table (20 bits a symbol present); rows of counts."""
    c = counts.double()
    n = c.sum(1, keepdim=True)
    return (c * torch.where(c > 0, (n / c.clamp(min=1)).log2(), torch.zeros_like(c))).sum(1) + (
        20 * (counts > 0).sum(1))


def huf_nbytes(x: torch.Tensor, per_message: bool = False, code_bits=huffman_bits,
               chunk_bits: int = 0) -> float:
    """Bytes of the HUF model's payload of one message (module docstring);
    ``per_message``: one table for the message's chunks (HUF/msg);
    ``code_bits``: the code's bits of rows of counts, ``chunk_bits`` what it
    adds a chunk that is not ZERO (ans_nbytes)."""
    info = F.dtype_info(x.dtype)
    w, valid = chunk_words(x)
    zero_chunk = ((w == 0) | ~valid).all(1)
    w, valid = w[~zero_chunk], valid[~zero_chunk]
    nonzero = valid & (w != 0) & (w != info.sign_word)
    sym = torch.where(w == 0, info.emax + 1,
                      torch.where(w == info.sign_word, info.emax + 2, (w >> info.man_bits) & info.emax))
    K = info.emax + 3
    rows = torch.arange(w.shape[0])[:, None].expand_as(w)
    counts = torch.bincount((rows * K + sym)[valid], minlength=w.shape[0] * K).view(-1, K)
    fold = (lambda c: c.sum(0, keepdim=True)) if per_message else (lambda c: c)
    bits = float(code_bits(fold(counts)).sum()) + chunk_bits * w.shape[0]
    sm = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 8}[x.dtype]
    bits += sm * float(nonzero.sum())
    if x.dtype == torch.float32:
        low16 = ((w & 0xFFFF) == 0).logical_or(~valid).all(1)
        t = w[~low16] & 0xFFFF
        kept = nonzero[~low16]
        need = tail_need(t)
        r = torch.arange(t.shape[0])[:, None].expand_as(t)
        nc = torch.bincount((r * NEED + need)[kept], minlength=t.shape[0] * NEED).view(-1, NEED)
        bits += float(code_bits(fold(nc)).sum()) + float(((need - 1).clamp(min=0) * kept).sum())
    return bits / 8 + 44 * w.shape[0] + 20 * int(zero_chunk.sum()) + 64


def ans_nbytes(x: torch.Tensor, per_message: bool = False) -> float:
    """Bytes of the ANS model's payload of one message: HUF's with rANS codes
    and ANS_LANES 32-bit final states a chunk that is not ZERO."""
    return huf_nbytes(x, per_message, ans_bits, 32 * ANS_LANES)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--captures", required=True, type=Path)
    p.add_argument("--recipes", default=",".join(rt.RECIPES))
    args = p.parse_args()
    torch.set_num_threads(1)
    ms = [m for m in rt.methods() if m.name in ("ZipNN", "zstd-3")]
    cands = ("W4", "TIER", "ENT")
    print("Ratio (raw / wire bytes, every message on its own) per message kind, all steps "
          "(kinds under 64 KiB, scalar all-reduces that go raw in training, left out); "
          "'tail bits': bits an element of the low 16 bits of non-LOW16 fp32 chunks, "
          "v3 / " + " / ".join(cands))
    head = ("| layout | kind | dtype | raw MB | tail bits | dense v3 | "
            + " | ".join(f"+{c}" for c in cands) + " | HUF | HUF/msg | ANS | "
            + " | ".join(m.name for m in ms) + " |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for recipe in args.recipes.split(","):
        groups: dict = {}
        for (kind, dtype, _step), msgs in rt.messages(args.captures / recipe).items():
            groups.setdefault((kind, dtype), []).extend(msgs)
        for (kind, dtype), msgs in sorted(groups.items()):
            raw = sum(m.numel() * m.element_size() for m in msgs)
            if raw < (64 << 10):
                continue
            dense = sum(dense_nbytes(m) for m in msgs)
            saved = dict.fromkeys(cands, 0.0)
            bits = dict.fromkeys(("v3", *cands), 0.0)
            nk_all = 0
            for m in msgs:
                if m.dtype != torch.float32:
                    continue
                hist, n, nz_low = need_histograms(m)
                cost = costs(hist, n, nz_low)
                nk_all += int(hist.sum())
                for key in bits:
                    bits[key] += float(cost[key].sum())
                for cand in cands:  # a chunk takes the candidate only where it is smaller
                    saved[cand] += float((cost["v3"] - cost[cand]).clamp(min=0).sum()) / 8
            huf = sum(huf_nbytes(m) for m in msgs)
            huf_m = sum(huf_nbytes(m, per_message=True) for m in msgs)
            ans = sum(ans_nbytes(m) for m in msgs)
            peers = [raw / sum(meth.size(meth.compress(m)) for m in msgs) for meth in ms]
            tail = " / ".join(f"{bits[key] / nk_all:.1f}" for key in bits) if nk_all else "-"
            with_tail = " | ".join(f"{raw / (dense - saved[c]):.3f}" if nk_all else "-" for c in cands)
            print(f"| {rt.LAYOUTS.get(recipe, recipe)} | {kind} | {dtype} | {raw / 1e6:.2f} | {tail} | "
                  f"{raw / dense:.3f} | {with_tail} | {raw / huf:.3f} | {raw / huf_m:.3f} | "
                  f"{raw / ans:.3f} | "
                  + " | ".join(f"{r:.3f}" for r in peers) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
