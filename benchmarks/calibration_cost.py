"""What the adaptive policy's calibration costs on an FSDP2 process group.

Two gloo ranks train a small model under ``fully_shard``
with bf16 parameters and fp32 gradient reduction (both dtypes calibrate),
with a ``ZipCCLHook()`` of the default config (``policy="adaptive"``,
every speed measured). For each run it prints, per rank: the seconds spent
in the policy's first decisions on the group (``Policy.gate``, which
measures the link and the codec and runs the in-situ A/B; the time of
each part beside it), the collectives those issued, and the bytes this
rank sent for them
(``stats()["calibration"]["wire_bytes"]``); and the first and the median
later step times.

    python benchmarks/calibration_cost.py                 # 3 runs
    python benchmarks/calibration_cost.py --runs 5 --layers 4 --dim 512
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)


def _count_collectives(counter: dict) -> None:
    """Count the collectives issued while ``counter["inside"]`` holds: every
    name the calibration and the pipelined schedule reach torch by."""
    import torch.distributed as dist

    from zipccl_fsdp import calibration, protocol

    def counted(fn):
        def wrapper(*args, **kwargs):
            if counter["inside"]:
                counter["collectives"] += 1
            return fn(*args, **kwargs)
        return wrapper

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                counter[name] = counter.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    for name, part in (("measure_link_local", "link"), ("measure_codec_local", "codec"),
                       ("measure_reduce_local", "codec"), ("measure_ab_local", "ab")):
        setattr(calibration, name, timed(part, getattr(calibration, name)))
    calibration._all_gather = counted(calibration._all_gather)
    protocol.all_gather_single = counted(protocol.all_gather_single)
    for name in ("all_reduce", "all_to_all_single", "broadcast"):
        setattr(dist, name, counted(getattr(dist, name)))


def _rank(rank: int, world: int, init: str, args, queue) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    from zipccl_fsdp import policy
    from zipccl_fsdp.hooks.registry import ZipCCLHook

    counter = {"inside": False, "collectives": 0, "seconds": 0.0}
    _count_collectives(counter)
    gate = policy.Policy.gate

    def timed_gate(self, *a, **k):
        outer = not counter["inside"]
        counter["inside"] = True
        t0 = time.perf_counter()
        try:
            return gate(self, *a, **k)
        finally:
            if outer:
                counter["inside"] = False
                counter["seconds"] += time.perf_counter() - t0

    policy.Policy.gate = timed_gate
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.dim, args.dim) for _ in range(args.layers)])
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    hook = ZipCCLHook()
    model.register_comm_hook(hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    steps = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = model(torch.randn(8, args.dim, generator=g)).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        steps.append(time.perf_counter() - t0)
    cal = hook.stats()["calibration"]
    parts = tuple(counter.get(k, 0.0) for k in ("link", "codec", "ab"))
    queue.put((rank, counter["seconds"], counter["collectives"], cal["wire_bytes"], parts,
               steps))
    from zipccl_fsdp import background

    background.stop()
    dist.destroy_process_group()


def one_run(args) -> list:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        procs = [ctx.Process(target=_rank, args=(r, 2, init, args, queue)) for r in range(2)]
        for p in procs:
            p.start()
        rows = sorted(queue.get(timeout=600) for _ in procs)
        for p in procs:
            p.join(timeout=120)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--dim", type=int, default=256)
    args = p.parse_args()
    # Build or load the C++ codec here, once: its first-use build is not the
    # calibration's cost (the ranks then load it).
    from zipccl_fsdp import codec_cpp

    backend = "cpp" if codec_cpp.available() else f"torch ({codec_cpp.unavailable_reason()})"
    print(f"FSDP2, 2 gloo ranks, {args.layers} x Linear({args.dim}), bf16 params, fp32 "
          f"reduce, ZipCCLHook() (adaptive, measured), codec backend {backend}; "
          f"{args.runs} runs")
    head = (f"{'run':>4}{'rank':>5}{'calib s':>9}{'link s':>8}{'codec s':>9}{'A/B s':>7}"
            f"{'collectives':>12}{'calib MB':>10}{'first step s':>14}{'later step s':>14}")
    print(head)
    print("-" * len(head))
    seconds, sent = [], []
    for run in range(1, args.runs + 1):
        for rank, secs, colls, wire, (link, codec, ab), steps in one_run(args):
            seconds.append(secs)
            sent.append(wire)
            print(f"{run:>4}{rank:>5}{secs:>9.2f}{link:>8.2f}{codec:>9.2f}{ab:>7.2f}"
                  f"{colls:>12}{wire / 1e6:>10.1f}"
                  f"{steps[0]:>14.2f}{statistics.median(steps[1:]):>14.3f}")
    print("-" * len(head))
    print(f"median over runs and ranks: {statistics.median(seconds):.2f} s, "
          f"{statistics.median(sent) / 1e6:.1f} MB sent per rank")


if __name__ == "__main__":
    main()
