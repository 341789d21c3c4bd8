"""A pool of real gloo processes for distributed tests.

``DistPool(world)`` spawns ``world`` processes once, each with a gloo default
process group (file rendezvous, short timeout); ``pool.run(fn, *args)`` runs
``fn(*args)`` on every rank and returns the per-rank results in rank order, or
raises with each failing rank's traceback. Spawning costs a few seconds per
process on 2 cores, so a test module keeps one pool per world size (a fixture)
and sends it many small tasks. ``fn`` must be a module-level function of an
importable module (the test module itself is: pytest puts ``tests/`` on
``sys.path`` and spawn passes ``sys.path`` on).

A pool whose task failed or timed out is torn down and respawned on the next
``run``: a rank may still sit inside a collective its peers never joined.
"""
from __future__ import annotations

import datetime
import os
import queue
import tempfile
import time
import traceback

import torch.multiprocessing as mp

PG_TIMEOUT_S = 60
START_TIMEOUT_S = 300
"""How long a pool's ranks may take to start and join their process group."""


def _worker(rank: int, world: int, init_file: str, tasks, results, pg_timeout_s: int) -> None:
    import faulthandler

    faulthandler.enable(all_threads=True)  # a rank that aborts prints every thread's stack
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # world processes share 2 cores
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=pg_timeout_s))
    results.put((rank, None, "ready"))
    try:
        while True:
            item = tasks.get()
            if item is None:
                break
            fn, args, kwargs = item
            try:
                results.put((rank, True, fn(*args, **kwargs)))
            except BaseException:  # noqa: BLE001 - reported to the parent
                results.put((rank, False, traceback.format_exc()))
    finally:
        _stop_worker()
        dist.destroy_process_group()


def _stop_worker() -> None:
    """Shut zipccl down (``background.stop()``: its calls run, their Works
    waited, its references to process groups dropped, gloo's workers idle)
    before the process group goes: a gloo worker still about to take the GIL
    when the interpreter finalizes ends the process with SIGABRT."""
    import sys

    background = sys.modules.get("zipccl_fsdp.background")
    if background is not None:
        background.stop()


class DistPoolError(AssertionError):
    """A task failed on at least one rank, or timed out."""


class DistPool:
    """``world`` gloo processes that run tasks on demand (see the module docstring)."""

    def __init__(self, world: int, pg_timeout_s: int = PG_TIMEOUT_S) -> None:
        self.world = world
        self.pg_timeout_s = pg_timeout_s
        self._procs: list = []

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self._dir = tempfile.TemporaryDirectory(prefix="zipccl_pg_")
        init_file = os.path.join(self._dir.name, "rendezvous")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.world)]
        self._procs = [ctx.Process(target=_worker, daemon=True,
                                   args=(r, self.world, init_file, self._tasks[r],
                                         self._results, self.pg_timeout_s))
                       for r in range(self.world)]
        for p in self._procs:
            p.start()
        # Wait for every rank to join its process group before any task's
        # clock starts: spawning, importing torch and the rendezvous take as
        # long as the machine is loaded, and are no part of what a task's
        # timeout guards.
        ready: set = set()
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(ready) < self.world:
            try:
                rank, _, _ = self._results.get(timeout=1.0)
                ready.add(rank)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    missing = sorted(set(range(self.world)) - ready)
                    self.close()
                    raise DistPoolError(f"ranks {missing} did not join the process group "
                                        f"(dead processes: {dead})") from None

    def run(self, fn, *args, timeout_s: float | None = None, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results in rank order."""
        if not self._procs:
            self._start()
        timeout_s = timeout_s if timeout_s is not None else self.pg_timeout_s + 30
        for q in self._tasks:
            q.put((fn, args, kwargs))
        got: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < self.world:
            try:
                rank, ok, value = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    missing = sorted(set(range(self.world)) - set(got))
                    self.close()
                    raise DistPoolError(
                        f"{fn.__name__}: ranks {missing} gave no result (dead processes: "
                        f"{dead}; results so far: {got})") from None
                continue
            got[rank] = (ok, value)
        failed = {r: v for r, (ok, v) in got.items() if not ok}
        if failed:
            self.close()
            text = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(failed.items()))
            raise DistPoolError(f"{fn.__name__} failed on ranks {sorted(failed)}:\n{text}")
        return [got[r][1] for r in range(self.world)]

    def close(self) -> None:
        """Stop the processes (politely, then by force) and forget them."""
        if not self._procs:
            return
        for p, q in zip(self._procs, self._tasks):
            if p.is_alive():
                try:
                    q.put(None)
                except (OSError, ValueError):
                    pass
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs = []
        self._dir.cleanup()
