"""The adaptive policy and the pipelined collectives, on real gloo process groups.

Pipelined calls (any piece count, ragged sizes, both codecs) must equal torch's
collectives (all-gather, all-to-all) or the fp32 rank-order reference
(reduce-scatter, all-reduce) bit for bit. The policy must send tiny messages
and fast links raw, compress on a slow link, and take the same decision on
every rank even when the ranks measure different speeds.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from collective_cases import (OPS, assert_bits_equal, check_reduce_scatter, gather_all,
                              make_data, make_op, reference_reduce, torch_all_gather_single)
from dist_utils import DistPool
from zipccl_fsdp import calibration as Cal
from zipccl_fsdp import cost as M
from zipccl_fsdp import policy as P
from zipccl_fsdp.collectives import all_gather_single, all_reduce, all_to_all_single, \
    reduce_scatter_single
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.protocol import row_width
from zipccl_fsdp.errors import CorruptPayloadError
from zipccl_fsdp.stats import CommStats

RAGGED = (0, 1, 7, 4097, 10001)
PIECES = (2, 3, 7)


def forced(pieces: int, codec: str) -> ZipCCLConfig:
    return ZipCCLConfig(policy="always", min_bytes=0, codec=codec, pipeline_pieces=pieces)


SLOW = dict(policy="adaptive", codec="auto", link_gbps=0.1, codec_gbps=1.0)
"""A link given as slow (12.5 MB/s) and a codec as fast: the policy compresses."""


# --------------------------------------------------------------------------
# Tasks (run inside the ranks)
# --------------------------------------------------------------------------
def task_pipelined_all_gather():
    rank, world = dist.get_rank(), dist.get_world_size()
    st = CommStats()
    for pieces in PIECES:
        for codec in ("fixed3", "dense"):
            cfg = forced(pieces, codec)
            for dtype in (torch.bfloat16, torch.float32):
                for n in RAGGED:
                    x = make_data(n, dtype, seed=pieces + n, rank=rank)
                    want = torch.empty(world * n, dtype=dtype)
                    torch_all_gather_single(want, x)
                    got = torch.full((world * n,), 3.0, dtype=dtype)
                    all_gather_single(got, x, config=cfg, stats=st)
                    assert_bits_equal(got, want, f"all_gather P={pieces} {codec} {dtype} n={n}")
                    # FSDP2's in-place form.
                    got2 = torch.full((world * n,), 3.0, dtype=dtype)
                    got2[rank * n:(rank + 1) * n].copy_(x)
                    all_gather_single(got2, got2[rank * n:(rank + 1) * n], config=cfg, stats=st)
                    assert_bits_equal(got2, want, f"in-place all_gather P={pieces} n={n}")
    return st.snapshot()["all_gather"]


def task_pipelined_reductions():
    rank, world = dist.get_rank(), dist.get_world_size()
    st = CommStats()
    checked = 0
    for pieces in PIECES:
        cfg = forced(pieces, "dense" if pieces % 2 else "fixed3")
        for dtype, kind in ((torch.bfloat16, "gauss"), (torch.float32, "bf16cast"),
                            (torch.float32, "gauss")):
            for n in RAGGED:
                for op, factor in OPS:
                    x = make_data(world * n, dtype, seed=pieces + 3 * n, rank=rank, kind=kind)
                    check_reduce_scatter(x, n, op, factor, f"reduce_scatter P={pieces} {op} "
                                         f"{dtype} {kind} n={n}", config=cfg, stats=st)
                    # all-reduce of a ragged numel (chunks differ by one element)
                    y = make_data(n, dtype, seed=pieces + 5 * n, rank=rank, kind=kind)
                    want = reference_reduce(gather_all(y), op, factor, dtype)
                    all_reduce(y, make_op(op, factor), config=cfg, stats=st)
                    assert_bits_equal(y, want, f"all_reduce P={pieces} {op} {dtype} n={n}")
                    checked += 2
    s = st.snapshot()
    return checked, s["reduce_scatter"], s["all_reduce"]


def task_pipelined_all_to_all():
    rank, world = dist.get_rank(), dist.get_world_size()
    st = CommStats()
    row = 3
    for pieces in PIECES:
        for cfg in (forced(pieces, "dense"),
                    ZipCCLConfig(policy="always", min_bytes=2000, pipeline_pieces=pieces)):
            for dtype in (torch.bfloat16, torch.float32):
                # Ragged, some splits empty, some below min_bytes (sent raw).
                send_rows = [0 if (rank + j) % 4 == 3 else (rank + 2 * j + 1) * 700 // 3
                             for j in range(world)]
                recv_rows = [0 if (j + rank) % 4 == 3 else (j + 2 * rank + 1) * 700 // 3
                             for j in range(world)]
                send_rows[rank] = recv_rows[rank] = 5
                x = make_data(sum(send_rows) * row, dtype, seed=pieces, rank=rank).view(-1, row)
                want = torch.empty(sum(recv_rows), row, dtype=dtype)
                dist.all_to_all_single(want, x, recv_rows, send_rows)
                got = torch.full_like(want, 5.0)
                all_to_all_single(got, x, recv_rows, send_rows, config=cfg, stats=st)
                assert_bits_equal(got, want, f"all_to_all P={pieces} {dtype} {cfg}")
    return st.snapshot()["all_to_all"]


def task_decisions_given_in_config():
    """Tiny messages and a fast link go raw, a slow link compresses (pipelined)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    cases = {
        # name: (config, all-gather shard elements)
        "tiny_slow_link": (ZipCCLConfig(min_bytes=0, **SLOW), 16),
        "fast_link": (ZipCCLConfig(policy="adaptive", link_gbps=400.0, codec_gbps=1.0), 1 << 20),
        "slow_link": (ZipCCLConfig(**SLOW), 1 << 20),
        "never": (ZipCCLConfig(policy="never", min_bytes=0), 1 << 20),
    }
    for name, (cfg, n) in cases.items():
        st = CommStats()
        x = make_data(n, torch.bfloat16, seed=1, rank=rank)
        want = torch.empty(world * n, dtype=torch.bfloat16)
        torch_all_gather_single(want, x)
        for _ in range(2):
            got = torch.empty_like(want)
            all_gather_single(got, x, config=cfg, stats=st)
            assert_bits_equal(got, want, name)
        g = make_data(world * n, torch.float32, seed=2, rank=rank, kind="bf16cast")
        r = torch.empty(n, dtype=torch.float32)
        reduce_scatter_single(r, g, config=cfg, stats=st)
        parts = [p[rank * n:(rank + 1) * n] for p in gather_all(g)]
        assert_bits_equal(r, reference_reduce(parts, "sum", 1.0, torch.float32), name)
        s = st.snapshot()
        out[name] = {k: {f: s[k][f] for f in ("calls", "compressed_calls", "pipelined_calls",
                                                "raw_fallback_calls", "compressed_fraction",
                                                "raw_bytes", "wire_bytes")}
                     for k in ("all_gather", "reduce_scatter")}
        out[name]["decisions"] = dict(P.of(cfg, st).decisions)
    return out


def task_disagreeing_measurements():
    """Rank 0 measures a fast link, rank 1 a slow one and a slower codec: alone
    they would decide differently; agreed (the slowest rank's), they decide alike."""
    rank, world = dist.get_rank(), dist.get_world_size()
    link = [[1e-5, 1e-4], [1e-3, 0.5]][rank]          # tiny, 2 MiB all-gather seconds
    codec = [[1e-3, 1e-3, 1e-4], [2e-3, 2e-3, 2e-4]][rank]
    ab = [[0.01, 0.005, 0], [0.3, 0.2, 0]][rank]     # in-situ raw, compressed seconds
    saved = Cal.measure_link_local, Cal.measure_codec_local, Cal.measure_ab_local
    Cal.measure_link_local = lambda group, world, device: list(link)
    Cal.measure_codec_local = lambda *a: list(codec)
    Cal.measure_ab_local = lambda *a: list(ab)
    try:
        # What this rank would decide on its own numbers (the hazard).
        own_link = M.LinkSpeed(link[0], Cal.LINK_PROBE_BYTES / (link[1] - link[0]))
        call = codec[2] / 2
        own_codec = M.CodecSpeed(Cal.CODEC_PROBE_BYTES / (codec[0] - call),
                                 Cal.CODEC_PROBE_BYTES / (codec[1] - call), call)
        alone = M.best_plan((M.gather(world, 1 << 22),), own_link,
                            {"dense": own_codec}, {"dense": 0.7})[0].compress
        cfg = ZipCCLConfig(policy="adaptive")
        st = CommStats()
        plans = []
        for n in (1 << 10, 1 << 16, 1 << 21):
            x = make_data(n, torch.bfloat16, seed=n, rank=rank)
            want = torch.empty(world * n, dtype=torch.bfloat16)
            torch_all_gather_single(want, x)
            got = torch.empty_like(want)
            all_gather_single(got, x, config=cfg, stats=st)
            assert_bits_equal(got, want, f"all_gather n={n}")
            y = make_data(n * world, torch.float32, seed=n, rank=rank)
            want = reference_reduce(gather_all(y), "avg", 1.0, torch.float32)
            all_reduce(y, dist.ReduceOp.AVG, config=cfg, stats=st)
            assert_bits_equal(y, want, f"all_reduce n={n}")
            plans.append(sorted(P.of(cfg, st).decisions.items()))
        report = P.of(cfg, st).calibration.report()
        return (alone, plans, repr((report["links"], report["speeds"])),
                st.snapshot()["all_gather"]["compressed_calls"])
    finally:
        Cal.measure_link_local, Cal.measure_codec_local, Cal.measure_ab_local = saved


def task_measured_loopback():
    """Measured for real: the loopback between two local processes is faster
    than the CPU codec, so the adaptive policy sends everything raw."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(policy="adaptive", codec="auto")
    st = CommStats()
    n = 1 << 20
    x = make_data(n, torch.bfloat16, seed=3, rank=rank)
    got = torch.empty(world * n, dtype=torch.bfloat16)
    all_gather_single(got, x, config=cfg, stats=st)
    want = torch.empty_like(got)
    torch_all_gather_single(want, x)
    assert_bits_equal(got, want, "measured all_gather")
    # A raw all-reduce under "adaptive" sums in fp32 in rank order, as a compressed one.
    y = make_data(n, torch.bfloat16, seed=5, rank=rank)
    want = reference_reduce(gather_all(y), "sum", 1.0, torch.bfloat16)
    all_reduce(y, config=cfg, stats=st)
    assert_bits_equal(y, want, "raw all_reduce sums in rank order")
    report = P.of(cfg, st).calibration.report()
    (link,) = report["links"].values()
    (speeds,) = report["speeds"].values()
    (probe,) = report["probes"].values()
    assert probe["slowdown"] >= Cal.PROBE_K_RANGE[0], probe
    return (st.snapshot()["all_gather"], link.bytes_per_s,
            {c: s.encode_bps for c, s in speeds.items()}, st.snapshot()["all_reduce"])


def task_encode_fails_midway():
    """Rank 1's encoder fails at its third call: that piece and the later ones
    go raw on every rank, the result is still exact."""
    from zipccl_fsdp import codec as C
    rank, world = dist.get_rank(), dist.get_world_size()
    real = C.encode
    calls = {"n": 0}

    def flaky(x, **kw):
        calls["n"] += 1
        if rank == 1 and calls["n"] == 3:
            raise RuntimeError("injected encoder failure")
        return real(x, **kw)

    C.encode = flaky
    try:
        st = CommStats()
        n = 5000
        x = make_data(n, torch.bfloat16, seed=9, rank=rank)
        want = torch.empty(world * n, dtype=torch.bfloat16)
        torch_all_gather_single(want, x)
        got = torch.empty_like(want)
        all_gather_single(got, x, config=forced(5, "dense"), stats=st)
        assert_bits_equal(got, want, "all_gather after a failed encode")
        return st.snapshot()["all_gather"]
    finally:
        C.encode = real


def task_corrupt_piece_all_reduce():
    """A corrupt piece in an all-reduce's first half: both ranks raise, nobody hangs,
    and the group still works afterwards."""
    from zipccl_fsdp import protocol as I
    rank = dist.get_rank()
    real = I.decode_from

    def bad(piece, out, cfg, kind, peer, group):
        if rank == 0:
            raise CorruptPayloadError("injected corrupt piece")
        return real(piece, out, cfg, kind, peer, group)

    I.decode_from = bad
    try:
        y = make_data(6000, torch.float32, seed=4, rank=rank)
        try:
            all_reduce(y, config=forced(3, "dense"))
            raised = None
        except CorruptPayloadError as e:
            raised = str(e)
    finally:
        I.decode_from = real
    t = torch.full((4,), float(rank + 1))
    all_reduce(t, config=forced(2, "dense"))
    assert t.tolist() == [3.0] * 4
    return raised


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------
def test_pipelined_all_gather_bitwise(pool2):
    for s in pool2.run(task_pipelined_all_gather):
        # every call but the empty ones (n = 0 is never encoded) went in pieces
        assert s["pipelined_calls"] == s["compressed_calls"] == s["calls"] * 4 // 5 > 0


def test_pipelined_reduce_scatter_and_all_reduce_bitwise(pool2):
    for checked, rs, ar in pool2.run(task_pipelined_reductions):
        assert checked > 0
        assert rs["pipelined_calls"] == rs["calls"] * 4 // 5 > 0
        assert ar["pipelined_calls"] == ar["calls"] * 4 // 5 > 0


def test_pipelined_all_to_all_bitwise(pool2):
    for s in pool2.run(task_pipelined_all_to_all):
        assert s["pipelined_calls"] == s["calls"] > 0


def test_policy_decisions_from_config(pool2):
    r0, r1 = pool2.run(task_decisions_given_in_config)
    for name in r0:  # every rank decided the same (wire bytes differ: own padding)
        assert r0[name]["decisions"] == r1[name]["decisions"], name
        for kind in ("all_gather", "reduce_scatter"):
            a, b = dict(r0[name][kind]), dict(r1[name][kind])
            a.pop("wire_bytes"), b.pop("wire_bytes")
            assert a == b, (name, kind)
    tiny, fast, slow, never = (r0[k] for k in ("tiny_slow_link", "fast_link", "slow_link",
                                                "never"))
    for kind in ("all_gather", "reduce_scatter"):
        assert tiny[kind]["compressed_calls"] == 0 and tiny[kind]["raw_fallback_calls"] > 0
        assert fast[kind]["compressed_calls"] == 0
        assert fast[kind]["raw_fallback_calls"] == fast[kind]["calls"]
        assert never[kind]["compressed_calls"] == 0
        assert slow[kind]["compressed_fraction"] == 1.0
        assert slow[kind]["pipelined_calls"] == slow[kind]["calls"] > 0
        assert slow[kind]["wire_bytes"] < 0.8 * slow[kind]["raw_bytes"]
    # The raw all-gathers of a fast link given in the config cost nothing extra:
    # wire == raw bytes, but for the one-time agreement check of the config (one
    # vector as wide as a size row).
    assert fast["all_gather"]["wire_bytes"] == fast["all_gather"]["raw_bytes"] + 8 * row_width(2)
    assert any(k[1] != "raw" and k[2] > 1 for k in slow["decisions"])


def test_decisions_agree_when_measurements_differ(pool2):
    (alone0, plans0, links0, c0), (alone1, plans1, links1, c1) = \
        pool2.run(task_disagreeing_measurements)
    assert alone0 != alone1          # on their own numbers the ranks would disagree
    assert plans0 == plans1 and links0 == links1 and c0 == c1
    assert c0 > 0                    # the agreed (slowest) link is slow: it compressed


def test_measured_loopback_goes_raw(pool2):
    for s, link_bps, codec_bps, ar in pool2.run(task_measured_loopback):
        assert s["compressed_calls"] == 0 and s["raw_fallback_calls"] == 1, (s, link_bps,
                                                                            codec_bps)
        assert ar["raw_fallback_calls"] == ar["calls"] == 1


def test_pipelined_encode_failure_goes_raw_on_every_rank(pool2):
    for s in pool2.run(task_encode_fails_midway):
        assert s["fallback_calls"] == 1 and s["compressed_calls"] == 1


def test_pipelined_all_reduce_corrupt_piece_raises_everywhere(pool2):
    r0, r1 = pool2.run(task_corrupt_piece_all_reduce)
    assert r0 and "injected" in r0
    assert r1 and "corrupt" in r1 and "rank" in r1


# --------------------------------------------------------------------------
# The cost model alone (no processes)
# --------------------------------------------------------------------------
def test_cost_model_pipelines_large_messages_on_slow_links():
    slow = M.LinkSpeed(150e-6, 62e6)          # the 1 Gbit namespace: 62 MB/s per rank
    fast = M.LinkSpeed(150e-6, 3.7e9)         # an unthrottled loopback, as measured once
    codec = {"dense": M.CodecSpeed(1.0e9, 1.5e9, 50e-6)}
    f = {"dense": 0.67}
    big = (M.gather(2, 32 << 20),)
    plan, t, raw = M.best_plan(big, slow, codec, f)
    assert plan.compress and plan.pieces > 1 and t < M.MARGIN * raw
    # more pieces hide more of the codec, up to the per-piece latencies
    assert M.predict(big, slow, codec["dense"], 0.67, 8) < M.predict(big, slow, codec["dense"],
                                                                      0.67, 1)
    assert not M.best_plan(big, fast, codec, f)[0].compress
    assert not M.best_plan((M.gather(2, 64),), slow, codec, f)[0].compress


def test_cost_model_prices_the_rank_order_sum():
    """A reduce-scatter part sums every rank's chunk, compressed and raw; where
    torch's all-reduce sums (two ranks), the raw call has no sum of its own."""
    link = M.LinkSpeed(150e-6, 62e6)
    fast_sum = M.CodecSpeed(1.0e9, 1.5e9, 50e-6)                  # no reduce_bps: free
    slow_sum = M.CodecSpeed(1.0e9, 1.5e9, 50e-6, reduce_bps=0.5e9)
    rs = M.scatter_reduce(4, 1 << 20)
    assert rs.reduce == rs.raw_reduce == 4 << 20
    torch_sums = M.scatter_reduce(2, 1 << 20, raw_reduces=False)
    assert torch_sums.reduce == 2 << 20 and torch_sums.raw_reduce == 0
    assert M.predict_raw((rs,), link, slow_sum) == pytest.approx(
        M.predict_raw((rs,), link) + (4 << 20) / 0.5e9)
    assert M.predict_raw((torch_sums,), link, slow_sum) == M.predict_raw((torch_sums,), link)
    one = M.predict((rs,), link, fast_sum, 0.6, 1)
    assert M.predict((rs,), link, slow_sum, 0.6, 1) == pytest.approx(one + (4 << 20) / 0.5e9)
    # in pieces, each piece's share is summed beside the next piece's transfer
    four = M.predict((rs,), link, fast_sum, 0.6, 4)
    assert four + (1 << 20) / 0.5e9 <= M.predict((rs,), link, slow_sum, 0.6, 4) < (
        four + (4 << 20) / 0.5e9)
    # the in-situ slowdown slows the sum with the codec
    assert slow_sum.slowed(2.0).reduce_bps == 0.25e9


def test_a_new_site_measures_its_own_ratio():
    """One site of a class with a poor ratio (an fp32 lm_head gradient) must not
    keep the class's other sites (bf16-cast layer gradients) raw: a site's first
    call is compressed whenever an optimistic ratio would be, and from then on
    its own ratio decides."""
    cfg = ZipCCLConfig(policy="adaptive", codec="dense", link_gbps=0.5, codec_gbps=2.0)
    pol, cpu, f32 = P.Policy(cfg), torch.device("cpu"), torch.float32
    parts = (M.scatter_reduce(2, 1 << 20),)

    def decide(site):
        return pol.decide("reduce_scatter", None, 2, site, f32, cpu, parts)

    head, layer = ("reduce_scatter", (1 << 19,), f32), ("reduce_scatter", (3 << 18,), f32)
    assert decide(head).compress  # the first site of its class: optimistic
    pol.observe(None, head, "dense", 1000, 880)
    assert not decide(head).compress  # its own poor ratio
    first = decide(layer)  # the class says raw, but this site was never measured
    assert first.compress and first.reason == "first", first
    pol.observe(None, layer, "dense", 1000, 350)
    assert decide(layer).compress and decide(layer).reason == "model"
    assert not decide(head).compress


def test_outlook_says_whether_a_call_would_measure_first():
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    st = CommStats()
    for cfg in (ZipCCLConfig(policy="always"), ZipCCLConfig(policy="never"),
                ZipCCLConfig(link_gbps=1.0, codec_gbps=2.0)):
        assert P.outlook(cfg, st, None, bf16, cpu, True) == "", cfg
    for measured in (ZipCCLConfig(), ZipCCLConfig(link_gbps=1.0), ZipCCLConfig(codec_gbps=2.0)):
        assert P.outlook(measured, st, None, bf16, cpu, True) == "calibrates", measured
        # too small to compress: raw, through zipccl's schedule (it waits), so ""
        assert P.outlook(measured, st, None, bf16, cpu, False) == "", measured
    assert P.outlook(ZipCCLConfig(policy="never"), st, None, bf16, cpu, False) == ""
    # After the measuring call: tests/test_ddp.py (the DDP hook runs it itself).


def test_config_validates_policy_fields():
    with pytest.raises(ValueError, match="policy"):
        ZipCCLConfig(policy="sometimes")
    with pytest.raises(ValueError, match="link_gbps"):
        ZipCCLConfig(link_gbps=0)
    with pytest.raises(ValueError, match="pipeline_pieces"):
        ZipCCLConfig(pipeline_pieces=-1)
    a, b = ZipCCLConfig(policy="adaptive"), ZipCCLConfig(policy="adaptive", link_gbps=1.0)
    assert a.protocol_fields() != b.protocol_fields()


# --------------------------------------------------------------------------
# Settings apart from state
# --------------------------------------------------------------------------
def test_configs_hold_settings_only():
    import dataclasses

    from zipccl_fsdp.config import DEFAULT_CONFIG
    for f in dataclasses.fields(DEFAULT_CONFIG):
        assert f.init, f"{f.name}: a field the user does not set"
        value = getattr(DEFAULT_CONFIG, f.name)
        assert value is None or type(value) in (str, int, float, bool), (f.name, value)
    assert set(vars(DEFAULT_CONFIG)) == {f.name for f in dataclasses.fields(DEFAULT_CONFIG)}
    assert DEFAULT_CONFIG == ZipCCLConfig() and hash(DEFAULT_CONFIG) == hash(ZipCCLConfig())


def test_runtime_state_goes_with_its_config():
    """State is per config object, and a config that is gone leaves none behind
    (a config made per call must not grow the runtime)."""
    import gc

    from zipccl_fsdp.runtime import Runtime
    rt = Runtime()
    a, b = ZipCCLConfig(), ZipCCLConfig()
    sa = rt.state(a)
    assert rt.state(a) is sa and rt.state(b) is not sa  # equal, but another config
    assert rt.state(a) is sa and len(rt.states()) == 2
    rt.state(b)  # b is the last one asked for
    del a
    gc.collect()
    assert rt.states() == [rt.state(b)]
    for _ in range(100):
        rt.state(ZipCCLConfig(min_bytes=1))
    gc.collect()
    assert len(rt.states()) <= 2


def test_codec_names_are_the_build_codec_set():
    from typing import get_args

    from zipccl_fsdp import codec
    from zipccl_fsdp.config import CodecName
    assert get_args(CodecName) == ("auto", *codec.CODECS)
    assert Cal.codecs(ZipCCLConfig()) == tuple(c for c in codec.CODECS if c != "raw")
    assert Cal.codecs(ZipCCLConfig(codec="fixed3")) == ("fixed3",)


def test_only_the_policy_module_reads_the_policy_setting():
    """``cfg.policy`` (or ``config.policy``) is read in ``policy.py`` alone (and
    in the config's own protocol fields)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    readers = set()
    for path in [*(root / "zipccl_fsdp").rglob("*.py"), *(root / "hooks").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr == "policy"):
                continue
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in ("cfg", "config") or name.endswith("config"):
                readers.add(path.relative_to(root).as_posix())
    readers.discard("zipccl_fsdp/config.py")
    assert readers == {"zipccl_fsdp/policy.py"}, readers


def task_hooks_keep_their_own_state():
    """Two hooks with equal configs, and the free functions with a third: each
    owner checks the agreement, decides and opens its lanes on its own."""
    from zipccl_fsdp.hooks.registry import ZipCCLHook
    from zipccl_fsdp import collectives as C
    from zipccl_fsdp.config import DEFAULT_CONFIG

    rank, world = dist.get_rank(), dist.get_world_size()
    fast = dict(link_gbps=400.0, codec_gbps=1.0)
    hooks = [ZipCCLHook(ZipCCLConfig(**fast)), ZipCCLHook(ZipCCLConfig(**fast))]
    x = make_data(1 << 16, torch.bfloat16, seed=7, rank=rank)
    want = torch.empty(world << 16, dtype=torch.bfloat16)
    torch_all_gather_single(want, x)
    out = {}
    for i, hook in enumerate(hooks):
        for _ in range(2):
            got = torch.empty_like(want)
            all_gather_single(got, x, config=hook.config, stats=hook.comm_stats)
            assert_bits_equal(got, want, f"hook {i}")
        state = hook.runtime.state(hook.config)
        out[i] = dict(stats=hook.stats()["all_gather"], lanes=len(state.lanes),
                      checked=len(state.checked_groups),
                      decisions=dict(state.policy.decisions))
    before = C.stats()["all_gather"]["size_bytes"]
    all_gather_single(torch.empty_like(want), x, config=ZipCCLConfig(**fast))
    out["module"] = C.stats()["all_gather"]["size_bytes"] - before
    out["distinct"] = (hooks[0].runtime is not hooks[1].runtime
                       and hooks[0].runtime.state(hooks[0].config)
                       is not hooks[1].runtime.state(hooks[1].config))
    # The default config through the free functions (a message under min_bytes:
    # only the agreement check, which used to write into the config).
    all_gather_single(torch.empty(world * 16), torch.ones(16))
    out["default_untouched"] = (DEFAULT_CONFIG == ZipCCLConfig() and set(vars(DEFAULT_CONFIG))
                                == set(DEFAULT_CONFIG.__dataclass_fields__))
    return out


def test_hooks_with_equal_configs_share_no_state(pool2):
    for r in pool2.run(task_hooks_keep_their_own_state):
        assert r["distinct"] and r["default_untouched"]
        for i in (0, 1):
            s = r[i]["stats"]
            # each hook ran its own agreement check: one vector as wide as a size row
            assert s["size_bytes"] == 8 * row_width(2), (i, s)
            assert s["calls"] == 2 and s["compressed_calls"] == 0, (i, s)
            assert r[i]["lanes"] == 1 and r[i]["checked"] == 1, r[i]
            assert r[i]["decisions"] == {("all_gather", "raw", 1): 2}, r[i]
        assert r["module"] == 8 * row_width(2), r  # and so did the free functions' owner


# --------------------------------------------------------------------------
# Calibration traffic is booked apart from the collectives'
# --------------------------------------------------------------------------
def task_fsdp2_default_hook_stats(steps: int):
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    from zipccl_fsdp.hooks.registry import ZipCCLHook

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(3)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    hook = ZipCCLHook()  # the default config: adaptive, everything measured
    model.register_comm_hook(hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        loss = model(torch.randn(8, 256, generator=g)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    from zipccl_fsdp.tensorboard_stats import calibration_scalars
    return hook.stats(), calibration_scalars(hook.calibration())


def test_fsdp2_default_hook_books_calibration_apart(pool2):
    for s, measured in pool2.run(task_fsdp2_default_hook_stats, 3, timeout_s=300):
        # what it measured, as the demo and TensorBoard show it (fp32 parameters)
        assert sorted(measured) == ["link_MBps", "slowdown_fp32"], measured
        assert measured["link_MBps"] > 0 and measured["slowdown_fp32"] >= 1.0, measured
        for kind in ("all_gather", "reduce_scatter"):
            k = s[kind]
            assert k["calls"] > 0 and k["compressed_calls"] == 0, (kind, k)  # the loopback: raw
            assert k["raw_bytes"] <= k["wire_bytes"] <= 1.01 * k["raw_bytes"], (kind, k)
        cal = s["calibration"]
        assert cal["calls"] > 0 and cal["wire_bytes"] > s["reduce_scatter"]["raw_bytes"], cal


# --------------------------------------------------------------------------
# Given speeds pin the decisions: two runs train the same bits
# --------------------------------------------------------------------------
def task_ddp_run_with_given_speeds(steps: int):
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from zipccl_fsdp.hooks.registry import ZipCCLHook, register_comm_hook

    rank = dist.get_rank()
    digests, stats = [], []
    for _ in range(2):  # two runs of the same script, each with its own hook
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8)),
                    bucket_cap_mb=0.01)
        hook = ZipCCLHook(ZipCCLConfig(link_gbps=0.2, codec_gbps=2.0, min_bytes=4096))
        register_comm_hook(model, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(100 + rank)
        for _ in range(steps):
            model(torch.randn(16, 512, generator=g)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        digests.append(torch.cat([p.detach().reshape(-1).view(torch.int32)
                                  for p in model.parameters()]))
        stats.append(hook.stats()["all_reduce"])
    return torch.equal(digests[0], digests[1]), stats


def test_given_speeds_make_two_runs_train_the_same_bits():
    pool = DistPool(3)
    try:
        results = pool.run(task_ddp_run_with_given_speeds, 3, timeout_s=300)
    finally:
        pool.close()
    for same, (first, second) in results:
        assert same
        assert first["compressed_calls"] > 0 and first["raw_fallback_calls"] > 0, first
        for key in ("calls", "compressed_calls", "raw_fallback_calls", "wire_bytes"):
            assert first[key] == second[key], (key, first, second)


def test_calibration_codes_fp32_as_bf16_casts():
    """The calibration's fp32 data are bf16 casts (what fp32 collectives carry
    in training), so its in-situ A/B compares a raw transfer with one a third
    as long; bf16 and fp16 data are plain Gaussian values of the dtype."""
    from zipccl_fsdp.calibration import probe_data
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    x = probe_data(4096, torch.float32, g(), torch.device("cpu"))
    assert x.dtype == torch.float32
    assert torch.equal(x.view(torch.int32), x.bfloat16().float().view(torch.int32))
    assert x.view(torch.int32).bitwise_and(0xFFFF).eq(0).all()
    assert x.std() > 0.5
    for dtype in (torch.bfloat16, torch.float16):
        y = probe_data(4096, dtype, g(), torch.device("cpu"))
        assert y.dtype == dtype and y.float().std() > 0.5
