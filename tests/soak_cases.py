"""A tiny FSDP2 model trained for many steps with the zipccl hook, sampling RSS.

``soak(steps, ...)`` runs inside an initialized gloo group and returns the
resident set sizes sampled and the hook's statistics checks. Shared by
tests/test_hook_failures.py (a short soak) and ``benchmarks/soak.py`` (a long one);
imports no pytest.
"""
from __future__ import annotations

import gc
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

DIM, HIDDEN, BATCH = 128, 256, 16
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def soak(steps: int, samples: tuple = (1, 100), verify: bool = True, hook: bool = True) -> dict:
    """Run inside an initialized gloo group; return RSS samples and stats checks.
    ``hook=False`` trains with torch's own comms (the baseline)."""
    import zipccl_fsdp.hooks.fsdp2  # noqa: F401  (adds FSDPModule.register_comm_hook)
    from zipccl_fsdp.hooks.registry import ZipCCLHook
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from zipccl_fsdp.config import ZipCCLConfig

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.Linear(DIM, 1))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    mpp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model[:2]:
        fully_shard(block, mesh=mesh, mp_policy=mpp)
    fully_shard(model, mesh=mesh, mp_policy=mpp)
    zhook = ZipCCLHook(ZipCCLConfig(policy="always", min_bytes=0, verify=verify))
    if hook:
        model.register_comm_hook(zhook)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)
    data = [torch.randn(BATCH, DIM, generator=g) for _ in range(8)]
    rss, per_step = {}, None
    wanted = set(samples) | {steps}
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        x = data[step % len(data)]
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 1:
            s = zhook.stats()
            per_step = {k: s[k]["calls"] for k in ("all_gather", "reduce_scatter")}
        if step in wanted:
            gc.collect()
            rss[step] = rss_bytes()
    elapsed = time.perf_counter() - t0
    s = zhook.stats()
    stats = {k: {f: s[k][f] for f in ("calls", "compressed_calls", "fallback_calls")}
             for k in ("all_gather", "reduce_scatter")}
    consistent = not hook or all(stats[k]["calls"] == steps * per_step[k]
                     and stats[k]["compressed_calls"] == stats[k]["calls"]
                     and stats[k]["fallback_calls"] == 0 for k in stats)
    return dict(rss=rss, per_step=per_step, stats=stats, consistent=consistent,
                step_ms=1e3 * elapsed / steps)
