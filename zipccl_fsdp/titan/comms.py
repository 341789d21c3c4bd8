"""Install FSDP2 comms on torchtitan's model parts, after ``fully_shard``.

torchtitan calls ``ModelSpec.post_optimizer_build_fn(optimizers, model_parts,
parallel_dims)`` once the model is sharded and the optimizer built;
:func:`with_fsdp_comms` chains :func:`install_fsdp_comms` into a model spec.

With ``compress=True`` every model part gets
``zipccl_fsdp.register_comm_hook(model_part, hook)`` (one hook, shared by all
parts), and the hook's ``stats()`` go to TensorBoard as
``zipccl/<kind>/<name>`` (kind: all_gather, reduce_scatter, ...; per logged
step, see :class:`~zipccl_fsdp.tensorboard_stats.StepDeltas`).

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
- ``capture`` N: the inputs of the first N calls of each collective kind of
  each rank are saved to ``<capture_dir>/capture_rank<R>.safetensors``
  (:class:`zipccl_fsdp.capture.Capture`; step = torchtitan's training step),
  rewritten after each optimizer step that added to it; with
  ``capture_steps``, the first N of each kind at each of those steps, one
  file per step (``capture_rank<R>_step<S>.safetensors``). Kinds: FSDP2's
  ``all_gather``, ``reduce_scatter`` and HSDP's replicate ``all_reduce``
  (the recording wraps the hook's comm objects before they are installed,
  so neither the hook nor FSDP2 changes), and ``dtensor_<kind>`` for the
  functional collectives of tensor parallelism and MoE token dispatch
  (``dtensor = true``).

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
from ..tensorboard_stats import StepDeltas, calibration_scalars
from .metrics import attach_scalar_source

logger = logging.getLogger(__name__)


SETTINGS_ENV = "ZIPCCL_TITAN_SETTINGS"
"""Environment variable holding :class:`RunSettings` as JSON."""


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
    capture_steps: tuple = ()
    """Training steps to capture at (N of each kind per step, one file per step:
    ``capture_rank<R>_step<S>.safetensors``); empty: the first N of the run."""

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_env(cls) -> "RunSettings | None":
        """The settings of this process, or None when not launched by ``zipccl titan``."""
        text = os.environ.get(SETTINGS_ENV)
        if not text:
            return None
        fields = json.loads(text)
        fields["capture_steps"] = tuple(fields.get("capture_steps", ()))
        return cls(**fields)

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
    """Register zipccl's comm hook on each model part when asked.

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
    logger.info("zipccl: %s", installed_line(settings, compress, hooked_fsdp, installed))
    flag = {"compressed": float(installed)}

    def config_scalars(step: int) -> dict[str, float]:
        return flag

    for part in model_parts:
        attach_scalar_source(part, "config", config_scalars)
    return installed


def installed_line(settings: RunSettings | None, compress: bool, hooked_fsdp: bool,
                   installed: bool) -> str:
    """One line on what ``install_fsdp_comms`` installed."""
    if not installed:
        return ("comms not installed (--no-compress): FSDP2's own" if not compress
                else "comms not installed: the settings compress no collective")
    from zipccl_fsdp.config import DEFAULT_CONFIG

    config = settings.zipccl_config() if settings is not None else DEFAULT_CONFIG
    kinds = [k for k in KINDS if getattr(config, f"compress_{k}")]
    what = []
    if hooked_fsdp:
        what.append("FSDP2 comm hook")
    if settings is not None and settings.dtensor:
        what.append("DTensor collectives")
    given = {k: v for k, v in (settings.config if settings is not None else {}).items()
             if not k.startswith("compress_")}
    return (f"compressed comms installed ({', '.join(what)}): {', '.join(kinds)}; "
            + (", ".join(f"{k}={v}" for k, v in sorted(given.items())) or "default config"))


def _install_zipccl(
    model_parts: Sequence[nn.Module], optimizers: Any, settings: RunSettings | None
) -> tuple[bool, bool]:
    """Install what ``settings`` ask for; return (FSDP2 hook installed, anything installed).

    The FSDP2 hook goes on when all-gathers or reduce-scatters are compressed
    (always without settings); the DTensor compression when ``settings.dtensor``.
    """
    import zipccl_fsdp

    # register_comm_hook(model, hook=None) installs the default hook
    # (zipccl_fsdp.zipccl_hook) and returns it; the later parts share it.
    hook, config = None, None
    if settings is not None:
        config = settings.zipccl_config()
        hook = zipccl_fsdp.ZipCCLHook(config)
    stats_fns = []
    # The FSDP2 hook carries all-gathers, reduce-scatters and (HSDP) the
    # replicate all-reduce.
    hook_fsdp = config is None or (config.compress_all_gather or config.compress_reduce_scatter
                                   or config.compress_all_reduce)
    recorder = None
    if settings is not None and settings.capture:
        recorder = _CaptureRecorder.for_run(settings, optimizers)
    if hook_fsdp:
        if recorder is not None:
            _record_fsdp_comms(hook, recorder)
        for part in model_parts:
            hook = zipccl_fsdp.register_comm_hook(part, hook)
        stats_fns.append(hook.stats)
    if settings is not None and settings.dtensor:
        # Process-wide (zipccl's kernels for the functional collectives); the
        # trainer never disables it.
        stats_fns.append(_enable_dtensor(zipccl_fsdp.enable_dtensor_compression, config,
                                         recorder).stats)
    if stats_fns and (settings is None or settings.telemetry):
        stats = functools.partial(_summed_stats, stats_fns)
        sources = [(kind, StepDeltas(stats, kind)) for kind in KINDS]
        if hook_fsdp:
            fsdp_hook = hook
            sources.append(("calibration",
                            lambda step: calibration_scalars(fsdp_hook.calibration())))
        for part in model_parts:
            for kind, source in sources:
                attach_scalar_source(part, kind, source)
    return hook_fsdp, bool(stats_fns) or hook_fsdp


def _summed_stats(stats_fns: Sequence[Callable[[], Mapping]]) -> dict[str, dict[str, float]]:
    """Per-kind counters of several owners (the FSDP2 hook, the DTensor compression) added up."""
    out: dict[str, dict[str, float]] = {}
    for fn in stats_fns:
        for kind, fields in fn().items():
            if kind not in KINDS:  # e.g. the DTensor compression's "passthrough"
                continue
            into = out.setdefault(kind, {})
            for name, value in fields.items():
                into[name] = into.get(name, 0) + value
    return out


class _CaptureRecorder:
    """Feeds ``Capture`` objects from the comms and saves them after optimizer steps.

    Without ``steps``: one capture of the first ``per_kind`` tensors of each
    kind, in ``path``. With ``steps``: one capture per listed training step,
    of the first ``per_kind`` tensors of each kind of that step, in
    ``path`` with ``_step<S>`` before the suffix.
    """

    def __init__(self, per_kind: int, path: str, steps: Sequence[int] = ()) -> None:
        from torchtitan.observability import structured_logger

        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.per_kind = per_kind
        self.path = path
        self.steps = frozenset(steps)
        self._step = structured_logger.get_step
        self._captures: dict = {}  # step (or None) -> Capture
        self._saved: dict = {}

    @classmethod
    def for_run(cls, settings: RunSettings, optimizers: Any) -> "_CaptureRecorder":
        rank = dist.get_rank() if dist.is_initialized() else 0
        path = os.path.join(settings.capture_dir, f"capture_rank{rank}.safetensors")
        recorder = cls(settings.capture, path, settings.capture_steps)
        # torchtitan's OptimizersContainer is a torch Optimizer: its step hooks
        # run once per training step, after the step's last collective.
        optimizers.register_step_post_hook(recorder.save_if_grown)
        return recorder

    def _capture_for(self, step: int):
        from zipccl_fsdp.capture import Capture

        key = step if self.steps else None
        if self.steps and step not in self.steps:
            return None
        if key not in self._captures:
            self._captures[key] = Capture(self.per_kind, rank=self.rank)
        return self._captures[key]

    def record(self, kind: str, tensor: torch.Tensor) -> None:
        step = self._step() or 0
        capture = self._capture_for(step)
        if capture is not None and capture.wants(kind):
            capture.step = step
            capture.record(kind, tensor)

    def file_for(self, key) -> str:
        if key is None:
            return self.path
        stem, ext = os.path.splitext(self.path)
        return f"{stem}_step{key}{ext}"

    def save_if_grown(self, *_: Any) -> None:
        for key, capture in self._captures.items():
            if len(capture) > self._saved.get(key, 0):
                path = self.file_for(key)
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                capture.save(path)
                self._saved[key] = len(capture)
                logger.info(f"zipccl capture: {len(capture)} tensors in {path}")


class _RecordingAllGather(AllGather):
    """An FSDP2 all-gather comm that records its input, then runs ``comm``."""

    def __init__(self, comm: AllGather, recorder: _CaptureRecorder) -> None:
        self.comm, self.recorder = comm, recorder
        self.hook = getattr(comm, "hook", None)  # whose comm this is (hooks/fsdp2.py)

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
        self.hook = getattr(comm, "hook", None)

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.comm.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        self.recorder.record("reduce_scatter", input_tensor)
        return self.comm(output_tensor=output_tensor, input_tensor=input_tensor,
                         group=group, op=op, async_op=async_op)


def _record_fsdp_comms(hook: Any, recorder: _CaptureRecorder) -> None:
    """Make ``hook``'s FSDP2 comms (and its HSDP replicate all-reduce) record
    their inputs (before it is installed)."""
    hook.all_gather_comm = _RecordingAllGather(hook.all_gather_comm, recorder)
    hook.reduce_scatter_comm = _RecordingReduceScatter(hook.reduce_scatter_comm, recorder)
    # Read by hooks/hsdp.py's ReplicateAllReduce before each all-reduce.
    hook.capture_tap = recorder.record


_DTENSOR_KINDS = {"_all_gather": "all_gather", "_reduce_scatter": "reduce_scatter",
                  "_all_reduce": "all_reduce", "_all_reduce_": "all_reduce",
                  "_all_to_all": "all_to_all", "_shard_dim_alltoall": "all_to_all"}
"""DTensorCompression's handler of each functional collective -> the kind it
records under (prefixed ``dtensor_``: tensor-parallel and MoE traffic apart
from FSDP2's)."""


def _enable_dtensor(enable: Callable, config: Any, recorder: _CaptureRecorder | None):
    """``enable(config)``, or with a recorder, the same compression recording
    the first input of every functional collective it handles."""
    if recorder is None:
        return enable(config)
    from zipccl_fsdp.hooks.dtensor import DTensorCompression

    class RecordingDTensorCompression(DTensorCompression):
        def _call(self, op, method, args, kwargs):
            kind = _DTENSOR_KINDS.get(method)
            if kind is not None and isinstance(args[0], torch.Tensor):
                recorder.record(f"dtensor_{kind}", args[0])
            return super()._call(op, method, args, kwargs)

    # Process-wide like enable_dtensor_compression; the trainer never exits it.
    return RecordingDTensorCompression(config).__enter__()


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
