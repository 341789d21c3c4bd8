"""Raw lanes: the shortest way from a public collective to the process group,
for calls that are sure to go raw.

Once a call has gone raw for a reason that no later call can change (the
adaptive policy found this group's link faster than any codec for the dtype,
``policy="never"``, or the kind's ``compress_*`` switch off), the collective
opens a lane for its (kind, group, dtype, device) in the runtime state of its
config in its stats' owner (``runtime.py``). A call raw for its own size opens
none: it exchanges its size row before torch's call (``dispatch.announce``),
which a lane would skip. The next such calls find it (``find``); their arguments
pass either a narrow test the collective asks inline for its commonest
calls (contiguous tensors of one dtype and device, even splits, a SUM: a
subset of what its checks accept, so it never takes a call they refuse)
or the collective's own argument checks (``checked``: the function its
general path runs, so a check and its error text live once, in the
collective's module). Then the lane counts their stats as the general path
would and calls the ``ProcessGroup`` method that torch's own wrapper calls
(``Lane.send``), skipping both zipccl's general path and torch's Python.

Why: a real call follows a blocking collective, and Python right after one
runs several times slower than in a loop (cold caches, a vCPU back from
idle), so zipccl's general raw path costs a large fraction of a small gloo
call; through a lane a raw call costs about what torch's own does
(``benchmarks/raw_call_overhead.py``; docs/benchmarks.md, "Raw call overhead").

A lane never raises on bad input and never changes what a call does: a call
it is not sure of takes the general path, with its checks and messages
(which tell the peers). That includes tensor subclasses and torch-function
modes (torch's wrapper dispatches those), tensors that require grad, a
running profiler (the general path records its ranges), torch's coalescing
manager, arguments the collective's checks refuse (``checked`` returns
``MISS``), an all-to-all whose output overlaps its input, and under
``verify``, where raw calls are framed and checked (no lane opens). The
all-reduce's lane takes only the calls its general path would hand to
torch's all-reduce (``_reduce.torch_sums_alike``).
"""
from __future__ import annotations

import collections
import time
import weakref

import torch
from torch._C import _has_torch_function
from torch.distributed.distributed_c10d import (AllgatherOptions, AllreduceOptions,
                                                AllToAllOptions, _world)

from ..config import DEFAULT_CONFIG
from ..stats import MODULE_STATS
from ..stats import profiling as _profiling

__all__ = ["MISS", "GATHER", "ALL_TO_ALL", "ALL_REDUCE", "Lane", "open_lane", "find", "checked"]

MISS = object()
"""What ``checked`` returns for arguments the collective's checks refuse."""

_Tensor = torch.Tensor
_clock = time.perf_counter

# What a lane calls, named by the collective that opens it: torch's options
# type and the ProcessGroup method that torch's wrapper calls.
GATHER = (AllgatherOptions, "all_gather_single")
ALL_TO_ALL = (AllToAllOptions, "all_to_all_single")
ALL_REDUCE = (AllreduceOptions, "allreduce")  # options' reduceOp: SUM, their default


class Lane:
    """What a raw call of one (kind, group, stats, dtype, device) needs: the
    group's size and this rank, the stats fields it adds to, the policy's
    decision counter, the process group's method and torch's options
    objects, at ``opts[async_op]``; ``via``: what it calls (``GATHER``, ...)."""

    __slots__ = ("pg", "world", "rank", "fields", "decisions", "decision", "method", "opts",
                 "via")

    def __init__(self, kind: str, via: tuple, pg, world: int, rank: int, fields: dict,
                 decisions) -> None:
        # A weak reference, and the method unbound: a lane must not keep the
        # group (and its backend's threads) alive past destroy_process_group.
        self.pg = weakref.ref(pg)
        self.world, self.rank, self.fields = world, rank, fields
        self.decisions = decisions if decisions is not None else collections.Counter()
        self.decision = (kind, "raw", 1)
        self.via = via
        options, method = via
        self.method = getattr(type(pg), method)
        self.opts = tuple(_options(options, async_op) for async_op in (False, True))

    def send(self, nbytes: int, async_op: bool, *args):
        """Count a call that sends ``nbytes`` as the general path counts a raw
        one, and run the process group's method on ``args``: its ``Work`` with
        ``async_op``, else None once it is done; the time goes to ``comm_s``.
        (One method, not two: a Python frame right after a blocking
        collective costs a measurable share of a small call.)"""
        fields = self.fields
        fields["calls"] += 1
        fields["raw_bytes"] += nbytes
        fields["raw_fallback_calls"] += 1
        fields["wire_bytes"] += nbytes
        self.decisions[self.decision] += 1
        start = _clock()
        work = self.method(self.pg(), *args, self.opts[1 if async_op else 0])
        if not async_op:
            work.wait()
            work = None
        fields["comm_s"] += _clock() - start
        return work


def _options(options, async_op: bool):
    opts = options()
    opts.asyncOp = async_op
    return opts


def open_lane(state, kind: str, via: tuple, pg, world: int, rank: int, fields: dict,
              dtype: torch.dtype, device: torch.device, decisions=None) -> None:
    """Open the lane of ``kind`` calls on process group ``pg`` (resolved: never
    None) with tensors of ``dtype`` on ``device`` in ``state`` (the
    ``runtime.ConfigState`` of the call's config in its stats' runtime),
    calling what ``via`` names (``GATHER``, ``ALL_TO_ALL``). Only for a call
    just sent raw for a reason no later call can change (see the module
    docstring); ``fields`` is the stats object's dict for ``kind``
    (``CommStats.fields``), ``decisions`` the policy's counter of its plans,
    if it counted this call. Keyed by the group's id, checked against the
    lane's weak reference (an id can be reused once a group is gone)."""
    key = (kind, id(pg), dtype, device)
    lane = state.lanes.get(key)
    if lane is None or lane.pg() is not pg:
        state.lanes[key] = Lane(kind, via, pg, world, rank, fields, decisions)


def _lanes(config, stats) -> dict:
    """The lanes of ``config`` (None: the default) in the runtime of ``stats``
    (None: the free functions')."""
    runtime = (MODULE_STATS if stats is None else stats).runtime
    config = DEFAULT_CONFIG if config is None else config
    last = runtime.last  # Runtime.state's own fast path, without its call
    return (last[1] if last[0] is config else runtime.state(config)).lanes


def find(kind: str, output, input, group, config, stats) -> Lane | None:
    """The open lane of a call of ``kind`` (``output`` is ``input`` for an
    all-reduce), or None where the call must take the general path."""
    if (type(input) is not _Tensor or type(output) is not _Tensor
            or _has_torch_function((input, output)) or input.requires_grad
            or output.requires_grad or _profiling() or _world.pg_coalesce_state):
        return None
    pg = _world.default_pg if group is None else group
    lane = _lanes(config, stats).get((kind, id(pg), input.dtype, input.device))
    return lane if lane is not None and lane.pg() is pg else None


def checked(check, *args):
    """``check(*args)``, the collective's own argument checks, or ``MISS`` where
    they raise: the general path then raises the error and tells the peers."""
    try:
        return check(*args)
    except (TypeError, ValueError):
        return MISS
