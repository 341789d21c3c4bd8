"""Counters of the compressed collectives: calls, bytes and time per phase.

Bytes are counted, not estimated. Both counts take the view of one rank and
count what it hands over for delivery to *other* ranks:

* ``raw_bytes``: what the uncompressed collective would carry from this rank:
  the input of an all-gather (sent once, to every peer), the input of a
  reduce-scatter or all-to-all minus the rank's own chunk (which never leaves
  it), and for an all-reduce the sum of its reduce-scatter and all-gather.
* ``wire_bytes``: the bytes of the tensors this rank passed to the underlying
  ``torch.distributed`` calls, size exchanges and padding included, again
  without the rank's own all-to-all slot.

Times are host wall-clock seconds. On CUDA a phase that does not wait for the
device (an NCCL launch) is counted until its launch returns, and so is a raw
call made with ``async_op=True`` (the DDP hook's, on a fast link), which
returns torch's pending ``Work``; encode and decode read sizes on the host,
so they include the kernels they wait for.
"""
from __future__ import annotations

import time

import torch.autograd.profiler as _autograd_profiler
from torch._C._autograd import _profiler_enabled
from torch.profiler import record_function

from .config import KINDS  # noqa: F401  (re-exported: the kinds, declared by config's switches)
from .runtime import Runtime

CALIBRATION = "calibration"
"""The key of the adaptive policy's own measurements (``calibration.py``): their
collectives are counted here, never in a collective's kind, so that a kind's
``wire_bytes`` / ``raw_bytes`` is what that collective's calls cost."""
COUNTS = ("calls", "compressed_calls", "raw_bytes", "wire_bytes", "size_bytes", "pad_bytes",
          "fallback_calls", "pipelined_calls", "raw_fallback_calls")
TIMES = ("encode_s", "decode_s", "comm_s", "size_exchange_s", "reduce_s", "policy_s")

# phase name -> the time fields it adds to
_PHASE_FIELDS = {
    "encode": ("encode_s",),
    "decode": ("decode_s",),
    "sizes": ("comm_s", "size_exchange_s"),
    "exchange": ("comm_s",),
    "reduce": ("reduce_s",),
    "policy": ("policy_s",),
}


def profiling() -> bool:
    """Whether a profiler may be recording this thread: ``_profiler_enabled()``
    is this thread's state; torch's module flag is set while any profiler
    runs, and one that records every thread records zipccl's worker too."""
    return _profiler_enabled() or _autograd_profiler._is_profiler_enabled


class CommStats:
    """Per-kind counters of one owner (a hook, or the module's free functions).

    ``size_bytes`` (size exchanges and config checks) and ``pad_bytes`` (the
    all-gather padding to the largest payload) are the parts of ``wire_bytes``
    that carry no data. ``fallback_calls`` counts calls that chose compression
    but went raw on every rank because some rank's encode failed
    (``protocol.py``); they are not in ``compressed_calls``. ``comm_s``
    includes ``size_exchange_s``, which also holds the wait for the slowest
    peer to finish encoding (the first collective after the encode absorbs the
    skew between ranks); ``reduce_s`` is the local part of a reduction (fp32
    sums, scaling, the final cast).

    The policy's decisions (``policy.py``): ``compressed_calls`` sent
    compressed payloads, ``pipelined_calls`` of them in more than one piece;
    ``raw_fallback_calls`` are calls of a dtype the codec handles that the
    policy (or ``min_bytes``) sent raw; ``compressed_fraction`` in a snapshot
    is compressed_calls / calls. ``policy_s`` is the time spent deciding,
    the one-time calibrations included; the calibrations' collectives are
    counted under their own key, ``"calibration"`` (``calls``: measurements,
    ``wire_bytes``, ``size_bytes``), never in a collective's kind.

    ``runtime`` is the state its owner's calls learn (``runtime.py``): the
    collectives find it here, so whoever owns the counters owns the state.
    ``reset`` zeroes the counters only.
    """

    def __init__(self) -> None:
        self._data: dict[str, dict[str, float]] = {}
        self.runtime = Runtime()
        self.reset()

    def reset(self) -> None:
        """Zero every counter (in place: ``fields`` dicts stay valid)."""
        for kind in KINDS + (CALIBRATION,):
            self._data.setdefault(kind, {}).update(
                {**{k: 0 for k in COUNTS}, **{k: 0.0 for k in TIMES}})

    def fields(self, kind: str) -> dict[str, float]:
        """The live counters of ``kind``, for a caller that adds to them directly
        (the raw lanes, ``collectives/_lanes.py``); valid across ``reset``."""
        return self._data[kind]

    def snapshot(self) -> dict[str, dict[str, float]]:
        """A copy: ``{kind: {"calls", "compressed_calls", "raw_bytes", "wire_bytes",
        "size_bytes", "pad_bytes", "fallback_calls", "pipelined_calls", "raw_fallback_calls",
        "encode_s", "decode_s", "comm_s", "size_exchange_s", "reduce_s", "policy_s",
        "compressed_fraction"}}``."""
        snap = {kind: dict(fields) for kind, fields in self._data.items()}
        for fields in snap.values():
            fields["compressed_fraction"] = (fields["compressed_calls"] / fields["calls"]
                                             if fields["calls"] else 0.0)
        return snap

    def add(self, kind: str, **counts: float) -> None:
        fields = self._data[kind]
        for name, value in counts.items():
            fields[name] += value

    def phase(self, kind: str, phase: str) -> "_Phase":
        """Time a phase and mark it ``zipccl::<kind>::<phase>`` in the profiler.

        The profiler range is opened only while a profiler runs: an open
        ``record_function`` around a gloo collective adds latency comparable
        to a small raw call (docs/benchmarks.md, "Figures behind constants").
        A profiler that records every thread
        (``experimental_config=_ExperimentalConfig(profile_all_threads=True)``)
        also shows the ranges of the DDP hook's calls, which run on zipccl's
        worker thread (``background.py``)."""
        return _Phase(self._data[kind], kind, phase)


class _Phase:
    """``CommStats.phase``: a plain class, not a generator context manager,
    which costs several times as much per use (every call enters two or more)."""

    __slots__ = ("fields", "kind", "phase", "rf", "start")

    def __init__(self, fields: dict, kind: str, phase: str) -> None:
        self.fields, self.kind, self.phase, self.rf = fields, kind, phase, None

    def __enter__(self) -> None:
        if profiling():
            self.rf = record_function(f"zipccl::{self.kind}::{self.phase}")
            self.rf.__enter__()
        self.start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        elapsed = time.perf_counter() - self.start
        if self.rf is not None:
            self.rf.__exit__(None, None, None)
        fields = self.fields
        for name in _PHASE_FIELDS[self.phase]:
            fields[name] += elapsed


MODULE_STATS = CommStats()
"""The counters, and the runtime state, of the free functions called without
``stats=`` (``collectives.stats()``)."""
