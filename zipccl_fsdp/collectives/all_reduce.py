"""All-reduce: ``all_reduce`` (a reduce-scatter half, then an all-gather half of
the one schedule), its checks and its plan, and ``all_reduce_outlook``.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from .. import cost
from .. import pipeline as _pipeline
from .. import policy as _policy
from .._layout import split_flat
from .._reduce import SUM as _SUM_PARSED
from .._reduce import finish_torch_sum, sum_rows, torch_sums_alike
from ..config import DEFAULT_CONFIG, ZipCCLConfig
from ..stats import CommStats
from . import dispatch
from . import _lanes

__all__ = ['all_reduce', 'all_reduce_outlook', 'gathers_whole']

_clock = time.perf_counter

WHERE = "all_reduce"
_SUM = ReduceOp.SUM

GATHER_EXTRA_BYTES = 128 * 1024
"""A raw all-reduce is summed from one all-gather of the whole tensors when
that sends at most this many bytes per rank more than the schedule's two
halves (``gathers_whole``): on two ranks it never sends more, on more ranks
only small messages qualify. One collective instead of two halves is what a
small raw call costs least with (docs/benchmarks.md, section "Raw
all-reduce")."""

GATHER_MAX_BYTES = 1 << 20
"""The largest all-gather of whole tensors (``world`` x the tensor's bytes)
a raw all-reduce makes: every rank then sums all ``world`` tensors, where the
schedule's halves sum one chunk each, and above this the sum costs more than
the collective saved (same section of docs/benchmarks.md)."""


def gathers_whole(world: int, nbytes: int) -> bool:
    """Whether a raw all-reduce of ``nbytes`` on ``world`` ranks is one
    all-gather of the whole tensors and a local sum. The schedule sends
    ``2 (world - 1) / world`` of the tensor per rank, the whole gather
    ``world - 1`` of it: the same on two ranks."""
    return (world * nbytes <= GATHER_MAX_BYTES
            and (world - 1) * (world - 2) * nbytes <= world * GATHER_EXTRA_BYTES)


def _checked(world: int, rank: int, tensor, op):
    """The parsed ``op``, once the arguments pass every local check (the
    general path's and the lane's)."""
    parsed = dispatch.parse_op(op, WHERE)
    dispatch.check_tensor(tensor, "tensor", WHERE)
    return parsed


def all_reduce(tensor: torch.Tensor, op: ReduceOp.RedOpType | ReduceOp = ReduceOp.SUM,
               group: torch.distributed.ProcessGroup | None = None, async_op: bool = False,
               *, config: ZipCCLConfig | None = None,
               stats: CommStats | None = None) -> torch.distributed.Work | None:
    """All-reduce ``tensor`` in place: compressed reduce-scatter + all-gather.

    Like ``torch.distributed.all_reduce`` with SUM, AVG or PREMUL_SUM. Any
    numel: rank r reduces elements [start_r, start_r + count_r) with counts
    differing by at most one. Same numerics as ``reduce_scatter_single``
    whether the call goes raw or compressed: every element is summed in fp32
    in rank order 0..world-1. A raw call is torch's all-reduce where that
    gives the same bits (``_reduce.torch_sums_alike``: two gloo ranks, SUM,
    or AVG in fp32), then finished as the rank-order sum would be; elsewhere
    a small one (``gathers_whole``) is one all-gather of the whole tensors
    and that sum on every rank, a larger one the schedule on raw bytes (an
    all-to-all of the chunks, the sum, an all-gather).

    Args:
        tensor (torch.Tensor): reduced in place; the same numel, dtype and
            device on every rank.
        op (ReduceOp): SUM, AVG or PREMUL_SUM.
        group, async_op, config, stats: as every collective takes them
            (``zipccl_fsdp.collectives``).

    Returns:
        None, or with ``async_op=True`` a completed ``Work``.

    Raises:
        ValueError: ``op`` is not SUM, AVG or PREMUL_SUM, or ``tensor``
            differs between ranks; every rank raises.
        TypeError, ZipCCLConfigError, CorruptPayloadError: as every
            collective raises them (``zipccl_fsdp.collectives``).

    Example::

        >>> all_reduce(bucket, op=ReduceOp.AVG)
    """
    lane = _lanes.find("all_reduce", tensor, tensor, group, config, stats)
    if lane is not None:
        if op is _SUM and tensor.is_contiguous():
            # The commonest call, asked only what it needs: a SUM of a
            # contiguous tensor (the checks' parse of it known) on a lane
            # that calls torch's all-reduce, which opens only where torch
            # sums alike (two gloo ranks: for a SUM always, see
            # ``torch_sums_alike``).
            lane.send(tensor.nbytes, False, [tensor])
            start = _clock()
            finish_torch_sum(tensor.view(-1), _SUM_PARSED, lane.world)
            lane.fields["reduce_s"] += _clock() - start
            return dispatch.completed_work(async_op, tensor)
        parsed = _lanes.checked(_checked, lane.world, lane.rank, tensor, op)
        nbytes = tensor.numel() * tensor.element_size()
        if parsed is not _lanes.MISS and torch_sums_alike(lane.world, parsed, tensor.dtype,
                                                          tensor.device):
            lane.send(nbytes, False, [tensor])
            start = _clock()
            finish_torch_sum(tensor.view(-1), parsed, lane.world)
            lane.fields["reduce_s"] += _clock() - start
            return dispatch.completed_work(async_op, tensor)
    with torch.no_grad():
        return _all_reduce(tensor, op, group, async_op, config, stats)


def _raw_rows(call: dispatch.Setup, tensor: torch.Tensor) -> bool:
    """Whether the peers of a rank that refuses the call exchange a size row
    first when they send it raw for a reason every rank shares (``_refuse``):
    unless torch's all-reduce sums alike for a SUM, which a refusing rank
    assumes of its peers' op, a raw all-reduce is zipccl's own reduction,
    whose first exchange is a size row."""
    return not torch_sums_alike(call.world, _SUM_PARSED, tensor.dtype, tensor.device)


def _unit(tensor: torch.Tensor, world: int) -> int:
    """The bytes of one rank's chunk, the all-reduce's unit of encoding."""
    return -(-tensor.numel() // world) * tensor.element_size()


def _whole(flat: torch.Tensor, world: int) -> torch.Tensor:
    """The receive buffer of an all-gather of ``flat`` from every rank."""
    return torch.empty(world * flat.numel(), dtype=flat.dtype, device=flat.device)




def _all_reduce(tensor, op, group, async_op: bool, config: ZipCCLConfig | None,
                stats: CommStats | None):
    call = dispatch.begin(group, config, stats)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    with dispatch.refusing(call, "all_reduce", tensor, dispatch.nbytes(tensor), per_rank=True,
                           raw_rows=_raw_rows):
        parsed = _checked(world, rank, tensor, op)
        coded = dispatch.coded(call, WHERE, tensor, tensor)
    dispatch.agree(call, "all_reduce", tensor)
    numel = tensor.numel()
    itemsize = tensor.element_size()
    if not coded:
        raw = numel * itemsize if world > 1 else 0
        st.add("all_reduce", calls=1, raw_bytes=raw)
        return dispatch.to_torch(st, "all_reduce", raw, dist.all_reduce, tensor, op=op, group=group,
                                 async_op=async_op)
    base, extra = divmod(numel, world)
    unit = _unit(tensor, world)
    parts = (cost.scatter_reduce(world, unit, not torch_sums_alike(world, parsed, tensor.dtype,
                                                                   tensor.device)),
             cost.gather(world, unit))
    plan = dispatch.plan(cfg, "all_reduce", group, world, tensor, parts, world > 1, unit, st)
    st.add("all_reduce", calls=1, raw_bytes=numel * itemsize if world > 1 else 0,
           **dispatch.decided(plan, world > 1))
    sent = dispatch.verified(cfg, plan) if world > 1 else plan
    flat = tensor.view(-1)
    counts = [base + (r < extra) for r in range(world)]
    # Raw or compressed, the bits of one rank-order sum (see the docstring).
    if not sent.compress and world > 1 and torch_sums_alike(world, parsed, tensor.dtype,
                                                            tensor.device):
        if dispatch.opens_lane(cfg, "all_reduce", plan):
            dispatch.open_lane(call, "all_reduce", tensor, _lanes.ALL_REDUCE)
        dispatch.announce(call, "all_reduce", plan, tensor, counts, [counts[rank]] * world, parsed)
        dispatch.to_torch(st, "all_reduce", numel * itemsize, dist.all_reduce, tensor, group=group)
        with st.phase("all_reduce", "reduce"):
            finish_torch_sum(flat, parsed, world)
        return dispatch.completed_work(async_op, tensor)
    if not sent.compress and world > 1 and gathers_whole(world, numel * itemsize):
        # Chosen by this rank's size over the schedule, whose raw call
        # exchanges a size row first: so this route exchanges one too (and
        # opens no lane, which would skip it).
        dispatch.announce(call, "all_reduce", _policy.SIZE_RAW, tensor, counts,
                          [counts[rank]] * world, parsed)
        every = _whole(flat, world)
        dispatch.to_torch(st, "all_reduce", numel * itemsize, dispatch.torch_all_gather, every,
                          flat, group=group)
        with st.phase("all_reduce", "reduce"):
            sum_rows(flat, every.view(world, -1), parsed)
        return dispatch.completed_work(async_op, tensor)
    reduced = torch.empty(counts[rank], dtype=tensor.dtype, device=tensor.device)
    slots = split_flat(flat, counts)
    pol, site = dispatch.observer(cfg, st, sent), ("all_reduce", tuple(tensor.shape), tensor.dtype)
    first = _pipeline.scatter_reduce("all_reduce", flat, counts, reduced, parsed, group, rank,
                                     sent, cfg, st, pol, site, settle=False)
    if world == 1:
        slots[0].copy_(reduced)
        return dispatch.completed_work(async_op, tensor)
    # A corrupt piece in the first half stops the second on every rank.
    second = _pipeline.gather("all_reduce", reduced, slots, group, rank, sent, cfg, st, pol,
                              site, abort=first.error, agreed=True)
    dispatch.scheduled_done(st, "all_reduce", first, second,
                            counted=sent is not dispatch.VERIFIED_RAW)
    return dispatch.completed_work(async_op, tensor)


def all_reduce_outlook(tensor: torch.Tensor, group=None, config: ZipCCLConfig | None = None,
                       stats: CommStats | None = None) -> str:
    """What ``all_reduce(tensor, group=group, config=config, stats=stats)`` is known to do
    before it runs, for a caller that runs calls off its own thread while it
    computes (the DDP hook, ``background.py``):

    * ``"calibrates"``: it first times the link and the codec (the adaptive
      policy's first call of this dtype and device on ``group`` that
      ``compress_all_reduce`` lets compress, whatever its size).
      Run it where nothing else competes for the machine: a codec timed
      beside backward looks slower than it is, and the policy's decision for
      every later call flips from run to run (docs/benchmarks.md,
      "Calibration");
    * ``""``: anything else: compressed or raw, it waits on the host (a raw
      all-reduce too: torch's, then its NaNs made canonical, or zipccl's
      rank-order sum, so no all-reduce of a coded dtype is handed to torch
      pending)."""
    cfg = config or DEFAULT_CONFIG
    if tensor.dtype not in dispatch.CODED_DTYPES or dispatch.capturing(tensor):
        return ""
    info = dispatch.group_info(group)
    if info is None or info[1] == 1:
        return ""
    group, world, _ = info
    return _policy.outlook(cfg, stats or dispatch._STATS, group, tensor.dtype, tensor.device,
                           cfg.compresses("all_reduce"))
