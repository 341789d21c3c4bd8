"""The adaptive policy: per call, raw, compressed, or compressed and pipelined.

``ZipCCLConfig.policy`` picks one of three:

* ``"always"``: compress every message of at least ``min_bytes`` with the
  config's codec, in ``pipeline_pieces`` pieces (one when 0);
* ``"never"``: everything raw;
* ``"adaptive"``: the cheapest of raw and (codec, piece count) in the cost
  model below, with compression taken only when the model says it saves
  ``1 - MARGIN`` (10%) of the raw time, so that a model error does not make a
  fast link slower.

The cost model (one rank's view, all ranks sending at once). A collective is
one or two *parts* (all-reduce: its reduce-scatter and its all-gather), each
described by ``Traffic``: the raw bytes the rank sends, encodes and decodes,
and how many codec calls a piece costs. With the link's latency ``L`` and
bandwidth ``B`` (bytes/s a rank gets while every rank sends), the codec's
speeds ``E``, ``D`` (bytes/s) and fixed cost per call ``c``, and the expected
wire fraction ``f`` (payload / raw bytes) of the call site::

    raw:       L + send / B
    P pieces:  e = encode / (P E) + calls_e c      (per piece, CPU)
               d = decode / (P D) + calls_d c      (per piece, CPU)
               w = 2 L + f send / (P B) + PIECE_OVERHEAD_S   (size row + payload)
               T = e + w + d + (P - 1) max(e + d, w)

Encode and decode share the rank's thread, the transfer runs in the
backend's (gloo's threads, NCCL's stream), so the steady state is the slower
of the two stages; the first piece's encode and the last one's decode are the
pipeline's fill and drain. ``P`` is searched over ``PIECE_COUNTS`` with every
piece sending at least ``MIN_PIECE_BYTES``.

Where the numbers come from, and why every rank decides the same:

* ``L``, ``B``: ``link_gbps`` / ``link_latency_us`` from the config, else
  measured at the first adaptive call on the process group (a few tiny
  all-gathers and a few of ``LINK_PROBE_BYTES`` per rank); every rank's minimum times are all-reduced with
  MAX, so all ranks hold the same, slowest-rank, figures.
* ``E``, ``D``, ``c``: ``codec_gbps`` from the config, else measured per
  (dtype, device type, codec) on 1 MiB of seeded Gaussian data and on 2 KiB
  (for ``c``), once per process, then agreed per group the same way (MAX of
  the times). When the link is measured too, one in-situ A/B follows
  (``Policy._in_situ``): a raw and a pipelined compressed all-gather of about
  ``PROBE_SECONDS``; the raw one refines ``B``, the compressed one says how much slower
  the codec runs inside a collective than alone, and ``E``, ``D``, ``c`` are
  corrected by that factor. On a loopback, where moving bytes is itself CPU
  work competing with the codec, that factor is what keeps the policy raw
  (docs/benchmarks.md). The calibration's collectives are counted under
  ``stats()["calibration"]``, never under the kind of the call that
  triggered it.
* ``f``: per call site (group, kind, shape, dtype), a running mean of the
  *global* wire fraction of its compressed calls: the pipelined collectives
  (``pipeline.py``) all-gather each piece's payload sizes together with the
  raw bytes they code, so every rank sees every rank's numbers and updates the
  same mean. A new site starts from the mean of its class (same group, kind
  and dtype: FSDP2's many parameter groups look alike), and the first site of
  a class from an optimistic ``BEST_FRACTION``. A site's first call is
  compressed whenever the optimistic ratio would compress, so that it
  measures its own ratio rather than living on its class's (one fp32 lm_head
  gradient must not keep the bf16-cast gradients of every layer raw). A site
  kept raw only by its own ratio is probed with one compressed call every
  ``REPROBE_EVERY`` calls.
* the message size: equal on every rank for all-gather, reduce-scatter and
  all-reduce; all-to-all splits differ, so there the ranks all-gather their
  send sizes first (one int64 pair per rank, only when the link is slow enough
  that compression could ever win).

Decisions are counted in ``CommStats`` (``compressed_calls``,
``pipelined_calls``, ``raw_fallback_calls``, ``compressed_fraction``) and kept
in ``Policy.decisions``.
"""
from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import codec as _codec
from .stats import CALIBRATION
from ._wire import all_gather_single as _all_gather
from ._wire import gather_ints, group_key as _group_key

logger = logging.getLogger(__name__)

__all__ = ["Plan", "RAW", "Traffic", "LinkSpeed", "CodecSpeed", "Policy", "policy_for",
           "predict", "predict_raw"]

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
"The adaptive policy"."""

DEFAULT_LATENCY_US = 100.0
"""Latency assumed when ``link_gbps`` is given without ``link_latency_us``."""

CONFIG_CODEC_OVERHEAD_S = 50e-6
"""Fixed cost per codec call assumed when ``codec_gbps`` is given."""

BEST_FRACTION = {torch.bfloat16: 0.62, torch.float16: 0.8, torch.float32: 0.3}
"""A wire fraction hard to beat on model data (fp32: bf16 casts, 0.33 dense;
Gaussian data with the cpp backend gives fixed3 / dense: bf16 0.70 / 0.67,
fp16 0.89 / 0.86, fp32 0.85 / 0.83). The expectation of a call site before
its class has been seen, so the first call measures the ratio; and the test
that tells "raw because of the link or size" from "raw because of this ratio"."""

DENSE_OVER_FIXED3 = 0.95
"""dense wire fraction / fixed3 wire fraction (0.667/0.702 bf16, 0.334/0.351
fp32 casts): how a site's ratio under one codec predicts the other's."""

A2A_SKIP_AFTER = 4
"""An all-to-all site that went raw this many times in a row stops exchanging
its sizes before deciding (one latency per call) and stays raw, but for one
call in ``REPROBE_EVERY``."""

REPROBE_EVERY = 32
"""A site kept raw by its ratio alone is compressed once every this many calls."""

PROBE_SECONDS = 0.04
"""Raw duration the in-situ A/B aims for (``Policy._in_situ``)."""

AB_ROUNDS = 8
"""Timed rounds of the in-situ A/B (best of): fewer let the loopback's noise
spread the fitted codec slowdown widely enough to flip decisions between
calibrations (docs/benchmarks.md, section "The adaptive policy"). Each round
costs a raw and a compressed all-gather of about PROBE_SECONDS, once per
(group, dtype)."""

PROBE_K_RANGE = (1.0, 64.0)
"""Bounds of the in-situ codec slowdown factor: a codec does not run faster
inside a collective than alone; a smaller fitted factor means the short
probe's transfer beat the model (a shaper's burst), not the codec."""

LINK_PROBE_BYTES = 2 << 20
CODEC_PROBE_BYTES = 1 << 20
CODEC_SMALL_ELEMS = 1024


# --------------------------------------------------------------------------
# Plans and the cost model (pure functions)
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """What one call does: raw, or compressed with ``codec`` in ``pieces`` pieces."""

    compress: bool
    codec: str = "raw"
    pieces: int = 1
    reason: str = ""


RAW = Plan(False, reason="raw")
LINK_RAW = Plan(False, reason="link")
"""Raw because compression can never pay on this group (``Policy.could_compress``)."""


@dataclass(frozen=True)
class Traffic:
    """One part of a collective, in raw bytes of this rank."""

    send: float
    encode: float
    decode: float
    encode_calls: int = 1
    decode_calls: int = 1


@dataclass(frozen=True)
class LinkSpeed:
    latency_s: float
    bytes_per_s: float


@dataclass(frozen=True)
class CodecSpeed:
    encode_bps: float
    decode_bps: float
    call_s: float


def traffic(kind: str, world: int, unit: int) -> tuple:
    """The parts of an all-gather (``unit``: the shard), reduce-scatter
    (``unit``: the chunk per rank) or all-reduce (``unit``: a chunk), in bytes."""
    peers = world - 1
    ag = Traffic(peers * unit, unit, peers * unit, 1, peers)
    rs = Traffic(peers * unit, peers * unit, peers * unit, peers, peers)
    if kind == "all_gather":
        return (ag,)
    if kind == "reduce_scatter":
        return (rs,)
    if kind == "all_reduce":
        return (rs, ag)
    raise ValueError(f"no traffic model for {kind!r}")


def predict_raw(parts: tuple, link: LinkSpeed) -> float:
    """Seconds the raw collective takes in the model."""
    return sum(link.latency_s + p.send / link.bytes_per_s for p in parts)


def predict(parts: tuple, link: LinkSpeed, speed: CodecSpeed, fraction: float,
            pieces: int) -> float:
    """Seconds the compressed collective takes in ``pieces`` pieces, in the model."""
    total = 0.0
    for p in parts:
        e = p.encode / (pieces * speed.encode_bps) + p.encode_calls * speed.call_s
        d = p.decode / (pieces * speed.decode_bps) + p.decode_calls * speed.call_s
        w = (2 * link.latency_s + fraction * p.send / (pieces * link.bytes_per_s)
             + PIECE_OVERHEAD_S)
        total += e + w + d + (pieces - 1) * max(e + d, w)
    return total


def best_plan(parts: tuple, link: LinkSpeed, speeds: dict, fractions: dict,
              forced_pieces: int = 0) -> tuple:
    """(plan, predicted seconds, predicted raw seconds); plan is ``RAW`` unless
    some (codec, pieces) beats raw by the margin."""
    raw_s = predict_raw(parts, link)
    send = max(p.send for p in parts)
    if forced_pieces:
        counts = (forced_pieces,)
    else:
        counts = [n for n in PIECE_COUNTS if n == 1 or send / n >= MIN_PIECE_BYTES]
    best, best_s = RAW, raw_s * MARGIN
    for codec, speed in speeds.items():
        for n in counts:
            t = predict(parts, link, speed, fractions[codec], n)
            if t < best_s:
                best, best_s = Plan(True, codec, n, "model"), t
    return best, (best_s if best.compress else raw_s), raw_s


# --------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _agree_max(values: list, group, device) -> list:
    """Every rank's ``values``, element-wise maximum over the group (the same on every rank)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def measure_link_local(group, world: int, device: torch.device) -> list:
    """[tiny all-gather seconds, LINK_PROBE_BYTES all-gather seconds]: this rank's
    minimum over a few repetitions (the first of each is a warm-up)."""
    ag = _all_gather
    out = []
    for nbytes, reps in ((8, 5), (LINK_PROBE_BYTES, 3)):
        send = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        recv = torch.empty(world * nbytes, dtype=torch.uint8, device=device)
        best = float("inf")
        for i in range(reps + 1):
            _sync(device)
            t0 = time.perf_counter()
            ag(recv, send, group=group)
            _sync(device)
            if i:
                best = min(best, time.perf_counter() - t0)
        out.append(best)
    return out


def measure_codec_local(dtype: torch.dtype, device: torch.device, codec: str, backend: str,
                        verify: bool) -> list:
    """[encode s, decode s of CODEC_PROBE_BYTES, encode + decode s of
    CODEC_SMALL_ELEMS elements]: minimum of two runs each, after a warm-up."""
    numel = CODEC_PROBE_BYTES // torch.empty(0, dtype=dtype).element_size()
    g = torch.Generator().manual_seed(0)
    big = torch.randn(numel, generator=g).to(dtype=dtype, device=device)
    small = big[:CODEC_SMALL_ELEMS].clone()
    times = []
    for x in (big, small):
        out = torch.empty_like(x)
        enc = dec = float("inf")
        for i in range(3):
            _sync(device)
            t0 = time.perf_counter()
            payload = _codec.encode(x, codec=codec, backend=backend, verify=verify)
            _sync(device)
            t1 = time.perf_counter()
            _codec.decode(payload, out=out, backend=backend)
            _sync(device)
            t2 = time.perf_counter()
            if i:
                enc, dec = min(enc, t1 - t0), min(dec, t2 - t1)
        times += [enc, dec]
    return [times[0], times[1], times[2] + times[3]]


def measure_ab_local(group, world: int, rank: int, x: torch.Tensor, plan: Plan, cfg) -> list:
    """[raw all-gather s, pipelined compressed all-gather s, bytes sent] of ``x``
    on this rank: the minimum of ``AB_ROUNDS`` runs each, after a warm-up,
    alternating which goes first."""
    from . import pipeline as _pipeline
    from .stats import CommStats

    ag = _all_gather
    device, numel = x.device, x.numel()
    out = torch.empty(world * numel, dtype=x.dtype, device=device)
    slots = [out[r * numel:(r + 1) * numel] for r in range(world)]
    tick = torch.zeros(1, dtype=torch.int64, device=device)
    ticks = torch.empty(world, dtype=torch.int64, device=device)
    scratch = CommStats()
    best = {"raw": float("inf"), "zip": float("inf")}
    for i in range(AB_ROUNDS + 1):
        for name in (("raw", "zip") if i % 2 else ("zip", "raw")):
            ag(ticks, tick, group=group)  # start together
            _sync(device)
            t0 = time.perf_counter()
            if name == "raw":
                ag(out, x, group=group)
            else:
                _pipeline.gather("all_gather", x, slots, group, rank, plan, cfg, scratch)
            _sync(device)
            if i:
                best[name] = min(best[name], time.perf_counter() - t0)
    sent = (AB_ROUNDS + 1) * (x.nbytes + 2 * 8) + scratch.snapshot()["all_gather"]["wire_bytes"]
    return [best["raw"], best["zip"], sent]


# --------------------------------------------------------------------------
# The policy object: one per config (``policy_for``)
# --------------------------------------------------------------------------
@dataclass
class _Site:
    fraction: dict = field(default_factory=dict)   # codec -> running wire fraction
    raw_streak: int = 0
    a2a_raw: int = 0                                 # all-to-all: raw calls in a row
    cache: tuple = ()                                # (key, plan)


class Policy:
    """Decides per call; holds the measured speeds and the ratio per call site.

    State is per process and per config (``policy_for(cfg)``); every piece of
    it that a decision reads is the same on every rank of the group (see the
    module docstring).
    """

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self._links: dict = {}         # group key -> LinkSpeed
        self._speeds: dict = {}        # (group key, dtype, device type) -> {codec: CodecSpeed}
        self._local_codec: dict = {}   # (dtype, device type, codec) -> local times
        self._sites: dict = {}         # (group key, kind, shape, dtype) -> _Site
        self._classes: dict = {}       # (group key, kind, dtype) -> _Site
        self._gates: dict = {}         # (group key, dtype, device type) -> could compress
        self.probes: dict = {}
        """(group key, dtype, device type) -> what the in-situ A/B measured."""
        self.decisions: collections.Counter = collections.Counter()
        """(kind, "raw" | codec, pieces) -> calls, for reports and tests."""

    # ------------------------------------------------------------ speeds
    def codecs(self) -> tuple:
        c = self.cfg.codec
        return ("fixed3", "dense") if c == "auto" else (c,)

    def link(self, group, world: int, device: torch.device, st=None, kind: str = "") -> LinkSpeed:
        key = _group_key(group)
        if key not in self._links:
            cfg = self.cfg
            if cfg.link_gbps is not None:
                lat_us = cfg.link_latency_us if cfg.link_latency_us is not None else \
                    DEFAULT_LATENCY_US
                self._links[key] = LinkSpeed(lat_us * 1e-6, cfg.link_gbps * 1e9 / 8)
            else:
                tiny, big = _agree_max(measure_link_local(group, world, device), group, device)
                if st is not None:
                    sent = 6 * 8 + 4 * LINK_PROBE_BYTES + 8 * 2  # warm-ups included
                    st.add(CALIBRATION, calls=1, wire_bytes=sent, size_bytes=sent)
                lat = tiny if cfg.link_latency_us is None else cfg.link_latency_us * 1e-6
                bw = (world - 1) * LINK_PROBE_BYTES / max(big - tiny, 1e-9)
                self._links[key] = LinkSpeed(lat, bw)
        return self._links[key]

    def speeds(self, group, world: int, dtype: torch.dtype, device: torch.device, st=None,
               kind: str = "") -> dict:
        key = (_group_key(group), dtype, device.type)
        if key not in self._speeds:
            cfg = self.cfg
            if cfg.codec_gbps is not None:
                bps = cfg.codec_gbps * 1e9
                self._speeds[key] = {c: CodecSpeed(bps, bps, CONFIG_CODEC_OVERHEAD_S)
                                     for c in self.codecs()}
            else:
                local = []
                for c in self.codecs():
                    lk = (dtype, device.type, c)
                    if lk not in self._local_codec:
                        self._local_codec[lk] = measure_codec_local(
                            dtype, device, c, cfg.backend, getattr(cfg, "verify", False))
                    local += self._local_codec[lk]
                agreed = _agree_max(local, group, device)
                if st is not None:
                    st.add(CALIBRATION, calls=1, wire_bytes=8 * len(local),
                           size_bytes=8 * len(local))
                speeds = {}
                for i, c in enumerate(self.codecs()):
                    enc, dec, small = agreed[3 * i:3 * i + 3]
                    call = small / 2
                    speeds[c] = CodecSpeed(CODEC_PROBE_BYTES / max(enc - call, 1e-9),
                                           CODEC_PROBE_BYTES / max(dec - call, 1e-9), call)
                if cfg.link_gbps is None:
                    speeds = self._in_situ(group, world, dtype, device, speeds, st, kind)
                self._speeds[key] = speeds
        return self._speeds[key]

    def _in_situ(self, group, world: int, dtype: torch.dtype, device: torch.device,
                 speeds: dict, st, kind: str) -> dict:
        """Correct measured speeds with one A/B on the real link: a raw and a
        pipelined compressed all-gather of Gaussian data, sized to take about
        ``PROBE_SECONDS`` raw (1 to 8 MiB per rank), best of ``AB_ROUNDS`` after a
        warm-up, the slowest rank's times. The raw time refines the link's
        bandwidth; the compressed one gives the factor ``k`` by which the
        codec runs slower inside a collective than alone (CPU cores shared
        with the other ranks and with the transfer itself, as on a loopback
        where moving bytes is CPU work); speeds are divided by ``k``."""
        key = _group_key(group)
        link = self._links[key]
        rank = dist.get_rank(group)
        itemsize = torch.empty(0, dtype=dtype).element_size()
        per_rank = link.bytes_per_s * PROBE_SECONDS / (world - 1)
        numel = int(min(max(per_rank, 1 << 20), 8 << 20)) // itemsize
        g = torch.Generator().manual_seed(17 + rank)
        x = torch.randn(numel, generator=g).to(dtype=dtype, device=device)
        parts = traffic("all_gather", world, numel * itemsize)
        local_f = [_codec.encode(x[:1 << 16], codec=c, backend=self.cfg.backend).numel()
                   / (min(numel, 1 << 16) * itemsize) for c in speeds]
        fractions = dict(zip(speeds, _agree_max(local_f, group, device)))
        codec, pieces, _ = min(((c, n, predict(parts, link, speeds[c], fractions[c], n))
                                for c in speeds for n in PIECE_COUNTS
                                if n == 1 or numel * itemsize / n >= MIN_PIECE_BYTES),
                               key=lambda t: t[2])
        plan = Plan(True, codec, pieces, "probe")
        t_raw, t_zip, sent = measure_ab_local(group, world, rank, x, plan, self.cfg)
        t_raw, t_zip = _agree_max([t_raw, t_zip], group, device)
        if st is not None:
            sent += 8 * (len(speeds) + 2)
            st.add(CALIBRATION, calls=1, wire_bytes=sent, size_bytes=sent)
        bw = (world - 1) * numel * itemsize / max(t_raw - link.latency_s, 1e-9)
        self._links[key] = link = LinkSpeed(link.latency_s, bw)

        def scaled(k):
            return {c: CodecSpeed(s.encode_bps / k, s.decode_bps / k, s.call_s * k)
                    for c, s in speeds.items()}
        lo, hi = PROBE_K_RANGE
        if predict(parts, link, scaled(lo)[codec], fractions[codec], pieces) >= t_zip:
            k = lo
        elif predict(parts, link, scaled(hi)[codec], fractions[codec], pieces) <= t_zip:
            k = hi
        else:
            for _ in range(40):  # bisection; predict grows with k
                k = (lo * hi) ** 0.5
                if predict(parts, link, scaled(k)[codec], fractions[codec], pieces) < t_zip:
                    lo = k
                else:
                    hi = k
        self.probes[(key, dtype, device.type)] = dict(
            per_rank_bytes=numel * itemsize, plan=(codec, pieces), raw_s=t_raw, zipccl_s=t_zip,
            link_bps=bw, slowdown=k)
        return scaled(k)

    # ------------------------------------------------------------ ratios
    def _site(self, group, site: tuple) -> _Site:
        key = (_group_key(group),) + site
        s = self._sites.get(key)
        if s is None:
            s = self._sites[key] = _Site()
        return s

    def _class(self, group, site: tuple) -> _Site:
        """The running ratio of every site of a (group, kind, dtype): the prior of a new site."""
        key = (_group_key(group), site[0], site[-1])
        s = self._classes.get(key)
        if s is None:
            s = self._classes[key] = _Site()
        return s

    def fractions(self, group, site: tuple, dtype: torch.dtype) -> dict:
        """Expected wire fraction per codec at a site: its own running value, else
        that of its class (same group, kind and dtype), else ``BEST_FRACTION``
        (so that the first call of a class is compressed and measures it)."""
        out = {}
        for c in self.codecs():
            for known in (self._site(group, site).fraction, self._class(group, site).fraction):
                if c in known:
                    out[c] = known[c]
                elif c == "dense" and "fixed3" in known:
                    out[c] = known["fixed3"] * DENSE_OVER_FIXED3
                elif c == "fixed3" and "dense" in known:
                    out[c] = known["dense"] / DENSE_OVER_FIXED3
                else:
                    continue
                break
            else:
                out[c] = 1.0 if c == "raw" else BEST_FRACTION.get(dtype, 1.0)
        return out

    def observe(self, group, site: tuple, codec: str, raw_bytes: int, payload_bytes: int) -> None:
        """Fold a call's global (all ranks) raw and payload bytes into the running
        ratio of its site and of its class."""
        if raw_bytes <= 0:
            return
        f = payload_bytes / raw_bytes
        for state in (self._site(group, site), self._class(group, site)):
            old = state.fraction.get(codec)
            state.fraction[codec] = f if old is None else 0.5 * (old + f)

    # ------------------------------------------------------------ decisions
    def decide(self, kind: str, group, world: int, site: tuple, dtype: torch.dtype,
               device: torch.device, parts: tuple, st=None) -> Plan:
        """The plan of one call of an all-gather, reduce-scatter or all-reduce
        (``parts`` from ``traffic``), or of an all-to-all once its sizes are
        agreed. A first call on a group may calibrate (collectives on
        ``group``, counted in ``st``)."""
        plan = self._decide(kind, group, world, site, dtype, device, parts, st)
        if logger.isEnabledFor(logging.DEBUG):  # each decision and why (plan.reason)
            logger.debug("%s %s %s: %s, expected wire fractions %s", kind, site[1], dtype, plan,
                         self.fractions(group, site, dtype))
        return self._count(kind, plan)

    def _decide(self, kind, group, world, site, dtype, device, parts, st) -> Plan:
        cfg = self.cfg
        if cfg.policy == "never":
            return RAW
        if cfg.policy == "always":
            pieces = cfg.pipeline_pieces or 1
            return Plan(True, cfg.codec, pieces, "always")
        if not self.could_compress(group, world, dtype, device, st, kind):
            return LINK_RAW
        link = self.link(group, world, device)
        speeds = self.speeds(group, world, dtype, device)
        state = self._site(group, site)
        fractions = self.fractions(group, site, dtype)
        key = (parts, tuple(sorted(fractions.items())))
        if state.cache and state.cache[0] == key:
            plan = state.cache[1]
        else:
            plan = best_plan(parts, link, speeds, fractions, cfg.pipeline_pieces)[0]
            state.cache = (key, plan)
        if plan.compress:
            state.raw_streak = 0
            return plan
        best = {c: BEST_FRACTION.get(dtype, 1.0) for c in speeds}
        hope = best_plan(parts, link, speeds, best, cfg.pipeline_pieces)[0]
        if not hope.compress:
            return Plan(False, reason="size")
        if not state.fraction:
            # Raw only by its class's ratio, never measured itself: measure it.
            # Tensors of one kind and dtype need not look alike (an fp32 lm_head
            # gradient codes to 0.86 of its bytes, the bf16-cast layer gradients
            # beside it to 0.35), and a site kept raw would be probed only once
            # in REPROBE_EVERY calls.
            return Plan(True, hope.codec, hope.pieces, "first")
        state.raw_streak += 1
        if state.raw_streak % REPROBE_EVERY == 0:
            return Plan(True, hope.codec, hope.pieces, "probe")
        return Plan(False, reason="ratio")

    def decide_all_to_all(self, group, world: int, row_shape: tuple, dtype: torch.dtype,
                          device: torch.device, send: int, coded: int, st=None) -> Plan:
        """The plan of an all-to-all whose rank sends ``send`` raw bytes to its
        peers, ``coded`` of them in splits big enough to encode. Split sizes
        differ between ranks, so the ranks first all-gather (send, coded) and
        decide on the largest; a site that went raw ``A2A_SKIP_AFTER`` times
        in a row skips that exchange (and stays raw) but for one call in
        ``REPROBE_EVERY``. Both rules read only agreed state."""
        kind = "all_to_all"
        site = (kind, row_shape, dtype)
        if not self.could_compress(group, world, dtype, device, st, kind):
            return self._count(kind, LINK_RAW)
        state = self._site(group, site)
        if state.a2a_raw >= A2A_SKIP_AFTER and state.a2a_raw % REPROBE_EVERY:
            state.a2a_raw += 1
            return self._count(kind, Plan(False, reason="streak"))
        flat = [v for row in gather_ints([send, coded], group, world, device) for v in row]
        if st is not None:
            st.add(kind, wire_bytes=16, size_bytes=16)
        most, most_coded = max(flat[0::2]), max(flat[1::2])
        if most_coded == 0:
            plan = self._count(kind, Plan(False, reason="size"))
        else:
            plan = self.decide(kind, group, world, site, dtype, device,
                               (Traffic(most, most_coded, most_coded, world - 1, world - 1),), st)
        state.a2a_raw = 0 if plan.compress else state.a2a_raw + 1
        return plan

    def _count(self, kind: str, plan: Plan) -> Plan:
        self.decisions[(kind, plan.codec if plan.compress else "raw", plan.pieces)] += 1
        return plan

    def explain(self, group, site: tuple, dtype: torch.dtype, device: torch.device,
                parts: tuple) -> dict:
        """What the model predicts for a call now (no side effects; the group's
        speeds must have been measured): the plan, its seconds, raw seconds,
        and the numbers they came from. For benchmarks and reports."""
        key = _group_key(group)
        link = self._links[key]
        speeds = self._speeds[(key, dtype, device.type)]
        fractions = self.fractions(group, site, dtype)
        plan, t, raw = best_plan(parts, link, speeds, fractions, self.cfg.pipeline_pieces)
        return dict(plan=plan, predicted_s=t, predicted_raw_s=raw, link=link, speeds=speeds,
                    fractions=fractions)

    def known_closed(self, kind: str, group, dtype: torch.dtype, device) -> bool:
        """True (and the raw call counted) when ``could_compress`` already said
        no for this group and dtype: the few-microsecond path of a fast link."""
        if not self.gate_closed(group, dtype, device):
            return False
        self.decisions[(kind, "raw", 1)] += 1
        return True

    def calibrated(self, group, dtype: torch.dtype, device) -> bool:
        """Whether calls of ``dtype`` on ``group`` decide without measuring
        anything first: the policy is not "adaptive", the config gives both
        speeds, or ``could_compress`` has measured them."""
        cfg = self.cfg
        return (cfg.policy != "adaptive"
                or (cfg.link_gbps is not None and cfg.codec_gbps is not None)
                or (_group_key(group), dtype, device.type) in self._gates)

    def gate_closed(self, group, dtype: torch.dtype, device) -> bool:
        """Whether ``could_compress`` has said no for this group and dtype
        (``known_closed`` without counting a call)."""
        return not self._gates.get((_group_key(group), dtype, device.type), True)

    def could_compress(self, group, world: int, dtype: torch.dtype, device, st=None,
                       kind: str = "") -> bool:
        """Whether compression can beat raw at any size and ratio on this group:
        false when the codec is slower than the link (then nothing is ever
        encoded, whatever the message)."""
        if self.cfg.policy != "adaptive":
            return self.cfg.policy == "always"
        key = (_group_key(group), dtype, device.type)
        if key not in self._gates:
            self.link(group, world, device, st, kind)
            speeds = self.speeds(group, world, dtype, device, st, kind)  # may refine the link
            link = self.link(group, world, device)
            huge = (Traffic(1 << 34, 1 << 34, 1 << 34),)
            best = {c: BEST_FRACTION.get(dtype, 1.0) for c in speeds}
            self._gates[key] = best_plan(huge, link, speeds, best)[0].compress
        return self._gates[key]


def policy_for(cfg) -> Policy:
    """The ``Policy`` of a config (created on first use, kept in ``cfg._runtime``)."""
    p = cfg._runtime.get("policy")
    if p is None:
        p = cfg._runtime["policy"] = Policy(cfg)
    return p
