"""zipccl's counters in TensorBoard: per-step deltas of a cumulative ``stats()``.

``StepDeltas`` turns the running totals of a ``ZipCCLHook``,
``DTensorCompression`` or the free collectives (``zipccl_fsdp.stats``) into
the traffic of the steps since the previous logged one. The torchtitan
integration logs it through torchtitan's own metrics (``titan/metrics.py``);
``TensorBoardStats`` writes it to any ``SummaryWriter``, for training loops
of one's own (DDP, FSDP2 or tensor parallelism without torchtitan), under
the same tags.

Example::

    >>> from torch.utils.tensorboard import SummaryWriter
    >>> tb = TensorBoardStats(SummaryWriter("runs/ddp"), zipccl_hook)
    >>> for step in range(1, steps + 1):
    ...     train_step()
    ...     tb.log(step)          # zipccl/all_reduce/wire_MB, .../ratio, ...
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from .stats import KINDS


class SupportsAddScalar(Protocol):
    """What ``TensorBoardStats`` writes to: ``SummaryWriter.add_scalar``."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> object: ...


class HasStats(Protocol):
    """What ``TensorBoardStats`` reads: ``ZipCCLHook.stats``, ``DTensorCompression.stats``."""

    def stats(self) -> Mapping[str, Mapping[str, float]]: ...

TAG_PREFIX = "zipccl"


class StepDeltas:
    """Scalar source: one kind of a cumulative ``stats()``, per logged step.

    ``stats()`` returns ``{kind: {"calls", "compressed_calls", "raw_bytes",
    "wire_bytes", "encode_s", "decode_s", "comm_s", ...}}`` counted since the
    start (a ``ZipCCLHook``'s ``stats``). Each call logs what changed since the
    previous call, so a tag's value at step ``s`` is the traffic of the steps
    since the previous logged step (with ``log_freq = 1``: of step ``s``
    alone), not a running total:

    ``raw_MB``, ``wire_MB``
        bytes this rank would send uncompressed / did send (10**6 bytes);
    ``ratio``
        raw / wire bytes of those steps;
    ``comm_ms``, ``encode_ms``, ``decode_ms``
        host wall-clock time in the exchange, the encoder and the decoder;
    ``calls``, ``compressed_calls``
        collectives run, and how many of them sent compressed payloads;
    ``compressed_fraction``
        compressed_calls / calls: what the policy decided (``policy.py``).

    Nothing is logged for steps in which the kind made no call. The first
    call logs the traffic since this object was made, not since the source's
    counters started (a hook that carried warm-up steps, say).
    """

    _FIELDS = (
        ("raw_bytes", "raw_MB", 1e-6),
        ("wire_bytes", "wire_MB", 1e-6),
        ("comm_s", "comm_ms", 1e3),
        ("encode_s", "encode_ms", 1e3),
        ("decode_s", "decode_ms", 1e3),
        ("calls", "calls", 1),
        ("compressed_calls", "compressed_calls", 1),
    )

    def __init__(
        self, stats: Callable[[], Mapping[str, Mapping[str, float]]], kind: str
    ) -> None:
        self.stats, self.kind = stats, kind
        self._last: dict[str, float] = dict(stats().get(kind, {}))

    def __call__(self, step: int) -> dict[str, float]:
        now = dict(self.stats().get(self.kind, {}))
        delta = {k: v - self._last.get(k, 0) for k, v in now.items()}
        self._last = now
        if not delta.get("calls"):
            return {}
        out = {
            name: delta[field] * scale
            for field, name, scale in self._FIELDS
            if field in delta
        }
        if delta.get("wire_bytes"):
            out["ratio"] = delta["raw_bytes"] / delta["wire_bytes"]
        if "compressed_calls" in delta:
            out["compressed_fraction"] = delta["compressed_calls"] / delta["calls"]
        return out


_SHORT_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}


def calibration_scalars(report: Mapping) -> dict[str, float]:
    """The adaptive policy's measurements (a ``ZipCCLHook.calibration()``
    report) as scalars, tags ``zipccl/calibration/<name>``: ``link_MBps``, the
    bandwidth per rank of the slowest group (10**6 bytes/s), and per dtype
    ``slowdown_<bf16|fp16|fp32>``, how many times slower the codec ran inside
    the in-situ collective than alone: the two figures that tell why the
    policy compressed or not. Empty until the first decision."""
    out: dict[str, float] = {}
    links = report.get("links", {})
    if links:
        out["link_MBps"] = min(link.bytes_per_s for link in links.values()) * 1e-6
    for (_, dtype, _), probe in report.get("probes", {}).items():
        name = f"slowdown_{_SHORT_DTYPES.get(str(dtype), str(dtype))}"
        out[name] = max(out.get(name, 0.0), float(probe["slowdown"]))
    return out


class TensorBoardStats:
    """Write ``StepDeltas`` of every collective kind to a ``SummaryWriter``.

    Call ``log(step)`` after each step whose collectives have completed (for
    DDP: after ``backward``, which waits for every bucket); it writes the
    step's scalars under ``zipccl/<kind>/<name>`` (``raw_MB``, ``wire_MB``,
    ``ratio``, ``comm_ms``, ... as ``StepDeltas`` lists them); kinds that
    made no call since the previous ``log`` write nothing, and the first
    ``log`` writes the traffic since this object was made. A source with a
    ``calibration()`` report (a ``ZipCCLHook``) also gets
    ``zipccl/calibration/<name>`` (``calibration_scalars``) once its policy
    has measured something, as torchtitan runs do. The writer is not flushed
    or closed here.

    Args:
        writer: a ``torch.utils.tensorboard.SummaryWriter``, or anything with
            its ``add_scalar(tag, value, step)``.
        source: anything with a ``stats()`` method returning ``{kind:
            counters}`` (a ``ZipCCLHook``, a ``DTensorCompression``), or None
            for the free collectives' own counters.
        kinds (tuple[str, ...]): the collective kinds to log; all by default.

    Raises:
        TypeError: ``source`` has no ``stats()`` method.
        ValueError: an unknown kind.

    Example::

        >>> hook = ZipCCLHook()
        >>> model.register_comm_hook(hook)
        >>> tb = TensorBoardStats(SummaryWriter("runs/zipccl"), hook)
        >>> for step in range(steps):
        ...     train_step(model)
        ...     tb.log(step)
    """

    def __init__(self, writer: SupportsAddScalar, source: HasStats | None = None,
                 kinds: tuple[str, ...] = KINDS) -> None:
        if source is None:
            from . import collectives
            stats = collectives.stats
        elif callable(getattr(source, "stats", None)):
            stats = source.stats
        else:
            raise TypeError(f"TensorBoardStats: source must have a stats() method (a "
                            f"ZipCCLHook or DTensorCompression) or be None, got "
                            f"{type(source).__name__}")
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise ValueError(f"TensorBoardStats: unknown kinds {unknown}; known: {KINDS}")
        self.writer = writer
        self._deltas = [(kind, StepDeltas(stats, kind)) for kind in kinds]
        calibration = getattr(source, "calibration", None)
        self._calibration = calibration if callable(calibration) else None

    def log(self, step: int) -> dict[str, float]:
        """Write this step's scalars; return them as ``{tag: value}``."""
        out = {}
        for kind, deltas in self._deltas:
            for name, value in deltas(step).items():
                out[f"{TAG_PREFIX}/{kind}/{name}"] = float(value)
        if self._calibration is not None:
            for name, value in calibration_scalars(self._calibration()).items():
                out[f"{TAG_PREFIX}/calibration/{name}"] = float(value)
        for tag, value in out.items():
            self.writer.add_scalar(tag, value, step)
        return out
