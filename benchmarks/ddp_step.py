"""DDP step time: DDP's own all-reduce, torch's Python ``allreduce_hook``,
zipccl's hook, zipccl's hook made to wait for each bucket (how it ran before
raw buckets returned torch's pending Work), and zipccl's all-reduce called on
autograd's thread (how the hook ran before its worker thread).

Two gloo ranks of one thread each train one copy per way of one MLP (the
same initial weights and data), each wrapped in DDP with small buckets so
that communication can overlap backward. Each step picks a copy from a
seeded generator (the same on both ranks); the table gives median step times
and their ratios to the first way's. The hooks' results equal DDP's default
bit for bit on two ranks (checked at the end), raw or compressed.

On the plain loopback the adaptive policy sends every bucket raw. With
``--rate`` (root, ``ip`` and ``tc``) the ranks run inside a network namespace
whose loopback is limited to that rate (``zipccl_fsdp.netns``), where
buckets are compressed.

    python benchmarks/ddp_step.py                    # 8 x 1024 wide, 120 steps
    python benchmarks/ddp_step.py --width 512 --steps 60
    python benchmarks/ddp_step.py --rate 1gbit --dtype bf16 --ways ddp,zipccl --steps 40
"""
from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ReduceOp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import run_gloo_ranks  # noqa: E402

from zipccl_fsdp import collectives, zipccl_hook  # noqa: E402
from zipccl_fsdp.policy import of as policy_of  # noqa: E402

WAYS = ("ddp", "torch_hook", "zipccl", "zipccl_waits", "zipccl_inline")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _waiting_hook(state, bucket):
    """zipccl's hook, blocking until the bucket is reduced."""
    fut = zipccl_hook(state, bucket)
    fut.wait()
    return fut


def _inline_hook(state, bucket):
    """zipccl's hook as it ran before its worker thread: the all-reduce on
    autograd's thread (a compressed one completes before the hook returns)."""
    buf = bucket.buffer()
    work = collectives.all_reduce(buf, op=ReduceOp.AVG, async_op=True,
                                  config=zipccl_hook.config, stats=zipccl_hook.comm_stats)
    return work.get_future().then(lambda _: buf)


HOOKS = {"torch_hook": default_hooks.allreduce_hook, "zipccl": zipccl_hook,
         "zipccl_waits": _waiting_hook, "zipccl_inline": _inline_hook}


def measure(width: int, layers: int, batch: int, steps: int, bucket_mb: float,
            dtype: str = "fp32", ways: tuple = WAYS) -> dict:
    torch.manual_seed(0)
    base = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])
    base = base.to(DTYPES[dtype])
    models = {way: DDP(copy.deepcopy(base), bucket_cap_mb=bucket_mb) for way in ways}
    for way, model in models.items():
        if way in HOOKS:
            model.register_comm_hook(None, HOOKS[way])
    opts = {way: torch.optim.SGD(m.parameters(), lr=1e-3) for way, m in models.items()}
    data = {way: torch.Generator().manual_seed(dist.get_rank()) for way in ways}
    times = {way: [] for way in ways}
    order = random.Random(0)
    for i in range(steps + 3 * len(ways)):
        way = ways[i % len(ways)] if i < 3 * len(ways) else order.choice(ways)  # warm-up first
        x = torch.randn(batch, width, generator=data[way]).to(DTYPES[dtype])
        dist.barrier()
        t0 = time.perf_counter()
        opts[way].zero_grad(set_to_none=True)
        models[way](x).square().mean().backward()
        opts[way].step()
        if i >= 3 * len(ways):
            times[way].append(time.perf_counter() - t0)
    # Equal step counts per way would make the weights comparable; the draw
    # does not, so compare one more step of each from equal weights instead.
    same = True
    for way in ways[1:]:
        models[way].module.load_state_dict(models[ways[0]].module.state_dict())
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(7 + dist.get_rank()))
    x = x.to(DTYPES[dtype])
    grads = {}
    for way in ways:
        models[way].zero_grad(set_to_none=True)
        models[way](x).square().mean().backward()
        grads[way] = [p.grad.view(torch.int16 if dtype == "bf16" else torch.int32).clone()
                      for p in models[way].parameters()]
    for way in ways[1:]:
        same &= all(torch.equal(a, b) for a, b in zip(grads[ways[0]], grads[way]))
    return {**{way: statistics.median(t) * 1e3 for way, t in times.items()},
            "n": {way: len(t) for way, t in times.items()}, "bitwise_equal": same,
            "compressed": zipccl_hook.stats()["all_reduce"]["compressed_fraction"],
            "probes": [(p["link_bps"], p["slowdown"])
                       for p in policy_of(zipccl_hook.config, zipccl_hook.comm_stats)
                       .calibration.probes.values()]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=120, help="timed steps, all ways together")
    p.add_argument("--bucket-mb", type=float, default=4.0, help="DDP's bucket_cap_mb")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32",
                   help="the model's (and so the gradient buckets') dtype")
    p.add_argument("--ways", default=",".join(WAYS),
                   help=f"comma-separated, the first is the reference (of {', '.join(WAYS)})")
    p.add_argument("--rate", default=None,
                   help="run the ranks behind a loopback limited to this tc rate (e.g. 1gbit)")
    p.add_argument("--link", default="plain loopback", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    ways = tuple(w for w in args.ways.split(",") if w)
    if not ways or any(w not in WAYS for w in ways):
        p.error(f"--ways takes a comma-separated list of {', '.join(WAYS)}; got {args.ways!r}")
    if args.rate:
        return _in_slow_link(args.rate, argv if argv is not None else sys.argv[1:])
    params = args.layers * (args.width * args.width + args.width)
    nbytes = params * DTYPES[args.dtype].itemsize
    print(f"ddp_step: 2 gloo ranks, {args.link}, {args.layers} x Linear({args.width}) "
          f"{args.dtype} ({nbytes / 2**20:.0f} MiB of gradients, {args.bucket_mb:g} MiB "
          f"buckets), batch {args.batch}, {args.steps} timed steps in a seeded random order")
    results = run_gloo_ranks("ddp_step", measure, (args.width, args.layers, args.batch,
                                                   args.steps, args.bucket_mb, args.dtype, ways),
                             timeout_s=300)
    if results is None:
        return 2
    ref = ways[0]
    print(f"median step ms (steps timed) per way, and ratios to {ref}")
    print(f"{'rank':<6}" + "".join(f"{w:>19}" for w in ways)
          + "".join(f"{w + '/' + ref:>22}" for w in ways[1:]) + f"{'bitwise':>9}")
    for rank, r in sorted(results.items()):
        print(f"{rank:<6}" + "".join(f"{r[w]:>13.1f} ({r['n'][w]:>3})" for w in ways)
              + "".join(f"{r[w] / r[ref]:>22.3f}" for w in ways[1:])
              + f"{str(r['bitwise_equal']):>9}")
    if any(w.startswith("zipccl") for w in ways):
        print("bucket all-reduces the zipccl ways sent compressed: "
              + ", ".join(f"rank {rank} {r['compressed']:.0%}" for rank, r in sorted(results.items()))
              + "; the policy's calibration (link MB/s, codec slowdown in a collective): "
              + ", ".join(f"{bps / 1e6:.0f} MB/s x{k:.2f}" for bps, k in results[0]["probes"]))
    return 0 if all(r["bitwise_equal"] for r in results.values()) else 1


def _in_slow_link(rate: str, argv: list) -> int:
    """Run this script again, without ``--rate``, inside a namespace of our own
    whose loopback is limited to ``rate``."""
    from zipccl_fsdp.netns import can_shape, slow_link

    ok, why = can_shape()
    if not ok:
        print(f"ddp_step: cannot shape a link ({why}); run without --rate")
        return 2
    rest, skip = [], False
    for a in argv:  # drop --rate VALUE / --rate=VALUE
        if skip:
            skip = False
        elif a == "--rate":
            skip = True
        elif not a.startswith("--rate="):
            rest.append(a)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    with slow_link(rate) as ns:
        cmd = [*ns.prefix(), sys.executable, os.path.abspath(__file__), *rest,
               "--link", f"loopback limited to {rate} (tc, own namespace)"]
        return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
