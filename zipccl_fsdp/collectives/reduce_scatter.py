"""Reduce-scatter: ``reduce_scatter_single``, its checks and its plan.
"""
from __future__ import annotations

import torch
from torch.distributed import ReduceOp

from .. import cost
from .. import pipeline as _pipeline
from ..config import ZipCCLConfig
from ..stats import CommStats
from . import dispatch

__all__ = ['reduce_scatter_single']

WHERE = "reduce_scatter_single"


def _checked(world: int, rank: int, output, input, op):
    """The parsed ``op``, once the arguments pass every local check."""
    parsed = dispatch.parse_op(op, WHERE)
    dispatch.check_pair(output, input, WHERE)
    dispatch.check_world_times(input, "input", output, "output", world, WHERE)
    return parsed


@torch.no_grad()
def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor,
                          op: ReduceOp.RedOpType | ReduceOp = ReduceOp.SUM,
                          group: torch.distributed.ProcessGroup | None = None,
                          async_op: bool = False, *, config: ZipCCLConfig | None = None,
                          stats: CommStats | None = None) -> torch.distributed.Work | None:
    """Reduce ``input`` over ranks and scatter it: rank r gets chunk r, compressed.

    Like ``torch.distributed.reduce_scatter_single``. The sum runs in fp32 in
    rank order, then AVG divides by world size and the result is cast to
    ``output.dtype``: deterministic, the same on every backend and whether
    the call goes raw or compressed.

    Args:
        output (torch.Tensor): this rank's chunk, ``input.numel() // world``
            elements of the input's dtype and device.
        input (torch.Tensor): world_size chunks, rank-major.
        op (ReduceOp): SUM, AVG or PREMUL_SUM
            (``torch.distributed._make_nccl_premul_sum(f)``; also on gloo,
            which lacks it).
        group, async_op, config, stats: as every collective takes them
            (``zipccl_fsdp.collectives``).

    Returns:
        None, or (``async_op=True``) a ``Work``; once it is waited on,
        ``output`` holds this rank's reduced chunk.

    Raises:
        ValueError: ``input`` is not world_size times ``output``, they
            differ in dtype or device, or ``op`` is not SUM, AVG or
            PREMUL_SUM; the peers raise too (see ``zipccl_fsdp.collectives``).
        TypeError, ZipCCLConfigError, CorruptPayloadError: as every
            collective raises them (``zipccl_fsdp.collectives``).

    Example::

        >>> out = torch.empty(grads.numel() // world, dtype=grads.dtype)
        >>> reduce_scatter_single(out, grads, op=ReduceOp.AVG)
    """
    call = dispatch.begin(group, config, stats)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    with dispatch.refusing(call, "reduce_scatter", input, dispatch.nbytes(output), raw_rows=True):
        parsed = _checked(world, rank, output, input, op)
        coded = dispatch.coded(call, WHERE, input, output, input)
    dispatch.agree(call, "reduce_scatter", input)
    n = output.numel()
    unit = n * input.element_size()
    if not coded:
        st.add("reduce_scatter", calls=1, raw_bytes=(world - 1) * unit)
        return dispatch.to_torch(st, "reduce_scatter", (world - 1) * unit,
                                 dispatch.torch_reduce_scatter, output, input, op=op, group=group,
                                 async_op=async_op)
    plan = dispatch.plan(cfg, "reduce_scatter", group, world, input,
                         (cost.scatter_reduce(world, unit),), world > 1, unit, st)
    st.add("reduce_scatter", calls=1, raw_bytes=(world - 1) * unit,
           **dispatch.decided(plan, world > 1))
    # Raw or compressed, the same schedule and the same rank-order sum: the
    # result never depends on the decision (a raw call is an all-to-all of the
    # chunks, then the sum; docs/benchmarks.md, "Link benchmark", measures it
    # against torch's).
    sent = dispatch.verified(cfg, plan) if world > 1 else plan
    dispatch.scheduled_done(st, "reduce_scatter", _pipeline.scatter_reduce(
        "reduce_scatter", input.view(-1), [n] * world, output.view(-1), parsed, group, rank,
        sent, cfg, st, dispatch.observer(cfg, st, sent),
        ("reduce_scatter", tuple(input.shape), input.dtype)),
        counted=sent is not dispatch.VERIFIED_RAW)
    return dispatch.completed_work(async_op, output)
