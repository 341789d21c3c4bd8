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
