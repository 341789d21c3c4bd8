"""Lossless compressed collectives over ``torch.distributed`` (gloo and NCCL).

Names and positional arguments mirror torch's: ``all_gather_single``,
``reduce_scatter_single``, ``all_reduce`` and ``all_to_all_single``, each with
keyword-only ``config`` (a ``ZipCCLConfig``) and ``stats`` (a ``CommStats``;
the module's own by default, read with ``stats()``). They know nothing of
FSDP or DDP; ``hooks`` builds those integrations on top of them.

Each function checks its arguments, asks the policy for a plan
(``policy.py``), and then either hands the call to torch (a raw call) or runs
the one schedule of ``pipeline.py`` with it, of which a one-piece compressed
call and zipccl's own raw reduction are cases. How each one moves bytes:

* all-gather: encode the own shard, all-gather the payload sizes (a row of
  int64 per rank), all-gather the payloads padded to the largest, decode each
  slot into the output. Padding keeps torch's (NCCL's ring/tree) all-gather;
  it costs max - own bytes, counted in ``pad_bytes``. The input may be a view
  into the output (FSDP2 passes it so): it is read (encoded) before any output
  slot is written.
* reduce-scatter: a sum of compressed bytes is meaningless, so each rank
  encodes the chunk meant for each peer, payloads go through
  ``all_to_all_single`` with exact split sizes (no padding), and each rank
  decodes and sums its chunk locally in fp32, in rank order 0..world-1, then
  scales (AVG, PREMUL_SUM) and casts. The raw path (below ``min_bytes``,
  with compression off, or sent raw by any policy) is an uncompressed
  all-to-all followed by the same sum, so the result is bitwise the same on
  either path and with every codec backend; a NaN result is the canonical
  quiet NaN (``_reduce.py``).
* all-reduce: the reduce-scatter above and the all-gather above, on chunks of
  ceil/floor(numel / world) elements (any numel), raw or compressed: never
  torch's own all-reduce, whose summation order is its own.
* all-to-all: each split is encoded if it holds at least ``min_bytes`` (the
  receiver applies the same rule to its output split, so nothing marks it),
  payloads go through an all-to-all with exact splits. An output that
  overlaps the input is refused on every path alike.

A rank's own chunk of a reduce-scatter or all-to-all is never encoded nor sent.

Every check that can fail locally (dtype, op, shapes) runs before the first
communication. A rank whose arguments fail them tells its peers in the
exchange they make first (``_refuse``): the agreement check, or the first size
row of a call that goes through the schedule; they raise ``ValueError``
naming it. A call the peers hand to torch raw has no such exchange, and there
torch's rule holds: the peers wait until the process group's timeout. What
only the ranks together can see (a call that differs between ranks, a size no
slot can hold) is checked on the size rows, which every rank sees. Under
``verify`` a call that would go raw is framed and checked (``VERIFIED_RAW``).
``async_op=True`` returns a ``Work``: torch's own, possibly pending, for a
call sent raw; a completed one for a compressed call, which runs
synchronously underneath (the size exchange needs the host anyway).

Integrity lives in ``integrity.py``: the agreement check at a group's first
call (per-field, naming the ranks), ``ZipCCLConfig(verify=True)`` payload
checksums, and the fallback to the raw collective on every rank when an encode
fails (a payload size of -1 in the size exchange). Measured costs of the size
exchange, the padding and a call's memory are in docs/benchmarks.md.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from . import _raw_lanes
from . import integrity as _integrity
from . import pipeline as _pipeline
from . import policy as _policy
from ._layout import overlaps, same_memory, split_flat
from ._wire import all_gather_single as _all_gather_single
from ._wire import reduce_scatter_single as _reduce_scatter_single
from .config import DEFAULT_CONFIG, ZipCCLConfig
from .stats import MODULE_STATS, CommStats

__all__ = ["all_gather_single", "reduce_scatter_single", "all_reduce", "all_to_all_single",
           "stats", "reset_stats", "CODED_DTYPES"]

CODED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

_STATS = MODULE_STATS


def stats() -> dict[str, dict[str, float]]:
    """Counters of the free functions' calls (hooks keep their own):
    ``{kind: {"calls", "compressed_calls", "raw_bytes", "wire_bytes", "encode_s",
    "size_bytes", "pad_bytes", "decode_s", "comm_s", "size_exchange_s", "reduce_s"}}``.
    See ``stats.py``."""
    return _STATS.snapshot()


def reset_stats() -> None:
    """Zero the free functions' counters."""
    _STATS.reset()


# --------------------------------------------------------------------------
# Argument checks (all local, all before any communication)
# --------------------------------------------------------------------------
def _bad(cls, why: int, text: str) -> Exception:
    """A local argument error; ``why`` indexes ``integrity.REFUSALS``: what this
    rank tells its peers (``_refuse``) before it raises."""
    err = cls(text)
    err.zipccl_refusal = why
    return err


class _Op:
    """A parsed reduce op: ``kind`` in sum/avg/premul_sum and the premul factor."""

    __slots__ = ("kind", "factor")

    def __init__(self, kind: str, factor=None) -> None:
        self.kind = kind
        self.factor = factor


def _parse_op(op, where: str) -> _Op:
    if isinstance(op, ReduceOp.RedOpType):
        red, wrapped = op, None
    elif isinstance(op, ReduceOp):
        red, wrapped = op.op, op
    else:
        raise _bad(TypeError, 4, f"zipccl {where}: op must be a torch.distributed.ReduceOp, "
                   f"got {type(op).__name__}")
    if red == ReduceOp.SUM:
        return _Op("sum")
    if red == ReduceOp.AVG:
        return _Op("avg")
    if red == ReduceOp.PREMUL_SUM:
        if wrapped is None:
            raise _bad(ValueError, 4, f"zipccl {where}: PREMUL_SUM needs its factor; pass "
                       f"torch.distributed._make_nccl_premul_sum(factor)")
        # ``.factor`` since torch 2.13; before, only the pickle state carries it.
        factor = wrapped.factor if hasattr(wrapped, "factor") else wrapped.__getstate__()[1]
        return _Op("premul_sum", factor)
    raise _bad(ValueError, 4, f"zipccl {where}: op {red} is not supported; zipccl reduces "
               f"with SUM, AVG and PREMUL_SUM")


def _check_tensor(t, name: str, where: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise _bad(TypeError, 3, f"zipccl {where}: {name} must be a torch.Tensor, "
                   f"got {type(t).__name__}")
    if not t.is_contiguous():
        raise _bad(ValueError, 3, f"zipccl {where}: {name} must be contiguous")


def _check_pair(out: torch.Tensor, inp: torch.Tensor, where: str) -> None:
    _check_tensor(out, "output", where)
    _check_tensor(inp, "input", where)
    if out.dtype != inp.dtype:
        raise _bad(TypeError, 2, f"zipccl {where}: output is {out.dtype} but input is "
                   f"{inp.dtype}")
    if out.device != inp.device:
        raise _bad(ValueError, 2, f"zipccl {where}: output is on {out.device} but input on "
                   f"{inp.device}")


def _coded(dtype: torch.dtype, cfg: ZipCCLConfig, where: str) -> bool:
    """Whether the codec handles ``dtype``; raises if it doesn't and the config says so."""
    if dtype in CODED_DTYPES:
        return True
    if cfg.unsupported_dtype == "raise":
        names = ", ".join(str(d) for d in CODED_DTYPES)
        raise _bad(TypeError, 6, f"zipccl {where}: dtype {dtype} is not supported (zipccl "
                   f"codes {names}); use ZipCCLConfig(unsupported_dtype='raw') to hand "
                   f"such calls to torch.distributed unchanged")
    return False


_LAST_GROUP: tuple = (None, None)
"""(group, (group, world_size, rank)) of the last call: asking torch costs a
noticeable share of a raw call's Python. Replaced whole, so a thread reads
a consistent pair; holds one reference, so a new group, or a new default group
after re-initialisation, is a different object."""


def _group_info(group):
    """(group, world_size, rank), or None when this rank is not in ``group``."""
    if group is None:
        group = dist.group.WORLD
        if group is None:
            raise RuntimeError("zipccl: the default process group is not initialized; "
                               "call torch.distributed.init_process_group first")
    global _LAST_GROUP
    last = _LAST_GROUP
    if last[0] is group:
        return last[1]
    if dist._rank_not_in_group(group):
        return None
    info = group, dist.get_world_size(group), dist.get_rank(group)
    _LAST_GROUP = (group, info)
    return info


def _compresses(cfg: ZipCCLConfig, kind: str, unit_nbytes: int) -> bool:
    return cfg.compresses(kind) and unit_nbytes > 0 and unit_nbytes >= cfg.min_bytes


def _plan(cfg: ZipCCLConfig, kind: str, group, world: int, t: torch.Tensor, unit: int,
          compress: bool, st: CommStats) -> _policy.Plan:
    """The policy's plan for a call that ``min_bytes`` and the ``compress_*``
    switches let compress (``policy.plan``); raw otherwise, and while a CUDA
    graph is captured. Every rank gets the same plan."""
    return _policy.plan(cfg, st, kind, group, world, t, unit, compress and not _capturing(t))


def _decided(plan: _policy.Plan, codable: bool) -> dict:
    """The stats of a plan: compressed, pipelined, or raw although codable."""
    return dict(compressed_calls=int(plan.compress),
                pipelined_calls=int(plan.compress and plan.pieces > 1),
                raw_fallback_calls=int(codable and not plan.compress))


VERIFIED_RAW = _policy.Plan(True, "raw", 1, reason="verify")
"""The plan of a call that would go raw under ``verify=True``: the same
schedule with the framing-only codec "raw" (a header and a checksum per 4096
elements around the raw bytes), so that what it moves is checked too."""


def _verified(cfg: ZipCCLConfig, plan: _policy.Plan) -> _policy.Plan:
    """``plan``, or ``VERIFIED_RAW`` for a raw plan under ``verify``."""
    return VERIFIED_RAW if cfg.verify and not plan.compress else plan


def _observer(cfg: ZipCCLConfig, st: CommStats, plan: _policy.Plan):
    """The policy that learns a call's ratio: none for a verified raw call."""
    return None if plan is VERIFIED_RAW else _policy.of(cfg, st)


def _raw_for_good(cfg: ZipCCLConfig, plan: _policy.Plan) -> bool:
    """``policy.raw_for_good``, and not under ``verify`` (those calls are
    framed and checked, ``VERIFIED_RAW``: no lane)."""
    return _policy.raw_for_good(cfg, plan) and not cfg.verify


def _open_lane(call: _Setup, kind: str, t: torch.Tensor) -> None:
    """Open the raw lane of this call's (kind, group, dtype, device)
    (``_raw_lanes.py``), in the runtime of the call's stats; only for a call
    sent raw for good (``_raw_for_good``)."""
    cfg, st = call.cfg, call.st
    _raw_lanes.open_lane(st.runtime.state(cfg), kind, call.group, call.world, call.rank,
                         st.fields(kind), t.dtype, t.device, _policy.lane_decisions(cfg, st))


def _pipelined_done(st: CommStats, kind: str, *outcomes: _pipeline.Outcome,
                    counted: bool = True) -> None:
    """Count a scheduled call's encode fallback (``counted``: the call was
    counted as compressed); raise its decode error."""
    if any(o.fell_back for o in outcomes):
        _integrity.count_fallback(st, kind, counted and not any(o.coded for o in outcomes))
    for o in outcomes:
        if o.error is not None:
            raise o.error


def _completed_work(async_op: bool, result: torch.Tensor):
    """Mirror torch's return value: None, or a Work when ``async_op``. On CUDA
    the future names the result's device: ``set_result`` then records an
    event on the current stream and ``wait()`` makes the waiting stream wait
    for it, as NCCL's Work does; a device-less future would let another
    stream read the result before the call's kernels have written it."""
    if not async_op:
        return None
    fut = torch.futures.Future(devices=[result.device] if result.is_cuda else None)
    fut.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(fut)


def _ensure_consistent(cfg: ZipCCLConfig, group, world: int, t: torch.Tensor,
                       st: CommStats, kind: str) -> None:
    """Once per (config, group): all ranks must agree on the protocol fields
    (``integrity.check_agreement``: raises ZipCCLConfigError naming field and
    ranks). Not while a CUDA graph is captured (it reads the answers on the
    host); a captured step has run uncaptured first, which checked it."""
    if not _capturing(t):
        _integrity.check_agreement(cfg, group, world, t.device, st, kind)


def _capturing(t) -> bool:
    """Whether ``t`` is a CUDA tensor whose stream is being captured into a
    CUDA graph. A compressed call reads sizes on the host and the policy
    times calls, both of which capture forbids, so a captured call goes raw
    (every rank captures the same step: they agree)."""
    return isinstance(t, torch.Tensor) and t.is_cuda and torch.cuda.is_current_stream_capturing()


class _Setup(NamedTuple):
    """What a public collective runs with."""

    cfg: ZipCCLConfig
    st: CommStats
    group: object
    world: int
    rank: int


def _begin(group, config: ZipCCLConfig | None, stats: CommStats | None) -> _Setup | None:
    """A public call's config and stats (the module's own when None) and its
    group, world size and rank. None when this rank is not in ``group``: the
    call then does nothing and returns None, as torch's does."""
    info = _group_info(group)
    if info is None:
        return None
    return _Setup(config or DEFAULT_CONFIG, stats or _STATS, *info)


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _refuse(call: _Setup, kind: str, t, unit: int, err: Exception) -> None:
    """Before a local argument error ``err`` is raised on this rank: tell the
    peers, whose call may be valid, so that they raise too instead of waiting
    for this rank (``integrity.refuse``). The refusal takes the place of the
    exchange the peers make first: the agreement check when it is due, else
    the first size row of a call that goes through the schedule (compressed,
    or verified raw), which this rank predicts from its own ``t`` and
    ``unit``. A call the peers hand to torch raw has no exchange of zipccl's
    to take: there torch's rule holds, as for torch's own collectives (the
    peers wait until the process group's timeout; README, "Errors")."""
    why = getattr(err, "zipccl_refusal", None)
    if why is None or call.world == 1 or not isinstance(t, torch.Tensor) or _capturing(t):
        return
    cfg, group, world = call.cfg, call.group, call.world
    if _integrity.agreement_pending(cfg, call.st, group):
        _integrity.refuse(group, world, t.device, why)
        return
    if t.dtype not in CODED_DTYPES:
        return
    if kind == "all_to_all":
        if not cfg.compress_all_to_all and not cfg.verify:
            return
        plan = _refusal_all_to_all_plan(call, t) if cfg.compress_all_to_all else _policy.RAW
    else:
        plan = _plan(cfg, kind, group, world, t, unit, _compresses(cfg, kind, unit), call.st)
    if _verified(cfg, plan).compress:
        _integrity.refuse(group, world, t.device, why)


def _check_world_times(big: torch.Tensor, big_name: str, small: torch.Tensor, small_name: str,
                       world: int, where: str) -> None:
    """``big`` must hold world_size times the elements of ``small``."""
    if big.numel() != world * small.numel():
        raise _bad(ValueError, 1, f"zipccl {where}: {big_name} has {big.numel()} elements, "
                   f"expected world_size {world} x {small_name} {small.numel()}")


def _no_grad_if_needed(*tensors: torch.Tensor):
    """``torch.no_grad()`` when autograd could see the call, else a no-op: the
    lean raw paths skip the cost of entering it when nothing requires grad."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return torch.no_grad()
    return contextlib.nullcontext()


def _to_torch(st: CommStats, kind: str, wire_bytes: int, collective, *args, **kwargs):
    """Hand the call to torch: run ``collective`` (a ``torch.distributed``
    function) as the call's exchange phase, counting
    ``wire_bytes`` sent; return its result."""
    st.add(kind, wire_bytes=wire_bytes)
    with st.phase(kind, "exchange"):
        return collective(*args, **kwargs)


# --------------------------------------------------------------------------
# Public collectives
# --------------------------------------------------------------------------
def all_gather_single(output_tensor, input_tensor, group=None, async_op=False, *,
                      config: ZipCCLConfig | None = None, stats: CommStats | None = None):
    """All-gather ``input_tensor`` of every rank into ``output_tensor``, compressed.

    Like ``torch.distributed.all_gather_single``: ``output_tensor`` holds
    world_size x ``input_tensor.numel()`` elements, rank-major; the input may be
    a view into the output. Bitwise the same result as torch's. With
    ``async_op=True`` a ``Work`` (complete unless the call went raw; see the
    module docstring).

    Example::

        >>> out = torch.empty(world * shard.numel(), dtype=shard.dtype)
        >>> all_gather_single(out, shard, config=ZipCCLConfig(codec="dense"))
    """
    done = _raw_lanes.all_gather(output_tensor, input_tensor, group, async_op, config, stats)
    if done is not _raw_lanes.MISS:
        return done
    where = "all_gather_single"
    call = _begin(group, config, stats)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    try:
        _check_pair(output_tensor, input_tensor, where)
        _check_world_times(output_tensor, "output", input_tensor, "input", world, where)
        coded = _coded(input_tensor.dtype, cfg, where)
    except (TypeError, ValueError) as err:
        _refuse(call, "all_gather", input_tensor, _nbytes(input_tensor), err)
        raise
    _ensure_consistent(cfg, group, world, input_tensor, st, "all_gather")
    unit = input_tensor.numel() * input_tensor.element_size()
    compress = coded and world > 1 and _compresses(cfg, "all_gather", unit)
    plan = _plan(cfg, "all_gather", group, world, input_tensor, unit, compress, st)
    if not plan.compress and world > 1 and not (coded and cfg.verify):
        # the lean path of every raw call
        st.add("all_gather", calls=1, raw_bytes=unit, raw_fallback_calls=int(coded))
        if coded and _policy.raw_for_good(cfg, plan):
            _open_lane(call, "all_gather", input_tensor)
        with _no_grad_if_needed(output_tensor, input_tensor):
            return _to_torch(st, "all_gather", unit, _all_gather_single, output_tensor,
                             input_tensor, group=group, async_op=async_op)
    st.add("all_gather", calls=1, raw_bytes=unit if world > 1 else 0,
           **_decided(plan, coded and world > 1))
    with torch.no_grad():
        if world == 1:
            if not same_memory(output_tensor, input_tensor):
                output_tensor.copy_(input_tensor.reshape(output_tensor.shape))
            return _completed_work(async_op, output_tensor)
        return _all_gather_coded(output_tensor, input_tensor, _verified(cfg, plan), cfg, st,
                                 group, world, rank, async_op)


def _all_gather_coded(output_tensor, input_tensor, plan, cfg: ZipCCLConfig, st: CommStats,
                      group, world: int, rank: int, async_op: bool):
    """The rest of ``all_gather_single`` for a compressed call."""
    n = input_tensor.numel()
    flat_out = output_tensor.view(-1)
    slots = [flat_out[r * n:(r + 1) * n] for r in range(world)]
    _pipelined_done(st, "all_gather", _pipeline.gather(
        "all_gather", input_tensor.view(-1), slots, group, rank, plan, cfg, st,
        _observer(cfg, st, plan), ("all_gather", tuple(input_tensor.shape), input_tensor.dtype)),
        counted=plan is not VERIFIED_RAW)
    return _completed_work(async_op, output_tensor)


@torch.no_grad()
def reduce_scatter_single(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          config: ZipCCLConfig | None = None, stats: CommStats | None = None):
    """Reduce ``input`` over ranks and scatter it: rank r gets chunk r, compressed.

    Like ``torch.distributed.reduce_scatter_single`` with ``op`` SUM, AVG or
    PREMUL_SUM (``torch.distributed._make_nccl_premul_sum(f)``; also on gloo,
    which lacks it). The sum runs in fp32 in rank order, then AVG divides by
    world size and the result is cast to ``output.dtype``: deterministic, the
    same on every backend and whether the call goes raw or compressed. With
    ``async_op=True`` the returned ``Work`` is already
    complete (synchronous underneath for now) unless the call went to torch.

    Example::

        >>> out = torch.empty(grads.numel() // world, dtype=grads.dtype)
        >>> reduce_scatter_single(out, grads, op=ReduceOp.AVG)
    """
    where = "reduce_scatter_single"
    call = _begin(group, config, stats)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    try:
        parsed = _parse_op(op, where)
        _check_pair(output, input, where)
        _check_world_times(input, "input", output, "output", world, where)
        coded = _coded(input.dtype, cfg, where)
    except (TypeError, ValueError) as err:
        _refuse(call, "reduce_scatter", input, _nbytes(output), err)
        raise
    _ensure_consistent(cfg, group, world, input, st, "reduce_scatter")
    n = output.numel()
    unit = n * input.element_size()
    if not coded:
        st.add("reduce_scatter", calls=1, raw_bytes=(world - 1) * unit)
        return _to_torch(st, "reduce_scatter", (world - 1) * unit, _reduce_scatter_single,
                         output, input, op=op, group=group, async_op=async_op)
    compress = world > 1 and _compresses(cfg, "reduce_scatter", unit)
    plan = _plan(cfg, "reduce_scatter", group, world, input, unit, compress, st)
    st.add("reduce_scatter", calls=1, raw_bytes=(world - 1) * unit,
           **_decided(plan, world > 1))
    # Raw or compressed, the same schedule and the same rank-order sum: the
    # result never depends on the decision (a raw call is an all-to-all of the
    # chunks, then the sum; docs/benchmarks.md measures it against torch's).
    sent = _verified(cfg, plan) if world > 1 else plan
    _pipelined_done(st, "reduce_scatter", _pipeline.scatter_reduce(
        "reduce_scatter", input.view(-1), [n] * world, output.view(-1), parsed, group, rank,
        sent, cfg, st, _observer(cfg, st, sent), ("reduce_scatter", tuple(input.shape),
                                              input.dtype)), counted=sent is not VERIFIED_RAW)
    return _completed_work(async_op, output)


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
    call = _begin(group, config, stats)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    try:
        parsed = _parse_op(op, where)
        _check_tensor(tensor, "tensor", where)
        coded = _coded(tensor.dtype, cfg, where)
    except (TypeError, ValueError) as err:
        _refuse(call, "all_reduce", tensor, -(-_nbytes(tensor) // world), err)
        raise
    _ensure_consistent(cfg, group, world, tensor, st, "all_reduce")
    numel = tensor.numel()
    itemsize = tensor.element_size()
    if not coded:
        raw = numel * itemsize if world > 1 else 0
        st.add("all_reduce", calls=1, raw_bytes=raw)
        return _to_torch(st, "all_reduce", raw, dist.all_reduce, tensor, op=op, group=group,
                         async_op=async_op)
    base, extra = divmod(numel, world)
    counts = [base + (r < extra) for r in range(world)]
    compress = world > 1 and _compresses(cfg, "all_reduce", counts[0] * itemsize)
    plan = _plan(cfg, "all_reduce", group, world, tensor, counts[0] * itemsize, compress, st)
    st.add("all_reduce", calls=1, raw_bytes=numel * itemsize if world > 1 else 0,
           **_decided(plan, world > 1))
    # Raw or compressed, one schedule and one rank-order sum (see the docstring).
    flat = tensor.view(-1)
    reduced = torch.empty(counts[rank], dtype=tensor.dtype, device=tensor.device)
    slots = split_flat(flat, counts)
    sent = _verified(cfg, plan) if world > 1 else plan
    pol, site = _observer(cfg, st, sent), ("all_reduce", tuple(tensor.shape), tensor.dtype)
    first = _pipeline.scatter_reduce("all_reduce", flat, counts, reduced, parsed, group, rank,
                                     sent, cfg, st, pol, site, settle=False)
    if world == 1:
        slots[0].copy_(reduced)
        return _completed_work(async_op, tensor)
    # A corrupt piece in the first half stops the second on every rank.
    second = _pipeline.gather("all_reduce", reduced, slots, group, rank, sent, cfg, st, pol,
                              site, abort=first.error)
    _pipelined_done(st, "all_reduce", first, second, counted=sent is not VERIFIED_RAW)
    return _completed_work(async_op, tensor)


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
      which waits on the host (a raw all-reduce too: it sums in rank order).

    (``"raw"``, a call handed to torch pending, is no longer returned: no
    all-reduce of a coded dtype goes to torch's own.)"""
    cfg = config or DEFAULT_CONFIG
    if tensor.dtype not in CODED_DTYPES or _capturing(tensor):
        return ""
    info = _group_info(group)
    if info is None or info[1] == 1:
        return ""
    group, world, _ = info
    unit = (tensor.numel() // world) * tensor.element_size()
    return _policy.outlook(cfg, stats or _STATS, group, tensor.dtype, tensor.device,
                           _compresses(cfg, "all_reduce", unit))


def _row_counts(t: torch.Tensor, splits, world: int, name: str, where: str) -> list:
    rows = t.shape[0] if t.dim() else 1
    if splits is None:
        if rows % world:
            raise _bad(ValueError, 5, f"zipccl {where}: {name} has {rows} rows, not divisible "
                       f"by world_size {world}; pass split sizes")
        return [rows // world] * world
    splits = [int(s) for s in splits]
    if len(splits) != world or any(s < 0 for s in splits) or sum(splits) != rows:
        raise _bad(ValueError, 5, f"zipccl {where}: {name} split sizes {splits} must be "
                   f"{world} non-negative row counts summing to {rows}")
    return splits


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False, *, config: ZipCCLConfig | None = None,
                      stats: CommStats | None = None):
    """Scatter splits of ``input`` to every rank and gather theirs into ``output``, compressed.

    Like ``torch.distributed.all_to_all_single``: splits are row counts of dim
    0 (equal splits when ``None``). Splits of at least ``config.min_bytes`` are
    encoded. Bitwise the same result as torch's. With ``async_op=True`` a
    ``Work`` (complete unless the call went raw; see the module docstring).

    Example::

        >>> all_to_all_single(recv_tokens, send_tokens, recv_counts, send_counts)
    """
    done = _raw_lanes.all_to_all(output, input, output_split_sizes, input_split_sizes, group,
                                 async_op, config, stats)
    if done is not _raw_lanes.MISS:
        return done
    where = "all_to_all_single"
    call = _begin(group, config, stats)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    try:
        _check_pair(output, input, where)
        coded = _coded(input.dtype, cfg, where)
        in_counts, out_counts = _split_counts(output, input, output_split_sizes,
                                              input_split_sizes, world, rank, where)
    except (TypeError, ValueError) as err:
        _refuse(call, "all_to_all", input, 0, err)
        raise
    itemsize = input.element_size()
    raw = (sum(in_counts) - in_counts[rank]) * itemsize
    _ensure_consistent(cfg, group, world, input, st, "all_to_all")
    if overlaps(input, output):
        # Every path reads the input while it writes the output (torch's own
        # all-to-all included), so an overlapping input is read from a copy.
        input = input.clone()
    if (not coded or world == 1 or _capturing(input)
            or not (cfg.compress_all_to_all or cfg.verify)):
        st.add("all_to_all", calls=1, raw_bytes=raw)
        return _to_torch(st, "all_to_all", raw, dist.all_to_all_single, output, input,
                         output_split_sizes, input_split_sizes, group=group, async_op=async_op)
    send_coded = [_compresses(cfg, "all_to_all", c * itemsize) for c in in_counts]
    recv_coded = [_compresses(cfg, "all_to_all", c * itemsize) for c in out_counts]
    if not cfg.compress_all_to_all or _policy.sure_raw(cfg, st, "all_to_all", group,
                                                       input.dtype, input.device):
        st.add("all_to_all", calls=1, raw_bytes=raw,
               raw_fallback_calls=int(cfg.compress_all_to_all))
        plan = _policy.RAW
        if not cfg.verify:
            # Raw for sure (a fast link, or "never"): the lean path, and the
            # lane of the next such calls.
            _open_lane(call, "all_to_all", input)
            with _no_grad_if_needed(output, input):
                return _to_torch(st, "all_to_all", raw, dist.all_to_all_single, output, input,
                                 output_split_sizes, input_split_sizes, group=group,
                                 async_op=async_op)
    else:
        st.add("all_to_all", calls=1, raw_bytes=raw)
        with torch.no_grad():
            # Decided before any slicing: a raw call should cost as little as possible.
            with st.phase("all_to_all", "policy"):
                plan = _policy.all_to_all_plan(cfg, st, group, world, rank, input, in_counts,
                                               send_coded)
        decided = _decided(plan, True)
        if not (any(send_coded) or any(recv_coded)):  # every split of this rank goes raw
            decided["compressed_calls"] = decided["pipelined_calls"] = 0
        st.add("all_to_all", **decided)
        if not plan.compress and not cfg.verify:
            return _to_torch(st, "all_to_all", raw, dist.all_to_all_single, output, input,
                             output_split_sizes, input_split_sizes, group=group,
                             async_op=async_op)
    sent = _verified(cfg, plan)
    # Under verify every split that holds bytes is framed: the raw ones with
    # the framing-only codec (the receiver frames by the same rule).
    framing = "raw" if cfg.verify else None
    send_codecs = [sent.codec if c and plan.compress else (framing if n else None)
                   for c, n in zip(send_coded, in_counts)]
    recv_framed = [(c and plan.compress) or (cfg.verify and n > 0)
                   for c, n in zip(recv_coded, out_counts)]
    with torch.no_grad():
        _pipelined_done(st, "all_to_all", _pipeline.all_to_all(
            "all_to_all", split_flat(input.view(-1), in_counts),
            split_flat(output.view(-1), out_counts), send_codecs, recv_framed, group, rank, sent,
            cfg, st, _observer(cfg, st, sent), ("all_to_all", tuple(input.shape[1:]), input.dtype)),
            counted=sent is not VERIFIED_RAW)
        return _completed_work(async_op, output)


def _split_counts(output, input, output_split_sizes, input_split_sizes, world: int, rank: int,
                  where: str) -> tuple:
    """The elements an all-to-all sends each rank and receives from each."""
    in_rows = _row_counts(input, input_split_sizes, world, "input", where)
    out_rows = _row_counts(output, output_split_sizes, world, "output", where)
    row_in = input.numel() // max(input.shape[0], 1) if input.dim() else 1
    row_out = output.numel() // max(output.shape[0], 1) if output.dim() else 1
    if input.dim() and input.shape[0] == 0:
        row_in = row_out
    if output.dim() and output.shape[0] == 0:
        row_out = row_in
    if row_in != row_out:
        raise _bad(ValueError, 1, f"zipccl {where}: input rows hold {row_in} elements but "
                   f"output rows {row_out}")
    in_counts = [s * row_in for s in in_rows]
    out_counts = [s * row_out for s in out_rows]
    if in_counts[rank] != out_counts[rank]:
        raise _bad(ValueError, 1, f"zipccl {where}: this rank sends itself {in_rows[rank]} "
                   f"rows but expects {out_rows[rank]}")
    return in_counts, out_counts


def _refusal_all_to_all_plan(call: _Setup, t: torch.Tensor) -> _policy.Plan:
    """The plan the peers of a refusing rank reach for an all-to-all: the same
    decision steps, this rank adding no bytes to the agreed split sizes."""
    cfg, st, world = call.cfg, call.st, call.world
    if _policy.sure_raw(cfg, st, "all_to_all", call.group, t.dtype, t.device):
        return _policy.RAW
    with torch.no_grad():
        return _policy.all_to_all_plan(cfg, st, call.group, world, call.rank, t, [0] * world,
                                       [False] * world)
