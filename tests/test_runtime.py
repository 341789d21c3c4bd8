"""The run-time state apart from the settings: state is per config object,
goes with it, and every owner (a hook, the free functions) keeps its own."""
from __future__ import annotations

import torch
import torch.distributed as dist

from collective_cases import assert_bits_equal, make_data, torch_all_gather_single
from zipccl_fsdp.collectives import all_gather_single
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.protocol import row_width

POOL_SHARE = "policy"
"""test_policy.py, test_calibration.py and test_runtime.py share their pools
of ranks (conftest.py): each pool is spawned once for the three."""


def test_runtime_state_goes_with_its_config():
    """State is per config object, and a config that is gone leaves none behind
    (a config made per call must not grow the runtime)."""
    import gc

    from zipccl_fsdp.runtime import Runtime
    rt = Runtime()
    a, b = ZipCCLConfig(), ZipCCLConfig()
    sa = rt.state(a)
    assert rt.state(a) is sa and rt.state(b) is not sa  # equal, but another config
    assert rt.state(a) is sa and len(rt.states()) == 2
    rt.state(b)  # b is the last one asked for
    del a
    gc.collect()
    assert rt.states() == [rt.state(b)]
    for _ in range(100):
        rt.state(ZipCCLConfig(min_bytes=1))
    gc.collect()
    assert len(rt.states()) <= 2


def task_hooks_keep_their_own_state():
    """Two hooks with equal configs, and the free functions with a third: each
    owner checks the agreement, decides and opens its lanes on its own."""
    from zipccl_fsdp.hooks.registry import ZipCCLHook
    from zipccl_fsdp import collectives as C
    from zipccl_fsdp.config import DEFAULT_CONFIG

    rank, world = dist.get_rank(), dist.get_world_size()
    fast = dict(link_gbps=400.0, codec_gbps=1.0)
    hooks = [ZipCCLHook(ZipCCLConfig(**fast)), ZipCCLHook(ZipCCLConfig(**fast))]
    x = make_data(1 << 16, torch.bfloat16, seed=7, rank=rank)
    want = torch.empty(world << 16, dtype=torch.bfloat16)
    torch_all_gather_single(want, x)
    out = {}
    for i, hook in enumerate(hooks):
        for _ in range(2):
            got = torch.empty_like(want)
            all_gather_single(got, x, config=hook.config, stats=hook.comm_stats)
            assert_bits_equal(got, want, f"hook {i}")
        state = hook.runtime.state(hook.config)
        out[i] = dict(stats=hook.stats()["all_gather"], lanes=len(state.lanes),
                      checked=len(state.checked_groups),
                      decisions=dict(state.policy.decisions))
    before = C.stats()["all_gather"]["size_bytes"]
    all_gather_single(torch.empty_like(want), x, config=ZipCCLConfig(**fast))
    out["module"] = C.stats()["all_gather"]["size_bytes"] - before
    out["distinct"] = (hooks[0].runtime is not hooks[1].runtime
                       and hooks[0].runtime.state(hooks[0].config)
                       is not hooks[1].runtime.state(hooks[1].config))
    # The default config through the free functions (a message under min_bytes:
    # only the agreement check, which used to write into the config).
    all_gather_single(torch.empty(world * 16), torch.ones(16))
    out["default_untouched"] = (DEFAULT_CONFIG == ZipCCLConfig() and set(vars(DEFAULT_CONFIG))
                                == set(DEFAULT_CONFIG.__dataclass_fields__))
    return out


def test_hooks_with_equal_configs_share_no_state(pool2):
    for r in pool2.run(task_hooks_keep_their_own_state):
        assert r["distinct"] and r["default_untouched"]
        for i in (0, 1):
            s = r[i]["stats"]
            # each hook ran its own agreement check: one vector as wide as a size row
            assert s["size_bytes"] == 8 * row_width(2), (i, s)
            assert s["calls"] == 2 and s["compressed_calls"] == 0, (i, s)
            assert r[i]["lanes"] == 1 and r[i]["checked"] == 1, r[i]
            assert r[i]["decisions"] == {("all_gather", "raw", 1): 2}, r[i]
        assert r["module"] == 8 * row_width(2), r  # and so did the free functions' owner
