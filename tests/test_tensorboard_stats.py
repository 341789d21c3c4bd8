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
