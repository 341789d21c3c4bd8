"""What each training layout really sends, and how well each codec codes it.

Runs each CPU layout recipe (HSDP, TP + FSDP, MoE with expert parallelism;
4 gloo ranks) for ``--steps`` steps with zipccl's comms, capturing the inputs
of the first ``--per-kind`` calls of every collective kind at an early, a
middle and the last step (``zipccl titan --capture N --capture-steps``), then
prints one row per (layout, kind, dtype, step) over every rank's captured
tensors:

- raw MB: the bytes of the captured tensors;
- H exp: the empirical entropy of their 8-bit exponents, in bits;
- bound: the ratio if the exponent took H exp bits and sign and mantissa went
  raw (``bits / (bits - 8 + H exp)``); fp32 gradients that are bf16 casts
  have 16 zero low mantissa bits the codec drops, so its ratio can exceed it;
- the ratio (raw / encoded bytes, headers included) of each codec, with
  every payload checked to decode back bit for bit.

Usage::

    python benchmarks/traffic_table.py --steps 60            # the three layouts
    python benchmarks/traffic_table.py --steps 300 --layouts hsdp --csv t.csv
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = {
    "hsdp": "recipes/llama3_tiny_hsdp_cpu.toml",
    "tp_fsdp": "recipes/llama3_tiny_tp_fsdp_cpu.toml",
    "moe_ep": "recipes/deepseek_v3_tiny_ep_cpu.toml",
}
CODECS = ("fixed3", "dense")
_EXP = {torch.bfloat16: (torch.int16, 7, 16), torch.float32: (torch.int32, 23, 32)}
"""dtype -> (integer view, exponent shift, bits)."""


def exponent_entropy(x: torch.Tensor) -> float:
    """Empirical entropy (bits) of the 8-bit exponent field of a bf16/fp32 tensor."""
    view, shift, _ = _EXP[x.dtype]
    exp = (x.view(view).to(torch.int64) >> shift) & 0xFF
    p = torch.bincount(exp.reshape(-1), minlength=256).double()
    p = p[p > 0] / p.sum()
    return float(-(p * p.log2()).sum())


def codec_ratio(x: torch.Tensor, codec: str) -> float:
    import zipccl_fsdp

    payload = zipccl_fsdp.encode(x, codec=codec, backend="torch")
    back = zipccl_fsdp.decode(payload)
    view = _EXP[x.dtype][0]
    if not torch.equal(back.view(view), x.view(view)):
        raise AssertionError(f"{codec} did not decode back bit for bit")
    return x.numel() * x.element_size() / payload.numel()


def run_layout(name: str, steps: int, per_kind: int, dump: Path) -> dict[int, Path]:
    """Train ``name``'s recipe; return {step: folder of its capture files}."""
    capture_steps = sorted({1, max(1, steps // 2), steps})
    cmd = [sys.executable, "-m", "zipccl_fsdp.cli", "titan", "--recipe", str(REPO / LAYOUTS[name]),
           "--steps", str(steps), "--dump-folder", str(dump), "--capture", str(per_kind),
           "--capture-steps", ",".join(map(str, capture_steps))]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: zipccl titan exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    return {s: dump for s in capture_steps}


def rows_for(name: str, dump: Path, steps: list[int]) -> list[dict]:
    from safetensors.torch import load_file

    from zipccl_fsdp.capture import read_capture_metadata

    groups: dict = defaultdict(list)
    for step in steps:
        for path in sorted(dump.glob(f"capture_rank*_step{step}.safetensors")):
            meta = read_capture_metadata(str(path))
            for tname, x in load_file(str(path)).items():
                if x.dtype in _EXP and x.numel() > 0:
                    groups[(meta[tname]["kind"], x.dtype, step)].append(x.reshape(-1))
    rows = []
    def order(item):
        (kind, dtype, step), _ = item
        return kind, str(dtype), step

    for (kind, dtype, step), tensors in sorted(groups.items(), key=order):
        x = torch.cat(tensors)
        h = exponent_entropy(x)
        bits = _EXP[dtype][2]
        row = {"layout": name, "kind": kind, "dtype": str(dtype).split(".")[-1], "step": step,
               "tensors": len(tensors), "raw_MB": x.numel() * x.element_size() / 1e6,
               "H_exp": h, "bound": bits / (bits - 8 + h)}
        for codec in CODECS:
            # Per captured tensor, as the collectives encode them; summed bytes.
            raw = sum(t.numel() * t.element_size() for t in tensors)
            enc = sum(t.numel() * t.element_size() / codec_ratio(t, codec) for t in tensors)
            row[codec] = raw / enc
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60, help="training steps per layout")
    p.add_argument("--per-kind", type=int, default=4,
                   help="tensors of each kind captured per rank at each captured step")
    p.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS))
    p.add_argument("--dump-folder", help="keep the runs here (default: a temporary folder)")
    p.add_argument("--csv", help="also write the rows to this CSV file")
    p.add_argument("--reuse", action="store_true",
                   help="read the captures an earlier run left in --dump-folder; train nothing")
    args = p.parse_args(argv)
    root = Path(args.dump_folder) if args.dump_folder else Path(tempfile.mkdtemp(prefix="traffic_"))
    rows = []
    if args.reuse and not args.dump_folder:
        raise SystemExit("--reuse needs --dump-folder")
    for name in args.layouts:
        if args.reuse:
            steps = sorted({1, max(1, args.steps // 2), args.steps})
        else:
            steps = sorted(run_layout(name, args.steps, args.per_kind, root / name))
        rows += rows_for(name, root / name, steps)
    head = (f"{'layout':<8} {'kind':<24} {'dtype':<9} {'step':>5} {'tensors':>7} {'raw MB':>8} "
            f"{'H exp':>6} {'bound':>6} " + " ".join(f"{c:>7}" for c in CODECS))
    print(f"traffic of {args.steps} steps, {args.per_kind} tensors of each kind per rank "
          f"at steps {sorted({1, max(1, args.steps // 2), args.steps})}; ratios raw/encoded")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['layout']:<8} {r['kind']:<24} {r['dtype']:<9} {r['step']:>5} {r['tensors']:>7} "
              f"{r['raw_MB']:>8.3f} {r['H_exp']:>6.2f} {r['bound']:>6.3f} "
              + " ".join(f"{r[c]:>7.3f}" for c in CODECS))
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
