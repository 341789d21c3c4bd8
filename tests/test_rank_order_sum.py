"""The rank-order sum's C++ loops (csrc/reduce.cpp) give the bits of its torch ops.

``_reduce.RankOrderSum`` runs its adds and its bf16 cast in C++ where the
library is loaded, and with torch ops elsewhere (a GPU, premultiplied sums, a
build without a compiler). Both must return the same bits, and both the bits
of ``collective_cases.reference_reduce`` (numpy fp32 in rank order): every
comparison is of integer views, over NaNs with payloads, infinities whose
sum is NaN, both zeros, subnormals, sums that overflow, ragged and tiny sizes,
blocks split over threads, and sums fed in pieces.
"""
from __future__ import annotations

import pytest
import torch

from codec_cases import case
from collective_cases import assert_bits_equal, make_op, reference_reduce
from zipccl_fsdp import _reduce, codec_cpp
from zipccl_fsdp.collectives.dispatch import parse_op as _parse_op

pytestmark = [
    pytest.mark.skipif(not codec_cpp.available(),
                       reason=f"C++ library unavailable: {codec_cpp.unavailable_reason()}"),
    # the numpy reference overflows to infinity where the sums must too
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SIZES = (1, 7, 8, 9, 4097, (1 << 16) + 3, 3 * (1 << 16) + 11)  # the loops take 1 << 16 a block
KINDS = ("special", "random_bits", "subnormal", "masked_mul", "neg_zero_heavy", "gauss")


def _parts(kind: str, n: int, dtype, world: int) -> list:
    return [case(kind, n, dtype, seed=17 * r + 3) for r in range(world)]


def _sum(parts: list, op: str, dtype, *, fast: bool, pieces: int = 1) -> torch.Tensor:
    n = parts[0].numel()
    out = torch.full((n,), 7.0, dtype=dtype)
    total = _reduce.RankOrderSum(out, parts[0], _parse_op(make_op(op, 1.0), "test"), len(parts))
    if not fast:
        total.ext = None
    else:
        assert total.ext is not None, "the loaded library was not taken"
    bounds = [n * i // pieces for i in range(pieces + 1)]
    for i in range(pieces):
        for r, p in enumerate(parts):
            a, b = bounds[i], bounds[i + 1]
            total.add(p[a:b], r, a, b)
    total.finish()
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ("sum", "avg"))
@pytest.mark.parametrize("world", (1, 2, 3))
def test_loops_give_the_torch_ops_bits(dtype, op, world):
    """C++ and torch, in one piece and in three, against the numpy reference."""
    for kind in KINDS:
        for n in SIZES:
            parts = _parts(kind, n, dtype, world)
            want = reference_reduce(parts, op, 1.0, dtype)
            what = f"{kind} n={n} {dtype} {op} world={world}"
            assert_bits_equal(_sum(parts, op, dtype, fast=False), want, what + " torch ops")
            assert_bits_equal(_sum(parts, op, dtype, fast=True), want, what + " C++")
            assert_bits_equal(_sum(parts, op, dtype, fast=True, pieces=3), want,
                              what + " C++ in 3 pieces")


@pytest.mark.parametrize("isa", codec_cpp.ISAS)
@pytest.mark.parametrize("threads", (1, 2))
def test_every_kernel_set_and_thread_count(monkeypatch, isa, threads):
    monkeypatch.setenv("ZIPCCL_FSDP_CPP_ISA", isa)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for dtype in DTYPES:
            for n in (5, 3 * (1 << 16) + 11):
                parts = _parts("special", n, dtype, 3)
                assert_bits_equal(_sum(parts, "sum", dtype, fast=True),
                                  reference_reduce(parts, "sum", 1.0, dtype),
                                  f"{isa} threads={threads} {dtype} n={n}")
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("isa", codec_cpp.ISAS)
def test_sum_add_says_whether_a_nan_is_left(monkeypatch, isa):
    """The flag is about the sum, not the inputs: +inf + -inf is a NaN from
    no NaN, and a NaN in the first part is reported by the add that follows.
    Each position is tried, the vector body's and the tail's."""
    monkeypatch.setenv("ZIPCCL_FSDP_CPP_ISA", isa)
    ext = codec_cpp.loaded()
    n = 21
    for pos in range(n):
        acc = torch.ones(n)
        src = torch.ones(n, dtype=torch.bfloat16)
        assert codec_cpp.sum_add(ext, acc, src, first=False) is False
        acc[pos], src[pos] = float("inf"), float("-inf")
        assert codec_cpp.sum_add(ext, acc, src, first=False) is True, pos
        assert codec_cpp.sum_add(ext, acc, torch.ones(n), first=False) is True, pos
        fresh = torch.ones(n)
        fresh[pos] = float("nan")
        acc = torch.zeros(n)
        assert codec_cpp.sum_add(ext, acc, fresh, first=True) is True, pos
        assert torch.equal(acc.view(torch.int32), fresh.view(torch.int32))


@pytest.mark.parametrize("isa", codec_cpp.ISAS)
def test_bf16_cast_rounds_as_torch_and_writes_the_canonical_nan(monkeypatch, isa):
    """Every bf16 upper half with the low halves around a tie, random ones and
    the extremes: torch's cast for every number (overflow to infinity
    included), 0x7FC0 for every NaN."""
    monkeypatch.setenv("ZIPCCL_FSDP_CPP_ISA", isa)
    hi = torch.arange(1 << 16, dtype=torch.int64) << 16
    lows = [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF]
    g = torch.Generator().manual_seed(5)
    words = torch.cat([hi | lo for lo in lows] + [hi | torch.randint(0, 1 << 16, hi.shape,
                                                                     generator=g)])
    acc = words.to(torch.int32).view(torch.float32)[:-3]  # ragged: the scalar tail too
    out = torch.empty(acc.numel(), dtype=torch.bfloat16)
    codec_cpp.sum_to_bf16(codec_cpp.loaded(), out, acc)
    want = acc.to(torch.bfloat16)
    want.view(torch.int16)[acc.isnan()] = 0x7FC0
    assert_bits_equal(out, want, f"fp32 -> bf16 ({isa})")


def test_wrong_arguments_are_refused():
    ext = codec_cpp.loaded()
    with pytest.raises(ValueError, match="bf16 or fp32"):
        codec_cpp.sum_add(ext, torch.zeros(4), torch.zeros(4, dtype=torch.float16), first=True)
    with pytest.raises(ValueError, match="4 bf16 or fp32 elements, got 3"):
        codec_cpp.sum_add(ext, torch.zeros(4), torch.zeros(3), first=True)
    with pytest.raises(ValueError, match="writes 4 bf16 elements"):
        codec_cpp.sum_to_bf16(ext, torch.zeros(4), torch.zeros(4))


def test_premultiplied_sums_keep_the_torch_ops():
    """PREMUL_SUM multiplies before adding: the loops do not, so it is not given them."""
    out = torch.empty(4, dtype=torch.bfloat16)
    op = _parse_op(make_op("premul_sum", 0.37), "test")
    assert _reduce.RankOrderSum(out, out, op, 2).ext is None
    assert _reduce.RankOrderSum(out, out, _parse_op(make_op("sum", 1.0), "test"), 2).ext \
        is codec_cpp.loaded()


def test_the_sum_never_builds_the_library(monkeypatch):
    """A process that has not loaded the library sums with torch ops (no compile behind a
    raw collective's back)."""
    monkeypatch.setitem(codec_cpp._state, "ext", None)
    out = torch.empty(4, dtype=torch.bfloat16)
    assert _reduce.RankOrderSum(out, out, _parse_op(make_op("sum", 1.0), "test"), 2).ext is None
