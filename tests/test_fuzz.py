"""A short run of benchmarks/fuzz_decode.py, plus hypothesis on random bytes."""
import os
import sys

import torch
from hypothesis import given, settings, strategies as st

import zipccl_fsdp as z

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import fuzz_decode  # noqa: E402


def test_fuzz_verify_mode_never_crashes_or_returns_a_wrong_tensor():
    res = fuzz_decode.run(900, verify=True, backend="torch", seed=3)
    assert res["outcomes"].get("crash", 0) == 0, res["examples"]
    assert res["outcomes"].get("wrong", 0) == 0, res["examples"]
    assert res["outcomes"].get("refused", 0) > 700


def test_fuzz_without_checksums_never_crashes():
    res = fuzz_decode.run(600, verify=False, backend="torch", seed=4)
    assert res["outcomes"].get("crash", 0) == 0, res["examples"]


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=400))
def test_random_bytes_are_refused(data):
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.empty(0, dtype=torch.uint8)
    try:
        z.decode(payload, backend="torch")
    except z.CorruptPayloadError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(0, 10**6))
def test_valid_header_with_random_body_is_refused_or_exact(body, seed):
    x = torch.randn(50, generator=torch.Generator().manual_seed(seed % 1000)).bfloat16()
    p = z.encode(x, codec="dense", backend="torch", verify=True)
    h = z.format.parse_header(p)
    q = torch.cat([p[:h.table_offset], torch.frombuffer(bytearray(body), dtype=torch.uint8)])
    try:
        y = z.decode(q, backend="torch")
    except z.CorruptPayloadError:
        return
    assert torch.equal(y.view(torch.int16), x.view(torch.int16))
