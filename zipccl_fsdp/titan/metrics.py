"""zipccl's scalars in torchtitan's own TensorBoard event files.

How torchtitan 0.3.0 logs (``torchtitan/components/metrics.py``,
``torchtitan/trainer.py``), as read for this hook point:

- ``MetricsProcessor.__init__`` builds ``self.logger``. On the metrics rank
  (rank 0 without pipeline parallelism; every rank with
  ``save_for_all_ranks``) that is a ``LoggerContainer`` holding a
  ``TensorBoardLogger``: one ``SummaryWriter(<dump_folder>/<save_tb_folder>/
  <YYYYmmdd-HHMM>[/rank_<r>], max_queue=1000)``. Other ranks get a
  ``BaseLogger`` whose ``log`` does nothing.
- On each step where ``should_log(step)`` holds (step 1 and multiples of
  ``log_freq``), after the optimizer step, ``Trainer.train_step`` calls
  ``metrics_processor.log(step, global_avg_loss, global_max_loss, grad_norm,
  extra_metrics={"n_tokens_seen": ..., <lr per group>: ...})`` on every rank.
  ``log`` builds its dict (loss, grad norm, throughput, timings, memory),
  ``update``\\ s it with ``extra_metrics`` and makes one
  ``self.logger.log(metrics, step)`` call, which is one ``add_scalar(tag,
  value, step)`` per key. Validation goes through ``log_validation`` instead.
- The processor is built in ``Trainer.__init__`` before the model is sharded;
  ``ModelSpec.post_optimizer_build_fn`` (where comm hooks are installed) is
  not given it, and right after that function the trainer sets
  ``metrics_processor.model_parts``.

So the hook point is ``extra_metrics``: whatever is merged into it is written
by the same ``add_scalar`` loop, to the same event file, at the same step and
flush as torchtitan's loss. :class:`ZipcclMetricsProcessor` (a drop-in for
``MetricsProcessor``, selected by putting its ``Config`` in
``Trainer.Config.metrics``) does that merge: each logged step it calls the
scalar sources attached with :func:`attach_scalar_source` to the model parts
it is given (and to itself, with :meth:`ZipcclMetricsProcessor.add_scalar_source`,
for code that holds the processor), and logs their values as
``zipccl/<kind>/<name>``. The model parts are the handle that
``post_optimizer_build_fn`` and the processor share, so no global registry
is needed.

:class:`~zipccl_fsdp.tensorboard_stats.StepDeltas` turns a hook's cumulative
``stats()`` into per-step sources: ``zipccl/<kind>/raw_MB``, ``wire_MB``,
``ratio``, ``comm_ms``, ``encode_ms``, ``decode_ms`` (and ``calls``,
``compressed_calls``) hold the traffic since the previous logged step, not
running totals.

For a stock torchtitan config, select the processor with
``--override.imports zipccl_fsdp.titan.metrics.zipccl_metrics``.

Example::

    # in a post_optimizer_build_fn
    attach_scalar_source(model_part, "comm", lambda step: {"bytes_saved": n})
    # -> TensorBoard tag "zipccl/comm/bytes_saved" at every logged step
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch.nn as nn
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.config.override import derive, override

from ..tensorboard_stats import TAG_PREFIX

ScalarSource = Callable[[int], Mapping[str, float]]
"""Called with the step number; returns ``{name: value}`` to log."""

_SOURCES_ATTR = "_zipccl_scalar_sources"


def attach_scalar_source(module: nn.Module, kind: str, source: ScalarSource) -> None:
    """Have ``source`` logged as ``zipccl/<kind>/<name>`` at each logged step.

    ``module`` is a torchtitan model part. The source is called on every rank
    (only the metrics rank writes), once per logged step, after the optimizer
    step; it must be cheap and must not start collectives unless every rank
    is sure to call it in the same order (they are: the same parts, the same
    attach order). Attaching the same ``(kind, source)`` twice logs it once.
    """
    _check_kind(kind)
    sources: list[tuple[str, ScalarSource]] = module.__dict__.setdefault(
        _SOURCES_ATTR, []
    )
    if not any(k == kind and s is source for k, s in sources):
        sources.append((kind, source))


def _check_kind(kind: str) -> None:
    if not kind or kind.startswith("/") or kind.endswith("/"):
        raise ValueError(f"kind must be a non-empty tag path, got {kind!r}")


def collect_scalars(holders: Any, step: int) -> dict[str, float]:
    """Return ``{"zipccl/<kind>/<name>": value}`` from the sources on ``holders``."""
    seen: set[tuple[str, int]] = set()
    out: dict[str, float] = {}
    for part in holders or ():
        for kind, source in part.__dict__.get(_SOURCES_ATTR, ()):
            if (kind, id(source)) in seen:
                continue
            seen.add((kind, id(source)))
            for name, value in source(step).items():
                out[f"{TAG_PREFIX}/{kind}/{name}"] = float(value)
    return out


class ZipcclMetricsProcessor(MetricsProcessor):
    """torchtitan's ``MetricsProcessor`` that also logs zipccl's scalars.

    Identical output otherwise; the extra tags go through torchtitan's own
    ``extra_metrics`` path, so they share its writer, event file and steps.
    Sources come from the model parts (:func:`attach_scalar_source`) and from
    :meth:`add_scalar_source` on the processor itself.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        pass

    def add_scalar_source(self, kind: str, source: ScalarSource) -> None:
        """Log ``source(step)`` as ``zipccl/<kind>/<name>`` at each logged step."""
        _check_kind(kind)
        self.__dict__.setdefault(_SOURCES_ATTR, []).append((kind, source))

    def log(
        self,
        step: int,
        global_avg_loss: float,
        global_max_loss: float,
        grad_norm: float,
        extra_metrics: dict[str, Any] | None = None,
    ) -> None:
        merged = dict(extra_metrics or {})
        merged.update(collect_scalars([self, *(self.model_parts or ())], step))
        super().log(
            step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=merged
        )


@override(
    target=MetricsProcessor.Config,
    description="MetricsProcessor that also logs zipccl/<kind>/<name> scalars",
)
def zipccl_metrics(cfg: MetricsProcessor.Config) -> ZipcclMetricsProcessor.Config:
    """Replace the metrics processor by :class:`ZipcclMetricsProcessor`."""
    return derive(cfg, ZipcclMetricsProcessor.Config)
