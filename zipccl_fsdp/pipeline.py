"""The schedule every collective runs: encode piece i+1, move piece i, decode piece i-1.

Each collective of ``collectives/`` describes its call (``protocol.Desc``:
what it sends each rank and expects from each) and hands this module a ``Plan``
(``policy.py``): raw, or compressed with a codec in ``plan.pieces`` pieces.
A one-piece compressed call is the ``pieces == 1`` case of the same schedule,
and zipccl's own raw reduction (an all-to-all then an fp32 sum in rank order)
is the case with no rows. Piece i of a slot (an all-gather shard, a
reduce-scatter chunk, an all-to-all split) of ``c`` elements is elements
``[c i // P, c (i + 1) // P)``, which every rank computes alike. Per piece:

1. encode this rank's part of the piece (the rank's thread; on CUDA a side
   stream);
2. all-gather a *size row* of int64 per rank (``protocol.send_row``): the
   payload size for each receiver and what the call is, which every rank
   checks against every other's (``protocol.check_rows``);
3. exchange the payloads with an async collective (``async_op=True``: gloo
   moves them in its own threads, NCCL on its stream): the all-gather padded
   to the piece's largest payload, or an all-to-all with exact splits;
4. decode (and for reductions, add in fp32 in rank order) the piece before.

Steps 1 and 4 of neighbouring pieces run while step 3 is in flight. Results
are bitwise the same for every piece count, since every element is decoded
from its own bytes and reduced in rank order 0..w-1.

The control integers of a call (its size rows, the fallback's
``FELL_BACK``, the all-reduce's ``ABORT``, the settling exchange under
``verify``) and every check made on them are the protocol's
(``protocol.py``): a rank whose encode fails sends ``FELL_BACK`` in its row,
and every rank then sends that piece and all later ones raw (the remaining
rows are skipped: raw sizes are known); a corrupt payload is kept as the
error of the call and raised after the last exchange, so every rank stays in
step. A raw call sends a row with its first piece too (its sizes
``FELL_BACK``), unless its sizes are agreed already: whatever route a rank
took from its own sizes, the ranks meet in a row first.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

import torch
import torch.distributed as dist

from . import codec as _codec
from . import protocol
from ._layout import (gather_source, padded_in_place, same_memory, split_flat,
                      stream_per_device, zero_padded)
from ._reduce import RankOrderSum
from .errors import CorruptPayloadError

__all__ = ["Outcome", "gather", "scatter_reduce", "all_to_all"]


class Outcome(NamedTuple):
    """How a call went; the caller counts it and raises ``error``."""

    fell_back: bool
    """Some rank's encode failed, so some pieces went raw on every rank."""
    coded: bool
    """At least one piece went compressed."""
    error: Exception | None
    """The first corrupt payload this rank received (raised by the caller
    after every exchange of the call)."""


def _bounds(count: int, pieces: int) -> list:
    return [count * i // pieces for i in range(pieces + 1)]


_EMPTY: dict = {}


def _empty_bytes(device: torch.device) -> torch.Tensor:
    """A uint8 tensor of no elements on ``device``, made once: what a rank
    sends itself in an all-to-all (nothing ever writes it)."""
    empty = _EMPTY.get(device)
    if empty is None:
        empty = _EMPTY[device] = torch.empty(0, dtype=torch.uint8, device=device)
    return empty


_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device):
    """The codec's stream on ``device`` (one per device, ``_layout.stream_per_device``)."""
    return stream_per_device(_SIDE_STREAMS, device)


class _Streams:
    """On CUDA the codec runs on a side stream: it waits for the caller's
    stream once (the inputs), the side stream waits for each collective
    before decoding (``work.wait()`` under ``codec()``), and the caller's
    stream waits for the side stream at the end. On the CPU every method is
    a no-op.

    Two rules keep the streams from racing. The caller's stream waits for
    the side stream (``before_launch``) before it touches anything of a
    piece: the payloads it copies or sends were written there, and a receive
    buffer it is about to reuse may still be read there. And a payload lives
    until its piece is drained: the caching allocator hands a freed side
    stream block to the next encode at once, ordered only against the side
    stream, which has waited for the collective only by then."""

    def __init__(self, device: torch.device) -> None:
        self.on = device.type == "cuda"
        if self.on:
            self.main = torch.cuda.current_stream(device)
            self.side = _side_stream(device)
            self.side.wait_stream(self.main)

    def codec(self):
        return torch.cuda.stream(self.side) if self.on else nullcontext()

    def before_launch(self) -> None:
        if self.on:
            self.main.wait_stream(self.side)

    def done(self) -> None:
        if self.on:
            self.main.wait_stream(self.side)


class _Call:
    """One call of a collective: its rows, fallback, ratio and errors, and the
    schedule that overlaps its pieces (``run``)."""

    def __init__(self, kind, group, world, rank, plan, cfg, st, device,
                 desc: protocol.Desc, dtype: torch.dtype, agreed: bool = False) -> None:
        self.kind, self.group, self.world, self.rank = kind, group, world, rank
        self.plan, self.cfg, self.st, self.device = plan, cfg, st, device
        self.desc, self.dtype = desc, dtype
        self.streams = _Streams(device)
        self.empty = _empty_bytes(device)  # what a rank sends itself
        self.raw_mode = not plan.compress  # sticky after a FELL_BACK
        # A raw call's first piece still exchanges a size row (its sizes
        # ``FELL_BACK``), unless the ranks have agreed on the sizes already.
        self.announce = self.raw_mode and not agreed
        self.fell = False
        self.coded = False
        self.error: Exception | None = None
        self.error_peer = -1        # the rank whose payload was corrupt
        self.coded_raw = 0          # global raw bytes of coded pieces
        self.coded_payload = 0      # and their payload bytes

    def run(self, raw, encode, exchange, drain) -> None:
        """Move every piece: encode piece i+1 while piece i is in flight, then
        decode piece i-1.

        ``raw(i)``: what piece i sends raw; ``encode(i)``: its payload(s) and
        this rank's sizes for each receiver; ``exchange(i, payloads, rows)``:
        launch its exchange (``rows`` is None when the piece goes raw) and
        return the work and a tuple for ``drain``, called with that tuple once
        the work is done."""
        def begin(i):
            if self.raw_mode:
                if i == 0 and self.announce:
                    sizes = protocol.fell_back_sizes(self.world, self.rank)
                    return raw(0), self.launch_row(sizes, [0, 0])
                return raw(i), None
            payloads, sizes, tail = encode(i)
            return payloads, self.launch_row(sizes, tail)

        pieces = self.plan.pieces
        started = begin(0)
        in_flight: list = []
        for i in range(pieces):
            payloads, launched = started
            started = rows = None
            if launched is not None:
                rows = self.rows(launched, i)
                if self.raw_mode:
                    payloads, rows = raw(i), None
            in_flight.append(exchange(i, payloads, rows))
            if i + 1 < pieces:
                started = begin(i + 1)
            if len(in_flight) > 1:
                self._land(in_flight.pop(0), drain)
        while in_flight:
            self._land(in_flight.pop(0), drain)

    def _land(self, flight, drain) -> None:
        work, entry = flight
        with self.st.phase(self.kind, "exchange"), self.streams.codec():
            work.wait()
        drain(*entry)

    def raw_parts(self, part, i: int) -> list:
        """Piece ``i`` of the split for each peer, as bytes (nothing for this
        rank): what an all-to-all piece sends raw."""
        return [self.empty if r == self.rank else part(r, i).view(torch.uint8)
                for r in range(self.world)]

    def launch_all_to_all(self, i: int, payloads: list, recv_sizes: list, coded: bool):
        """Start piece ``i``'s async all-to-all of ``payloads`` (one per peer);
        returns the work and the drain's tuple: ``i``, the receive buffer,
        ``recv_sizes``, ``coded`` and what must outlive the work (``_Streams``)."""
        self.streams.before_launch()
        send_sizes = [p.numel() for p in payloads]
        # One peer (two ranks): its payload as it is, without a copy into a new buffer.
        live = [p for p in payloads if p.numel()]
        send = live[0] if len(live) == 1 else torch.cat(payloads)
        recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=self.device)
        work = dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=self.group,
                                      async_op=True)
        self.st.add(self.kind, wire_bytes=sum(send_sizes))
        return work, (i, recv, recv_sizes, coded, (send, payloads))

    def encode(self, x: torch.Tensor, codec: str | None = None, room: int = 0):
        """Payload of ``x`` (with ``codec``, by default the plan's; with
        ``room``, as ``codec.encode``'s), or None when the encoder failed (the
        rank sends FELL_BACK)."""
        cfg, codec = self.cfg, codec or self.plan.codec
        with self.st.phase(self.kind, "encode"), self.streams.codec():
            try:
                return _codec.encode(x, codec=codec, backend=cfg.backend, verify=cfg.verify,
                                     room=room)
            except Exception:  # noqa: BLE001 - any codec failure becomes a raw call, on every rank
                protocol.encode_failed(self.st, self.kind)
                return None

    def launch_row(self, sizes: list, tail: list):
        """Start the exchange of this rank's size row (``protocol.send_row``)."""
        return protocol.send_row(self.desc, sizes, tail, self.group, self.world, self.device,
                                 self.st, self.kind)

    def rows(self, wait, i: int) -> list:
        """Wait for piece ``i``'s row exchange and check it
        (``protocol.receive_rows``); return every rank's sizes for each
        receiver. Marks a fallback (all later pieces go raw) and counts the
        coded bytes."""
        rows = protocol.receive_rows(wait, self.desc, self.dtype, i, self.plan.pieces, self.kind,
                                     self.group, self.rank, self.st)
        sizes = protocol.sizes_of(rows)
        flat = [v for row in sizes for v in row]
        if protocol.ABORT in flat:
            return sizes
        if protocol.FELL_BACK in flat:
            self.fell = self.fell or not self.raw_mode  # not a raw call's own announcement
            self.raw_mode = True
        else:
            self.coded = True
            raw, payload = protocol.coded_bytes(rows)
            self.coded_raw += raw
            self.coded_payload += payload
        return sizes

    def decode(self, piece: torch.Tensor, out: torch.Tensor, peer: int) -> None:
        if self.error is not None:
            return  # the call is lost; keep exchanging so the peers stay in step
        try:
            protocol.decode_from(piece, out, self.cfg, self.kind, peer, self.group)
        except (CorruptPayloadError, ValueError) as e:
            self.error, self.error_peer = e, peer

    def settle(self) -> None:
        """Under ``verify``, after the last exchange: every rank learns whether
        some rank received a corrupt payload (``protocol.settle``), so that the
        call raises on every rank, not only on the one that received it (its
        peers would otherwise go on to a next collective it never joins)."""
        if not self.cfg.verify or self.world == 1:
            return
        elsewhere = protocol.settle(self.error_peer, self.kind, self.group, self.world,
                                    self.device, self.st)
        if self.error is None:
            self.error = elsewhere

    def finish(self, policy, site: tuple) -> Outcome:
        self.streams.done()
        if self.coded_raw and policy is not None:
            policy.observe(self.group, site, self.plan.codec, self.coded_raw, self.coded_payload)
        return Outcome(self.fell, self.coded, self.error)


def _aborted(sizes: list, call: _Call, abort) -> None:
    first = [row[0] for row in sizes]
    if protocol.ABORT in first:
        if abort is not None:
            raise abort
        protocol.raise_if_aborted(first, call.kind, call.group)


# --------------------------------------------------------------------------
# All-gather
# --------------------------------------------------------------------------
def gather(kind: str, own: torch.Tensor, slots: list, group, rank: int, plan, cfg, st,
           policy=None, site: tuple = (), abort: Exception | None = None,
           agreed: bool = False) -> Outcome:
    """All-gather ``own`` (flat) into ``slots`` (flat views, one per rank; their
    sizes may differ, as all-reduce's do) in ``plan.pieces`` pieces, raw when
    ``plan`` is. With ``abort`` (an all-reduce whose first half failed) every
    rank raises at the first row: this one ``abort``, the others
    ``CorruptPayloadError``. ``agreed``: the ranks have checked each other's
    sizes already (an all-reduce's second half), so a raw call sends no row."""
    world = len(slots)
    device = own.device
    own = gather_source(own, slots, rank)
    desc = protocol.describe(kind, own.dtype, None, [own.numel()] * world,
                             [s.numel() for s in slots])
    call = _Call(kind, group, world, rank, plan, cfg, st, device, desc, own.dtype, agreed)
    itemsize = own.element_size()
    bounds = [_bounds(s.numel(), plan.pieces) for s in slots]
    placed = [True] if same_memory(own, slots[rank]) else []
    # On the host a coded piece is encoded with room for the widest slot and
    # padded where it is (a copy would be a pass over host memory); a
    # device's backend makes no room, and its copy is what zero_padded does.
    in_place = device.type == "cpu"

    def room(i):
        """The room piece i's payload is encoded with (``in_place``)."""
        if not in_place:
            return 0
        return max(protocol.max_bytes(b[i + 1] - b[i], own.dtype) for b in bounds)

    def mine(i):
        return own[bounds[rank][i]:bounds[rank][i + 1]]

    def raw(i):
        return mine(i).view(torch.uint8)

    def encode(i):
        if abort is not None:
            return None, [protocol.ABORT] * world, [0, 0]
        x = mine(i)
        payload = call.encode(x, room=room(i))
        size = protocol.FELL_BACK if payload is None else payload.numel()
        return payload, [size] * world, [x.nbytes, max(size, 0)]

    def exchange(i, payload, rows):
        if rows is None:
            sizes = [(b[i + 1] - b[i]) * itemsize for b in bounds]
        else:
            _aborted(rows, call, abort)
            sizes = [row[0] for row in rows]
        width = max(sizes)
        call.streams.before_launch()
        pad = padded_in_place if in_place and rows is not None else zero_padded
        send = pad(payload, width)
        recv = torch.empty(world * width, dtype=torch.uint8, device=device)
        work = protocol.all_gather_single(recv, send, group=group, async_op=True)
        st.add(kind, wire_bytes=width, pad_bytes=width - payload.numel())
        if not placed:
            # this rank's own slot, while the first piece is in flight
            # (nothing in flight reads or writes it: ``own`` is not in it)
            slots[rank].copy_(own)
            placed.append(True)
        return work, (i, recv, width, sizes, rows is not None, (send, payload))

    def drain(i, recv, width, sizes, coded, _keep):
        with st.phase(kind, "decode"), call.streams.codec():
            for r in range(world):
                if r == rank:
                    continue
                out = slots[r][bounds[r][i]:bounds[r][i + 1]]
                got = recv[r * width:r * width + sizes[r]]
                if coded:
                    call.decode(got, out, r)
                else:
                    out.view(torch.uint8).copy_(got)

    call.run(raw, encode, exchange, drain)
    call.settle()
    return call.finish(policy, site)


# --------------------------------------------------------------------------
# Reduce-scatter
# --------------------------------------------------------------------------
def scatter_reduce(kind: str, flat_in: torch.Tensor, counts: list, out: torch.Tensor, op,
                   group, rank: int, plan, cfg, st, policy=None, site: tuple = (),
                   settle: bool = True) -> Outcome:
    """Reduce chunk ``rank`` of every rank's ``flat_in`` (chunks of ``counts``
    elements, rank order) into ``out``: fp32 sum in rank order, then scale and
    cast, in ``plan.pieces`` pieces; raw (an all-to-all, then the same sum)
    when ``plan`` is. A decode error is returned in the outcome, not raised,
    so that an all-reduce can stop its second half on every rank (which it
    does instead of ``settle``: its second half's first row carries ABORT)."""
    world = len(counts)
    device = flat_in.device
    itemsize = flat_in.element_size()
    chunks = split_flat(flat_in, counts)
    n = counts[rank]
    mine = chunks[rank]
    # Before _Call: the side stream reads what these write on the caller's
    # stream (a PREMUL_SUM factor cast to fp32), and it waits for that stream
    # once, when the call is made.
    total = RankOrderSum(out, flat_in, op, world)
    scratch = torch.empty(n, dtype=flat_in.dtype, device=device) if plan.compress else None
    desc = protocol.describe(kind, flat_in.dtype, op, counts, [n] * world)
    call = _Call(kind, group, world, rank, plan, cfg, st, device, desc, flat_in.dtype)
    bounds = [_bounds(c, plan.pieces) for c in counts]

    def part(r, i):
        return chunks[r][bounds[r][i]:bounds[r][i + 1]]

    def raw(i):
        return call.raw_parts(part, i)

    def encode(i):
        payloads, failed = [], False
        for r in range(world):
            if r == rank:
                payloads.append(call.empty)
                continue
            p = call.encode(part(r, i)) if not failed else None
            failed = failed or p is None
            payloads.append(p)
        if failed:
            return payloads, protocol.fell_back_sizes(world, rank), [0, 0]
        sizes = [p.numel() for p in payloads]
        raw_bytes = sum(part(r, i).nbytes for r in range(world) if r != rank)
        return payloads, sizes, [raw_bytes, sum(sizes)]

    def exchange(i, payloads, rows):
        if rows is None:
            recv_sizes = [0 if r == rank else (bounds[rank][i + 1] - bounds[rank][i]) * itemsize
                          for r in range(world)]
        else:
            recv_sizes = [rows[r][rank] for r in range(world)]
        return call.launch_all_to_all(i, payloads, recv_sizes, rows is not None)

    def drain(i, recv, recv_sizes, coded, _keep):
        a, b = bounds[rank][i], bounds[rank][i + 1]
        decoded = scratch[a:b] if coded else None
        offset = 0
        with call.streams.codec():
            for r in range(world):
                size = recv_sizes[r]
                if r == rank:
                    src = mine[a:b]
                elif coded:
                    with st.phase(kind, "decode"):
                        call.decode(recv[offset:offset + size], decoded, r)
                    src = decoded
                else:
                    src = recv[offset:offset + size].view(flat_in.dtype)
                offset += size
                if call.error is None:
                    with st.phase(kind, "reduce"):
                        total.add(src, r, a, b)

    if world > 1:
        call.run(raw, encode, exchange, drain)
        if settle:
            call.settle()
    else:
        total.add(mine, 0)
    with st.phase(kind, "reduce"), call.streams.codec():
        total.finish()
    return call.finish(policy, site)


# --------------------------------------------------------------------------
# All-to-all
# --------------------------------------------------------------------------
def all_to_all(kind: str, in_parts: list, out_parts: list, send_codecs: list,
               recv_coded: list, group, rank: int, plan, cfg, st, policy=None,
               site: tuple = ()) -> Outcome:
    """Send ``in_parts[r]`` to rank r and receive ``out_parts[r]`` from it (flat
    views), in ``plan.pieces`` pieces, encoding split r with ``send_codecs[r]``
    (None: raw bytes) and decoding the received splits marked in
    ``recv_coded``. A received split that is corrupt is the outcome's error."""
    world = len(in_parts)
    device = in_parts[rank].device
    dtype = in_parts[rank].dtype
    itemsize = in_parts[rank].element_size()
    desc = protocol.describe(kind, dtype, None, [x.numel() for x in in_parts],
                             [x.numel() for x in out_parts])
    call = _Call(kind, group, world, rank, plan, cfg, st, device, desc, dtype)
    b_in = [_bounds(x.numel(), plan.pieces) for x in in_parts]
    b_out = [_bounds(x.numel(), plan.pieces) for x in out_parts]

    def part(r, i):
        return in_parts[r][b_in[r][i]:b_in[r][i + 1]]

    def raw(i):
        return call.raw_parts(part, i)

    def encode(i):
        payloads, failed, raw_bytes, coded_bytes = [], False, 0, 0
        for r in range(world):
            x = part(r, i)
            if r == rank:
                payloads.append(call.empty)
            elif send_codecs[r] is not None and not failed:
                p = call.encode(x, send_codecs[r])
                failed = p is None
                payloads.append(p)
                if p is not None and send_codecs[r] == plan.codec:  # the ratio the policy learns
                    raw_bytes += x.nbytes
                    coded_bytes += p.numel()
            else:
                payloads.append(x.view(torch.uint8))
        if failed:
            return payloads, protocol.fell_back_sizes(world, rank), [0, 0]
        return payloads, [p.numel() for p in payloads], [raw_bytes, coded_bytes]

    def exchange(i, payloads, rows):
        if rows is None:
            recv_sizes = [0 if r == rank else (b_out[r][i + 1] - b_out[r][i]) * itemsize
                          for r in range(world)]
        else:
            recv_sizes = [0 if r == rank else rows[r][rank] for r in range(world)]
        return call.launch_all_to_all(i, payloads, recv_sizes, rows is not None)

    def drain(i, recv, recv_sizes, coded, _keep):
        offset = 0
        with st.phase(kind, "decode"), call.streams.codec():
            for r in range(world):
                got = recv[offset:offset + recv_sizes[r]]
                offset += recv_sizes[r]
                if r == rank:
                    continue
                out = out_parts[r][b_out[r][i]:b_out[r][i + 1]]
                if coded and recv_coded[r]:
                    call.decode(got, out, r)
                elif got.numel() == out.nbytes:
                    out.view(torch.uint8).copy_(got)
                elif call.error is None:  # a raw split whose size the row check allowed
                    call.error_peer = r
                    call.error = CorruptPayloadError(
                        f"zipccl {kind}: rank {protocol.rank_names([r], group)} sent "
                        f"{got.numel()} bytes for a raw split of {out.numel()} elements")

    call.run(raw, encode, exchange, drain)
    call.settle()
    out_parts[rank].copy_(in_parts[rank])
    return call.finish(policy, site)
