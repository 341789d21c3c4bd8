"""Verify mode's and the agreement check's local parts: the protocol field,
the checksum and the text that names fields and ranks.

* ``verify`` is a validated protocol field, the one slot that differs in
  the agreement vector;
* the checksum catches every single-element change, a dtype relabelled in
  the header, and the multi-element changes a linear weighted sum cancels;
* a disagreement is described per field, with the ranks on each side.

What verify mode, the agreement check and the fallback do across ranks is
tested with the other failure paths, in test_collective_failures.py.
"""
from __future__ import annotations

import struct
import zlib

import pytest
import torch

from zipccl_fsdp import codec as zcodec
from zipccl_fsdp import format as F
from zipccl_fsdp import protocol as integrity
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.errors import CorruptPayloadError

INT = {2: torch.int16, 4: torch.int32}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).contiguous().view(INT[t.element_size()])


# --------------------------------------------------------------------------
# The config field and the checksum
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
    # One damaged byte of fp16's 3-bit rem stream can move three neighbours by
    # -2, +3, -1 (x 1024), which sum(word_i * (2i + 1)) cancels.
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
