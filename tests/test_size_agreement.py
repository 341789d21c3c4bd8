"""Sizes that differ between ranks: straddling ``min_bytes``,
or empty on one rank only, for the four collectives under "always", "adaptive"
and "never".

Whatever a call decides (raw or compressed, which route) must not depend on
one rank's own sizes before the ranks have agreed on them. So each case ends
in one of two ways, and the test states which applies:

* ``"raises"``: some rank runs zipccl's schedule (or goes raw for its own
  size, which exchanges a size row first): every rank raises ``ValueError``
  naming the sizes, within 10 s, and the group still works after it;
* ``"torch"``: zipccl hands the call to torch on every rank (a raw decision
  every rank shares: "never", the adaptive gate closed on a fast link). Then
  torch's own behaviour is the reference (gloo aborts the process, or the
  ranks wait until the timeout, as with torch's own call); the test checks
  that every rank handed the call to torch, with a stand-in for the handoff
  that records it instead of running it.

The adaptive cases give the link and codec speeds, so the policy's gate is
known without timing anything: a slow link (compression can pay, every call
decides by its size) and a fast one (the gate closed).
"""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import zipccl_fsdp
from collective_cases import make_data
from zipccl_fsdp.collectives import dispatch as K
from zipccl_fsdp.collectives import all_gather_single, all_reduce, all_to_all_single
from zipccl_fsdp.collectives import reduce_scatter_single
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.stats import CommStats

PG_TIMEOUT_S = 30
WITHIN_S = 10.0
TASK_TIMEOUT_S = 50
"""A task that hangs (the bug) fails the test after this, not CI."""

MIN_BYTES = 64 * 1024
SIZES = {
    # one unit of encoding of 80000 and 60000 bytes: one rank above min_bytes, one below
    "straddle": (40000, 30000),
    "empty_on_one": (40000, 0),
}
POLICIES = {
    "always": dict(policy="always"),
    "never": dict(policy="never"),
    "adaptive_slow_link": dict(policy="adaptive", link_gbps=0.1, codec_gbps=10.0),
    "adaptive_fast_link": dict(policy="adaptive", link_gbps=10000.0, codec_gbps=0.1),
}
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")


def expected(kind: str, policy: str) -> str:
    """What applies on 2 gloo ranks. A raw decision every rank shares hands an
    all-gather, an all-to-all and (two gloo ranks sum alike, ``torch_sums_alike``)
    an fp32 SUM all-reduce to torch; a raw reduce-scatter is zipccl's own
    reduction (an all-to-all of the chunks after a size row)."""
    if policy in ("never", "adaptive_fast_link") and kind != "reduce_scatter":
        return "torch"
    return "raises"


class _Handed(Exception):
    """Raised by the stand-in for torch: the call was handed to torch."""


def task_sizes_differ(kind: str, policy: str, case: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    n = SIZES[case][rank]
    cfg = ZipCCLConfig(min_bytes=MIN_BYTES, **POLICIES[policy])
    st = CommStats()  # no lane nor agreement carried over from another task
    dtype = torch.float32 if kind == "all_reduce" else torch.bfloat16
    if kind == "all_gather":
        x = make_data(n, dtype, 1, rank)
        call = lambda: all_gather_single(torch.empty(world * n, dtype=dtype), x,  # noqa: E731
                                         config=cfg, stats=st)
    elif kind == "reduce_scatter":
        x = make_data(world * n, dtype, 2, rank)
        call = lambda: reduce_scatter_single(torch.empty(n, dtype=dtype), x,  # noqa: E731
                                             config=cfg, stats=st)
    elif kind == "all_reduce":  # chunks of n / world fp32: units of 80000 and 60000 bytes
        x = make_data(n, dtype, 3, rank)
        call = lambda: all_reduce(x, config=cfg, stats=st)  # noqa: E731
    else:
        x = make_data(world * n, dtype, 4, rank)
        call = lambda: all_to_all_single(torch.empty_like(x), x, config=cfg,  # noqa: E731
                                         stats=st)

    # The codec's first use (loading the C++ backend) is no part of what the
    # time bound guards.
    zipccl_fsdp.encode(make_data(64, dtype, 0, rank), codec=cfg.codec, backend=cfg.backend)
    handed = []

    def to_torch(st_, kind_, wire_bytes, collective, *args, **kwargs):
        handed.append(getattr(collective, "__name__", str(collective)))
        raise _Handed

    real, K.to_torch = K.to_torch, to_torch
    t0 = time.monotonic()
    try:
        call()
        outcome = ("returned", "")
    except _Handed:
        outcome = ("torch", handed[0])
    except Exception as e:  # noqa: BLE001 - reported to the test
        outcome = (type(e).__name__, str(e))
    finally:
        K.to_torch = real
    seconds = time.monotonic() - t0
    t = torch.ones(4)
    dist.all_reduce(t)  # the group still works
    return outcome + (seconds, t.tolist() == [float(world)] * 4)


@pytest.mark.parametrize("case", sorted(SIZES))
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("kind", KINDS)
def test_sizes_differing_between_ranks(pool2, kind, policy, case):
    results = pool2.run(task_sizes_differ, kind, policy, case, timeout_s=TASK_TIMEOUT_S)
    want = expected(kind, policy)
    for rank, (outcome, text, seconds, in_step) in enumerate(results):
        if want == "torch":
            assert outcome == "torch", (rank, outcome, text)
        else:
            assert outcome == "ValueError", (rank, outcome, text)
            assert "disagree on the call's sizes" in text, (rank, text)
            assert seconds < WITHIN_S, (rank, seconds)
        assert in_step, rank
    if want == "torch":
        assert results[0][1] == results[1][1], results  # the same torch collective


# --------------------------------------------------------------------------
# Whether an all-gather's shapes are accepted does not depend on the
# route: CPU tensors follow gloo's rule on every path.
# --------------------------------------------------------------------------
SHAPE_PATHS = {
    "raw": dict(policy="never"),
    "compressed": dict(policy="always", min_bytes=0),
}


def task_gather_shapes(path: str, out_shape: tuple, in_shape: tuple):
    """(torch's outcome, zipccl's outcome, zipccl's result equals torch's)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out_shape = tuple(world if d == "w" else d for d in out_shape)
    x = make_data(int(torch.tensor(in_shape).prod()), torch.bfloat16, 9, rank).view(in_shape)
    cfg = ZipCCLConfig(**SHAPE_PATHS[path])

    def outcome(fn, out):
        try:
            fn(out, x)
            return "ok"
        except (RuntimeError, ValueError) as e:
            return type(e).__name__ + ": " + str(e)

    want, got = torch.empty(out_shape, dtype=x.dtype), torch.empty(out_shape, dtype=x.dtype)
    theirs = outcome(lambda o, i: dist.all_gather_into_tensor(o, i), want)
    ours = outcome(lambda o, i: all_gather_single(o, i, config=cfg, stats=CommStats()), got)
    same = theirs == "ok" and torch.equal(want.view(torch.int16), got.view(torch.int16))
    return theirs, ours, same


@pytest.mark.parametrize("path", sorted(SHAPE_PATHS))
@pytest.mark.parametrize("out_shape,in_shape,accepted", [
    (("w", 4096), (4096,), False),          # stacked: NCCL takes it, gloo does not
    ((2, "w", 2048), (2, 2048), False),
    ((8192,), (2, 2048), False),
    ((4096 * 2,), (4096,), True),
    ((2 * 3, 2048), (3, 2048), True),
])
def test_all_gather_shapes_accepted_as_torch_accepts_them(pool2, path, out_shape, in_shape,
                                                          accepted):
    for theirs, ours, same in pool2.run(task_gather_shapes, path, out_shape, in_shape):
        if accepted:
            assert theirs == ours == "ok" and same, (theirs, ours)
        else:
            assert theirs.startswith("RuntimeError"), theirs  # gloo's own refusal
            assert ours.startswith("ValueError") and "along dim 0" in ours, ours
