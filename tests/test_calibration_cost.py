"""What the adaptive policy's calibration costs an FSDP2 process group, as
``stats()["calibration"]`` counts it and as its log line reports it: within
the byte bound of calibration.py, every call and byte counted, one line per
(group, dtype) calibrated, on rank 0 alone. (Its seconds are measured by
benchmarks/calibration_cost.py, not asserted here.)"""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from zipccl_fsdp import calibration as Cal

BOUND_BYTES = 32 * 10**6
"""The most one rank sends to calibrate one process group (calibration.py)."""


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list = []

    def emit(self, record) -> None:
        self.lines.append(record.getMessage())


def task_fsdp2_first_steps(steps: int):
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from zipccl_fsdp.hooks.registry import ZipCCLHook

    lines = _Lines()
    log = logging.getLogger("zipccl_fsdp.calibration")
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(3)])
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        hook = ZipCCLHook()  # the default config: adaptive, everything measured
        model.register_comm_hook(hook)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(dist.get_rank())
        for _ in range(steps):
            model(torch.randn(8, 256, generator=g)).float().square().mean().backward()
            opt.step()
            opt.zero_grad()
    finally:
        log.removeHandler(lines)
        log.setLevel(logging.NOTSET)
    return hook.stats()["calibration"], sorted(map(str, hook.calibration()["probes"])), \
        lines.lines


def test_fsdp2_calibration_is_bounded_counted_and_logged_once(pool2):
    results = pool2.run(task_fsdp2_first_steps, 3, timeout_s=300)
    # the link once, then per dtype (bf16 all-gathers, fp32 reduce-scatters):
    # the codec speeds' agreement, the A/B's ratio agreement, its rounds, its times
    per_dtype = 1 + 1 + 4 * (Cal.AB_ROUNDS + 1) + 1
    link = Cal.LINK_TINY_REPS + Cal.LINK_PROBE_REPS + 3
    for rank, (cal, probes, lines) in enumerate(results):
        assert len(probes) == 2, probes  # both dtypes were calibrated
        assert cal["calls"] == link + 2 * per_dtype, cal
        assert 2 * (Cal.AB_ROUNDS + 1) * Cal.PROBE_BYTES[0] < cal["wire_bytes"] <= BOUND_BYTES, cal
        assert cal["comm_s"] > 0, cal
        if rank:
            assert lines == [], lines
            continue
        assert len(lines) == 2, lines
        assert all(line.startswith("zipccl calibration of group ") for line in lines), lines
        assert [" bfloat16 on cpu: " in lines[0], " float32 on cpu: " in lines[1]] == [True, True]
        sent = sum(float(line.split(" MB sent")[0].rsplit(" ", 1)[1]) for line in lines)
        assert abs(sent - cal["wire_bytes"] / 1e6) <= 0.1, (sent, cal, lines)
        calls = sum(int(line.split(" calls")[0].rsplit(" ", 1)[1]) for line in lines)
        assert calls == cal["calls"], (calls, cal)
