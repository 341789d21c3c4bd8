"""Compressed collectives against torch's raw ones, on real gloo process groups.

all-gather and all-to-all must equal torch's bit for bit; reduce-scatter and
all-reduce must equal a reference that sums the same fp32 values in rank
order (numpy float32, independent of the implementation), then scales and
casts. Pipelined calls (any piece count, ragged sizes, both codecs) are held
to the same references. Everything is compared as integer views, never as
float values.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from collective_cases import (NAN_BITS, OPS, assert_bits_equal, check_reduce_scatter, forced,
                              gather_all, make_data, make_op, reference_reduce,
                              torch_all_gather_single)
from zipccl_fsdp.collectives import (all_gather_single, all_reduce, all_to_all_single,
                                     reduce_scatter_single, reset_stats, stats)
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.protocol import row_width
from zipccl_fsdp.errors import ZipCCLConfigError
from zipccl_fsdp.stats import CommStats

SIZES = (0, 1, 7, 4097)
DTYPES = (torch.bfloat16, torch.float32)
# policy "always" compresses every message of at least min_bytes (the default
# policy, "adaptive", would send these small ones raw on a fast loopback; see
# test_policy.py). min_bytes 0 forces the compressed path at every size; the
# default min_bytes keeps small ones raw.
CONFIGS = (ZipCCLConfig(policy="always", min_bytes=0, codec="fixed3"),
           ZipCCLConfig(policy="always", min_bytes=0, codec="dense"),
           ZipCCLConfig(policy="always"))


# --------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------
def task_all_gather():
    rank, world = dist.get_rank(), dist.get_world_size()
    checked = 0
    for ci, cfg in enumerate(CONFIGS):
        for dtype in DTYPES + (torch.float16,):
            for n in SIZES:
                x = make_data(n, dtype, seed=ci * 7 + n, rank=rank)
                want = torch.empty(world * n, dtype=dtype)
                torch_all_gather_single(want, x)
                got = torch.full((world * n,), 3.0, dtype=dtype)
                all_gather_single(got, x, config=cfg)
                assert_bits_equal(got, want, f"all_gather {dtype} n={n} {cfg}")
                # FSDP2's in-place form: the input is this rank's slot of the output.
                got2 = torch.full((world * n,), 3.0, dtype=dtype)
                own = got2[rank * n:(rank + 1) * n]
                own.copy_(x)
                all_gather_single(got2, own, config=cfg)
                assert_bits_equal(got2, want, f"in-place all_gather {dtype} n={n}")
                checked += 2
    # Multi-dimensional output and input, as torch accepts them.
    x = make_data(6 * 5, torch.bfloat16, 99, rank).view(6, 5)
    want = torch.empty(world * 6, 5, dtype=torch.bfloat16)
    torch_all_gather_single(want, x)
    got = torch.empty_like(want)
    all_gather_single(got, x, config=CONFIGS[0])
    assert_bits_equal(got, want, "2-D all_gather")
    return checked


def task_reduce_scatter(ops):
    rank, world = dist.get_rank(), dist.get_world_size()
    checked = 0
    for ci, cfg in enumerate(CONFIGS):
        for dtype in DTYPES:
            for kind in ("gauss", "bf16cast"):
                for n in SIZES:
                    for op, factor in ops:
                        x = make_data(world * n, dtype, seed=ci + 3 * n, rank=rank, kind=kind)
                        check_reduce_scatter(x, n, op, factor,
                                             f"reduce_scatter {op} {dtype} {kind} n={n} {cfg}",
                                             config=cfg)
                        checked += 1
    return checked


def task_all_reduce(ops):
    rank = dist.get_rank()
    checked = 0
    for ci, cfg in enumerate(CONFIGS):
        for dtype in DTYPES:
            for n in SIZES:
                for op, factor in ops:
                    x = make_data(n, dtype, seed=ci + 5 * n, rank=rank)
                    want = reference_reduce(gather_all(x), op, factor, dtype)
                    got = x.clone()
                    all_reduce(got, make_op(op, factor), config=cfg)
                    assert_bits_equal(got, want, f"all_reduce {op} {dtype} n={n} {cfg}")
                    checked += 1
    return checked


def task_all_to_all():
    rank, world = dist.get_rank(), dist.get_world_size()
    checked = 0
    row = 3
    for ci, cfg in enumerate(CONFIGS + (ZipCCLConfig(policy="always", min_bytes=2000),)):
        for dtype in DTYPES:
            # Ragged: rank r sends (r + 2 * j) * 700 // 3 rows to rank j, some splits empty.
            send_rows = [0 if (rank + j) % 4 == 3 else (rank + 2 * j + 1) * 700 // (3 + ci)
                         for j in range(world)]
            recv_rows = [0 if (j + rank) % 4 == 3 else (j + 2 * rank + 1) * 700 // (3 + ci)
                         for j in range(world)]
            x = make_data(sum(send_rows) * row, dtype, seed=ci, rank=rank).view(-1, row)
            want = torch.empty(sum(recv_rows), row, dtype=dtype)
            dist.all_to_all_single(want, x, recv_rows, send_rows)
            got = torch.full_like(want, 5.0)
            all_to_all_single(got, x, recv_rows, send_rows, config=cfg)
            assert_bits_equal(got, want, f"all_to_all ragged {dtype} {cfg}")
            # Equal splits (None), tiny and empty.
            for n in (0, world, 7 * world, 4097 * world):
                x = make_data(n, dtype, seed=ci + n, rank=rank)
                want = torch.empty(n, dtype=dtype)
                dist.all_to_all_single(want, x)
                got = torch.full_like(want, 5.0)
                all_to_all_single(got, x, config=cfg)
                assert_bits_equal(got, want, f"all_to_all n={n} {dtype} {cfg}")
                checked += 1
    return checked


def task_stats_and_async():
    rank, world = dist.get_rank(), dist.get_world_size()
    reset_stats()
    cfg = ZipCCLConfig(policy="always", min_bytes=0)
    n = 1 << 14
    x = make_data(n, torch.bfloat16, 1, rank)
    out = torch.empty(world * n, dtype=torch.bfloat16)
    work = all_gather_single(out, x, async_op=True, config=cfg)
    assert isinstance(work, dist.Work) and work.wait()
    g = torch.empty(n // world * world, dtype=torch.float32)
    reduce_scatter_single(g[:n // world], make_data(n // world * world, torch.float32, 2, rank,
                                                    "bf16cast"), config=cfg)
    s = stats()
    ag, rs = s["all_gather"], s["reduce_scatter"]
    assert ag["calls"] == 1 and ag["compressed_calls"] == 1 and ag["raw_bytes"] == 2 * n
    assert 0 < ag["wire_bytes"] < 0.75 * ag["raw_bytes"], ag
    assert rs["raw_bytes"] == (world - 1) * (n // world) * 4
    assert 0 < rs["wire_bytes"] < 0.4 * rs["raw_bytes"], rs
    assert ag["encode_s"] > 0 and ag["decode_s"] > 0 and ag["comm_s"] >= ag["size_exchange_s"] > 0
    # Raw path, raw for its size: what the rank hands to torch is exactly the
    # raw count, after the size row it exchanges first (the ranks agree on
    # the sizes before a route chosen from them).
    own = CommStats()
    all_gather_single(out[:world], x[:1],
                      config=ZipCCLConfig(policy="always", check_consistency=False), stats=own)
    raw_ag = own.snapshot()["all_gather"]
    assert raw_ag["compressed_calls"] == 0 and raw_ag["raw_bytes"] == 2
    assert raw_ag["wire_bytes"] == 2 + raw_ag["size_bytes"] == 2 + 8 * row_width(world)
    # Raw for a reason every rank shares: no row.
    own.reset()
    all_gather_single(out[:world], x[:1],
                      config=ZipCCLConfig(policy="never", check_consistency=False), stats=own)
    raw_ag = own.snapshot()["all_gather"]
    assert raw_ag["wire_bytes"] == raw_ag["raw_bytes"] == 2 and raw_ag["size_bytes"] == 0
    # The one-time consistency check of a new config is counted too: one
    # tagged vector as wide as a size row.
    own.reset()
    all_gather_single(out[:world], x[:1], config=ZipCCLConfig(policy="always"), stats=own)
    assert own.snapshot()["all_gather"]["wire_bytes"] == 2 + 2 * 8 * row_width(world)
    assert stats()["all_gather"]["calls"] == 1  # the call above went to `own`
    reset_stats()
    assert stats()["all_gather"]["calls"] == 0
    return s


def task_bad_input():
    """Unsupported dtype/op must raise on every rank, before any communication."""
    rank, world = dist.get_rank(), dist.get_world_size()
    errors = []
    calls = [
        lambda: all_gather_single(torch.empty(world * 4, dtype=torch.int32),
                                  torch.zeros(4, dtype=torch.int32)),
        lambda: reduce_scatter_single(torch.empty(4), torch.zeros(world * 4), ReduceOp.MAX),
        lambda: all_reduce(torch.zeros(8), ReduceOp.PRODUCT),
        lambda: all_reduce(torch.zeros(8, dtype=torch.float64)),
        lambda: all_to_all_single(torch.empty(world * 2, dtype=torch.int64),
                                  torch.zeros(world * 2, dtype=torch.int64)),
        lambda: reduce_scatter_single(torch.empty(4), torch.zeros(world * 4), ReduceOp.PREMUL_SUM),
        lambda: reduce_scatter_single(torch.empty(5), torch.zeros(world * 4)),
    ]
    for call in calls:
        try:
            call()
        except (TypeError, ValueError) as e:
            errors.append(f"{type(e).__name__}: {e}")
        else:
            errors.append(None)
    # The group is still in step: a real collective works afterwards.
    t = torch.full((4,), float(rank + 1))
    all_reduce(t, config=ZipCCLConfig(policy="always", min_bytes=0))
    assert t.tolist() == [world * (world + 1) / 2] * 4
    # unsupported_dtype="raw" hands such calls to torch unchanged.
    i = torch.full((3,), rank, dtype=torch.int64)
    all_reduce(i, config=ZipCCLConfig(policy="always", unsupported_dtype="raw"))
    assert i.tolist() == [world * (world - 1) // 2] * 3
    return errors


def task_config_mismatch():
    rank = dist.get_rank()
    # pipeline_pieces=5: a config value no earlier task agreed on, on any rank
    cfg = ZipCCLConfig(policy="always", min_bytes=0 if rank == 0 else 1 << 20, pipeline_pieces=5)
    x = torch.randn(64)
    out = torch.empty(dist.get_world_size() * 64)
    try:
        all_gather_single(out, x, config=cfg)
    except ZipCCLConfigError as e:
        return str(e)
    return None


def task_subgroup():
    """A group of ranks 1..world-1; rank 0 is not a member and returns None."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(1, world)))
    cfg = ZipCCLConfig(policy="always", min_bytes=0)
    x = make_data(4097, torch.bfloat16, 3, rank)
    sub = world - 1
    if rank == 0:
        assert all_gather_single(torch.empty(sub * 4097, dtype=torch.bfloat16), x,
                                 group=group, config=cfg) is None
        return None
    want = torch.empty(sub * 4097, dtype=torch.bfloat16)
    torch_all_gather_single(want, x, group=group)
    got = torch.empty_like(want)
    all_gather_single(got, x, group=group, config=cfg)
    assert_bits_equal(got, want, "subgroup all_gather")
    y = make_data(sub * 700, torch.float32, 4, rank)
    parts = [p[(rank - 1) * 700:rank * 700] for p in gather_all(y, group)]
    got = torch.empty(700)
    reduce_scatter_single(got, y, ReduceOp.AVG, group=group, config=cfg)
    assert_bits_equal(got, reference_reduce(parts, "avg", 1.0, torch.float32), "subgroup rs")
    return True


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 3])
def test_all_gather_bitwise(world, pool2, pool3):
    pool = pool2 if world == 2 else pool3
    assert all(c > 0 for c in pool.run(task_all_gather))


@pytest.mark.parametrize("world", [2, 3])
def test_reduce_scatter_rank_order_fp32(world, pool2, pool3):
    pool = pool2 if world == 2 else pool3
    assert all(c > 0 for c in pool.run(task_reduce_scatter, OPS))


@pytest.mark.parametrize("world", [2, 3])
def test_all_reduce_rank_order_fp32(world, pool2, pool3):
    pool = pool2 if world == 2 else pool3
    assert all(c > 0 for c in pool.run(task_all_reduce, OPS))


@pytest.mark.parametrize("world", [2, 3])
def test_all_to_all_bitwise(world, pool2, pool3):
    pool = pool2 if world == 2 else pool3
    assert all(c > 0 for c in pool.run(task_all_to_all))


def test_stats_count_bytes_and_async(pool2):
    pool2.run(task_stats_and_async)


@pytest.mark.parametrize("world", [2, 3])
def test_bad_input_raises_on_every_rank(world, pool2, pool3):
    pool = pool2 if world == 2 else pool3
    per_rank = pool.run(task_bad_input)
    for errors in per_rank:
        assert all(e is not None for e in errors), errors
        assert errors[0].startswith("TypeError") and "torch.int32" in errors[0]
        assert errors[1].startswith("ValueError") and "MAX" in errors[1]
        assert errors[2].startswith("ValueError") and "PRODUCT" in errors[2]
        assert errors[3].startswith("TypeError") and "torch.float64" in errors[3]
        assert errors[4].startswith("TypeError")
        assert errors[5].startswith("ValueError") and "factor" in errors[5]
        assert errors[6].startswith("ValueError")


def task_raw_paths_with_grad_tensors():
    """Tensors that require grad take the lean raw paths (the default policy on
    this fast loopback, and "never") without autograd seeing the call."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x = make_data(1 << 12, torch.float32, 7, rank).requires_grad_()
    for cfg in (ZipCCLConfig(), ZipCCLConfig(policy="never")):
        out = torch.empty(world << 12, requires_grad=True)
        all_gather_single(out, x, config=cfg)
        want = torch.empty(world << 12)
        torch_all_gather_single(want, x.detach())
        assert_bits_equal(out.detach(), want, "all_gather")
        assert out.grad_fn is None
        got = torch.empty(1 << 12, requires_grad=True)
        all_to_all_single(got, x, config=cfg)
        want = torch.empty(1 << 12)
        dist.all_to_all_single(want, x.detach())
        assert_bits_equal(got.detach(), want, "all_to_all")
    return True


def test_raw_paths_accept_tensors_that_require_grad(pool2):
    assert pool2.run(task_raw_paths_with_grad_tensors) == [True, True]


def order_sensitive(n: int, rank: int, world: int) -> torch.Tensor:
    """fp32 data whose sum depends on its order: at each element one rank
    holds 1e8 * s, another -1e8 * s and the others small values (which rank
    holds which rotates along the tensor), so (big + small) + -big loses the
    small value where (big + -big) + small keeps it."""
    g = torch.Generator().manual_seed(77)
    scale = torch.rand(n, generator=g) + 1.0
    pos = (torch.arange(n) + rank) % world
    x = make_data(n, torch.float32, 21, rank)
    x = torch.where(pos == 0, 1e8 * scale, x)
    return torch.where(pos == 1, -1e8 * scale, x)


# Under the default (adaptive) policy, given speeds decide without timing
# anything: a link far faster than the codec sends every call raw, a slow one
# every call compressed.
FORCED_RAW = ZipCCLConfig(min_bytes=0, link_gbps=1e5, codec_gbps=0.01)
FORCED_COMPRESSED = ZipCCLConfig(min_bytes=0, link_gbps=0.001, codec_gbps=100.0)


def task_adaptive_numerics(kind: str):
    """The same bits whether the adaptive policy sends a reduction raw or
    compressed: both sum in fp32 in rank order. torch's own all-reduce is
    asked too, to show that the data tells orders apart."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n = world * 6000
    xs = [order_sensitive(n, r, world) for r in range(world)]
    got, counts = {}, {}
    for name, cfg in (("raw", FORCED_RAW), ("compressed", FORCED_COMPRESSED)):
        st = CommStats()
        if kind == "all_reduce":
            t = xs[rank].clone()
            all_reduce(t, config=cfg, stats=st)
        else:
            t = torch.empty(n // world)
            reduce_scatter_single(t, xs[rank], config=cfg, stats=st)
        got[name] = t
        counts[name] = st.snapshot()[kind]["compressed_calls"]
    want = reference_reduce(xs, "sum", 1.0, torch.float32)
    if kind == "reduce_scatter":
        want = want.view(world, -1)[rank]
    assert_bits_equal(got["raw"], got["compressed"], f"{kind}: raw vs compressed")
    assert_bits_equal(got["raw"], want, f"{kind}: raw vs the rank-order reference")
    native = xs[rank].clone()
    dist.all_reduce(native)
    order_matters = not torch.equal(native.view(torch.int32), reference_reduce(
        xs, "sum", 1.0, torch.float32).view(torch.int32))
    return counts, order_matters


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
def test_adaptive_raw_and_compressed_reductions_give_the_same_bits(pool3, kind):
    for counts, order_matters in pool3.run(task_adaptive_numerics, kind, timeout_s=240):
        assert counts == {"raw": 0, "compressed": 1}, counts
        assert order_matters  # torch's own order gives other bits on this data


F32_SPECIALS = (0x7FC00000, 0x7FC00001, 0xFFC12345, 0x7F800001, 0xFFBFFFFF, 0x7F800000,
                0xFF800000, 0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00400000)
"""fp32 bit patterns: quiet NaNs with and without a payload, a negative one, two
signalling ones, +-inf, both zeros and subnormals."""


def with_specials(x: torch.Tensor, rank: int) -> torch.Tensor:
    """``x`` with a special value (``F32_SPECIALS``) at every other element: at
    i % 4 == 0 one that differs between ranks (NaN + inf, inf - inf, -0 + 0,
    subnormal + -subnormal, ...), at i % 4 == 2 the same one on every rank
    (-0 + -0, inf + inf, NaN payloads with themselves)."""
    specials = torch.tensor([b - (1 << 32) if b >> 31 else b for b in F32_SPECIALS],
                            dtype=torch.int32).view(torch.float32)
    i = torch.arange(x.numel())
    k = len(F32_SPECIALS)
    x = x.clone()
    x[0::4] = specials[(i[0::4] // 4 + 5 * rank) % k]
    x[2::4] = specials[(i[2::4] // 4) % k]
    return x


# Sizes (fp32 elements, 3 ranks) on both sides of all_reduce.gathers_whole:
# tiny and ragged ones, the largest gathered whole, one more, and a larger
# ragged one that goes through the schedule.
SUM_SIZES = (0, 1, 2, 5, 18001, 49152, 49153, 60002)
OPS_AT = (49152, 49153)
ALWAYS_COMPRESSED = ZipCCLConfig(policy="always", min_bytes=0)


def task_raw_all_reduce_numerics():
    """A raw all-reduce (adaptive sent raw, and "never") gives the bits of a
    compressed one and of the rank-order reference on data where the order
    matters and every special value meets every other, whether it is summed
    from one all-gather of the whole tensors or through the schedule."""
    from zipccl_fsdp.collectives.all_reduce import gathers_whole
    rank, world = dist.get_rank(), dist.get_world_size()
    sides = sorted({gathers_whole(world, 4 * n) for n in SUM_SIZES})
    counts = {}
    for n in SUM_SIZES:
        xs = [with_specials(order_sensitive(n, r, world), r) for r in range(world)]
        for op, factor in (OPS if n in OPS_AT else OPS[:1]):
            got = {}
            for name, cfg in (("raw", FORCED_RAW), ("never", ZipCCLConfig(policy="never")),
                              ("compressed", ALWAYS_COMPRESSED)):
                st = CommStats()
                t = xs[rank].clone()
                all_reduce(t, make_op(op, factor), config=cfg, stats=st)
                got[name] = t
                counts[(n, op, name)] = st.snapshot()["all_reduce"]["compressed_calls"]
            want = reference_reduce(xs, op, factor, torch.float32)
            for name in ("raw", "never"):
                assert_bits_equal(got[name], got["compressed"], f"n={n} {op}: {name} vs compressed")
                assert_bits_equal(got[name], want, f"n={n} {op}: {name} vs the reference")
    return sides, counts


def test_raw_all_reduce_gives_the_compressed_bits_across_the_gather_threshold(pool3):
    for sides, counts in pool3.run(task_raw_all_reduce_numerics, timeout_s=300):
        assert sides == [False, True]  # the sizes reach both ways of summing raw
        for (n, op, name), compressed in counts.items():
            assert compressed == int(name == "compressed" and n > 0), (n, op, name)


SPECIAL_BITS = {
    torch.bfloat16: (0x7FC0, 0x7FC1, 0xFFA5, 0x7F81, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001,
                     0x807F, 0x7F7F, 0xFF7F),
    torch.float16: (0x7E00, 0x7E01, 0xFE35, 0x7C01, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x0001,
                    0x83FF, 0x7BFF, 0xFBFF),
    torch.float32: F32_SPECIALS,
}
"""Per dtype: quiet NaNs with and without a payload, a negative one, a
signalling one, +-inf, both zeros, subnormals, and +-max (whose sums overflow)."""


def two_rank_data(n: int, dtype: torch.dtype, rank: int) -> torch.Tensor:
    """Values over a wide range of exponents (so the sums round, and tie, in
    every way), with ``SPECIAL_BITS`` at every third element: at i % 6 == 0 one
    that differs between the ranks, at i % 6 == 3 the same on both."""
    g = torch.Generator().manual_seed(91 + rank)
    x = (torch.randn(n, generator=g) * torch.exp2(torch.randint(-30, 30, (n,), generator=g)
                                                 .float())).to(dtype)
    bits = SPECIAL_BITS[dtype]
    int_dtype = {2: torch.int16, 4: torch.int32}[dtype.itemsize]
    width = 8 * dtype.itemsize
    table = torch.tensor([b - (1 << width) if b >> (width - 1) else b for b in bits],
                         dtype=int_dtype).view(dtype)
    i = torch.arange(n)
    x[0::6] = table[(i[0::6] // 6 + 5 * rank) % len(bits)]
    x[3::6] = table[(i[3::6] // 6) % len(bits)]
    return x


TWO_RANK_SIZES = (0, 1, 2, 3, 4097, 300001)


def task_two_rank_raw_all_reduce():
    """On two gloo ranks a raw SUM all-reduce (and an fp32 AVG) is torch's (its
    lane calls the process group's allreduce), and every op's raw call, first
    or through the lane, gives the bits of the compressed call and of the
    rank-order reference, in bf16, fp16 and fp32, at every size, with NaN
    payloads, infinities, both zeros, subnormals and overflowing sums."""
    from zipccl_fsdp.collectives import dispatch as C
    from zipccl_fsdp.collectives import _lanes
    rank, world = dist.get_rank(), dist.get_world_size()
    never = ZipCCLConfig(policy="never", min_bytes=0)
    vias = set()
    for dtype in SPECIAL_BITS:
        for n in TWO_RANK_SIZES:
            xs = [two_rank_data(n, dtype, r) for r in range(world)]
            for op, factor in OPS:
                want = reference_reduce(xs, op, factor, dtype)
                for name, cfg in (("raw", FORCED_RAW), ("never", never), ("lane", never),
                                  ("compressed", ALWAYS_COMPRESSED)):
                    t = xs[rank].clone()
                    all_reduce(t, make_op(op, factor), config=cfg)
                    assert_bits_equal(t, want, f"{dtype} n={n} {op}: {name} vs the reference")
            want = reference_reduce(xs, "sum", 1.0, dtype)
            native = xs[rank].clone()
            dist.all_reduce(native)
            assert torch.equal(native.isnan(), want.isnan())  # the data does make NaNs
    for (kind, _, dtype, _), lane in C._STATS.runtime.state(never).lanes.items():
        if kind == "all_reduce":
            vias.add((str(dtype), lane.via is _lanes.ALL_REDUCE))
    return sorted(vias)


def test_two_rank_raw_all_reduce_is_torchs_with_the_rank_order_bits(pool2):
    for vias in pool2.run(task_two_rank_raw_all_reduce, timeout_s=240):
        assert vias == [("torch.bfloat16", True), ("torch.float16", True),
                        ("torch.float32", True)], vias


def task_captured_calls_go_raw():
    """Under CUDA graph capture every call goes raw, with no agreement check
    and no policy (both read the host). No CUDA here: the capture predicate
    is forced, which tests what the collectives do with it."""
    from zipccl_fsdp.collectives import dispatch as C
    from zipccl_fsdp import protocol as integrity
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ZipCCLConfig(policy="always", min_bytes=0, pipeline_pieces=2, compress_all_to_all=True)
    st = CommStats()
    xs = [make_data(world << 12, torch.bfloat16, 13, r) for r in range(world)]
    x = xs[rank]
    saved = C.capturing, integrity.check_agreement

    def no_agreement(*args):
        raise AssertionError("agreement check under capture")

    C.capturing, integrity.check_agreement = (lambda t: True), no_agreement
    try:
        got = torch.empty(world * x.numel(), dtype=x.dtype)
        all_gather_single(got, x, config=cfg, stats=st)
        assert_bits_equal(got, torch.cat(xs), "all_gather")
        got = torch.empty_like(x)
        all_to_all_single(got, x, config=cfg, stats=st)
        want = torch.cat([y.view(world, -1)[rank] for y in xs])
        assert_bits_equal(got, want, "all_to_all")
        out = torch.empty(x.numel() // world, dtype=x.dtype)
        reduce_scatter_single(out, x, config=cfg, stats=st)
        total = x.clone()
        all_reduce(total, config=cfg, stats=st)
    finally:
        C.capturing, integrity.check_agreement = saved
    assert_bits_equal(out, total.view(world, -1)[rank], "reduce_scatter vs all_reduce")
    snap = st.snapshot()
    return {k: (snap[k]["calls"], snap[k]["compressed_calls"])
            for k in ("all_gather", "all_to_all", "reduce_scatter", "all_reduce")}


def test_captured_calls_go_raw(pool2):
    for counts in pool2.run(task_captured_calls_go_raw):
        assert counts == {"all_gather": (1, 0), "all_to_all": (1, 0),
                          "reduce_scatter": (1, 0), "all_reduce": (1, 0)}, counts


def test_config_mismatch_raises_on_every_rank(pool2):
    messages = pool2.run(task_config_mismatch)
    assert all(m and "disagree" in m for m in messages), messages


def test_subgroup(pool3):
    assert pool3.run(task_subgroup) == [None, True, True]


@pytest.mark.parametrize("dtype", list(SPECIAL_BITS))
def test_canonical_nans_rewrites_every_nan_and_nothing_else(dtype):
    """Every NaN (any payload, either sign, anywhere in a long or short tensor)
    becomes the positive quiet NaN without payload; every other element,
    infinities of both signs included, keeps its bits."""
    from zipccl_fsdp._reduce import canonical_nans
    bits = {2: torch.int16, 4: torch.int32}[dtype.itemsize]
    canon = torch.tensor([NAN_BITS[dtype]], dtype=bits).view(dtype)
    for n in (1, 5, 4097):
        for make_nan in (False, True):
            x = two_rank_data(n, dtype, 0)
            x[x.isnan()] = 1.0
            if n > 1:
                x[1], x[-1] = float("inf"), float("-inf")
            if make_nan:  # a negative NaN with a payload, written as bits
                neg = SPECIAL_BITS[dtype][2]
                x.view(bits)[n // 2] = neg - (1 << (8 * dtype.itemsize))
            want = torch.where(x.isnan(), canon, x)
            got = x.clone()
            canonical_nans(got)
            assert_bits_equal(got, want, f"{dtype} n={n} nan={make_nan}")
            assert make_nan == bool((got.view(bits) != x.view(bits)).any()), (dtype, n)
            # Cast from an fp32 sum, asked through it (as a reduction's finish does).
            wide = x.float()
            got = wide.to(dtype)
            canonical_nans(got, wide)
            assert_bits_equal(got, want, f"{dtype} n={n} nan={make_nan}, from fp32")


# --------------------------------------------------------------------------
# Pipelined calls: any piece count, ragged sizes, both codecs
# --------------------------------------------------------------------------
RAGGED = (0, 1, 7, 4097, 10001)
PIECES = (2, 3, 7)


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
