"""Capture the raw tensors of the first collectives of each kind, to measure
the codecs on real training traffic (``zipccl bench codec --input FILE``).

A capture is a ``.safetensors`` file: one tensor per captured call, named
``<kind>.<index>`` (e.g. ``all_gather.3``), with the file metadata holding a
JSON record per tensor (kind, dtype, rank, step, shape).
"""
from __future__ import annotations

import json
import threading

import torch

METADATA_KEY = "zipccl_capture"


class Capture:
    """Keeps copies of up to ``per_kind`` tensors of each collective kind."""

    def __init__(self, per_kind: int, rank: int = 0):
        if per_kind < 0:
            raise ValueError(f"per_kind must be >= 0, got {per_kind}")
        self.per_kind = per_kind
        self.rank = rank
        self.step = 0
        self._tensors: dict = {}
        self._records: dict = {}
        self._counts: dict = {}
        self._lock = threading.Lock()

    def wants(self, kind: str) -> bool:
        return self._counts.get(kind, 0) < self.per_kind

    def record(self, kind: str, tensor: torch.Tensor) -> None:
        """Copy ``tensor`` (to CPU) if this kind still has room."""
        with self._lock:
            i = self._counts.get(kind, 0)
            if i >= self.per_kind:
                return
            self._counts[kind] = i + 1
        name = f"{kind}.{i}"
        self._tensors[name] = tensor.detach().reshape(-1).to("cpu", copy=True)
        self._records[name] = dict(kind=kind, dtype=str(tensor.dtype).split(".")[-1],
                                   rank=self.rank, step=self.step, shape=list(tensor.shape))

    def __len__(self) -> int:
        return len(self._tensors)

    def save(self, path: str) -> None:
        from safetensors.torch import save_file
        save_file(self._tensors, path, metadata={METADATA_KEY: json.dumps(self._records)})


def read_capture_metadata(path: str) -> dict:
    """{tensor name: record} of a capture file ({} for other safetensors files)."""
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    return json.loads(meta.get(METADATA_KEY, "{}"))
