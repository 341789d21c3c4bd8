"""All-gather: ``all_gather_single``, its checks and its plan.

The input may be a view into the output (FSDP2 passes it so): the schedule
reads (encodes) it before it writes any output slot.
"""
from __future__ import annotations

import torch

from .. import cost
from .. import pipeline as _pipeline
from .._layout import same_memory
from ..config import ZipCCLConfig
from ..stats import CommStats
from . import dispatch
from . import _lanes

__all__ = ['all_gather_single']

WHERE = "all_gather_single"


def _checked(world: int, rank: int, output_tensor, input_tensor) -> int:
    """The bytes of this rank's shard, once the arguments pass every local
    check (the general path's and the lane's)."""
    dispatch.check_pair(output_tensor, input_tensor, WHERE)
    dispatch.check_world_times(output_tensor, "output", input_tensor, "input", world, WHERE)
    if output_tensor.device.type == "cpu" and not _stacks(output_tensor, input_tensor, world):
        raise dispatch.bad(
            ValueError, 1, f"zipccl {WHERE}: an output of shape {tuple(output_tensor.shape)} "
            f"does not hold world_size {world} inputs of shape {tuple(input_tensor.shape)} one "
            f"after another along dim 0, as torch's all-gather on gloo (CPU tensors) requires: "
            f"output.shape[0] == world_size x input.shape[0], the other dims equal")
    return input_tensor.numel() * input_tensor.element_size()


def _stacks(output_tensor, input_tensor, world: int) -> bool:
    """Whether ``output_tensor`` is ``world`` tensors shaped like
    ``input_tensor`` concatenated along dim 0: what gloo's all-gather accepts
    (it splits the output into ``world`` chunks along dim 0, each of the
    input's shape). On CUDA, NCCL's accepts any output of world_size x the
    input's elements, which ``_check_world_times`` checks; whichever way a
    call goes, raw or compressed, it is accepted where torch's is."""
    return (input_tensor.dim() >= 1 and output_tensor.dim() == input_tensor.dim()
            and output_tensor.shape[0] == world * input_tensor.shape[0]
            and output_tensor.shape[1:] == input_tensor.shape[1:])


def all_gather_single(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                      group: torch.distributed.ProcessGroup | None = None,
                      async_op: bool = False, *, config: ZipCCLConfig | None = None,
                      stats: CommStats | None = None) -> torch.distributed.Work | None:
    """All-gather ``input_tensor`` of every rank into ``output_tensor``, compressed.

    Like ``torch.distributed.all_gather_single``, with bitwise the same
    result as torch's; the policy (``config.policy``) decides per call
    whether it goes raw or compressed.

    Args:
        output_tensor (torch.Tensor): world_size x ``input_tensor.numel()``
            elements of the input's dtype and device, rank-major; on CPU
            (gloo's rule) ``world_size`` inputs concatenated along dim 0.
        input_tensor (torch.Tensor): this rank's shard; may be a view into
            ``output_tensor`` (FSDP2 passes it so).
        group, async_op, config, stats: see ``zipccl_fsdp.collectives``.

    Returns:
        None. With ``async_op=True``, a ``Work``: wait on it before reading
        ``output_tensor`` (a completed one unless the call went to torch).

    Raises:
        ValueError: ``output_tensor`` is not world_size times
            ``input_tensor`` (on CPU: stacked along dim 0), or the ranks'
            sizes differ, or the two differ in dtype or device; the
            peers raise too (``zipccl_fsdp.collectives`` says when).
        TypeError, ZipCCLConfigError, CorruptPayloadError: as every
            collective raises them (``zipccl_fsdp.collectives``).

    Example::

        >>> out = torch.empty(world * shard.numel(), dtype=shard.dtype)
        >>> all_gather_single(out, shard, config=ZipCCLConfig(codec="dense"))
    """
    lane = _lanes.find("all_gather", output_tensor, input_tensor, group, config, stats)
    if (lane is not None and output_tensor.dtype is input_tensor.dtype
            and input_tensor.dim() == 1 and output_tensor.dim() == 1
            and input_tensor.is_contiguous() and output_tensor.is_contiguous()
            and output_tensor.device == input_tensor.device):
        # What ``_checked`` asks, asked directly for flat tensors (a subset of
        # what it accepts): its frames are a share of a small call. (Any
        # other call takes the general path, which raises where it refuses.)
        unit = input_tensor.nbytes
        if output_tensor.nbytes == lane.world * unit:
            return lane.send(unit, async_op, output_tensor, input_tensor)
    call = dispatch.begin(group, config, stats)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    with dispatch.refusing(call, "all_gather", input_tensor, dispatch.nbytes(input_tensor)):
        unit = _checked(world, rank, output_tensor, input_tensor)
        coded = dispatch.coded(call, WHERE, input_tensor, output_tensor, input_tensor)
    dispatch.agree(call, "all_gather", input_tensor)
    plan = dispatch.plan(cfg, "all_gather", group, world, input_tensor,
                         (cost.gather(world, unit),), coded and world > 1, unit, st)
    if not plan.compress and world > 1 and not (coded and cfg.verify):
        # the lean path of every raw call
        st.add("all_gather", calls=1, raw_bytes=unit, raw_fallback_calls=int(coded))
        if coded and dispatch.opens_lane(cfg, "all_gather", plan):
            dispatch.open_lane(call, "all_gather", input_tensor, _lanes.GATHER)
        n = input_tensor.numel()
        dispatch.announce(call, "all_gather", plan, input_tensor, [n] * world, [n] * world)
        with dispatch.no_grad_if_needed(output_tensor, input_tensor):
            return dispatch.to_torch(st, "all_gather", unit, dispatch.torch_all_gather,
                                     output_tensor, input_tensor, group=group, async_op=async_op)
    st.add("all_gather", calls=1, raw_bytes=unit if world > 1 else 0,
           **dispatch.decided(plan, coded and world > 1))
    with torch.no_grad():
        if world == 1:
            if not same_memory(output_tensor, input_tensor):
                output_tensor.copy_(input_tensor.reshape(output_tensor.shape))
            return dispatch.completed_work(async_op, output_tensor)
        return _all_gather_coded(output_tensor, input_tensor, dispatch.verified(cfg, plan), cfg,
                                 st, group, world, rank, async_op)


def _all_gather_coded(output_tensor, input_tensor, plan, cfg: ZipCCLConfig, st: CommStats,
                      group, world: int, rank: int, async_op: bool):
    """The rest of ``all_gather_single`` for a compressed call."""
    n = input_tensor.numel()
    flat_out = output_tensor.view(-1)
    slots = [flat_out[r * n:(r + 1) * n] for r in range(world)]
    dispatch.scheduled_done(st, "all_gather", _pipeline.gather(
        "all_gather", input_tensor.view(-1), slots, group, rank, plan, cfg, st,
        dispatch.observer(cfg, st, plan),
        ("all_gather", tuple(input_tensor.shape), input_tensor.dtype)),
        counted=plan is not dispatch.VERIFIED_RAW)
    return dispatch.completed_work(async_op, output_tensor)
