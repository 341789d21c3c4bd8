"""The adaptive policy's cost model: pure functions of sizes and speeds.

Nothing here communicates, times or keeps state; ``calibration.py`` measures
the speeds and ``policy.py`` decides with them.

The model takes one rank's view, all ranks sending at once. A collective is
one or two *parts* (all-reduce: its reduce-scatter and its all-gather), each
described by ``Traffic`` (each collective builds its own from ``gather`` and
``scatter_reduce``): the raw bytes the rank sends, encodes and decodes, how
many codec calls a piece costs, and the bytes its local reduction reads, raw
and compressed. With the link's latency ``L`` and bandwidth ``B`` (bytes/s a
rank gets while every rank sends), the codec's speeds ``E``, ``D`` and the
reduction's ``R`` (bytes/s) and fixed cost per call ``c``, and the expected
wire fraction ``f`` (payload / raw bytes) of the call site::

    raw:       L + send / B + raw_reduce / R
    P pieces:  e = encode / (P E) + calls_e c                 (per piece, CPU)
               d = decode / (P D) + calls_d c + reduce / (P R)  (per piece, CPU)
               w = 2 L + f send / (P B) + PIECE_OVERHEAD_S   (size row + payload)
               T = e + w + d + (P - 1) max(e + d, w)

Encode and decode share the rank's thread, the transfer runs in the
backend's (gloo's threads, NCCL's stream), so the steady state is the slower
of the two stages; the first piece's encode and the last one's decode are the
pipeline's fill and drain. ``P`` is searched over ``PIECE_COUNTS`` with every
piece sending at least ``MIN_PIECE_BYTES``; compression is taken only when
the model says it saves ``1 - MARGIN`` of the raw time, so that a model error
does not make a fast link slower.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Plan", "RAW", "LINK_RAW", "Traffic", "LinkSpeed", "CodecSpeed", "gather",
           "scatter_reduce",
           "predict_raw", "predict", "best_plan", "piece_counts", "could_ever_compress",
           "fit_slowdown",
           "BEST_FRACTION", "MARGIN", "PIECE_COUNTS", "MIN_PIECE_BYTES", "PIECE_OVERHEAD_S"]

MARGIN = 0.9
"""Compress only when the model predicts at most this fraction of the raw time."""

PIECE_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
"""Piece counts the adaptive policy considers."""

MIN_PIECE_BYTES = 256 * 1024
"""Smallest raw bytes a piece sends (below it the per-piece latencies dominate)."""

PIECE_OVERHEAD_S = 300e-6
"""Host cost of one more piece beyond its two latencies and its codec calls
(tensor set-up, async launches and waits handed between threads); tuned on
pipelined all-gathers of 1 to 16 pieces, see docs/benchmarks.md, section
"Calibration"."""

BEST_FRACTION = {torch.bfloat16: 0.62, torch.float16: 0.8, torch.float32: 0.3}
"""A wire fraction hard to beat on model data (fp32: gradients cast from
bf16), per dtype; the figures behind it are in docs/benchmarks.md, section
"Figures behind constants". The expectation of a call site before its class has
been seen, so that the first call measures the ratio; and the test that
tells "raw because of the link or size" from "raw because of this ratio"."""


@dataclass(frozen=True)
class Plan:
    """What one call does: raw, or compressed with ``codec`` in ``pieces`` pieces."""

    compress: bool
    codec: str = "raw"
    pieces: int = 1
    reason: str = ""


RAW = Plan(False, reason="raw")
LINK_RAW = Plan(False, reason="link")
"""Raw because compression can never pay on this group and dtype (the
policy's gate is closed): no later call of that kind can go otherwise."""

SIZE_RAW = Plan(False, reason="size")
"""Raw because the message is below ``min_bytes``."""


def agreed_raw(plan: Plan) -> bool:
    """Whether ``plan`` is raw for a reason every rank shares before the ranks
    have exchanged anything (``RAW``: the config, the kind's switch, the
    caller; ``LINK_RAW``: the gate). Any other raw plan was reached from the
    call's own sizes, which the ranks have not yet agreed on: such a call
    exchanges a size row before it moves raw bytes (``pipeline.announce``)."""
    return plan is RAW or plan is LINK_RAW


@dataclass(frozen=True)
class Traffic:
    """One part of a collective, in raw bytes of this rank."""

    send: float
    encode: float
    decode: float
    encode_calls: int = 1
    decode_calls: int = 1
    reduce: float = 0.0
    """Bytes the compressed call's rank-order sum reads on this rank."""
    raw_reduce: float = 0.0
    """Bytes the raw call's sum reads on this rank (0 where torch reduces)."""


@dataclass(frozen=True)
class LinkSpeed:
    latency_s: float
    bytes_per_s: float


@dataclass(frozen=True)
class CodecSpeed:
    """A codec's speeds on one device and dtype, and the rank-order sum's there
    (``reduce_bps``: the device's, the same for every codec; it runs on the
    codec's thread, so an in-situ slowdown slows it too)."""

    encode_bps: float
    decode_bps: float
    call_s: float
    reduce_bps: float = float("inf")

    def slowed(self, k: float) -> "CodecSpeed":
        """The speed of a codec running ``k`` times slower (``fit_slowdown``)."""
        return CodecSpeed(self.encode_bps / k, self.decode_bps / k, self.call_s * k,
                          self.reduce_bps / k)


def gather(world: int, unit: int) -> Traffic:
    """The part of an all-gather of a ``unit``-byte shard per rank: it sends
    and encodes the shard once, decodes every peer's."""
    peers = world - 1
    return Traffic(peers * unit, unit, peers * unit, 1, peers)


def scatter_reduce(world: int, unit: int, raw_reduces: bool = True) -> Traffic:
    """The part of a reduce-scatter of ``unit`` bytes per rank's chunk: it
    sends and encodes a chunk to each peer, decodes theirs and sums all
    ``world`` chunks in rank order; ``raw_reduces``: the raw call sums them too
    (false where torch's all-reduce does, ``_reduce.torch_sums_alike``)."""
    peers = world - 1
    return Traffic(peers * unit, peers * unit, peers * unit, peers, peers,
                   world * unit, world * unit if raw_reduces else 0.0)


def predict_raw(parts: tuple, link: LinkSpeed, speed: CodecSpeed | None = None) -> float:
    """Seconds the raw collective takes in the model (its sums at ``speed``'s
    ``reduce_bps``)."""
    reduce_bps = speed.reduce_bps if speed is not None else float("inf")
    return sum(link.latency_s + p.send / link.bytes_per_s + p.raw_reduce / reduce_bps
               for p in parts)


def predict(parts: tuple, link: LinkSpeed, speed: CodecSpeed, fraction: float,
            pieces: int) -> float:
    """Seconds the compressed collective takes in ``pieces`` pieces, in the model."""
    total = 0.0
    for p in parts:
        e = p.encode / (pieces * speed.encode_bps) + p.encode_calls * speed.call_s
        d = (p.decode / (pieces * speed.decode_bps) + p.decode_calls * speed.call_s
             + p.reduce / (pieces * speed.reduce_bps))
        w = (2 * link.latency_s + fraction * p.send / (pieces * link.bytes_per_s)
             + PIECE_OVERHEAD_S)
        total += e + w + d + (pieces - 1) * max(e + d, w)
    return total


def piece_counts(send: float, forced_pieces: int = 0) -> tuple:
    """The piece counts to consider for a part that sends ``send`` raw bytes."""
    if forced_pieces:
        return (forced_pieces,)
    return tuple(n for n in PIECE_COUNTS if n == 1 or send / n >= MIN_PIECE_BYTES)


def best_plan(parts: tuple, link: LinkSpeed, speeds: dict, fractions: dict,
              forced_pieces: int = 0) -> tuple:
    """(plan, predicted seconds, predicted raw seconds); plan is ``RAW`` unless
    some (codec, pieces) beats raw by the margin."""
    # Every codec's reduce_bps is the device's: any of them prices the raw sums.
    raw_s = predict_raw(parts, link, next(iter(speeds.values()), None))
    counts = piece_counts(max(p.send for p in parts), forced_pieces)
    best, best_s = RAW, raw_s * MARGIN
    for codec, speed in speeds.items():
        for n in counts:
            t = predict(parts, link, speed, fractions[codec], n)
            if t < best_s:
                best, best_s = Plan(True, codec, n, "model"), t
    return best, (best_s if best.compress else raw_s), raw_s


def could_ever_compress(link: LinkSpeed, speeds: dict, fractions: dict) -> bool:
    """Whether compression beats raw for a huge message at ``fractions``: false
    when the codec is slower than the link, whatever the message."""
    huge = (Traffic(1 << 34, 1 << 34, 1 << 34),)
    return best_plan(huge, link, speeds, fractions)[0].compress


def fit_slowdown(parts: tuple, link: LinkSpeed, speed: CodecSpeed, fraction: float,
                 pieces: int, seconds: float, bounds: tuple) -> float:
    """The factor ``k`` in ``bounds`` by which ``speed`` must be slowed
    (``CodecSpeed.slowed``) for the model to predict ``seconds`` for this
    compressed call: a bisection, as the prediction grows with ``k``; a bound
    when the prediction stays on one side."""
    lo, hi = bounds
    if predict(parts, link, speed.slowed(lo), fraction, pieces) >= seconds:
        return lo
    if predict(parts, link, speed.slowed(hi), fraction, pieces) <= seconds:
        return hi
    k = lo
    for _ in range(40):
        k = (lo * hi) ** 0.5
        if predict(parts, link, speed.slowed(k), fraction, pieces) < seconds:
            lo = k
        else:
            hi = k
    return k
