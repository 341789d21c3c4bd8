"""The stream-order rule of ``pipeline._Streams``, checked on the CPU.

On CUDA a pipelined collective encodes and decodes on a side stream while the
caller's stream concatenates, pads and sends the pieces. The caller's stream
must wait for the side stream (``before_launch``) before it touches a piece:
the payloads were written there, and a receive buffer it may reuse could
still be read there. A CPU run cannot break that rule visibly (there are no
streams), and CI has no GPU, so this test stands in for CUDA's streams with a
recorder: side-stream work is pending from any ``codec()`` block until the
next ``before_launch``/``done``, and the caller's-stream steps that read
payloads (``torch.cat`` of an all-to-all's pieces, the all-gather's
``zero_padded``, and ``padded_in_place``, which a CPU run takes) must not
run while it is pending. And a payload must live
until its piece is drained: CUDA's caching allocator hands a freed block of
the side stream to the next encode at once, ordered only against the side
stream, which waits for the collective when the piece is drained. The
collectives run for real, on 2 gloo ranks, through
``device_collectives.task_collectives_on``.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch

from device_collectives import task_collectives_on
from zipccl_fsdp import pipeline


class _RecordingStreams:
    """pipeline._Streams's interface; records the order instead of enforcing it."""

    latest = None

    def __init__(self, device: torch.device) -> None:
        self.depth = 0          # inside codec(): work on the side stream
        self.pending = False    # side-stream work the caller's stream has not waited for
        self.launched = 0       # pieces launched
        self.landed = 0         # pieces drained
        _RecordingStreams.latest = self

    @contextmanager
    def codec(self):
        self.depth += 1
        self.pending = True
        try:
            yield
        finally:
            self.depth -= 1

    def before_launch(self) -> None:
        self.pending = False
        self.launched += 1

    def done(self) -> None:
        self.pending = False


def _checked(fn, name: str, log: dict):
    def wrapper(*args, **kwargs):
        s = _RecordingStreams.latest
        if s is not None and s.depth == 0:
            log["checked"] += 1
            if s.pending:
                log["violations"].append(name)
        return fn(*args, **kwargs)
    return wrapper


def _tracked_encode(encode, log: dict):
    """_Call.encode, noting when each payload is freed against its piece."""
    def freed(streams, piece):
        log["freed"] += 1
        if streams.landed <= piece:
            log["violations"].append("payload freed before its piece was drained")

    def wrapper(call, x, codec=None, room=0):
        payload = encode(call, x, codec, room)
        if payload is not None:
            # The piece this payload goes out with is the next one launched.
            weakref.finalize(payload, freed, call.streams, call.streams.launched)
        return payload
    return wrapper


def _counted_land(land):
    def wrapper(call, flight, drain):
        land(call, flight, drain)
        call.streams.landed += 1
    return wrapper


def task_stream_order() -> dict:
    log = {"checked": 0, "freed": 0, "violations": []}
    Call = pipeline._Call
    saved = (pipeline._Streams, pipeline.zero_padded, pipeline.padded_in_place, torch.cat,
             Call.encode, Call._land)
    pipeline._Streams = _RecordingStreams
    pipeline.zero_padded = _checked(pipeline.zero_padded, "zero_padded", log)
    pipeline.padded_in_place = _checked(pipeline.padded_in_place, "padded_in_place", log)
    torch.cat = _checked(torch.cat, "torch.cat", log)
    Call.encode = _tracked_encode(Call.encode, log)
    Call._land = _counted_land(Call._land)
    try:
        task_collectives_on("cpu")
    finally:
        (pipeline._Streams, pipeline.zero_padded, pipeline.padded_in_place, torch.cat,
         Call.encode, Call._land) = saved
        _RecordingStreams.latest = None
    return {"checked": log["checked"], "freed": log["freed"],
            "violations": sorted(set(log["violations"])), "first": log["violations"][:3]}


def test_pipelined_calls_keep_cuda_stream_order(pool2):
    results = pool2.run(task_stream_order, timeout_s=600)
    for rank, r in enumerate(results):
        assert r["violations"] == [], f"rank {rank}: {r}"
        # The pipelined paths ran and were watched: not a vacuous pass.
        assert r["checked"] > 50 and r["freed"] > 50, f"rank {rank}: {r}"
