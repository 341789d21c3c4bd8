"""Process exit under load: many runs of 2 gloo ranks that create and destroy
their process group, counting the runs a rank did not end with status 0.

Each run spawns ``--world`` processes (spawn: each exits through the full
interpreter shutdown, as the package's tests and scripts do). Each rank
creates a gloo process group, trains two steps of a small DDP model with the
zipccl hook (its calls run on zipccl's worker thread; with the raw policy
they return torch's pending Work) and runs one compressed all-reduce, then
shuts down the way ``tests/dist_utils.py`` does: ``background.stop()`` (the
worker's calls run and their Works waited) and ``destroy_process_group()``.
``--no-stop`` ends as a user's script does, with ``destroy_process_group()``
alone: zipccl's ``stop()`` is never called (it runs at interpreter exit,
as always). ``--work collectives`` runs the free functions instead of DDP:
an fp32 all-reduce with the default config and one with ``policy="always"``,
and an all-gather of 64 MiB of bf16 per rank with the default config.

Every rank enables ``faulthandler`` for all threads, so a rank that aborts
prints each Python thread's stack to stderr (so does one still running a
minute before the run's limit); ``--cores DIR`` also lets it
write a core file (``ulimit -c unlimited`` for the ranks; where the file
goes is the kernel's ``core_pattern``) for ``gdb -batch -ex "thread apply
all bt"``. The load average is printed at the start and at the end.

``--load`` starts one spinning process per core for the whole soak, so that
the ranks run on a machine whose cores are all busy; ``--load-nice N`` runs
those spinners at niceness N, so that on a machine already busy with other
work they fill the idle time without also taking the ranks' share.

Usage::

    python benchmarks/exit_soak.py --runs 200 --load
    python benchmarks/exit_soak.py --runs 200 --load --no-stop              # a user's script
    python benchmarks/exit_soak.py --runs 200 --load --no-stop --work collectives
"""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import signal
import sys
import tempfile
import time

import torch.multiprocessing as mp

PG_TIMEOUT_S = 20
RUN_LIMIT_S = 600  # a run that takes longer is counted as hung and killed


def _rank(rank: int, world: int, init_file: str, stop: bool, cores: str | None = None,
          work: str = "ddp") -> None:
    import faulthandler

    faulthandler.enable(all_threads=True)
    # A rank still running near the limit prints every thread's stack (then
    # the run is killed and counted as hung).
    faulthandler.dump_traceback_later(RUN_LIMIT_S - 60, exit=False)
    if cores:
        import resource

        os.chdir(cores)
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import zipccl_fsdp as Z
    from zipccl_fsdp import background

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    torch.manual_seed(0)
    if work == "collectives":
        x = torch.randn(1 << 20)
        Z.all_reduce(x)
        Z.all_reduce(x, config=Z.ZipCCLConfig(policy="always"))
        shard = torch.randn(32 << 20).to(torch.bfloat16)
        Z.all_gather_single(torch.empty(world * shard.numel(), dtype=shard.dtype), shard)
    else:
        net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
        for policy in ("always", "never"):  # "never": the worker hands back torch's pending Work
            model = DDP(net, bucket_cap_mb=0.005)
            model.register_comm_hook(None, Z.ZipCCLHook(Z.ZipCCLConfig(policy=policy,
                                                                       min_bytes=0)))
            for _ in range(2):
                model(torch.randn(8, 32)).square().mean().backward()
        x = torch.randn(3000)
        Z.all_reduce(x, config=Z.ZipCCLConfig(policy="always", min_bytes=0))
    if stop and hasattr(background, "stop"):  # (older checkouts have no stop())
        background.stop()
    dist.destroy_process_group()


def _spin(nice: int = 0) -> None:
    if nice:
        os.nice(nice)
    while True:
        pass


def one_run(ctx, world: int, stop: bool, cores: str | None = None, work: str = "ddp") -> list:
    """The ranks' exit codes (None: still running at the limit, then killed)."""
    with tempfile.TemporaryDirectory(prefix="zipccl_exit_") as d:
        procs = [ctx.Process(target=_rank,
                             args=(r, world, os.path.join(d, "rdv"), stop, cores, work))
                 for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + RUN_LIMIT_S
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        codes = [p.exitcode for p in procs]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    return codes


def _describe(code) -> str:
    if code is None:
        return "hung"
    if code < 0:
        return signal.Signals(-code).name
    return f"exit {code}"


def _loadavg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--load", action="store_true", help="keep every core busy meanwhile")
    ap.add_argument("--load-nice", type=int, default=0, metavar="N",
                    help="niceness of the --load spinners (default 0)")
    ap.add_argument("--no-stop", action="store_true",
                    help="never call background.stop(): destroy_process_group() alone")
    ap.add_argument("--work", choices=("ddp", "collectives"), default="ddp",
                    help="what the ranks run: DDP with the hook, or the free functions")
    ap.add_argument("--cores", metavar="DIR", help="let the ranks dump core, from DIR")
    args = ap.parse_args(argv)
    cores = os.path.abspath(args.cores) if args.cores else None
    print(f"exit_soak: start {datetime.datetime.now(datetime.timezone.utc):%H:%M:%S} UTC, "
          f"load average {_loadavg()}", flush=True)
    ctx = mp.get_context("spawn")
    burners = []
    if args.load:
        burners = [ctx.Process(target=_spin, args=(args.load_nice,), daemon=True) for _ in range(os.cpu_count() or 1)]
        for b in burners:
            b.start()
    bad = collections.Counter()
    t0 = time.monotonic()
    try:
        for i in range(args.runs):
            codes = one_run(ctx, args.world, not args.no_stop, cores, args.work)
            for rank, code in enumerate(codes):
                if code != 0:
                    bad[_describe(code)] += 1
                    print(f"run {i}: rank {rank} {_describe(code)}", flush=True)
            if (i + 1) % 10 == 0:
                print(f"{i + 1} runs, {time.monotonic() - t0:.0f} s, bad exits: {dict(bad)}",
                      flush=True)
    finally:
        for b in burners:
            b.kill()
            b.join(5)
    print(f"exit_soak: end {datetime.datetime.now(datetime.timezone.utc):%H:%M:%S} UTC, "
          f"load average {_loadavg()}", flush=True)
    how = "without" if args.no_stop else "with"
    print(f"exit_soak: {args.runs} runs of {args.world} ranks, {args.work} ({how} background.stop(); load: {len(burners)} spinning processes at nice {args.load_nice}), "
          f"{time.monotonic() - t0:.0f} s; rank exits other than 0: {dict(bad) or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
