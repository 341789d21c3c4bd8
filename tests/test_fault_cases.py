"""Failure paths of the collectives: sizes, configs and reduce ops that differ
between ranks, an all-to-all whose output overlaps its input, damaged raw
sends under verify, NaN payloads across piece counts, a hooked model saved
and loaded, and arguments wrong on one rank only (``benchmarks/fault_matrix.py``
runs the same cases by number): each raises the same error type on every
rank within seconds, or gives the exact result on every path.

Process groups time out after 30 s; a case that raised on one rank only
would leave the others waiting that long, so each task measures how long
its call took on every rank and the tests require under 10 s.
"""
from __future__ import annotations

import io
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from collective_cases import assert_bits_equal, make_data
from zipccl_fsdp.collectives import all_reduce, all_to_all_single, reduce_scatter_single
from zipccl_fsdp.collectives import all_gather_single
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.stats import CommStats

PG_TIMEOUT_S = 30
WITHIN_S = 10.0


def _timed(fn):
    """(exception type name or None, message, seconds) of ``fn()``."""
    t0 = time.monotonic()
    try:
        fn()
        return None, "", time.monotonic() - t0
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, str(e), time.monotonic() - t0


def raised_everywhere(results: list, error: str, *words: str) -> None:
    """Every rank's ``_timed`` call raised ``error`` with each of ``words`` in
    its message, within ``WITHIN_S``, and the ranks are in step after it."""
    for rank, (err, msg, dt, in_step) in enumerate(results):
        assert err == error, (rank, err, msg)
        assert all(w in msg for w in words), (words, msg)
        assert dt < WITHIN_S, (rank, dt)
        assert in_step


def _warm(cfg: ZipCCLConfig) -> None:
    """One agreeing compressed call first: the codec's first use (loading the
    C++ backend) must not count in the time a failure takes to reach every rank."""
    world = dist.get_world_size()
    x = torch.randn(4096).bfloat16()
    all_gather_single(torch.empty(world * x.numel(), dtype=x.dtype), x,
                      config=ZipCCLConfig(policy="always", min_bytes=0,
                                          check_consistency=False, backend=cfg.backend))


def _in_step() -> bool:
    """The group still works after the failed call: a plain sum across ranks."""
    t = torch.ones(4)
    dist.all_reduce(t)
    return t.tolist() == [float(dist.get_world_size())] * 4


# --------------------------------------------------------------------------
# Sizes that differ between ranks (fault matrix case 2)
# --------------------------------------------------------------------------
def task_mismatched_all_reduce(numels: list, policy: str):
    rank = dist.get_rank()
    cfg = ZipCCLConfig(policy=policy, min_bytes=0, check_consistency=False)
    x = make_data(numels[rank], torch.bfloat16, 3, rank)
    _warm(cfg)
    out = _timed(lambda: all_reduce(x, config=cfg))
    return out + (_in_step(),)


@pytest.mark.parametrize("numels", [[8192, 8193], [4096, 6000]])
def test_all_reduce_with_sizes_differing_between_ranks_raises_on_every_rank(pool2, numels):
    raised_everywhere(pool2.run(task_mismatched_all_reduce, numels, "always"), "ValueError",
                      "disagree on the call's sizes")


# --------------------------------------------------------------------------
# check_consistency differing between ranks (fault matrix case 3)
# --------------------------------------------------------------------------
def task_check_consistency_differs(kind: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(policy="always", min_bytes=0, check_consistency=rank == 0)
    n = 3000
    x = make_data(n, torch.bfloat16, 4, rank)
    _warm(cfg)
    if kind == "all_gather":
        call = lambda: all_gather_single(torch.empty(world * n, dtype=x.dtype), x, config=cfg)  # noqa: E731
    elif kind == "reduce_scatter":
        call = lambda: reduce_scatter_single(torch.empty(n // world, dtype=x.dtype),  # noqa: E731
                                             x[:n // world * world], config=cfg)
    else:
        call = lambda: all_to_all_single(torch.empty_like(x[:n // world * world]),  # noqa: E731
                                         x[:n // world * world], config=cfg)
    return _timed(call) + (_in_step(),)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter", "all_to_all"])
def test_check_consistency_differing_between_ranks_is_a_config_error_everywhere(pool2, kind):
    raised_everywhere(pool2.run(task_check_consistency_differs, kind), "ZipCCLConfigError",
                      "check_consistency")


# --------------------------------------------------------------------------
# Reduce ops differing between ranks (fault matrix case 10)
# --------------------------------------------------------------------------
def task_ops_differ(kind: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(policy="always", min_bytes=0)
    op = ReduceOp.SUM if rank == 0 else ReduceOp.AVG
    x = make_data(3000, torch.float32, 5, rank)
    _warm(cfg)
    if kind == "all_reduce":
        call = lambda: all_reduce(x, op=op, config=cfg)  # noqa: E731
    else:
        call = lambda: reduce_scatter_single(torch.empty(1000), x, op=op, config=cfg)  # noqa: E731
    return _timed(call) + (_in_step(),)


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
def test_reduce_ops_differing_between_ranks_raise_on_every_rank(pool3, kind):
    raised_everywhere(pool3.run(task_ops_differ, kind), "ValueError", "reduce op", "SUM", "AVG")


# --------------------------------------------------------------------------
# Arguments wrong on one rank only (fault matrix cases 13, 14)
# --------------------------------------------------------------------------
REFUSAL_CONFIGS = {
    # the first call of a config on a group: the agreement check comes first
    "agreement": dict(policy="always", min_bytes=0),
    # a compressed call's first size row
    "row": dict(policy="always", min_bytes=0, check_consistency=False),
    # a raw call under verify: framed and checked, so it has a size row too
    "verified_raw": dict(policy="never", verify=True, check_consistency=False),
}


def task_refused_on_one_rank(kind: str, mode: str):
    """Rank 1 passes arguments that fail its local checks; rank 0's are valid."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(**REFUSAL_CONFIGS[mode])
    bad = rank == 1
    n = 4096
    x = make_data(world * n, torch.bfloat16, 7, rank)
    _warm(cfg)
    if kind == "all_gather":  # an input of another size than the output expects
        inp = x[:n + bad]
        call = lambda: all_gather_single(  # noqa: E731
            torch.empty(world * n, dtype=x.dtype), inp, config=cfg)
    elif kind == "reduce_scatter":  # an output of the wrong size
        call = lambda: reduce_scatter_single(  # noqa: E731
            torch.empty(n + bad, dtype=x.dtype), x, config=cfg)
    elif kind == "all_to_all":  # split sizes that do not add up
        splits = [n, n + bad]
        call = lambda: all_to_all_single(  # noqa: E731
            torch.empty_like(x), x, [n, n], splits, config=cfg)
    else:  # a reduce op zipccl does not reduce with
        op = ReduceOp.MAX if bad else ReduceOp.SUM
        call = lambda: all_reduce(x, op=op, config=cfg)  # noqa: E731
    return _timed(call) + (_in_step(),)


@pytest.mark.parametrize("mode", sorted(REFUSAL_CONFIGS))
@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter", "all_to_all", "all_reduce"])
def test_arguments_wrong_on_one_rank_raise_on_every_rank(pool2, kind, mode):
    (err0, msg0, dt0, in0), (err1, msg1, dt1, in1) = pool2.run(task_refused_on_one_rank,
                                                               kind, mode)
    assert err1 == "ValueError" and "zipccl" in msg1, (err1, msg1)  # its own local error
    assert err0 == "ValueError", (err0, msg0)
    assert "rank 1 refused this call" in msg0 and kind in msg0, msg0
    assert dt0 < WITHIN_S and dt1 < WITHIN_S, (dt0, dt1)
    assert in0 and in1


# --------------------------------------------------------------------------
# An all-to-all whose output overlaps its input (fault matrix case 4)
# --------------------------------------------------------------------------
def task_all_to_all_overlap(policy: str, shift: int, trials: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(policy=policy, min_bytes=0)
    rows, width = 6 * world, 4096
    wrong = 0
    for t in range(trials):
        xs = [make_data(rows * width, torch.bfloat16, 40 + t, r).view(rows, width)
              for r in range(world)]
        want = torch.cat([x.chunk(world)[rank] for x in xs])
        buf = torch.empty((rows + shift) * width, dtype=torch.bfloat16).view(rows + shift, width)
        buf[:rows].copy_(xs[rank])
        inp, out = buf[:rows], buf[shift:shift + rows]
        all_to_all_single(out, inp, config=cfg)
        got = out.clone()
        try:
            assert_bits_equal(got, want, f"all_to_all in place {policy} shift {shift}")
        except AssertionError:
            wrong += 1
    return wrong


@pytest.mark.parametrize("policy", ["always", "never", "adaptive"])
@pytest.mark.parametrize("shift", [0, 1])
def test_all_to_all_with_overlapping_output_is_exact_on_every_path(pool2, policy, shift):
    assert pool2.run(task_all_to_all_overlap, policy, shift, 5) == [0, 0]


# --------------------------------------------------------------------------
# verify=True checks raw sends too (fault matrix case 5)
# --------------------------------------------------------------------------
RAW_PATHS = {
    "always_below_min_bytes": dict(policy="always"),  # 8 KiB messages: under min_bytes
    "never": dict(policy="never"),
    "adaptive_raw": dict(min_bytes=0, link_gbps=1e5, codec_gbps=0.01),
}


class _FlipOneByte:
    """On the rank that makes it: flip one bit, on a copy, of the first byte
    send (uint8: payloads, not the int64 rows) that zipccl's schedule makes
    through ``protocol.all_gather_single`` and ``dist.all_to_all_single``, in
    the part bound for rank 0."""

    def __init__(self) -> None:
        from zipccl_fsdp import protocol as _wire

        self.wire, self.fired = _wire, 0
        self.saved = _wire.all_gather_single, dist.all_to_all_single
        _wire.all_gather_single, dist.all_to_all_single = self.gather, self.all_to_all

    def restore(self) -> None:
        self.wire.all_gather_single, dist.all_to_all_single = self.saved

    def _flip(self, t: torch.Tensor, start: int, n: int) -> torch.Tensor:
        if self.fired or t.dtype != torch.uint8 or n == 0:
            return t
        self.fired += 1
        t = t.clone()
        t[start + n // 2] ^= 1 << 2
        return t

    def gather(self, out, inp, group=None, async_op=False):
        return self.saved[0](out, self._flip(inp, 0, inp.numel()), group=group,
                             async_op=async_op)

    def all_to_all(self, out, inp, out_splits=None, in_splits=None, group=None,
                   async_op=False):
        n = in_splits[0] if in_splits else inp.numel() // dist.get_world_size()
        return self.saved[1](out, self._flip(inp, 0, n), out_splits, in_splits, group=group,
                             async_op=async_op)


def task_damaged_raw_send(kind: str, path: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(verify=True, **RAW_PATHS[path])
    n = 4096
    x = make_data(world * n, torch.bfloat16, 9, rank)
    if kind == "all_gather":
        call = lambda: all_gather_single(  # noqa: E731
            torch.empty(world * n, dtype=x.dtype), x[:n], config=cfg, stats=st)
    elif kind == "reduce_scatter":
        call = lambda: reduce_scatter_single(  # noqa: E731
            torch.empty(n, dtype=x.dtype), x, config=cfg, stats=st)
    elif kind == "all_to_all":
        call = lambda: all_to_all_single(  # noqa: E731
            torch.empty_like(x), x, config=cfg, stats=st)
    else:
        call = lambda: all_reduce(x.clone(), config=cfg, stats=st)  # noqa: E731
    st = CommStats()
    call()  # undamaged: exact, and raw (no compressed call)
    compressed = st.snapshot()[kind]["compressed_calls"]
    damage = _FlipOneByte() if rank == 1 else None
    try:
        out = _timed(call)
    finally:
        if damage is not None:
            damage.restore()
    return out + (_in_step(), compressed, damage.fired if damage else None)


@pytest.mark.parametrize("path", sorted(RAW_PATHS))
@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter", "all_to_all", "all_reduce"])
def test_verify_catches_a_damaged_raw_send_on_every_rank(pool2, kind, path):
    got = pool2.run(task_damaged_raw_send, kind, path)
    assert got[1][-1] == 1, got  # rank 1 damaged one send
    for rank, (err, msg, dt, in_step, compressed, _) in enumerate(got):
        assert compressed == 0, (rank, compressed)  # the path under test is a raw one
        assert err == "CorruptPayloadError", (rank, err, msg)
        # rank 0 names the sender of the damaged bytes, rank 1 the rank that found them
        assert kind in msg and f"rank {1 - rank}" in msg, msg
        assert dt < WITHIN_S and in_step, (rank, dt)


# --------------------------------------------------------------------------
# NaN payloads and the piece count (fault matrix case 6)
# --------------------------------------------------------------------------
def task_nan_payloads(pieces_list: tuple):
    rank, world = dist.get_rank(), dist.get_world_size()
    n = 3 * 4099  # ragged: pieces end in vectorised bodies and scalar tails alike
    x = make_data(world * n, torch.float16, 6, rank).view(torch.int16)
    # NaN at the same positions on every rank, each rank with its own payload
    # and sign; a few positions where one rank holds +inf and another NaN.
    pos = torch.arange(7, world * n, 97)
    x[pos] = torch.tensor(0x7C01 + 17 * rank, dtype=torch.int16) | (
        torch.tensor(rank % 2, dtype=torch.int16) << 15)
    x = x.view(torch.float16)
    results = {}
    for pieces in pieces_list:
        cfg = ZipCCLConfig(policy="always", min_bytes=0, pipeline_pieces=pieces)
        out = torch.empty(n, dtype=torch.float16)
        reduce_scatter_single(out, x, config=cfg)
        results[pieces] = out.view(torch.int16).clone()
    base = results[pieces_list[0]]
    return {p: int((r != base).sum()) for p, r in results.items()}, \
        bool(torch.isnan(base.view(torch.float16)).any())


def test_nan_results_do_not_depend_on_the_piece_count(pool3):
    for differing, has_nan in pool3.run(task_nan_payloads, (1, 2, 3, 7)):
        assert has_nan
        assert differing == {1: 0, 2: 0, 3: 0, 7: 0}, differing


# --------------------------------------------------------------------------
# A model with the hook survives torch.save / torch.load (fault matrix case 12)
# --------------------------------------------------------------------------
def task_ddp_save_load(steps: int):
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from zipccl_fsdp.hooks.registry import ZipCCLHook, register_comm_hook

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 64)),
                bucket_cap_mb=0.1)
    hook = ZipCCLHook(ZipCCLConfig(policy="always", min_bytes=0))
    register_comm_hook(model, hook)

    def train(m, seed):
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(seed * 10 + rank)
        for _ in range(steps):
            m(torch.randn(16, 64, generator=g)).square().mean().backward()
            opt.step()
            opt.zero_grad()

    train(model, 1)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    # DDP's __setstate__ builds a new reducer without the comm hooks (torch's
    # own hooks included); the unpickled hook and state are registered again.
    new_hook, state = loaded._comm_hooks[0]
    loaded._comm_hooks.clear()
    loaded.register_comm_hook(state, new_hook)
    train(model, 2)
    train(loaded, 2)
    same = all(torch.equal(a.detach().view(torch.int32), b.detach().view(torch.int32))
               for a, b in zip(model.parameters(), loaded.parameters()))
    return (same, type(new_hook).__name__, new_hook is not hook,
            new_hook.stats()["all_reduce"]["compressed_calls"])


def test_ddp_model_with_the_hook_survives_save_and_load(pool2):
    for same, name, fresh, compressed in pool2.run(task_ddp_save_load, 2, timeout_s=240):
        assert name == "ZipCCLHook" and fresh
        assert compressed > 0  # the loaded model's buckets went through zipccl
        assert same  # and trained on bit for bit like the one never saved
