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
  scales (AVG, PREMUL_SUM) and casts. The raw path (below ``min_bytes`` or
  with compression off) is an uncompressed all-to-all followed by the same
  sum, so the result is bitwise the same on either path and with every codec
  backend; a NaN result is the canonical quiet NaN (``_reduce.py``).
* all-reduce: the reduce-scatter above and the all-gather above, on chunks of
  ceil/floor(numel / world) elements (any numel).
* all-to-all: each split is encoded if it holds at least ``min_bytes`` (the
  receiver applies the same rule to its output split, so nothing marks it),
  payloads go through an all-to-all with exact splits. An output that
  overlaps the input is refused on every path alike.

A rank's own chunk of a reduce-scatter or all-to-all is never encoded nor sent.

Every check that can fail locally (dtype, op, shapes) runs before the first
communication, so a bad call raises on every rank instead of hanging some;
what only the ranks together can see (a call that differs between ranks, a
size no slot can hold) is checked on the size rows, which every rank sees.
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
from .stats import CommStats

__all__ = ["all_gather_single", "reduce_scatter_single", "all_reduce", "all_to_all_single",
           "stats", "reset_stats", "CODED_DTYPES"]

CODED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

_STATS = CommStats()


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
        raise TypeError(f"zipccl {where}: op must be a torch.distributed.ReduceOp, "
                        f"got {type(op).__name__}")
    if red == ReduceOp.SUM:
        return _Op("sum")
    if red == ReduceOp.AVG:
        return _Op("avg")
    if red == ReduceOp.PREMUL_SUM:
        if wrapped is None:
            raise ValueError(f"zipccl {where}: PREMUL_SUM needs its factor; pass "
                             f"torch.distributed._make_nccl_premul_sum(factor)")
        # ``.factor`` since torch 2.13; before, only the pickle state carries it.
        factor = wrapped.factor if hasattr(wrapped, "factor") else wrapped.__getstate__()[1]
        return _Op("premul_sum", factor)
    raise ValueError(f"zipccl {where}: op {red} is not supported; zipccl reduces with "
                     f"SUM, AVG and PREMUL_SUM")


def _check_tensor(t, name: str, where: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"zipccl {where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"zipccl {where}: {name} must be contiguous")


def _check_pair(out: torch.Tensor, inp: torch.Tensor, where: str) -> None:
    _check_tensor(out, "output", where)
    _check_tensor(inp, "input", where)
    if out.dtype != inp.dtype:
        raise TypeError(f"zipccl {where}: output is {out.dtype} but input is {inp.dtype}")
    if out.device != inp.device:
        raise ValueError(f"zipccl {where}: output is on {out.device} but input on {inp.device}")


def _coded(dtype: torch.dtype, cfg: ZipCCLConfig, where: str) -> bool:
    """Whether the codec handles ``dtype``; raises if it doesn't and the config says so."""
    if dtype in CODED_DTYPES:
        return True
    if cfg.unsupported_dtype == "raise":
        names = ", ".join(str(d) for d in CODED_DTYPES)
        raise TypeError(f"zipccl {where}: dtype {dtype} is not supported (zipccl codes "
                        f"{names}); use ZipCCLConfig(unsupported_dtype='raw') to hand "
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
    """What ``cfg.policy`` does with a call that ``min_bytes`` and the ``compress_*``
    switches let compress (``policy.py``); raw otherwise. Every rank gets the same plan."""
    if not compress or cfg.policy == "never" or _capturing(t):
        return _policy.RAW
    if cfg.policy == "always" and cfg.pipeline_pieces <= 1:
        return _policy.Plan(True, cfg.codec, reason="always")
    pol = _policy.policy_for(cfg)
    if pol.known_closed(kind, group, t.dtype, t.device):  # the hot path of a fast link
        return _policy.LINK_RAW
    with st.phase(kind, "policy"):
        return pol.decide(
            kind, group, world, (kind, tuple(t.shape), t.dtype), t.dtype, t.device,
            _policy.traffic(kind, world, unit), st)


def _decided(plan: _policy.Plan, codable: bool) -> dict:
    """The stats of a plan: compressed, pipelined, or raw although codable."""
    return dict(compressed_calls=int(plan.compress),
                pipelined_calls=int(plan.compress and plan.pieces > 1),
                raw_fallback_calls=int(codable and not plan.compress))


def _is_nccl(group) -> bool:
    return dist.get_backend(group) == "nccl"


def _native_all_reduce(tensor, parsed: _Op, op, group, world: int, async_op: bool):
    """torch's own all-reduce, for the calls the adaptive policy sends raw:
    zipccl steps aside, numerics included (gloo sums bf16 in bf16; the
    compressed calls sum in fp32 in rank order). zipccl's own raw path
    (all-to-all, fp32 sum, all-gather; "always" and "never" keep it) takes
    several times as long as torch's on a fast link (docs/benchmarks.md).
    gloo lacks AVG and
    PREMUL_SUM: those scale each rank's tensor, then sum (as torch's DDP
    allreduce_hook divides, then sums)."""
    if _is_nccl(group) or parsed.kind == "sum":
        return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)
    if parsed.kind == "avg":
        tensor.div_(world)
    else:
        tensor.mul_(parsed.factor)
    return dist.all_reduce(tensor, op=ReduceOp.SUM, group=group, async_op=async_op)


def _raw_for_good(cfg: ZipCCLConfig, plan: _policy.Plan) -> bool:
    """Whether ``plan`` sent a call raw for a reason no later call of its kind,
    group and dtype can change: the adaptive policy's closed gate, or "never"."""
    return plan is _policy.LINK_RAW or cfg.policy == "never"


def _open_lane(call: _Setup, kind: str, stats_arg, t: torch.Tensor,
               native_avg: bool = False) -> None:
    """Open the raw lane of this call's (kind, group, stats, dtype, device)
    (``_raw_lanes.py``); only for a call sent raw for good (``_raw_for_good``)."""
    cfg = call.cfg
    decisions = _policy.policy_for(cfg).decisions if cfg.policy == "adaptive" else None
    _raw_lanes.open_lane(cfg, kind, call.group, call.world, call.rank, stats_arg,
                         call.st.fields(kind), t.dtype, t.device, decisions, native_avg)


def _pipelined_done(st: CommStats, kind: str, *outcomes: _pipeline.Outcome) -> None:
    """Count a pipelined call's encode fallback; raise its decode error."""
    if any(o.fell_back for o in outcomes):
        _integrity.count_fallback(st, kind, not any(o.coded for o in outcomes))
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


def _begin(where: str, group, config: ZipCCLConfig | None, stats: CommStats | None,
           *tensors: torch.Tensor) -> _Setup | None:
    """A public call's config and stats (the module's own when None) and its
    group, world size and rank, after checking its ``tensors``: ``output,
    input`` (``_check_pair``) or an in-place ``tensor``. None when this rank is
    not in ``group``: the call then does nothing and returns None, as torch's
    does."""
    info = _group_info(group)
    if info is None:
        return None
    if len(tensors) == 2:
        _check_pair(*tensors, where)
    else:
        _check_tensor(*tensors, "tensor", where)
    return _Setup(config or DEFAULT_CONFIG, stats or _STATS, *info)


def _check_world_times(big: torch.Tensor, big_name: str, small: torch.Tensor, small_name: str,
                       world: int, where: str) -> None:
    """``big`` must hold world_size times the elements of ``small``."""
    if big.numel() != world * small.numel():
        raise ValueError(f"zipccl {where}: {big_name} has {big.numel()} elements, "
                         f"expected world_size {world} x {small_name} {small.numel()}")


def _admit(call: _Setup, t: torch.Tensor, kind: str, where: str) -> bool:
    """The last step before a call's first communication: whether the codec
    handles ``t``'s dtype (``_coded``: raises where the config says so), then
    the agreement check of the ranks' configs (``_ensure_consistent``)."""
    coded = _coded(t.dtype, call.cfg, where)
    _ensure_consistent(call.cfg, call.group, call.world, t, call.st, kind)
    return coded


def _no_grad_if_needed(*tensors: torch.Tensor):
    """``torch.no_grad()`` when autograd could see the call, else a no-op: the
    lean raw paths skip the cost of entering it when nothing requires grad."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return torch.no_grad()
    return contextlib.nullcontext()


def _to_torch(st: CommStats, kind: str, wire_bytes: int, collective, *args, **kwargs):
    """Hand the call to torch: run ``collective`` (a ``torch.distributed``
    function, or ``_native_all_reduce``) as the call's exchange phase, counting
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
    call = _begin(where, group, config, stats, output_tensor, input_tensor)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    _check_world_times(output_tensor, "output", input_tensor, "input", world, where)
    coded = _admit(call, input_tensor, "all_gather", where)
    unit = input_tensor.numel() * input_tensor.element_size()
    compress = coded and world > 1 and _compresses(cfg, "all_gather", unit)
    plan = _plan(cfg, "all_gather", group, world, input_tensor, unit, compress, st)
    if not plan.compress and world > 1:  # the lean path of every raw call
        st.add("all_gather", calls=1, raw_bytes=unit, raw_fallback_calls=int(coded))
        if coded and _raw_for_good(cfg, plan):
            _open_lane(call, "all_gather", stats, input_tensor)
        with _no_grad_if_needed(output_tensor, input_tensor):
            return _to_torch(st, "all_gather", unit, _all_gather_single, output_tensor,
                             input_tensor, group=group, async_op=async_op)
    st.add("all_gather", calls=1, raw_bytes=unit if world > 1 else 0,
           **_decided(plan, coded and world > 1))
    with torch.no_grad():
        if not plan.compress:  # one rank
            if not same_memory(output_tensor, input_tensor):
                output_tensor.copy_(input_tensor.reshape(output_tensor.shape))
            return _completed_work(async_op, output_tensor)
        return _all_gather_coded(output_tensor, input_tensor, plan, cfg, st, group, world,
                                 rank, async_op)


def _all_gather_coded(output_tensor, input_tensor, plan, cfg: ZipCCLConfig, st: CommStats,
                      group, world: int, rank: int, async_op: bool):
    """The rest of ``all_gather_single`` for a compressed call."""
    n = input_tensor.numel()
    flat_out = output_tensor.view(-1)
    slots = [flat_out[r * n:(r + 1) * n] for r in range(world)]
    _pipelined_done(st, "all_gather", _pipeline.gather(
        "all_gather", input_tensor.view(-1), slots, group, rank, plan, cfg, st,
        _policy.policy_for(cfg), ("all_gather", tuple(input_tensor.shape), input_tensor.dtype)))
    return _completed_work(async_op, output_tensor)


@torch.no_grad()
def reduce_scatter_single(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          config: ZipCCLConfig | None = None, stats: CommStats | None = None):
    """Reduce ``input`` over ranks and scatter it: rank r gets chunk r, compressed.

    Like ``torch.distributed.reduce_scatter_single`` with ``op`` SUM, AVG or
    PREMUL_SUM (``torch.distributed._make_nccl_premul_sum(f)``; also on gloo,
    which lacks it). The sum runs in fp32 in rank order, then AVG divides by
    world size and the result is cast to ``output.dtype``: deterministic, the
    same on every backend and with or without compression, except for a call
    the adaptive policy sends raw on NCCL: that one is NCCL's own
    reduce-scatter. With ``async_op=True`` the returned ``Work`` is already
    complete (synchronous underneath for now) unless the call went to torch.

    Example::

        >>> out = torch.empty(grads.numel() // world, dtype=grads.dtype)
        >>> reduce_scatter_single(out, grads, op=ReduceOp.AVG)
    """
    where = "reduce_scatter_single"
    parsed = _parse_op(op, where)
    call = _begin(where, group, config, stats, output, input)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    _check_world_times(input, "input", output, "output", world, where)
    n = output.numel()
    unit = n * input.element_size()
    coded = _admit(call, input, "reduce_scatter", where)
    if not coded:
        st.add("reduce_scatter", calls=1, raw_bytes=(world - 1) * unit)
        return _to_torch(st, "reduce_scatter", (world - 1) * unit, _reduce_scatter_single,
                         output, input, op=op, group=group, async_op=async_op)
    compress = world > 1 and _compresses(cfg, "reduce_scatter", unit)
    plan = _plan(cfg, "reduce_scatter", group, world, input, unit, compress, st)
    st.add("reduce_scatter", calls=1, raw_bytes=(world - 1) * unit,
           **_decided(plan, world > 1))
    if not plan.compress and cfg.policy == "adaptive" and world > 1 and _is_nccl(group):
        # NCCL's own reduce-scatter (ring or NVLS, reducing as it moves) beats
        # zipccl's raw path, an all-to-all and then w adds, where links are
        # fast; gloo's moves twice an all-to-all's bytes, so there zipccl's stays.
        return _to_torch(st, "reduce_scatter", (world - 1) * unit, _reduce_scatter_single,
                         output, input, op=op, group=group, async_op=async_op)
    _pipelined_done(st, "reduce_scatter", _pipeline.scatter_reduce(
        "reduce_scatter", input.view(-1), [n] * world, output.view(-1), parsed, group, rank,
        plan, cfg, st, _policy.policy_for(cfg), ("reduce_scatter", tuple(input.shape),
                                                  input.dtype)))
    return _completed_work(async_op, output)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, *,
               config: ZipCCLConfig | None = None, stats: CommStats | None = None):
    """All-reduce ``tensor`` in place: compressed reduce-scatter + all-gather.

    Like ``torch.distributed.all_reduce`` with SUM, AVG or PREMUL_SUM. Any
    numel: rank r reduces elements [start_r, start_r + count_r) with counts
    differing by at most one. Same numerics as ``reduce_scatter_single``,
    except for a call the adaptive policy sends raw: that one is torch's own
    all-reduce (``_native_all_reduce``). With ``async_op=True`` a ``Work``
    (complete unless the call went raw; see the module docstring).

    Example::

        >>> all_reduce(bucket, op=ReduceOp.AVG)
    """
    done = _raw_lanes.all_reduce(tensor, op, group, async_op, config, stats)
    if done is not _raw_lanes.MISS:
        return done
    with torch.no_grad():
        return _all_reduce(tensor, op, group, async_op, config, stats)


def _all_reduce(tensor, op, group, async_op: bool, config: ZipCCLConfig | None,
                stats: CommStats | None):
    """``all_reduce`` off its raw lane."""
    where = "all_reduce"
    parsed = _parse_op(op, where)
    call = _begin(where, group, config, stats, tensor)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    numel = tensor.numel()
    itemsize = tensor.element_size()
    coded = _admit(call, tensor, "all_reduce", where)
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
    if not plan.compress and cfg.policy == "adaptive" and world > 1:
        if plan is _policy.LINK_RAW:
            _open_lane(call, "all_reduce", stats, tensor,
                       native_avg=_is_nccl(group))
        return _to_torch(st, "all_reduce", numel * itemsize, _native_all_reduce, tensor, parsed,
                         op, group, world, async_op)
    flat = tensor.view(-1)
    reduced = torch.empty(counts[rank], dtype=tensor.dtype, device=tensor.device)
    slots = split_flat(flat, counts)
    pol, site = _policy.policy_for(cfg), ("all_reduce", tuple(tensor.shape), tensor.dtype)
    first = _pipeline.scatter_reduce("all_reduce", flat, counts, reduced, parsed, group, rank,
                                     plan, cfg, st, pol, site)
    if world == 1:
        slots[0].copy_(reduced)
        return _completed_work(async_op, tensor)
    # A corrupt piece in the first half stops the second on every rank.
    second = _pipeline.gather("all_reduce", reduced, slots, group, rank, plan, cfg, st, pol,
                              site, abort=first.error)
    _pipelined_done(st, "all_reduce", first, second)
    return _completed_work(async_op, tensor)


def all_reduce_outlook(tensor: torch.Tensor, group=None,
                       config: ZipCCLConfig | None = None) -> str:
    """What ``all_reduce(tensor, group=group, config=config)`` is known to do
    before it runs, for a caller that runs calls off its own thread while it
    computes (the DDP hook, ``background.py``):

    * ``"calibrates"``: it first times the link and the codec (the adaptive
      policy's first compressible call of this dtype and device on ``group``).
      Run it where nothing else competes for the machine: a codec timed
      beside backward looks slower than it is, and the policy's decision for
      every later call flips from run to run (docs/benchmarks.md);
    * ``"raw"``: the adaptive policy sends it raw whatever its data (a
      message under ``min_bytes``, or a link found too fast to ever
      compress): torch's own all-reduce, pending, costs no more on the
      caller's thread than handing it over;
    * ``""``: anything else: it may be compressed, or (``"always"``,
      ``"never"``) sent raw through zipccl's rank-order path, which waits."""
    cfg = config or DEFAULT_CONFIG
    if cfg.policy != "adaptive" or tensor.dtype not in CODED_DTYPES or _capturing(tensor):
        return ""
    info = _group_info(group)
    if info is None or info[1] == 1:
        return ""
    group, world, _ = info
    if not _compresses(cfg, "all_reduce", (tensor.numel() // world) * tensor.element_size()):
        return "raw"
    pol = _policy.policy_for(cfg)
    if not pol.calibrated(group, tensor.dtype, tensor.device):
        return "calibrates"
    return "raw" if pol.gate_closed(group, tensor.dtype, tensor.device) else ""


def _row_counts(t: torch.Tensor, splits, world: int, name: str, where: str) -> list:
    rows = t.shape[0] if t.dim() else 1
    if splits is None:
        if rows % world:
            raise ValueError(f"zipccl {where}: {name} has {rows} rows, not divisible by "
                             f"world_size {world}; pass split sizes")
        return [rows // world] * world
    splits = [int(s) for s in splits]
    if len(splits) != world or any(s < 0 for s in splits) or sum(splits) != rows:
        raise ValueError(f"zipccl {where}: {name} split sizes {splits} must be {world} "
                         f"non-negative row counts summing to {rows}")
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
    call = _begin(where, group, config, stats, output, input)
    if call is None:
        return None
    cfg, st, group, world, rank = call
    coded = _coded(input.dtype, cfg, where)
    in_rows = _row_counts(input, input_split_sizes, world, "input", where)
    out_rows = _row_counts(output, output_split_sizes, world, "output", where)
    row_in = input.numel() // max(input.shape[0], 1) if input.dim() else 1
    row_out = output.numel() // max(output.shape[0], 1) if output.dim() else 1
    if input.dim() and input.shape[0] == 0:
        row_in = row_out
    if output.dim() and output.shape[0] == 0:
        row_out = row_in
    if row_in != row_out:
        raise ValueError(f"zipccl {where}: input rows hold {row_in} elements but output "
                         f"rows {row_out}")
    itemsize = input.element_size()
    in_counts = [s * row_in for s in in_rows]
    out_counts = [s * row_out for s in out_rows]
    if in_counts[rank] != out_counts[rank]:
        raise ValueError(f"zipccl {where}: this rank sends itself {in_rows[rank]} rows but "
                         f"expects {out_rows[rank]}")
    raw = (sum(in_counts) - in_counts[rank]) * itemsize
    _ensure_consistent(cfg, group, world, input, st, "all_to_all")
    if overlaps(input, output):
        # Every path reads the input while it writes the output (torch's own
        # all-to-all included), so an overlapping input is read from a copy.
        input = input.clone()
    if not coded or not cfg.compress_all_to_all or world == 1 or _capturing(input):
        st.add("all_to_all", calls=1, raw_bytes=raw)
        return _to_torch(st, "all_to_all", raw, dist.all_to_all_single, output, input,
                         output_split_sizes, input_split_sizes, group=group, async_op=async_op)
    if cfg.policy == "never" or (cfg.policy == "adaptive" and _policy.policy_for(cfg).known_closed(
            "all_to_all", group, input.dtype, input.device)):
        # Raw for sure (a fast link, or "never"): the lean path, and the lane
        # of the next such calls.
        st.add("all_to_all", calls=1, raw_bytes=raw, raw_fallback_calls=1)
        _open_lane(call, "all_to_all", stats, input)
        with _no_grad_if_needed(output, input):
            return _to_torch(st, "all_to_all", raw, dist.all_to_all_single, output, input,
                             output_split_sizes, input_split_sizes, group=group,
                             async_op=async_op)
    st.add("all_to_all", calls=1, raw_bytes=raw)
    send_coded = [_compresses(cfg, "all_to_all", c * itemsize) for c in in_counts]
    recv_coded = [_compresses(cfg, "all_to_all", c * itemsize) for c in out_counts]
    with torch.no_grad():
        # Decided before any slicing: a raw call should cost as little as possible.
        with st.phase("all_to_all", "policy"):
            plan = _all_to_all_plan(cfg, group, world, rank, input, in_counts, send_coded, st)
        decided = _decided(plan, True)
        if not (any(send_coded) or any(recv_coded)):  # every split of this rank goes raw
            decided["compressed_calls"] = decided["pipelined_calls"] = 0
        st.add("all_to_all", **decided)
        if not plan.compress:
            return _to_torch(st, "all_to_all", raw, dist.all_to_all_single, output, input,
                             output_split_sizes, input_split_sizes, group=group,
                             async_op=async_op)
        _pipelined_done(st, "all_to_all", _pipeline.all_to_all(
            "all_to_all", split_flat(input.view(-1), in_counts),
            split_flat(output.view(-1), out_counts), send_coded, recv_coded, group, rank, plan,
            cfg, st, _policy.policy_for(cfg), ("all_to_all", tuple(input.shape[1:]),
                                                input.dtype)))
        return _completed_work(async_op, output)


def _all_to_all_plan(cfg: ZipCCLConfig, group, world: int, rank: int, t: torch.Tensor,
                     in_counts: list, send_coded: list, st: CommStats) -> _policy.Plan:
    """The plan of an all-to-all (split sizes differ between ranks:
    ``Policy.decide_all_to_all``)."""
    if cfg.policy == "never":
        return _policy.RAW
    pol = _policy.policy_for(cfg)
    if cfg.policy == "always":
        return pol.decide("all_to_all", group, world, ("all_to_all", tuple(t.shape[1:]), t.dtype),
                          t.dtype, t.device, (), st)
    itemsize = t.element_size()
    send = sum(c for r, c in enumerate(in_counts) if r != rank) * itemsize
    coded = sum(c for r, c in enumerate(in_counts) if r != rank and send_coded[r]) * itemsize
    return pol.decide_all_to_all(group, world, tuple(t.shape[1:]), t.dtype, t.device, send,
                                 coded, st)
