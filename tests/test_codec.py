"""The codec's public contract, on the torch reference backend and on "auto"."""
import struct
import zlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

import zipccl_fsdp as z
from zipccl_fsdp import format as F
from codec_cases import (CASES, DTYPES, SIZES, INT_VIEW, bits, case, from_bits, signed,
                         special_words)

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
    fields = (b"ZCCL" + bytes([3, 0, 1, 2]) + struct.pack("<QIIQ", 3, 0, 0, 6) + bytes(24)
              + struct.pack("<I", 0))
    dims = struct.pack("<2Q", 1, 3)
    head = fields + struct.pack("<I", zlib.crc32(fields + dims)) + dims  # 80 B: 16-aligned
    assert bytes(p.tolist()) == head + bytes(x.view(torch.uint8).flatten().tolist())
    # A coded payload, every byte: header, entry, offset, padding, one segment.
    q = z.encode(torch.ones(10, dtype=torch.float32), codec="fixed3", backend="torch")
    fields = (b"ZCCL" + bytes([3, 1, 3, 1]) + struct.pack("<QIIQ", 10, 4096, 1, 32) + bytes(24)
              + struct.pack("<I", 0))
    dims = struct.pack("<Q", 10)
    head = fields + struct.pack("<I", zlib.crc32(fields + dims)) + dims + bytes(8)
    entry = bytes([F.MODE_CODED, F.FLAG_LOW16, 127, 0]) + bytes(12)  # base 127: 1.0
    offsets = struct.pack("<I", 0) + bytes(12)  # body at align16(96 + 4) = 112
    codes = (sum(4 << (3 * i) for i in range(10))).to_bytes(4, "little")  # lo = 123: code 4
    segment = codes + bytes(12) + bytes(10) + bytes(6)  # LOW16 sm bytes of 1.0 are 0
    assert bytes(q.tolist()) == head + entry + offsets + segment
    h = F.parse_header(q)
    assert (h.table_offset, h.offsets_offset, h.body_offset, h.body_nbytes) == (80, 96, 112, 32)
    # LOWBYTE: 64 fp32 words 1.0 + 2**-15 (low sm byte 0), the first + 2**-23 too.
    w = torch.full((64,), 0x3F800100, dtype=torch.int32)
    w[0] = 0x3F800101
    r = z.encode(w.view(torch.float32), codec="fixed3", backend="torch")
    fields = (b"ZCCL" + bytes([3, 1, 3, 1]) + struct.pack("<QIIQ", 64, 4096, 1, 192) + bytes(24)
              + struct.pack("<I", 0))
    dims = struct.pack("<Q", 64)
    head = fields + struct.pack("<I", zlib.crc32(fields + dims)) + dims + bytes(8)
    entry = bytes([F.MODE_CODED, F.FLAG_LOWBYTE, 127, 0]) + bytes(12)
    codes = (sum(4 << (3 * i) for i in range(64))).to_bytes(24, "little") + bytes(8)
    sm = bytes([1, 0]) * 64  # sm bits 8..23: the mantissa's bit 8
    bitmap = bytes([1]) + bytes(7) + bytes(8)  # only element 0 has a low byte
    low = bytes([1]) + bytes(15)
    assert bytes(r.tolist()) == head + entry + offsets + codes + sm + bitmap + low
    assert torch.equal(bits(z.decode(r, backend="torch")), w)


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
        (4, 2, True, "format version 2; this build reads version 3"),
        (40, 1, True, "reserved header bytes"),
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
       st.integers(0, 3))
def test_hypothesis_round_trip(dtype, codec, words, mode):
    itemsize = torch.empty(0, dtype=dtype).element_size()
    mask = (1 << (8 * itemsize)) - 1
    w = [v & mask for v in words]
    if mode == 1:  # mostly +0.0, as in pruned or padded data
        w = [v if i % 5 == 0 else 0 for i, v in enumerate(w)]
    if mode == 3:  # both signed zeros mixed with NaNs of several payloads
        sign, nan = 1 << (8 * itemsize - 1), (0x7F80 if itemsize == 2 else 0x7F800000)
        if dtype == torch.float16:
            nan = 0x7C00
        w = [(0, sign, nan | (v & 0xFF) | 1, (nan | sign | (v >> 9)) | 1, v)[v % 5]
             for v in w]
    if mode == 2:  # a narrow exponent band around one value
        w = [(v & (mask >> 4)) | (0x3F80 if itemsize == 2 else 0x3F800000) for v in w]
    lim = 1 << (8 * itemsize)
    x = torch.tensor([v - lim if v >= lim // 2 else v for v in w],
                     dtype=torch.int64).to(INT_VIEW[itemsize]).view(dtype)
    y = z.decode(z.encode(x, codec=codec, backend="torch"), backend="torch")
    assert torch.equal(bits(y), bits(x))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(DTYPES), st.sampled_from(("fixed3", "dense")),
       st.integers(1, 3 * 4096 + 33), st.floats(0.0, 1.0), st.floats(0.0, 1.0),
       st.integers(0, 2 ** 31))
def test_hypothesis_signed_zeros_and_nan_payloads(dtype, codec, n, zero_frac, neg_share, seed):
    # Chunks whose -0.0 and +0.0 shares straddle the ZPOS / ZNEG thresholds,
    # with NaNs of several payloads (a quiet, a signalling and a negative one).
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g).to(dtype)
    u = torch.rand(n, generator=g)
    x[u < zero_frac * neg_share] = -0.0
    x[(u >= zero_frac * neg_share) & (u < zero_frac)] = 0.0
    itemsize = x.element_size()
    nan = from_bits(signed(special_words(dtype)[:3], itemsize), dtype)
    x[torch.randint(0, n, (3,), generator=g)] = nan
    p = z.encode(x, codec=codec, backend="torch")
    assert torch.equal(bits(z.decode(p, backend="torch")), bits(x))


def test_signed_zeros_cost_no_sm_byte():
    # 30% zeros from x * mask (both signs): every one is coded without its sm byte.
    x = case("masked_mul", 4 * 4096, torch.bfloat16)
    for codec in CODED:
        p = z.encode(x, codec=codec, backend="torch")
        h = F.parse_header(p)
        table, _ = F.read_table(p, h)
        zeros = (bits(x).view(-1, 4096) & 0x7FFF) == 0
        assert torch.equal(table.n_zero, zeros.sum(1)), codec
        assert bool(((table.flags & F.FLAG_ZNEG) != 0).all()), codec


@pytest.mark.parametrize("numel", [4097, 262244, 1000003, (1 << 20) + 3])
def test_every_chunk_takes_the_aligned_hot_path(numel):
    for dtype in DTYPES:
        x = case("masked_mul", numel, dtype, seed=numel % 7)
        for codec in CODED:
            p = z.encode(x, codec=codec, backend="torch")
            h = F.parse_header(p)
            table, offsets = F.read_table(p, h)
            hot = F.hot_path_chunks(h, table, offsets)
            assert hot.shape == (h.nchunks,) and bool(hot.all()), (numel, dtype, codec)
            starts = F.stream_starts(h, table, offsets)
            assert int(starts[-1, 0]) == h.body_offset + 16 * int(offsets[-1])
            assert h.body_offset % 16 == 0 and h.sums_offset % 16 == 0


def test_the_hot_path_at_2_24_plus_5_elements():
    # Too large for the torch reference in a unit test: the C++ backend writes
    # the same bytes (tests/test_cpp_codec.py); "auto" falls back to torch.
    x = case("masked_mul", (1 << 24) + 5, torch.bfloat16, seed=5)
    for codec in CODED:
        p = z.encode(x, codec=codec)
        h = F.parse_header(p)
        table, offsets = F.read_table(p, h)
        assert bool(F.hot_path_chunks(h, table, offsets).all()), codec


def test_v1_payload_is_refused_naming_both_versions():
    p = z.encode(torch.randn(100).bfloat16(), codec="dense", backend="torch")
    for old in (1, 2):
        with pytest.raises(z.CorruptPayloadError, match=f"version {old}.*version 3"):
            z.decode(_edit_header(p, 4, old), backend="torch")


def _forge(numel, dtype_code, nbytes, body):
    """A header with a valid CRC, numel consistent with its shape and nchunks."""
    nch = -(-numel // 4096)
    fields = (b"ZCCL" + bytes([3, 2, dtype_code, 1]) + struct.pack("<QIIQ", numel, 4096, nch, body)
              + bytes(24) + struct.pack("<I", 0))
    dims = struct.pack("<Q", numel)
    head = fields + struct.pack("<I", zlib.crc32(fields + dims)) + dims
    return torch.cat([torch.frombuffer(bytearray(head), dtype=torch.uint8),
                      torch.zeros(nbytes - len(head), dtype=torch.uint8)])


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_forged_header_is_refused_before_allocating(backend):
    # A forged header: 29.3 GiB of fp32 claimed by a 2 MiB payload, refused
    # before anything is allocated.
    numel = 29.3 * 2 ** 30 // 4
    numel = int(numel) // 4096 * 4096
    for body in (0, 2 ** 21 - 128, 16 * (numel // 4096)):
        p = _forge(numel, 3, 2 ** 21, body)
        with pytest.raises(z.CorruptPayloadError):
            z.decode(p, backend=backend)
    # A payload that holds its table but not the body the table asks for
    # (its entries, all zero, say RAW) is refused by the table's checks.
    numel = 1 << 20
    nch = numel // 4096
    small = align_up(64 + 8, 16) + align_up(20 * nch, 16) + 16 * nch
    with pytest.raises(z.CorruptPayloadError, match="offset|body"):
        z.decode(_forge(numel, 3, small, 16 * nch), backend=backend)


def align_up(x, a):
    return (x + a - 1) // a * a


def test_max_encoded_nbytes_holds_for_every_ndim_and_refuses_nonsense():
    # An incompressible (4, 4, 4096) bf16 tensor stays within the bound for
    # every codec and ndim; nonsense arguments raise ValueError.
    x = case("random_bits", 4 * 4 * 4096, torch.bfloat16).view(4, 4, 4096)
    for codec in z.CODECS:
        for verify in (False, True):
            p = z.encode(x, codec=codec, backend="torch", verify=verify)
            assert p.numel() <= z.max_encoded_nbytes(x.numel(), x.dtype, codec, verify=verify)
            assert p.numel() <= z.max_encoded_nbytes(x.numel(), x.dtype, codec, ndim=3,
                                                     verify=verify)
    one = torch.randint(-2 ** 15, 2 ** 15, (5,) * 1, dtype=torch.int16).view(torch.bfloat16)
    many = one.view(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 5)
    assert z.encode(many, codec="raw").numel() <= z.max_encoded_nbytes(5, torch.bfloat16)
    for bad in (dict(numel=-1), dict(numel=1.5), dict(numel=True), dict(numel=8, ndim=17),
                dict(numel=8, ndim=-1)):
        with pytest.raises(ValueError):
            z.max_encoded_nbytes(bad.pop("numel"), torch.bfloat16, **bad)


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_decode_into_an_out_overlapping_the_payload_is_refused(backend):
    # The same clear ValueError on every backend, naming the overlap.
    x = case("gauss", 3 * 4096, torch.bfloat16)
    p = z.encode(x, codec="fixed3", backend="torch")
    buf = torch.zeros(p.numel() + x.numel() * 2, dtype=torch.uint8)
    for at in (0, 16, p.numel() - 2):
        buf[at:at + p.numel()] = p
        out = buf[:x.numel() * 2].view(torch.bfloat16)
        with pytest.raises(ValueError, match="overlaps the payload"):
            z.decode(buf[at:at + p.numel()], out=out, backend=backend)
    buf[:p.numel()] = p
    out = buf[p.numel():p.numel() + 2 * x.numel()].view(torch.bfloat16)
    z.decode(buf[:p.numel()], out=out, backend=backend)  # adjacent, not overlapping
    assert torch.equal(bits(out), bits(x))


@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("codec", z.CODECS)
@pytest.mark.parametrize("verify", [False, True])
def test_room_keeps_the_bytes_and_gives_a_buffer_of_its_own(backend, codec, verify):
    """encode(room=r): the same payload bytes, at the start of a buffer of at
    least r bytes, which padded_in_place widens with zeros; a payload without
    room is refused rather than widened over memory it does not own."""
    from zipccl_fsdp._layout import padded_in_place
    for n in (0, 1, 4097):
        x = case("special", n, torch.bfloat16)
        plain = z.encode(x, codec=codec, backend=backend, verify=verify)
        room = plain.numel() + 1000
        roomy = z.encode(x, codec=codec, backend=backend, verify=verify, room=room)
        assert torch.equal(roomy, plain), (n, codec)
        assert roomy.storage_offset() == 0
        assert roomy.untyped_storage().nbytes() >= room
        roomy.untyped_storage()[plain.numel():room].fill_(0xAB)  # what a reused buffer holds
        send = padded_in_place(roomy, room)
        assert send.data_ptr() == roomy.data_ptr() and send.numel() == room
        assert torch.equal(send[:plain.numel()], plain)
        assert int(send[plain.numel():].count_nonzero()) == 0
        d = z.decode(send[:plain.numel()])
        assert torch.equal(bits(d), bits(x))
        if plain.untyped_storage().nbytes() - plain.storage_offset() < room:
            with pytest.raises(RuntimeError):
                padded_in_place(plain, room)
    with pytest.raises(ValueError, match="room must be an int"):
        z.encode(torch.zeros(4), room=-1)
    with pytest.raises(ValueError, match="room must be an int"):
        z.encode(torch.zeros(4), room=1.5)


def _lowbyte_rule(x):
    """Per chunk of an fp32 tensor, whether format.py's LOWBYTE rule holds for
    the torch encoder's choice of zero codes (``table``'s n_zero)."""
    w = bits(x)
    pad = -w.numel() % 4096
    valid = torch.nn.functional.pad(torch.ones_like(w, dtype=torch.bool), (0, pad)).view(-1, 4096)
    w = torch.nn.functional.pad(w, (0, pad)).view(-1, 4096)
    low16 = (((w & 0xFFFF) == 0) | ~valid).all(1)
    n_low = (valid & ((w & 0xFF) != 0)).sum(1)
    return low16, n_low


@pytest.mark.parametrize("codec", CODED)
@pytest.mark.parametrize("name", ["mantissa_tail", "tail_mixed", "gauss", "bf16_casts"])
def test_lowbyte_is_set_exactly_by_its_rule(codec, name):
    """LOWBYTE is set on exactly the fp32 chunks whose padded segment it makes
    smaller (format.lowbyte_wins), never with LOW16; mantissa tails take it,
    Gaussian fp32 and bf16 casts do not; and the payload round-trips."""
    x = case(name, 4 * 4096 + 5, torch.float32, seed=3)
    p = z.encode(x, codec=codec, backend="torch")
    table, _ = F.read_table(p, F.parse_header(p))
    low16, n_low = _lowbyte_rule(x)
    n = F.chunk_lengths(x.numel(), table.mode.numel(), 4096, "cpu")
    coded = table.mode == F.MODE_CODED
    want = coded & ~low16 & F.lowbyte_wins(n, n - table.n_zero, n_low)
    got = (table.flags & F.FLAG_LOWBYTE) != 0
    assert torch.equal(got, want), (name, got, want)
    if name == "mantissa_tail":
        assert bool(got[:-1].all())
    elif name == "tail_mixed":
        assert got.tolist() == [True, False, False, True, False]
        assert bool(low16[2])
    else:
        assert not bool(got.any())
    assert torch.equal(bits(z.decode(p, backend="torch")), bits(x))


@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("codec", CODED)
def test_a_bitmap_that_disagrees_with_the_offsets_is_refused(backend, codec):
    """Set 16 more bits in chunk 0's bitmap: its low stream would be 16 bytes
    longer than the offsets say; in the last chunk's (1003 elements), a bit
    past its end is padding."""
    x = case("mantissa_tail", 3 * 4096 + 1003, torch.float32, seed=4)
    p = z.encode(x, codec=codec, backend="torch")
    h = F.parse_header(p)
    table, offsets = F.read_table(p, h)
    assert bool(((table.flags & F.FLAG_LOWBYTE) != 0).all())
    start = F.stream_starts(h, table, offsets)[:, 2].tolist()
    bm = p[start[0]:start[0] + 512]
    unset = [i for i in range(4096) if not (int(bm[i // 8]) >> (i % 8)) & 1][:16]
    q = p.clone()
    for i in unset:
        q[start[0] + i // 8] |= 1 << (i % 8)
    with pytest.raises(z.CorruptPayloadError, match="segment offset of chunk 1"):
        z.decode(q, backend=backend)
    q = p.clone()
    q[start[3] + 1003 // 8] |= 0x80
    with pytest.raises(z.CorruptPayloadError, match="padding after a sub-stream of chunk 3"):
        z.decode(q, backend=backend)
    assert torch.equal(bits(z.decode(p, backend=backend)), bits(x))


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_lowbyte_where_the_format_forbids_it_is_refused(backend):
    """LOWBYTE only in CODED fp32 chunks without LOW16."""
    for x, flag in ((case("gauss", 4096, torch.bfloat16), 0),
                    (case("bf16_casts", 4096, torch.float32), 0),
                    (case("mantissa_tail", 4096, torch.float32), F.FLAG_LOW16)):
        p = z.encode(x, codec="fixed3", backend="torch")
        h = F.parse_header(p)
        q = p.clone()
        q[h.table_offset + 1] |= F.FLAG_LOWBYTE | flag
        with pytest.raises(z.CorruptPayloadError, match="chunk table entry 0"):
            z.decode(q, backend=backend)


@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("codec", CODED)
def test_zero_chunks_are_exactly_the_all_positive_zero_ones(backend, dtype, codec):
    """A chunk is ZERO exactly when every element is +0.0 (the ragged last
    chunk too); a chunk of +0.0 but for one -0.0, NaN or subnormal is not.
    ZERO chunks have no segment and an entry of zeros, and decode to +0.0."""
    x = case("zero_runs", 8 * 4096 + 1003, dtype, seed=5)
    p = z.encode(x, codec=codec, backend=backend)
    h = F.parse_header(p)
    table, offsets = F.read_table(p, h)
    w = torch.nn.functional.pad(bits(x), (0, -x.numel() % 4096), value=1).view(-1, 4096)
    w[-1, 1003:] = 0
    zero = (w == 0).all(1)
    assert zero.tolist() == [True, False, False, False, True, False, False, False, True]
    assert torch.equal(table.mode == F.MODE_ZERO, zero)
    assert not bool((table.mode == F.MODE_RAW).any())
    fields = torch.stack([table.flags, table.base, table.phase, table.n_zero, table.n_esc], 1)
    assert int(fields[zero].abs().sum()) == 0 and int(table.n_open[zero].abs().sum()) == 0
    ends = torch.cat([offsets[1:], torch.tensor([h.body_nbytes // F.ALIGN])])
    assert torch.equal((ends - offsets)[zero], torch.zeros(3, dtype=torch.int64))
    assert torch.equal(bits(z.decode(p, backend=backend)), bits(x))


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_zero_chunk_entries_that_break_the_format_are_refused(backend):
    """A ZERO entry carries its mode and zeros; mode 3 does not exist; a
    CODED chunk relabelled ZERO leaves a segment the offsets no longer fit."""
    x = case("zero_runs", 3 * 4096, torch.bfloat16, seed=6)
    p = z.encode(x, codec="dense", backend="torch")
    h = F.parse_header(p)
    assert p[h.table_offset:h.table_offset + 3 * F.CHUNK_ENTRY_NBYTES:F.CHUNK_ENTRY_NBYTES].tolist() \
        == [F.MODE_ZERO, F.MODE_CODED, F.MODE_ZERO]
    for at, value in ((1, F.FLAG_ZPOS), (2, 127), (4, 1), (0, 3)):
        q = p.clone()
        q[h.table_offset + at] = value
        with pytest.raises(z.CorruptPayloadError, match="chunk table entry 0"):
            z.decode(q, backend=backend)
    q = p.clone()
    q[h.table_offset + F.CHUNK_ENTRY_NBYTES:h.table_offset + 2 * F.CHUNK_ENTRY_NBYTES] = 0
    q[h.table_offset + F.CHUNK_ENTRY_NBYTES] = F.MODE_ZERO
    with pytest.raises(z.CorruptPayloadError, match="body|offset"):
        z.decode(q, backend=backend)
