"""Torch profiler traces of chosen training steps, for TensorBoard.

torchtitan 0.3.0's ``Profiler`` (``torchtitan/tools/profiler.py``) traces on
a periodic schedule (``profile_freq``, ``profiler_warmup``,
``profiler_active``) and writes Chrome traces with its own handler
(``<dump_folder>/profiling/traces/iteration_<n>/rank<r>_trace.json.gz``).
The trainer builds it from ``Trainer.Config.profiler`` and calls its
``step()`` after every training step.

:class:`ZipcclProfiler` is that component with one more field,
``trace_steps``. When it is set, exactly the steps it names are traced
(``enable_profiling`` need not be set) and each run of consecutive steps is
written by ``torch.profiler.tensorboard_trace_handler`` into
``<dump_folder>/<save_traces_folder>/rank<r>.<time_ns>.pt.trace.json``: the
layout TensorBoard's PyTorch profiler plugin (``torch-tb-profiler``) reads,
so ``tensorboard --logdir <dump_folder>`` shows the traces beside the
scalars. zipccl's collectives mark their phases with
``record_function("zipccl::<kind>::<phase>")`` (encode, sizes, exchange,
decode, reduce), so the traces show where a compressed collective spends
its time. With ``trace_steps`` empty it is torchtitan's profiler, unchanged.

The config functions of :mod:`zipccl_fsdp.titan` select it; for another
config, ``--override.imports zipccl_fsdp.titan.profiling.zipccl_profiler``.

Example::

    torchrun ... -m torchtitan.train --module zipccl_fsdp.titan \\
        --config llama3_tiny --profiler.trace_steps 3-4
    # or: zipccl titan --recipe recipes/llama3_tiny_cpu.toml --profile 3-4
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerAction
from torchtitan.config.override import derive, override
from torchtitan.tools.logging import logger
from torchtitan.tools.profiler import Profiler


def parse_steps(text: str) -> frozenset[int]:
    """Parse ``"3"``, ``"3,7"``, ``"3-5"`` or ``"2,5-6"`` into step numbers (>= 1).

    Raises ``ValueError`` with the offending part.
    """
    steps: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(
                f"profile steps {text!r}: {part!r} is not a step (N) or range (N-M)"
            ) from None
        if first < 1 or last < first:
            raise ValueError(
                f"profile steps {text!r}: {part!r} must be N >= 1 or N-M with M >= N"
            )
        steps.update(range(first, last + 1))
    if not steps:
        raise ValueError(f"profile steps {text!r}: no step given")
    return frozenset(steps)


def step_schedule(steps: frozenset[int], first_step: int = 1):
    """A ``torch.profiler`` schedule that records the training steps in ``steps``.

    The profiler's step counter starts at 0 during training step
    ``first_step``; a step before a traced run warms up, the last step of
    each run of consecutive steps saves.
    """

    def schedule(profiler_step: int) -> ProfilerAction:
        step = first_step + profiler_step
        if step in steps:
            if step + 1 in steps:
                return ProfilerAction.RECORD
            return ProfilerAction.RECORD_AND_SAVE
        if step + 1 in steps:
            return ProfilerAction.WARMUP
        return ProfilerAction.NONE

    return schedule


class ZipcclProfiler(Profiler):
    """torchtitan's ``Profiler`` that can also trace chosen steps for TensorBoard.

    See the module docstring; only ``build_torch_profiler`` differs, and only
    when ``trace_steps`` is set.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(Profiler.Config):
        trace_steps: str = ""
        """
        Training steps to trace, e.g. "3", "3,7" or "3-5" (steps count from 1).
        When set, these steps are traced whatever enable_profiling says, and
        written with torch.profiler.tensorboard_trace_handler into
        <dump_folder>/<save_traces_folder>/ (one file per rank and run of
        consecutive steps) instead of torchtitan's periodic Chrome traces.
        """

    def build_torch_profiler(self, *, global_step: int, base_folder: str, leaf_folder: str):
        cfg = self._config
        if not cfg.trace_steps:
            return super().build_torch_profiler(
                global_step=global_step, base_folder=base_folder, leaf_folder=leaf_folder
            )
        steps = parse_steps(cfg.trace_steps)
        trace_dir = os.path.join(base_folder, cfg.save_traces_folder, leaf_folder)
        os.makedirs(trace_dir, exist_ok=True)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        elif torch.xpu.is_available():
            activities.append(torch.profiler.ProfilerActivity.XPU)
        logger.info(
            f"Profiling steps {sorted(steps)}; TensorBoard traces go to {trace_dir}"
        )
        prof = torch.profiler.profile(
            activities=activities,
            # After a resume the first step is global_step + 1; the profiler
            # counts from 0 whatever torchtitan's step is.
            schedule=step_schedule(steps, first_step=global_step + 1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                trace_dir, worker_name=f"rank{rank}"
            ),
            record_shapes=True,
        )
        prof.__enter__()
        return prof


@override(
    target=Profiler.Config,
    description="torchtitan's Profiler plus trace_steps: chosen steps, TensorBoard traces",
)
def zipccl_profiler(cfg: Profiler.Config) -> ZipcclProfiler.Config:
    """Replace the profiler by :class:`ZipcclProfiler` (same settings)."""
    return derive(cfg, ZipcclProfiler.Config)
