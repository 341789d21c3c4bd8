"""All-reduce: ``all_reduce`` (a reduce-scatter half, then an all-gather half of
the one schedule), its checks and its plan, and ``all_reduce_outlook``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from .. import pipeline as _pipeline
from .. import policy as _policy
from .._layout import split_flat
from ..config import DEFAULT_CONFIG, ZipCCLConfig
from ..stats import CommStats
from . import _call as K

__all__ = ['all_reduce', 'all_reduce_outlook']


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, *,
               config: ZipCCLConfig | None = None, stats: CommStats | None = None):
    """All-reduce ``tensor`` in place: compressed reduce-scatter + all-gather.

    Like ``torch.distributed.all_reduce`` with SUM, AVG or PREMUL_SUM. Any
    numel: rank r reduces elements [start_r, start_r + count_r) with counts
    differing by at most one. Same numerics as ``reduce_scatter_single``
    whether the call goes raw or compressed: a raw call runs the same
    schedule on raw bytes (an all-to-all of the chunks, the fp32 sum in rank
    order, an all-gather), never torch's all-reduce, whose summation order is
    its own. With ``async_op=True`` a completed ``Work``.

    Example::

        >>> all_reduce(bucket, op=ReduceOp.AVG)
    """
    with torch.no_grad():
        return _all_reduce(tensor, op, group, async_op, config, stats)


def _all_reduce(tensor, op, group, async_op: bool, config: ZipCCLConfig | None,
                stats: CommStats | None):
    where = "all_reduce"
    call = K._begin(group, config, stats)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    try:
        parsed = K._parse_op(op, where)
        K._check_tensor(tensor, "tensor", where)
        coded = K._coded(tensor.dtype, cfg, where)
    except (TypeError, ValueError) as err:
        K._refuse(call, "all_reduce", tensor, -(-K._nbytes(tensor) // world), err)
        raise
    K._ensure_consistent(cfg, group, world, tensor, st, "all_reduce")
    numel = tensor.numel()
    itemsize = tensor.element_size()
    if not coded:
        raw = numel * itemsize if world > 1 else 0
        st.add("all_reduce", calls=1, raw_bytes=raw)
        return K._to_torch(st, "all_reduce", raw, dist.all_reduce, tensor, op=op, group=group,
                           async_op=async_op)
    base, extra = divmod(numel, world)
    counts = [base + (r < extra) for r in range(world)]
    compress = world > 1 and K._compresses(cfg, "all_reduce", counts[0] * itemsize)
    plan = K._plan(cfg, "all_reduce", group, world, tensor, counts[0] * itemsize, compress, st)
    st.add("all_reduce", calls=1, raw_bytes=numel * itemsize if world > 1 else 0,
           **K._decided(plan, world > 1))
    # Raw or compressed, one schedule and one rank-order sum (see the docstring).
    flat = tensor.view(-1)
    reduced = torch.empty(counts[rank], dtype=tensor.dtype, device=tensor.device)
    slots = split_flat(flat, counts)
    sent = K._verified(cfg, plan) if world > 1 else plan
    pol, site = K._observer(cfg, st, sent), ("all_reduce", tuple(tensor.shape), tensor.dtype)
    first = _pipeline.scatter_reduce("all_reduce", flat, counts, reduced, parsed, group, rank,
                                     sent, cfg, st, pol, site, settle=False)
    if world == 1:
        slots[0].copy_(reduced)
        return K._completed_work(async_op, tensor)
    # A corrupt piece in the first half stops the second on every rank.
    second = _pipeline.gather("all_reduce", reduced, slots, group, rank, sent, cfg, st, pol,
                              site, abort=first.error)
    K._pipelined_done(st, "all_reduce", first, second, counted=sent is not K.VERIFIED_RAW)
    return K._completed_work(async_op, tensor)


def all_reduce_outlook(tensor: torch.Tensor, group=None, config: ZipCCLConfig | None = None,
                       stats: CommStats | None = None) -> str:
    """What ``all_reduce(tensor, group=group, config=config, stats=stats)`` is known to do
    before it runs, for a caller that runs calls off its own thread while it
    computes (the DDP hook, ``background.py``):

    * ``"calibrates"``: it first times the link and the codec (the adaptive
      policy's first compressible call of this dtype and device on ``group``).
      Run it where nothing else competes for the machine: a codec timed
      beside backward looks slower than it is, and the policy's decision for
      every later call flips from run to run (docs/benchmarks.md);
    * ``""``: anything else: compressed or raw, it runs zipccl's schedule,
      which waits on the host (a raw all-reduce too: it sums in rank order,
      so no all-reduce of a coded dtype is handed to torch pending)."""
    cfg = config or DEFAULT_CONFIG
    if tensor.dtype not in K.CODED_DTYPES or K._capturing(tensor):
        return ""
    info = K._group_info(group)
    if info is None or info[1] == 1:
        return ""
    group, world, _ = info
    unit = (tensor.numel() // world) * tensor.element_size()
    return _policy.outlook(cfg, stats or K._STATS, group, tensor.dtype, tensor.device,
                           K._compresses(cfg, "all_reduce", unit))
