"""The adaptive policy's calibration, on real gloo process groups: ranks that
measure different speeds agree on the slowest rank's, so they decide alike;
a round of its probes takes its slowest rank's time, its latency each
rank's fastest call;
a hook with the default config books its calibration traffic apart from the
collectives'; the probe data are what training carries."""
from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.distributed as dist

from collective_cases import (assert_bits_equal, gather_all, make_data, reference_reduce,
                              torch_all_gather_single)
from zipccl_fsdp import calibration as Cal
from zipccl_fsdp import cost as M
from zipccl_fsdp import policy as P
from zipccl_fsdp.collectives import all_gather_single, all_reduce
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.stats import CommStats

POOL_SHARE = "policy"
"""test_policy.py, test_calibration.py and test_runtime.py share their pools
of ranks (conftest.py): each pool is spawned once for the three."""


# --------------------------------------------------------------------------
# Ranks that measure different speeds decide alike
# --------------------------------------------------------------------------
def task_disagreeing_measurements():
    """Rank 0 measures a fast link, rank 1 a slow one and a slower codec: alone
    they would decide differently; agreed (the slowest rank's), they decide alike."""
    rank, world = dist.get_rank(), dist.get_world_size()
    link = [[1e-5, 1e-4], [1e-3, 0.5]][rank]          # tiny, 2 MiB all-gather seconds
    codec = [[1e-3, 1e-3, 1e-4], [2e-3, 2e-3, 2e-4]][rank]
    ab = [[0.01, 0.005, 0], [0.3, 0.2, 0]][rank]     # in-situ raw, compressed seconds
    with mock.patch.multiple(
            Cal, measure_link_local=lambda group, world, device: ([link[0]], [link[1]]),
            measure_codec_local=lambda *a: list(codec),
            measure_ab_local=lambda *a: ([ab[0]], [ab[1]], [link[0]], ab[2])):
        # What this rank would decide on its own numbers (the hazard).
        own_link = M.LinkSpeed(link[0], Cal.LINK_PROBE_BYTES / (link[1] - link[0]))
        call = codec[2] / 2
        own_codec = M.CodecSpeed(Cal.CODEC_PROBE_BYTES / (codec[0] - call),
                                 Cal.CODEC_PROBE_BYTES / (codec[1] - call), call)
        alone = M.best_plan((M.gather(world, 1 << 22),), own_link,
                            {"dense": own_codec}, {"dense": 0.7})[0].compress
        cfg = ZipCCLConfig(policy="adaptive")
        st = CommStats()
        plans = []
        for n in (1 << 10, 1 << 16, 1 << 21):
            x = make_data(n, torch.bfloat16, seed=n, rank=rank)
            want = torch.empty(world * n, dtype=torch.bfloat16)
            torch_all_gather_single(want, x)
            got = torch.empty_like(want)
            all_gather_single(got, x, config=cfg, stats=st)
            assert_bits_equal(got, want, f"all_gather n={n}")
            y = make_data(n * world, torch.float32, seed=n, rank=rank)
            want = reference_reduce(gather_all(y), "avg", 1.0, torch.float32)
            all_reduce(y, dist.ReduceOp.AVG, config=cfg, stats=st)
            assert_bits_equal(y, want, f"all_reduce n={n}")
            plans.append(sorted(P.of(cfg, st).decisions.items()))
        report = P.of(cfg, st).calibration.report()
        return (alone, plans, repr((report["links"], report["speeds"])),
                st.snapshot()["all_gather"]["compressed_calls"])


def test_decisions_agree_when_measurements_differ(pool2):
    (alone0, plans0, links0, c0), (alone1, plans1, links1, c1) = \
        pool2.run(task_disagreeing_measurements)
    assert alone0 != alone1          # on their own numbers the ranks would disagree
    assert plans0 == plans1 and links0 == links1 and c0 == c1
    assert c0 > 0                    # the agreed (slowest) link is slow: it compressed

# --------------------------------------------------------------------------
# A collective's time is its slowest rank's, round by round
# --------------------------------------------------------------------------
def task_round_times(stalled: bool):
    """Stand-in times, as a shared link gives them: in each round of the
    link probe and the A/B one rank has its share in half the round's time
    (6 ms), the other when the round ends (12 ms), a different rank each
    round. Each rank's tiny calls take 0.1 ms or, every other call, 2 ms (a
    late wake-up), so that every call has a slow rank; ``stalled``: 4 ms
    every one (a busy host), while the A/B's start-together calls, spread
    over its rounds, take 0.1 ms or 3 ms."""
    rank, world = dist.get_rank(), dist.get_world_size()
    half, full, fast = 6e-3, 12e-3, 1e-4

    def rounds(n, a, b):
        return [a if (i + rank) % 2 else b for i in range(n)]

    tiny = [4e-3] * Cal.LINK_TINY_REPS if stalled else rounds(Cal.LINK_TINY_REPS, 2e-3, fast)
    with mock.patch.multiple(
            Cal, measure_link_local=lambda group, world, device: (
                list(tiny), rounds(Cal.LINK_PROBE_REPS, half, full)),
            measure_codec_local=lambda *a: [1e-3, 1e-3, 1e-4],
            measure_reduce_local=lambda *a: 1e-3,
            measure_ab_local=lambda *a: (rounds(Cal.AB_ROUNDS, half, full),
                                         [8e-3] * Cal.AB_ROUNDS,
                                         rounds(2 * Cal.AB_ROUNDS, 3e-3, fast), 0)):
        cal = Cal.Calibration(ZipCCLConfig(policy="adaptive", codec="dense"))
        group, cpu = dist.group.WORLD, torch.device("cpu")
        probe_link = cal.link(group, world, cpu)
        cal.speeds(group, world, torch.bfloat16, cpu)
        report = cal.report()
        (probe,) = report["probes"].values()
        (link,) = report["links"].values()
        return probe_link, probe, link


@pytest.mark.parametrize("stalled", [False, True])
def test_a_round_takes_its_slowest_rank_and_the_latency_each_ranks_fastest_call(pool2,
                                                                               stalled):
    """The link probe and the A/B time each round as the collective it is
    (until its last rank has its data: 12 ms, never 6), and keep the fastest
    round; the latency is each rank's fastest tiny call (0.1 ms, not the 2 ms
    of every call's slowest rank), and where the link probe's were all
    stalled (4 ms), the A/B's start-together calls give it (0.1 ms): the
    bandwidth is fitted to the 12 ms round less 0.1 ms, never less 4."""
    for probe_link, probe, link in pool2.run(task_round_times, stalled):
        assert probe_link.latency_s == (4e-3 if stalled else 1e-4), probe_link
        assert probe_link.bytes_per_s == Cal.LINK_PROBE_BYTES / (12e-3 - probe_link.latency_s)
        assert probe["raw_s"] == 12e-3 and probe["zipccl_s"] == 8e-3, probe
        assert link.latency_s == 1e-4, link
        assert link.bytes_per_s == probe["per_rank_bytes"] / (12e-3 - 1e-4), link


# --------------------------------------------------------------------------
# Calibration traffic is booked apart from the collectives'
# --------------------------------------------------------------------------
def task_fsdp2_default_hook_stats(steps: int):
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from zipccl_fsdp.hooks.registry import ZipCCLHook

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(3)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    hook = ZipCCLHook()  # the default config: adaptive, everything measured
    model.register_comm_hook(hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        loss = model(torch.randn(8, 256, generator=g)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    from zipccl_fsdp.tensorboard_stats import calibration_scalars
    return hook.stats(), calibration_scalars(hook.calibration())


def test_fsdp2_default_hook_books_calibration_apart(pool2):
    for s, measured in pool2.run(task_fsdp2_default_hook_stats, 3, timeout_s=300):
        # what it measured, as the demo and TensorBoard show it (fp32 parameters)
        assert sorted(measured) == ["link_MBps", "slowdown_fp32"], measured
        assert measured["link_MBps"] > 0 and measured["slowdown_fp32"] >= 1.0, measured
        for kind in ("all_gather", "reduce_scatter"):
            k = s[kind]
            assert k["calls"] > 0 and k["compressed_calls"] == 0, (kind, k)  # the loopback: raw
            assert k["raw_bytes"] <= k["wire_bytes"] <= 1.01 * k["raw_bytes"], (kind, k)
        cal = s["calibration"]
        assert cal["calls"] > 0 and cal["wire_bytes"] > s["reduce_scatter"]["raw_bytes"], cal



# --------------------------------------------------------------------------
# The probe data
# --------------------------------------------------------------------------
def test_calibration_codes_fp32_as_bf16_casts():
    """The calibration's fp32 data are bf16 casts (what fp32 collectives carry
    in training), so its in-situ A/B compares a raw transfer with one a third
    as long; bf16 and fp16 data are plain Gaussian values of the dtype."""
    from zipccl_fsdp.calibration import probe_data
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    x = probe_data(4096, torch.float32, g(), torch.device("cpu"))
    assert x.dtype == torch.float32
    assert torch.equal(x.view(torch.int32), x.bfloat16().float().view(torch.int32))
    assert x.view(torch.int32).bitwise_and(0xFFFF).eq(0).all()
    assert x.std() > 0.5
    for dtype in (torch.bfloat16, torch.float16):
        y = probe_data(4096, dtype, g(), torch.device("cpu"))
        assert y.dtype == dtype and y.float().std() > 0.5
