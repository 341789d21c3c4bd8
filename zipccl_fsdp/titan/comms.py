"""Install FSDP2 comms on torchtitan's model parts, after ``fully_shard``.

torchtitan calls ``ModelSpec.post_optimizer_build_fn(optimizers, model_parts,
parallel_dims)`` once the model is sharded and the optimizer built;
:func:`with_fsdp_comms` chains :func:`install_fsdp_comms` into a model spec.

With ``compress=True`` every model part gets
``zipccl_fsdp.register_comm_hook(model_part, hook)`` (one hook, shared by all
parts), and the hook's ``stats()`` go to TensorBoard as
``zipccl/<kind>/<name>`` (kind: all_gather, reduce_scatter, ...; per logged
step, see :class:`~zipccl_fsdp.tensorboard_stats.StepDeltas`). If this build of
zipccl_fsdp does not export ``register_comm_hook``, a warning is logged and
the run keeps FSDP2's default comms.

Run settings from ``zipccl titan``: the launcher puts a recipe's ``[zipccl]``
table and its own options (``--no-compress``, ``--capture N``) into the
environment variable ``ZIPCCL_TITAN_SETTINGS`` as JSON
(:class:`RunSettings`), which every rank reads here. Without it (plain
``torchrun -m torchtitan.train``) the default hook ``zipccl_hook`` is used,
with telemetry and without capture. With it:

- ``compress`` false: FSDP2's own comms (the baseline);
- ``config``: the ``ZipCCLConfig`` of a new ``ZipCCLHook``;
- ``dtensor``: DTensor and functional collectives (tensor parallelism, MoE
  token dispatch with expert parallelism) also go through zipccl, with
  ``zipccl_fsdp.enable_dtensor_compression(config)`` (process-wide);
- ``telemetry`` false: no ``zipccl/<kind>/...`` tags;
- ``capture`` N: the inputs of the first N all-gathers and reduce-scatters of
  each rank are saved to ``<capture_dir>/capture_rank<R>.safetensors``
  (:class:`zipccl_fsdp.capture.Capture`; step = torchtitan's training step),
  rewritten after each optimizer step that added to it. The recording wraps
  the hook's FSDP2 comm objects before they are installed, so neither the
  hook nor FSDP2 changes.

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
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from ..stats import KINDS
from ..tensorboard_stats import StepDeltas
from .metrics import attach_scalar_source

logger = logging.getLogger(__name__)


SETTINGS_ENV = "ZIPCCL_TITAN_SETTINGS"
"""Environment variable holding :class:`RunSettings` as JSON."""

COMM_KINDS = KINDS


@dataclass(frozen=True)
class RunSettings:
    """What ``zipccl titan`` asks of the ranks (sent as JSON in ``SETTINGS_ENV``)."""

    compress: bool = True
    """False: FSDP2's own comms, whatever the config function binds."""
    config: dict = field(default_factory=dict)
    """``ZipCCLConfig`` keyword arguments."""
    dtensor: bool = False
    """Also compress DTensor / functional collectives (TP, MoE all-to-all)."""
    telemetry: bool = True
    """Log ``zipccl/<kind>/...`` scalars to TensorBoard."""
    capture: int = 0
    """Record the inputs of the first N collectives of each kind."""
    capture_dir: str = "."
    """Folder of ``capture_rank<R>.safetensors``."""

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_env(cls) -> "RunSettings | None":
        """The settings of this process, or None when not launched by ``zipccl titan``."""
        text = os.environ.get(SETTINGS_ENV)
        if not text:
            return None
        return cls(**json.loads(text))

    def zipccl_config(self):
        from zipccl_fsdp.config import ZipCCLConfig

        return ZipCCLConfig(**self.config)


def install_fsdp_comms(
    optimizers: Any,
    model_parts: Sequence[nn.Module],
    parallel_dims: Any,
    *,
    compress: bool,
) -> bool:
    """Register zipccl's comm hook on each model part when asked and available.

    A ``post_optimizer_build_fn`` (bind ``compress`` with ``functools.partial``).
    ``RunSettings`` from the environment refine ``compress`` and the hook's
    config (see the module docstring). Returns whether zipccl compresses
    anything (the FSDP2 hook or the DTensor compression). Also attaches the scalar
    ``zipccl/config/compressed`` (1.0 or 0.0) to the TensorBoard metrics, so
    runs can be told apart side by side.
    """
    settings = RunSettings.from_env()
    if settings is not None:
        compress = compress and settings.compress
    hooked_fsdp, installed = (
        _install_zipccl(model_parts, optimizers, settings) if compress else (False, False)
    )
    if not hooked_fsdp and _backend_lacks_premul_sum():
        force_sum_reductions(model_parts)
    flag = {"compressed": float(installed)}

    def config_scalars(step: int) -> dict[str, float]:
        return flag

    for part in model_parts:
        attach_scalar_source(part, "config", config_scalars)
    return installed


def _install_zipccl(
    model_parts: Sequence[nn.Module], optimizers: Any, settings: RunSettings | None
) -> tuple[bool, bool]:
    """Install what ``settings`` ask for; return (FSDP2 hook installed, anything installed).

    The FSDP2 hook goes on when all-gathers or reduce-scatters are compressed
    (always without settings); the DTensor compression when ``settings.dtensor``.
    """
    import zipccl_fsdp

    register = getattr(zipccl_fsdp, "register_comm_hook", None)
    if register is None:
        logger.warning(
            "zipccl_fsdp has no register_comm_hook in this build: training "
            "with FSDP2's default (uncompressed) comms"
        )
        return False, False
    # register_comm_hook(model, hook=None) installs the default hook
    # (zipccl_fsdp.zipccl_hook) and returns it; the later parts share it.
    hook, config = None, None
    if settings is not None:
        config = settings.zipccl_config()
        hook_cls = getattr(zipccl_fsdp, "ZipCCLHook", None) or type(zipccl_fsdp.zipccl_hook)
        hook = hook_cls(config)
    stats_fns = []
    hook_fsdp = config is None or config.compress_all_gather or config.compress_reduce_scatter
    if hook_fsdp:
        if settings is not None and settings.capture:
            _record_fsdp_comms(hook, settings, optimizers)
        for part in model_parts:
            hook = register(part, hook)
        if callable(getattr(hook, "stats", None)):
            stats_fns.append(hook.stats)
    if settings is not None and settings.dtensor:
        enable = getattr(zipccl_fsdp, "enable_dtensor_compression", None)
        if enable is None:
            logger.warning(
                "zipccl_fsdp has no enable_dtensor_compression in this build: "
                "DTensor / functional collectives stay uncompressed"
            )
        else:
            # Process-wide (zipccl's kernels for the functional collectives);
            # the trainer never disables it.
            stats_fns.append(enable(config).stats)
    if stats_fns and (settings is None or settings.telemetry):
        stats = functools.partial(_summed_stats, stats_fns)
        sources = [(kind, StepDeltas(stats, kind)) for kind in COMM_KINDS]
        for part in model_parts:
            for kind, source in sources:
                attach_scalar_source(part, kind, source)
    return hook_fsdp, bool(stats_fns) or hook_fsdp


def _summed_stats(stats_fns: Sequence[Callable[[], Mapping]]) -> dict[str, dict[str, float]]:
    """Per-kind counters of several owners (the FSDP2 hook, the DTensor compression) added up."""
    out: dict[str, dict[str, float]] = {}
    for fn in stats_fns:
        for kind, fields in fn().items():
            if kind not in COMM_KINDS:  # e.g. the DTensor compression's "passthrough"
                continue
            into = out.setdefault(kind, {})
            for name, value in fields.items():
                into[name] = into.get(name, 0) + value
    return out


class _CaptureRecorder:
    """Feeds a ``Capture`` from the comms and saves it after optimizer steps."""

    def __init__(self, per_kind: int, path: str) -> None:
        from torchtitan.observability import structured_logger

        from zipccl_fsdp.capture import Capture

        rank = dist.get_rank() if dist.is_initialized() else 0
        self.capture = Capture(per_kind, rank=rank)
        self.path = path
        self._step = structured_logger.get_step
        self._saved = 0

    def record(self, kind: str, tensor: torch.Tensor) -> None:
        if self.capture.wants(kind):
            self.capture.step = self._step() or 0
            self.capture.record(kind, tensor)

    def save_if_grown(self, *_: Any) -> None:
        if len(self.capture) > self._saved:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self.capture.save(self.path)
            self._saved = len(self.capture)
            logger.info(f"zipccl capture: {self._saved} tensors in {self.path}")


class _RecordingAllGather(AllGather):
    """An FSDP2 all-gather comm that records its input, then runs ``comm``."""

    def __init__(self, comm: AllGather, recorder: _CaptureRecorder) -> None:
        self.comm, self.recorder = comm, recorder

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.comm.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        self.recorder.record("all_gather", input_tensor)
        return self.comm(output_tensor=output_tensor, input_tensor=input_tensor,
                         group=group, async_op=async_op)


class _RecordingReduceScatter(ReduceScatter):
    """An FSDP2 reduce-scatter comm that records its input, then runs ``comm``."""

    def __init__(self, comm: ReduceScatter, recorder: _CaptureRecorder) -> None:
        self.comm, self.recorder = comm, recorder

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.comm.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        self.recorder.record("reduce_scatter", input_tensor)
        return self.comm(output_tensor=output_tensor, input_tensor=input_tensor,
                         group=group, op=op, async_op=async_op)


def _record_fsdp_comms(hook: Any, settings: RunSettings, optimizers: Any) -> None:
    """Make ``hook``'s FSDP2 comms record their inputs (before it is installed)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    path = os.path.join(settings.capture_dir, f"capture_rank{rank}.safetensors")
    recorder = _CaptureRecorder(settings.capture, path)
    hook.all_gather_comm = _RecordingAllGather(hook.all_gather_comm, recorder)
    hook.reduce_scatter_comm = _RecordingReduceScatter(hook.reduce_scatter_comm, recorder)
    # torchtitan's OptimizersContainer is a torch Optimizer: its step hooks run
    # once per training step, after the step's last collective.
    optimizers.register_step_post_hook(recorder.save_if_grown)


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
