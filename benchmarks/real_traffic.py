"""zipccl against ZipNN and zstd on the traffic training really sends.

Reads the captures of ``zipccl titan --capture N --capture-steps S`` (one
safetensors file per rank and step, each tensor one collective's input), or
makes them first (``--run``: each CPU recipe, steps early, middle and late).
Every message is compressed on its own by each method, as a collective would
send it. Per (layout, collective kind, dtype, step) it prints the raw MB, the
bound, and per method the ratio (raw bytes / compressed bytes, summed over
the messages) and the speed in GB of input per CPU-second of this process
(``time.process_time``, one thread: the machine may be shared).

Methods: zipccl fixed3 and dense (C++ backend), ZipNN (``zipnn``, its
default: byte grouping + Huffman/zstd) and zstd level 3 (``zstandard``).
ZipNN and zstandard come with the ``bench`` extra; a method not installed is
skipped. Every round trip is checked bit for bit against a copy of the input
kept aside: ZipNN's ``compress`` rewrites its input buffer in place (it moves
the sign bit), so it gets a fresh copy of the message each call.

The bound: an order-0 entropy bound for codes that, like zipccl's, model the
exponent and ship sign and mantissa raw but for the format's two structures.
Per message, every element outside a 4096-element chunk of +0.0 alone (a
ZERO chunk: it costs nothing) is one symbol: its exponent field, or "+0.0"
or "-0.0" (zeros are symbols of their own and ship no sign or mantissa).
Bits = sum over those elements of -log2 p(symbol) (p: the symbol's frequency
among them) + the sign+mantissa bits of every nonzero element: 8 for bf16,
11 for fp16; for fp32, 8 in a chunk whose words all have zero low 16 bits
(bf16 casts: the 16 zero bits cost nothing, as zipccl's LOW16 chunks), else
16 bits plus the low byte at its chunk's order-0 entropy of "zero or not"
and 8 bits when it is not zero (LOWBYTE's bitmap and bytes, at best). The
bound ratio is raw bits / those bits. A compressor that models mantissas or
runs (zstd, ZipNN) can beat it; zipccl's codes cannot.

Usage::

    python benchmarks/real_traffic.py --captures DIR [--run] [--steps 1,15,30]
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from zipccl_fsdp import codec_cpp  # noqa: E402
from zipccl_fsdp import format as F  # noqa: E402
from zipccl_fsdp.capture import read_capture_metadata  # noqa: E402

RECIPES = ("llama3_tiny_cpu", "llama3_tiny_hsdp_cpu", "llama3_tiny_tp_fsdp_cpu",
           "deepseek_v3_tiny_ep_cpu")
LAYOUTS = {"llama3_tiny_cpu": "FSDP2", "llama3_tiny_hsdp_cpu": "HSDP",
           "llama3_tiny_tp_fsdp_cpu": "TP+FSDP", "deepseek_v3_tiny_ep_cpu": "MoE-EP"}
INT = {2: torch.int16, 4: torch.int32}
SM_BITS = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}
MIN_TIMED_NBYTES = 8 << 20  # each method codes a group's messages until this much input
MAX_TIMED_REPS = 64  # ... or this many times (a group of scalars is per-call overhead anyway)


def bound_bits(x: torch.Tensor) -> float:
    """The bound's bits for one message (see the module docstring)."""
    info = F.dtype_info(x.dtype)
    C = F.CHUNK_ELEMS
    w = x.reshape(-1).view(INT[x.element_size()]).to(torch.int64) & ((1 << (8 * x.element_size())) - 1)
    rows = torch.nn.functional.pad(w, (0, -w.numel() % C), value=-1).view(-1, C)  # -1: padding
    valid = rows >= 0
    live = valid & ~((rows == 0) | ~valid).all(1, keepdim=True)  # outside ZERO chunks
    e = (rows >> info.man_bits) & info.emax
    sym = torch.where(rows == 0, info.emax + 1, torch.where(rows == info.sign_word, info.emax + 2, e))
    counts = torch.bincount(sym[live], minlength=info.emax + 3).double()
    p = counts[counts > 0] / max(int(live.sum()), 1)
    bits = float(-(counts[counts > 0] * torch.log2(p)).sum())
    nonzero = live & (rows != 0) & (rows != info.sign_word)
    kept = nonzero.sum(1).double()
    if x.dtype != torch.float32:
        return bits + SM_BITS[x.dtype] * float(kept.sum())
    low16 = (((rows & 0xFFFF) == 0) | ~valid).all(1)
    nzlow = (nonzero & ((rows & 0xFF) != 0)).sum(1).double()
    q = (nzlow / kept.clamp(min=1)).clamp(1e-12, 1 - 1e-12)
    h = -(q * q.log2() + (1 - q) * (1 - q).log2())  # bits a kept element's low byte: zero or not
    sm = torch.where(low16, 8 * kept, 16 * kept + kept * h + 8 * nzlow)
    return bits + float(sm.sum())


class Method:
    """compress(x) -> blob, decompress(blob, like) -> tensor; blob size in bytes."""
    name = ""

    def size(self, blob) -> int:
        return len(blob)


class Zipccl(Method):
    def __init__(self, codec):
        self.codec = codec
        self.name = f"zipccl {codec}"

    def compress(self, x):
        return codec_cpp.encode(x, self.codec)

    def decompress(self, blob, like):
        return codec_cpp.decode(blob, F.parse_header(blob), torch.empty_like(like))

    def size(self, blob):
        return blob.numel()


class Zstd(Method):
    name = "zstd-3"

    def __init__(self):
        import zstandard
        self.c = zstandard.ZstdCompressor(level=3)
        self.d = zstandard.ZstdDecompressor()

    def compress(self, x):
        return self.c.compress(x.view(torch.uint8).numpy().tobytes())

    def decompress(self, blob, like):
        return torch.frombuffer(bytearray(self.d.decompress(blob)), dtype=like.dtype)


class ZipNN(Method):
    name = "ZipNN"
    _NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

    def __init__(self):
        import zipnn
        self.zipnn = zipnn
        self.z = {}

    def _for(self, dtype):
        if dtype not in self.z:
            self.z[dtype] = self.zipnn.ZipNN(input_format="byte",
                                             bytearray_dtype=self._NAMES[dtype], threads=1)
        return self.z[dtype]

    def compress(self, x):
        # a fresh buffer: compress rewrites its input in place
        return self._for(x.dtype).compress(bytearray(x.view(torch.uint8).numpy().tobytes()))

    def decompress(self, blob, like):
        return torch.frombuffer(bytearray(self._for(like.dtype).decompress(blob)), dtype=like.dtype)


def methods() -> list:
    out = [Zipccl("fixed3"), Zipccl("dense")]
    for cls in (ZipNN, Zstd):
        try:
            out.append(cls())
        except ImportError:
            print(f"({cls.name} not installed: pip install '.[bench]')")
    return out


def capture(recipe: str, folder: Path, steps: str, per_kind: int) -> None:
    """Run ``zipccl titan`` on a recipe with captures at ``steps``."""
    last = max(int(s) for s in steps.split(","))
    cmd = [sys.executable, "-m", "zipccl_fsdp.cli", "titan", "--recipe",
           str(ROOT / "recipes" / f"{recipe}.toml"), "--steps", str(last), "--capture",
           str(per_kind), "--capture-steps", steps, "--dump-folder", str(folder)]
    print("$", " ".join(cmd), flush=True)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def messages(folder: Path) -> dict:
    """{(kind, dtype, step): [tensors]} of every capture file of a recipe's folder."""
    from safetensors.torch import load_file
    groups: dict = {}
    for path in sorted(glob.glob(str(folder / "capture_rank*.safetensors"))):
        meta = read_capture_metadata(path)
        for name, t in load_file(path).items():
            rec = meta[name]
            if t.dtype in SM_BITS and t.numel():
                groups.setdefault((rec["kind"], rec["dtype"], rec["step"]), []).append(t.reshape(-1))
    return groups


def measure(msgs: list, ms: list) -> dict:
    raw = sum(m.numel() * m.element_size() for m in msgs)
    row = dict(raw=raw, n=len(msgs), bound=8 * raw / sum(bound_bits(m) for m in msgs))
    reps = min(MAX_TIMED_REPS, max(1, math.ceil(MIN_TIMED_NBYTES / raw)))
    for meth in ms:
        size, exact = 0, True
        blobs = []
        for m in msgs:
            keep = m.clone()
            blob = meth.compress(m)
            y = meth.decompress(blob, m)
            exact &= torch.equal(y.reshape(-1).view(INT[m.element_size()]),
                                 keep.view(INT[m.element_size()]))
            size += meth.size(blob)
            blobs.append(blob)
        t0 = time.process_time()
        for _ in range(reps):
            for m in msgs:
                meth.compress(m)
        enc = (time.process_time() - t0) / reps
        t0 = time.process_time()
        for _ in range(reps):
            for m, b in zip(msgs, blobs):
                meth.decompress(b, m)
        dec = (time.process_time() - t0) / reps
        row[meth.name] = dict(ratio=raw / size, wire=size, enc=raw / max(enc, 1e-9) / 1e9,
                              dec=raw / max(dec, 1e-9) / 1e9, exact=exact)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--captures", required=True, type=Path,
                   help="folder with one subfolder of captures per recipe")
    p.add_argument("--run", action="store_true", help="capture first (runs each recipe)")
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--steps", default="1,15,30", help="training steps captured (--run)")
    p.add_argument("--per-kind", type=int, default=8, help="messages of each kind per step (--run)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    torch.set_num_threads(1)
    ms = methods()
    names = [m.name for m in ms]
    print(f"real_traffic: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load {os.getloadavg()[0]:.1f}, 1 thread, C++ isa {codec_cpp.isa()}; ratio = raw / "
          f"compressed bytes over the messages, each compressed on its own; GB/cpu-s = input "
          f"bytes per CPU-second, encode / decode")
    head = "| layout | kind | dtype | step | msgs | raw MB | bound | " + " | ".join(names) + " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    rows, totals = [], {}
    for recipe in args.recipes.split(","):
        folder = args.captures / recipe
        if args.run:
            capture(recipe, folder, args.steps, args.per_kind)
        groups = messages(folder)
        if not groups:
            print(f"| {LAYOUTS.get(recipe, recipe)} | no captures in {folder} |")
            continue
        for (kind, dtype, step), msgs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
            r = measure(msgs, ms)
            cells = [f"{r[n]['ratio']:.3f} ({r[n]['enc']:.2f}/{r[n]['dec']:.2f})"
                     + ("" if r[n]["exact"] else " NOT EXACT") for n in names]
            layout = LAYOUTS.get(recipe, recipe)
            print(f"| {layout} | {kind} | {dtype} | {step} | {r['n']} | {r['raw'] / 1e6:.2f} | "
                  f"{r['bound']:.3f} | " + " | ".join(cells) + " |", flush=True)
            rows.append(dict(layout=layout, kind=kind, dtype=dtype, step=step, **r))
            t = totals.setdefault((layout, kind), dict(raw=0, **{n: 0 for n in names}))
            t["raw"] += r["raw"]
            for n in names:
                t[n] += r[n]["wire"]
    print("\nTotal wire bytes per (layout, kind), all steps and dtypes: ratio, and zipccl's best "
          "codec's wire bytes against each peer's (< 1: zipccl sends less)")
    head = "| layout | kind | raw MB | " + " | ".join(names) + " | best zipccl / ZipNN | best zipccl / zstd-3 |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for (layout, kind), t in totals.items():
        best = min(t["zipccl fixed3"], t["zipccl dense"])
        rel = [f"{best / t[n]:.3f}" if n in t else "-" for n in ("ZipNN", "zstd-3")]
        print(f"| {layout} | {kind} | {t['raw'] / 1e6:.2f} | "
              + " | ".join(f"{t['raw'] / t[n]:.3f}" for n in names) + " | " + " | ".join(rel) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if not all(r[n]["exact"] for r in rows for n in names if n.startswith("zipccl")):
        print("ERROR: a zipccl round trip was not bit-exact")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
