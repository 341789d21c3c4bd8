"""How many project files and function calls one compressed all-gather walks through.

Runs ``zipccl_fsdp.collectives.all_gather_single`` with ``policy="always"``
on two gloo ranks (CPU, loopback) and records, with ``sys.setprofile`` on
the calling thread of rank 0, every call of a Python function defined in the
project's sources (``zipccl_fsdp/``, ``hooks/``, ``triton_kernels/``).
Prints, for the first call (which also checks the config's agreement) and
for a later one (the steady state), the distinct project files entered in
the order first entered, the number of project function calls, and the
files that call each other, directly or around a loop (a call path that
goes back and forth between files, callbacks included: the reader of one
must read the other). The codec
backend is the torch one, so the walk does not depend on a C++ build.

    python tools/call_walk.py [--numel N] [--codec dense]
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = tuple(str(ROOT / d) + os.sep for d in ("zipccl_fsdp", "hooks", "triton_kernels"))


def _project(filename: str) -> str | None:
    """The file's path relative to the repository root, or None when it is not the project's."""
    return os.path.relpath(filename, ROOT) if filename.startswith(SOURCES) else None


def walk(fn) -> dict:
    """Run ``fn()`` under a profiler; return what it walked through (module docstring)."""
    files: list = []
    calls = 0
    edges: set = set()

    def profile(frame, event, _arg):
        nonlocal calls
        if event != "call":
            return
        here = _project(frame.f_code.co_filename)
        if here is None:
            return
        calls += 1
        if here not in files:
            files.append(here)
        back = frame.f_back
        while back is not None and _project(back.f_code.co_filename) is None:
            back = back.f_back  # through torch, the stdlib, ...: the last project caller
        if back is not None:
            caller = _project(back.f_code.co_filename)
            if caller != here:
                edges.add((caller, here))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return {"files": files, "calls": calls, "edges": sorted(edges),
            "loops": _loops(files, edges)}


def _loops(files: list, edges: set) -> list:
    """The sets of files that reach each other through the call edges (more than one file)."""
    reach = {f: {b for a, b in edges if a == f} for f in files}
    changed = True
    while changed:
        changed = False
        for f in files:
            more = set().union(*(reach[g] for g in reach[f])) - reach[f] if reach[f] else set()
            if more:
                reach[f] |= more
                changed = True
    loops = []
    for f in files:
        group = sorted({f} | {g for g in reach[f] if f in reach[g]})
        if len(group) > 1 and group not in loops:
            loops.append(group)
    return loops


def _rank(rank: int, world: int, init_file: str, numel: int, codec: str, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        from zipccl_fsdp import ZipCCLConfig
        from zipccl_fsdp.collectives import all_gather_single, stats

        cfg = ZipCCLConfig(policy="always", codec=codec, backend="torch", min_bytes=0)
        shard = torch.randn(numel, generator=torch.Generator().manual_seed(rank)).bfloat16()
        output = torch.empty(world * numel, dtype=torch.bfloat16)
        results = []
        for _ in range(3):
            results.append(walk(lambda: all_gather_single(output, shard, config=cfg)))
        assert stats()["all_gather"]["compressed_calls"] == 3, stats()["all_gather"]
        if rank == 0:
            out.put({"first": results[0], "steady": results[-1]})
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=1 << 16)
    parser.add_argument("--codec", default="dense")
    args = parser.parse_args()
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank, args=(r, 2, os.path.join(tmp, "init"), args.numel,
                                                 args.codec, out)) for r in range(2)]
        for p in procs:
            p.start()
        found = out.get(timeout=300)
        for p in procs:
            p.join(timeout=60)
    for name in ("first", "steady"):
        w = found[name]
        print(f"## {name} call: {len(w['files'])} project files, {w['calls']} project "
              f"function calls, {len(w['loops'])} sets of files that call each other")
        for i, f in enumerate(w["files"], 1):
            print(f"  {i:2d}. {f}")
        for group in w["loops"]:
            print("  calling each other: " + ", ".join(group))
            for a, b in w["edges"]:
                if a in group and b in group:
                    print(f"    {a} -> {b}")


if __name__ == "__main__":
    main()
