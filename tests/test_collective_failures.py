"""Failure paths of the collectives, on real gloo process groups: each case
raises the same error type on every rank within seconds, or gives the exact
result on every path, and leaves the process group usable.

* Arguments that differ between ranks (sizes, ``check_consistency``, reduce
  ops) and arguments wrong on one rank only: the refusal reaches every rank.
* Configs or builds that disagree: ``ZipCCLConfigError`` on every rank,
  naming the field and the ranks.
* An all-to-all whose output overlaps its input, NaN payloads across piece
  counts: exact on every path.
* Verify mode: round-trips bitwise, adding only the checksums; a payload or
  a raw send damaged in transit raises ``CorruptPayloadError`` on every rank,
  naming the collective, the sending rank and the chunk; one bit flipped in
  transit per call (``bitflip_cases``, short) is always caught.
* An encode failure on one rank, before or between a call's pieces: that call
  (or its remaining pieces) goes raw on every rank, exactly, counted in
  ``fallback_calls``; a corrupt piece in an all-reduce raises on every rank.
* A rank killed (SIGKILL) or stalled inside the payload exchange: the others
  raise within the process group's timeout + 5 s.

``benchmarks/fault_matrix.py`` runs the same kinds of case as a table.
Process groups time out after 30 s (5 s in the lost-rank cases); a case that
raised on one rank only would leave the others waiting that long, so each
task times its call on every rank and the tests require under 10 s.
"""
from __future__ import annotations

import datetime
import logging
import os
import queue
import signal
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import ReduceOp

import bitflip_cases as B
from collective_cases import (assert_bits_equal, bits, forced, make_data,
                              torch_all_gather_single)
from zipccl_fsdp import codec as zcodec
from zipccl_fsdp import format as F
from zipccl_fsdp import protocol as integrity
from zipccl_fsdp.collectives import all_reduce, all_to_all_single, reduce_scatter_single
from zipccl_fsdp.collectives import all_gather_single
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.errors import CorruptPayloadError, ZipCCLConfigError
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
# Sizes that differ between ranks
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
# check_consistency differing between ranks
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
# Reduce ops differing between ranks
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
# Arguments wrong on one rank only
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
# An all-to-all whose output overlaps its input
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
# verify=True checks raw sends too
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
# NaN payloads and the piece count
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
# Verify mode, configs that disagree, and the encode fallback: tasks
# --------------------------------------------------------------------------
def task_verify_round_trip():
    """Every collective with verify on and off: the same bits; verify adds only checksums."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for verify in (False, True):
        cfg = ZipCCLConfig(policy="always", min_bytes=0, verify=verify)
        st = CommStats()
        results = []
        for i, kind in enumerate(B.KINDS):
            xs = B.make_inputs(100 + i, B.N, "bf16", torch.bfloat16, world)
            got, want = B.run_case(kind, xs, rank, world, cfg)
            assert torch.equal(bits(got), bits(want)), (kind, verify)
            results.append(bits(got).clone())
        # run_case counts in the module's stats; count one call on our own
        x = B.make_inputs(7, B.N, "bf16", torch.bfloat16, world)[rank]
        all_gather_single(torch.empty(world * x.numel(), dtype=x.dtype), x, config=cfg, stats=st)
        out[verify] = (results, st.snapshot()["all_gather"]["wire_bytes"])
    for a, b in zip(out[False][0], out[True][0]):
        assert torch.equal(a, b)
    # The same payloads plus 4 bytes per 4096 elements, on every rank: the padded
    # all-gather width grows by exactly that; and one int64 per rank at the end,
    # whether some rank found a corrupt payload (``pipeline._Call.settle``).
    return out[True][1] - out[False][1], 4 * F.nchunks_for(B.N) + 8


def task_corrupt_in_transit(kind: str, skip: int):
    """Rank 1 flips one bit of a payload it sends rank 0; rank 0 must name kind, peer, chunk."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(policy="always", min_bytes=0, verify=True)
    transport = B.FlipTransport(rank, world, seed=5) if rank == 1 else None
    xs = B.make_inputs(3, B.N, "bf16", torch.bfloat16, world)
    if transport:
        transport.arm(to=0, skip=skip)
    try:
        B.run_case(kind, xs, rank, world, cfg)
        result = None
    except CorruptPayloadError as e:
        result = (e.collective, e.peer, e.chunk, str(e))
    finally:
        if transport:
            transport.restore()
    # The group is still in step.
    t = torch.ones(8)
    all_reduce(t, config=ZipCCLConfig(policy="always", min_bytes=0, verify=True))
    assert t.tolist() == [float(world)] * 8
    return result


def task_config_mismatch(which: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = integrity._codec.CODECS
    if which == "verify":
        cfg = ZipCCLConfig(policy="always", min_bytes=0, verify=rank == world - 1)
    elif which == "min_bytes":
        cfg = ZipCCLConfig(policy="always", min_bytes=0 if rank != 1 else 1 << 20)
    else:  # a build that decodes a codec the others don't know
        cfg = ZipCCLConfig(policy="always", min_bytes=0)
        if rank == 1:
            integrity._codec.CODECS = saved + ("zstd",)
    x = torch.randn(1000)
    try:
        all_gather_single(torch.empty(world * 1000), x, config=cfg)
        message = None
    except ZipCCLConfigError as e:
        message = str(e)
    finally:
        integrity._codec.CODECS = saved
    # Still in step, and an agreeing config works.
    t = torch.full((300,), float(rank))
    all_reduce(t, config=ZipCCLConfig(policy="always", min_bytes=0))
    assert t.tolist() == [float(sum(range(world)))] * 300
    return message


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.levels = []

    def emit(self, record) -> None:
        self.levels.append(record.levelno)


def task_fallback(fail_rank: int, fail_after: int):
    """``fail_rank``'s encoder raises after ``fail_after`` successful encodes in each
    call; every collective must still return the exact result on every rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(policy="always", min_bytes=0, verify=True)
    st = CommStats()
    real = zcodec.encode
    count = {"n": 0}

    def broken(x, **kw):
        count["n"] += 1
        if count["n"] > fail_after:
            raise RuntimeError("injected encoder failure")
        return real(x, **kw)

    records = _Records()
    log = logging.getLogger("zipccl_fsdp.protocol")
    log.addHandler(records)
    log.setLevel(logging.DEBUG)
    import zipccl_fsdp.collectives.dispatch as C
    saved_stats = C._STATS
    C._STATS = st  # run_case uses the module's stats
    try:
        for rep in range(2):
            for i, kind in enumerate(B.KINDS):
                xs = B.make_inputs(200 + i, B.N, "fp32", torch.float32, world)
                count["n"] = 0
                if rank == fail_rank:
                    zcodec.encode = broken
                try:
                    got, want = B.run_case(kind, xs, rank, world, cfg)
                finally:
                    zcodec.encode = real
                assert torch.equal(bits(got), bits(want)), (kind, rep)
        s = st.snapshot()
        # The encoder works again: compressed again.
        xs = B.make_inputs(300, B.N, "bf16", torch.bfloat16, world)
        B.run_case("all_gather", xs, rank, world, cfg)
        again = (st.snapshot()["all_gather"]["compressed_calls"]
                 - s["all_gather"]["compressed_calls"])
    finally:
        C._STATS = saved_stats
        log.removeHandler(records)
    return ({k: (s[k]["calls"], s[k]["compressed_calls"], s[k]["fallback_calls"])
             for k in B.KINDS}, again, records.levels)


# --------------------------------------------------------------------------
# Verify mode, configs that disagree, and the encode fallback: tests
# --------------------------------------------------------------------------
def test_verify_round_trips_bitwise_and_adds_only_checksums(pool2):
    for extra, sums_bytes in pool2.run(task_verify_round_trip):
        assert extra == sums_bytes, (extra, sums_bytes)


@pytest.mark.parametrize("kind,skip", [("all_gather", 0), ("reduce_scatter", 0),
                                       ("all_to_all", 0), ("all_reduce", 0), ("all_reduce", 1)])
def test_corrupt_payload_names_collective_peer_and_chunk(pool2, kind, skip):
    got0, got1 = pool2.run(task_corrupt_in_transit, kind, skip)
    assert got0 is not None, "rank 0 took a damaged payload without noticing"
    collective, peer, chunk, text = got0
    assert (collective, peer) == (kind, 1) and "rank 1" in text and kind in text
    assert chunk is None or 0 <= chunk < F.nchunks_for(B.N), text
    assert got1 is not None, "the sender went on as if the call had succeeded"
    assert got1[:2] == (kind, 0) and "rank 0" in got1[3], got1  # names the rank that found it
    if kind == "all_reduce" and skip == 0:
        # damaged in the reduce-scatter half: rank 0 stops the all-gather half on every rank
        assert "stopped it on every rank" in got1[3]
    else:  # learnt at the end of the call
        assert "from rank 1" in got1[3] and "every rank" in got1[3], got1


@pytest.mark.parametrize("which,expect", [
    ("verify", ["ranks [0, 1] have False", "rank 2 has True"]),
    ("min_bytes", ["ranks [0, 2] have 0", "rank 1 has 1048576"]),
    ("codec_set", ["ranks [0, 2] have", "rank 1 has"]),  # values are hashed: not all shown
])
def test_config_mismatch_names_field_and_ranks_on_every_rank(pool3, which, expect):
    messages = pool3.run(task_config_mismatch, which, timeout_s=60)
    for rank, m in enumerate(messages):
        assert m is not None, f"rank {rank} did not raise"
        assert "disagree" in m and f"this is rank {rank}" in m, m
        lines = m.splitlines()[1:]  # one line per differing field
        assert len(lines) == 1 and lines[0].strip().startswith(f"{which}:"), m
        for part in expect:
            assert part in lines[0], m


@pytest.mark.parametrize("fail_after", [0, 1])
def test_encode_failure_on_one_rank_falls_back_on_every_rank(pool3, fail_after):
    per_rank = pool3.run(task_fallback, 1, fail_after)
    for rank, (counts, again, levels) in enumerate(per_rank):
        for kind, (calls, compressed, fallback) in counts.items():
            assert calls == 2, (rank, kind, counts)
            if fail_after == 1 and kind == "all_gather":
                # one encode per call: the first succeeds, so nothing falls back
                assert (compressed, fallback) == (2, 0), (rank, kind, counts)
            else:
                assert (compressed, fallback) == (0, 2), (rank, kind, counts)
        assert again == 1
        if rank == 1:  # a warning for the first failure of a kind, then debug messages
            assert levels[0] == logging.WARNING and logging.DEBUG in levels, levels
            assert levels.count(logging.WARNING) <= 2 * len(B.KINDS), levels
        else:
            assert levels == []


# --------------------------------------------------------------------------
# A pipelined call: an encode failure between pieces, a corrupt piece
# --------------------------------------------------------------------------
def task_encode_fails_midway():
    """Rank 1's encoder fails at its third call: that piece and the later ones
    go raw on every rank, the result is still exact."""
    from zipccl_fsdp import codec as C
    rank, world = dist.get_rank(), dist.get_world_size()
    real = C.encode
    calls = {"n": 0}

    def flaky(x, **kw):
        calls["n"] += 1
        if rank == 1 and calls["n"] == 3:
            raise RuntimeError("injected encoder failure")
        return real(x, **kw)

    C.encode = flaky
    try:
        st = CommStats()
        n = 5000
        x = make_data(n, torch.bfloat16, seed=9, rank=rank)
        want = torch.empty(world * n, dtype=torch.bfloat16)
        torch_all_gather_single(want, x)
        got = torch.empty_like(want)
        all_gather_single(got, x, config=forced(5, "dense"), stats=st)
        assert_bits_equal(got, want, "all_gather after a failed encode")
        return st.snapshot()["all_gather"]
    finally:
        C.encode = real


def task_corrupt_piece_all_reduce():
    """A corrupt piece in an all-reduce's first half: both ranks raise, nobody hangs,
    and the group still works afterwards."""
    from zipccl_fsdp import protocol as I
    rank = dist.get_rank()
    real = I.decode_from

    def bad(piece, out, cfg, kind, peer, group):
        if rank == 0:
            raise CorruptPayloadError("injected corrupt piece")
        return real(piece, out, cfg, kind, peer, group)

    I.decode_from = bad
    try:
        y = make_data(6000, torch.float32, seed=4, rank=rank)
        try:
            all_reduce(y, config=forced(3, "dense"))
            raised = None
        except CorruptPayloadError as e:
            raised = str(e)
    finally:
        I.decode_from = real
    t = torch.full((4,), float(rank + 1))
    all_reduce(t, config=forced(2, "dense"))
    assert t.tolist() == [3.0] * 4
    return raised


def test_pipelined_encode_failure_goes_raw_on_every_rank(pool2):
    for s in pool2.run(task_encode_fails_midway):
        assert s["fallback_calls"] == 1 and s["compressed_calls"] == 1


def test_pipelined_all_reduce_corrupt_piece_raises_everywhere(pool2):
    r0, r1 = pool2.run(task_corrupt_piece_all_reduce)
    assert r0 and "injected" in r0
    assert r1 and "corrupt" in r1 and "rank" in r1


# --------------------------------------------------------------------------
# A rank dies or stalls mid-collective
# --------------------------------------------------------------------------
FAULT_PG_TIMEOUT_S = 5
GRACE_S = 5  # how long past the pg timeout the other ranks may take to raise
WARM_PG_TIMEOUT_S = 30
"""The group's timeout until every rank is past the warm call: three ranks
starting and running it on a loaded 2-core machine (CI runs the kernel tests
beside the suite) may drift apart by more than FAULT_PG_TIMEOUT_S."""


def _fault_proc(rank: int, world: int, init_file: str, kind: str, mode: str, victim: int,
                q) -> None:
    torch.set_num_threads(1)
    from zipccl_fsdp import protocol as W
    from zipccl_fsdp.config import ZipCCLConfig

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=WARM_PG_TIMEOUT_S))
    cfg = ZipCCLConfig(policy="always", min_bytes=0, verify=True)
    xs = B.make_inputs(1, B.N, "bf16", torch.bfloat16, world)
    B.run_case(kind, xs, rank, world, cfg)  # warm: the agreement check is behind us
    dist.barrier()  # every rank is past it: the short timeout the test bounds holds from here
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=FAULT_PG_TIMEOUT_S))
    if rank == victim:
        def die_or_stall() -> None:
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)  # stall: the parent kills us

        real_ag, real_a2a = W.all_gather_single, dist.all_to_all_single

        def ag(output, input, *a, **kw):
            if input.dtype == torch.uint8:  # the payload exchange, after the sizes
                die_or_stall()
            return real_ag(output, input, *a, **kw)

        def a2a(output, input, *a, **kw):
            if input.dtype == torch.uint8:
                die_or_stall()
            return real_a2a(output, input, *a, **kw)

        W.all_gather_single, dist.all_to_all_single = ag, a2a
    q.put((rank, "ready", 0.0))
    t0 = time.monotonic()
    try:
        B.run_case(kind, xs, rank, world, cfg)
        outcome = "returned"
    except Exception as e:  # noqa: BLE001 - reported to the parent
        outcome = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    q.put((rank, outcome, time.monotonic() - t0))
    q.close()
    q.join_thread()
    os._exit(0)  # no teardown: the group has a dead member


def run_fault(kind: str, mode: str, world: int = 3, victim: int = 1) -> dict:
    """Start ``world`` ranks, make ``victim`` die or stall inside ``kind``; return
    {rank: (outcome, seconds from the call to its end)} for the other ranks."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="zipccl_fault_") as d:
        procs = [ctx.Process(target=_fault_proc, daemon=True,
                             args=(r, world, os.path.join(d, "rdv"), kind, mode, victim, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        got, deadline = {}, None
        start_by = time.monotonic() + 300  # spawning, rendezvous and the warm call
        try:
            while len(got) < world - 1:
                try:
                    rank, outcome, dt = q.get(timeout=1)
                except queue.Empty:
                    if deadline and time.monotonic() > deadline:
                        break
                    # No rank ready yet: stop once every rank has exited (the
                    # warm call failed; the ranks printed why) or too late.
                    if deadline is None and (time.monotonic() > start_by
                                             or not any(p.is_alive() for p in procs)):
                        break
                    continue
                if outcome == "ready":
                    if deadline is None:  # spawning is slow; start counting once all run
                        deadline = time.monotonic() + 60
                    continue
                got[rank] = (outcome, dt)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join(timeout=10)
    return got


@pytest.mark.parametrize("kind,mode", [("all_gather", "kill"), ("reduce_scatter", "stall"),
                                       ("all_to_all", "kill")])
def test_rank_lost_mid_collective_makes_the_others_raise_in_time(kind, mode):
    got = run_fault(kind, mode)
    assert sorted(got) == [0, 2], f"survivors that never came back: {got}"
    for rank, (outcome, dt) in got.items():
        assert outcome != "returned", (rank, outcome)
        assert dt <= FAULT_PG_TIMEOUT_S + GRACE_S, (rank, outcome, dt)


# --------------------------------------------------------------------------
# Bits flipped in transit (the short run of benchmarks/bitflip_transit.py)
# --------------------------------------------------------------------------
def task_bitflips(n: int, seed: int):
    return B.worker_loop(dist.get_rank(), dist.get_world_size(), n, seed)


def test_bit_flips_in_transit_are_all_caught(pool2):
    n = 96  # 4 collectives x 4 dtypes x 3 codecs x 2; benchmarks/bitflip_transit.py runs 1000+
    victim, flipper = pool2.run(task_bitflips, n, 11, timeout_s=240)
    o = victim["outcomes"]
    assert o.get("missed", 0) == 0 and o.get("caught_misattributed", 0) == 0, victim
    assert o.get("caught", 0) + o.get("harmless", 0) == n, victim
    assert o.get("caught", 0) >= 0.95 * n, victim  # harmless flips are rare (stream padding)
    assert flipper["outcomes"] == {}, flipper
