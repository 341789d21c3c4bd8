"""Integrity for the compressed collectives: verify mode, cross-rank agreement,
and the fallback to raw when an encode fails.

The collectives (``collectives/``) call in here at four points.

* **Agreement** (``check_agreement``): at the first call of a config on a
  process group every rank all-gathers a tagged int64, a hash of what it will put
  on the wire: the payload format version, the codec set of its build and
  ``ZipCCLConfig.protocol_fields()`` (the settings that choose a path or
  change the wire bytes). When the hashes differ, every
  rank sees it (it is an all-gather), so every rank joins a second all-gather
  of a fixed-size vector of one int64 per field (``PROTOCOL_SLOTS``: 256 bytes
  per rank) and raises ``ZipCCLConfigError`` naming each differing field and
  the ranks on each side. Both exchanges are plain collectives all ranks join
  at the same point, so a mismatch raises everywhere, never hangs; a rank that
  never arrives makes the others fail at the process group's timeout. The
  fingerprint travels in a vector as wide as a size row of the schedule
  (``pipeline.row_width``), behind ``AGREE_TAG``: a rank that skips the check
  (``check_consistency`` differing between ranks) meets it with a size row,
  and both sides raise ``ZipCCLConfigError``. The happy path costs one such
  vector per rank, once per (config, group).
* **Verify** (``encode`` / ``decode_from``): with ``ZipCCLConfig(verify=True)``
  payloads carry the per-4096-element checksums of ``encode(verify=True)``;
  the receiver's decode checks them, and a failure is re-raised as
  ``CorruptPayloadError`` with ``.collective``, ``.peer`` (the sending rank in
  the group) and ``.chunk`` (the damaged 4096-element chunk, when the checksum
  found it; None for a damaged header or table, which the message names). The
  error is kept until the call's last exchange, then every rank learns of it
  (``pipeline._Call.settle``: one int64 per rank, ``corrupt_elsewhere``) and
  raises, so no rank goes on to a collective the others never join. An
  all-reduce stops earlier: a rank that finds a corrupt piece in the
  reduce-scatter half joins the all-gather half's size exchange with ``ABORT``
  and every rank raises there. Calls that would go raw are framed by the codec
  "raw" under verify (``collectives.VERIFIED_RAW``), so their bytes are
  checked alike; not covered are dtypes the codec does not handle and the
  pieces after a failed encode.
* **Refusal** (``refuse`` / ``raise_if_refused``): a rank whose own arguments
  fail its local checks joins the exchange its peers make first (the
  agreement vector, or a call's first size row) with ``REFUSE_TAG`` before it
  raises, so that they raise ``ValueError`` naming it instead of waiting.
* **Fallback** (``guarded`` / ``fell_back``): an exception from the encoder
  (a codec bug, a failed C++ build, out of memory) must not leave the ranks in
  different collectives. The failing rank sends ``FELL_BACK`` (-1) instead of
  its payload size in the size exchange every compressed call already makes;
  every rank then sees it and runs that call's raw collective instead, so
  there is no extra message. The call is counted in ``fallback_calls`` (not in
  ``compressed_calls``) and the first one per stats owner is logged as a
  warning with the traceback, later ones at debug level.

Costs are measured by ``benchmarks/verify_cost.py`` and catch rates by
``benchmarks/bitflip_transit.py`` (docs/benchmarks.md, "Verify cost" and "Bit
flips in transit").
"""
from __future__ import annotations

import hashlib
import logging

import torch
import torch.distributed as dist

from . import codec as _codec
from . import format as F
from ._wire import gather_ints, group_key
from .errors import CorruptPayloadError, ZipCCLConfigError

log = logging.getLogger(__name__)

__all__ = ["FELL_BACK", "ABORT", "AGREE_TAG", "REFUSE_TAG", "REFUSALS", "PROTOCOL_SLOTS",
           "protocol_fields", "check_agreement", "agreement_pending", "refuse", "raise_if_refused",
           "guarded", "count_fallback", "decode_from", "raise_if_aborted", "rank_names"]

FELL_BACK = -1
"""A payload size that means: this rank's encode failed, the call goes raw on every rank."""

ABORT = -2
"""A payload size that means: this rank found a corrupt payload earlier in this call."""

AGREE_TAG = 0x5A43_4147_5231
"""First entry of the agreement vector ("ZCAGR1"); size rows start with ``pipeline.ROW_TAG``."""

REFUSE_TAG = 0x5A43_5246_5553
"""First entry of a refusal ("ZCRFUS"): the rank that sends it found its own
arguments wrong before the call's first exchange (``refuse``); the second
entry indexes ``REFUSALS``."""

REFUSALS = ("its arguments are invalid",
            "its tensors' element counts do not fit the call",
            "its output and input differ in dtype or device",
            "a tensor is not contiguous or not a tensor",
            "its reduce op is not supported",
            "its split sizes are invalid",
            "its dtype is one the codec does not handle")
"""What a refusal can name, by index (the text the peers' error quotes)."""

PROTOCOL_SLOTS = 32
"""Slots of the per-field agreement vector: slot 0 hashes the field names, one
slot per field after it (room for 31 fields, about twice what
``protocol_fields`` returns; ``field_vector`` raises when they outgrow it)."""

# Integers below this travel as themselves (so errors can print them); other
# values (strings, tuples, big ints) as a hash with this bit set.
_HASHED = 1 << 62

# --------------------------------------------------------------------------
# Agreement
# --------------------------------------------------------------------------
def protocol_fields(cfg) -> dict:
    """What every rank of a group must agree on, by name: the payload format
    version, the codecs this build decodes and the config's protocol fields."""
    return {"format_version": F.VERSION, "codec_set": tuple(_codec.CODECS),
            **cfg.protocol_fields()}


def hash62(text: str) -> int:
    """A 62-bit hash of ``text``, the same on every rank and in every process."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 2


def _slot(value) -> int:
    if isinstance(value, (bool, int)) and 0 <= int(value) < _HASHED:
        return int(value)
    return _HASHED | hash62(repr(value))


def field_vector(fields: dict) -> list:
    """``PROTOCOL_SLOTS`` int64s: a hash of the field names, then one per field."""
    if len(fields) >= PROTOCOL_SLOTS:
        raise AssertionError(f"{len(fields)} protocol fields do not fit in "
                             f"{PROTOCOL_SLOTS - 1} slots; raise PROTOCOL_SLOTS")
    vec = [_HASHED | hash62(repr(tuple(fields)))] + [_slot(v) for v in fields.values()]
    return vec + [0] * (PROTOCOL_SLOTS - len(vec))


def rank_names(ranks: list, group) -> str:
    """``[0, 2]``, or ``3`` for one rank; with the global ranks for a subgroup."""
    one = len(ranks) == 1
    text = str(ranks[0] if one else ranks)
    if group is not None and group is not dist.group.WORLD:
        glob = [dist.get_global_rank(group, r) for r in ranks]
        text += f" (global rank {glob[0]})" if one else f" (global ranks {glob})"
    return text


def _describe(fields: dict, table: list, rank: int, group) -> list:
    """One line per disagreeing field: which ranks hold which value."""
    names = ["<the list of fields: a different zipccl version>"] + list(fields)
    values = [tuple(fields)] + list(fields.values())
    lines = []
    for slot, name in enumerate(names):
        column = [row[slot] for row in table]
        if len(set(column)) == 1:
            continue
        sides: dict = {}
        for r, v in enumerate(column):
            sides.setdefault(v, []).append(r)
        parts = []
        for v, ranks in sides.items():
            if v == column[rank]:
                shown = repr(values[slot])
            elif not v & _HASHED and isinstance(values[slot], (bool, int)):
                shown = repr(type(values[slot])(v))
            else:
                shown = "another value"
            who, verb = ("rank", "has") if len(ranks) == 1 else ("ranks", "have")
            parts.append(f"{who} {rank_names(ranks, group)} {verb} {shown}")
        lines.append(f"{name}: " + "; ".join(parts))
        if slot == 0:  # different field lists: the per-field slots don't line up
            break
    return lines


def check_agreement(cfg, group, world: int, device, st, kind: str) -> None:
    """Once per (config, group) in the owner of ``st`` (its ``runtime``): raise
    ``ZipCCLConfigError`` on every rank unless all ranks agree on
    ``protocol_fields(cfg)`` (see the module docstring)."""
    if not cfg.check_consistency or world == 1:
        return
    key = group_key(group)
    checked = st.runtime.state(cfg).checked_groups
    if key in checked:
        return
    from .pipeline import is_size_row, row_width

    fields = protocol_fields(cfg)
    vec = field_vector(fields)
    width = row_width(world)
    with st.phase(kind, "sizes"):
        rows = gather_ints([AGREE_TAG, hash62(repr(vec))] + [0] * (width - 2), group, world,
                           device)
    st.add(kind, wire_bytes=8 * width, size_bytes=8 * width)
    raise_if_refused(rows, kind, group)
    tags = [row[0] for row in rows]
    if any(t != AGREE_TAG for t in tags):
        rows_ = [r for r, t in enumerate(tags) if is_size_row(t)]
        mine = [r for r, t in enumerate(tags) if t == AGREE_TAG]
        why = (f"rank {rank_names(mine, group)} checked the config's agreement "
               f"(check_consistency=True) where rank {rank_names(rows_, group)} did not: "
               f"check_consistency must be equal on every rank, "
               f"and so must the configs (one a rank has agreed before and another it has not "
               f"also meet like this)") if rows_ else (
            "some rank sent something other than zipccl's agreement vector: the ranks are not "
            "in the same collective")
        raise ZipCCLConfigError(f"zipccl {kind}: {why}")
    prints = [row[1] for row in rows]
    if len(set(prints)) == 1:
        checked.add(key)
        return
    # Every rank saw the same fingerprints, so every rank joins this second exchange.
    with st.phase(kind, "sizes"):
        table = gather_ints(vec, group, world, device)
    st.add(kind, wire_bytes=8 * PROTOCOL_SLOTS, size_bytes=8 * PROTOCOL_SLOTS)
    rank = dist.get_rank(group)
    lines = _describe(fields, table, rank, group) or [f"fingerprints {prints}"]
    raise ZipCCLConfigError(
        f"zipccl {kind}: the ranks of process group {key!r} disagree on settings that decide "
        f"which collectives run and what they send (they must be equal on every rank; this is "
        f"rank {rank}):\n  " + "\n  ".join(lines))


def agreement_pending(cfg, st, group) -> bool:
    """Whether the next call of ``cfg`` on ``group`` in the owner of ``st``
    starts with the agreement check."""
    return (cfg.check_consistency
            and group_key(group) not in st.runtime.state(cfg).checked_groups)


# --------------------------------------------------------------------------
# Refusal: a call whose arguments are wrong on some ranks only
# --------------------------------------------------------------------------
def refuse(group, world: int, device, why: int) -> None:
    """Join the exchange the peers are about to make (the agreement vector or
    a call's first size row: both ``pipeline.row_width(world)`` int64s) with a
    refusal instead, so that they raise at once (``raise_if_refused``) instead
    of waiting for this rank until the process group's timeout. The caller
    then raises its own error. ``why`` indexes ``REFUSALS``."""
    from .pipeline import row_width

    gather_ints([REFUSE_TAG, why] + [0] * (row_width(world) - 2), group, world, device)


def raise_if_refused(rows: list, kind: str, group) -> None:
    """Raise ``ValueError`` on a rank that sees a refusal among ``rows`` (an
    agreement vector's or a size row's exchange), naming the refusing ranks."""
    refused = [r for r, row in enumerate(rows) if row[0] == REFUSE_TAG]
    if not refused:
        return
    whys = sorted({rows[r][1] for r in refused})
    what = "; ".join(REFUSALS[w] if 0 <= w < len(REFUSALS) else REFUSALS[0] for w in whys)
    who = "rank" if len(refused) == 1 else "ranks"
    raise ValueError(f"zipccl {kind}: {who} {rank_names(refused, group)} refused this call "
                     f"before sending anything ({what}; the error raised there says more): "
                     f"the ranks must pass matching arguments")


# --------------------------------------------------------------------------
# Encode fallback
# --------------------------------------------------------------------------
def guarded(st, kind: str, fn):
    """``fn()``, or None when it raises: the caller then sends ``FELL_BACK``."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - any codec failure becomes a raw call, on every rank
        first = st.snapshot()[kind]["fallback_calls"] == 0
        (log.warning if first else log.debug)(
            "zipccl %s: encoding failed on this rank; this call goes raw on every rank "
            "(counted in fallback_calls%s)", kind,
            "; later failures are logged at debug level" if first else "", exc_info=True)
        return None


def count_fallback(st, kind: str, was_compressed: bool = True) -> None:
    """Count a call that fell back: a fallback call, no longer a compressed one."""
    st.add(kind, fallback_calls=1, compressed_calls=-int(was_compressed))


# --------------------------------------------------------------------------
# Decode with context, and the all-reduce abort
# --------------------------------------------------------------------------
def _corrupt(kind: str, peer: int, group, err: Exception, text: str) -> CorruptPayloadError:
    new = CorruptPayloadError(text)
    new.collective, new.peer, new.chunk = kind, peer, getattr(err, "chunk", None)
    return new


def decode_from(piece: torch.Tensor, out: torch.Tensor, cfg, kind: str, peer: int,
                group) -> torch.Tensor:
    """``codec.decode(piece, out=out)``; a corrupt piece raises ``CorruptPayloadError``
    naming the collective, the sending rank and the chunk."""
    try:
        return _codec.decode(piece, out=out, backend=cfg.backend)
    except CorruptPayloadError as e:
        chunk = getattr(e, "chunk", None)
        where = f"chunk {chunk}" if chunk is not None else "header or chunk table"
        raise _corrupt(kind, peer, group, e,
                       f"zipccl {kind}: the payload received from rank "
                       f"{rank_names([peer], group)} is corrupt ({where}): {e}") from e


def corrupt_elsewhere(found: list, kind: str, group) -> CorruptPayloadError | None:
    """The error of a rank whose own payloads were intact when ``found`` (per
    rank: the peer whose payload it found corrupt, or -1) shows another rank
    that received a corrupt one; None when none did (``pipeline._Call.settle``)."""
    bad = [r for r, peer in enumerate(found) if peer >= 0]
    if not bad:
        return None
    r = bad[0]
    return _corrupt(kind, r, group, None,
                    f"zipccl {kind}: rank {rank_names([r], group)} received a corrupt payload "
                    f"from rank {rank_names([found[r]], group)} in this call; it raises "
                    f"CorruptPayloadError, and so does every rank")


def raise_if_aborted(sizes: list, kind: str, group) -> None:
    """Raise on every rank when some rank sent ``ABORT`` in a size exchange."""
    if ABORT in sizes:
        peer = sizes.index(ABORT)
        raise _corrupt(kind, peer, group, None,
                       f"zipccl {kind}: rank {rank_names([peer], group)} received a corrupt "
                       f"payload earlier in this call and stopped it on every rank")

