"""Compression ratios the project promises, at 2**24 elements.

Ratio = input bytes / payload bytes. The fast code is fixed3, the dense code
is the best one; the bounds are the ratios the project promises
(docs/benchmarks.md, "Compression ratios", prints the measured ones).
"""
import pytest
import torch

import zipccl_fsdp as z

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
