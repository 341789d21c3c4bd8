"""``zipccl bench link``: collectives raw vs zipccl over a real slow link.

As root, the ranks run inside a network namespace of our own whose loopback
is rate-limited with tc (``--rate``, default 1gbit), so gloo traffic crosses a
real bottleneck. Raw and compressed calls alternate in one run and the table
shows time ratios (raw / zipccl: above 1 means zipccl is faster).

Message size is the full tensor on each rank: the all-gather output, the
reduce-scatter input, the all-reduce tensor.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from .bench_codec import parse_size

# (collective, what data) measured by default
CASES = (("all_gather", "bf16"), ("reduce_scatter", "bf16-casts"), ("all_reduce", "bf16"))


def _data(kind: str, numel: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g)
    return x.bfloat16().float() if kind == "bf16-casts" else x.bfloat16()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------
# Worker: one rank
# --------------------------------------------------------------------------
def _worker(spec: dict) -> None:
    import torch.distributed as dist
    from . import collectives as zc
    from .config import ZipCCLConfig

    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(codec=spec["codec"], min_bytes=0)
    ag_raw = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs_raw = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    results = []
    for size in spec["sizes"]:
        for kind, data in spec["cases"]:
            itemsize = 4 if data == "bf16-casts" else 2
            numel = size // itemsize // world * world
            x = _data(data, numel, seed=rank)
            if kind == "all_gather":
                inp = x[: numel // world].clone()
                out = torch.empty(numel, dtype=x.dtype)
                raw = lambda: ag_raw(out, inp)  # noqa: E731
                zip_ = lambda: zc.all_gather_single(out, inp, config=cfg)  # noqa: E731
            elif kind == "reduce_scatter":
                out = torch.empty(numel // world, dtype=x.dtype)
                raw = lambda: rs_raw(out, x)  # noqa: E731
                zip_ = lambda: zc.reduce_scatter_single(out, x, config=cfg)  # noqa: E731
            else:
                buf = x.clone()
                raw = lambda: dist.all_reduce(buf)  # noqa: E731
                zip_ = lambda: zc.all_reduce(buf, config=cfg)  # noqa: E731
            times = {"raw": [], "zipccl": []}
            for i in range(spec["repeat"] + 1):  # first round warms up
                for name, fn in (("raw", raw), ("zipccl", zip_)):
                    dist.barrier()
                    t0 = time.perf_counter()
                    fn()
                    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank is the time
                    if i:
                        times[name].append(float(t))
            r = statistics.median(times["raw"])
            c = statistics.median(times["zipccl"])
            results.append(dict(collective=kind, data=data, size_mib=size / 2**20,
                                raw_ms=r * 1e3, zipccl_ms=c * 1e3, speedup=r / c))
            if rank == 0:
                print(f"  {kind:<15} {data:<11} {size / 2**20:>6.0f} MiB  raw {r * 1e3:8.1f} ms  "
                      f"zipccl {c * 1e3:8.1f} ms  x{r / c:.2f}", flush=True)
    if rank == 0:
        with open(spec["out"], "w") as fh:
            json.dump(results, fh)
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------
def run_ranks(spec: dict, nproc: int, prefix: list) -> list:
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        spec = dict(spec, out=os.path.join(tmp, "result.json"))
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as fh:
            json.dump(spec, fh)
        procs = []
        for rank in range(nproc):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                       OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // nproc)))
            procs.append(subprocess.Popen(
                [*prefix, sys.executable, "-m", "zipccl_fsdp.bench_link", "--worker", spec_path],
                env=env))
        try:
            codes = [p.wait() for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(codes):
            raise SystemExit(f"a rank failed (exit codes {codes})")
        with open(spec["out"]) as fh:
            return json.load(fh)


def format_table(rows: list, link: str) -> str:
    head = f"{'collective':<15} {'data':<11} {'MiB':>6} {'raw ms':>9} {'zipccl ms':>10} {'raw/zipccl':>10}"
    lines = [f"link: {link}", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['collective']:<15} {r['data']:<11} {r['size_mib']:>6.0f} {r['raw_ms']:>9.1f} "
                     f"{r['zipccl_ms']:>10.1f} {r['speedup']:>10.2f}")
    return "\n".join(lines)


def plot(rows: list, path: str, link: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, data in sorted({(r["collective"], r["data"]) for r in rows}):
        pts = [(r["size_mib"], r["speedup"]) for r in rows
               if r["collective"] == kind and r["data"] == data]
        ax.plot(*zip(*pts), marker="o", label=f"{kind} ({data})")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (MiB)")
    ax.set_ylabel("speedup (raw time / zipccl time)")
    ax.set_title(f"zipccl vs raw, {link}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rate", default="1gbit",
                   help="tc rate of the namespace loopback, e.g. 1gbit, 10gbit, or 'none' for "
                        "unthrottled (default: 1gbit)")
    p.add_argument("--sizes", default="1MiB,4MiB,16MiB,64MiB,256MiB",
                   help="comma-separated message sizes (default: 1MiB..256MiB)")
    p.add_argument("--nproc", type=int, default=2, help="ranks (default: 2)")
    p.add_argument("--codec", default="auto", help="zipccl codec (default: auto)")
    p.add_argument("--repeat", type=int, default=3, help="timed rounds per row (median; default 3)")
    p.add_argument("--csv", metavar="FILE", help="write the rows to this CSV file")
    p.add_argument("--plot", metavar="FILE.png", help="plot speedup against message size")
    p.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from .netns import can_shape, slow_link
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    spec = dict(sizes=sizes, cases=CASES, codec=args.codec, repeat=args.repeat)
    rate = None if args.rate.lower() in ("none", "unlimited", "0") else args.rate
    ok, why = can_shape()
    if ok:
        link = f"namespace loopback shaped to {rate}" if rate else "namespace loopback, unthrottled"
        print(f"zipccl bench link: {args.nproc} ranks, {link}, median of {args.repeat}", flush=True)
        with slow_link(rate) as ns:
            rows = run_ranks(spec, args.nproc, ns.prefix())
    else:
        link = f"plain loopback, unthrottled ({why}: cannot create a shaped namespace)"
        print(f"zipccl bench link: {link}", flush=True)
        rows = run_ranks(spec, args.nproc, [])
    print(format_table(rows, link))
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["link", *rows[0]])
            w.writeheader()
            for r in rows:
                w.writerow({"link": link, **r})
    if args.plot:
        plot(rows, args.plot, link)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        with open(sys.argv[2]) as fh:
            _worker(json.load(fh))
    else:
        raise SystemExit("use: zipccl bench link")
