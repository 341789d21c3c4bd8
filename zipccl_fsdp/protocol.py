"""The wire protocol of the compressed collectives: every control integer
the ranks exchange, and every check made on them.

The schedule (``pipeline.py``) moves the payloads; the collectives
(``collectives/``) check their arguments and plan their calls; both call in
here for what the ranks tell each other, and this module calls nothing back.
Every exchange is an all-gather of int64s (``gather_ints``) that all ranks
join at the same point, so every rank sees every other's message and raises
the same error; a rank that never arrives makes the others fail at the
process group's timeout. The messages a rank may meet at a call's first
exchange (a size row, the agreement vector, a refusal) share one width
(``row_width``) and tell each other apart by their first entry:

* **Size rows** (``send_row`` / ``receive_rows``): before each piece's
  payloads move, every rank all-gathers a row: a tag (``ROW_TAG``) with the
  call's collective, dtype and reduce op, the op's factor, the payload size
  for each receiver, the elements this rank sends each rank, a hash of the
  ones it expects from each, then the raw and payload bytes it coded (so
  every rank learns the call's global ratio, which the policy's per-site
  estimate needs to stay equal on every rank). Every check of a row raises
  the same error on every rank before anything is allocated from it
  (``check_rows``): a row that is not a size row (``ZipCCLConfigError``: the
  ranks are in different steps of the protocol, such as a
  ``check_consistency`` that differs), ranks that disagree on the call
  (``ValueError``: collective, dtype, op, or the elements one sends and the
  other expects), or a payload size larger than ``max_encoded_nbytes`` of
  its slot (``CorruptPayloadError``). A call that goes raw for a reason read
  from its own sizes sends a row too (``announce``): whatever route a rank
  took from its own sizes, the ranks meet in a row first.
* **Agreement** (``check_agreement``): at the first call of a config on a
  process group every rank all-gathers, behind ``AGREE_TAG``, a hash of what
  it will put on the wire: the payload format version, the codec set of its
  build and ``ZipCCLConfig.protocol_fields()`` (the settings that choose a
  path or change the wire bytes). When the hashes differ every rank joins a
  second all-gather of one int64 per field (``PROTOCOL_SLOTS`` int64s: 256
  bytes per rank) and raises ``ZipCCLConfigError`` naming each differing
  field and the ranks on each side. A rank that skips the check
  (``check_consistency`` differing between ranks) meets it with a size row,
  and both sides raise ``ZipCCLConfigError``. The happy path costs one
  vector per rank, once per (config, group).
* **Refusal** (``refuse`` / ``raise_if_refused``): a rank whose own
  arguments fail its local checks joins the exchange its peers make first
  (the agreement vector, or a call's first size row) with ``REFUSE_TAG``
  before it raises, so that they raise ``ValueError`` naming it instead of
  waiting.
* **Fallback** (``FELL_BACK``, ``encode_failed``): an exception from the
  encoder (a codec bug, a failed C++ build, out of memory) must not leave
  the ranks in different collectives. The failing rank sends ``FELL_BACK``
  (-1) instead of its payload sizes in the size row every compressed piece
  makes; every rank then sends that piece and all later ones raw, so there
  is no extra message. The call is counted in ``fallback_calls`` (not in
  ``compressed_calls``) and the first one per stats owner is logged as a
  warning with the traceback, later ones at debug level.
* **Verify** (``decode_from``, ``settle``, ``ABORT``): with
  ``ZipCCLConfig(verify=True)`` payloads carry the per-4096-element
  checksums of ``encode(verify=True)``; the receiver's decode checks them,
  and a failure is re-raised as ``CorruptPayloadError`` with
  ``.collective``, ``.peer`` (the sending rank in the group) and ``.chunk``
  (the damaged 4096-element chunk, when the checksum found it; None for a
  damaged header or table, which the message names). The error is kept
  until the call's last exchange, then every rank learns of it (``settle``:
  one int64 per rank) and raises, so no rank goes on to a collective the
  others never join. An all-reduce stops earlier: a rank that finds a
  corrupt piece in the reduce-scatter half sends ``ABORT`` in the first row
  of the all-gather half and every rank raises there. Calls that would go
  raw are framed by the codec "raw" under verify
  (``collectives.VERIFIED_RAW``), so their bytes are checked alike; not
  covered are dtypes the codec does not handle and the pieces after a
  failed encode.

Costs are measured by ``benchmarks/verify_cost.py`` and catch rates by
``benchmarks/bitflip_transit.py`` (docs/benchmarks.md, "Verify cost" and "Bit
flips in transit"). The schedule and the calibration look
``all_gather_single`` up here at each call, so a test that wraps this one
attribute sees every all-gather zipccl makes.
"""
from __future__ import annotations

import hashlib
import logging
import struct
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

from . import codec as _codec
from . import format as F
from ._layout import device_ints
from .config import KINDS
from .errors import CorruptPayloadError, ZipCCLConfigError

log = logging.getLogger(__name__)

__all__ = ["all_gather_single", "reduce_scatter_single", "gather_ints", "group_key",
           "ROW_TAG", "AGREE_TAG", "REFUSE_TAG", "FELL_BACK", "ABORT", "REFUSALS",
           "PROTOCOL_SLOTS", "row_width", "is_size_row", "Desc", "describe", "send_row",
           "receive_rows", "check_rows", "sizes_of", "coded_bytes", "max_bytes",
           "fell_back_sizes", "announce", "protocol_fields", "check_agreement",
           "agreement_pending", "refuse", "raise_if_refused", "encode_failed", "count_fallback",
           "decode_from", "settle", "raise_if_aborted", "rank_names", "sides"]

# --------------------------------------------------------------------------
# torch's collectives, and the int64 exchange every message of the protocol is
# --------------------------------------------------------------------------
# torch 2.13 names; torch 2.11 only has the older (since deprecated) ones.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def gather_ints(values: list, group, world: int, device, async_op: bool = False):
    """All-gather a list of int64s of the same length on every rank.

    Returns the rows in rank order, or with ``async_op`` a function that waits
    for the exchange and then returns them."""
    width = len(values)
    mine = device_ints(values, device)
    every = torch.empty(world * width, dtype=torch.int64, device=device)
    work = all_gather_single(every, mine, group=group, async_op=async_op)

    def rows() -> list:
        if work is not None:
            work.wait()
        flat = every.tolist()
        return [flat[r * width:(r + 1) * width] for r in range(world)]

    return rows if async_op else rows()


def group_key(group):
    """A process group's stable name (its ``group_name``), else its id."""
    return getattr(group, "group_name", None) or id(group)


# --------------------------------------------------------------------------
# What a message's entries mean
# --------------------------------------------------------------------------
ROW_TAG = 0x5A43_5257
"""Top 32 bits of a size row's first entry ("ZCRW"); its low 32 bits hold the
call's collective, dtype and reduce op (``_pack_head``)."""

AGREE_TAG = 0x5A43_4147_5231
"""First entry of the agreement vector ("ZCAGR1")."""

REFUSE_TAG = 0x5A43_5246_5553
"""First entry of a refusal ("ZCRFUS"): the rank that sends it found its own
arguments wrong before the call's first exchange (``refuse``); the second
entry indexes ``REFUSALS``."""

FELL_BACK = -1
"""A payload size that means: this rank's encode failed, the call goes raw on every rank."""

ABORT = -2
"""A payload size that means: this rank found a corrupt payload earlier in this call."""

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

_HEAD = 2
"""Row entries before the sizes: tag with collective, dtype and op; op factor."""
_TAIL = 3
"""Row entries after the element counts: a hash of the counts this rank
expects from each rank, raw bytes coded, payload bytes."""

_DTYPE_IDS = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}
_OP_IDS = {None: 0, "sum": 1, "avg": 2, "premul_sum": 3}

# Integers below this travel as themselves (so errors can print them); other
# values (strings, tuples, big ints) as a hash with this bit set.
_HASHED = 1 << 62


def row_width(world: int) -> int:
    """Entries of a size row on a group of ``world`` ranks (the agreement
    vector and a refusal are as wide). A row carries the elements this rank
    sends each rank in full and the ones it expects only as a hash: every
    rank can rebuild each rank's expected column from the others' rows, so a
    hash is enough to check it, and small calls (a tensor-parallel
    all-reduce of a few KB) keep their rows short."""
    return _HEAD + 2 * world + _TAIL


def is_size_row(first: int) -> bool:
    """Whether ``first``, a row's first entry, starts a size row."""
    return first >> 32 == ROW_TAG


def _pack_head(kind: int, dtype: int, op: int) -> int:
    return ROW_TAG << 32 | kind << 16 | dtype << 8 | op


def _unpack_head(first: int) -> tuple:
    return (first >> 16) & 0xFFFF, (first >> 8) & 0xFF, first & 0xFF


def hash62(text: str) -> int:
    """A 62-bit hash of ``text``, the same on every rank and in every process."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 2


# --------------------------------------------------------------------------
# Who said what: the text of every error that names ranks
# --------------------------------------------------------------------------
def rank_names(ranks: list, group) -> str:
    """``[0, 2]``, or ``3`` for one rank; with the global ranks for a subgroup."""
    one = len(ranks) == 1
    text = str(ranks[0] if one else ranks)
    if group is not None and group is not dist.group.WORLD:
        glob = [dist.get_global_rank(group, r) for r in ranks]
        text += f" (global rank {glob[0]})" if one else f" (global ranks {glob})"
    return text


def _who(ranks: list, group) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_names(ranks, group)


def sides(column: list, group, show: Callable = repr) -> str:
    """``rank 0 has X; ranks [1, 2] have Y`` for one entry of every rank's
    message (``column[r]`` is rank r's), each value shown by ``show``."""
    held: dict = {}
    for r, v in enumerate(column):
        held.setdefault(v, []).append(r)
    return "; ".join(f"{_who(ranks, group)} {'has' if len(ranks) == 1 else 'have'} {show(v)}"
                     for v, ranks in held.items())


def _out_of_step(tags: list, kind: str, group, agreement: bool) -> ZipCCLConfigError:
    """The error of an exchange where some rank sent other than the agreement
    vector (``agreement``) or a size row: ranks that checked the config's
    agreement meeting ranks that sent a size row, or ranks not in the same
    collective."""
    agree = [r for r, t in enumerate(tags) if t == AGREE_TAG]
    rows = [r for r, t in enumerate(tags) if is_size_row(t)]
    if agree and rows:
        why = (f"{_who(agree, group)} checked the config's agreement (check_consistency=True) "
               f"where {_who(rows, group)} did not: check_consistency must be equal on every "
               f"rank, and so must the configs (one a rank has agreed before and another it "
               f"has not also meet like this)")
    else:
        expected = agree if agreement else rows
        other = [r for r in range(len(tags)) if r not in expected]
        why = (f"{_who(other, group)} sent something other than zipccl's "
               f"{'agreement vector' if agreement else 'size row'}: the ranks are not in the "
               f"same collective")
    return ZipCCLConfigError(f"zipccl {kind}: {why}")


# --------------------------------------------------------------------------
# Size rows
# --------------------------------------------------------------------------
_KEPT = 4096
"""Entries a memo of the size rows' checks holds before it is emptied."""


def _remembered(memo: dict, key, make):
    """``memo[key]``, made by ``make()`` on first use; ``memo`` is emptied
    when it holds ``_KEPT`` entries. A training step meets the same few calls
    again and again, so their checks' hashes and bounds are made once."""
    found = memo.get(key)
    if found is None:
        if len(memo) >= _KEPT:
            memo.clear()
        found = memo[key] = make()
    return found


_COUNTS_HASHES: dict = {}
_MAX_BYTES: dict = {}


def _counts_hash(counts) -> int:
    """A 62-bit hash of a list of element counts, the same on every rank."""
    key = tuple(int(c) for c in counts)
    return _remembered(_COUNTS_HASHES, key, lambda: hash62(repr(key)))


class Desc(NamedTuple):
    """What a call sends and expects, which every rank checks against every other's."""

    head: tuple
    """(collective, dtype, op, factor) as ints."""
    elems_to: list
    """Elements this rank sends to each rank."""
    elems_from: list
    """Elements this rank expects from each rank."""


def describe(kind: str, dtype: torch.dtype, op, elems_to: list, elems_from: list) -> Desc:
    """The ``Desc`` of a call of ``kind`` (``op`` a parsed reduce op or None)."""
    factor = 0
    if op is not None and isinstance(op.factor, (int, float)):
        factor = struct.unpack("<q", struct.pack("<d", float(op.factor)))[0]
    head = (KINDS.index(kind), _DTYPE_IDS.get(dtype, 0),
            _OP_IDS[op.kind if op is not None else None], factor)
    return Desc(head, list(elems_to), list(elems_from))


_HEAD_NAMES = ("collective", "dtype", "reduce op", "reduce op's factor")
_HEAD_SHOW = (lambda v: KINDS[v] if 0 <= v < len(KINDS) else repr(v),
              lambda v: {i: str(d) for d, i in _DTYPE_IDS.items()}.get(v, repr(v)),
              lambda v: {i: str(o).upper() for o, i in _OP_IDS.items()}.get(v, repr(v)),
              lambda v: repr(struct.unpack("<d", struct.pack("<q", v))[0]))


def fell_back_sizes(world: int, rank: int) -> list:
    """The sizes of a rank whose encode failed, or of a raw call's row:
    ``FELL_BACK`` for every peer."""
    return [0 if r == rank else FELL_BACK for r in range(world)]


def send_row(desc: Desc, sizes: list, tail: list, group, world: int, device, st,
             kind: str) -> Callable[[], list]:
    """Start the all-gather of this rank's size row: ``sizes`` for each
    receiver, ``tail`` the raw and payload bytes it coded. Returns the
    function that waits for every rank's row (``receive_rows``)."""
    row = [_pack_head(*desc.head[:3]), desc.head[3], *sizes, *desc.elems_to,
           _counts_hash(desc.elems_from), *tail]
    wait = gather_ints(row, group, world, device, async_op=True)
    st.add(kind, wire_bytes=8 * len(row), size_bytes=8 * len(row))
    return wait


def receive_rows(wait: Callable[[], list], desc: Desc, dtype: torch.dtype, piece: int,
                 pieces: int, kind: str, group, rank: int, st) -> list:
    """Every rank's row of piece ``piece`` of ``pieces``, once ``check_rows``
    found nothing wrong in them."""
    with st.phase(kind, "sizes"):
        rows = wait()
    check_rows(rows, desc, dtype, piece, pieces, kind, group, rank)
    return rows


def sizes_of(rows: list) -> list:
    """Per rank, the payload size it announced for each receiver."""
    return [row[_HEAD:_HEAD + len(rows)] for row in rows]


def coded_bytes(rows: list) -> tuple:
    """(raw bytes, payload bytes) the ranks coded for the piece of ``rows``."""
    return sum(row[-2] for row in rows), sum(row[-1] for row in rows)


def max_bytes(elems: int, dtype: torch.dtype) -> int:
    """``max_encoded_nbytes`` of a piece of ``elems`` elements with
    checksums: the most a size row may announce for it."""
    return _remembered(_MAX_BYTES, (elems, dtype), lambda: (
        F.max_encoded_nbytes(elems, dtype, 1, True) if dtype in _DTYPE_IDS else 0))


def check_rows(rows: list, desc: Desc, dtype: torch.dtype, piece: int, pieces: int, kind: str,
               group, rank: int) -> None:
    """Raise the same error on every rank when the rows show that the ranks
    are not in the same call, or announce more bytes than a slot can hold."""
    w = len(rows)
    raise_if_refused(rows, kind, group)
    tags = [row[0] for row in rows]
    if not all(is_size_row(t) for t in tags):
        raise _out_of_step(tags, kind, group, agreement=False)
    if any(row[:_HEAD] != rows[0][:_HEAD] for row in rows):
        heads = [(*_unpack_head(row[0]), row[1]) for row in rows]
        for slot, (name, show) in enumerate(zip(_HEAD_NAMES, _HEAD_SHOW)):
            column = [head[slot] for head in heads]
            if len(set(column)) > 1:
                raise ValueError(f"zipccl {kind}: the ranks disagree on the call's "
                                 f"{name}: {sides(column, group, show)}")
    to = _HEAD + w
    for s in range(w):
        sent = [rows[r][to + s] for r in range(w)]
        if _counts_hash(sent) != rows[s][-_TAIL]:
            mine = "" if s != rank else f", where it expects {list(desc.elems_from)}"
            raise ValueError(
                f"zipccl {kind}: the ranks disagree on the call's sizes: "
                f"{_who([s], group)} expects other element counts than the ranks send it "
                f"(they send {sent}, rank by rank{mine})")
    for r in range(w):
        for s in range(w):
            size = rows[r][_HEAD + s]
            if s == r or size in (FELL_BACK, ABORT):
                continue
            count = rows[r][to + s]
            elems = count * (piece + 1) // pieces - count * piece // pieces
            if not 0 <= size <= max_bytes(elems, dtype):
                raise CorruptPayloadError(
                    f"zipccl {kind}: {_who([r], group)} announced a payload of {size} bytes "
                    f"for {elems} elements to {_who([s], group)}; at most "
                    f"{max_bytes(elems, dtype)} are possible")


def announce(desc: Desc, dtype: torch.dtype, group, rank: int, world: int, pieces: int, st,
             device: torch.device, kind: str) -> None:
    """Exchange and check the size row of a call that goes raw outside the
    schedule (handed to torch) for a reason read from its own sizes
    (``cost.agreed_raw`` is false for its plan): the row its peers send first
    if their sizes made them compress, or go raw through the schedule, so
    ranks whose sizes differ raise the same ``ValueError`` here
    (``check_rows``) instead of meeting in different collectives. Its
    sizes are ``FELL_BACK``: a peer that compressed although the sizes agree
    sends the call raw with it."""
    wait = send_row(desc, fell_back_sizes(world, rank), [0, 0], group, world, device, st, kind)
    receive_rows(wait, desc, dtype, 0, pieces, kind, group, rank, st)


# --------------------------------------------------------------------------
# Agreement
# --------------------------------------------------------------------------
def protocol_fields(cfg) -> dict:
    """What every rank of a group must agree on, by name: the payload format
    version, the codecs this build decodes and the config's protocol fields."""
    return {"format_version": F.VERSION, "codec_set": tuple(_codec.CODECS),
            **cfg.protocol_fields()}


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


def _describe(fields: dict, table: list, rank: int, group) -> list:
    """One line per disagreeing field: which ranks hold which value."""
    names = ["<the list of fields: a different zipccl version>"] + list(fields)
    values = [tuple(fields)] + list(fields.values())
    lines = []
    for slot, name in enumerate(names):
        column = [row[slot] for row in table]
        if len(set(column)) == 1:
            continue
        value = values[slot]

        def show(v, mine=column[rank], value=value):
            if v == mine:
                return repr(value)
            if not v & _HASHED and isinstance(value, (bool, int)):
                return repr(type(value)(v))
            return "another value"

        lines.append(f"{name}: {sides(column, group, show)}")
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
        raise _out_of_step(tags, kind, group, agreement=True)
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
    a call's first size row: both ``row_width(world)`` int64s) with a
    refusal instead, so that they raise at once (``raise_if_refused``) instead
    of waiting for this rank until the process group's timeout. The caller
    then raises its own error. ``why`` indexes ``REFUSALS``."""
    gather_ints([REFUSE_TAG, why] + [0] * (row_width(world) - 2), group, world, device)


def raise_if_refused(rows: list, kind: str, group) -> None:
    """Raise ``ValueError`` on a rank that sees a refusal among ``rows`` (an
    agreement vector's or a size row's exchange), naming the refusing ranks."""
    refused = [r for r, row in enumerate(rows) if row[0] == REFUSE_TAG]
    if not refused:
        return
    whys = sorted({rows[r][1] for r in refused})
    what = "; ".join(REFUSALS[w] if 0 <= w < len(REFUSALS) else REFUSALS[0] for w in whys)
    raise ValueError(f"zipccl {kind}: {_who(refused, group)} refused this call "
                     f"before sending anything ({what}; the error raised there says more): "
                     f"the ranks must pass matching arguments")


# --------------------------------------------------------------------------
# Encode fallback
# --------------------------------------------------------------------------
def encode_failed(st, kind: str) -> None:
    """Log the encode error being handled on this rank (called in its
    ``except`` block); the caller then sends ``FELL_BACK``."""
    first = st.snapshot()[kind]["fallback_calls"] == 0
    (log.warning if first else log.debug)(
        "zipccl %s: encoding failed on this rank; this call goes raw on every rank "
        "(counted in fallback_calls%s)", kind,
        "; later failures are logged at debug level" if first else "", exc_info=True)


def count_fallback(st, kind: str, was_compressed: bool = True) -> None:
    """Count a call that fell back: a fallback call, no longer a compressed one."""
    st.add(kind, fallback_calls=1, compressed_calls=-int(was_compressed))


# --------------------------------------------------------------------------
# Verify: decode with context, the settling exchange and the all-reduce abort
# --------------------------------------------------------------------------
def _corrupt(kind: str, peer: int, err: Exception | None, text: str) -> CorruptPayloadError:
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
        raise _corrupt(kind, peer, e,
                       f"zipccl {kind}: the payload received from rank "
                       f"{rank_names([peer], group)} is corrupt ({where}): {e}") from e


def settle(error_peer: int, kind: str, group, world: int, device, st
           ) -> CorruptPayloadError | None:
    """After a verified call's last exchange: tell every rank whether this one
    received a corrupt payload (``error_peer``: the rank that sent it, or -1;
    one int64 per rank). Returns the error a rank whose own payloads were
    intact raises when another's were not, else None."""
    with st.phase(kind, "sizes"):
        found = [row[0] for row in gather_ints([error_peer], group, world, device)]
    st.add(kind, wire_bytes=8, size_bytes=8)
    bad = [r for r, peer in enumerate(found) if peer >= 0]
    if not bad:
        return None
    r = bad[0]
    return _corrupt(kind, r, None,
                    f"zipccl {kind}: rank {rank_names([r], group)} received a corrupt payload "
                    f"from rank {rank_names([found[r]], group)} in this call; it raises "
                    f"CorruptPayloadError, and so does every rank")


def raise_if_aborted(sizes: list, kind: str, group) -> None:
    """Raise on every rank when some rank sent ``ABORT`` in a size exchange."""
    if ABORT in sizes:
        peer = sizes.index(ABORT)
        raise _corrupt(kind, peer, None,
                       f"zipccl {kind}: rank {rank_names([peer], group)} received a corrupt "
                       f"payload earlier in this call and stopped it on every rank")
