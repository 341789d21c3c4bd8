"""The codec's public contract, on the torch reference backend and on "auto"."""
import struct
import zlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

import zipccl_fsdp as z
from zipccl_fsdp import format as F
from codec_cases import CASES, DTYPES, SIZES, INT_VIEW, bits, case

CODED = ("fixed3", "dense")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("codec", z.CODECS)
@pytest.mark.parametrize("name", CASES)
def test_round_trip_bitwise(dtype, codec, name):
    for n in SIZES:
        x = case(name, n, dtype)
        p = z.encode(x, codec=codec, backend="torch")
        assert p.dtype == torch.uint8 and p.dim() == 1
        assert p.numel() <= z.max_encoded_nbytes(n, dtype, codec)
        y = z.decode(p, backend="torch")
        assert y.dtype == dtype and y.shape == x.shape
        assert torch.equal(bits(y), bits(x)), (name, n)


@pytest.mark.parametrize("sigma", [1.0, 0.02, 3e-4, 1e-30, 1e30])
def test_round_trip_sigmas_and_a_large_tensor(sigma):
    x = (torch.randn(1_000_003, generator=torch.Generator().manual_seed(1)) * sigma).bfloat16()
    for codec in CODED:
        y = z.decode(z.encode(x, codec=codec, backend="torch"), backend="torch")
        assert torch.equal(bits(y), bits(x))


def test_shapes_and_out_in_place():
    x = torch.randn(3, 5, 7).bfloat16()
    p = z.encode(x, codec="dense", backend="torch")
    y = z.decode(p, backend="torch")
    assert y.shape == (3, 5, 7) and torch.equal(bits(y), bits(x))
    out = torch.empty(105, dtype=torch.bfloat16)
    r = z.decode(p, out=out, backend="torch")
    assert r is out and torch.equal(bits(out), bits(x))
    with pytest.raises(ValueError, match="out is"):
        z.decode(p, out=torch.empty(104, dtype=torch.bfloat16), backend="torch")
    with pytest.raises(ValueError, match="out is"):
        z.decode(p, out=torch.empty(105, dtype=torch.float16), backend="torch")
    nc = torch.randn(8, 6).bfloat16().t()
    assert torch.equal(bits(z.decode(z.encode(nc, backend="torch"), backend="torch")),
                       bits(nc.contiguous()))


def test_bad_arguments_name_what_is_wrong():
    with pytest.raises(TypeError, match="int32"):
        z.encode(torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="unknown codec 'zstd'"):
        z.encode(torch.zeros(4), codec="zstd")
    with pytest.raises(ValueError, match="unknown backend"):
        z.encode(torch.zeros(4), backend="numpy")
    with pytest.raises(TypeError, match="1-D uint8"):
        z.decode(torch.zeros(100, dtype=torch.int32))


def test_golden_header_bytes():
    x = torch.tensor([[1.0, -2.0, 0.0]], dtype=torch.bfloat16)
    p = z.encode(x, codec="raw", backend="torch")
    head = bytes(p[:F.HEADER_NBYTES + 16].tolist())
    fields = (b"ZCCL" + bytes([1, 0, 1, 2]) + struct.pack("<QII", 3, 0, 0)
              + struct.pack("<4Q", 0, 6, 0, 0) + struct.pack("<I", 0))
    dims = struct.pack("<2Q", 1, 3)
    assert head == fields + struct.pack("<I", zlib.crc32(fields + dims)) + dims
    assert bytes(p[-6:].tolist()) == bytes(x.view(torch.uint8).flatten().tolist())
    # A coded payload: the header names codec, dtype, chunking and stream lengths.
    q = z.encode(torch.ones(10, dtype=torch.float32), codec="fixed3", backend="torch")
    assert bytes(q[:24].tolist()) == (b"ZCCL" + bytes([1, 1, 3, 1])
                                      + struct.pack("<QII", 10, 4096, 1))
    h = F.parse_header(q)
    assert (h.codes_nbytes, h.sm_nbytes, h.rem_nbytes, h.esc_nbytes) == (4, 10, 0, 0)


def _edit_header(p, offset, value, fix_crc=True):
    """Set one header byte; with fix_crc the CRC is recomputed so deeper checks run."""
    b = p.clone()
    b[offset] = value
    if fix_crc:
        ndim = int(b[7])
        raw = bytes(b[:F.HEADER_NBYTES + 8 * ndim].tolist())
        crc = zlib.crc32(raw[:F.HEADER_NBYTES - 4] + raw[F.HEADER_NBYTES:])
        b[F.HEADER_NBYTES - 4:F.HEADER_NBYTES] = torch.tensor(list(struct.pack("<I", crc)))
    return b


def test_corrupt_headers_are_refused():
    p = z.encode(torch.randn(5000).bfloat16(), codec="dense", backend="torch")
    for offset, value, fix, msg in [
        (4, 2, True, "unknown format version 2"),
        (0, ord("X"), True, "bad magic"),
        (5, 9, True, "unknown codec id"),
        (6, 7, True, "unknown dtype code"),
        (56, 0x80, True, "unknown header flags"),
        (8, 0xFF, True, "shape"),
        (16, 0x11, True, "chunk_elems"),
        (8, 0xFF, False, "header checksum"),
        (30, 0x01, False, "header checksum"),
    ]:
        with pytest.raises(z.CorruptPayloadError, match=msg):
            z.decode(_edit_header(p, offset, value, fix), backend="torch")
    for cut in (0, 10, 63, p.numel() - 1):
        with pytest.raises(z.CorruptPayloadError):
            z.decode(p[:cut].clone(), backend="torch")
    with pytest.raises(z.CorruptPayloadError):
        z.decode(torch.cat([p, torch.zeros(3, dtype=torch.uint8)]), backend="torch")


@pytest.mark.parametrize("codec", z.CODECS)
def test_verify_mode_round_trips_and_catches_every_flipped_bit(codec):
    x = case("special", 3 * 4096 + 5, torch.bfloat16)
    p = z.encode(x, codec=codec, backend="torch", verify=True)
    assert p.numel() == z.encode(x, codec=codec, backend="torch").numel() + 4 * 4
    assert p.numel() <= z.max_encoded_nbytes(x.numel(), x.dtype, codec, verify=True)
    assert torch.equal(bits(z.decode(p, backend="torch")), bits(x))
    g = torch.Generator().manual_seed(7)
    for pos in torch.randint(0, p.numel() * 8, (40,), generator=g).tolist():
        q = p.clone()
        q[pos // 8] ^= 1 << (pos % 8)
        with pytest.raises(z.CorruptPayloadError):
            z.decode(q, backend="torch")


def test_huge_header_fields_do_not_allocate():
    p = z.encode(torch.randn(100), codec="fixed3", backend="torch").clone()
    p[8:16] = torch.tensor(list(struct.pack("<Q", 1 << 60)), dtype=torch.uint8)
    with pytest.raises(z.CorruptPayloadError):
        z.decode(p, backend="torch")


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(DTYPES), st.sampled_from(z.CODECS),
       st.lists(st.integers(0, (1 << 32) - 1), min_size=0, max_size=300),
       st.integers(0, 2))
def test_hypothesis_round_trip(dtype, codec, words, mode):
    itemsize = torch.empty(0, dtype=dtype).element_size()
    mask = (1 << (8 * itemsize)) - 1
    w = [v & mask for v in words]
    if mode == 1:  # mostly +0.0, as in pruned or padded data
        w = [v if i % 5 == 0 else 0 for i, v in enumerate(w)]
    if mode == 2:  # a narrow exponent band around one value
        w = [(v & (mask >> 4)) | (0x3F80 if itemsize == 2 else 0x3F800000) for v in w]
    lim = 1 << (8 * itemsize)
    x = torch.tensor([v - lim if v >= lim // 2 else v for v in w],
                     dtype=torch.int64).to(INT_VIEW[itemsize]).view(dtype)
    y = z.decode(z.encode(x, codec=codec, backend="torch"), backend="torch")
    assert torch.equal(bits(y), bits(x))
