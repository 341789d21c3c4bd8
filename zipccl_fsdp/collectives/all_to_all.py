"""All-to-all: ``all_to_all_single``, its checks (split sizes) and its plan.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from .. import pipeline as _pipeline
from .. import policy as _policy
from .._layout import overlaps, split_flat
from ..config import ZipCCLConfig
from ..stats import CommStats
from . import dispatch
from . import _lanes

__all__ = ['all_to_all_single']

WHERE = "all_to_all_single"


def _row_counts(t: torch.Tensor, splits, world: int, name: str) -> list:
    rows = t.shape[0] if t.dim() else 1
    if splits is None:
        if rows % world:
            raise dispatch.bad(ValueError, 5, f"zipccl {WHERE}: {name} has {rows} rows, not "
                               f"divisible by world_size {world}; pass split sizes")
        return [rows // world] * world
    splits = [int(s) for s in splits]
    if len(splits) != world or any(s < 0 for s in splits) or sum(splits) != rows:
        raise dispatch.bad(ValueError, 5, f"zipccl {WHERE}: {name} split sizes {splits} must be "
                           f"{world} non-negative row counts summing to {rows}")
    return splits


def all_to_all_single(output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None,
                      group: torch.distributed.ProcessGroup | None = None,
                      async_op: bool = False, *, config: ZipCCLConfig | None = None,
                      stats: CommStats | None = None) -> torch.distributed.Work | None:
    """Scatter splits of ``input`` to every rank and gather theirs into ``output``, compressed.

    Like ``torch.distributed.all_to_all_single``, with bitwise the same
    result as torch's. Splits of at least ``config.min_bytes`` are encoded.

    Args:
        output (torch.Tensor): receives every rank's split, in rank order;
            must not overlap ``input``.
        input (torch.Tensor): this rank's splits, in rank order.
        output_split_sizes (list[int], optional): rows of dim 0 received
            from each rank; None splits ``output`` evenly.
        input_split_sizes (list[int], optional): rows of dim 0 sent to each
            rank; None splits ``input`` evenly.
        group, async_op, config, stats: the arguments every collective
            takes, described in ``zipccl_fsdp.collectives``.

    Returns:
        None, or a ``Work`` when ``async_op``: wait on it before reading
        the splits in ``output``.

    Raises:
        ValueError: split sizes that do not fit the tensors, an output that
            overlaps the input, or dtypes or devices that differ; the peers
            raise as well (``zipccl_fsdp.collectives`` says when).
        TypeError, ZipCCLConfigError, CorruptPayloadError: as every
            collective raises them (``zipccl_fsdp.collectives``).

    Example::

        >>> all_to_all_single(recv_tokens, send_tokens, recv_counts, send_counts)
    """
    lane = _lanes.find("all_to_all", output, input, group, config, stats)
    if lane is not None:
        if output_split_sizes is None and input_split_sizes is None:
            raw = _even_raw(lane, output, input)
            if raw >= 0:
                return lane.send(raw, async_op, output, input, _EVEN, _EVEN)
        elif input.dim() and output.dim() and not overlaps(input, output):
            # (the general path hands a 0-dim tensor to torch's wrapper as
            # given, and reads an overlapping input from a copy)
            split = _lanes.checked(_checked, lane.world, lane.rank, output, input,
                                   output_split_sizes, input_split_sizes)
            if split is not _lanes.MISS:
                return lane.send(split.raw, async_op, output, input, split.out_rows,
                                 split.in_rows)
    call = dispatch.begin(group, config, stats)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    with dispatch.refusing(call, "all_to_all", input, 0, plan_of=_refusal_plan):
        split = _checked(world, rank, output, input, output_split_sizes, input_split_sizes)
        coded = dispatch.coded(call, WHERE, input, output, input)
    dispatch.agree(call, "all_to_all", input)
    in_counts, out_counts, raw = split.in_counts, split.out_counts, split.raw
    itemsize = input.element_size()
    if overlaps(input, output):
        # Every path reads the input while it writes the output (torch's own
        # all-to-all included), so an overlapping input is read from a copy.
        input = input.clone()
    if (not coded or world == 1 or dispatch.capturing(input)
            or not (cfg.compress_all_to_all or cfg.verify)):
        st.add("all_to_all", calls=1, raw_bytes=raw)
        return dispatch.to_torch(st, "all_to_all", raw, dist.all_to_all_single, output, input,
                                 output_split_sizes, input_split_sizes, group=group,
                                 async_op=async_op)
    send_coded = [dispatch.compresses(cfg, "all_to_all", c * itemsize) for c in in_counts]
    recv_coded = [dispatch.compresses(cfg, "all_to_all", c * itemsize) for c in out_counts]
    if not cfg.compress_all_to_all or _policy.sure_raw(cfg, st, "all_to_all", group,
                                                       input.dtype, input.device):
        st.add("all_to_all", calls=1, raw_bytes=raw,
               raw_fallback_calls=int(cfg.compress_all_to_all))
        plan = _policy.RAW
        if not cfg.verify:
            # Raw for sure (a fast link, or "never"): the lean path, and the
            # lane of the next such calls.
            dispatch.open_lane(call, "all_to_all", input, _lanes.ALL_TO_ALL)
            with dispatch.no_grad_if_needed(output, input):
                return dispatch.to_torch(st, "all_to_all", raw, dist.all_to_all_single, output,
                                         input, output_split_sizes, input_split_sizes,
                                         group=group, async_op=async_op)
    else:
        st.add("all_to_all", calls=1, raw_bytes=raw)
        with torch.no_grad():
            # Decided before any slicing: a raw call should cost as little as possible.
            with st.phase("all_to_all", "policy"):
                plan = _policy.all_to_all_plan(cfg, st, group, world, rank, input, in_counts,
                                               send_coded)
        decided = dispatch.decided(plan, True)
        if not (any(send_coded) or any(recv_coded)):  # every split of this rank goes raw
            decided["compressed_calls"] = decided["pipelined_calls"] = 0
        st.add("all_to_all", **decided)
        if not plan.compress and not cfg.verify:
            return dispatch.to_torch(st, "all_to_all", raw, dist.all_to_all_single, output, input,
                                     output_split_sizes, input_split_sizes, group=group,
                                     async_op=async_op)
    sent = dispatch.verified(cfg, plan)
    # Under verify every split that holds bytes is framed: the raw ones with
    # the framing-only codec (the receiver frames by the same rule).
    framing = "raw" if cfg.verify else None
    send_codecs = [sent.codec if c and plan.compress else (framing if n else None)
                   for c, n in zip(send_coded, in_counts)]
    recv_framed = [(c and plan.compress) or (cfg.verify and n > 0)
                   for c, n in zip(recv_coded, out_counts)]
    with torch.no_grad():
        dispatch.scheduled_done(st, "all_to_all", _pipeline.all_to_all(
            "all_to_all", split_flat(input.view(-1), in_counts),
            split_flat(output.view(-1), out_counts), send_codecs, recv_framed, group, rank, sent,
            cfg, st, dispatch.observer(cfg, st, sent),
            ("all_to_all", tuple(input.shape[1:]), input.dtype)),
            counted=sent is not dispatch.VERIFIED_RAW)
        return dispatch.completed_work(async_op, output)


class _Split(NamedTuple):
    """How an all-to-all's rows are split: the row counts this rank sends each
    rank and receives from each, the same in elements, and the raw bytes it
    sends its peers."""

    in_rows: list
    out_rows: list
    in_counts: list
    out_counts: list
    raw: int


def _checked(world: int, rank: int, output, input, output_split_sizes,
             input_split_sizes) -> _Split:
    """The call's ``_Split``, once the arguments pass every local check (the
    general path's and the lane's)."""
    dispatch.check_pair(output, input, WHERE)
    in_rows = _row_counts(input, input_split_sizes, world, "input")
    out_rows = _row_counts(output, output_split_sizes, world, "output")
    row_in = input.numel() // max(input.shape[0], 1) if input.dim() else 1
    row_out = output.numel() // max(output.shape[0], 1) if output.dim() else 1
    if input.dim() and input.shape[0] == 0:
        row_in = row_out
    if output.dim() and output.shape[0] == 0:
        row_out = row_in
    if row_in != row_out:
        raise dispatch.bad(ValueError, 1, f"zipccl {WHERE}: input rows hold {row_in} elements but "
                           f"output rows {row_out}")
    in_counts = [s * row_in for s in in_rows]
    out_counts = [s * row_out for s in out_rows]
    if in_counts[rank] != out_counts[rank]:
        raise dispatch.bad(ValueError, 1, f"zipccl {WHERE}: this rank sends itself {in_rows[rank]} "
                           f"rows but expects {out_rows[rank]}")
    raw = (sum(in_counts) - in_counts[rank]) * input.element_size()
    return _Split(in_rows, out_rows, in_counts, out_counts, raw)


_EVEN = []
"""The split sizes that ask a process group for even splits (torch's wrapper
passes them for ``None``)."""


def _even_raw(lane: _lanes.Lane, output, input) -> int:
    """The bytes a lane's call with even splits sends its peers, or -1 where
    the lane must leave the call to the general path. Its test is narrower
    than ``_checked`` (equal shapes, contiguous, of the lane's dtype and
    device, no overlap), so whatever it takes ``_checked`` would take with
    the same bytes; it asks only what it needs, since on a small raw call
    the checks are a large share of the lane's own cost."""
    shape = input.shape
    if not (shape and output.shape == shape and output.dtype is input.dtype
            and not shape[0] % lane.world and input.is_contiguous()
            and output.is_contiguous() and output.device == input.device):
        return -1
    nbytes = input.nbytes
    a, b = input.data_ptr(), output.data_ptr()
    if a < b + nbytes and b < a + nbytes:  # they overlap
        return -1
    return nbytes - nbytes // lane.world


def _refusal_plan(call: dispatch.Setup, t: torch.Tensor) -> _policy.Plan:
    """The plan the peers of a refusing rank reach for an all-to-all: the same
    decision steps, this rank adding no bytes to the agreed split sizes."""
    cfg, st, world = call.cfg, call.st, call.world
    if _policy.sure_raw(cfg, st, "all_to_all", call.group, t.dtype, t.device):
        return _policy.RAW
    with torch.no_grad():
        return _policy.all_to_all_plan(cfg, st, call.group, world, call.rank, t, [0] * world,
                                       [False] * world)
