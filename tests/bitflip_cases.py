"""One bit flipped in a payload in transit: the transport that flips it, the
inputs, the cases and the loop that counts how verify mode fares.

Shared by the tests (tests/test_collective_failures.py,
tests/test_hook_failures.py) and ``benchmarks/bitflip_transit.py``, which runs
``worker_loop`` long on two spawned ranks; imports no pytest. What an
injection's outcomes mean is in that script's docstring.
"""
from __future__ import annotations

import struct
from collections import Counter

import torch
import torch.distributed as dist

from zipccl_fsdp import protocol as W
from zipccl_fsdp import codec as Z
from zipccl_fsdp import collectives as C
from zipccl_fsdp import format as F
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.errors import CorruptPayloadError
from zipccl_fsdp.stats import KINDS

DTYPES = (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32),
          ("fp32_bf16cast", torch.float32))
CODECS = Z.CODECS  # the build's codec set, the framing-only "raw" included
INT = {2: torch.int16, 4: torch.int32}
N = 3 * 4096 + 123  # 4 chunks of the checksum, the last one short


def payload_nbytes(buf: torch.Tensor) -> int:
    """The length of the payload at the start of ``buf`` (read from its header),
    or ``buf.numel()`` when no header is found there."""
    if buf.numel() < F.HEADER_NBYTES:
        return buf.numel()
    raw = buf[:F.HEADER_NBYTES].numpy().tobytes()
    (magic, _v, codec_id, _d, ndim, numel, chunk_elems, nchunks, codes, sm, rem, esc, flags,
     _crc) = struct.unpack("<4sBBBBQII4QII", raw)
    if magic != F.MAGIC:
        return buf.numel()
    total = (F.HEADER_NBYTES + 8 * ndim + F.CHUNK_ENTRY_NBYTES * nchunks + codes + sm + rem
             + esc + (4 * F.nchunks_for(numel) if flags & F.HEADER_FLAG_CHECKSUM else 0))
    return min(total, buf.numel())


class FlipTransport:
    """Wraps this rank's uint8 sends: when armed, the ``skip``-th next payload send
    goes out with one random bit flipped inside one payload bound for ``to``.

    It patches ``zipccl_fsdp.protocol.all_gather_single`` (the all-gather
    every zipccl exchange looks up) and ``torch.distributed.all_to_all_single``;
    ``restore()`` undoes both. The sender's own tensors are never modified (the
    flip is made on a copy), so only the receiver sees the damage.
    """

    def __init__(self, rank: int, world: int, seed: int) -> None:
        self.rank, self.world = rank, world
        self.rng = torch.Generator().manual_seed(seed)
        self.armed = None  # (skip, to)
        self.last = None  # (offset into the payload, bit, payload nbytes)
        self._ag, self._a2a = W.all_gather_single, dist.all_to_all_single
        W.all_gather_single = self._all_gather
        dist.all_to_all_single = self._all_to_all

    def restore(self) -> None:
        W.all_gather_single, dist.all_to_all_single = self._ag, self._a2a

    def arm(self, to: int, skip: int = 0) -> None:
        self.armed, self.last = (skip, to), None

    def _rand(self, hi: int) -> int:
        return int(torch.randint(0, hi, (1,), generator=self.rng))

    def _take(self, t: torch.Tensor) -> bool:
        if self.armed is None or t.dtype != torch.uint8:
            return False
        skip, to = self.armed
        if skip:
            self.armed = (skip - 1, to)
            return False
        self.armed = None
        return True

    def _flip(self, t: torch.Tensor, start: int, nbytes: int) -> torch.Tensor:
        t = t.clone()
        bit = self._rand(8 * nbytes)
        t[start + bit // 8] ^= 1 << (bit % 8)
        self.last = (bit // 8, bit % 8, nbytes)
        return t

    def _all_gather(self, output, input, group=None, async_op=False):
        if self._take(input):
            input = self._flip(input, 0, payload_nbytes(input))
        return self._ag(output, input, group=group, async_op=async_op)

    def _all_to_all(self, output, input, output_split_sizes=None, input_split_sizes=None,
                    group=None, async_op=False):
        if input.dtype == torch.uint8 and self.armed is not None and input_split_sizes:
            to = self.armed[1]
            start = sum(input_split_sizes[:to])
            if input_split_sizes[to] and self._take(input):
                input = self._flip(input, start, input_split_sizes[to])
        return self._a2a(output, input, output_split_sizes, input_split_sizes, group=group,
                         async_op=async_op)


def make_inputs(case: int, numel: int, dtag: str, dtype: torch.dtype, world: int) -> list:
    """Every rank's input for one case (the same on every rank: the reference is local)."""
    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(case * 131 + r)
        x = torch.randn(numel, generator=g) * (0.01 * (r + 1))
        x[: numel // 8] = 0
        x[7 + r] = float("nan")
        if dtag == "fp32_bf16cast":
            x = x.bfloat16().float()
        out.append(x.to(dtype))
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).contiguous().view(INT[t.element_size()])


def _fp32_sum(parts: list, dtype) -> torch.Tensor:
    acc = parts[0].to(torch.float32, copy=True)
    for p in parts[1:]:
        acc.add_(p)
    out = acc.to(dtype)
    # zipccl's sums give one NaN: the positive quiet NaN without payload
    bits = {2: (torch.int16, {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}),
            4: (torch.int32, {torch.float32: 0x7FC00000})}[out.element_size()]
    out.view(bits[0]).masked_fill_(out.isnan(), bits[1][dtype])
    return out


def run_case(kind: str, xs: list, rank: int, world: int, cfg: ZipCCLConfig):
    """Run one collective on this rank; return (result, exact expected result)."""
    x = xs[rank]
    n = x.numel()
    if kind == "all_gather":
        out = torch.empty(world * n, dtype=x.dtype)
        C.all_gather_single(out, x, config=cfg)
        return out, torch.cat(xs)
    if kind == "reduce_scatter":
        m = n // world
        out = torch.empty(m, dtype=x.dtype)
        C.reduce_scatter_single(out, x[:m * world].clone(), config=cfg)
        return out, _fp32_sum([xi[rank * m:(rank + 1) * m] for xi in xs], x.dtype)
    if kind == "all_reduce":
        t = x.clone()
        C.all_reduce(t, config=cfg)
        base, extra = divmod(n, world)
        counts = [base + (r < extra) for r in range(world)]
        starts = [sum(counts[:r]) for r in range(world)]
        want = torch.cat([_fp32_sum([xi[s:s + c] for xi in xs], x.dtype)
                          for s, c in zip(starts, counts)])
        return t, want
    # all_to_all: uneven splits S[src][dst], all large enough to be coded (min_bytes=0)
    base = n // (world + 1)
    S = [[base + 17 * ((src + 2 * dst) % 3) for dst in range(world)] for src in range(world)]
    send = x[:sum(S[rank])]
    recv_splits = [S[src][rank] for src in range(world)]
    out = torch.empty(sum(recv_splits), dtype=x.dtype)
    C.all_to_all_single(out, send, recv_splits, S[rank], config=cfg)
    want = torch.cat([xs[src][sum(S[src][:rank]):sum(S[src][:rank + 1])]
                      for src in range(world)])
    return out, want


def worker_loop(rank: int, world: int, injections: int, seed: int, numel: int = N,
                verify: bool = True) -> dict:
    """Run inside an initialized gloo group: rank 1 flips, rank 0 receives and counts."""
    flipper, victim = 1, 0
    transport = FlipTransport(rank, world, seed) if rank == flipper else None
    cfgs = {c: ZipCCLConfig(policy="always", codec=c, verify=verify, min_bytes=0) for c in CODECS}
    outcomes: Counter = Counter()
    per_kind: Counter = Counter()
    examples = {}
    rng = torch.Generator().manual_seed(seed + 7)
    try:
        for i in range(injections):
            kind = KINDS[i % len(KINDS)]
            dtag, dtype = DTYPES[(i // len(KINDS)) % len(DTYPES)]
            codec = CODECS[(i // (len(KINDS) * len(DTYPES))) % len(CODECS)]
            skip = int(torch.randint(0, 2, (1,), generator=rng)) if kind == "all_reduce" else 0
            xs = make_inputs(seed * 100003 + i, numel, dtag, dtype, world)
            if transport is not None:
                transport.arm(to=victim, skip=skip)
            try:
                got, want = run_case(kind, xs, rank, world, cfgs[codec])
            except CorruptPayloadError as e:
                outcome = "caught"
                if rank == victim and not (e.collective == kind and e.peer == flipper):
                    outcome = "caught_misattributed"
                    examples.setdefault(outcome, str(e))
                if rank == victim and e.chunk is not None:
                    examples.setdefault("caught_chunk", str(e).splitlines()[0][:200])
            else:
                same = torch.equal(_bits(got), _bits(want))
                outcome = "harmless" if same else "missed"
                if not same:
                    examples.setdefault("missed", f"{kind} {dtag} {codec} case {i}")
            if rank == victim:
                outcomes[outcome] += 1
                per_kind[(kind, outcome)] += 1
            elif outcome not in ("harmless", "caught"):
                # The flipper's own result is never damaged; it raises only when the
                # victim aborts an all-reduce in its first half.
                outcomes["flipper_" + outcome] += 1
    finally:
        if transport is not None:
            transport.restore()
    return dict(outcomes=dict(outcomes), per_kind=dict(per_kind), examples=examples)
