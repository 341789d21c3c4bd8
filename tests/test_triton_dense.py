"""The dense Triton kernels (format v2) against the torch reference.

Encode is launched here with codec_encode's launch plan and arguments
into a buffer of 0xAB bytes, so a padding byte the kernel leaves unwritten
shows; decode through the public API with ``out=`` (codec_decode.py's one
kernel, header checked on the device), and, for error bits, through
this file's ``dense_decode_kernel`` (dense_decode_chunk over a header the
host parsed). Without CUDA they run on CPU tensors under the Triton
interpreter (conftest.py sets TRITON_INTERPRET), where a chunk takes seconds:
the inputs pack their cases into few chunks. Payloads are compared as bytes,
decoded tensors as integer views.
"""
import pytest
import torch

from zipccl_fsdp.triton_kernels import available

if not available():
    pytest.skip("triton is not installed", allow_module_level=True)

import zipccl_fsdp as z  # noqa: E402
from zipccl_fsdp import codec_torch  # noqa: E402
from zipccl_fsdp import format as F  # noqa: E402
from zipccl_fsdp.errors import CorruptPayloadError  # noqa: E402
from codec_cases import INT_VIEW, bits, from_bits, signed, special_words  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
C = F.CHUNK_ELEMS


def _interpreted() -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    from zipccl_fsdp.triton_kernels import dense_encode
    return isinstance(dense_encode.dense_encode_kernel, InterpretedFunction)


if not HAS_CUDA and not _interpreted():
    pytest.skip("CPU tensors need the Triton interpreter", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from zipccl_fsdp.triton_kernels import codec_encode as E  # noqa: E402
from zipccl_fsdp.triton_kernels._codec_common import tile_shape  # noqa: E402
from zipccl_fsdp.triton_kernels.dense_decode import dense_decode_chunk  # noqa: E402


@triton.jit
def dense_decode_kernel(p_ptr, out_ptr, err_ptr, numel, nch, C, table_off, offsets_off, body_off,
                        body_nbytes, ITEMSIZE: tl.constexpr, EXP_BITS: tl.constexpr,
                        MAN_BITS: tl.constexpr, CP: tl.constexpr, T: tl.constexpr):
    """The chunks (C elements each) of a dense payload whose header the host
    parsed, each program one chunk, the OR of the ERR_* bits in ``err_ptr``
    (codec_decode.py's decode_kernel checks the header on the device and
    calls dense_decode_chunk too)."""
    c = tl.program_id(0)
    start = c.to(tl.int64) * C
    n = tl.minimum(numel - start, C).to(tl.int32)
    err = dense_decode_chunk(p_ptr, out_ptr + start, c, n, nch, table_off, offsets_off, body_off,
                             body_nbytes, ITEMSIZE, EXP_BITS, MAN_BITS, CP, T)
    tl.atomic_or(err_ptr, err, mask=err != 0)


def encode(x: torch.Tensor) -> torch.Tensor:
    """The dense payload of x from the Triton kernel, in a launch region
    prepared as codec_encode prepares one (the kernel writes the header from
    its template), the header checked against format's. The buffer starts as
    0xAB bytes, so a padding byte the kernel leaves unwritten shows."""
    info = F.dtype_info(x.dtype)
    numel = x.numel()
    nch = F.nchunks_for(numel)
    h = F.Header("dense", x.dtype, tuple(x.shape), numel, C, nch, 0)
    out = torch.full((F.max_encoded_nbytes(numel, x.dtype, x.dim()),), 0xAB, dtype=torch.uint8,
                     device=x.device)
    region = E.initial_region(h).to(x.device)
    kernel, const, warps = E.launch_plan(info, "dense", C)
    kernel[(nch,)](*E.launch_args(kernel, x.reshape(-1).view(INT_VIEW[info.itemsize]), out, region,
                                  numel, nch, C, h), **const, num_warps=warps)
    h.body_nbytes = 16 * int(region[E.TOTAL])
    out = out[:h.total_nbytes].clone()
    head = h.pack()
    assert bytes(out[:len(head)].cpu().numpy()) == head, "the kernel's header"
    return out


def decode(payload: torch.Tensor):
    """(decoded tensor, error bits) from the Triton kernel."""
    h = F.parse_header(payload)
    info = F.DTYPES[h.dtype]
    out = torch.empty(h.shape, dtype=h.dtype, device=payload.device)
    err = torch.zeros(1, dtype=torch.int32, device=payload.device)
    warps = 4
    cp, t = tile_shape(h.chunk_elems, warps)
    dense_decode_kernel[(h.nchunks,)](
        payload, out.reshape(-1).view(INT_VIEW[info.itemsize]), err, h.numel, h.nchunks,
        h.chunk_elems, h.table_offset, h.offsets_offset, h.body_offset, h.body_nbytes,
        ITEMSIZE=info.itemsize, EXP_BITS=info.exp_bits, MAN_BITS=info.man_bits, CP=cp, T=t,
        num_warps=warps)
    return out, int(err[0])


def _specials(dtype, zeros: bool = True):
    size = torch.empty(0, dtype=dtype).element_size()
    words = [w for w in special_words(dtype) if zeros or w not in (0, 1 << (8 * size - 1))]
    return from_bits(signed(words, size), dtype)


def mixed(dtype, seed: int = 0) -> torch.Tensor:
    """3 chunks + 37 elements, one per path of the kernels:
    0: Gaussian with NaN payloads, +-inf, subnormals and a few -0.0 (below
       the ZNEG threshold) but no +0.0: the hot path;
    1: random bit patterns: a RAW chunk;
    2: x * mask with 30% zeros of both signs: ZPOS and ZNEG, zeros omitted
       (fp16: the rem stream compacted);
    3: a ragged tail of 37 with every special value, +-0.0 included (RAW:
       too short to gain)."""
    g = torch.Generator().manual_seed(seed)
    size = torch.empty(0, dtype=dtype).element_size()
    x = torch.randn(3 * C + 37, generator=g).to(dtype)
    sp = _specials(dtype, zeros=False)
    idx = torch.randperm(C, generator=g)[:3 * sp.numel()]
    x[idx] = sp.repeat(3)
    x[idx[:5] + 1] = -0.0
    lim = 1 << (8 * size - 1)
    x[C:2 * C] = torch.randint(-lim, lim, (C,), generator=g).to(INT_VIEW[size]).view(dtype)
    x[2 * C:3 * C] *= (torch.rand(C, generator=g) > 0.3).to(dtype)
    tail = _specials(dtype)
    x[3 * C:3 * C + tail.numel()] = tail
    return x


def _roundtrip(x: torch.Tensor) -> torch.Tensor:
    pt = codec_torch.encode(x, "dense")
    pg = encode(x)
    assert pg.numel() == pt.numel(), (pg.numel(), pt.numel())
    assert torch.equal(pg, pt), f"first differing byte {int((pg != pt).nonzero()[0, 0])}"
    y = torch.empty_like(x)
    assert z.decode(pt, out=y, backend="triton") is y
    assert torch.equal(bits(y), bits(x))
    return pt


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bytes_equal_torch_and_round_trip(dtype):
    x = mixed(dtype).to(DEV)
    p = _roundtrip(x)
    h = F.parse_header(p)
    table, _ = F.read_table(p, h)
    # The chunks took the paths the input was built for.
    assert table.mode.tolist()[:3] == [1, 0, 1]
    flags = table.flags.tolist()
    assert flags[0] & (F.FLAG_ZPOS | F.FLAG_ZNEG) == 0 and table.n_esc[0] > 0
    assert flags[2] & (F.FLAG_ZPOS | F.FLAG_ZNEG) == F.FLAG_ZPOS | F.FLAG_ZNEG


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tiny_and_ragged_sizes(dtype):
    sp = _specials(dtype)
    for n in (1, 7, 16):
        _roundtrip(sp.repeat(2)[:n].clone().to(DEV))
    # One full chunk of large values (the window clamped at the top), then 1.
    big = torch.finfo(dtype).max / 8
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(C + 1, generator=g) * big).to(dtype)
    _roundtrip(x.view(1, C + 1).to(DEV))


def test_zero_signs_and_fp32_low16():
    """Only -0.0 (ZNEG alone), only +0.0, and fp32 bf16 casts (LOW16) with
    and without zeros."""
    _roundtrip(-torch.zeros(300, dtype=torch.bfloat16, device=DEV))
    _roundtrip(torch.zeros(C, dtype=torch.float16, device=DEV))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2 * C, generator=g).bfloat16().float()
    x[C:] *= (torch.rand(C, generator=g) > 0.5).float()
    p = _roundtrip(x.to(DEV))
    table, _ = F.read_table(p, F.parse_header(p))
    assert ((table.flags & F.FLAG_LOW16) != 0).tolist() == [True, True]


def test_fp32_low16_checks_every_word():
    """LOW16 only when every word of the chunk has zero low 16 bits: one
    word with a low bit set, at a first-half and a second-half position of
    a thread's row (a full fp32 chunk is a [T, G, 2, 4] tile in the
    encoder) and at the chunk's last word, clears the flag of its chunk and
    of no other."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(3 * C, generator=g).bfloat16().float()
    for at in (3, 8 * 5 + 6, C - 1):
        x = base.clone()
        xi = x.view(torch.int32)
        xi[C + at] |= 1  # chunk 1
        p = _roundtrip(x.to(DEV))
        table, _ = F.read_table(p, F.parse_header(p))
        assert table.mode.tolist() == [F.MODE_CODED] * 3, at  # (a RAW entry has no flags)
        assert ((table.flags & F.FLAG_LOW16) != 0).tolist() == [True, False, True], at


def test_subnormal_window():
    """Subnormal magnitudes: the locator near exponent 0."""
    g = torch.Generator().manual_seed(3)
    for dtype in DTYPES:
        x = (torch.randn(C, generator=g, dtype=torch.float64) * torch.finfo(dtype).tiny).to(dtype)
        _roundtrip(x.to(DEV))


def _torch_raises(p: torch.Tensor) -> None:
    h = F.parse_header(p)
    with pytest.raises(CorruptPayloadError):
        codec_torch.decode(p, h, torch.empty(h.shape, dtype=h.dtype, device=p.device))


def test_decode_flags_corrupt_payloads():
    """Each damage sets its error bit (and the torch reference refuses the
    same payload); the intact payload decodes without one."""
    from zipccl_fsdp.triton_kernels import dense_decode as D
    x = mixed(torch.bfloat16, seed=4)[:2 * C + 37].clone().to(DEV)  # chunks: hot, raw, tail
    p = codec_torch.encode(x, "dense")
    h = F.parse_header(p)
    table, offsets = F.read_table(p, h)
    starts = F.stream_starts(h, table, offsets)
    lengths = F.segment_nbytes("dense", F.DTYPES[h.dtype], F.chunk_lengths(
        h.numel, h.nchunks, C, p.device), table)
    cases = {}
    q = p.clone()
    q[h.table_offset] = 7  # chunk 0's mode
    cases["mode"] = (q, D.ERR_TABLE.value)
    q = p.clone()
    q[h.offsets_offset + 4] += 1  # chunk 1's offset
    cases["offset"] = (q, D.ERR_OFFSETS.value)
    q = p.clone()
    part = next(k for k in range(4) if lengths[k][0] % 16)  # chunk 0's first padded part
    q[int(starts[0, part] + lengths[part][0])] = 1
    cases["padding"] = (q, D.ERR_PADDING.value)
    q = p.clone()
    q[h.table_offset + 6] ^= 1  # chunk 0's n_esc
    cases["n_esc"] = (q, None)
    q = p.clone()
    at = int(starts[0, 0])  # chunk 0's first tier-0 digit: opened or closed
    q[at] = q[at] & 0xFC if int(q[at]) & 3 == 3 else q[at] | 3
    cases["codes"] = (q, D.ERR_TIERS.value)
    for name, (q, bit) in cases.items():
        _torch_raises(q)
        with pytest.raises(CorruptPayloadError):
            z.decode(q, out=torch.empty_like(x), backend="triton")
        _, err = decode(q)
        assert err != 0, name
        if bit is not None:
            assert err & bit, (name, err)
    _, err = decode(p)
    assert err == 0


def test_zeros_below_the_thresholds_on_the_hot_path():
    """Full chunks with a few zeros (no flag: +0.0 has the last rank and no
    sm byte, -0.0 is coded by its exponent), +0.0 only flagged (ZPOS, -0.0
    by exponent), -0.0 only flagged (ZNEG, +0.0 by exponent), at the top and
    the bottom of the exponent range: bytes and bits."""
    g = torch.Generator().manual_seed(5)
    for dtype in DTYPES:
        x = torch.randn(4 * C, generator=g).to(dtype)
        idx = torch.randperm(C, generator=g)
        x[idx[:40]] = 0.0
        x[idx[40:70]] = -0.0
        x[C + idx[:C // 8]] = 0.0
        x[C + idx[C // 8:C // 8 + 20]] = -0.0
        x[2 * C + idx[:C // 8]] = -0.0
        x[2 * C + idx[C // 8:C // 8 + 20]] = 0.0
        tiny = torch.finfo(dtype).tiny
        x[3 * C:] = (torch.randn(C, generator=g, dtype=torch.float64) * tiny * 4).to(dtype)
        x[3 * C + idx[:30]] = -0.0
        x[3 * C + idx[30:50]] = 0.0
        p = _roundtrip(x.to(DEV))
        table, _ = F.read_table(p, F.parse_header(p))
        zf = (table.flags & (F.FLAG_ZPOS | F.FLAG_ZNEG)).tolist()
        assert zf[:3] == [0, F.FLAG_ZPOS, F.FLAG_ZNEG], zf
        assert table.n_zero.tolist()[0] == 40  # the unflagged +0.0s omit their sm byte


@pytest.mark.parametrize("chunk_elems, n", [(8, 21), (1000, 2500), (4104, 4104 + 37),
                                            (10000, 20003)])
def test_decodes_other_chunk_sizes(chunk_elems, n, monkeypatch):
    """The format allows any chunk size of 8..65535 that is a multiple of 8
    (format.parse_header), and the torch and C++ backends decode them: so
    does the Triton decoder (sub-blocks of up to 4096 elements for chunks
    above that), bit for bit, and it flags a damaged tier in the last
    sub-block of a chunk."""
    monkeypatch.setattr(F, "CHUNK_ELEMS", chunk_elems)
    g = torch.Generator().manual_seed(chunk_elems)
    for dtype in DTYPES:
        x = torch.randn(n, generator=g).to(dtype)
        x[::5] *= (torch.rand(x[::5].shape, generator=g) > 0.5).to(dtype)  # zeros, both signs
        sp = _specials(dtype)
        x[torch.randperm(n, generator=g)[:sp.numel()]] = sp
        x = x.to(DEV)
        p = codec_torch.encode(x, "dense")
        h = F.parse_header(p)
        assert h.chunk_elems == chunk_elems
        y = torch.empty_like(x)
        z.decode(p, out=y, backend="triton")
        assert torch.equal(bits(y), bits(x)), dtype
        y2, err = decode(p)
        assert err == 0 and torch.equal(bits(y2), bits(x))
    table, offsets = F.read_table(p, h)
    coded = (table.mode == F.MODE_CODED).nonzero()[:, 0].tolist()
    if chunk_elems < 1000:  # (chunks of 8 never shrink: all RAW)
        assert coded == []
        return
    c = coded[-1]
    starts = F.stream_starts(h, table, offsets)
    nc = int(F.chunk_lengths(h.numel, h.nchunks, chunk_elems, p.device)[c])
    q = p.clone()
    at = int(starts[c, 0]) + (2 * (nc - 1)) // 8  # the chunk's last element's tier-0 digit
    sh = (2 * (nc - 1)) % 8
    digit = (int(q[at]) >> sh) & 3
    q[at] = (int(q[at]) & ~(3 << sh)) | ((0 if digit == 3 else 3) << sh)  # open or close tier 1
    _torch_raises(q)
    _, err = decode(q)
    assert err != 0
    with pytest.raises(CorruptPayloadError):
        z.decode(q, out=torch.empty_like(x), backend="triton")


def test_zeros_among_the_largest_exponents():
    """Full chunks whose base is within 7 of the top exponent, with zeros
    flagged (x * mask: ZPOS and ZNEG) and unflagged: no zero may name an
    exponent past the dtype's (the decoder's exponent check), bits intact."""
    g = torch.Generator().manual_seed(6)
    for dtype in DTYPES:
        info = F.dtype_info(dtype)
        x = (torch.randn(2 * C, generator=g) * (torch.finfo(dtype).max / 4)).to(dtype)
        x[:C] *= (torch.rand(C, generator=g) > 0.3).to(dtype)
        idx = torch.randperm(C, generator=g)
        x[C + idx[:40]] = 0.0
        x[C + idx[40:70]] = -0.0
        p = _roundtrip(x.to(DEV))
        table, _ = F.read_table(p, F.parse_header(p))
        assert table.mode.tolist() == [1, 1]
        assert (table.base >= info.emax - 7).all(), table.base
        zf = (table.flags & (F.FLAG_ZPOS | F.FLAG_ZNEG)).tolist()
        assert zf == [F.FLAG_ZPOS | F.FLAG_ZNEG, 0], zf
        y, err = decode(p)
        assert err == 0 and torch.equal(bits(y), bits(x.to(DEV)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_every_padding_of_a_hot_chunk_checked(dtype):
    """A nonzero byte in any padded part of a full chunk's segment (codes,
    sm, rem, escapes: each checked by its own threads) sets ERR_PADDING,
    whichever byte of the padding it is."""
    from zipccl_fsdp.triton_kernels import dense_decode as D
    x = mixed(dtype, seed=7)[:C + 1].clone().to(DEV)  # chunk 0: full and hot
    x[: C // 2] *= (torch.rand(C // 2, generator=torch.Generator().manual_seed(7)) > 0.2).to(dtype)
    p = codec_torch.encode(x, "dense")
    h = F.parse_header(p)
    table, offsets = F.read_table(p, h)
    assert int(table.mode[0]) == 1
    starts = F.stream_starts(h, table, offsets)
    lengths = F.segment_nbytes("dense", F.DTYPES[h.dtype], F.chunk_lengths(
        h.numel, h.nchunks, C, p.device), table)
    parts = [k for k in range(4) if int(lengths[k][0]) % 16]
    assert len(parts) >= 3, parts  # (bf16: codes, sm, esc; fp16: rem too, or one of them)
    for k in parts:
        end = int(starts[0, k] + lengths[k][0])
        for at in (end, (end | 15)):  # the first and the last byte of the padding
            q = p.clone()
            q[at] = 0x40
            _, err = decode(q)
            assert err & D.ERR_PADDING.value, (k, at, err)
    _, err = decode(p)
    assert err == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_table_entry_fields_and_raw_padding_flagged(dtype):
    """Each field of a chunk-table entry outside format.validate_table's
    rules (mode, flags, LOW16 on a 16-bit dtype, phase, base past the
    dtype's exponents, a zero count past n, the tier-count chain) sets
    ERR_TABLE for a hot chunk, and a nonzero padding byte of a RAW chunk
    sets ERR_PADDING; the torch reference refuses each payload too."""
    from zipccl_fsdp.triton_kernels import dense_decode as D
    x = mixed(dtype, seed=9)
    x = torch.cat([x[:C], x[C:C + 5]]).clone().to(DEV)  # chunk 0 hot, chunk 1 RAW (5 elements)
    p = codec_torch.encode(x, "dense")
    h = F.parse_header(p)
    table, offsets = F.read_table(p, h)
    assert table.mode.tolist() == [1, 0], table.mode
    t0 = h.table_offset
    emax = F.dtype_info(dtype).emax
    cases = {"mode": (0, 2), "flags": (1, 8), "low16": (1, 1), "phase": (3, 4)}
    if emax < 255:
        cases["base"] = (2, emax + 1)
    cases = {k: [(t0 + at, v)] for k, (at, v) in cases.items()}
    cases["flags"] = [(t0 + 1, int(p[t0 + 1]) | 8)]
    cases["low16"] = [(t0 + 1, int(p[t0 + 1]) | 1)]
    cases["n_zero"] = [(t0 + 4, (C + 1) & 0xFF), (t0 + 5, (C + 1) >> 8)]
    o1 = int(table.n_open[0, 0])
    cases["n_open2"] = [(t0 + 10, (o1 + 1) & 0xFF), (t0 + 11, (o1 + 1) >> 8)]
    for name, writes in cases.items():
        q = p.clone()
        for at, v in writes:
            q[at] = v
        _torch_raises(q)
        _, err = decode(q)
        assert err & D.ERR_TABLE.value, (name, err)
    raw_end = int(h.body_offset + 16 * int(offsets[1])) + 5 * x.element_size()
    for at in (raw_end, raw_end | 15):  # the RAW chunk's first and last padding byte
        q = p.clone()
        q[at] = 0x40
        _torch_raises(q)
        _, err = decode(q)
        assert err & D.ERR_PADDING.value, (at, err)
    y, err = decode(p)
    assert err == 0 and torch.equal(bits(y), bits(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_exponent_past_the_dtype_flagged(dtype):
    """A hot chunk whose base is moved to the top (bottom) exponent, so that
    its elements of positive (negative) offsets name an exponent the dtype
    lacks, sets ERR_EXPONENT and nothing else (the table, counts and
    paddings are intact); the torch reference refuses each payload too."""
    from zipccl_fsdp.triton_kernels import dense_decode as D
    x = mixed(dtype, seed=11)[:C].clone().to(DEV)
    p = codec_torch.encode(x, "dense")
    h = F.parse_header(p)
    table, _ = F.read_table(p, h)
    assert table.mode.tolist() == [1], table.mode
    for base in (F.dtype_info(dtype).emax, 0):
        q = p.clone()
        q[h.table_offset + 2] = base
        _torch_raises(q)
        _, err = decode(q)
        assert err == D.ERR_EXPONENT.value, (base, err)
    y, err = decode(p)
    assert err == 0 and torch.equal(bits(y), bits(x))


def test_kept_and_escape_counts_flagged():
    """A hot chunk whose entry claims one zero more, or one escape more (or
    fewer), than its codes hold, with the segment's padded layout unchanged
    (the table and offsets checks pass): the decoded counts disagree and
    ERR_COUNTS is set; the torch reference refuses each payload too."""
    from zipccl_fsdp.triton_kernels import dense_decode as D
    x = mixed(torch.bfloat16, seed=12)[:C].clone().to(DEV)
    p = codec_torch.encode(x, "dense")
    h = F.parse_header(p)
    table, _ = F.read_table(p, h)
    assert table.mode.tolist() == [1], table.mode
    nz, nesc, o4 = int(table.n_zero[0]), int(table.n_esc[0]), int(table.n_open[0, 3])
    assert (C - nz) % 16 != 1, nz  # one sm byte fewer keeps the padded sm
    assert nesc % 16 != 0 and nesc < o4, (nesc, o4)  # one escape byte more keeps the padded esc
    t0 = h.table_offset
    for at, v in ((t0 + 4, nz + 1), (t0 + 6, nesc + 1)):  # n_zero, n_esc (u16)
        q = p.clone()
        q[at], q[at + 1] = v & 0xFF, v >> 8
        _torch_raises(q)
        _, err = decode(q)
        assert err & D.ERR_COUNTS.value, (at - t0, err)
        assert not err & (D.ERR_TABLE.value | D.ERR_OFFSETS.value), (at - t0, err)


def _count_calls(monkeypatch, module, names) -> dict:
    """Count the calls of the jitted functions ``names`` of ``module`` that
    the kernels make: under the interpreter a kernel's call of another is a
    Python call of the module's attribute. Empty (nothing counted) when the
    kernels are compiled for a GPU."""
    calls = {}
    if HAS_CUDA:
        return calls
    for name in names:
        orig = getattr(module, name)

        def counted(*a, _orig=orig, _name=name, **k):
            calls[_name] = calls.get(_name, 0) + 1
            return _orig(*a, **k)
        monkeypatch.setattr(module, name, counted)
    return calls


def hot_and_cold(dtype, seed: int = 21) -> torch.Tensor:
    """9 chunks + 37 elements, for the hot paths (a full chunk without zeros)
    and the cold ones:
    0: Gaussian: hot;
    1: Gaussian with NaN payloads, +-inf and subnormals, no zero: hot, its
       locator's count of normal numbers below the chunk's length;
    2: many escapes: thread 0's 32 elements, thread 5's first 31, every
       third element of thread 9 (the largest finite value, +-inf): hot,
       32 rounds;
    3: Gaussian with one +0.0 (no flag, n_zero 1): cold encode (the zero
       path, escapes in rounds) and decode;
    4: Gaussian with one -0.0 (no flag: coded by its exponent, n_zero 0):
       cold encode (the zero path), hot decode;
    5: 300 -0.0 and no +0.0 (ZNEG): cold encode (the zero path) and decode;
    6: fp32: bf16 casts (LOW16); 16-bit: Gaussian of spread 0.02 (fp16:
       subnormals); no zero: hot;
    7: random bit patterns without zeros: hot encode, RAW;
    8: Gaussian: hot (after the RAW chunk);
    9: a ragged tail of 37: cold."""
    g = torch.Generator().manual_seed(seed)
    size = torch.empty(0, dtype=dtype).element_size()
    x = torch.randn(9 * C + 37, generator=g).to(dtype)
    sp = _specials(dtype, zeros=False)
    x[C + torch.randperm(C, generator=g)[:3 * sp.numel()]] = sp.repeat(3)
    big = torch.tensor([torch.finfo(dtype).max, -torch.finfo(dtype).max, float("inf"),
                        -float("inf")], dtype=dtype)
    x[2 * C:2 * C + 32] = big.repeat(8)
    x[2 * C + 5 * 32:2 * C + 6 * 32 - 1] = big.repeat(8)[:31]
    x[2 * C + 9 * 32:2 * C + 10 * 32:3] = big.repeat(3)[:11]
    x[3 * C + 100] = 0.0
    x[4 * C + 200] = -0.0
    x[5 * C + torch.randperm(C, generator=g)[:300]] = -0.0
    if dtype == torch.float32:
        x[6 * C:7 * C] = x[6 * C:7 * C].bfloat16().float()
    else:
        x[6 * C:7 * C] = (torch.randn(C, generator=g) * 0.02).to(dtype)
    lim = 1 << (8 * size - 1)
    x[7 * C:8 * C] = torch.randint(-lim, lim, (C,), generator=g).to(INT_VIEW[size]).view(dtype)
    for k in (0, 1, 2, 4, 6, 7, 8):  # no exact zero but those placed above
        part = x[k * C:(k + 1) * C]
        part[(bits(part) << 1 == 0) & ~torch.isin(torch.arange(C), torch.tensor([200]))] = 1.0
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hot_and_cold_chunks_take_their_paths(dtype, monkeypatch):
    """Every path of hot_and_cold's chunks, bytes equal to the torch
    reference's and decoded bit for bit; under the interpreter, the cold
    functions are called for the chunks meant for them and no other."""
    from zipccl_fsdp.triton_kernels import dense_decode as DD
    from zipccl_fsdp.triton_kernels import dense_encode as DE
    enc = _count_calls(monkeypatch, DE, ["_encode_zeros", "_encode_general", "_encode_tail",
                                         "_escape_rounds"])
    dec = _count_calls(monkeypatch, DD, ["_decode_zeros", "_decode_general", "_decode_raw",
                                         "_patch_escapes"])
    x = hot_and_cold(dtype).to(DEV)
    p = _roundtrip(x)
    table, _ = F.read_table(p, F.parse_header(p))
    assert table.mode.tolist()[:9] == [1] * 7 + [0, 1], table.mode
    tail_coded = int(table.mode[9]) == F.MODE_CODED
    zf = (table.flags & (F.FLAG_ZPOS | F.FLAG_ZNEG)).tolist()
    assert zf[:7] == [0, 0, 0, 0, 0, F.FLAG_ZNEG, 0], zf
    assert table.n_zero.tolist()[:7] == [0, 0, 0, 1, 0, 300, 0], table.n_zero
    n_esc = table.n_esc.tolist()
    assert n_esc[1] >= 3 * _specials(dtype, zeros=False).numel() and n_esc[2] >= 32 + 31 + 11
    low16 = ((table.flags & F.FLAG_LOW16) != 0).tolist()
    assert low16[6] == (dtype == torch.float32)
    if not HAS_CUDA:
        assert enc == {"_encode_zeros": 3, "_encode_tail": 1, "_escape_rounds": 8}, enc
        want = {"_decode_zeros": 2, "_decode_raw": 1 if tail_coded else 2, "_patch_escapes": 6}
        if tail_coded:
            want["_decode_general"] = 1
        assert dec == want, dec


def _tier_digit_at(p, h, table, starts, c, tier, k):
    """(byte index, bit shift) of digit k of chunk c's tier ``tier`` (3 or 4:
    the 2-bit tiers) in the payload."""
    n_open = table.n_open[c].tolist()
    b = (2 * C + 7) >> 3
    widths = [(n_open[0] + 7) >> 3, (n_open[1] + 7) >> 3, (2 * n_open[2] + 7) >> 3]
    b += sum(widths[:tier - 1])
    return int(starts[c, 0]) + b + (2 * k) // 8, (2 * k) % 8


def test_hot_decode_flags_what_a_hot_chunk_cannot_hold():
    """A hot chunk (n_zero 0, no zero flag) whose codes name +0.0's rank (a
    tier-4 digit 0 or 1 made 2: the tiers' counts unchanged), whose escape
    count is one short of its codes' (the last escape's byte is read from
    the clamped stream), or (fp16) whose escape byte names an exponent past
    the dtype's, sets ERR_COUNTS (ERR_EXPONENT) and none of ERR_TABLE,
    ERR_OFFSETS; the torch reference refuses each payload too."""
    from zipccl_fsdp.triton_kernels import dense_decode as D
    for dtype in (torch.bfloat16, torch.float16):
        x = hot_and_cold(dtype)[:C].clone().to(DEV)
        p = codec_torch.encode(x, "dense")
        h = F.parse_header(p)
        table, offsets = F.read_table(p, h)
        starts = F.stream_starts(h, table, offsets)
        assert table.mode.tolist() == [1] and int(table.n_zero[0]) == 0
        assert int(table.flags[0]) & (F.FLAG_ZPOS | F.FLAG_ZNEG) == 0
        cases = []
        for k in range(int(table.n_open[0, 3])):
            at, sh = _tier_digit_at(p, h, table, starts, 0, 4, k)
            if (int(p[at]) >> sh) & 3 < 2:
                q = p.clone()
                q[at] = (int(q[at]) & ~(3 << sh)) | (2 << sh)
                cases.append(("zero rank", q, D.ERR_COUNTS.value))
                break
        nesc = int(table.n_esc[0])
        assert nesc % 16 != 1, nesc  # one escape byte fewer keeps the padded esc
        q = p.clone()
        q[h.table_offset + 6], q[h.table_offset + 7] = (nesc - 1) & 0xFF, (nesc - 1) >> 8
        cases.append(("escapes", q, D.ERR_COUNTS.value))
        if dtype == torch.float16:
            q = p.clone()
            q[int(starts[0, 3])] = 0x40
            cases.append(("escape byte", q, D.ERR_EXPONENT.value))
        assert len(cases) == 2 + (dtype == torch.float16)
        for name, q, bit in cases:
            _torch_raises(q)
            _, err = decode(q)
            assert err & bit, (dtype, name, err)
            assert not err & (D.ERR_TABLE.value | D.ERR_OFFSETS.value), (dtype, name, err)
        y, err = decode(p)
        assert err == 0 and torch.equal(bits(y), bits(x))
