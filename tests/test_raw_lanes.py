"""Raw lanes (``zipccl_fsdp/collectives/_lanes.py``) on real gloo process groups.

Once a call went raw for good (a link faster than the codec, or "never"), the
next calls of its (kind, group, stats, dtype, device) skip the general path;
once one went raw for its size (below ``min_bytes``), the next ones as small.
They must give torch's results bit for bit (all-reduce: the fp32 rank-order
reference) and count the stats the general path counts; calls a lane is not
sure of (bad arguments, tensors that require grad, a profiler, other groups,
an all-reduce too large to gather whole) must take the general path, with
its errors on every rank.
"""
from __future__ import annotations

import copy
import importlib
import pickle

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from collective_cases import (OPS, assert_bits_equal, gather_all, make_data, make_op,
                              reference_reduce, torch_all_gather_single)
import zipccl_fsdp.collectives.dispatch as C  # the shared part: begin, _STATS
from zipccl_fsdp import policy as P
from zipccl_fsdp._reduce import torch_sums_alike
from zipccl_fsdp.collectives import all_gather_single, all_reduce, all_to_all_single
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.stats import CommStats

# The module (the package's attribute of that name is the function).
AR = importlib.import_module("zipccl_fsdp.collectives.all_reduce")

# The codec is "slower" than the link: the adaptive policy's gate closes at the
# first call, with no measurement.
FAST_LINK = dict(policy="adaptive", link_gbps=400.0, codec_gbps=1.0)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class _GeneralPath:
    """Counts the calls that reach the general path (``collectives._begin``)."""

    def __init__(self) -> None:
        self.calls = 0
        self._real = C.begin

    def __enter__(self):
        def counted(*args, **kwargs):
            self.calls += 1
            return self._real(*args, **kwargs)
        C.begin = counted
        return self

    def __exit__(self, *exc) -> None:
        C.begin = self._real


def _lane_keys(st: CommStats, cfg: ZipCCLConfig) -> list:
    return sorted((k[0], str(k[2])) for k in st.runtime.state(cfg).lanes)


def task_lanes_equal_torch(policy: str):
    """Every dtype and shape (ragged and empty splits, tiny and odd sizes, the
    format's special values): lane calls equal torch's, skip the general path
    after the first call, and count what the general path counts."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(**FAST_LINK) if policy == "adaptive" else ZipCCLConfig(policy="never")
    st = CommStats()
    counts = []
    for dtype in DTYPES:
        for n in (1 << 16, 4097, 7, 1):  # the first is big enough to decide, and opens
            x = make_data(n, dtype, seed=n, rank=rank)
            with _GeneralPath() as general:
                for _ in range(3):
                    got = torch.empty(world * n, dtype=dtype)
                    all_gather_single(got, x, config=cfg, stats=st)
                    want = torch.empty_like(got)
                    torch_all_gather_single(want, x)
                    assert_bits_equal(got, want, f"all_gather {dtype} {n}")
            counts.append(("all_gather", general.calls))
            rows = x.view(n, 1).repeat(1, 3).reshape(n, 3)
            for splits in (None, [0, n], [n, 0], [n // 2, n - n // 2]):
                if splits is None and n % world:
                    continue
                # Every rank sends splits[r] rows to rank r, so receives splits[rank] from each.
                recv = None if splits is None else [splits[rank]] * world
                out_rows = n if splits is None else world * splits[rank]
                with _GeneralPath() as general:
                    for _ in range(3):
                        got = torch.empty(out_rows, 3, dtype=dtype)
                        all_to_all_single(got, rows, recv, splits, config=cfg, stats=st)
                        want = torch.empty_like(got)
                        dist.all_to_all_single(want, rows, recv, splits)
                        assert_bits_equal(got, want, f"all_to_all {dtype} {n} {splits}")
                counts.append(("all_to_all", general.calls))
            parts = gather_all(x)
            with _GeneralPath() as general:
                for _ in range(3):
                    for name, factor in OPS:
                        y = x.clone()
                        all_reduce(y, op=make_op(name, factor), config=cfg, stats=st)
                        assert_bits_equal(y, reference_reduce(parts, name, factor, dtype),
                                          f"all_reduce {name} {dtype} {n}")
            # The all-reduce lane that opens on two ranks is torch's, which takes
            # only the ops that torch sums alike; the others take the general path.
            unlike = sum(not torch_sums_alike(world, C.parse_op(make_op(name, factor), ""),
                                              dtype, x.device) for name, factor in OPS)
            counts.append(("all_reduce", general.calls - (3 * unlike if world == 2 else 0)))
    return counts, st.snapshot(), _lane_keys(st, cfg)


@pytest.mark.parametrize("policy", ["adaptive", "never"])
def test_lanes_equal_torch_and_skip_the_general_path(pool2, policy):
    for counts, snap, lanes in pool2.run(task_lanes_equal_torch, policy):
        # One call of each (kind, dtype) opens the lane; all others take it.
        first = {}
        for kind, calls in counts:
            first.setdefault(kind, []).append(calls)
        assert sorted(first) == ["all_gather", "all_reduce", "all_to_all"]
        for kind, per_case in first.items():
            assert sum(per_case) == len(DTYPES), (kind, per_case)
        kinds = ("all_gather", "all_reduce", "all_to_all")
        assert lanes == sorted((k, str(d)) for k in kinds for d in DTYPES)
        for kind in kinds:
            s = snap[kind]
            assert s["calls"] == s["raw_fallback_calls"] > 0, (kind, s)
            assert s["compressed_calls"] == 0, s
            assert s["wire_bytes"] - s["size_bytes"] - s["pad_bytes"] == s["raw_bytes"] > 0, s


def task_stats_match_general_path():
    """The same calls through a lane and through the general path (a fresh
    config each time, so no lane) count the same bytes, calls and decisions."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x = make_data(3000, torch.bfloat16, seed=1, rank=rank).view(1000, 3)
    out = torch.empty(world * 1000, 3, dtype=torch.bfloat16)
    snaps, decisions = [], []
    for fresh in (True, False):
        cfg = ZipCCLConfig(**FAST_LINK)
        all_gather_single(out, x, config=cfg)  # opens the lanes (and decides)
        all_to_all_single(x.clone(), x, config=cfg)
        all_reduce(x.clone(), config=cfg)
        C.reset_stats()
        P.of(cfg, C._STATS).decisions.clear()
        for _ in range(4):
            if fresh:
                C._STATS.runtime.state(cfg).lanes.clear()
            all_gather_single(out, x, config=cfg)
            recv = [(300, 700)[rank]] * world
            all_to_all_single(torch.empty(sum(recv), 3, dtype=x.dtype), x, recv, [300, 700],
                              config=cfg)
            all_reduce(x.clone(), config=cfg)
        snap = C.stats()
        snaps.append({k: {f: v for f, v in s.items() if not f.endswith("_s")}
                      for k, s in snap.items()})
        assert all(s["comm_s"] > 0 for k, s in snap.items() if s["calls"]), snap
        decisions.append(sorted(P.of(cfg, C._STATS).decisions.items()))
    return snaps, decisions


def test_lane_stats_match_the_general_path(pool2):
    for (general, lane), (dec_general, dec_lane) in pool2.run(task_stats_match_general_path):
        assert general == lane
        assert dec_general == dec_lane and dec_lane


def task_small_calls_lane():
    """A call raw for its size opens no lane: calls below ``min_bytes`` take
    the general path, which exchanges their size row before torch's call (a
    lane would skip it, and ranks whose sizes straddle ``min_bytes`` would meet
    in different collectives), and a larger call compresses."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(policy="always", min_bytes=1 << 14)
    small = make_data(1 << 12, torch.bfloat16, seed=3, rank=rank)  # units of 4 and 8 KiB
    big = make_data(1 << 15, torch.bfloat16, seed=4, rank=rank)  # 32 and 64 KiB

    def calls(x, st):
        y = x.clone()
        all_reduce(y, config=cfg, stats=st)
        assert_bits_equal(y, reference_reduce(gather_all(x), "sum", 1.0, x.dtype),
                          f"all_reduce {x.numel()}")
        out = torch.empty(world * x.numel(), dtype=x.dtype)
        all_gather_single(out, x, config=cfg, stats=st)
        assert_bits_equal(out, torch.cat(gather_all(x)), f"all_gather {x.numel()}")

    laned, general_only = CommStats(), CommStats()
    for st in (laned, general_only):
        calls(small, st)  # opens the lanes (and checks the configs agree)
    opened = sorted(k[0] for k in laned.runtime.state(cfg).lanes)
    laned.reset()
    general_only.reset()
    with _GeneralPath() as general:
        for _ in range(3):
            calls(small, laned)
        lane_misses = general.calls
        calls(big, laned)
        big_calls = general.calls - lane_misses
    for _ in range(3):
        general_only.runtime.state(cfg).lanes.clear()
        calls(small, general_only)
    calls(big, general_only)
    snaps = [{k: {f: v for f, v in st.snapshot()[k].items() if not f.endswith("_s")}
              for k in ("all_reduce", "all_gather")} for st in (laned, general_only)]
    return opened, lane_misses, big_calls, snaps


def test_small_calls_take_no_lane_and_exchange_their_sizes(pool2):
    for opened, lane_misses, big_calls, (laned, general) in pool2.run(task_small_calls_lane):
        assert opened == [], opened
        assert lane_misses == 6 and big_calls == 2
        assert laned == general
        # 3 small calls of each kind announce one row each, the big one sends its rows
        assert all(s["size_bytes"] > 0 for s in laned.values()), laned
        assert {k: (s["calls"], s["compressed_calls"]) for k, s in laned.items()} == \
            {"all_reduce": (4, 1), "all_gather": (4, 1)}, laned


def task_lane_misses():
    """Calls a lane must not take reach the general path, and bad ones raise
    its errors on every rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(**FAST_LINK)
    n = 1 << 15  # 128 KiB: big enough for the policy to decide (min_bytes)
    x = make_data(n, torch.float32, seed=2, rank=rank)
    out = torch.empty(world * n)
    all_gather_single(out, x, config=cfg)
    all_to_all_single(torch.empty(n), x, config=cfg)
    all_reduce(x.clone(), config=cfg)
    seen = {}
    with _GeneralPath() as general:
        all_gather_single(out, x, config=cfg)
        all_to_all_single(torch.empty(n), x, config=cfg)
        all_reduce(x.clone(), config=cfg)
        # On two ranks the all-reduce lane is torch's: a tensor larger than
        # any gathered whole takes it too.
        saved, AR.GATHER_MAX_BYTES = AR.GATHER_MAX_BYTES, x.nbytes  # world x nbytes is more
        try:
            y = x.clone()
            all_reduce(y, config=cfg)
        finally:
            AR.GATHER_MAX_BYTES = saved
        assert_bits_equal(y, reference_reduce(gather_all(x), "sum", 1.0, x.dtype),
                          "all_reduce larger than a whole gather")
        seen["lanes"] = general.calls
        # Grad-requiring tensors, another stats object, another group, a
        # profiler, an op torch's lane does not sum alike (PREMUL_SUM, which
        # zipccl's schedule multiplies before adding): the general path.
        all_gather_single(out, x.clone().requires_grad_(), config=cfg)
        all_to_all_single(torch.empty(n), x, config=cfg, stats=CommStats())
        group = dist.new_group([0, 1])
        all_reduce(x.clone(), group=group, config=cfg)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            all_gather_single(out, x, config=cfg)
        names = {e.name for e in prof.events()}
        y = x.clone()
        all_reduce(y, op=make_op("premul_sum", 0.37), config=cfg)
        assert_bits_equal(y, reference_reduce(gather_all(x), "premul_sum", 0.37, x.dtype),
                          "all_reduce PREMUL_SUM")
        # An all-to-all in place, and one whose output starts inside its
        # input: read from a copy, as the general path does.
        for shift in (0, n // 4):
            buf = torch.cat([x, x])
            got, src = buf[shift:shift + n], buf[:n]
            want = torch.empty(n)
            dist.all_to_all_single(want, src.clone())
            all_to_all_single(got, src, config=cfg)
            assert_bits_equal(got, want, f"all_to_all overlapping by {n - shift}")
        seen["misses"] = general.calls - seen["lanes"]
        errors = []
        for bad in (lambda: all_to_all_single(torch.empty(n), x, [10, n - 10], [20, n - 20],
                                              config=cfg),
                    lambda: all_to_all_single(torch.empty(n), x, [n], [n], config=cfg),
                    lambda: all_gather_single(torch.empty(world * n)[::2], x[:n // 2],
                                              config=cfg),
                    lambda: all_gather_single(torch.empty(world * n + 1), x, config=cfg),
                    lambda: all_to_all_single(torch.empty(n, dtype=torch.float64), x,
                                              config=cfg),
                    # the shapes of an even-split call the lane has seen, but
                    # a non-contiguous output; then rows that do not split
                    lambda: all_to_all_single(torch.empty(2 * n)[::2], x, config=cfg),
                    lambda: all_to_all_single(torch.empty(n + 1), torch.empty(n + 1),
                                              config=cfg),
                    lambda: all_reduce(torch.empty(2 * n)[::2], config=cfg),
                    lambda: all_reduce(x.clone(), op=ReduceOp.MAX, config=cfg)):
            try:
                bad()
                errors.append(None)
            except (ValueError, TypeError) as e:
                errors.append(f"{type(e).__name__}: {e}")
    seen["profiled"] = "zipccl::all_gather::exchange" in names
    return seen, errors


def test_lane_misses_take_the_general_path(pool2):
    for seen, errors in pool2.run(task_lane_misses):
        assert seen["lanes"] == 0
        assert seen["misses"] == 7
        assert seen["profiled"]
        assert all(e and e.split(":")[0] in ("ValueError", "TypeError") and "zipccl" in e
                   for e in errors), errors


def task_async_and_reset():
    """``async_op=True`` through a lane returns torch's Work; counters stay
    live across ``reset_stats``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(**FAST_LINK)
    x = make_data(1 << 12, torch.bfloat16, seed=4, rank=rank)
    out = torch.empty(world << 12, dtype=torch.bfloat16)
    all_gather_single(out, x, config=cfg)  # opens the lanes
    all_reduce(x.clone(), config=cfg)
    all_to_all_single(torch.empty_like(x), x, config=cfg)
    C.reset_stats()
    works = [all_gather_single(out, x, async_op=True, config=cfg)]
    y = x.clone()
    works.append(all_reduce(y, async_op=True, config=cfg))
    got = torch.empty_like(x)
    works.append(all_to_all_single(got, x, async_op=True, config=cfg))
    for w in works:
        w.wait()
    want = torch.empty_like(out)
    torch_all_gather_single(want, x)
    assert_bits_equal(out, want, "async all_gather")
    assert_bits_equal(y, reference_reduce(gather_all(x), "sum", 1.0, x.dtype), "async all_reduce")
    want = torch.empty_like(x)
    dist.all_to_all_single(want, x)
    assert_bits_equal(got, want, "async all_to_all")
    return {k: C.stats()[k]["calls"] for k in ("all_gather", "all_reduce", "all_to_all")}


def test_async_lanes_and_reset_stats(pool2):
    for calls in pool2.run(task_async_and_reset):
        assert calls == {"all_gather": 1, "all_reduce": 1, "all_to_all": 1}


def task_used_config_copies():
    """A used config holds no state (its lanes, policy and agreement checks live
    in the runtime of the stats' owner), so it pickles and copies like any
    settings; a copy is a new config, whose state starts afresh."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(**FAST_LINK)
    x = make_data(1 << 16, torch.bfloat16, seed=5, rank=rank)
    all_gather_single(torch.empty(world << 16, dtype=torch.bfloat16), x, config=cfg)
    state = C._STATS.runtime.state(cfg)
    assert state.lanes and state.policy is not None and state.checked_groups
    for twin in (pickle.loads(pickle.dumps(cfg)), copy.deepcopy(cfg), copy.copy(cfg)):
        assert twin == cfg and twin is not cfg
        fresh = C._STATS.runtime.state(twin)
        assert not fresh.lanes and fresh.policy is None and not fresh.checked_groups
        got = torch.empty(world << 16, dtype=torch.bfloat16)
        all_gather_single(got, x, config=twin)
        want = torch.empty_like(got)
        torch_all_gather_single(want, x)
        assert_bits_equal(got, want, "all_gather with a copied config")
    return True


def test_used_config_pickles_and_copies(pool2):
    assert pool2.run(task_used_config_copies) == [True, True]
