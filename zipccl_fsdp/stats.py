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
device (an NCCL launch) is counted until its launch returns; encode and decode
read sizes on the host, so they include the kernels they wait for.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from torch.profiler import record_function

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
COUNTS = ("calls", "compressed_calls", "raw_bytes", "wire_bytes", "size_bytes", "pad_bytes")
TIMES = ("encode_s", "decode_s", "comm_s", "size_exchange_s", "reduce_s")

# phase name -> the time fields it adds to
_PHASE_FIELDS = {
    "encode": ("encode_s",),
    "decode": ("decode_s",),
    "sizes": ("comm_s", "size_exchange_s"),
    "exchange": ("comm_s",),
    "reduce": ("reduce_s",),
}


class CommStats:
    """Per-kind counters of one owner (a hook, or the module's free functions).

    ``size_bytes`` (size exchanges and config checks) and ``pad_bytes`` (the
    all-gather padding to the largest payload) are the parts of ``wire_bytes``
    that carry no data. ``comm_s`` includes ``size_exchange_s``, which also
    holds the wait for the slowest peer to finish encoding (the first
    collective after the encode absorbs the skew between ranks); ``reduce_s``
    is the local part of a reduction (fp32 sums, scaling, the final cast).
    """

    def __init__(self) -> None:
        self._data: dict[str, dict[str, float]] = {}
        self.reset()

    def reset(self) -> None:
        """Zero every counter."""
        self._data = {kind: {**{k: 0 for k in COUNTS}, **{k: 0.0 for k in TIMES}}
                      for kind in KINDS}

    def snapshot(self) -> dict[str, dict[str, float]]:
        """A copy: ``{kind: {"calls", "compressed_calls", "raw_bytes", "wire_bytes",
        "size_bytes", "pad_bytes", "encode_s", "decode_s", "comm_s", "size_exchange_s",
        "reduce_s"}}``."""
        return {kind: dict(fields) for kind, fields in self._data.items()}

    def add(self, kind: str, **counts: float) -> None:
        fields = self._data[kind]
        for name, value in counts.items():
            fields[name] += value

    @contextmanager
    def phase(self, kind: str, phase: str):
        """Time a phase and mark it ``zipccl::<kind>::<phase>`` in the profiler."""
        with record_function(f"zipccl::{kind}::{phase}"):
            start = time.perf_counter()
            try:
                yield
            finally:
                elapsed = time.perf_counter() - start
                fields = self._data[kind]
                for name in _PHASE_FIELDS[phase]:
                    fields[name] += elapsed
