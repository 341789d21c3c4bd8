"""Raw lanes: the shortest way from a public collective to the process group,
for calls that are sure to go raw.

Once a call has gone raw for a reason that no later call can change (the
adaptive policy found this group's link faster than any codec for the dtype,
or ``policy="never"``), the collective opens a lane for its (config, stats,
group, dtype, device). The next such calls then check their arguments in a
few steps, count their stats as the general path would, and call the
``ProcessGroup`` method that torch's own wrapper calls, skipping both
zipccl's general path and torch's Python.

Why: a real call follows a blocking collective, and Python right after one
runs several times slower than in a loop (cold caches, a vCPU back from
idle), so zipccl's general raw path costs a large fraction of a small gloo
call; through a lane a raw call costs what torch's own does
(``benchmarks/raw_call_overhead.py``, docs/benchmarks.md).

A lane never raises on bad input and never changes what a call does: any call
it is not sure of returns ``MISS`` and takes the general path, with its
checks and messages. That includes tensor subclasses and torch-function modes
(torch's wrapper dispatches those), tensors that require grad, a running
profiler (the general path records its ranges), torch's coalescing manager,
invalid shapes or split sizes, an all-to-all whose output overlaps its input,
and reduce ops other than SUM.
"""
from __future__ import annotations

import collections
import time

import torch
from torch._C import _has_torch_function
from torch.distributed import ReduceOp
from torch.distributed.distributed_c10d import (AllgatherOptions, AllreduceOptions,
                                                AllToAllOptions, _world)

from .config import DEFAULT_CONFIG
from .stats import profiling as _profiling

MISS = object()
"""What a lane returns for a call it does not take."""

_Tensor = torch.Tensor
_SUM = ReduceOp.SUM
_AVG = ReduceOp.AVG
_clock = time.perf_counter
_OPTIONS = {"all_gather": AllgatherOptions, "all_to_all": AllToAllOptions,
            "all_reduce": AllreduceOptions}


class _Lane:
    """What a raw call of one (kind, group, stats, dtype, device) needs: the
    group, its size and this rank, the stats fields it adds to, the policy's
    decision counter, and torch's options objects, at ``opts[async_op]``; an
    all-reduce's AVG options at ``opts[2 + async_op]`` where the backend has
    AVG (NCCL), else None: gloo's AVG divides, then sums, as the general
    path's ``collectives._native_all_reduce`` does."""

    __slots__ = ("pg", "world", "rank", "itemsize", "fields", "decisions", "decision", "opts")

    def __init__(self, kind: str, pg, world: int, rank: int, itemsize: int, fields: dict,
                 decisions, native_avg: bool) -> None:
        self.pg, self.world, self.rank, self.itemsize = pg, world, rank, itemsize
        self.fields = fields
        self.decisions = decisions if decisions is not None else collections.Counter()
        self.decision = (kind, "raw", 1)
        self.opts = tuple(_options(kind, _SUM, async_op) for async_op in (False, True))
        if kind == "all_reduce":
            self.opts += tuple(_options(kind, _AVG, async_op) if native_avg else None
                               for async_op in (False, True))


def _options(kind: str, op, async_op: bool):
    opts = _OPTIONS[kind]()
    opts.asyncOp = async_op
    if kind == "all_reduce":
        opts.reduceOp = op
    return opts


def open_lane(cfg, kind: str, pg, world: int, rank: int, stats_arg, fields: dict,
              dtype: torch.dtype, device: torch.device, decisions=None,
              native_avg: bool = False) -> None:
    """Open the lane of ``kind`` calls on process group ``pg`` (resolved: never
    None) passing ``stats=stats_arg`` (None included) with tensors of ``dtype``
    on ``device``. Only for a call just sent raw for a reason no later call
    can change (see the module docstring); ``fields`` is the stats object's
    dict for ``kind`` (``CommStats.fields``), ``decisions`` the policy's
    counter of its plans, if it has one; ``native_avg``: the backend reduces
    with AVG (NCCL)."""
    key = (kind, pg, stats_arg, dtype, device)
    if key not in cfg._raw_lanes:
        cfg._raw_lanes[key] = _Lane(kind, pg, world, rank, dtype.itemsize, fields, decisions,
                                    native_avg)


# The three lanes below repeat their checks and counting inline rather than
# share helpers: a Python call frame right after a blocking collective costs
# a measurable share of a small call (benchmarks/raw_call_overhead.py,
# docs/benchmarks.md).

def all_gather(output, input, group, async_op, config, stats):
    """``collectives.all_gather_single`` through its lane, or MISS."""
    if (type(input) is not _Tensor or type(output) is not _Tensor
            or _has_torch_function((input, output)) or _profiling()):
        return MISS
    device = input.device
    lane = (DEFAULT_CONFIG if config is None else config)._raw_lanes.get(
        ("all_gather", _world.default_pg if group is None else group, stats, input.dtype,
         device))
    if (lane is None or output.dtype is not input.dtype or output.device != device
            or input.requires_grad or output.requires_grad
            or not input.is_contiguous() or not output.is_contiguous()
            or output.numel() != lane.world * input.numel() or _world.pg_coalesce_state):
        return MISS
    nbytes = input.numel() * lane.itemsize
    fields = lane.fields
    fields["calls"] += 1
    fields["raw_bytes"] += nbytes
    fields["raw_fallback_calls"] += 1
    fields["wire_bytes"] += nbytes
    lane.decisions[lane.decision] += 1
    start = _clock()
    work = lane.pg.all_gather_single(output, input, lane.opts[1 if async_op else 0])
    if not async_op:
        work.wait()
        work = None
    fields["comm_s"] += _clock() - start
    return work


def all_to_all(output, input, output_split_sizes, input_split_sizes, group, async_op, config,
               stats):
    """``collectives.all_to_all_single`` through its lane, or MISS."""
    if (type(input) is not _Tensor or type(output) is not _Tensor
            or _has_torch_function((input, output)) or _profiling()):
        return MISS
    device = input.device
    lane = (DEFAULT_CONFIG if config is None else config)._raw_lanes.get(
        ("all_to_all", _world.default_pg if group is None else group, stats, input.dtype,
         device))
    if (lane is None or output.dtype is not input.dtype or output.device != device
            or input.requires_grad or output.requires_grad
            or not input.is_contiguous() or not output.is_contiguous()):
        return MISS
    shape_in, shape_out = input.shape, output.shape
    if not shape_in or not shape_out:  # 0-dim
        return MISS
    start_in, start_out = input.data_ptr(), output.data_ptr()
    if start_in < start_out + output.nbytes and start_out < start_in + input.nbytes:
        return MISS  # overlapping: the general path reads the input from a copy
    rows_in, rows_out = shape_in[0], shape_out[0]
    if rows_in:
        row = input.numel() // rows_in
        if row * rows_out != output.numel():  # rows of different sizes
            return MISS
    elif rows_out:
        row = output.numel() // rows_out
    else:
        return MISS
    world, rank = lane.world, lane.rank
    if output_split_sizes is None and input_split_sizes is None:
        if rows_in != rows_out or rows_in % world:
            return MISS
        sent_rows = rows_in - rows_in // world
        out_splits = in_splits = []
    else:
        out_splits, in_splits = output_split_sizes, input_split_sizes
        if (type(out_splits) is not list or type(in_splits) is not list
                or len(out_splits) != world or len(in_splits) != world
                or sum(in_splits) != rows_in or sum(out_splits) != rows_out
                or min(in_splits) < 0 or min(out_splits) < 0
                or in_splits[rank] != out_splits[rank]):
            return MISS
        sent_rows = rows_in - in_splits[rank]
    nbytes = sent_rows * row * lane.itemsize
    fields = lane.fields
    fields["calls"] += 1
    fields["raw_bytes"] += nbytes
    fields["raw_fallback_calls"] += 1
    fields["wire_bytes"] += nbytes
    lane.decisions[lane.decision] += 1
    start = _clock()
    work = lane.pg.all_to_all_single(output, input, out_splits, in_splits,
                                     lane.opts[1 if async_op else 0])
    if not async_op:
        work.wait()
        work = None
    fields["comm_s"] += _clock() - start
    return work


def all_reduce(tensor, op, group, async_op, config, stats):
    """``collectives.all_reduce`` through its lane (SUM and AVG), or MISS."""
    if (type(tensor) is not _Tensor or (op is not _SUM and op is not _AVG)
            or _has_torch_function((tensor,)) or _profiling()):
        return MISS
    lane = (DEFAULT_CONFIG if config is None else config)._raw_lanes.get(
        ("all_reduce", _world.default_pg if group is None else group, stats, tensor.dtype,
         tensor.device))
    if (lane is None or tensor.requires_grad or not tensor.is_contiguous()
            or _world.pg_coalesce_state):
        return MISS
    nbytes = tensor.numel() * lane.itemsize
    fields = lane.fields
    fields["calls"] += 1
    fields["raw_bytes"] += nbytes
    fields["raw_fallback_calls"] += 1
    fields["wire_bytes"] += nbytes
    lane.decisions[lane.decision] += 1
    start = _clock()
    at = 1 if async_op else 0
    if op is _AVG:
        if lane.opts[2] is not None:
            at += 2
        else:
            tensor.div_(lane.world)
    work = lane.pg.allreduce([tensor], lane.opts[at])
    if not async_op:
        work.wait()
        work = None
    fields["comm_s"] += _clock() - start
    return work
