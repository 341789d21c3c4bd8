"""Install FSDP2 comms on torchtitan's model parts, after ``fully_shard``.

torchtitan calls ``ModelSpec.post_optimizer_build_fn(optimizers, model_parts,
parallel_dims)`` once the model is sharded and the optimizer built;
:func:`with_fsdp_comms` chains :func:`install_fsdp_comms` into a model spec.

With ``compress=True`` every model part gets
``zipccl_fsdp.register_comm_hook(model_part, hook)`` (the default hook,
shared by all parts), and the hook's ``stats()`` go to TensorBoard as
``zipccl/<kind>/<counter>`` (kind: all_gather, reduce_scatter, ...; the
counters are cumulative; ``ratio`` is raw / wire bytes). If this build of
zipccl_fsdp does not export ``register_comm_hook``, a warning is logged and
the run keeps FSDP2's default comms.

gloo and PREMUL_SUM: torchtitan sets a gradient divide factor of 1.0 on every
FSDP module (it normalises the loss by the global token count itself), and
FSDP2 turns that factor into ``ReduceOp.PREMUL_SUM(1.0)`` for the
reduce-scatter, which only NCCL implements; gloo raises. Of the two ways out
(a custom FSDP2 reduce-scatter that implements PREMUL_SUM, or a setting that
avoids it) we take the setting: FSDP2's
``set_force_sum_reduction_for_comms(True)`` (pytorch/pytorch#155915) makes the
reduce-scatter a plain SUM followed by a division by the factor, skipped
when it is 1.0. Multiplying by 1.0 is exact, so this is the same reduction
as PREMUL_SUM(1.0), and the baseline keeps FSDP2's own reduce-scatter rather
than code of ours.
torchtitan's only switch that sets it, ``parallelism.enable_fsdp_symm_mem``,
also needs CUDA symmetric memory (see also pytorch/torchtitan#2332 for the
same PREMUL_SUM gap on XPU). It is applied only where no zipccl hook was
installed (a zipccl reduce-scatter implements PREMUL_SUM itself) and only on
gloo; on NCCL nothing changes.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from .metrics import attach_scalar_source

logger = logging.getLogger(__name__)


def install_fsdp_comms(
    optimizers: Any,
    model_parts: Sequence[nn.Module],
    parallel_dims: Any,
    *,
    compress: bool,
) -> bool:
    """Register zipccl's comm hook on each model part when asked and available.

    A ``post_optimizer_build_fn`` (bind ``compress`` with ``functools.partial``).
    Returns whether the zipccl hook was installed. Also attaches the scalar
    ``zipccl/config/compressed`` (1.0 or 0.0) to the TensorBoard metrics, so
    runs can be told apart side by side.
    """
    installed = compress and _register_zipccl_hook(model_parts)
    if not installed and _backend_lacks_premul_sum():
        force_sum_reductions(model_parts)
    flag = {"compressed": float(installed)}

    def config_scalars(step: int) -> dict[str, float]:
        return flag

    for part in model_parts:
        attach_scalar_source(part, "config", config_scalars)
    return installed


def _register_zipccl_hook(model_parts: Sequence[nn.Module]) -> bool:
    import zipccl_fsdp

    register = getattr(zipccl_fsdp, "register_comm_hook", None)
    if register is None:
        logger.warning(
            "zipccl_fsdp has no register_comm_hook in this build: training "
            "with FSDP2's default (uncompressed) comms"
        )
        return False
    # register_comm_hook(model, hook=None) installs the default hook
    # (zipccl_fsdp.zipccl_hook) and returns it; the later parts share it.
    hook = None
    for part in model_parts:
        hook = register(part, hook)
    stats = getattr(hook, "stats", None)
    if callable(stats):
        sources = [(kind, _KindStats(stats, kind)) for kind in stats()]
        for part in model_parts:
            for kind, source in sources:
                attach_scalar_source(part, kind, source)
    return True


class _KindStats:
    """Scalar source: one kind of a hook's ``stats()`` (cumulative counters).

    Logs the counters of ``stats()[kind]`` and ``ratio`` = raw / wire bytes
    once the kind has carried data; nothing before its first call.
    """

    def __init__(self, stats: Callable[[], Mapping[str, Mapping[str, float]]], kind: str):
        self.stats, self.kind = stats, kind

    def __call__(self, step: int) -> dict[str, float]:
        fields = dict(self.stats()[self.kind])
        if not fields.get("calls"):
            return {}
        if fields.get("wire_bytes"):
            fields["ratio"] = fields["raw_bytes"] / fields["wire_bytes"]
        return fields


def _backend_lacks_premul_sum() -> bool:
    return dist.is_initialized() and dist.get_backend() == dist.Backend.GLOO


def force_sum_reductions(model_parts: Sequence[nn.Module]) -> int:
    """Make FSDP2 reduce with SUM only (plus a separate scale); return #modules.

    ``set_force_sum_reduction_for_comms`` is per FSDP module: setting it on
    the root does not reach the children, so walk them all.
    """
    count = 0
    for part in model_parts:
        for module in part.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
                count += 1
    return count


def with_fsdp_comms(model_spec: Any, *, compress: bool) -> Any:
    """Return a copy of ``model_spec`` whose post-optimizer step installs comms.

    An existing ``post_optimizer_build_fn`` runs first.
    """
    previous: Callable[..., None] | None = model_spec.post_optimizer_build_fn
    install = functools.partial(install_fsdp_comms, compress=compress)

    def post_optimizer_build_fn(optimizers, model_parts, parallel_dims) -> None:
        if previous is not None:
            previous(optimizers, model_parts, parallel_dims)
        install(optimizers, model_parts, parallel_dims)

    return dataclasses.replace(model_spec, post_optimizer_build_fn=post_optimizer_build_fn)
