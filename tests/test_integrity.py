"""Integrity: verify mode, cross-rank agreement, and the fallback to raw.

* verify mode round-trips bitwise on every collective and catches a payload
  damaged in transit, naming the collective, the sending rank and the chunk;
  the checksum itself catches the multi-element changes the first (linear)
  definition missed (found by benchmarks/fuzz_decode.py);
* ranks whose configs (or builds) disagree raise ZipCCLConfigError on every
  rank, naming the field and the ranks, and the group stays usable;
* an encode failure on one rank sends that call raw on every rank, with the
  exact result, counted in ``fallback_calls``.
"""
from __future__ import annotations

import logging
import struct
import zlib

import pytest
import torch
import torch.distributed as dist

import bitflip_cases as B
from zipccl_fsdp import codec as zcodec
from zipccl_fsdp import format as F
from zipccl_fsdp import protocol as integrity
from zipccl_fsdp.collectives import all_gather_single, all_reduce
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.errors import CorruptPayloadError, ZipCCLConfigError
from zipccl_fsdp.stats import CommStats

INT = {2: torch.int16, 4: torch.int32}
PG_TIMEOUT_S = 20  # nothing here may wait for a timeout: a hang fails the test quickly


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).contiguous().view(INT[t.element_size()])


# --------------------------------------------------------------------------
# Local: the config field and the checksum
# --------------------------------------------------------------------------
def test_verify_is_a_validated_protocol_field():
    with pytest.raises(ValueError, match="verify"):
        ZipCCLConfig(verify=1)
    assert ZipCCLConfig(verify=True).protocol_fields()["verify"] is True
    a = integrity.field_vector(integrity.protocol_fields(ZipCCLConfig()))
    b = integrity.field_vector(integrity.protocol_fields(ZipCCLConfig(verify=True)))
    assert len(a) == len(b) == integrity.PROTOCOL_SLOTS
    names = list(integrity.protocol_fields(ZipCCLConfig()))
    assert [names[i - 1] for i in range(1, len(names) + 1) if a[i] != b[i]] == ["verify"]


def _changed(x: torch.Tensor, diffs: dict) -> torch.Tensor:
    """``x`` with the unsigned words at the given positions moved by the given amounts."""
    w = bits(x).to(torch.int64) & ((1 << (8 * x.element_size())) - 1)
    for i, d in diffs.items():
        w[i] = (w[i] + d) % (1 << (8 * x.element_size()))
    w = torch.where(w >= 1 << (8 * x.element_size() - 1), w - (1 << (8 * x.element_size())), w)
    return w.to(INT[x.element_size()]).view(x.dtype)


def test_checksum_catches_changes_the_linear_sum_missed():
    g = torch.Generator().manual_seed(0)
    # What one damaged byte of fp16's 3-bit rem stream did (fuzz case 16454):
    # three neighbours moved by -2, +3, -1 (x 1024), which sum(word_i * (2i + 1)) cancels.
    x16 = torch.randn(9000, generator=g).half()
    y16 = _changed(x16, {6768: -2048, 6769: 3072, 6771: -1024})
    # Two fp32 sign flips in one chunk: 2**31 * odd + 2**31 * odd = 0 mod 2**32.
    x32 = torch.randn(5000, generator=g)
    y32 = x32.clone()
    y32[[10, 999]] *= -1
    # Every exponent of a full bf16 chunk up by 2 (a flipped bit of a table's base byte):
    # 256 * sum(2i + 1) = 2**32.
    xb = (torch.randn(4096, generator=g) + 4).bfloat16()
    yb = _changed(xb, {i: 256 for i in range(4096)})
    for x, y in ((x16, y16), (x32, y32), (xb, yb)):
        assert not torch.equal(bits(x), bits(y))
        assert not torch.equal(zcodec.chunk_sums(x), zcodec.chunk_sums(y))


def test_checksum_catches_every_single_element_change():
    x = torch.randn(4096 + 5, generator=torch.Generator().manual_seed(1)).bfloat16()
    base = zcodec.chunk_sums(x)
    for i in (0, 1, 2047, 4095, 4096, 4100):
        for bit in range(16):
            y = _changed(x, {i: 0})
            bits(y)[i] ^= 1 << bit if bit < 15 else -(1 << 15)
            assert not torch.equal(zcodec.chunk_sums(y), base), (i, bit)


def test_checksum_catches_a_dtype_relabel():
    x = torch.randn(300).bfloat16()
    p = bytearray(bytes(zcodec.encode(x, codec="raw", backend="torch", verify=True).tolist()))
    p[6] = F.DTYPES[torch.float16].code
    H = F.HEADER_NBYTES
    p[H - 4:H] = struct.pack("<I", zlib.crc32(bytes(p[:H - 4]) + bytes(p[H:H + 8])))
    with pytest.raises(CorruptPayloadError, match="checksum"):
        zcodec.decode(torch.frombuffer(p, dtype=torch.uint8), backend="torch")


def test_describe_names_fields_and_ranks():
    fields = integrity.protocol_fields(ZipCCLConfig(min_bytes=0))
    rows = [integrity.field_vector(fields) for _ in range(3)]
    other = integrity.field_vector(integrity.protocol_fields(ZipCCLConfig(min_bytes=0,
                                                                          verify=True)))
    rows[2] = other
    lines = integrity._describe(fields, rows, 0, None)
    assert lines == ["verify: ranks [0, 1] have False; rank 2 has True"], lines


# --------------------------------------------------------------------------
# Distributed tasks (run inside the ranks)
# --------------------------------------------------------------------------
def task_verify_round_trip():
    """Every collective with verify on and off: the same bits; verify adds only checksums."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for verify in (False, True):
        cfg = ZipCCLConfig(policy="always", min_bytes=0, verify=verify)
        st = CommStats()
        results = []
        for i, kind in enumerate(B.KINDS):
            xs = B.make_inputs(100 + i, B.N, "bf16", torch.bfloat16, world)
            got, want = B.run_case(kind, xs, rank, world, cfg)
            assert torch.equal(bits(got), bits(want)), (kind, verify)
            results.append(bits(got).clone())
        # run_case counts in the module's stats; count one call on our own
        x = B.make_inputs(7, B.N, "bf16", torch.bfloat16, world)[rank]
        all_gather_single(torch.empty(world * x.numel(), dtype=x.dtype), x, config=cfg, stats=st)
        out[verify] = (results, st.snapshot()["all_gather"]["wire_bytes"])
    for a, b in zip(out[False][0], out[True][0]):
        assert torch.equal(a, b)
    # The same payloads plus 4 bytes per 4096 elements, on every rank: the padded
    # all-gather width grows by exactly that; and one int64 per rank at the end,
    # whether some rank found a corrupt payload (``pipeline._Call.settle``).
    return out[True][1] - out[False][1], 4 * F.nchunks_for(B.N) + 8


def task_corrupt_in_transit(kind: str, skip: int):
    """Rank 1 flips one bit of a payload it sends rank 0; rank 0 must name kind, peer, chunk."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(policy="always", min_bytes=0, verify=True)
    transport = B.FlipTransport(rank, world, seed=5) if rank == 1 else None
    xs = B.make_inputs(3, B.N, "bf16", torch.bfloat16, world)
    if transport:
        transport.arm(to=0, skip=skip)
    try:
        B.run_case(kind, xs, rank, world, cfg)
        result = None
    except CorruptPayloadError as e:
        result = (e.collective, e.peer, e.chunk, str(e))
    finally:
        if transport:
            transport.restore()
    # The group is still in step.
    t = torch.ones(8)
    all_reduce(t, config=ZipCCLConfig(policy="always", min_bytes=0, verify=True))
    assert t.tolist() == [float(world)] * 8
    return result


def task_config_mismatch(which: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = integrity._codec.CODECS
    if which == "verify":
        cfg = ZipCCLConfig(policy="always", min_bytes=0, verify=rank == world - 1)
    elif which == "min_bytes":
        cfg = ZipCCLConfig(policy="always", min_bytes=0 if rank != 1 else 1 << 20)
    else:  # a build that decodes a codec the others don't know
        cfg = ZipCCLConfig(policy="always", min_bytes=0)
        if rank == 1:
            integrity._codec.CODECS = saved + ("zstd",)
    x = torch.randn(1000)
    try:
        all_gather_single(torch.empty(world * 1000), x, config=cfg)
        message = None
    except ZipCCLConfigError as e:
        message = str(e)
    finally:
        integrity._codec.CODECS = saved
    # Still in step, and an agreeing config works.
    t = torch.full((300,), float(rank))
    all_reduce(t, config=ZipCCLConfig(policy="always", min_bytes=0))
    assert t.tolist() == [float(sum(range(world)))] * 300
    return message


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.levels = []

    def emit(self, record) -> None:
        self.levels.append(record.levelno)


def task_fallback(fail_rank: int, fail_after: int):
    """``fail_rank``'s encoder raises after ``fail_after`` successful encodes in each
    call; every collective must still return the exact result on every rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(policy="always", min_bytes=0, verify=True)
    st = CommStats()
    real = zcodec.encode
    count = {"n": 0}

    def broken(x, **kw):
        count["n"] += 1
        if count["n"] > fail_after:
            raise RuntimeError("injected encoder failure")
        return real(x, **kw)

    records = _Records()
    log = logging.getLogger("zipccl_fsdp.protocol")
    log.addHandler(records)
    log.setLevel(logging.DEBUG)
    import zipccl_fsdp.collectives.dispatch as C
    saved_stats = C._STATS
    C._STATS = st  # run_case uses the module's stats
    try:
        for rep in range(2):
            for i, kind in enumerate(B.KINDS):
                xs = B.make_inputs(200 + i, B.N, "fp32", torch.float32, world)
                count["n"] = 0
                if rank == fail_rank:
                    zcodec.encode = broken
                try:
                    got, want = B.run_case(kind, xs, rank, world, cfg)
                finally:
                    zcodec.encode = real
                assert torch.equal(bits(got), bits(want)), (kind, rep)
        s = st.snapshot()
        # The encoder works again: compressed again.
        xs = B.make_inputs(300, B.N, "bf16", torch.bfloat16, world)
        B.run_case("all_gather", xs, rank, world, cfg)
        again = (st.snapshot()["all_gather"]["compressed_calls"]
                 - s["all_gather"]["compressed_calls"])
    finally:
        C._STATS = saved_stats
        log.removeHandler(records)
    return ({k: (s[k]["calls"], s[k]["compressed_calls"], s[k]["fallback_calls"])
             for k in B.KINDS}, again, records.levels)


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------
def test_verify_round_trips_bitwise_and_adds_only_checksums(pool2):
    for extra, sums_bytes in pool2.run(task_verify_round_trip):
        assert extra == sums_bytes, (extra, sums_bytes)


@pytest.mark.parametrize("kind,skip", [("all_gather", 0), ("reduce_scatter", 0),
                                       ("all_to_all", 0), ("all_reduce", 0), ("all_reduce", 1)])
def test_corrupt_payload_names_collective_peer_and_chunk(pool2, kind, skip):
    got0, got1 = pool2.run(task_corrupt_in_transit, kind, skip)
    assert got0 is not None, "rank 0 took a damaged payload without noticing"
    collective, peer, chunk, text = got0
    assert (collective, peer) == (kind, 1) and "rank 1" in text and kind in text
    assert chunk is None or 0 <= chunk < F.nchunks_for(B.N), text
    assert got1 is not None, "the sender went on as if the call had succeeded"
    assert got1[:2] == (kind, 0) and "rank 0" in got1[3], got1  # names the rank that found it
    if kind == "all_reduce" and skip == 0:
        # damaged in the reduce-scatter half: rank 0 stops the all-gather half on every rank
        assert "stopped it on every rank" in got1[3]
    else:  # learnt at the end of the call
        assert "from rank 1" in got1[3] and "every rank" in got1[3], got1


@pytest.mark.parametrize("which,expect", [
    ("verify", ["ranks [0, 1] have False", "rank 2 has True"]),
    ("min_bytes", ["ranks [0, 2] have 0", "rank 1 has 1048576"]),
    ("codec_set", ["ranks [0, 2] have", "rank 1 has"]),  # values are hashed: not all shown
])
def test_config_mismatch_names_field_and_ranks_on_every_rank(pool3, which, expect):
    messages = pool3.run(task_config_mismatch, which, timeout_s=60)
    for rank, m in enumerate(messages):
        assert m is not None, f"rank {rank} did not raise"
        assert "disagree" in m and f"this is rank {rank}" in m, m
        lines = m.splitlines()[1:]  # one line per differing field
        assert len(lines) == 1 and lines[0].strip().startswith(f"{which}:"), m
        for part in expect:
            assert part in lines[0], m


@pytest.mark.parametrize("fail_after", [0, 1])
def test_encode_failure_on_one_rank_falls_back_on_every_rank(pool3, fail_after):
    per_rank = pool3.run(task_fallback, 1, fail_after)
    for rank, (counts, again, levels) in enumerate(per_rank):
        for kind, (calls, compressed, fallback) in counts.items():
            assert calls == 2, (rank, kind, counts)
            if fail_after == 1 and kind == "all_gather":
                # one encode per call: the first succeeds, so nothing falls back
                assert (compressed, fallback) == (2, 0), (rank, kind, counts)
            else:
                assert (compressed, fallback) == (0, 2), (rank, kind, counts)
        assert again == 1
        if rank == 1:  # a warning for the first failure of a kind, then debug messages
            assert levels[0] == logging.WARNING and logging.DEBUG in levels, levels
            assert levels.count(logging.WARNING) <= 2 * len(B.KINDS), levels
        else:
            assert levels == []
