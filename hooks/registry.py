"""``ZipCCLHook``, the default ``zipccl_hook`` and ``register_comm_hook``.

A hook object is what a user registers on a model: a ``ZipCCLConfig``, the
comm implementations each integration needs (FSDP2's ``AllGather`` and
``ReduceScatter`` for now) and its own statistics. ``register_comm_hook``
finds the integration for the model's kind in ``_INTEGRATIONS`` and lets it
install the hook; ``hook.remove(model)`` undoes it the same way.

Adding an integration (DDP lives in ``hooks/ddp.py``): write
``matches(model) -> bool``, ``install(model, hook)`` and
``remove(model, hook)`` there and append an ``Integration`` to
``_INTEGRATIONS`` below. Nothing else changes.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable

from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.stats import CommStats

from . import ddp, fsdp2


class ZipCCLHook:
    """Compressed comms for a model, with the statistics of every call they make.

    Register with ``register_comm_hook(model, hook)`` or, on an FSDP2 root,
    ``model.register_comm_hook(hook)``; ``hook.remove(model)`` gives the
    model torch's comms back. One hook may serve several models; its
    statistics then add up. For DDP the hook is also the comm hook itself:
    ``ddp_model.register_comm_hook(None, hook)`` calls
    ``hook(state, bucket) -> Future[Tensor]`` per gradient bucket.

    Args:
        config (ZipCCLConfig, optional): how its calls compress; None is
            ``ZipCCLConfig()``. Only the config is pickled with the hook;
            what its calls learn (agreement, calibration, raw lanes) lives in
            its ``comm_stats.runtime`` and starts afresh in a copy.

    Raises:
        TypeError: ``config`` is not a ``ZipCCLConfig``.

    Example::

        >>> hook = ZipCCLHook(ZipCCLConfig(codec="dense"))
        >>> model.register_comm_hook(hook)
        >>> train(model)
        >>> s = hook.stats()["all_gather"]
        >>> print(s["wire_bytes"] / s["raw_bytes"])
    """

    def __init__(self, config: ZipCCLConfig | None = None) -> None:
        # What the user tunes.
        if config is not None and not isinstance(config, ZipCCLConfig):
            raise TypeError(f"ZipCCLHook takes a ZipCCLConfig, got {type(config).__name__}")
        self.config = config if config is not None else ZipCCLConfig()
        # Comm implementations handed to the integrations.
        self.all_gather_comm = fsdp2.ZipCCLAllGather(self)
        self.reduce_scatter_comm = fsdp2.ZipCCLReduceScatter(self)
        # Internal state: what each FSDP2 module had before (restored by remove()).
        self._fsdp2_saved: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # Statistics, and with them (``comm_stats.runtime``) the state the
        # collectives learn: agreement checks, the policy's calibration and
        # ratios, raw lanes (zipccl_fsdp/runtime.py).
        self.comm_stats = CommStats()
        # DDP's register_comm_hook reads hook.__qualname__ (for its logger,
        # torch/nn/parallel/distributed.py register_comm_hook); a plain instance has none.
        self.__name__ = "zipccl_hook"
        self.__qualname__ = "zipccl_hook"

    # Pickled with a model (DDP keeps its comm hooks in its pickle state, and
    # torch.save of an FSDP2 module holds its comms): the settings only. Like
    # torch's PowerSGDState, which leaves its process group out, the runtime
    # state (statistics, the collectives' runtime, what each FSDP2 module had
    # before) starts afresh.
    def __getstate__(self) -> dict:
        return {"config": self.config}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["config"])

    def __call__(self, state, bucket):
        """The DDP comm hook protocol, so ``ddp_model.register_comm_hook(state, hook)``
        works; see ``hooks/ddp.py`` (``bucket`` stays unannotated: DDP compares
        annotations to ``dist.GradBucket``)."""
        return ddp.ddp_comm_hook(state, bucket, config=self.config, stats=self.comm_stats)

    @property
    def runtime(self):
        """What this hook's calls have learned (``zipccl_fsdp.runtime.Runtime``):
        its own, never shared with another hook, whatever their configs."""
        return self.comm_stats.runtime

    def stats(self) -> dict[str, dict[str, float]]:
        """``{kind: {"calls", "compressed_calls", "raw_bytes", "wire_bytes", "encode_s",
        "decode_s", "comm_s", "size_exchange_s", "reduce_s", ...}}`` for kind in
        all_gather, reduce_scatter, all_reduce, all_to_all (see zipccl_fsdp/stats.py)."""
        return self.comm_stats.snapshot()

    def calibration(self) -> dict:
        """What the adaptive policy measured for this hook's calls, or took from
        the config (``calibration.Calibration.report``): ``{"links": {group key:
        LinkSpeed}, "speeds": {(group key, dtype, device type): {codec:
        CodecSpeed}}, "probes": {(group key, dtype, device type): {...,
        "slowdown": k}}}``; empty before the first decision."""
        policy = self.runtime.state(self.config).policy
        if policy is None:
            return {"links": {}, "speeds": {}, "probes": {}}
        return policy.calibration.report()

    def reset_stats(self) -> None:
        """Zero this hook's counters."""
        self.comm_stats.reset()

    def register(self, model) -> "ZipCCLHook":
        """Same as ``register_comm_hook(model, self)``."""
        return register_comm_hook(model, self)

    def remove(self, model) -> None:
        """Give ``model`` torch's comms back where this hook had replaced them."""
        _integration_for(model, "remove").remove(model, self)

    def __repr__(self) -> str:
        return f"ZipCCLHook({self.config!r})"


@dataclass(frozen=True)
class Integration:
    """How to hook one kind of model."""

    name: str
    """What the user reads in errors, e.g. "FSDP2 (fully_shard)"."""
    matches: Callable[[object], bool]
    install: Callable[[object, ZipCCLHook], object]
    remove: Callable[[object, ZipCCLHook], object]


# First match wins.
_INTEGRATIONS: list[Integration] = [
    Integration("FSDP2 (a module fully_shard was applied to, the root of the model)",
                fsdp2.is_fsdp2_model, fsdp2.install, fsdp2.remove),
    Integration("DDP (DistributedDataParallel)", ddp.is_ddp_model, ddp.install, ddp.remove),
]


def _integration_for(model, verb: str) -> Integration:
    for integration in _INTEGRATIONS:
        if integration.matches(model):
            return integration
    supported = "; ".join(i.name for i in _INTEGRATIONS)
    raise TypeError(f"zipccl cannot {verb} comm hooks on a {type(model).__name__}; "
                    f"supported: {supported}")


zipccl_hook = ZipCCLHook()
"""The default hook: ``ZipCCLConfig()`` defaults."""


def register_comm_hook(model, hook: ZipCCLHook | None = None) -> ZipCCLHook:
    """Install ``hook`` (default ``zipccl_hook``) on ``model``; return the hook.

    Dispatches on the model's kind; anything unsupported raises ``TypeError``
    naming what is.

    Example::

        >>> fully_shard(model)
        >>> register_comm_hook(model)  # == model.register_comm_hook(zipccl_hook)
    """
    hook = zipccl_hook if hook is None else hook
    if not isinstance(hook, ZipCCLHook):
        raise TypeError(f"register_comm_hook takes a ZipCCLHook, got {type(hook).__name__}")
    _integration_for(model, "register").install(model, hook)
    return hook


def _fsdp_register_comm_hook(self, hook=None):
    """Install zipccl's compressed comms on this FSDP2 module and every FSDP2
    module under it; ``hook`` defaults to ``zipccl_hook``. Returns the hook.

    Example::

        >>> for block in model.layers:
        ...     fully_shard(block)
        >>> fully_shard(model)
        >>> model.register_comm_hook(zipccl_hook)
        >>> ...  # train; zipccl_hook.stats() shows the bytes saved
        >>> zipccl_hook.remove(model)
    """
    return register_comm_hook(self, hook)


fsdp2.FSDPModule.register_comm_hook = _fsdp_register_comm_hook
