"""tests/device_collectives.py on the CPU (here and in CI) and on CUDA (when a
GPU is present; benchmarks/gpu_check.py runs the same task there)."""
from __future__ import annotations

import pytest
import torch

from device_collectives import KINDS, task_collectives_on, task_ddp_hook_on

DEVICES = ("cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device")))


@pytest.mark.parametrize("device", DEVICES)
def test_collectives_bitwise_on_device(device, pool2):
    results = pool2.run(task_collectives_on, device, timeout_s=600)
    assert results[0] == results[1], results
    assert results[0]["checked"] > 100
    # Every collective went through the compressed path, not only the raw one.
    assert all(results[0][k] > 0 for k in KINDS), results[0]


@pytest.mark.parametrize("device", DEVICES)
def test_ddp_hook_bitwise_on_device(device, pool2):
    results = pool2.run(task_ddp_hook_on, device, timeout_s=300)
    assert results[0] == results[1], results
    assert results[0]["checked"] == 2 * 3 * 6  # dtypes x steps x parameters
    # Several buckets per backward, all compressed.
    assert results[0]["compressed"] == results[0]["calls"] > 2 * 3, results[0]
