"""A script that uses zipccl and ends with ``destroy_process_group()``, never
calling ``background.stop()``.

Each rank runs in a process of its own (spawned: it exits through the full
interpreter shutdown) and uses zipccl every way that keeps state about a
group: compressed and raw collectives on the default group and on a
subgroup (raw lanes, the last group looked up), and DDP with the hook (the
worker thread, zipccl's own group). After ``destroy_process_group()`` and
once the script's own objects are gone, no group may still be alive: a
group that is keeps gloo's worker threads running into interpreter
shutdown, where one that takes the GIL late aborts the process.
"""
from __future__ import annotations

import datetime
import os
import tempfile

import pytest
import torch.multiprocessing as mp

PG_TIMEOUT_S = 20
RUN_LIMIT_S = 240


def _rank(rank: int, world: int, init_file: str, ddp: bool) -> None:
    import faulthandler
    import gc
    import sys
    import weakref

    faulthandler.enable(all_threads=True)
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import zipccl_fsdp as Z
    from zipccl_fsdp import background

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    if ddp:
        # A DDP model keeps its group, and the default group, alive in torch
        # itself (not checked here); zipccl's own group must not outlive
        # destroy_process_group.
        group = dist.new_group(list(range(world)))
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)),
                    bucket_cap_mb=0.005, process_group=group)
        model.register_comm_hook(group, Z.ZipCCLHook())
        for _ in range(3):
            model(torch.randn(8, 32)).square().mean().backward()
        groups = {"zipccl's own": weakref.ref(background.own_group(group))}
        del model, group
    else:
        sub = dist.new_group(list(range(world)))
        _collectives(None)
        _collectives(sub)
        groups = {"default": weakref.ref(dist.group.WORLD), "subgroup": weakref.ref(sub)}
        del sub
    dist.destroy_process_group()
    gc.collect()
    alive = [name for name, ref in groups.items() if ref() is not None]
    if alive:
        print(f"rank {rank}: alive after destroy_process_group: {alive}", file=sys.stderr,
              flush=True)
        sys.exit(3)


def _collectives(group) -> None:
    """Compressed and raw calls on ``group``: the raw ones open lanes."""
    import torch

    import zipccl_fsdp as Z

    world = 2 if group is None else group.size()
    x = torch.randn(3000)
    out = torch.empty(3000 * world)
    Z.all_reduce(x, group=group, config=Z.ZipCCLConfig(policy="always", min_bytes=0))
    for _ in range(3):  # the default policy on loopback: raw, then through a lane
        Z.all_reduce(x, group=group)
        Z.all_gather_single(out, x, group=group)


def _run(ddp: bool, world: int = 2) -> list:
    """The ranks' exit codes (None: still running at the limit, then killed)."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="zipccl_exit_") as d:
        procs = [ctx.Process(target=_rank, args=(r, world, os.path.join(d, "rdv"), ddp))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(RUN_LIMIT_S)
        codes = [p.exitcode for p in procs]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    return codes


@pytest.mark.parametrize("ddp", [False, True], ids=["collectives", "ddp"])
def test_no_group_outlives_destroy_and_the_ranks_exit_cleanly(ddp):
    # Exit code 3: a group outlived destroy_process_group (the run's stderr
    # names it); a negative code: the signal a rank died of.
    for _ in range(2):
        assert _run(ddp) == [0, 0]
