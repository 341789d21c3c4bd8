"""What the multi-rank benchmark scripts share: running a function on spawned gloo ranks."""
from __future__ import annotations

import datetime
import os
import queue
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank_main(rank: int, world: int, init_file: str, timeout_s: float, fn, args: tuple,
               q) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        q.put((rank, fn(*args)))
    finally:
        from zipccl_fsdp import background

        background.stop()  # no zipccl call or Work left inside gloo when the group goes
        dist.destroy_process_group()


def run_gloo_ranks(name: str, fn, args: tuple = (), *, world: int = 2,
                   timeout_s: float = 60) -> dict | None:
    """Run ``fn(*args)`` in ``world`` spawned processes, one gloo rank each
    (one thread each; ``timeout_s`` for every collective); return ``{rank:
    result}``. ``fn`` must be importable by the children (a module-level
    function). When a rank dies, the others are killed, ``name: a rank died``
    is printed (its traceback is above) and the result is None.

    Example::

        >>> results = run_gloo_ranks("soak", soak, (steps,))
        >>> if results is None:
        ...     return 2
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    results = {}
    with tempfile.TemporaryDirectory(prefix=f"zipccl_{name}_") as d:
        procs = [ctx.Process(target=_rank_main,
                             args=(r, world, os.path.join(d, "rdv"), timeout_s, fn, args, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        while len(results) < world:
            try:
                rank, res = q.get(timeout=5)
                results[rank] = res
            except queue.Empty:
                if any(not p.is_alive() for p in procs):
                    for p in procs:
                        p.kill()
                    print(f"{name}: a rank died (its traceback is above)")
                    return None
        for p in procs:
            p.join()
    return results
