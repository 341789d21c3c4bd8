"""Compression ratios the project promises, at 2**24 elements.

Ratio = input bytes / payload bytes. The fast code is fixed3, the dense code
is the best one; the bounds are the ratios the project promises
(docs/benchmarks.md, "Compression ratios", prints the measured ones).
"""
import pytest
import torch

import zipccl_fsdp as z
from codec_cases import mantissa_tail

N = 1 << 24


def ratio(x, codec):
    return x.numel() * x.element_size() / z.encode(x, codec=codec).numel()


@pytest.fixture(scope="module")
def gen():
    return torch.Generator().manual_seed(1234)


@pytest.mark.parametrize("sigma", [1.0, 0.02, 3e-4])
def test_gaussian_bf16(gen, sigma):
    x = (torch.randn(N, generator=gen) * sigma).bfloat16()
    assert ratio(x, "dense") >= 1.49
    assert ratio(x, "fixed3") >= 1.42


def test_zero_heavy_bf16(gen):
    x = torch.randn(N, generator=gen).bfloat16()
    x[torch.rand(N, generator=gen) < 0.3] = 0
    assert ratio(x, "dense") >= 1.65


def test_masked_by_multiplication_bf16(gen):
    # x * mask (dropout, ReLU backward, routing masks): -0.0 where x < 0, so
    # 30% zeros of both signs; each sign has its own zero code.
    x = torch.randn(N, generator=gen).bfloat16()
    x = x * (torch.rand(N, generator=gen) >= 0.3).bfloat16()
    assert int((x.view(torch.int16) == -0x8000).sum()) > 0.14 * N
    assert ratio(x, "dense") >= 1.75
    assert ratio(x, "fixed3") >= 1.70


def test_fp32_bf16_casts(gen):
    x = torch.randn(N, generator=gen).bfloat16().float()
    assert ratio(x, "dense") >= 2.9


def test_generic_fp32(gen):
    assert ratio(torch.randn(N, generator=gen), "dense") >= 1.19


def test_random_bits_expand_at_most_one_percent(gen):
    x = torch.randint(-2**15, 2**15, (N,), generator=gen, dtype=torch.int16).view(torch.bfloat16)
    for codec in z.CODECS:
        assert ratio(x, codec) >= 0.99


def masked(gen, frac, n=N):
    x = torch.randn(n, generator=gen).bfloat16()
    return x * (torch.rand(n, generator=gen) >= frac).bfloat16()


@pytest.mark.parametrize("kind", ["masked0", "masked5", "masked10", "masked30", "masked50",
                                  "masked90", "pos30", "gauss_small", "fp32_casts"])
def test_dense_at_least_as_small_as_fixed3(gen, kind):
    """dense is the small code: on x * mask at every zero fraction, +0.0-only
    zeros, Gaussian data and fp32 bf16 casts, it is never larger than fixed3."""
    n = 1 << 22
    if kind.startswith("masked"):
        x = masked(gen, int(kind[6:]) / 100, n)
    elif kind == "pos30":
        x = torch.randn(n, generator=gen).bfloat16()
        x[torch.rand(n, generator=gen) < 0.3] = 0
    elif kind == "gauss_small":
        x = (torch.randn(n, generator=gen) * 3e-4).bfloat16()
    else:
        x = torch.randn(n, generator=gen).bfloat16().float()
    assert ratio(x, "dense") >= ratio(x, "fixed3")


def test_zero_rows_fp32(gen):
    """An embedding-gradient shard as FSDP2 reduce-scatters it: fp32 bf16
    casts in 128-element rows, 89% of the rows all +0.0 (tokens the batch did
    not use)."""
    rows = (torch.randn(8192, 128, generator=gen) * 1e-3).bfloat16().float()
    rows[torch.rand(8192, generator=gen) < 0.89] = 0
    x = rows.reshape(-1)
    assert 0.87 < float((x.view(torch.int32) == 0).float().mean()) < 0.91
    assert ratio(x, "dense") >= 10.3
    assert ratio(x, "fixed3") >= 7.9


def trailing_zero_bits(x):
    """Mean count of trailing zero bits of the 23-bit fp32 mantissa field."""
    m = x.view(torch.int32) & 0x7FFFFF
    tz = torch.zeros_like(m)
    for k in range(1, 24):
        tz += ((m & ((1 << k) - 1)) == 0).int()
    return float(tz.float().mean())


def test_mantissa_tail_fp32(gen):
    """An fp32 gradient that is a sum of a few bf16 partial gradients formed
    in fp32 (as the lm_head's, which torchtitan's chunked loss accumulates
    over sequence chunks): mantissas end in about 13.5 zero bits, 99% of the
    low bytes are zero, and no chunk is an exact bf16 cast."""
    x = sum((torch.randn(N // 4, generator=gen) * 1e-3).bfloat16().float() for _ in range(5))
    assert 13.0 < trailing_zero_bits(x) < 15.0
    assert float(((x.view(torch.int32) & 0xFF) == 0).float().mean()) >= 0.98
    # LOWBYTE: 2 sm bytes an element, a bit, and the few nonzero low bytes.
    assert ratio(x, "dense") >= 1.58
    assert ratio(x, "fixed3") >= 1.54


def test_mantissa_tail_masked_fp32(gen):
    """The fp32 gradients the captures carry (benchmarks/real_traffic.py:
    outside exact bf16 casts, about 13 trailing zero mantissa bits and 95-98%
    of low bytes zero): sums of 2 to 4 bf16 values, times a 30% mask (zeros
    of both signs, coded without sm), LOWBYTE beside the zero codes."""
    x = mantissa_tail(N, gen)
    assert float(((x.view(torch.int32) & 0xFF) == 0).float().mean()) >= 0.98
    x = x * (torch.rand(N, generator=gen) >= 0.3).float()
    assert ratio(x, "dense") >= 2.00
    assert ratio(x, "fixed3") >= 1.98


def test_zero_row_runs_fp32():
    """An embedding-gradient shard as the captures show it: 1024 rows of 128,
    a row per token id, the batch's ids (Zipf-like over the first 200) the
    only nonzero rows, each a sum of bf16 terms in fp32; 80% of the rows are
    +0.0, most of them in one run, so whole chunks are zero (ZERO chunks)."""
    g = torch.Generator().manual_seed(1234)
    ids = torch.multinomial(1.0 / torch.arange(1, 201, dtype=torch.float64), 2048,
                            replacement=True, generator=g)
    x = torch.zeros(1024, 128)
    x.index_add_(0, ids, torch.randn(2048, 128, generator=g).bfloat16().float())
    assert 0.78 < float((x == 0).all(1).float().mean()) < 0.85
    assert ratio(x, "dense") >= 8.0
    assert ratio(x, "fixed3") >= 7.8
