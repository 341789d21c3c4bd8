"""The adaptive policy's measurements: link and codec speeds, and the in-situ A/B.

``Calibration`` measures what a config does not give and reports what it
measured (``report()``); ``policy.py`` decides with its figures through the
cost model (``cost.py``). Its collectives are counted under
``stats()["calibration"]``, never under the kind of the call that triggered
it, so a kind's ``wire_bytes`` / ``raw_bytes`` is what that kind's calls cost.

Where the figures come from, and why every rank holds the same:

* link latency ``L`` and bandwidth ``B``: ``link_gbps`` / ``link_latency_us``
  from the config, else measured at the first adaptive call on the process
  group (a few tiny all-gathers and a few of ``LINK_PROBE_BYTES`` per rank):
  the latency is every rank's fastest tiny call, the slowest rank's of
  those (refined by the A/B's, below); a transfer's time is a call's
  slowest rank's (every rank's times all-reduced with MAX, call by call:
  see ``AB_ROUNDS``), the fastest call kept. All ranks hold the same figures.
* codec speeds ``E``, ``D`` and cost per call ``c``: ``codec_gbps`` from the
  config, else measured per (dtype, device type, codec) on
  ``CODEC_PROBE_BYTES`` of seeded ``probe_data`` and on
  ``CODEC_SMALL_ELEMS`` elements (for ``c``), once per process, then agreed
  per group the same way (MAX of the times); the rank-order sum's speed
  ``R`` alike, per (dtype, device type) (``measure_reduce_local``), or
  ``codec_gbps`` too when that is given.
* when the link is measured too, one in-situ A/B follows (``_in_situ``): a
  raw and a pipelined compressed all-gather of about ``PROBE_SECONDS``,
  timed the same way; the raw one refines ``B``, the compressed one says how
  much slower the codec runs inside a collective than alone, and ``E``,
  ``D``, ``c``, ``R`` are corrected by that factor (``cost.fit_slowdown``).
  On a loopback, where moving bytes is itself CPU work competing with the
  codec, that factor is what keeps the policy raw (docs/benchmarks.md,
  section "Link benchmark").

With both ``link_gbps`` and ``codec_gbps`` given nothing is timed and nothing
is sent: the figures are pure functions of the config.

What it costs is bounded by the sizes below: per process group, the link
probe and, per dtype, the codec timing and the A/B, at most 32 MB sent per
rank for the two dtypes FSDP2 moves (bf16 all-gathers, fp32 reduce-scatters).
Its calls, bytes and seconds are counted under ``stats()["calibration"]``
(``calls``, ``wire_bytes``, ``comm_s``), and each calibration of a
(group, dtype) logs one INFO line on the group's rank 0: what it measured
and what it cost.
"""
from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist

from . import codec as _codec
from . import cost
from ._reduce import SUM, RankOrderSum
from .protocol import all_gather_single as _all_gather
from .protocol import group_key
from .stats import CALIBRATION, CommStats

logger = logging.getLogger(__name__)

__all__ = ["Calibration", "codecs", "probe_data", "measure_link_local",
           "measure_codec_local", "measure_reduce_local", "measure_ab_local"]

DEFAULT_LATENCY_US = 100.0
"""Latency assumed when ``link_gbps`` is given without ``link_latency_us``."""

CONFIG_CODEC_OVERHEAD_S = 50e-6
"""Fixed cost per codec call assumed when ``codec_gbps`` is given."""

PROBE_SECONDS = 0.04
"""Raw duration the in-situ A/B aims for (``Calibration._in_situ``), within
``PROBE_BYTES``."""

PROBE_BYTES = (256 << 10, 768 << 10)
"""Bounds of the in-situ A/B's message per rank: (AB_ROUNDS + 1) raw and
compressed all-gathers of the larger, for bf16 and fp32, and the link probe
stay under 32 MB sent per rank and group."""

AB_ROUNDS = 8
"""Timed rounds of the in-situ A/B: fewer let a noisy link spread the fitted
codec slowdown widely enough to flip decisions between calibrations
(docs/benchmarks.md, section "Calibration"). A round's time is its slowest
rank's and the fastest round is kept: the time of a collective, which ends
when its last rank has its data, on its best round (a host's scheduling
noise only adds). Not each rank's fastest round: ranks that share a link
receive in turn, so in one round a rank may have its share in half the
round's time, and a bandwidth fitted to that would be twice what the link
carries. Each round costs a raw and a compressed all-gather of about
PROBE_SECONDS (within PROBE_BYTES), once per (group, dtype)."""

PROBE_K_RANGE = (1.0, 64.0)
"""Bounds of the in-situ codec slowdown factor: a codec does not run faster
inside a collective than alone; a smaller fitted factor means the short
probe's transfer beat the model (a shaper's burst), not the codec."""

LINK_PROBE_BYTES = 1 << 20
LINK_TINY_REPS, LINK_PROBE_REPS = 5, 2
"""Timed all-gathers of 8 bytes and of LINK_PROBE_BYTES (each after a warm-up)."""
CODEC_PROBE_BYTES = 512 << 10
"""Enough for the codec's speed (its cost per call comes from CODEC_SMALL_ELEMS)."""
CODEC_SMALL_ELEMS = 1024

CODEC_RUNS = 5
"""Timed runs of each codec measurement (the minimum is taken): a codec timed
alone is fast, and one run slowed by a neighbour's burst would otherwise
stand for the whole process (docs/benchmarks.md, section "Calibration")."""


def probe_data(numel: int, dtype: torch.dtype, generator, device) -> torch.Tensor:
    """What the calibration codes: Gaussian values, in fp32 cast from bf16 (the
    fp32 that moves in training is mostly bf16 gradients reduced in fp32,
    ``cost.BEST_FRACTION``), so that the in-situ A/B's compressed transfer is
    as much shorter as real calls' and the slowdown it fits is well posed."""
    x = torch.randn(numel, generator=generator)
    if dtype == torch.float32:
        x = x.bfloat16()
    return x.to(dtype=dtype, device=device)


def codecs(cfg) -> tuple:
    """The codecs the adaptive policy chooses among: the config's, or with
    ``codec="auto"`` every coding codec of the build (``codec.CODECS`` but raw)."""
    if cfg.codec != "auto":
        return (cfg.codec,)
    return tuple(c for c in _codec.CODECS if c != "raw")


# --------------------------------------------------------------------------
# Local measurements (this rank's times; agreed by ``Calibration``)
# --------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _agree_max(values: list, group, device) -> list:
    """Every rank's ``values``, element-wise maximum over the group (the same on every rank)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def measure_link_local(group, world: int, device: torch.device) -> tuple:
    """(tiny all-gather seconds, LINK_PROBE_BYTES all-gather seconds): this
    rank's times of each repetition (lists of LINK_TINY_REPS and
    LINK_PROBE_REPS), after a warm-up of each."""
    out = []
    for nbytes, reps in ((8, LINK_TINY_REPS), (LINK_PROBE_BYTES, LINK_PROBE_REPS)):
        send = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        recv = torch.empty(world * nbytes, dtype=torch.uint8, device=device)
        times = []
        for i in range(reps + 1):
            _sync(device)
            t0 = time.perf_counter()
            _all_gather(recv, send, group=group)
            _sync(device)
            if i:
                times.append(time.perf_counter() - t0)
        out.append(times)
    return tuple(out)


def _fastest_calls(series: tuple, group, device, floor: tuple = ()) -> list:
    """For each list of timed collective calls in ``series`` (this rank's
    times, call by call, as many on every rank), the fastest call, each
    taking its slowest rank's time; first, for each list in ``floor``, this
    rank's fastest call, the slowest rank's of those. One all-reduce for all."""
    agreed = _agree_max([min(times) for times in floor]
                        + [t for times in series for t in times], group, device)
    out, at = agreed[:len(floor)], len(floor)
    for times in series:
        out.append(min(agreed[at:at + len(times)]))
        at += len(times)
    return out


def measure_codec_local(dtype: torch.dtype, device: torch.device, codec: str, backend: str,
                        verify: bool) -> list:
    """[encode s, decode s of CODEC_PROBE_BYTES, encode + decode s of
    CODEC_SMALL_ELEMS elements]: minimum of ``CODEC_RUNS`` runs each, after a
    warm-up."""
    numel = CODEC_PROBE_BYTES // dtype.itemsize
    g = torch.Generator().manual_seed(0)
    big = probe_data(numel, dtype, g, device)
    small = big[:CODEC_SMALL_ELEMS].clone()
    times = []
    for x in (big, small):
        out = torch.empty_like(x)
        enc = dec = float("inf")
        for i in range(CODEC_RUNS + 1):
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


def measure_reduce_local(dtype: torch.dtype, device: torch.device) -> float:
    """Seconds of a two-rank rank-order sum of CODEC_PROBE_BYTES per rank
    (``_reduce.RankOrderSum``, as a reduce-scatter's chunk is summed): the
    minimum of ``CODEC_RUNS`` runs after a warm-up."""
    numel = CODEC_PROBE_BYTES // dtype.itemsize
    g = torch.Generator().manual_seed(1)
    parts = [probe_data(numel, dtype, g, device) for _ in range(2)]
    out = torch.empty(numel, dtype=dtype, device=device)
    best = float("inf")
    for i in range(CODEC_RUNS + 1):
        _sync(device)
        t0 = time.perf_counter()
        total = RankOrderSum(out, parts[0], SUM, len(parts))
        for r, x in enumerate(parts):
            total.add(x, r)
        total.finish()
        _sync(device)
        if i:
            best = min(best, time.perf_counter() - t0)
    return best


def measure_ab_local(group, world: int, rank: int, x: torch.Tensor, plan: cost.Plan,
                     cfg) -> tuple:
    """(raw all-gather s, pipelined compressed all-gather s, tiny all-gather
    s, bytes sent) of ``x`` on this rank: the times of ``AB_ROUNDS`` rounds
    (lists; the tiny all-gathers are the ones that start each timed call
    together, two a round), after a warm-up, alternating which goes first."""
    from . import pipeline as _pipeline

    device, numel = x.device, x.numel()
    out = torch.empty(world * numel, dtype=x.dtype, device=device)
    slots = [out[r * numel:(r + 1) * numel] for r in range(world)]
    tick = torch.zeros(1, dtype=torch.int64, device=device)
    ticks = torch.empty(world, dtype=torch.int64, device=device)
    scratch = CommStats()
    times: dict = {"raw": [], "zip": [], "tick": []}
    for i in range(AB_ROUNDS + 1):
        for name in (("raw", "zip") if i % 2 else ("zip", "raw")):
            t0 = time.perf_counter()
            _all_gather(ticks, tick, group=group)  # start together
            _sync(device)
            if i:
                times["tick"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            if name == "raw":
                _all_gather(out, x, group=group)
            else:
                _pipeline.gather("all_gather", x, slots, group, rank, plan, cfg, scratch)
            _sync(device)
            if i:
                times[name].append(time.perf_counter() - t0)
    sent = (AB_ROUNDS + 1) * (x.nbytes + 2 * 8) + scratch.snapshot()["all_gather"]["wire_bytes"]
    return times["raw"], times["zip"], times["tick"], sent


# --------------------------------------------------------------------------
# The calibration of one config
# --------------------------------------------------------------------------
class Calibration:
    """The link and codec speeds of one config, per process group: given by the
    config, or measured at first use and agreed across the group (see the
    module docstring). Owned by the config's ``policy.Policy``."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.codecs = codecs(cfg)
        self.links: dict = {}
        """group key -> ``LinkSpeed``."""
        self.speeds_of: dict = {}
        """(group key, dtype, device type) -> {codec: ``CodecSpeed``}."""
        self.probes: dict = {}
        """(group key, dtype, device type) -> what the in-situ A/B measured."""
        self._local_codec: dict = {}   # (dtype, device type, codec) -> this rank's times
        self._unlogged = [0.0, 0, 0]   # seconds, bytes sent, calls not yet in a log line

    def given(self) -> bool:
        """Whether the config gives every speed (nothing is ever timed)."""
        return self.cfg.link_gbps is not None and self.cfg.codec_gbps is not None

    def known(self, group, dtype: torch.dtype, device) -> bool:
        """Whether the speeds for ``dtype`` on ``group`` are known without timing anything."""
        return self.given() or (group_key(group), dtype, device.type) in self.speeds_of

    def report(self) -> dict:
        """What was measured or taken from the config: ``{"links": {group key:
        LinkSpeed}, "speeds": {(group key, dtype, device type): {codec:
        CodecSpeed}}, "probes": {(group key, dtype, device type): {...}}}``."""
        return {"links": dict(self.links), "speeds": dict(self.speeds_of),
                "probes": dict(self.probes)}

    def link(self, group, world: int, device: torch.device, st=None) -> cost.LinkSpeed:
        """The link of ``group``, measured at its first use unless given."""
        key = group_key(group)
        if key not in self.links:
            cfg = self.cfg
            if cfg.link_gbps is not None:
                lat_us = (cfg.link_latency_us if cfg.link_latency_us is not None
                          else DEFAULT_LATENCY_US)
                self.links[key] = cost.LinkSpeed(lat_us * 1e-6, cfg.link_gbps * 1e9 / 8)
            else:
                t0 = time.perf_counter()
                # The latency is a floor: a tiny call's slowest rank is the
                # one a host woke last, not the link.
                tiny_t, big_t = measure_link_local(group, world, device)
                tiny, big = _fastest_calls((big_t,), group, device, floor=(tiny_t,))
                sent = ((LINK_TINY_REPS + 1) * 8 + (LINK_PROBE_REPS + 1) * LINK_PROBE_BYTES
                        + 8 * (1 + LINK_PROBE_REPS))  # warm-ups and the agreement included
                self._book(st, LINK_TINY_REPS + LINK_PROBE_REPS + 3, sent,
                           time.perf_counter() - t0)
                lat = tiny if cfg.link_latency_us is None else cfg.link_latency_us * 1e-6
                bw = (world - 1) * LINK_PROBE_BYTES / max(big - tiny, 1e-9)
                self.links[key] = cost.LinkSpeed(lat, bw)
        return self.links[key]

    def speeds(self, group, world: int, dtype: torch.dtype, device: torch.device,
               st=None) -> dict:
        """{codec: ``CodecSpeed``} for ``dtype`` on ``group``, measured at first
        use unless given; the link must be known (``link``)."""
        key = (group_key(group), dtype, device.type)
        if key not in self.speeds_of:
            cfg = self.cfg
            if cfg.codec_gbps is not None:
                bps = cfg.codec_gbps * 1e9  # the rank-order sum's speed too
                self.speeds_of[key] = {c: cost.CodecSpeed(bps, bps, CONFIG_CODEC_OVERHEAD_S,
                                                          bps)
                                       for c in self.codecs}
            else:
                t0 = time.perf_counter()
                local = []
                for c in self.codecs:
                    lk = (dtype, device.type, c)
                    if lk not in self._local_codec:
                        self._local_codec[lk] = measure_codec_local(dtype, device, c,
                                                                    cfg.backend, cfg.verify)
                    local += self._local_codec[lk]
                lk = (dtype, device.type, "reduce")
                if lk not in self._local_codec:
                    self._local_codec[lk] = [measure_reduce_local(dtype, device)]
                local += self._local_codec[lk]
                agreed = _agree_max(local, group, device)
                self._book(st, 1, 8 * len(local), 0.0)
                speeds = {}
                reduce_bps = 2 * CODEC_PROBE_BYTES / max(agreed[-1], 1e-9)
                for i, c in enumerate(self.codecs):
                    enc, dec, small = agreed[3 * i:3 * i + 3]
                    call = small / 2
                    speeds[c] = cost.CodecSpeed(CODEC_PROBE_BYTES / max(enc - call, 1e-9),
                                                CODEC_PROBE_BYTES / max(dec - call, 1e-9), call,
                                                reduce_bps)
                alone = speeds
                if cfg.link_gbps is None:
                    speeds = self._in_situ(group, world, dtype, device, speeds, st)
                self._book(st, 0, 0, time.perf_counter() - t0)
                self.speeds_of[key] = speeds
                self._log(group, key, alone)
        return self.speeds_of[key]

    def _book(self, st, calls: int, nbytes: int, seconds: float) -> None:
        """Count calibration collectives (a pipelined all-gather as one call, as
        its kind counts it), the bytes this rank sent, and the time taken: in
        ``st`` when given, and toward the next log line."""
        if st is not None:
            st.add(CALIBRATION, calls=calls, wire_bytes=nbytes, size_bytes=nbytes,
                   comm_s=seconds)
        for i, value in enumerate((seconds, nbytes, calls)):
            self._unlogged[i] += value

    def _log(self, group, key: tuple, alone: dict) -> None:
        """One INFO line, on the group's rank 0, for a (group, dtype) calibrated:
        what it measured (the codec speeds ``alone``, before the in-situ
        slowdown) and what it cost (the link's probe included when it ran for
        this dtype's first call)."""
        seconds, nbytes, calls = self._unlogged
        self._unlogged = [0.0, 0, 0]
        if not logger.isEnabledFor(logging.INFO) or dist.get_rank(group) != 0:
            return
        link = self.links[key[0]]
        probe = self.probes.get(key)
        codecs = ", ".join(f"{c} {min(s.encode_bps, s.decode_bps) / 1e9:.2f} GB/s"
                           for c, s in alone.items())
        logger.info("zipccl calibration of group %s, %s on %s: link %.0f MB/s, %.0f us; "
                    "codec alone %s%s; took %.2f s, %.1f MB sent, %d calls", key[0],
                    str(key[1]).replace("torch.", ""), key[2], link.bytes_per_s / 1e6,
                    link.latency_s * 1e6, codecs,
                    f" (in a collective: {probe['slowdown']:.1f}x slower)" if probe else "",
                    seconds, nbytes / 1e6, calls)

    def _in_situ(self, group, world: int, dtype: torch.dtype, device: torch.device,
                 speeds: dict, st) -> dict:
        """Correct measured speeds with one A/B on the real link: a raw and a
        pipelined compressed all-gather of ``probe_data``, sized to take about
        ``PROBE_SECONDS`` raw (within ``PROBE_BYTES`` per rank), the fastest of
        ``AB_ROUNDS`` after a warm-up, a round's time its slowest rank's. Its
        start-together calls bound the latency, the raw time refines the
        link's bandwidth, and the compressed one gives the factor ``k`` by
        which the codec runs slower inside a collective than alone
        (CPU cores shared with the other ranks and with the transfer itself,
        as on a loopback where moving bytes is CPU work); speeds are divided
        by ``k``."""
        key = group_key(group)
        link = self.links[key]
        rank = dist.get_rank(group)
        itemsize = dtype.itemsize
        per_rank = link.bytes_per_s * PROBE_SECONDS / (world - 1)
        numel = int(min(max(per_rank, PROBE_BYTES[0]), PROBE_BYTES[1])) // itemsize
        g = torch.Generator().manual_seed(17 + rank)
        x = probe_data(numel, dtype, g, device)
        parts = (cost.gather(world, numel * itemsize),)
        local_f = [_codec.encode(x[:1 << 16], codec=c, backend=self.cfg.backend).numel()
                   / (min(numel, 1 << 16) * itemsize) for c in speeds]
        fractions = dict(zip(speeds, _agree_max(local_f, group, device)))
        self._book(st, 1, 8 * len(speeds), 0.0)
        codec, pieces, _ = min(((c, n, cost.predict(parts, link, speeds[c], fractions[c], n))
                                for c in speeds for n in cost.piece_counts(numel * itemsize)),
                               key=lambda t: t[2])
        plan = cost.Plan(True, codec, pieces, "probe")
        raw_t, zip_t, tick_t, sent = measure_ab_local(group, world, rank, x, plan, self.cfg)
        tick, t_raw, t_zip = _fastest_calls((raw_t, zip_t), group, device, floor=(tick_t,))
        # The link probe's tiny calls run back to back, in a few ms: a busy
        # host can stall every one of them (a rank woken a scheduler tick
        # late), and that latency, subtracted from the raw round, would
        # inflate the bandwidth fitted to it. The ticks, spread over the
        # A/B's rounds, give a second floor (unless the config gives it).
        lat = link.latency_s if self.cfg.link_latency_us is not None else min(link.latency_s,
                                                                              tick)
        # each round: a start-together all-gather before each of the two timed ones
        self._book(st, 4 * (AB_ROUNDS + 1) + 1, sent + 8 * (1 + 2 * AB_ROUNDS), 0.0)
        bw = (world - 1) * numel * itemsize / max(t_raw - lat, 1e-9)
        self.links[key] = link = cost.LinkSpeed(lat, bw)
        k = cost.fit_slowdown(parts, link, speeds[codec], fractions[codec], pieces, t_zip,
                              PROBE_K_RANGE)
        self.probes[(key, dtype, device.type)] = dict(
            per_rank_bytes=numel * itemsize, plan=(codec, pieces), raw_s=t_raw, zipccl_s=t_zip,
            link_bps=bw, slowdown=k)
        return {c: s.slowed(k) for c, s in speeds.items()}
