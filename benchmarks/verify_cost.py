"""What integrity mode costs: encode + decode with and without ``verify``, side by side.

One tensor (64 MiB of Gaussian bf16 by default), every backend available on
this machine (or ``--backend``), codecs dense and fixed3. Runs are
interleaved (verify off, on, off, on, ...) and the best of ``--repeats`` is
kept, so a busy machine hurts both columns alike; compare the ratios, not the
absolute GB/s across runs. GB/s are of tensor bytes.

The cpp backend computes the checksums in C++, in the passes over each chunk
it makes anyway. The row ``cpp/torch-sums`` is the same codec with the
checksums computed by ``codec.chunk_sums`` (torch ops) and appended with a
copy of the payload, which is how verify ran before, and still runs on the
torch backend; it shares the interleaving, so the two rows compare directly.
With torch sums, ``--threads 1`` is steadier on a machine shared with other
busy processes: they are many small torch ops, and each parallel region waits
for a descheduled thread. The last lines time the checksum pass alone
(``chunk_sums``, and the C++ one), cold over the whole tensor.

Usage::

    python benchmarks/verify_cost.py [--mib 64] [--repeats 3] [--backend cpp]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import zipccl_fsdp as z  # noqa: E402
from zipccl_fsdp import codec as zcodec  # noqa: E402
from zipccl_fsdp import format as F  # noqa: E402

TORCH_SUMS = "cpp/torch-sums"


def backends() -> list:
    out = ["torch"]
    from zipccl_fsdp import codec_cpp
    if codec_cpp.available():
        out[:0] = ["cpp", TORCH_SUMS]
    return out


def _torch_sums_encode(x: torch.Tensor, codec: str, verify: bool) -> torch.Tensor:
    from zipccl_fsdp import codec_cpp
    payload = codec_cpp.encode(x, codec)
    return zcodec._add_checksums(payload, x) if verify else payload


def _torch_sums_decode(payload: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    from zipccl_fsdp import codec_cpp
    header = F.parse_header(payload)
    if not header.flags & F.HEADER_FLAG_CHECKSUM:
        return codec_cpp.decode(payload, header, out)
    codec_cpp.decode(payload[:header.sums_offset], dataclasses.replace(header, flags=0), out)
    zcodec._check_checksums(payload, header, zcodec._sums_bytes(zcodec.chunk_sums(out)))
    return out


def coders(backend: str):
    """(encode(x, codec, verify), decode(payload, out)) for a row of the table."""
    if backend == TORCH_SUMS:
        return _torch_sums_encode, _torch_sums_decode
    return (lambda x, codec, verify: z.encode(x, codec=codec, backend=backend, verify=verify),
            lambda payload, out: z.decode(payload, out=out, backend=backend))


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(x: torch.Tensor, rows: list, codec: str, repeats: int) -> dict:
    """Best encode and decode seconds per (row, verify), all interleaved."""
    res = {}
    out = torch.empty_like(x)
    payloads = {}
    for row in rows:
        enc, dec = coders(row)
        for v in (False, True):
            payloads[row, v] = enc(x, codec, v)
            assert torch.equal(dec(payloads[row, v], out).view(torch.int16), x.view(torch.int16))
    for _ in range(repeats):
        for row in rows:
            enc, dec = coders(row)
            for v in (False, True):
                e = _seconds(lambda: enc(x, codec, v))
                d = _seconds(lambda: dec(payloads[row, v], out))
                prev = res.get((row, v), (float("inf"), float("inf")))
                res[row, v] = (min(prev[0], e), min(prev[1], d))
    for row in rows:
        res[row, "grow"] = payloads[row, True].numel() / payloads[row, False].numel() - 1
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--backend", action="append", choices=("cpp", TORCH_SUMS, "torch"),
                    help="rows to run (repeatable; default: every one available)")
    ap.add_argument("--codec", action="append", choices=("dense", "fixed3"),
                    help="codecs to run (repeatable; default: both)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = args.backend or backends()
    x = torch.randn(args.mib << 19, generator=torch.Generator().manual_seed(0)).bfloat16()
    gb = x.numel() * x.element_size() / 1e9
    print(f"verify_cost: {args.mib} MiB Gaussian bf16, torch threads {torch.get_num_threads()}, "
          f"best of {args.repeats} (interleaved)")
    print(f"{'backend':<14} {'codec':<7} {'enc GB/s':>9} {'+verify':>8} {'dec GB/s':>9} "
          f"{'+verify':>8} {'enc+dec s':>10} {'+verify':>8} {'cost':>7} {'bytes +':>8}")
    for codec in args.codec or ("dense", "fixed3"):
        r = measure(x, rows, codec, args.repeats)
        for row in rows:
            (e0, d0), (e1, d1) = r[row, False], r[row, True]
            print(f"{row:<14} {codec:<7} {gb / e0:>9.3f} {gb / e1:>8.3f} {gb / d0:>9.3f} "
                  f"{gb / d1:>8.3f} {e0 + d0:>10.3f} {e1 + d1:>8.3f} "
                  f"{(e1 + d1) / (e0 + d0):>6.2f}x {100 * r[row, 'grow']:>7.3f}%")
    passes = [("chunk_sums (torch ops)", zcodec.chunk_sums)]
    if any(row in ("cpp", TORCH_SUMS) for row in rows):
        from zipccl_fsdp import codec_cpp
        passes.append(("codec_cpp.chunk_sums", codec_cpp.chunk_sums))
    for name, fn in passes:
        t = min(_seconds(lambda: fn(x)) for _ in range(args.repeats))
        print(f"{name} alone: {gb / t:.3f} GB/s ({t:.4f} s per pass)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
