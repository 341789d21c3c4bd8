"""Peak extra host memory of one collective call, raw vs compressed, as a fraction of its input.

Two gloo ranks. For each collective the input and output are allocated and
touched first; then the peak resident set size is reset (``/proc/self/
clear_refs`` = 5), the call runs, and ``VmHWM - VmRSS(before)`` is what the
call allocated at its peak (temporaries, payloads, send and receive buffers).
glibc is told to serve every allocation above 64 KiB with mmap
(``MALLOC_MMAP_THRESHOLD_``), so freed buffers leave the RSS at once and one
call's reuse of another's heap cannot hide its peak.

Modes: ``raw`` = zipccl with compression off (all-gather and all-to-all are
torch's own; the reduce-scatter is zipccl's raw all-to-all + fp32 sum, which
gloo needs); ``zipccl`` = compressed (min_bytes=0), with each CPU backend;
``+verify`` = the same with ``verify=True``; ``4 pieces`` = pipelined
(``pipeline_pieces=4``).

Usage::

    python benchmarks/collective_memory.py [--mib 16]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import run_gloo_ranks  # noqa: E402

from zipccl_fsdp.stats import KINDS  # noqa: E402


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _call(kind: str, x: torch.Tensor, out: torch.Tensor, cfg) -> None:
    from zipccl_fsdp import collectives as C
    if kind == "all_gather":
        C.all_gather_single(out, x, config=cfg)
    elif kind == "reduce_scatter":
        C.reduce_scatter_single(out, x, config=cfg)
    elif kind == "all_reduce":
        C.all_reduce(x, config=cfg)
    else:
        C.all_to_all_single(out, x, config=cfg)


def measure(mib: int) -> list:
    """Rows (kind, mode, input bytes, peak extra bytes) for this rank."""
    from zipccl_fsdp import codec_cpp
    from zipccl_fsdp.config import ZipCCLConfig
    world = dist.get_world_size()
    modes = [("raw", ZipCCLConfig(compress_all_gather=False, compress_reduce_scatter=False,
                                  compress_all_reduce=False, compress_all_to_all=False))]
    for backend in (["cpp"] if codec_cpp.available() else []) + ["torch"]:
        for verify in (False, True):
            name = f"zipccl {backend}" + (" +verify" if verify else "")
            modes.append((name, ZipCCLConfig(policy="always", min_bytes=0, backend=backend,
                                             verify=verify)))
        if backend == "cpp" and "pipeline_pieces" in ZipCCLConfig.__dataclass_fields__:
            modes.append((f"zipccl {backend} 4 pieces",
                          ZipCCLConfig(policy="always", min_bytes=0, backend=backend,
                                       pipeline_pieces=4)))
    rows = []
    g = torch.Generator().manual_seed(dist.get_rank())
    for kind in KINDS:
        dtype = torch.float32 if kind == "reduce_scatter" else torch.bfloat16
        n = (mib << 20) // torch.tensor([], dtype=dtype).element_size()
        n -= n % world
        base = torch.randn(n, generator=g)
        if kind == "reduce_scatter":
            base = base.bfloat16().float()  # FSDP2's fp32 reduce input: exact bf16 casts
        base = base.to(dtype)
        for name, cfg in modes:
            x = base.clone()
            out = {"all_gather": torch.zeros(world * n, dtype=dtype),
                   "reduce_scatter": torch.zeros(n // world, dtype=dtype),
                   "all_reduce": torch.zeros(0, dtype=dtype),
                   "all_to_all": torch.zeros(n, dtype=dtype)}[kind]
            _call(kind, x.clone() if kind == "all_reduce" else x, out, cfg)  # warm
            dist.barrier()
            before = _status("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            _call(kind, x, out, cfg)
            peak = _status("VmHWM")
            dist.barrier()
            rows.append((kind, name, x.numel() * x.element_size(), peak - before))
            del x, out
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=16)
    args = ap.parse_args(argv)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by the children's glibc at start
    world = 2
    results = run_gloo_ranks("collective_memory", measure, (args.mib,), world=world,
                             timeout_s=120)
    if results is None:
        return 2
    print(f"collective_memory: {args.mib} MiB input per rank, 2 gloo ranks, peak extra RSS "
          f"of one call (max over ranks), as a multiple of the input bytes")
    print(f"{'collective':<15} {'mode':<22} {'input MiB':>9} {'extra MiB':>10} {'x input':>8}")
    for i, (kind, name, nbytes, _) in enumerate(results[0]):
        extra = max(results[r][i][3] for r in range(world))
        print(f"{kind:<15} {name:<22} {nbytes / 2**20:>9.1f} {extra / 2**20:>10.1f} "
              f"{extra / nbytes:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
