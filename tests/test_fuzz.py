"""Damaged payloads are refused or decode exactly: short runs of the fuzz
loop (``fuzz_cases.run``, which benchmarks/fuzz_decode.py runs long), plus
hypothesis on random bytes."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import zipccl_fsdp as z
from fuzz_cases import run


def test_fuzz_verify_mode_never_crashes_or_returns_a_wrong_tensor():
    res = run(900, verify=True, backend="torch", seed=3)
    assert res["outcomes"].get("crash", 0) == 0, res["examples"]
    assert res["outcomes"].get("wrong", 0) == 0, res["examples"]
    assert res["outcomes"].get("refused", 0) > 700


def test_fuzz_without_checksums_never_crashes():
    res = run(600, verify=False, backend="torch", seed=4)
    assert res["outcomes"].get("crash", 0) == 0, res["examples"]


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=400))
def test_random_bytes_are_refused(data):
    """Bytes that are no payload (no magic, no header CRC: random bytes never
    have both) raise ``CorruptPayloadError``, whatever their length, the
    empty payload included: nothing else escapes and nothing decodes."""
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.empty(0, dtype=torch.uint8)
    with pytest.raises(z.CorruptPayloadError):
        z.decode(payload, backend="torch")


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
