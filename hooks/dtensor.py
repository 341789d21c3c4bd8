"""Compress DTensor and functional collectives: zipccl's kernels for torch's
functional-collective ops.

DTensor redistribution (Shard->Replicate, Partial->Shard, Partial->Replicate),
tensor/sequence parallelism and MoE token dispatch
(``torch.distributed._functional_collectives``) all lower to
``torch.ops._c10d_functional.*``; torch offers no registry to swap those. While
a ``DTensorCompression`` is active, this module registers kernels of its own
for eight of those ops, for CPU and CUDA tensors
(``torch.library.Library(namespace, "IMPL")``), which run
``zipccl_fsdp.collectives``:

=================================================  ===========================
``_c10d_functional.all_gather_into_tensor``        ``all_gather_single``
(and ``_out``)
``_c10d_functional.reduce_scatter_tensor`` (sum,   ``reduce_scatter_single``
avg; and ``_out``)
``_c10d_functional.all_reduce`` (sum, avg; and     ``all_reduce``
the in-place ``all_reduce_``)
``_c10d_functional.all_to_all_single``             ``all_to_all_single``
``_dtensor.shard_dim_alltoall`` (Shard(i)->        ``all_to_all_single``
Shard(j) on non-CPU meshes)
=================================================  ===========================

Why kernels: torch registers these ops' kernels for the
CompositeExplicitAutograd alias key and their autograd formulas in Python
(``torch.library.register_autograd``: the backward of an all-gather calls
``_c10d_functional.reduce_scatter_tensor``, and so on). A kernel registered
for the CPU and CUDA keys takes precedence over the composite one for those
devices, below autograd, so it runs for forward and backward alike and
autograd records the same graph. It runs for these ops only, on every thread
(autograd's backward threads included). A ``TorchDispatchMode`` would route
every op of its thread through Python, which slows tensor-parallel steps
measurably (``benchmarks/dtensor_overhead.py``; docs/benchmarks.md, "DTensor
overhead").

Torch's own kernels stay registered underneath: a call zipccl does not take
(integer dtypes such as MoE token counts, reduce ops other than sum/avg, odd
shapes, tracing, CUDA graph capture) runs torch's kernel
(``OpOverload._op_dk`` with the CompositeExplicitAutograd key) and is
counted per op and reason under ``"passthrough"`` in ``stats()``. Other
functional collectives (broadcast, coalesced variants, in-place broadcast)
are not intercepted at all. Deactivating the last ``DTensorCompression``
removes zipccl's kernels.

Under ``torch.compile`` inductor's generated code calls the in-place and
``_out`` variants (``all_reduce_``, ``all_gather_into_tensor_out``,
``reduce_scatter_tensor_out``), which is why those are intercepted too: a
compiled region's collectives are compressed like eager ones.

Activation is process-wide. Compressions stack: the most recent active one
handles the calls, and they must be exited in reverse order.

A real functional collective returns a tensor whose ``Work`` is registered for
a later ``_c10d_functional.wait_tensor`` (``AsyncCollectiveTensor`` issues it
on first use). zipccl's collectives return when done, so the kernels return
unregistered tensors; ``wait_tensor`` on a tensor with no registered work
returns it unchanged (``wait_tensor`` in
``torch/csrc/distributed/c10d/Functional.cpp`` pops the works the
``WorkRegistry`` holds for the tensor and waits on each, of which there are
none here; checked on torch 2.13 with gloo).
"""
from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch._C import DispatchKey
from torch.distributed import ReduceOp

from zipccl_fsdp import collectives as _coll
from zipccl_fsdp.config import DEFAULT_CONFIG, ZipCCLConfig
from zipccl_fsdp.stats import CommStats

__all__ = ["DTensorCompression", "compress_dtensor_comms",
           "enable_dtensor_compression", "disable_dtensor_compression"]

_REDUCE_OPS = {"sum": ReduceOp.SUM, "avg": ReduceOp.AVG}
_TORCH_KERNEL = DispatchKey.CompositeExplicitAutograd
_DEVICE_KEYS = ("CPU", "CUDA")
_OPS = {  # (namespace, op name) -> the DTensorCompression method that handles it
    ("_c10d_functional", "all_gather_into_tensor"): "_all_gather",
    ("_c10d_functional", "all_gather_into_tensor_out"): "_all_gather",
    ("_c10d_functional", "reduce_scatter_tensor"): "_reduce_scatter",
    ("_c10d_functional", "reduce_scatter_tensor_out"): "_reduce_scatter",
    ("_c10d_functional", "all_reduce"): "_all_reduce",
    ("_c10d_functional", "all_reduce_"): "_all_reduce_",
    ("_c10d_functional", "all_to_all_single"): "_all_to_all",
    ("_dtensor", "shard_dim_alltoall"): "_shard_dim_alltoall",
}


def _resolve_group(group_name):
    """The ``ProcessGroup`` of an op's ``group_name`` argument (a name or a group)."""
    if isinstance(group_name, dist.ProcessGroup):
        return group_name
    return dist.distributed_c10d._resolve_process_group(group_name)


def _plain(t):
    """``t`` as a plain tensor the codec can read, or None when it is not one.

    A kernel below the Python dispatch keys sees plain tensors; an
    ``AsyncCollectiveTensor`` (should one arrive) is waited on. Fake and meta
    tensors (tracing) are not data.
    """
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    if isinstance(t, AsyncCollectiveTensor):
        t = t.wait()
    if type(t) is not torch.Tensor or t.device.type == "meta":
        return None
    return t


class DTensorCompression:
    """Run functional collectives through ``zipccl_fsdp.collectives`` while active.

    Use it through ``compress_dtensor_comms`` or ``enable_dtensor_compression``
    (or as a context manager). Results are bitwise those of
    ``zipccl_fsdp.collectives`` (data movement is bit-exact; reductions sum in
    fp32 in rank order when compressed, which is torch's result bit for bit
    on two ranks).

    Example::

        >>> with compress_dtensor_comms(ZipCCLConfig(min_bytes=0)) as comp:
        ...     loss = tp_model(x).sum()
        ...     loss.backward()
        >>> comp.stats()["all_gather"]["wire_bytes"]
    """

    def __init__(self, config: ZipCCLConfig | None = None) -> None:
        if config is not None and not isinstance(config, ZipCCLConfig):
            raise TypeError(f"config must be a ZipCCLConfig or None, got {type(config).__name__}")
        # What the user tunes
        self.config = config or DEFAULT_CONFIG
        # Statistics, and with them (``_stats.runtime``) the state the
        # collectives learn (zipccl_fsdp/runtime.py)
        self._stats = CommStats()
        self._passthrough: Counter = Counter()

    # ------------------------------------------------------------------ stats
    @property
    def runtime(self):
        """What this compression's calls have learned (``zipccl_fsdp.runtime.Runtime``)."""
        return self._stats.runtime

    def stats(self) -> dict:
        """Counters: ``CommStats.snapshot()`` per kind, plus ``"passthrough"``:
        ``{"op:reason": calls}`` for intercepted calls left to torch's kernel."""
        snap = self._stats.snapshot()
        snap["passthrough"] = dict(self._passthrough)
        return snap

    def reset_stats(self) -> None:
        """Zero every counter."""
        self._stats.reset()
        self._passthrough.clear()

    # ------------------------------------------------------------- activation
    def __enter__(self) -> "DTensorCompression":
        _activate(self)
        return self

    def __exit__(self, *exc) -> None:
        _deactivate(self)

    # ------------------------------------------------------------------ calls
    def _call(self, op, method: str, args: tuple, kwargs: dict):
        """One call of ``op`` (an OpOverload) on this rank: zipccl's collective,
        or torch's kernel with the reason counted."""
        from torch.distributed._functional_collectives import _are_we_tracing
        if _are_we_tracing():
            reason = "tracing"
        elif _coll._capturing(args[0]):  # torch.compile(mode="reduce-overhead")
            reason = "cuda graph capture"
        else:
            result = getattr(self, method)(*args, **kwargs)
            if not isinstance(result, str):
                return result
            reason = result
        self._passthrough[f"{op}:{reason}"] += 1
        return op._op_dk(_TORCH_KERNEL, *args, **kwargs)

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

    def _all_gather(self, input, group_size, group_name, *, out=None):
        inp, why = self._input(input)
        if why:
            return why
        group = _resolve_group(group_name)
        if inp.dim() == 0 or group.size() != group_size:
            return "shape"
        shape = (group_size * inp.shape[0], *inp.shape[1:])
        if out is None:
            out = inp.new_empty(shape)
        elif _plain(out) is not out or out.shape != shape or not out.is_contiguous():
            return "out"
        _coll.all_gather_single(out, inp, group=group, config=self.config, stats=self._stats)
        return out

    def _reduce_scatter(self, input, reduce_op, group_size, group_name, *, out=None):
        inp, why = self._input(input)
        if why:
            return why
        op = _REDUCE_OPS.get(reduce_op.lower())
        if op is None:
            return f"op {reduce_op}"
        group = _resolve_group(group_name)
        if inp.dim() == 0 or group.size() != group_size or inp.shape[0] % group_size:
            return "shape"
        shape = (inp.shape[0] // group_size, *inp.shape[1:])
        if out is None:
            out = inp.new_empty(shape)
        elif _plain(out) is not out or out.shape != shape or not out.is_contiguous():
            return "out"
        _coll.reduce_scatter_single(out, inp, op=op, group=group, config=self.config,
                                    stats=self._stats)
        return out

    def _all_reduce(self, input, reduce_op, group_name, *, in_place=False):
        inp, why = self._input(input)
        if why:
            return why
        op = _REDUCE_OPS.get(reduce_op.lower())
        if op is None:
            return f"op {reduce_op}"
        if in_place:
            if inp is not input:  # not contiguous: the copy would not be the input
                return "shape"
            out = input
        else:
            out = inp.clone(memory_format=torch.contiguous_format)  # leaves its input alone
        _coll.all_reduce(out, op=op, group=_resolve_group(group_name), config=self.config,
                         stats=self._stats)
        return out

    def _all_reduce_(self, input, reduce_op, group_name):
        return self._all_reduce(input, reduce_op, group_name, in_place=True)

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


# --------------------------------------------------------------------------
# Activation: zipccl's kernels are registered while any compression is active.
# --------------------------------------------------------------------------
_ACTIVE: list[DTensorCompression] = []
"""Active compressions, oldest first; the last one handles the calls."""
_LIBRARIES: list = []
"""The ``torch.library.Library`` objects holding zipccl's kernels while active."""
_LOCK = threading.Lock()


def _kernel(op, method: str):
    """The kernel of ``op``: the newest active compression's handler."""
    def kernel(*args, **kwargs):
        active = _ACTIVE[-1] if _ACTIVE else None
        if active is None:  # raced with the last deactivation: torch's own
            return op._op_dk(_TORCH_KERNEL, *args, **kwargs)
        return active._call(op, method, args, kwargs)
    return kernel


def _activate(comp: DTensorCompression) -> None:
    with _LOCK:
        if any(c is comp for c in _ACTIVE):
            raise RuntimeError("this DTensorCompression is already active")
        if not _ACTIVE:
            for namespace in sorted({ns for ns, _ in _OPS}):
                lib = torch.library.Library(namespace, "IMPL")
                _LIBRARIES.append(lib)
                for (ns, name), method in _OPS.items():
                    if ns != namespace:
                        continue
                    op = getattr(getattr(torch.ops, ns), name).default
                    for key in _DEVICE_KEYS:
                        lib.impl(name, _kernel(op, method), key)
        _ACTIVE.append(comp)


def _deactivate(comp: DTensorCompression) -> None:
    with _LOCK:
        if not _ACTIVE or _ACTIVE[-1] is not comp:
            if any(c is comp for c in _ACTIVE):
                raise RuntimeError("another DTensor compression was entered after this one "
                                   "and is still active; exit it first")
            return
        _ACTIVE.pop()
        if not _ACTIVE:
            while _LIBRARIES:
                _LIBRARIES.pop()._destroy()


@contextlib.contextmanager
def compress_dtensor_comms(config: ZipCCLConfig | None = None) -> Iterator[DTensorCompression]:
    """Compress DTensor and functional collectives, on every thread, inside the block.

    Inside the block torch's functional collectives (``all_gather_into_tensor``,
    ``reduce_scatter_tensor``, ``all_reduce``, ``all_to_all_single`` of
    ``torch.distributed._functional_collectives``, which DTensor's
    redistributions call, in forward and backward) run zipccl's compressed
    collectives; calls zipccl does not take (other dtypes and ops) stay
    torch's. Blocks nest; the innermost one counts the calls.

    Args:
        config (ZipCCLConfig, optional): how to compress; None is
            ``DEFAULT_CONFIG``.

    Yields:
        DTensorCompression: the active compression; read its ``stats()``.

    Raises:
        TypeError: ``config`` is not a ``ZipCCLConfig`` or None.
        RuntimeError: the same ``DTensorCompression`` entered twice, or a
            block left while one entered after it is still active.

    Example::

        >>> with compress_dtensor_comms(ZipCCLConfig(codec="dense")) as comp:
        ...     model(x).sum().backward()
        >>> comp.stats()["reduce_scatter"]
    """
    with DTensorCompression(config) as comp:
        yield comp


_enabled: DTensorCompression | None = None  # what enable_dtensor_compression activated


def enable_dtensor_compression(config: ZipCCLConfig | None = None) -> DTensorCompression:
    """Compress DTensor and functional collectives, on every thread, until disabled.

    For training loops that cannot wrap forward and backward in one block
    (e.g. torchtitan's). Returns the ``DTensorCompression`` (read its
    ``stats()``). Raises if already enabled.

    Example::

        >>> comp = enable_dtensor_compression(ZipCCLConfig(min_bytes=1 << 16))
        >>> train()
        >>> disable_dtensor_compression()
    """
    global _enabled
    if _enabled is not None:
        raise RuntimeError("DTensor compression is already enabled; call "
                           "disable_dtensor_compression() first")
    comp = DTensorCompression(config)
    _activate(comp)
    _enabled = comp
    return comp


def disable_dtensor_compression() -> None:
    """Undo ``enable_dtensor_compression`` (a no-op when it is not enabled).

    Compressions stack: one entered after enabling and still active must be
    exited first, or this raises ``RuntimeError``.
    """
    global _enabled
    if _enabled is None:
        return
    _deactivate(_enabled)
    _enabled = None
