"""How a collective's call is dispatched: the steps every collective shares
from its entry to its return.

A call begins (``begin``: its group, config and stats), runs its own
argument checks inside ``refusing`` (a check that fails is refused to the
peers before it is raised; ``coded`` says whether the dtype is coded), has
the config's agreement checked (``agree``), asks the policy for a plan
(``plan``), and then goes raw to torch (``announce`` its
size row when its sizes chose it, then ``to_torch``), opens a raw lane
(``open_lane``), or runs one of the schedule's movements (``pipeline.py``,
with ``verified`` and ``observer``) and counts its outcome
(``scheduled_done``); ``completed_work`` mirrors torch's return value. The
collectives (``all_gather.py`` and its siblings) look these up as
``dispatch.NAME`` at each call, so a test that replaces one here sees every
collective use it.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, NamedTuple, Union

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from .. import _reduce
from .. import codec as _codec
from .. import pipeline as _pipeline
from .. import policy as _policy
from .. import protocol
from .. import runtime as _runtime
from . import _lanes
from ..config import DEFAULT_CONFIG, ZipCCLConfig
from ..cost import agreed_raw as _agreed_raw
from ..stats import MODULE_STATS, CommStats

__all__ = ["CODED_DTYPES", "stats", "reset_stats", "VERIFIED_RAW", "Setup", "begin",
           "refusing", "coded", "agree", "bad", "parse_op", "check_tensor", "check_pair",
           "check_world_times", "nbytes",
           "group_info", "capturing", "compresses", "plan", "announce", "decided", "verified",
           "observer", "open_lane", "opens_lane", "scheduled_done", "completed_work",
           "no_grad_if_needed", "to_torch", "torch_all_gather", "torch_reduce_scatter"]

CODED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

torch_all_gather = protocol.all_gather_single
torch_reduce_scatter = protocol.reduce_scatter_single
"""torch's collectives that a raw call is handed to (``to_torch``), bound
here once: a test that wraps ``protocol.all_gather_single`` sees zipccl's
own exchanges, not the calls it hands to torch."""

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
def bad(cls: type[Exception], why: int, text: str) -> Exception:
    """A local argument error; ``why`` indexes ``protocol.REFUSALS``: what this
    rank tells its peers (``_refuse``) before it raises."""
    err = cls(text)
    err.zipccl_refusal = why
    return err


def parse_op(op: ReduceOp | ReduceOp.RedOpType, where: str) -> _reduce.Op:
    if isinstance(op, ReduceOp.RedOpType):
        red, wrapped = op, None
    elif isinstance(op, ReduceOp):
        red, wrapped = op.op, op
    else:
        raise bad(TypeError, 4, f"zipccl {where}: op must be a torch.distributed.ReduceOp, "
                  f"got {type(op).__name__}")
    if red == ReduceOp.SUM:
        return _reduce.SUM
    if red == ReduceOp.AVG:
        return _reduce.AVG
    if red == ReduceOp.PREMUL_SUM:
        if wrapped is None:
            raise bad(ValueError, 4, f"zipccl {where}: PREMUL_SUM needs its factor; pass "
                      f"torch.distributed._make_nccl_premul_sum(factor)")
        # ``.factor`` since torch 2.13; before, only the pickle state carries it.
        factor = wrapped.factor if hasattr(wrapped, "factor") else wrapped.__getstate__()[1]
        return _reduce.Op("premul_sum", factor)
    raise bad(ValueError, 4, f"zipccl {where}: op {red} is not supported; zipccl reduces "
              f"with SUM, AVG and PREMUL_SUM")


def check_tensor(t: object, name: str, where: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise bad(TypeError, 3, f"zipccl {where}: {name} must be a torch.Tensor, "
                  f"got {type(t).__name__}")
    if not t.is_contiguous():
        raise bad(ValueError, 3, f"zipccl {where}: {name} must be contiguous")


def check_pair(out: torch.Tensor, inp: torch.Tensor, where: str) -> None:
    check_tensor(out, "output", where)
    check_tensor(inp, "input", where)
    if out.dtype != inp.dtype:
        raise bad(TypeError, 2, f"zipccl {where}: output is {out.dtype} but input is "
                  f"{inp.dtype}")
    if out.device != inp.device:
        raise bad(ValueError, 2, f"zipccl {where}: output is on {out.device} but input on "
                  f"{inp.device}")


def _coded(dtype: torch.dtype, cfg: ZipCCLConfig, where: str) -> bool:
    """Whether the codec handles ``dtype``; raises if it doesn't and the config says so."""
    if dtype in CODED_DTYPES:
        return True
    if cfg.unsupported_dtype == "raise":
        names = ", ".join(str(d) for d in CODED_DTYPES)
        raise bad(TypeError, 6, f"zipccl {where}: dtype {dtype} is not supported (zipccl "
                  f"codes {names}); use ZipCCLConfig(unsupported_dtype='raw') to hand "
                  f"such calls to torch.distributed unchanged")
    return False


_LAST_GROUP: tuple = (None, 0, 0)
"""(weak reference to the group, world_size, rank) of the last call: asking
torch costs a noticeable share of a raw call's Python. Replaced whole, so a
thread reads a consistent triple; weak, so it keeps no group (and its
backend's threads) alive past destroy_process_group, and a new group, or a
new default group after re-initialisation, is a different object."""


def _forget_last_group() -> None:
    global _LAST_GROUP
    _LAST_GROUP = (None, 0, 0)


_runtime.holds_groups(_forget_last_group)


def group_info(group: dist.ProcessGroup | None
               ) -> tuple[dist.ProcessGroup, int, int] | None:
    """(group, world_size, rank), or None when this rank is not in ``group``."""
    if group is None:
        group = dist.group.WORLD
        if group is None:
            raise RuntimeError("zipccl: the default process group is not initialized; "
                               "call torch.distributed.init_process_group first")
    global _LAST_GROUP
    last = _LAST_GROUP
    if last[0] is not None and last[0]() is group:
        return group, last[1], last[2]
    if dist._rank_not_in_group(group):
        return None
    info = group, dist.get_world_size(group), dist.get_rank(group)
    _LAST_GROUP = (weakref.ref(group), info[1], info[2])
    return info


def compresses(cfg: ZipCCLConfig, kind: str, unit_nbytes: int) -> bool:
    """Whether a message of ``unit_nbytes`` (this rank's own) is big enough to
    compress: not empty and at least ``min_bytes``."""
    return unit_nbytes > 0 and unit_nbytes >= cfg.min_bytes


def plan(cfg: ZipCCLConfig, kind: str, group: dist.ProcessGroup, world: int, t: torch.Tensor,
         parts: tuple, may: bool, unit: int, st: CommStats) -> _policy.Plan:
    """The policy's plan for a call whose traffic is ``parts``, its unit of
    encoding ``unit`` bytes (``policy.plan``); ``may``: the collective lets it
    compress (a coded dtype, more than one rank: the same on every rank). Raw
    while a CUDA graph is captured. A raw plan that is not ``agreed_raw``
    came from this rank's own size: the call announces it (``announce``)."""
    return _policy.plan(cfg, st, kind, group, world, t, parts,
                        may and cfg.compresses(kind) and not capturing(t),
                        compresses(cfg, kind, unit))


def announce(call: Setup, kind: str, plan: _policy.Plan, t: torch.Tensor, elems_to: list,
             elems_from: list, op: _reduce.Op | None = None) -> None:
    """Before a raw call is handed to torch: exchange its size row if its plan
    came from this rank's own sizes (``protocol.announce``), so that ranks whose
    sizes differ raise ``ValueError`` on every rank instead of meeting in
    different collectives. A plan every rank shares before any exchange
    (``cost.agreed_raw``) sends nothing: the call costs what torch's does."""
    if _agreed_raw(plan):
        return
    desc = protocol.describe(kind, t.dtype, op, elems_to, elems_from)
    protocol.announce(desc, t.dtype, call.group, call.rank, call.world, plan.pieces, call.st,
                      t.device, kind)


def decided(plan: _policy.Plan, codable: bool) -> dict[str, int]:
    """The stats of a plan: compressed, pipelined, or raw although codable."""
    return dict(compressed_calls=int(plan.compress),
                pipelined_calls=int(plan.compress and plan.pieces > 1),
                raw_fallback_calls=int(codable and not plan.compress))


VERIFIED_RAW = _policy.Plan(True, "raw", 1, reason="verify")
"""The plan of a call that would go raw under ``verify=True``: the same
schedule with the framing-only codec "raw" (a header and a checksum per 4096
elements around the raw bytes), so that what it moves is checked too."""


def verified(cfg: ZipCCLConfig, plan: _policy.Plan) -> _policy.Plan:
    """``plan``, or ``VERIFIED_RAW`` for a raw plan under ``verify``."""
    return VERIFIED_RAW if cfg.verify and not plan.compress else plan


def observer(cfg: ZipCCLConfig, st: CommStats, plan: _policy.Plan) -> _policy.Policy | None:
    """The policy that learns a call's ratio: none for a verified raw call."""
    return None if plan is VERIFIED_RAW else _policy.of(cfg, st)


def open_lane(call: Setup, kind: str, t: torch.Tensor, via: tuple) -> None:
    """Open the raw lane of this call's (kind, group, dtype, device), calling
    what ``via`` names (``_lanes.py``), in the runtime of the call's stats."""
    cfg, st = call.cfg, call.st
    _lanes.open_lane(st.runtime.state(cfg), kind, via, call.group, call.world, call.rank,
                     st.fields(kind), t.dtype, t.device, _policy.lane_decisions(cfg, st))


def opens_lane(cfg: ZipCCLConfig, kind: str, plan: _policy.Plan) -> bool:
    """Whether this raw call of a coded dtype opens a raw lane for the later
    calls of its kind: when none can go otherwise (``policy.raw_for_good``, or
    the kind's ``compress_*`` switch off); not under ``verify``, whose raw
    calls are framed, nor when this call was raw for a reason a later call
    may not share, its size among them: a call raw for its own size exchanges
    a size row first (``announce``), which a lane would skip."""
    return not cfg.verify and (_policy.raw_for_good(cfg, plan) or not cfg.compresses(kind))


def scheduled_done(st: CommStats, kind: str, *outcomes: _pipeline.Outcome,
                   counted: bool = True) -> None:
    """Count a scheduled call's encode fallback (``counted``: the call was
    counted as compressed); raise its decode error."""
    if any(o.fell_back for o in outcomes):
        protocol.count_fallback(st, kind, counted and not any(o.coded for o in outcomes))
    for o in outcomes:
        if o.error is not None:
            raise o.error


def completed_work(async_op: bool, result: torch.Tensor) -> dist.Work | None:
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


def capturing(t: object) -> bool:
    """Whether ``t`` is a CUDA tensor whose stream is being captured into a
    CUDA graph. A compressed call reads sizes on the host and the policy
    times calls, both of which capture forbids, so a captured call goes raw
    (every rank captures the same step: they agree)."""
    return isinstance(t, torch.Tensor) and t.is_cuda and torch.cuda.is_current_stream_capturing()


class Setup(NamedTuple):
    """What a public collective runs with."""

    cfg: ZipCCLConfig
    st: CommStats
    group: dist.ProcessGroup
    world: int
    rank: int


PlanOf = Callable[[Setup, torch.Tensor], _policy.Plan]
"""A collective's own way to plan a call that it refuses (``refusing``'s ``plan_of``)."""

RawRows = Union[bool, Callable[[Setup, torch.Tensor], bool]]
"""Whether a raw call sends size rows (``refusing``'s ``raw_rows``)."""


def begin(group: dist.ProcessGroup | None, config: ZipCCLConfig | None,
          stats: CommStats | None) -> Setup | None:
    """A public call's config and stats (the module's own when None) and its
    group, world size and rank. None when this rank is not in ``group``: the
    call then does nothing and returns None, as torch's does."""
    info = group_info(group)
    if info is None:
        return None
    return Setup(config or DEFAULT_CONFIG, stats or _STATS, *info)


class refusing:
    """``with dispatch.refusing(call, kind, t, unit):`` around a public
    collective's own argument checks (and ``coded``): a ``TypeError`` or
    ``ValueError`` raised inside is refused to the peers before it goes on
    (``_refuse``, which predicts the call's first exchange from ``unit``,
    the bytes of one unit of encoding, or of the whole tensor when
    ``per_rank``: a chunk is then a world's share of it; ``raw_rows`` and
    ``plan_of``: see ``_refuse``). The collective runs its checks itself, so
    the call reads in one direction: collective, then dispatch."""

    __slots__ = ("call", "kind", "t", "unit", "plan_of", "raw_rows")

    def __init__(self, call: Setup, kind: str, t: torch.Tensor, unit: int, *,
                 per_rank: bool = False, plan_of: PlanOf | None = None,
                 raw_rows: RawRows = False) -> None:
        self.call, self.kind, self.t, self.plan_of, self.raw_rows = call, kind, t, plan_of, raw_rows
        self.unit = -(-unit // call.world) if per_rank else unit

    def __enter__(self) -> None:
        return None

    def __exit__(self, cls, err, tb) -> bool:
        if cls is not None and issubclass(cls, (TypeError, ValueError)):
            _refuse(self.call, self.kind, self.t, self.unit, err, self.plan_of, self.raw_rows)
        return False


def coded(call: Setup, where: str, t: torch.Tensor, *tensors: torch.Tensor) -> bool:
    """Whether the call codes: ``t``'s dtype is one the codec handles (else
    raw, or ``TypeError`` when the config says so) and each of ``tensors``
    holds its elements in memory of its own. A tensor that does not (a
    wrapper subclass: FSDP2's all-gather extensions, float8) goes to torch,
    which dispatches it. Whether a call's tensors are such is part of the
    call, like its dtype: the same on every rank (FSDP2's parameters are of
    one type on every rank), so every rank decides alike. Run it inside
    ``refusing``."""
    return (all(_codec.in_memory(a) for a in tensors)
            and _coded(t.dtype, call.cfg, where))


def agree(call: Setup, kind: str, t: torch.Tensor) -> None:
    """After the checks pass: the agreement check, once per (config, group)
    (``protocol.check_agreement``: raises ZipCCLConfigError naming field and
    ranks). Not while a CUDA graph is captured (it reads the answers on the
    host); a captured step has run uncaptured first, which checked it."""
    if not capturing(t):
        protocol.check_agreement(call.cfg, call.group, call.world, t.device, call.st, kind)


def nbytes(t: object) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _refuse(call: Setup, kind: str, t: object, unit: int, err: Exception,
            plan_of: PlanOf | None = None, raw_rows: RawRows = False) -> None:
    """Before a local argument error ``err`` is raised on this rank: tell the
    peers, whose call may be valid, so that they raise too instead of waiting
    for this rank (``protocol.refuse``). The refusal takes the place of the
    exchange the peers make first: the agreement check when it is due, else
    the first size row of a call that goes through the schedule (compressed,
    verified raw, or raw through zipccl's own reduction: ``raw_rows``, a bool
    or ``raw_rows(call, t)``) or goes raw for its size (``announce``), which
    this rank predicts from its own ``t`` and ``unit`` (or with
    ``plan_of(call, t)``, a collective's own way to plan, as the
    all-to-all's). A call the peers hand to torch raw for a reason every rank
    shares has no exchange of zipccl's to take: there torch's rule holds, as
    for torch's own collectives (the peers wait until the process group's
    timeout; README, "Errors")."""
    why = getattr(err, "zipccl_refusal", None)
    if why is None or call.world == 1 or not isinstance(t, torch.Tensor) or capturing(t):
        return
    cfg, group, world = call.cfg, call.group, call.world
    if protocol.agreement_pending(cfg, call.st, group):
        protocol.refuse(group, world, t.device, why)
        return
    if t.dtype not in CODED_DTYPES:
        return
    if plan_of is not None:
        planned = plan_of(call, t) if cfg.compresses(kind) else _policy.RAW
        rows = verified(cfg, planned).compress
    else:
        planned = plan(cfg, kind, group, world, t, (), True, unit, call.st)
        rows = (verified(cfg, planned).compress or not _agreed_raw(planned)
                or (raw_rows(call, t) if callable(raw_rows) else raw_rows))
    if rows:
        protocol.refuse(group, world, t.device, why)


def check_world_times(big: torch.Tensor, big_name: str, small: torch.Tensor, small_name: str,
                      world: int, where: str) -> None:
    """``big`` must hold world_size times the elements of ``small``."""
    if big.numel() != world * small.numel():
        raise bad(ValueError, 1, f"zipccl {where}: {big_name} has {big.numel()} elements, "
                  f"expected world_size {world} x {small_name} {small.numel()}")


def no_grad_if_needed(*tensors: torch.Tensor) -> contextlib.AbstractContextManager:
    """``torch.no_grad()`` when autograd could see the call, else a no-op: the
    lean raw paths skip the cost of entering it when nothing requires grad."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return torch.no_grad()
    return contextlib.nullcontext()


def to_torch(st: CommStats, kind: str, wire_bytes: int, collective: Callable[..., Any],
             *args: Any, **kwargs: Any) -> Any:
    """Hand the call to torch: run ``collective`` (a ``torch.distributed``
    function) as the call's exchange phase, counting
    ``wire_bytes`` sent; return its result."""
    st.add(kind, wire_bytes=wire_bytes)
    with st.phase(kind, "exchange"):
        return collective(*args, **kwargs)
