"""The adaptive policy, on real gloo process groups and alone: it sends tiny
messages and fast links raw, compresses (pipelined) on a slow link, takes the
same decision on every rank, lets a site's own ratio decide, and given speeds
pin its decisions so that two runs train the same bits.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from collective_cases import (assert_bits_equal, gather_all, make_data, reference_reduce,
                              torch_all_gather_single)
from dist_utils import DistPool
from zipccl_fsdp import calibration as Cal
from zipccl_fsdp import cost as M
from zipccl_fsdp import policy as P
from zipccl_fsdp.collectives import all_gather_single, all_reduce, reduce_scatter_single
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.protocol import row_width
from zipccl_fsdp.stats import CommStats

POOL_SHARE = "policy"
"""test_policy.py, test_calibration.py and test_runtime.py share their pools
of ranks (conftest.py): each pool is spawned once for the three."""


SLOW = dict(policy="adaptive", codec="auto", link_gbps=0.1, codec_gbps=1.0)
"""A link given as slow (12.5 MB/s) and a codec as fast: the policy compresses."""


# --------------------------------------------------------------------------
# Tasks (run inside the ranks)
# --------------------------------------------------------------------------
def task_decisions_given_in_config():
    """Tiny messages and a fast link go raw, a slow link compresses (pipelined)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    cases = {
        # name: (config, all-gather shard elements)
        "tiny_slow_link": (ZipCCLConfig(min_bytes=0, **SLOW), 16),
        "fast_link": (ZipCCLConfig(policy="adaptive", link_gbps=400.0, codec_gbps=1.0), 1 << 20),
        "slow_link": (ZipCCLConfig(**SLOW), 1 << 20),
        "never": (ZipCCLConfig(policy="never", min_bytes=0), 1 << 20),
    }
    for name, (cfg, n) in cases.items():
        st = CommStats()
        x = make_data(n, torch.bfloat16, seed=1, rank=rank)
        want = torch.empty(world * n, dtype=torch.bfloat16)
        torch_all_gather_single(want, x)
        for _ in range(2):
            got = torch.empty_like(want)
            all_gather_single(got, x, config=cfg, stats=st)
            assert_bits_equal(got, want, name)
        g = make_data(world * n, torch.float32, seed=2, rank=rank, kind="bf16cast")
        r = torch.empty(n, dtype=torch.float32)
        reduce_scatter_single(r, g, config=cfg, stats=st)
        parts = [p[rank * n:(rank + 1) * n] for p in gather_all(g)]
        assert_bits_equal(r, reference_reduce(parts, "sum", 1.0, torch.float32), name)
        s = st.snapshot()
        out[name] = {k: {f: s[k][f] for f in ("calls", "compressed_calls", "pipelined_calls",
                                                "raw_fallback_calls", "compressed_fraction",
                                                "raw_bytes", "wire_bytes")}
                     for k in ("all_gather", "reduce_scatter")}
        out[name]["decisions"] = dict(P.of(cfg, st).decisions)
    return out


def task_measured_loopback():
    """Measured for real: the loopback between two local processes is faster
    than the CPU codec, so the adaptive policy sends everything raw."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(policy="adaptive", codec="auto")
    st = CommStats()
    n = 1 << 20
    x = make_data(n, torch.bfloat16, seed=3, rank=rank)
    got = torch.empty(world * n, dtype=torch.bfloat16)
    all_gather_single(got, x, config=cfg, stats=st)
    want = torch.empty_like(got)
    torch_all_gather_single(want, x)
    assert_bits_equal(got, want, "measured all_gather")
    # A raw all-reduce under "adaptive" sums in fp32 in rank order, as a compressed one.
    y = make_data(n, torch.bfloat16, seed=5, rank=rank)
    want = reference_reduce(gather_all(y), "sum", 1.0, torch.bfloat16)
    all_reduce(y, config=cfg, stats=st)
    assert_bits_equal(y, want, "raw all_reduce sums in rank order")
    report = P.of(cfg, st).calibration.report()
    (link,) = report["links"].values()
    (speeds,) = report["speeds"].values()
    (probe,) = report["probes"].values()
    assert probe["slowdown"] >= Cal.PROBE_K_RANGE[0], probe
    return (st.snapshot()["all_gather"], link.bytes_per_s,
            {c: s.encode_bps for c, s in speeds.items()}, st.snapshot()["all_reduce"])


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------
def test_policy_decisions_from_config(pool2):
    r0, r1 = pool2.run(task_decisions_given_in_config)
    for name in r0:  # every rank decided the same (wire bytes differ: own padding)
        assert r0[name]["decisions"] == r1[name]["decisions"], name
        for kind in ("all_gather", "reduce_scatter"):
            a, b = dict(r0[name][kind]), dict(r1[name][kind])
            a.pop("wire_bytes"), b.pop("wire_bytes")
            assert a == b, (name, kind)
    tiny, fast, slow, never = (r0[k] for k in ("tiny_slow_link", "fast_link", "slow_link",
                                                "never"))
    for kind in ("all_gather", "reduce_scatter"):
        assert tiny[kind]["compressed_calls"] == 0 and tiny[kind]["raw_fallback_calls"] > 0
        assert fast[kind]["compressed_calls"] == 0
        assert fast[kind]["raw_fallback_calls"] == fast[kind]["calls"]
        assert never[kind]["compressed_calls"] == 0
        assert slow[kind]["compressed_fraction"] == 1.0
        assert slow[kind]["pipelined_calls"] == slow[kind]["calls"] > 0
        assert slow[kind]["wire_bytes"] < 0.8 * slow[kind]["raw_bytes"]
    # The raw all-gathers of a fast link given in the config cost nothing extra:
    # wire == raw bytes, but for the one-time agreement check of the config (one
    # vector as wide as a size row).
    assert fast["all_gather"]["wire_bytes"] == fast["all_gather"]["raw_bytes"] + 8 * row_width(2)
    assert any(k[1] != "raw" and k[2] > 1 for k in slow["decisions"])


def test_measured_loopback_goes_raw(pool2):
    for s, link_bps, codec_bps, ar in pool2.run(task_measured_loopback):
        assert s["compressed_calls"] == 0 and s["raw_fallback_calls"] == 1, (s, link_bps,
                                                                            codec_bps)
        assert ar["raw_fallback_calls"] == ar["calls"] == 1



# --------------------------------------------------------------------------
# Decisions alone (no processes)
# --------------------------------------------------------------------------
def test_a_new_site_measures_its_own_ratio():
    """One site of a class with a poor ratio (an fp32 lm_head gradient) must not
    keep the class's other sites (bf16-cast layer gradients) raw: a site's first
    call is compressed whenever an optimistic ratio would be, and from then on
    its own ratio decides."""
    cfg = ZipCCLConfig(policy="adaptive", codec="dense", link_gbps=0.5, codec_gbps=2.0)
    pol, cpu, f32 = P.Policy(cfg), torch.device("cpu"), torch.float32
    parts = (M.scatter_reduce(2, 1 << 20),)

    def decide(site):
        return pol.decide("reduce_scatter", None, 2, site, f32, cpu, parts)

    head, layer = ("reduce_scatter", (1 << 19,), f32), ("reduce_scatter", (3 << 18,), f32)
    assert decide(head).compress  # the first site of its class: optimistic
    pol.observe(None, head, "dense", 1000, 880)
    assert not decide(head).compress  # its own poor ratio
    first = decide(layer)  # the class says raw, but this site was never measured
    assert first.compress and first.reason == "first", first
    pol.observe(None, layer, "dense", 1000, 350)
    assert decide(layer).compress and decide(layer).reason == "model"
    assert not decide(head).compress


def test_outlook_says_whether_a_call_would_measure_first():
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    st = CommStats()
    for cfg in (ZipCCLConfig(policy="always"), ZipCCLConfig(policy="never"),
                ZipCCLConfig(link_gbps=1.0, codec_gbps=2.0)):
        assert P.outlook(cfg, st, None, bf16, cpu, True) == "", cfg
    for measured in (ZipCCLConfig(), ZipCCLConfig(link_gbps=1.0), ZipCCLConfig(codec_gbps=2.0)):
        assert P.outlook(measured, st, None, bf16, cpu, True) == "calibrates", measured
        # too small to compress: raw, through zipccl's schedule (it waits), so ""
        assert P.outlook(measured, st, None, bf16, cpu, False) == "", measured
    assert P.outlook(ZipCCLConfig(policy="never"), st, None, bf16, cpu, False) == ""
    # After the measuring call: tests/test_ddp.py (the DDP hook runs it itself).


def test_only_the_policy_module_reads_the_policy_setting():
    """``cfg.policy`` (or ``config.policy``) is read in ``policy.py`` alone (and
    in the config's own protocol fields)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    readers = set()
    for path in [*(root / "zipccl_fsdp").rglob("*.py"), *(root / "hooks").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr == "policy"):
                continue
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in ("cfg", "config") or name.endswith("config"):
                readers.add(path.relative_to(root).as_posix())
    readers.discard("zipccl_fsdp/config.py")
    assert readers == {"zipccl_fsdp/policy.py"}, readers



# --------------------------------------------------------------------------
# Given speeds pin the decisions: two runs train the same bits
# --------------------------------------------------------------------------
def task_ddp_run_with_given_speeds(steps: int):
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from zipccl_fsdp.hooks.registry import ZipCCLHook, register_comm_hook

    rank = dist.get_rank()
    digests, stats = [], []
    for _ in range(2):  # two runs of the same script, each with its own hook
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8)),
                    bucket_cap_mb=0.01)
        hook = ZipCCLHook(ZipCCLConfig(link_gbps=0.2, codec_gbps=2.0, min_bytes=4096))
        register_comm_hook(model, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(100 + rank)
        for _ in range(steps):
            model(torch.randn(16, 512, generator=g)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        digests.append(torch.cat([p.detach().reshape(-1).view(torch.int32)
                                  for p in model.parameters()]))
        stats.append(hook.stats()["all_reduce"])
    return torch.equal(digests[0], digests[1]), stats


def test_given_speeds_make_two_runs_train_the_same_bits():
    pool = DistPool(3)
    try:
        results = pool.run(task_ddp_run_with_given_speeds, 3, timeout_s=300)
    finally:
        pool.close()
    for same, (first, second) in results:
        assert same
        assert first["compressed_calls"] > 0 and first["raw_fallback_calls"] > 0, first
        for key in ("calls", "compressed_calls", "raw_fallback_calls", "wire_bytes"):
            assert first[key] == second[key], (key, first, second)
