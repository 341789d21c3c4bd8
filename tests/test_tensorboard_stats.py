"""zipccl_fsdp.TensorBoardStats: what it refuses. (What it writes, read back
from a real event file after DDP training: tests/test_ddp.py.)"""
from __future__ import annotations

import pytest

from zipccl_fsdp import TensorBoardStats, ZipCCLHook


class _Writer:
    def add_scalar(self, tag, value, step):  # never called here
        raise AssertionError("nothing should be written")


def test_source_must_have_stats():
    with pytest.raises(TypeError, match="stats\\(\\) method.*got dict"):
        TensorBoardStats(_Writer(), {"all_reduce": {}})


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match="unknown kinds \\['allreduce'\\]"):
        TensorBoardStats(_Writer(), ZipCCLHook(), kinds=("allreduce",))


def test_nothing_is_written_before_any_call():
    assert TensorBoardStats(_Writer(), ZipCCLHook()).log(1) == {}


def test_calibration_scalars_say_what_the_policy_measured():
    """The link of the slowest group (10**6 bytes/s) and the largest in-situ
    codec slowdown per dtype; nothing before the first decision, and a
    hook that has decided nothing reports nothing."""
    import torch

    from zipccl_fsdp.hooks.registry import ZipCCLHook
    from zipccl_fsdp.cost import LinkSpeed
    from zipccl_fsdp.tensorboard_stats import calibration_scalars

    assert calibration_scalars(ZipCCLHook().calibration()) == {}
    report = {
        "links": {"0": LinkSpeed(2e-4, 77e6), "1": LinkSpeed(1e-4, 3e9)},
        "speeds": {},
        "probes": {("0", torch.bfloat16, "cpu"): {"slowdown": 2.5},
                   ("1", torch.bfloat16, "cpu"): {"slowdown": 1.5},
                   ("0", torch.float32, "cpu"): {"slowdown": 4.0}},
    }
    assert calibration_scalars(report) == {"link_MBps": pytest.approx(77.0),
                                           "slowdown_bf16": 2.5, "slowdown_fp32": 4.0}


class _Recorder:
    def __init__(self) -> None:
        self.scalars: dict = {}

    def add_scalar(self, tag, value, step):
        self.scalars.setdefault(tag, {})[step] = value


class _Source:
    """A hook's stats() and calibration(), set by the test."""

    def __init__(self) -> None:
        self.counters = {"calls": 0, "compressed_calls": 0, "raw_bytes": 0, "wire_bytes": 0}
        self.report: dict = {"links": {}, "speeds": {}, "probes": {}}

    def step(self, calls: int, raw: int, wire: int) -> None:
        c = self.counters
        c["calls"] += calls
        c["compressed_calls"] += calls
        c["raw_bytes"] += raw
        c["wire_bytes"] += wire

    def stats(self):
        return {"all_reduce": dict(self.counters)}

    def calibration(self):
        return self.report


def test_first_log_books_the_traffic_since_it_was_made():
    """Warm-up traffic the hook carried before TensorBoardStats was made is
    not booked to the first logged step."""
    source = _Source()
    source.step(calls=7, raw=7_000_000, wire=3_500_000)  # warm-up steps
    writer = _Recorder()
    tb = TensorBoardStats(writer, source)
    source.step(calls=2, raw=2_000_000, wire=1_000_000)
    out = tb.log(1)
    assert out["zipccl/all_reduce/raw_MB"] == pytest.approx(2.0)
    assert out["zipccl/all_reduce/wire_MB"] == pytest.approx(1.0)
    assert out["zipccl/all_reduce/calls"] == 2
    source.step(calls=1, raw=1_000_000, wire=250_000)
    assert tb.log(2)["zipccl/all_reduce/ratio"] == pytest.approx(4.0)
    assert writer.scalars["zipccl/all_reduce/raw_MB"] == {1: pytest.approx(2.0),
                                                          2: pytest.approx(1.0)}


def test_calibration_tags_are_written_once_measured():
    """zipccl/calibration/<name>, as torchtitan runs log them, from a source
    with a calibration() report; nothing before the policy measured."""
    import torch

    from zipccl_fsdp.cost import LinkSpeed

    source = _Source()
    writer = _Recorder()
    tb = TensorBoardStats(writer, source)
    source.step(calls=1, raw=100, wire=50)
    assert not [t for t in tb.log(1) if "calibration" in t]
    source.report = {"links": {"0": LinkSpeed(1e-4, 125e6)}, "speeds": {},
                     "probes": {("0", torch.bfloat16, "cpu"): {"slowdown": 2.0}}}
    out = tb.log(2)  # written even in a step without calls
    assert out == {"zipccl/calibration/link_MBps": pytest.approx(125.0),
                   "zipccl/calibration/slowdown_bf16": 2.0}
    assert writer.scalars["zipccl/calibration/link_MBps"] == {2: pytest.approx(125.0)}
