"""Pipelined compressed collectives: encode piece i+1, move piece i, decode piece i-1.

``collectives.py`` calls these when the policy (``policy.py``) picks
compression under ``policy="adaptive"``, or when ``pipeline_pieces`` > 1.
A message is cut into ``plan.pieces`` pieces: piece i of a slot (an
all-gather shard, a reduce-scatter chunk, an all-to-all split) of ``c``
elements is elements ``[c i // P, c (i + 1) // P)``, which every rank computes
alike. Per piece:

1. encode this rank's part of the piece (the rank's thread; on CUDA a side
   stream);
2. all-gather a *row* of int64 per rank: the payload size for each receiver,
   then the raw and payload bytes this rank coded (so every rank learns the
   call's global ratio, which the policy's per-site estimate needs to stay
   equal on every rank);
3. exchange the payloads with an async collective (``async_op=True``: gloo
   moves them in its own threads, NCCL on its stream): the all-gather padded
   to the piece's largest payload, or an all-to-all with exact splits;
4. decode (and for reductions, add in fp32 in rank order) the piece before.

Steps 1 and 4 of neighbouring pieces run while step 3 is in flight. One
piece behaves as the one-shot collectives of ``collectives.py`` do, with a
different row; results are bitwise the same for every piece count, since
every element is decoded from its own bytes and reduced in rank order 0..w-1.

Integrity (``integrity.py``): a rank whose encode fails sends ``FELL_BACK`` in
its row; every rank then sends that piece and all later ones raw (the
remaining rows are skipped: raw sizes are known). A corrupt payload is kept
as the error of the call and raised after the last exchange, so every rank
stays in step; an all-reduce whose reduce-scatter half found one sends
``ABORT`` in the first row of its all-gather half, and every rank raises.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

import torch
import torch.distributed as dist

from . import codec as _codec
from . import integrity as _integrity
from ._layout import (device_ints, gather_source, same_memory, split_flat, stream_per_device,
                      zero_padded)
from ._reduce import RankOrderSum
from .errors import CorruptPayloadError

__all__ = ["Outcome", "gather", "scatter_reduce", "all_to_all"]

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

_TAIL = 2
"""Row entries after the per-receiver sizes: raw bytes coded, payload bytes."""


class Outcome(NamedTuple):
    """How a pipelined call went; the caller counts it and raises ``error``."""

    fell_back: bool
    """Some rank's encode failed, so some pieces went raw on every rank."""
    coded: bool
    """At least one piece went compressed."""
    error: Exception | None
    """The first corrupt or mismatched payload this rank received (raised by
    the caller after every exchange of the call)."""


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
def _bounds(count: int, pieces: int) -> list:
    return [count * i // pieces for i in range(pieces + 1)]


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
    """Bookkeeping shared by the three collectives: rows, fallback, ratio, errors,
    and the schedule that overlaps their pieces (``run``)."""

    def __init__(self, kind, group, world, rank, plan, cfg, st, device) -> None:
        self.kind, self.group, self.world, self.rank = kind, group, world, rank
        self.plan, self.cfg, self.st, self.device = plan, cfg, st, device
        self.streams = _Streams(device)
        self.empty = torch.empty(0, dtype=torch.uint8, device=device)  # what a rank sends itself
        self.raw_mode = False       # sticky after a FELL_BACK
        self.fell = False
        self.coded = False
        self.error: Exception | None = None
        self.coded_raw = 0          # global raw bytes of coded pieces
        self.coded_payload = 0      # and their payload bytes

    def run(self, raw, encode, exchange, drain) -> None:
        """Move every piece: encode piece i+1 while piece i is in flight, then
        decode piece i-1.

        ``raw(i)``: what piece i sends raw; ``encode(i)``: its payload(s) and
        this rank's row; ``exchange(i, payloads, rows)``: launch its exchange
        (``rows`` is None when the piece goes raw) and return the work and a
        tuple for ``drain``, called with that tuple once the work is done."""
        def begin(i):
            if self.raw_mode:
                return raw(i), None
            payloads, row = encode(i)
            return payloads, self.launch_row(row)

        pieces = self.plan.pieces
        started = begin(0)
        in_flight: list = []
        for i in range(pieces):
            payloads, launched = started
            started = rows = None
            if launched is not None:
                rows = self.rows(launched)
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

    def fell_back_row(self) -> list:
        """The row of a rank whose encode failed: ``FELL_BACK`` for every peer."""
        return [0 if r == self.rank else _integrity.FELL_BACK for r in range(self.world)] + [0, 0]

    def launch_all_to_all(self, i: int, payloads: list, recv_sizes: list, coded: bool):
        """Start piece ``i``'s async all-to-all of ``payloads`` (one per peer);
        returns the work and the drain's tuple: ``i``, the receive buffer,
        ``recv_sizes``, ``coded`` and what must outlive the work (``_Streams``)."""
        self.streams.before_launch()
        send_sizes = [p.numel() for p in payloads]
        send = torch.cat(payloads)
        recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=self.device)
        work = dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=self.group,
                                      async_op=True)
        self.st.add(self.kind, wire_bytes=sum(send_sizes))
        return work, (i, recv, recv_sizes, coded, (send, payloads))

    def encode(self, x: torch.Tensor):
        """Payload of ``x``, or None when the encoder failed (the rank sends FELL_BACK)."""
        cfg, plan = self.cfg, self.plan
        with self.st.phase(self.kind, "encode"), self.streams.codec():
            return _integrity.guarded(self.st, self.kind, lambda: _codec.encode(
                x, codec=plan.codec, backend=cfg.backend, verify=getattr(cfg, "verify", False)))

    def launch_row(self, row: list):
        mine = device_ints(row, self.device)
        every = torch.empty(self.world * len(row), dtype=torch.int64, device=self.device)
        work = _all_gather_single(every, mine, group=self.group, async_op=True)
        self.st.add(self.kind, wire_bytes=8 * len(row), size_bytes=8 * len(row))
        return work, every, len(row)

    def rows(self, launched) -> list:
        """Wait for a row exchange; return every rank's row. Marks a fallback
        (all later pieces go raw) and counts the coded bytes."""
        work, every, width = launched
        with self.st.phase(self.kind, "sizes"):
            work.wait()
            flat = every.tolist()
        rows = [flat[r * width:(r + 1) * width] for r in range(self.world)]
        sizes = [v for row in rows for v in row[:-_TAIL]]
        if _integrity.ABORT in sizes:
            return rows
        if _integrity.FELL_BACK in sizes:
            self.raw_mode = self.fell = True
        else:
            self.coded = True
            self.coded_raw += sum(row[-2] for row in rows)
            self.coded_payload += sum(row[-1] for row in rows)
        return rows

    def decode(self, piece: torch.Tensor, out: torch.Tensor, peer: int) -> None:
        if self.error is not None:
            return  # the call is lost; keep exchanging so the peers stay in step
        try:
            _integrity.decode_from(piece, out, self.cfg, self.kind, peer, self.group)
        except (CorruptPayloadError, ValueError) as e:
            self.error = e

    def finish(self, policy, site: tuple) -> Outcome:
        self.streams.done()
        if self.coded_raw and policy is not None:
            policy.observe(self.group, site, self.plan.codec, self.coded_raw, self.coded_payload)
        return Outcome(self.fell, self.coded, self.error)


def _aborted(rows: list, call: _Call, abort) -> None:
    sizes = [row[0] for row in rows]
    if _integrity.ABORT in sizes:
        if abort is not None:
            raise abort
        _integrity.raise_if_aborted(sizes, call.kind, call.group)


# --------------------------------------------------------------------------
# All-gather
# --------------------------------------------------------------------------
def gather(kind: str, own: torch.Tensor, slots: list, group, rank: int, plan, cfg, st,
           policy=None, site: tuple = (), abort: Exception | None = None) -> Outcome:
    """All-gather ``own`` (flat) into ``slots`` (flat views, one per rank; their
    sizes may differ, as all-reduce's do) in ``plan.pieces`` pieces. With
    ``abort`` (an all-reduce whose first half failed) every rank raises at the
    first row: this one ``abort``, the others ``CorruptPayloadError``."""
    world = len(slots)
    device = own.device
    own = gather_source(own, slots, rank)
    call = _Call(kind, group, world, rank, plan, cfg, st, device)
    itemsize = own.element_size()
    bounds = [_bounds(s.numel(), plan.pieces) for s in slots]

    def mine(i):
        return own[bounds[rank][i]:bounds[rank][i + 1]]

    def raw(i):
        return mine(i).view(torch.uint8)

    def encode(i):
        if abort is not None:
            return None, [_integrity.ABORT, 0, 0]
        x = mine(i)
        payload = call.encode(x)
        size = _integrity.FELL_BACK if payload is None else payload.numel()
        return payload, [size, x.nbytes, max(size, 0)]

    def exchange(i, payload, rows):
        if rows is None:
            sizes = [(b[i + 1] - b[i]) * itemsize for b in bounds]
        else:
            _aborted(rows, call, abort)
            sizes = [row[0] for row in rows]
        width = max(sizes)
        call.streams.before_launch()
        send = zero_padded(payload, width)
        recv = torch.empty(world * width, dtype=torch.uint8, device=device)
        work = _all_gather_single(recv, send, group=group, async_op=True)
        st.add(kind, wire_bytes=width, pad_bytes=width - payload.numel())
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
    if not same_memory(own, slots[rank]):
        slots[rank].copy_(own)
    return call.finish(policy, site)


# --------------------------------------------------------------------------
# Reduce-scatter
# --------------------------------------------------------------------------
def scatter_reduce(kind: str, flat_in: torch.Tensor, counts: list, out: torch.Tensor, op,
                   group, rank: int, plan, cfg, st, policy=None, site: tuple = ()) -> Outcome:
    """Reduce chunk ``rank`` of every rank's ``flat_in`` (chunks of ``counts``
    elements, rank order) into ``out``: fp32 sum in rank order, then scale and
    cast, in ``plan.pieces`` pieces. A decode error is returned in the outcome,
    not raised, so that an all-reduce can stop its second half on every rank."""
    world = len(counts)
    device = flat_in.device
    itemsize = flat_in.element_size()
    chunks = split_flat(flat_in, counts)
    n = counts[rank]
    mine = chunks[rank]
    # Before _Call: the side stream reads what these write on the caller's
    # stream (a PREMUL_SUM factor cast to fp32), and it waits for that stream
    # once, when the call is made.
    total = RankOrderSum(out, flat_in, op)
    scratch = torch.empty(n, dtype=flat_in.dtype, device=device)
    call = _Call(kind, group, world, rank, plan, cfg, st, device)
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
            return payloads, call.fell_back_row()
        sizes = [p.numel() for p in payloads]
        raw_bytes = sum(part(r, i).nbytes for r in range(world) if r != rank)
        return payloads, sizes + [raw_bytes, sum(sizes)]

    def exchange(i, payloads, rows):
        if rows is None:
            recv_sizes = [0 if r == rank else (bounds[rank][i + 1] - bounds[rank][i]) * itemsize
                          for r in range(world)]
        else:
            recv_sizes = [rows[r][rank] for r in range(world)]
        return call.launch_all_to_all(i, payloads, recv_sizes, rows is not None)

    def drain(i, recv, recv_sizes, coded, _keep):
        a, b = bounds[rank][i], bounds[rank][i + 1]
        offset = 0
        for r in range(world):
            got = recv[offset:offset + recv_sizes[r]]
            offset += recv_sizes[r]
            if r == rank:
                src = mine[a:b]
            elif coded:
                with st.phase(kind, "decode"), call.streams.codec():
                    call.decode(got, scratch[a:b], r)
                src = scratch[a:b]
            else:
                src = got.view(flat_in.dtype)
            if call.error is None:
                with st.phase(kind, "reduce"), call.streams.codec():
                    total.add(src, r, a, b)

    call.run(raw, encode, exchange, drain)
    with st.phase(kind, "reduce"), call.streams.codec():
        total.finish(world)
    return call.finish(policy, site)


# --------------------------------------------------------------------------
# All-to-all
# --------------------------------------------------------------------------
def all_to_all(kind: str, in_parts: list, out_parts: list, send_coded: list, recv_coded: list,
               group, rank: int, plan, cfg, st, policy=None, site: tuple = ()) -> Outcome:
    """Send ``in_parts[r]`` to rank r and receive ``out_parts[r]`` from it (flat
    views), encoding the splits marked coded, in ``plan.pieces`` pieces. A
    received split that is corrupt or whose size disagrees with ``out_parts``
    is the outcome's error."""
    world = len(in_parts)
    device = in_parts[rank].device
    itemsize = in_parts[rank].element_size()
    call = _Call(kind, group, world, rank, plan, cfg, st, device)
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
            elif send_coded[r] and not failed:
                p = call.encode(x)
                failed = p is None
                payloads.append(p)
                if p is not None:
                    raw_bytes += x.nbytes
                    coded_bytes += p.numel()
            else:
                payloads.append(x.view(torch.uint8))
        if failed:
            return payloads, call.fell_back_row()
        return payloads, [p.numel() for p in payloads] + [raw_bytes, coded_bytes]

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
                elif got.numel() != out.nbytes:
                    if call.error is None:
                        call.error = ValueError(
                            f"zipccl {kind}: rank {r} sent {got.numel()} bytes for "
                            f"{out.numel()} elements of an output split; split sizes "
                            f"disagree between ranks")
                else:
                    out.view(torch.uint8).copy_(got)

    call.run(raw, encode, exchange, drain)
    out_parts[rank].copy_(in_parts[rank])
    return call.finish(policy, site)
