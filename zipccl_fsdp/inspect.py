"""``zipccl inspect FILE``: what a capture (.safetensors) or a payload file holds.

For a capture: one row per tensor with its kind, rank, step, dtype, size and
the ratio each codec reaches on it. For a payload (the bytes of
``zipccl_fsdp.encode``, e.g. saved with ``payload.numpy().tofile(path)``):
its header fields and how many chunks are coded or stored raw.
"""
from __future__ import annotations

import argparse

import torch

from . import codec as C
from . import format as F
from .capture import read_capture_metadata


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .safetensors capture (zipccl titan --capture N) or a payload file")
    p.add_argument("--codecs", default="fixed3,dense",
                   help="codecs whose ratio to show for each captured tensor")


def _inspect_payload(path: str) -> int:
    import numpy as np
    payload = torch.from_numpy(np.fromfile(path, dtype=np.uint8))
    h = F.parse_header(payload)
    print(f"{path}: zipccl payload, format version {F.VERSION}")
    print(f"  codec {h.codec}, dtype {str(h.dtype).split('.')[-1]}, shape {list(h.shape)}, "
          f"numel {h.numel}")
    raw = h.numel * F.DTYPES[h.dtype].itemsize
    print(f"  {payload.numel()} bytes for {raw} raw bytes: ratio {raw / max(payload.numel(), 1):.3f}")
    if h.codec != "raw" and h.nchunks:
        t, offsets = F.read_table(payload, h)
        coded, zero = int((t.mode == F.MODE_CODED).sum()), int((t.mode == F.MODE_ZERO).sum())
        print(f"  {h.nchunks} chunks of {h.chunk_elems}: {coded} coded, {zero} zero, "
              f"{h.nchunks - coded - zero} raw")
        n = F.chunk_lengths(h.numel, h.nchunks, h.chunk_elems, payload.device)
        n_low, _ = F.low_counts(payload, h, t, offsets)
        lens = [int(s.sum()) for s in F.segment_nbytes(h.codec, F.DTYPES[h.dtype], n, t, n_low)]
        print(f"  body {h.body_nbytes} B: codes {lens[0]} B, sm {lens[1]} B, rem {lens[2]} B, "
              f"esc {lens[3]} B, low {lens[4]} B, padding {h.body_nbytes - sum(lens)} B")
    return 0


def _inspect_capture(path: str, codecs: list) -> int:
    from safetensors.torch import load_file
    tensors = load_file(path)
    meta = read_capture_metadata(path)
    cols = "".join(f" {c:>8}" for c in codecs)
    head = f"{'tensor':<22} {'kind':<15} {'rank':>4} {'step':>4} {'dtype':<9} {'MiB':>8}{cols}"
    print(f"{path}: {len(tensors)} tensors" + ("" if meta else " (not a zipccl capture)"))
    print(head)
    print("-" * len(head))
    for name in sorted(tensors):
        t = tensors[name]
        m = meta.get(name, {})
        ratios = ""
        for c in codecs:
            if t.dtype in F.DTYPES and t.numel():
                ratios += f" {t.numel() * t.element_size() / C.encode(t, codec=c).numel():>8.3f}"
            else:
                ratios += f" {'-':>8}"
        print(f"{name:<22} {m.get('kind', '-'):<15} {m.get('rank', '-'):>4} {m.get('step', '-'):>4} "
              f"{str(t.dtype).split('.')[-1]:<9} {t.numel() * t.element_size() / 2**20:>8.2f}{ratios}")
    return 0


def run(args: argparse.Namespace) -> int:
    codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    with open(args.file, "rb") as fh:
        magic = fh.read(4)
    if magic == F.MAGIC:
        return _inspect_payload(args.file)
    try:
        return _inspect_capture(args.file, codecs)
    except Exception as exc:  # safetensors raises its own error types
        raise SystemExit(f"{args.file}: neither a zipccl payload nor a readable "
                         f".safetensors file ({exc})") from None
