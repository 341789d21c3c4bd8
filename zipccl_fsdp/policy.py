"""Decisions: per call, raw, compressed, or compressed and pipelined.

This is the only module that reads ``ZipCCLConfig.policy``; the collectives
ask it through the functions at the end of this file (``plan``,
``all_to_all_plan``, ``sure_raw``, ``raw_for_good``, ``outlook``). The policy picks one of three:

* ``"always"``: compress every message of at least ``min_bytes`` with the
  config's codec, in ``pipeline_pieces`` pieces (one when 0);
* ``"never"``: everything raw, reductions through zipccl's own rank-order sum;
* ``"adaptive"``: the cheapest of raw and (codec, piece count) in the cost
  model (``cost.py``), with the speeds from ``calibration.py``; a reduction
  sent raw runs zipccl's rank-order sum too, so no decision changes its bits.

The three parts of the adaptive policy, one owner each:

* ``cost.py``: the model, pure functions of sizes, speeds and ratios;
* ``calibration.py``: ``Calibration`` measures the speeds a config does not
  give (its traffic is counted under ``stats()["calibration"]``);
* this module: ``Policy`` keeps the ratio per call site, the gate per
  (group, dtype) and the decisions taken, and decides.

Why every rank decides the same: every input of a decision is the same on
every rank of the group. The speeds are the config's or agreed (the slowest
rank's, ``calibration.py``); the message size is equal on every rank for
all-gather, reduce-scatter and all-reduce (a call whose ranks pass other
sizes raises on every rank at the size row it exchanges before it sends
anything, whichever plan each rank reached: ``cost.agreed_raw``), and
all-to-all ranks exchange
their send sizes first (only when compression could ever win); and the
expected wire fraction ``f`` of a call site (group, kind, shape, dtype) is a
running mean of the *global* wire fraction of its compressed calls, which the
schedule (``pipeline.py``) exchanges with every piece's sizes. A new site
starts from the mean of its class (same group, kind and dtype: FSDP2's many
parameter groups look alike), and the first site of a class from an
optimistic ``cost.BEST_FRACTION``. A site's first call is compressed whenever
the optimistic ratio would compress, so that it measures its own ratio
rather than living on its class's. A site kept raw only by its own ratio is
probed with one compressed call every ``REPROBE_EVERY`` calls.

With ``link_gbps`` and ``codec_gbps`` given, nothing is timed: each decision
is a function of the calls (their sizes and the ratios their data gave), so
two runs of the same script decide, and train, the same.

The state lives in the owner's ``Runtime`` (``runtime.py``), one ``Policy``
per config: ``of(cfg, st)``. Decisions are counted in ``CommStats``
(``compressed_calls``, ``pipelined_calls``, ``raw_fallback_calls``) and in
``Policy.decisions``.
"""
from __future__ import annotations

import collections
import copy
import logging
from dataclasses import dataclass, field

import torch

from . import cost
from .protocol import gather_ints, group_key
from .calibration import Calibration
from .cost import LINK_RAW, RAW, SIZE_RAW, Plan, Traffic

logger = logging.getLogger(__name__)

__all__ = ["Policy", "of", "plan", "all_to_all_plan", "sure_raw", "raw_for_good",
           "lane_decisions", "outlook"]

DENSE_OVER_FIXED3 = 0.95
"""dense wire fraction / fixed3 wire fraction on model data (docs/benchmarks.md,
section "Figures behind constants"): how a site's ratio under one codec predicts
the other's."""

A2A_SKIP_AFTER = 4
"""An all-to-all site that went raw this many times in a row stops exchanging
its sizes before deciding (one latency per call) and stays raw, but for one
call in ``REPROBE_EVERY``."""

REPROBE_EVERY = 32
"""A site kept raw by its ratio alone is compressed once every this many calls."""


@dataclass
class _Site:
    fraction: dict = field(default_factory=dict)   # codec -> running wire fraction
    raw_streak: int = 0
    a2a_raw: int = 0                                 # all-to-all: raw calls in a row
    cache: tuple = ()                                # (key, plan)


class Policy:
    """The decisions of one config in one owner: the ratio per call site, the
    gate per (group, dtype, device type), and the counts of the plans taken.

    Every piece of state a decision reads is the same on every rank of the
    group (see the module docstring)."""

    def __init__(self, cfg) -> None:
        # An equal copy: the owner's runtime must not keep the caller's config
        # alive (its state goes with the config, runtime.py).
        self.cfg = cfg = copy.copy(cfg)
        self.calibration = Calibration(cfg)
        self._sites: dict = {}         # (group key, kind, shape, dtype) -> _Site
        self._classes: dict = {}       # (group key, kind, dtype) -> _Site
        self._gates: dict = {}         # (group key, dtype, device type) -> compression can pay
        self.decisions: collections.Counter = collections.Counter()
        """(kind, "raw" | codec, pieces) -> calls, for reports and tests."""

    # ------------------------------------------------------------ the gate
    def gate(self, group, world: int, dtype: torch.dtype, device, st=None) -> bool:
        """Whether compression can beat raw at any size and ratio for ``dtype``
        on ``group`` (false when the codec is slower than the link: then nothing
        is ever encoded); calibrates first where the speeds are not known."""
        key = (group_key(group), dtype, device.type)
        if key not in self._gates:
            cal = self.calibration
            cal.link(group, world, device, st)
            speeds = cal.speeds(group, world, dtype, device, st)  # may refine the link
            best = {c: cost.BEST_FRACTION.get(dtype, 1.0) for c in speeds}
            self._gates[key] = cost.could_ever_compress(cal.link(group, world, device),
                                                        speeds, best)
        return self._gates[key]

    def gate_known(self, group, dtype: torch.dtype, device):
        """What ``gate`` said for ``dtype`` on ``group``, or None before it was asked."""
        return self._gates.get((group_key(group), dtype, device.type))

    # ------------------------------------------------------------ ratios
    def _site(self, group, site: tuple) -> _Site:
        key = (group_key(group),) + site
        s = self._sites.get(key)
        if s is None:
            s = self._sites[key] = _Site()
        return s

    def _class(self, group, site: tuple) -> _Site:
        """The running ratio of every site of a (group, kind, dtype): the prior of a new site."""
        key = (group_key(group), site[0], site[-1])
        s = self._classes.get(key)
        if s is None:
            s = self._classes[key] = _Site()
        return s

    def fractions(self, group, site: tuple, dtype: torch.dtype) -> dict:
        """Expected wire fraction per codec at a site: its own running value, else
        that of its class (same group, kind and dtype), else ``BEST_FRACTION``
        (so that the first call of a class is compressed and measures it)."""
        out = {}
        for c in self.calibration.codecs:
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
                out[c] = 1.0 if c == "raw" else cost.BEST_FRACTION.get(dtype, 1.0)
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
        (``parts``: its ``cost.Traffic``), or of an all-to-all once its sizes are
        agreed. A first call on a group may calibrate (collectives on
        ``group``, counted in ``st`` under "calibration")."""
        plan = self._decide(group, world, site, dtype, device, parts, st)
        if logger.isEnabledFor(logging.DEBUG):  # each decision and why (plan.reason)
            logger.debug("%s %s %s: %s, expected wire fractions %s", kind, site[1], dtype, plan,
                         self.fractions(group, site, dtype))
        return self._count(kind, plan)

    def _decide(self, group, world, site, dtype, device, parts, st) -> Plan:
        cfg = self.cfg
        if cfg.policy == "never":
            return RAW
        if cfg.policy == "always":
            return Plan(True, cfg.codec, cfg.pipeline_pieces or 1, "always")
        if not self.gate(group, world, dtype, device, st):
            return LINK_RAW
        link = self.calibration.link(group, world, device)
        speeds = self.calibration.speeds(group, world, dtype, device)
        state = self._site(group, site)
        fractions = self.fractions(group, site, dtype)
        key = (parts, tuple(sorted(fractions.items())))
        if state.cache and state.cache[0] == key:
            plan = state.cache[1]
        else:
            plan = cost.best_plan(parts, link, speeds, fractions, cfg.pipeline_pieces)[0]
            state.cache = (key, plan)
        if plan.compress:
            state.raw_streak = 0
            return plan
        best = {c: cost.BEST_FRACTION.get(dtype, 1.0) for c in speeds}
        hope = cost.best_plan(parts, link, speeds, best, cfg.pipeline_pieces)[0]
        if not hope.compress:
            return Plan(False, reason="size")
        if not state.fraction:
            # Raw only by its class's ratio, never measured itself: measure it.
            # Tensors of one kind and dtype need not look alike (an fp32 head
            # gradient codes far worse than the bf16-cast layer gradients
            # beside it), and a site kept raw would be probed only once in
            # REPROBE_EVERY calls.
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
        if not self.gate(group, world, dtype, device, st):
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
        speeds must be known): the plan, its seconds, raw seconds, and the
        numbers they came from. For benchmarks and reports."""
        key = group_key(group)
        cal = self.calibration
        link = cal.links[key]
        speeds = cal.speeds_of[(key, dtype, device.type)]
        fractions = self.fractions(group, site, dtype)
        plan, t, raw = cost.best_plan(parts, link, speeds, fractions, self.cfg.pipeline_pieces)
        return dict(plan=plan, predicted_s=t, predicted_raw_s=raw, link=link, speeds=speeds,
                    fractions=fractions)


# --------------------------------------------------------------------------
# What the collectives ask (``st``: the call's CommStats, whose ``runtime``
# holds the owner's state)
# --------------------------------------------------------------------------
def of(cfg, st) -> Policy:
    """The ``Policy`` of ``cfg`` in the owner of ``st`` (created on first use)."""
    state = st.runtime.state(cfg)
    pol = state.policy
    if pol is None:
        pol = state.policy = Policy(cfg)
    return pol


def plan(cfg, st, kind: str, group, world: int, t: torch.Tensor, parts: tuple,
         compress: bool, big: bool = True) -> Plan:
    """The plan of an all-gather, reduce-scatter or all-reduce of ``t`` whose
    traffic is ``parts`` (``cost.gather``, ``cost.scatter_reduce``: the
    collective's own description); ``compress``: the ``compress_*`` switch and
    the caller let it compress (the same on every rank); ``big``: the message
    holds at least ``min_bytes`` (this rank's own size). Every rank whose
    sizes agree gets the same plan; a raw plan reached from ``big`` or the
    sizes is not ``cost.agreed_raw``, and the collective then exchanges a size
    row before it sends raw bytes, so ranks whose sizes differ raise there.
    The adaptive gate is asked whatever the size: it may calibrate (collectives
    on ``group``), so what calls it must be the same on every rank."""
    if not compress or cfg.policy == "never":
        return RAW
    if cfg.policy == "always":
        if not big:
            return SIZE_RAW
        if cfg.pipeline_pieces <= 1:
            return Plan(True, cfg.codec, reason="always")
    pol = of(cfg, st)
    gate = pol.gate_known(group, t.dtype, t.device)
    if gate is False:  # the hot path of a fast link
        pol.decisions[(kind, "raw", 1)] += 1
        return LINK_RAW
    if not big:
        if gate is None and cfg.policy == "adaptive":
            with st.phase(kind, "policy"):
                if not pol.gate(group, world, t.dtype, t.device, st):
                    pol.decisions[(kind, "raw", 1)] += 1
                    return LINK_RAW
        return SIZE_RAW
    with st.phase(kind, "policy"):
        return pol.decide(kind, group, world, (kind, tuple(t.shape), t.dtype), t.dtype,
                          t.device, parts, st)


def all_to_all_plan(cfg, st, group, world: int, rank: int, t: torch.Tensor, in_counts: list,
                    send_coded: list) -> Plan:
    """The plan of an all-to-all of ``t`` sending ``in_counts`` elements to each
    rank, the splits ``send_coded`` big enough to encode (split sizes differ
    between ranks: ``Policy.decide_all_to_all``)."""
    if cfg.policy == "never":
        return RAW
    pol = of(cfg, st)
    site = ("all_to_all", tuple(t.shape[1:]), t.dtype)
    if cfg.policy == "always":
        return pol.decide("all_to_all", group, world, site, t.dtype, t.device, (), st)
    itemsize = t.element_size()
    send = sum(c for r, c in enumerate(in_counts) if r != rank) * itemsize
    coded = sum(c for r, c in enumerate(in_counts) if r != rank and send_coded[r]) * itemsize
    return pol.decide_all_to_all(group, world, tuple(t.shape[1:]), t.dtype, t.device, send,
                                 coded, st)


def sure_raw(cfg, st, kind: str, group, dtype: torch.dtype, device) -> bool:
    """Whether a call of ``kind`` goes raw before any decision: ``"never"``, or
    the adaptive gate already closed for ``dtype`` on ``group`` (then the call
    is counted as a raw decision)."""
    if cfg.policy == "never":
        return True
    if cfg.policy != "adaptive":
        return False
    pol = of(cfg, st)
    if pol.gate_known(group, dtype, device) is False:
        pol.decisions[(kind, "raw", 1)] += 1
        return True
    return False


def raw_for_good(cfg, plan: Plan) -> bool:
    """Whether ``plan`` sent a call raw for a reason no later call of its kind,
    group and dtype can change: the adaptive policy's closed gate, or "never"."""
    return plan is LINK_RAW or cfg.policy == "never"


def lane_decisions(cfg, st):
    """The counter a raw lane adds its calls to: the policy's under "adaptive", else None."""
    return of(cfg, st).decisions if cfg.policy == "adaptive" else None


def outlook(cfg, st, group, dtype: torch.dtype, device, may_compress: bool) -> str:
    """What an all-reduce is known to do before it runs
    (``collectives.all_reduce_outlook``): "calibrates" or "" (anything else:
    raw or compressed, an all-reduce runs zipccl's schedule, which waits).
    ``may_compress``: the ``compress_*`` switch lets it compress (``plan``
    asks the gate whatever the size)."""
    if cfg.policy != "adaptive" or not may_compress:
        return ""
    pol = of(cfg, st)
    gate = pol.gate_known(group, dtype, device)
    return "calibrates" if gate is None and not pol.calibration.known(group, dtype, device) \
        else ""
