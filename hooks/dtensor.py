"""Compress DTensor and functional collectives: a ``TorchDispatchMode``.

DTensor redistribution (Shard->Replicate, Partial->Shard, Partial->Replicate),
tensor/sequence parallelism and MoE token dispatch
(``torch.distributed._functional_collectives``) all lower to
``torch.ops._c10d_functional.*``; torch offers no registry to swap those, so
this module intercepts them with a dispatch mode and runs
``zipccl_fsdp.collectives`` instead:

=================================================  ===========================
``_c10d_functional.all_gather_into_tensor``        ``all_gather_single``
``_c10d_functional.reduce_scatter_tensor`` (sum,   ``reduce_scatter_single``
avg)
``_c10d_functional.all_reduce`` (sum, avg)         ``all_reduce``
``_c10d_functional.all_to_all_single``             ``all_to_all_single``
``_dtensor.shard_dim_alltoall`` (Shard(i)->        ``all_to_all_single``
Shard(j) on non-CPU meshes)
=================================================  ===========================

Why a dispatch mode and not a ``TorchFunctionMode``: torch registers the
autograd formulas of these ops with ``torch.library.register_autograd``
(``torch/distributed/_functional_collectives.py``: the backward of an
all-gather calls ``_c10d_functional.reduce_scatter_tensor`` and so on). Those
backward calls are dispatcher calls, never Python function calls, so only a
dispatch mode sees them. The mode sits below autograd: autograd records the
same graph as without it.

A real functional collective returns a tensor whose ``Work`` is registered for
a later ``_c10d_functional.wait_tensor`` (``AsyncCollectiveTensor`` issues it
on first use). The compressed collectives are synchronous, so the mode returns
a completed, unregistered tensor; ``wait_tensor`` on a tensor with no
registered work returns it unchanged (``wait_tensor`` in
``torch/csrc/distributed/c10d/Functional.cpp`` pops the works the
``WorkRegistry`` holds for the tensor and waits on each, of which there are
none here; checked on torch 2.13 with gloo).

Calls the codec cannot take (integer dtypes such as MoE token counts, reduce
ops other than sum/avg, fake or meta tensors while tracing) and every other
functional collective run torch's own kernel and are counted per op under
``"passthrough"`` in ``stats()``.

The mode lives on the thread that enters it (autograd's device threads
inherit it): call ``backward()`` while it is active, or backward's collectives
run uncompressed. Like every dispatch mode it routes every op of the thread
through Python, a few microseconds each.
"""
from __future__ import annotations

import contextlib
from collections import Counter

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from zipccl_fsdp import collectives as _coll
from zipccl_fsdp.config import DEFAULT_CONFIG, ZipCCLConfig
from zipccl_fsdp.stats import CommStats

__all__ = ["DTensorCompressionMode", "compress_dtensor_comms", "enable_dtensor_compression",
           "disable_dtensor_compression"]

_funcol = torch.ops._c10d_functional
_REDUCE_OPS = {"sum": ReduceOp.SUM, "avg": ReduceOp.AVG}
# Functional-collective namespaces whose unhandled ops are counted as passthrough.
_COLLECTIVE_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "_dtensor")
# Ops of those namespaces that move no data: not counted.
_QUIET = ("wait_tensor", "_wrap_tensor_autograd", "mesh_get_process_group")


def _resolve_group(group_name):
    """The ``ProcessGroup`` of an op's ``group_name`` argument (a name or a group)."""
    if isinstance(group_name, dist.ProcessGroup):
        return group_name
    return dist.distributed_c10d._resolve_process_group(group_name)


def _plain(t):
    """``t`` as a plain tensor the codec can read, or None when it is not one.

    An ``AsyncCollectiveTensor`` argument reaches a mode before its own
    ``__torch_dispatch__`` (modes go first): wait on it. Fake and meta tensors
    (tracing) are not data.
    """
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    if isinstance(t, AsyncCollectiveTensor):
        t = t.wait()
    if type(t) is not torch.Tensor or t.device.type == "meta":
        return None
    return t


class DTensorCompressionMode(TorchDispatchMode):
    """Run functional collectives through ``zipccl_fsdp.collectives`` while active.

    Use it through ``compress_dtensor_comms`` or ``enable_dtensor_compression``.
    Results are bitwise those of ``zipccl_fsdp.collectives`` (data movement is
    bit-exact; reductions sum in fp32 in rank order, which is torch's result
    bit for bit on two ranks).

    Example::

        >>> with compress_dtensor_comms(ZipCCLConfig(min_bytes=0)) as mode:
        ...     loss = tp_model(x).sum()
        ...     loss.backward()
        >>> mode.stats()["all_gather"]["wire_bytes"]
    """

    def __init__(self, config: ZipCCLConfig | None = None) -> None:
        super().__init__()
        if config is not None and not isinstance(config, ZipCCLConfig):
            raise TypeError(f"config must be a ZipCCLConfig or None, got {type(config).__name__}")
        # What the user tunes
        self.config = config or DEFAULT_CONFIG
        # Statistics
        self._stats = CommStats()
        self._passthrough: Counter = Counter()
        self._handlers = {
            _funcol.all_gather_into_tensor.default: self._all_gather,
            _funcol.reduce_scatter_tensor.default: self._reduce_scatter,
            _funcol.all_reduce.default: self._all_reduce,
            _funcol.all_to_all_single.default: self._all_to_all,
            torch.ops._dtensor.shard_dim_alltoall.default: self._shard_dim_alltoall,
        }

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict:
        """Counters: ``CommStats.snapshot()`` per kind, plus ``"passthrough"``:
        ``{op or "op:reason": calls}`` for functional collectives left to torch."""
        snap = self._stats.snapshot()
        snap["passthrough"] = dict(self._passthrough)
        return snap

    def reset_stats(self) -> None:
        """Zero every counter."""
        self._stats.reset()
        self._passthrough.clear()

    # --------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = self._handlers.get(func)
        if handler is not None:
            from torch.distributed._functional_collectives import _are_we_tracing
            if _are_we_tracing():
                reason = "tracing"
            else:
                result = handler(*args, **kwargs)
                if not isinstance(result, str):
                    return result
                reason = result
            self._passthrough[f"{func}:{reason}"] += 1
        elif func.namespace in _COLLECTIVE_NAMESPACES and \
                func._schema.name.split("::")[-1] not in _QUIET:
            self._passthrough[str(func)] += 1
        return func(*args, **kwargs)

    # Each handler returns the op's result, or a string saying why torch's own
    # kernel must run instead (checked before any communication, on values
    # that are equal on every rank, so no rank is left waiting).
    def _input(self, t):
        t = _plain(t)
        if t is None:
            return None, "not a plain tensor"
        if t.dtype not in _coll.CODED_DTYPES:
            return None, f"dtype {t.dtype}"
        return t.contiguous(), None

    def _all_gather(self, input, group_size, group_name):
        inp, why = self._input(input)
        if why:
            return why
        group = _resolve_group(group_name)
        if inp.dim() == 0 or group.size() != group_size:
            return "shape"
        out = inp.new_empty((group_size * inp.shape[0], *inp.shape[1:]))
        _coll.all_gather_single(out, inp, group=group, config=self.config, stats=self._stats)
        return out

    def _reduce_scatter(self, input, reduce_op, group_size, group_name):
        inp, why = self._input(input)
        if why:
            return why
        op = _REDUCE_OPS.get(reduce_op.lower())
        if op is None:
            return f"op {reduce_op}"
        group = _resolve_group(group_name)
        if inp.dim() == 0 or group.size() != group_size or inp.shape[0] % group_size:
            return "shape"
        out = inp.new_empty((inp.shape[0] // group_size, *inp.shape[1:]))
        _coll.reduce_scatter_single(out, inp, op=op, group=group, config=self.config,
                                    stats=self._stats)
        return out

    def _all_reduce(self, input, reduce_op, group_name):
        inp, why = self._input(input)
        if why:
            return why
        op = _REDUCE_OPS.get(reduce_op.lower())
        if op is None:
            return f"op {reduce_op}"
        out = inp.clone(memory_format=torch.contiguous_format)  # the op leaves its input alone
        _coll.all_reduce(out, op=op, group=_resolve_group(group_name), config=self.config,
                         stats=self._stats)
        return out

    def _all_to_all(self, input, output_split_sizes, input_split_sizes, group_name):
        inp, why = self._input(input)
        if why:
            return why
        if inp.dim() == 0:
            return "shape"
        out_splits = [int(s) for s in output_split_sizes]
        in_splits = [int(s) for s in input_split_sizes]
        out = inp.new_empty((sum(out_splits), *inp.shape[1:]))
        _coll.all_to_all_single(out, inp, out_splits, in_splits, group=_resolve_group(group_name),
                                config=self.config, stats=self._stats)
        return out

    def _shard_dim_alltoall(self, input, gather_dim, shard_dim, group_name):
        # Same result as the C++ op: chunk along shard_dim, exchange chunk r
        # with rank r, concatenate what arrives along gather_dim.
        inp, why = self._input(input)
        if why:
            return why
        group = _resolve_group(group_name)
        world = group.size()
        if inp.dim() == 0:
            return "shape"
        shard_dim %= inp.dim()
        gather_dim %= inp.dim()
        if inp.shape[shard_dim] % world:
            return "shape"
        length = inp.shape[shard_dim] // world
        send = torch.stack([inp.narrow(shard_dim, r * length, length) for r in range(world)])
        recv = torch.empty_like(send)
        _coll.all_to_all_single(recv.view(world, -1), send.view(world, -1), group=group,
                                config=self.config, stats=self._stats)
        return torch.cat(recv.unbind(0), dim=gather_dim)


@contextlib.contextmanager
def compress_dtensor_comms(config: ZipCCLConfig | None = None):
    """Compress DTensor and functional collectives issued inside the block.

    Yields the ``DTensorCompressionMode`` (read its ``stats()``). Run forward
    *and* backward inside the block: backward's collectives are issued by the
    autograd engine while ``backward()`` runs.

    Example::

        >>> with compress_dtensor_comms(ZipCCLConfig(codec="dense")) as mode:
        ...     model(x).sum().backward()
        >>> mode.stats()["reduce_scatter"]
    """
    mode = DTensorCompressionMode(config)
    with mode:
        yield mode


_enabled: DTensorCompressionMode | None = None  # the mode enable_dtensor_compression pushed


def enable_dtensor_compression(config: ZipCCLConfig | None = None) -> DTensorCompressionMode:
    """Compress DTensor and functional collectives of this thread until disabled.

    For training loops that cannot wrap forward and backward in one block
    (e.g. torchtitan's). Returns the mode (read its ``stats()``). Raises if
    already enabled.

    Example::

        >>> mode = enable_dtensor_compression(ZipCCLConfig(min_bytes=1 << 16))
        >>> train()
        >>> disable_dtensor_compression()
    """
    global _enabled
    if _enabled is not None:
        raise RuntimeError("DTensor compression is already enabled; call "
                           "disable_dtensor_compression() first")
    mode = DTensorCompressionMode(config)
    mode.__enter__()
    _enabled = mode
    return mode


def disable_dtensor_compression() -> None:
    """Undo ``enable_dtensor_compression`` (a no-op when it is not enabled).

    Dispatch modes form a stack: a mode entered after enabling and still
    active must be exited first, or this raises ``RuntimeError``.
    """
    global _enabled
    if _enabled is None:
        return
    if _get_current_dispatch_mode() is not _enabled:
        raise RuntimeError("another TorchDispatchMode was entered after "
                           "enable_dtensor_compression() and is still active; exit it first")
    _enabled.__exit__(None, None, None)
    _enabled = None
