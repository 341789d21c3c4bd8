"""What every module that talks to ``torch.distributed`` shares: torch's
collective names, the int64 exchange, and the key of a process group.

Defined once here so that the collectives, the schedule, the agreement check
and the calibration cannot drift apart in how they move control integers.
The schedule looks ``all_gather_single`` up here at each call, so a test that
wraps this one attribute sees every all-gather zipccl makes.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ._layout import device_ints

__all__ = ["all_gather_single", "reduce_scatter_single", "gather_ints", "group_key"]

# torch 2.13 names; torch 2.11 only has the older (since deprecated) ones.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def gather_ints(values: list, group, world: int, device, async_op: bool = False):
    """All-gather a list of int64s of the same length on every rank.

    Returns the rows in rank order, or with ``async_op`` a function that waits
    for the exchange and then returns them."""
    width = len(values)
    mine = device_ints(values, device)
    every = torch.empty(world * width, dtype=torch.int64, device=device)
    work = all_gather_single(every, mine, group=group, async_op=async_op)

    def rows() -> list:
        if work is not None:
            work.wait()
        flat = every.tolist()
        return [flat[r * width:(r + 1) * width] for r in range(world)]

    return rows if async_op else rows()


def group_key(group):
    """A process group's stable name (its ``group_name``), else its id."""
    return getattr(group, "group_name", None) or id(group)
