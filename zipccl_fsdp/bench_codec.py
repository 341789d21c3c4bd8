"""``zipccl bench codec``: ratio and speed of each codec, side by side with
zstd level 3 and a plain tensor copy measured in the same run.

Speeds are input bytes per second, the median of ``--repeat`` runs after one
warm-up. The copy row is ``copy_`` into a tensor allocated once beforehand,
timed the same way: one warm pass over the data, the physical ceiling of this
machine for a codec that reads its input and writes its output (``clone()``
would also time an allocation and its first-touch page faults, which an
encoder into a reused buffer does not pay). Each timed run calls a method
enough times to cover ``MIN_TIMED_NBYTES`` of input, so a small tensor's
figure is not timer noise. Compare ratios of rows, not absolute numbers
across runs.

Inputs: synthetic data (``--data``), or the float tensors of safetensors
files (``--input``, repeatable; a folder means its ``*.safetensors``). A
capture of ``zipccl titan --capture`` is read per collective kind and dtype,
its messages concatenated: zstd then also finds what repeats across messages
(FSDP2 gathers the same parameters in forward and backward), which no
per-message compressor sees; ``benchmarks/real_traffic.py`` codes every
message on its own.
"""
from __future__ import annotations

import argparse
import csv
import glob
import math
import os
import platform
import re
import statistics
import time

import torch

from . import codec as C

_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
           "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}
_INPUTS = ("gauss", "bf16-casts", "zeros30", "masked30")


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMG]i?B?|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected e.g. 64MiB, 1GiB, 4096")
    unit = (m.group(2) or "B").upper().rstrip("B").rstrip("I")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit])


def synthetic(kind: str, nbytes: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "bf16-casts":
        dtype = torch.float32
    n = max(nbytes // torch.empty(0, dtype=dtype).element_size(), 1)
    if kind == "bf16-casts":
        return torch.randn(n, generator=g).bfloat16().float()
    x = torch.randn(n, generator=g).to(dtype)
    if kind == "zeros30":
        x[torch.rand(n, generator=g) < 0.3] = 0
    if kind == "masked30":  # x * mask: zeros of both signs
        x = x * (torch.rand(n, generator=g) >= 0.3).to(dtype)
    return x


MIN_TIMED_NBYTES = 16 << 20
"""Input bytes each timed run covers at least (a smaller input is coded
several times per run)."""


def input_files(paths) -> list:
    """The .safetensors files of ``paths`` (files, or folders of them)."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            found = sorted(glob.glob(os.path.join(p, "*.safetensors")))
            if not found:
                raise SystemExit(f"{p} holds no .safetensors file")
            out += found
        else:
            out.append(p)
    return out


def load_safetensors(path: str, tensor: str | None = None) -> dict:
    """Float tensors of a .safetensors file, concatenated per dtype (per
    collective kind and dtype for a zipccl capture)."""
    from safetensors.torch import load_file

    from .capture import read_capture_metadata
    tensors = load_file(path)
    meta = read_capture_metadata(path)
    if tensor is not None:
        if tensor not in tensors:
            raise SystemExit(f"{path} has no tensor {tensor!r}; it has {sorted(tensors)[:10]}")
        tensors = {tensor: tensors[tensor]}
    groups: dict = {}
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype in (torch.bfloat16, torch.float16, torch.float32) and t.numel():
            kind = meta.get(name, {}).get("kind")
            groups.setdefault((kind, t.dtype), []).append(t.reshape(-1))
    if not groups:
        raise SystemExit(f"{path} holds no bf16/fp16/fp32 tensors")
    base = os.path.basename(path)
    return {f"{base}:{kind + ':' if kind else ''}{str(d).split('.')[-1]}": torch.cat(ts)
            for (kind, d), ts in groups.items()}


def _time(fn, repeat: int, calls: int = 1) -> float:
    """Median over ``repeat`` runs of the seconds per call, each run timing
    ``calls`` calls back to back, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def _bits(t):
    return t.reshape(-1).view({2: torch.int16, 4: torch.int32}[t.element_size()])


def measure(name: str, x: torch.Tensor, codecs, backend: str, repeat: int, zstd: bool) -> list:
    nbytes = x.numel() * x.element_size()
    calls = max(1, math.ceil(MIN_TIMED_NBYTES / max(nbytes, 1)))
    gbs = lambda s: nbytes / s / 1e9  # noqa: E731
    dst = torch.empty_like(x)
    rows = [dict(input=name, method="copy_ (warm)", ratio=1.0,
                 enc_gbs=gbs(_time(lambda: dst.copy_(x), repeat, calls)), dec_gbs=None,
                 exact="-")]
    for codec in codecs:
        payload = C.encode(x, codec=codec, backend=backend)
        out = torch.empty_like(x)
        enc = _time(lambda: C.encode(x, codec=codec, backend=backend), repeat, calls)
        dec = _time(lambda: C.decode(payload, out=out, backend=backend), repeat, calls)
        exact = torch.equal(_bits(out), _bits(x))
        rows.append(dict(input=name, method=f"zipccl {codec}", ratio=nbytes / payload.numel(),
                         enc_gbs=gbs(enc), dec_gbs=gbs(dec), exact="yes" if exact else "NO"))
    if zstd:
        try:
            import zstandard
        except ImportError:
            rows.append(dict(input=name, method="zstd-3 (not installed)", ratio=None,
                             enc_gbs=None, dec_gbs=None, exact="-"))
        else:
            raw = x.reshape(-1).view(torch.uint8).numpy().tobytes()
            comp = zstandard.ZstdCompressor(level=3, threads=0)
            blob = comp.compress(raw)
            dctx = zstandard.ZstdDecompressor()
            enc = _time(lambda: comp.compress(raw), repeat, calls)
            dec = _time(lambda: dctx.decompress(blob), repeat, calls)
            rows.append(dict(input=name, method="zstd level 3", ratio=nbytes / len(blob),
                             enc_gbs=gbs(enc), dec_gbs=gbs(dec),
                             exact="yes" if dctx.decompress(blob) == raw else "NO"))
    return rows


def format_table(rows: list) -> str:
    wide = max([26] + [len(r["input"]) for r in rows])
    head = f"{'input':<{wide}} {'method':<18} {'ratio':>7} {'enc GB/s':>9} {'dec GB/s':>9} {'exact':>5}"
    lines = [head, "-" * len(head)]
    f = lambda v, p: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in rows:
        lines.append(f"{r['input']:<{wide}} {r['method']:<18} {f(r['ratio'], 3):>7} "
                     f"{f(r['enc_gbs'], 3):>9} {f(r['dec_gbs'], 3):>9} {r['exact']:>5}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", metavar="FILE.safetensors", action="append",
                   help="measure the float tensors of this file (e.g. a zipccl capture, "
                        "per collective kind and dtype) instead of synthetic data; "
                        "repeatable; a folder means its *.safetensors files")
    p.add_argument("--tensor", help="with --input: only this tensor of the file")
    p.add_argument("--data", choices=_INPUTS, default="gauss",
                   help="synthetic input: Gaussian values, fp32 exact bf16 casts, "
                        "Gaussian with 30%% exact +0.0, or Gaussian times a 30%% zero "
                        "mask (+0.0 and -0.0) (default: gauss)")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16",
                   help="dtype of the synthetic input (default: bf16)")
    p.add_argument("--size", type=parse_size, default=parse_size("64MiB"),
                   help="bytes of synthetic input, e.g. 16MiB, 1GiB (default: 64MiB)")
    p.add_argument("--codecs", default="fixed3,dense",
                   help=f"comma-separated codecs to measure, of {','.join(C.CODECS)}")
    p.add_argument("--backend", default="auto", choices=C.BACKENDS,
                   help="codec backend (default: auto = cpp on CPU, triton on CUDA)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per row (median)")
    p.add_argument("--no-zstd", action="store_true", help="skip the zstd level 3 baseline")
    p.add_argument("--csv", metavar="FILE", help="append the rows to this CSV file")


def run(args: argparse.Namespace) -> int:
    codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    for c in codecs:
        if c not in C.CODECS:
            raise SystemExit(f"unknown codec {c!r}; choose from {', '.join(C.CODECS)}")
    if args.input:
        inputs = {}
        for path in input_files(args.input):
            inputs.update(load_safetensors(path, args.tensor))
    else:
        dtype = _DTYPES[args.dtype]
        x = synthetic(args.data, args.size, dtype)
        inputs = {f"{args.data} {str(x.dtype).split('.')[-1]} {x.numel() * x.element_size() / 2**20:.0f}MiB": x}
    backend_note = args.backend
    if args.backend == "auto":
        from . import codec_cpp
        backend_note = "cpp" if codec_cpp.available() else "torch (cpp extension unavailable)"
    print(f"zipccl bench codec: backend {backend_note}, {torch.get_num_threads()} threads, "
          f"median of {args.repeat} runs, each of at least {MIN_TIMED_NBYTES >> 20} MiB of input, "
          f"GB/s = input bytes per second")
    rows = []
    for name, x in inputs.items():
        rows += measure(name, x, codecs, args.backend, args.repeat, not args.no_zstd)
    print(format_table(rows))
    if any(r["exact"] == "NO" for r in rows):
        print("ERROR: a round trip was not bit-exact")
        return 1
    if args.csv:
        new = not os.path.exists(args.csv)
        with open(args.csv, "a", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["time", "host", "torch", "backend", *rows[0]])
            if new:
                w.writeheader()
            stamp = dict(time=time.strftime("%Y-%m-%dT%H:%M:%S"), host=platform.node(),
                         torch=torch.__version__, backend=backend_note)
            for r in rows:
                w.writerow({**stamp, **r})
    return 0
