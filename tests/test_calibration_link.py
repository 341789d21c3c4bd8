"""The calibration on a real shaped link: a network namespace whose loopback
a token-bucket shaper (``tc tbf``) limits to 1 Gbit/s, as ``zipccl demo``
and ``zipccl bench link`` use it, both ranks' bytes through one queue. In
a round of the calibration's all-gathers one rank may have its share in
half the round's time (the other's queued behind it), so a link fitted to
each rank's fastest round reads about twice what it carries. The bound is
the link's own, what the transfer cannot take less than, so that a loaded
machine, which slows the call, does not move it. Needs root, ``ip`` and
``tc``.
"""
from __future__ import annotations

import csv
import pathlib
import subprocess
import sys

import pytest

from zipccl_fsdp.netns import can_shape

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_calibrated_link_prices_a_large_raw_all_gather_near_what_it_takes(tmp_path):
    ok, why = can_shape()
    if not ok:
        pytest.skip(f"no shaped namespace here: {why}")
    out = tmp_path / "rows.csv"
    done = subprocess.run(
        [sys.executable, "-m", "zipccl_fsdp.cli", "bench", "link", "--rate", "1gbit",
         "--sizes", "16MiB", "--collectives", "all_gather", "--repeat", "1", "--csv", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (row,) = list(csv.DictReader(out.open()))
    assert row["link"] == "namespace loopback shaped to 1gbit", row
    predicted, took = float(row["pred_raw_ms"]), float(row["raw_ms"])
    # Both ranks' shares, 8 MiB each, cross the one 125 MB/s queue: the
    # all-gather cannot take less than floor_ms. A calibration that fits the
    # link to what it carries prices it near that (a round that starts on
    # the shaper's burst reads at most about a fifth fast); one fitted to
    # half rounds prices it near half.
    floor_ms = 2 * (8 << 20) / 125e6 * 1e3
    assert took >= 0.95 * floor_ms, (took, floor_ms)  # the link is shaped
    assert predicted >= 0.75 * floor_ms, (predicted, took, row["link_MBps"])
    assert float(row["link_MBps"]) <= 125.0, row["link_MBps"]
