"""DDP comm hook: average each gradient bucket with zipccl's compressed all-reduce.

``ddp_comm_hook(state, bucket)`` follows the conventions of
``torch/distributed/algorithms/ddp_comm_hooks/``: ``state`` is what
``ddp_model.register_comm_hook(state, hook)`` was given, the return value is
a ``Future`` of a tensor of the bucket's shape, and the reduced values are
written in place into ``bucket.buffer()``. ``ZipCCLHook.__call__`` delegates
here, so ``ddp_model.register_comm_hook(None, zipccl_hook)`` works and its
calls land in the hook's stats (kind ``"all_reduce"``, profiler ranges
``zipccl::all_reduce::<phase>``).

``state`` may be:

* ``None``: the default process group and the hook's config;
* a ``ProcessGroup`` (torch's hooks take one the same way): that group and
  the hook's config (``zipccl_fsdp.register_comm_hook(ddp_model)`` passes
  ``ddp_model.process_group``);
* a ``ZipCCLConfig``: the default process group and that config.

``install``/``remove`` are the registry's DDP integration
(``zipccl_fsdp.register_comm_hook(ddp_model)``): DDP takes one comm hook per
model and cannot unregister it, so ``remove`` switches the registered hook to
torch's ``allreduce_hook`` (which its docs say matches DDP without a hook) and
a later ``install`` of the same hook switches it back.

Numerics: DDP hands hooks the bucket *before* averaging. zipccl sums the
ranks' buckets in fp32 in rank order, divides by the world size in fp32 and
casts once to the bucket's dtype (``ReduceOp.AVG`` of ``collectives``).
DDP's default divides each gradient by the world size first and sums after;
for a world size that is a power of two both orders give the same bits
(barring overflow or subnormals), and the fp32 sum of two operands does not
depend on their order: on two ranks the result equals DDP's default bit for
bit, for fp32 and bf16 buckets. On other world sizes it is deterministic and
the same on every backend, with one rounding fewer than pre-dividing.

A bucket's all-reduce runs on zipccl's worker thread, in bucket order
(``zipccl_fsdp/background.py``), and the hook returns at once, so the
bucket's communication overlaps the rest of backward as with DDP's default
hook. Every call of the hook's goes over zipccl's own process group with
the ranks of the DDP model's (``background.own_group``, created at the
first bucket): DDP's reducer (the used-parameter map of
``find_unused_parameters`` and ``static_graph``), autograd (the backward of
``torch.distributed.nn.functional`` collectives) and the user issue
collectives on the model's group while the worker runs, and on one group
the ranks would disagree on their order. A compressed call waits on the host (its size exchange), which on
autograd's thread would stall backward until the bucket had crossed the
link. One call runs in the hook instead, once the worker has issued every
earlier one: the call that calibrates the adaptive policy (times the link
and the codec), so that backward does not slow down what it measures. DDP
waits on every bucket's future at the end of backward.

Failure: when a bucket's all-reduce fails (with ``verify=True``, a payload
damaged in transit raises ``CorruptPayloadError`` on every rank of the
call), the buckets queued behind it still run on every rank, and
``loss.backward()`` raises the first failure of the pass, as it was raised,
once zipccl's worker is idle: ``except CorruptPayloadError`` catches it,
and the caller may issue collectives at once. The gradients of that step are not to be used;
the DDP model itself trains on. (Outside backward, the hook called
directly, the future fails with a ``RuntimeError`` whose message holds the
original exception's type and text.)
"""
# No ``from __future__ import annotations`` here: DDP compares the hook's
# ``bucket`` and return annotations to ``dist.GradBucket`` and
# ``torch.futures.Future[torch.Tensor]`` (``_check_comm_hook`` in
# torch/nn/parallel/distributed.py); string annotations fail that check.
import functools
import threading
from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.autograd import Variable
from torch.nn.parallel import DistributedDataParallel

from zipccl_fsdp import background as _background
from zipccl_fsdp import collectives as _coll
from zipccl_fsdp.config import DEFAULT_CONFIG, ZipCCLConfig
from zipccl_fsdp.stats import CommStats

__all__ = ["ddp_comm_hook", "is_ddp_model", "install", "remove"]


class _Installed:
    """The state ``install`` registers: the DDP model's group, and whether the
    hook is on (``remove`` turns it off: DDP cannot unregister a hook)."""

    __slots__ = ("process_group", "active")

    def __init__(self, process_group) -> None:
        self.process_group = process_group
        self.active = True

    # Like PowerSGDState: a ProcessGroup does not pickle.
    def __getstate__(self):
        return {"process_group": None, "active": self.active}

    def __setstate__(self, state) -> None:
        self.process_group = state["process_group"]
        self.active = state["active"]


def _resolve_state(state, config: Optional[ZipCCLConfig]) -> Tuple[object, ZipCCLConfig]:
    """(process group or None for the default one, config) from the hook's ``state``."""
    config = config or DEFAULT_CONFIG
    if isinstance(state, _Installed):
        return state.process_group, config
    if state is None:
        return None, config
    if isinstance(state, ZipCCLConfig):
        return None, state
    if isinstance(state, dist.ProcessGroup):
        return state, config
    raise TypeError(f"zipccl DDP comm hook: state must be None, a ProcessGroup or a "
                    f"ZipCCLConfig, got {type(state).__name__}")


def ddp_comm_hook(state, bucket: dist.GradBucket, *, config: Optional[ZipCCLConfig] = None,
                  stats: Optional[CommStats] = None) -> torch.futures.Future[torch.Tensor]:
    """Average a DDP gradient bucket over ranks with a compressed all-reduce.

    ``config`` applies when ``state`` brings none (``None`` or a process
    group); ``stats`` receives the counters (the free functions' own in
    ``zipccl_fsdp.collectives`` when ``None``). Buckets of a dtype the codec
    does not take follow ``config.unsupported_dtype``; with ``"raw"`` they are
    pre-divided and summed by torch, exactly like torch's ``allreduce_hook``.
    Sparse gradients (``nn.Embedding(sparse=True)``) are not compressed: their
    buckets go to torch's ``allreduce_hook``, which reduces them as DDP without
    a hook does.

    Example::

        >>> ddp_model.register_comm_hook(None, zipccl_hook)          # default config
        >>> ddp_model.register_comm_hook(ZipCCLConfig(codec="dense"), zipccl_hook)
    """
    if isinstance(state, _Installed) and not state.active:
        return default_hooks.allreduce_hook(state.process_group, bucket)
    group, cfg = _resolve_state(state, config)
    buffer = bucket.buffer()
    if buffer.is_sparse:
        # A sparse gradient (``nn.Embedding(sparse=True)``) is not compressed:
        # torch's own hook divides and sums it as DDP without a hook does.
        return default_hooks.allreduce_hook(group, bucket)
    # Every call of the hook's, in place or on the worker, goes over zipccl's
    # own group with the ranks of ``group``: DDP's reducer and autograd issue
    # collectives on ``group`` while the worker runs (``background.own_group``).
    group = _background.own_group(group)
    if buffer.dtype in _coll.CODED_DTYPES:
        op = ReduceOp.AVG
    else:
        # torch's allreduce_hook: divide first, then sum (gloo has no AVG).
        if cfg.unsupported_dtype == "raw":
            buffer.div_(dist.get_world_size(group))
        op = ReduceOp.SUM
    # zipccl's all-reduce decodes every peer's chunk straight into its slot of
    # ``buffer``: that is the in-place "decompress" step that torch's
    # compression hooks run in ``fut.then`` (no second bucket-sized tensor at
    # peak memory; https://github.com/pytorch/pytorch/issues/45968). It runs
    # on zipccl's worker thread (``background.py``): a compressed call waits on
    # the host, which here would hold up the rest of backward. The call that
    # calibrates the policy runs here instead, after the calls before it (so
    # that backward does not compete with what it times); every other
    # all-reduce of the bucket waits on the host whichever way it goes
    # (``all_reduce_outlook``). A rank outside ``group`` gets None from the
    # call: its future completes with ``buffer``.
    outlook = _coll.all_reduce_outlook(buffer, group, cfg, stats)
    try:
        fut = _background.submit(
            lambda: _coll.all_reduce(buffer, op=op, group=group, async_op=True, config=cfg,
                                     stats=stats),
            buffer, here=outlook == "calibrates")
    except Exception as e:  # noqa: BLE001 - a call run here: it fails like a queued one
        fut = torch.futures.Future()
        fut.set_exception(e)
    return _watched(fut, buffer)


# --------------------------------------------------------------------------
# A bucket that fails
# --------------------------------------------------------------------------
# DDP's reducer cannot carry a Python exception out of a comm hook's future:
# it reads the future's value as a tensor (an exception object there becomes
# "Unable to cast ... to Tensor"), and a C++ error keeps only the message. It
# also stops waiting at the first failed bucket, with later ones still queued
# on the worker. So inside backward the future given to DDP always completes with
# the bucket, and the pass's failure is raised by an autograd final callback
# that runs after DDP's own (which waits for every bucket) once the worker is
# idle: the engine re-raises a Python exception from a callback as it is.
class _Pass:
    """The zipccl futures of one backward pass (one autograd graph task)."""

    __slots__ = ("task", "futures")

    def __init__(self, task: int) -> None:
        self.task, self.futures = task, []


_passes_lock = threading.Lock()
_open_pass: Optional[_Pass] = None


def _watched(fut: torch.futures.Future, buffer: torch.Tensor) -> torch.futures.Future:
    """The future to give DDP for the bucket whose all-reduce ``fut`` is."""
    global _open_pass
    task = torch._C._current_graph_task_id()
    if task == -1:
        # Not inside backward (the hook called directly): the waiter gets the
        # failure, as a C++ error whose message names it.
        return fut.then(_value)
    with _passes_lock:
        new = _open_pass is None or _open_pass.task != task
        if new:
            _open_pass = _Pass(task)
        _open_pass.futures.append(fut)
        this = _open_pass
    if new:
        Variable._execution_engine.queue_callback(functools.partial(_close_pass, this))
    return fut.then(lambda _: buffer)


def _value(fut: torch.futures.Future):
    return fut.value()


def _close_pass(this: _Pass) -> None:
    """The first final callback of a pass: queued at its first bucket, it runs
    before DDP's, which is queued once every bucket is ready; queue the check
    behind DDP's. A bucket whose hook runs after this (DDP's static graph
    reduces in its own callback) opens a pass of its own."""
    global _open_pass
    with _passes_lock:
        if _open_pass is this:
            _open_pass = None
    try:
        Variable._execution_engine.queue_callback(functools.partial(_raise_failure, this))
    except RuntimeError:  # callbacks cannot be queued here: check now
        _raise_failure(this)


def _raise_failure(this: _Pass) -> None:
    """Wait until the worker has run every call (so every failure of the pass
    is known), then raise the first failure of the pass, as it was raised:
    ``except CorruptPayloadError`` catches a damaged payload."""
    _background.drain()
    first = None
    for fut in this.futures:
        try:
            fut.wait()
        except Exception as e:  # noqa: BLE001 - the first one is raised below
            first = first if first is not None else e
    if first is not None:
        raise first


# --------------------------------------------------------------------------
# The registry's DDP integration
# --------------------------------------------------------------------------
def is_ddp_model(model) -> bool:
    """Whether ``model`` is a ``DistributedDataParallel`` wrapper."""
    return isinstance(model, DistributedDataParallel)


def install(model: DistributedDataParallel, hook) -> None:
    """Register ``hook`` (a ``ZipCCLHook``) as ``model``'s comm hook, on the model's
    own process group; after ``remove``, switch the same hook back on."""
    installed = getattr(model, "_zipccl_ddp", None)
    if installed is not None:
        old_hook, state = installed
        if old_hook is not hook:
            raise ValueError(f"zipccl cannot register {hook!r} on this DDP model: it already "
                             f"has {old_hook!r}, and DDP takes one comm hook per model and "
                             f"cannot unregister it; wrap the module in a new DDP instead")
        state.active = True
        return
    state = _Installed(model.process_group)
    model.register_comm_hook(state, hook)  # raises if the model already has another hook
    model._zipccl_ddp = (hook, state)


def remove(model: DistributedDataParallel, hook) -> int:
    """Switch ``hook`` off on ``model`` (torch's ``allreduce_hook`` runs instead);
    return 1 if it was on, else 0."""
    installed = getattr(model, "_zipccl_ddp", None)
    if installed is None or installed[0] is not hook or not installed[1].active:
        return 0
    installed[1].active = False
    return 1
