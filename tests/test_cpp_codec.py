"""The C++ backend against the torch reference: the same payload bytes, the
same decoded bits, the same refusals, on every kernel set this CPU runs.

The extension is a supported path wherever a C++ compiler is installed, so
these tests fail (they do not skip) when it does not build. Set
ZIPCCL_FSDP_NO_CPP=1 to skip them on a platform without a compiler.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings, strategies as st

import zipccl_fsdp as z
from zipccl_fsdp import backends, codec, codec_cpp, codec_torch
from zipccl_fsdp import format as F
from codec_cases import CASES, DTYPES, INT_VIEW, SIZES, bits, case, from_bits, signed, special_words

CODED = ("fixed3", "dense")

if os.environ.get("ZIPCCL_FSDP_NO_CPP") == "1":
    pytest.skip("ZIPCCL_FSDP_NO_CPP=1", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def built():
    assert codec_cpp.available(), f"the C++ codec did not build: {codec_cpp.unavailable_reason()}"


@pytest.fixture(params=codec_cpp.ISAS)
def isa(request, monkeypatch, built):
    """Run the test once per kernel set (forced through ZIPCCL_FSDP_CPP_ISA)."""
    monkeypatch.setenv("ZIPCCL_FSDP_CPP_ISA", request.param)
    if codec_cpp.isa() != request.param:
        pytest.skip(f"this CPU does not run the {request.param} kernels")
    return request.param


def cpp_decode(p: torch.Tensor) -> torch.Tensor:
    return z.decode(p, backend="cpp")


def assert_same_as_torch(x: torch.Tensor, codec_name: str, what="",
                         verify: bool = False) -> torch.Tensor:
    """cpp payload == torch payload; each backend decodes it to x's bits. With
    verify, the torch payload's checksums come from codec.chunk_sums (torch ops)
    and the cpp one's from C++."""
    ref = z.encode(x, codec=codec_name, backend="torch", verify=verify)
    got = z.encode(x, codec=codec_name, backend="cpp", verify=verify)
    assert got.dtype == torch.uint8 and got.dim() == 1
    assert torch.equal(got, ref), f"payload bytes differ {what}"
    assert bool(F.parse_header(got).flags & F.HEADER_FLAG_CHECKSUM) == verify
    y = cpp_decode(ref)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert torch.equal(bits(y), bits(x)), f"cpp decode of the torch payload {what}"
    return got


# --------------------------------------------------------------------------
# Byte equality with the reference
# --------------------------------------------------------------------------
@pytest.mark.parametrize("verify", [False, True], ids=["plain", "verify"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("codec_name", z.CODECS)
@pytest.mark.parametrize("name", CASES)
def test_payload_bytes_equal_torch(isa, dtype, codec_name, name, verify):
    for n in SIZES + (15, 16, 17, 31, 32, 33):
        x = case(name, n, dtype, seed=n)
        p = assert_same_as_torch(x, codec_name, (name, n), verify)
        y = z.decode(p, backend="torch")
        assert torch.equal(bits(y), bits(x)), ("torch decode of the cpp payload", name, n)


def mixed_large(dtype, n=1_000_003, seed=0) -> torch.Tensor:
    """Gaussian spans of several sigmas, then special words, zeros, random bits."""
    g = torch.Generator().manual_seed(seed)
    sigmas = (1.0, 0.02, 3e-4, 1e-30, 1e30, 1e-3)
    span = n // (len(sigmas) + 2)
    parts = [(torch.randn(span, generator=g) * s) for s in sigmas]
    x = torch.cat(parts).to(dtype)
    itemsize = x.element_size()
    rnd = torch.randint(-(1 << (8 * itemsize - 1)), 1 << (8 * itemsize - 1), (n - x.numel(),),
                        generator=g, dtype=torch.int64).to(INT_VIEW[itemsize]).view(dtype)
    x = torch.cat([x, rnd])
    sp = from_bits(signed(special_words(dtype), itemsize), dtype)
    idx = torch.randint(0, n, (4096,), generator=g)
    x[idx] = sp.repeat(4096 // sp.numel() + 1)[:4096]
    x[n // 3: n // 3 + 9000] = 0  # a zero-heavy stretch
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("codec_name", CODED)
def test_large_mixed_tensor(isa, dtype, codec_name):
    assert_same_as_torch(mixed_large(dtype), codec_name)
    assert_same_as_torch(mixed_large(dtype, n=100_003, seed=5), codec_name, verify=True)


def zero_mix(dtype, mixes, sigma=1.0, seed=0) -> torch.Tensor:
    """One 4096-element chunk per (fraction of +0.0, fraction of -0.0) in
    mixes, then a ragged chunk of the last mix: every combination of the zero
    flags each codec sets (fixed3 flags a sign at 1/64 of the chunk, dense at
    1/32), on either side of each threshold."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for k, (fp, fn) in enumerate(mixes + mixes[-1:]):
        n = F.CHUNK_ELEMS if k < len(mixes) else 1000 + 37
        x = (torch.randn(n, generator=g) * sigma).to(dtype)
        u = torch.rand(n, generator=g)
        x[u < fp] = 0.0
        x[(u >= fp) & (u < fp + fn)] = -0.0
        parts.append(x)
    return torch.cat(parts)


ZERO_MIXES = [(0, 0), (0.01, 0.01), (0.02, 0), (0, 0.02), (0.02, 0.02), (0.05, 0.07),
              (0.07, 0.05), (0.1, 0), (0, 0.1), (0.1, 0.1), (0.15, 0.15), (0.02, 0.3),
              (0.3, 0.02), (0.45, 0.45), (0, 0.9), (0.9, 0), (0.5, 0.5)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("codec_name", CODED)
def test_zero_sign_mixes_equal_torch(isa, dtype, codec_name):
    """The SIMD kernels code each zero sign a chunk flags (either, both or
    none) as the reference does; also at tiny sigma, where an unflagged zero's
    exponent 0 falls inside the code window."""
    for sigma in (1.0, 1e-36 if dtype != torch.float16 else 1e-6):
        x = zero_mix(dtype, ZERO_MIXES, sigma)
        p = assert_same_as_torch(x, codec_name, (sigma,))
        flags = F.read_table(p, F.parse_header(p))[0].flags
        if sigma == 1.0:
            both = F.FLAG_ZPOS | F.FLAG_ZNEG
            assert {int(f) & both for f in flags} == {0, F.FLAG_ZPOS, F.FLAG_ZNEG, both}


def test_fp32_bf16_casts_set_low16_and_match(isa):
    x = (torch.randn(100_003) * 0.02).bfloat16().float()
    for c in CODED:
        p = assert_same_as_torch(x, c)
        h = F.parse_header(p)
        table, _ = F.read_table(p, h)
        assert bool(((table.flags & F.FLAG_LOW16) != 0).all())


def test_best_kernel_set_is_what_the_cpu_runs(built, monkeypatch):
    """Where the CPU has AVX-512 BW/VL/VBMI2 the avx512 kernels are picked
    (a failed CPU check would skip every avx512 run of these tests without a
    word); where it lacks them they are not."""
    monkeypatch.delenv("ZIPCCL_FSDP_CPP_ISA", raising=False)
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((set(line.split(":", 1)[1].split()) for line in f
                          if line.startswith("flags")), None)
    except OSError:
        flags = None
    if flags is None or "avx2" not in flags or "bmi2" not in flags:
        pytest.skip("no x86 CPU flags with AVX2 + BMI2 to compare with")
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vbmi2"} <= flags:
        assert codec_cpp.isa() == "avx512"
    else:  # AVX2 where BMI2 is fast (not on AMD before Zen 3, which has no AVX-512)
        assert codec_cpp.isa() != "avx512"


def test_payload_independent_of_thread_count():
    x = mixed_large(torch.bfloat16, n=300_007)
    old = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append([codec_cpp.encode(x, c, verify=v) for c in z.CODECS
                         for v in (False, True)])
        for o in outs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(outs[0], o))
    finally:
        torch.set_num_threads(old)


# --------------------------------------------------------------------------
# Checksums (verify): format.py's definition, computed in C++
# --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chunk_sums_equal_torch(isa, dtype):
    for name in CASES:
        for n in SIZES + (1, 15, 16, 17, 4095, 4096, 2 * 4096 + 31):
            x = case(name, n, dtype, seed=n + 1)
            got, ref = codec_cpp.chunk_sums(x), codec.chunk_sums(x)
            assert got.dtype == ref.dtype == torch.int64 and got.shape == (F.nchunks_for(n),)
            assert torch.equal(got, ref), (name, n)


def test_sum_constants_are_checked_at_load(monkeypatch):
    # The C++ mix carries its own copy of format.py's constants; the load-time
    # comparison must cover them (a library for other constants is refused).
    assert F.SUM_MUL1 in codec_cpp._expected_constants()
    monkeypatch.setattr(F, "SUM_MUL1", F.SUM_MUL1 + 2)
    with pytest.raises(RuntimeError, match="format constants"):
        codec_cpp._build()


def damage_one_element(p: torch.Tensor) -> tuple:
    """A copy of the verified payload p with one sm byte of its middle chunk changed
    (a value changes, the structure does not); and that chunk."""
    h = F.parse_header(p)
    table, offsets = F.read_table(p, h)
    c = h.nchunks // 2
    at = int(F.stream_starts(h, table, offsets)[c, 1]) + 5
    q = p.clone()
    q[at] ^= 0x10
    return q, c


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("codec_name", CODED)
def test_verified_payload_damage_is_caught_like_torch(isa, dtype, codec_name):
    x = case("special", 3 * 4096 + 5, dtype, seed=2)
    p = z.encode(x, codec=codec_name, backend="cpp", verify=True)
    q, c = damage_one_element(p)
    errors = {}
    for backend in ("cpp", "torch"):
        with pytest.raises(z.CorruptPayloadError) as e:
            z.decode(q, backend=backend)
        errors[backend] = (str(e.value), getattr(e.value, "chunk", None))
    assert errors["cpp"] == errors["torch"], errors
    assert errors["cpp"][1] == c and f"checksum mismatch in chunk {c}" in errors["cpp"][0]
    # The sums stream itself damaged: the chunk whose stored sum changed.
    h = F.parse_header(p)
    q = p.clone()
    q[h.sums_offset + 4 * 2 + 3] ^= 0x80
    with pytest.raises(z.CorruptPayloadError, match="checksum mismatch in chunk 2") as e:
        cpp_decode(q)
    assert e.value.chunk == 2


@pytest.mark.parametrize("codec_name", z.CODECS)
def test_verified_payload_any_flipped_bit_is_caught(isa, codec_name):
    x = case("special", 3 * 4096 + 5, torch.bfloat16)
    p = z.encode(x, codec=codec_name, backend="cpp", verify=True)
    assert p.numel() == z.encode(x, codec=codec_name, backend="cpp").numel() + 4 * 4
    assert torch.equal(bits(cpp_decode(p)), bits(x))
    g = torch.Generator().manual_seed(8)
    for pos in torch.randint(0, p.numel() * 8, (60,), generator=g).tolist():
        q = p.clone()
        q[pos // 8] ^= 1 << (pos % 8)
        with pytest.raises(z.CorruptPayloadError):
            cpp_decode(q)


@pytest.mark.parametrize("chunk_elems", [40, 4104])
def test_verified_payload_with_other_chunk_sizes(isa, monkeypatch, chunk_elems):
    # Chunks that are not the checksum's 4096-element runs: C++ sums the decoded
    # tensor in a second pass instead of chunk by chunk.
    for dtype in DTYPES:
        x = mixed_large(dtype, n=3 * 4096 + 77, seed=3)
        with monkeypatch.context() as m:
            m.setattr(F, "CHUNK_ELEMS", chunk_elems)
            plain = codec_torch.encode(x, "dense")
        p = codec._add_checksums(plain, x)
        assert F.parse_header(p).chunk_elems == chunk_elems
        assert torch.equal(bits(cpp_decode(p)), bits(x)), dtype
        q = p.clone()
        q[-1] ^= 1
        with pytest.raises(z.CorruptPayloadError, match="checksum mismatch in chunk 3"):
            cpp_decode(q)


# --------------------------------------------------------------------------
# Decoding what the encoder never writes but the format allows
# --------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_elems", [8, 40, 96, 4104, 65528])
def test_decodes_other_chunk_sizes(isa, monkeypatch, chunk_elems):
    monkeypatch.setattr(F, "CHUNK_ELEMS", chunk_elems)
    for dtype in DTYPES:
        n = 50 * chunk_elems + 5 if chunk_elems < 1000 else chunk_elems + 4469
        x = mixed_large(dtype, n=n, seed=1)
        for c in CODED:
            p = codec_torch.encode(x, c)
            assert F.parse_header(p).chunk_elems == chunk_elems
            assert torch.equal(bits(cpp_decode(p)), bits(x)), (dtype, c)


def test_shapes_out_and_auto_dispatch():
    x = torch.randn(3, 5, 7).bfloat16()
    p = z.encode(x, codec="dense", backend="cpp")
    assert torch.equal(p, z.encode(x, codec="dense", backend="torch"))
    assert torch.equal(p, z.encode(x, codec="dense"))  # auto picks cpp on CPU
    assert backends.module("auto", torch.device("cpu"), torch.bfloat16, "dense") is codec_cpp
    y = cpp_decode(p)
    assert y.shape == (3, 5, 7) and torch.equal(bits(y), bits(x))
    out = torch.empty(105, dtype=torch.bfloat16)
    assert z.decode(p, out=out, backend="cpp") is out and torch.equal(bits(out), bits(x))
    scalar = torch.tensor(-2.5, dtype=torch.float16)
    for c in z.CODECS:
        q = z.encode(scalar, codec=c, backend="cpp")
        assert torch.equal(q, z.encode(scalar, codec=c, backend="torch"))
        assert cpp_decode(q).shape == () and torch.equal(bits(cpp_decode(q)), bits(scalar))


# --------------------------------------------------------------------------
# Corrupt payloads: refused exactly when the reference refuses
# --------------------------------------------------------------------------
def decode_outcome(p: torch.Tensor, backend: str):
    try:
        return "ok", bits(z.decode(p, backend=backend))
    except z.CorruptPayloadError:
        return "corrupt", None


def assert_same_outcome(p: torch.Tensor, what=""):
    got, ref = decode_outcome(p, "cpp"), decode_outcome(p, "torch")
    assert got[0] == ref[0], (what, got[0], ref[0])
    if got[0] == "ok":
        assert torch.equal(got[1], ref[1]), what
    return got[0]


def payloads():
    for dtype in DTYPES:
        for c in CODED:
            for name in ("gauss", "special", "zero_heavy"):
                yield (dtype, c, name), codec_cpp.encode(case(name, 4096 + 77, dtype, seed=3), c)


def test_truncated_payloads_are_refused(isa):
    for what, p in payloads():
        h = F.parse_header(p)
        cuts = {0, 10, 63, h.table_offset, h.body_offset, h.body_offset + 1,
                p.numel() // 2, p.numel() - 1}
        for cut in sorted(cuts):
            with pytest.raises(z.CorruptPayloadError):
                cpp_decode(p[:cut].clone())


def test_flipped_table_bytes_match_the_reference(isa):
    g = torch.Generator().manual_seed(0)
    refused = 0
    for what, p in payloads():
        h = F.parse_header(p)
        for _ in range(12):
            q = p.clone()
            i = int(torch.randint(h.table_offset, h.body_offset, (1,), generator=g))
            q[i] ^= 1 << int(torch.randint(0, 8, (1,), generator=g))
            refused += assert_same_outcome(q, (what, i)) == "corrupt"
    assert refused > 0


def test_random_bytes_after_a_valid_header_match_the_reference(isa):
    g = torch.Generator().manual_seed(1)
    for what, p in payloads():
        h = F.parse_header(p)
        for k in range(6):
            q = p.clone()
            start = h.table_offset if k % 2 == 0 else h.body_offset
            q[start:] = torch.randint(0, 256, (q.numel() - start,), generator=g, dtype=torch.uint8)
            assert_same_outcome(q, (what, k))


def test_flipped_stream_bytes_match_the_reference(isa):
    g = torch.Generator().manual_seed(2)
    for what, p in payloads():
        h = F.parse_header(p)
        for _ in range(4):
            q = p.clone()
            idx = torch.randint(h.body_offset, q.numel(), (3,), generator=g)
            q[idx] ^= torch.randint(1, 256, (3,), generator=g, dtype=torch.uint8)
            assert_same_outcome(q, what)


def refusal(p: torch.Tensor, backend: str) -> str:
    with pytest.raises(z.CorruptPayloadError) as e:
        z.decode(p, backend=backend)
    return str(e.value)


def test_offset_and_body_length_faults_are_refused_like_the_reference(isa):
    # Each chunk checks its own offset against the next one's (the last: the
    # body length): every way the prefix-sum rule can break must still be
    # refused, with the reference's message. The inserted bytes are zero, so
    # only the offsets or the body length are wrong.
    zeros = torch.zeros(16, dtype=torch.uint8)
    for dtype in DTYPES:
        for c in CODED:
            x = case("gauss", 3 * F.CHUNK_ELEMS + 77, dtype, seed=5)
            p = codec_cpp.encode(x, c)
            h = F.parse_header(p)
            table, off = F.read_table(p, h)
            body = p[h.body_offset:h.body_offset + h.body_nbytes]

            def build(offsets, new_body):
                h2 = F.Header(h.codec, h.dtype, h.shape, h.numel, h.chunk_elems, h.nchunks,
                              new_body.numel())
                return torch.cat([torch.frombuffer(bytearray(h2.pack()), dtype=torch.uint8),
                                  table.to_bytes(), F.offsets_to_bytes(offsets),
                                  p[h.offsets_offset + 4 * h.nchunks:h.body_offset], new_body])

            assert torch.equal(bits(cpp_decode(build(off, body))), bits(x))  # the builder is exact
            at2 = 16 * int(off[2])
            cases = {
                "first offset not 0": build(off + 1, torch.cat([zeros, body])),
                "body longer than the segments": build(off, torch.cat([body, zeros])),
                "a gap before chunk 2": build(torch.cat([off[:2], off[2:] + 1]),
                                              torch.cat([body[:at2], zeros, body[at2:]])),
                "last offset inside chunk 2": build(torch.cat([off[:-1], off[-1:] - 1]), body),
                "body shorter than the segments": build(off, body[:-16]),
            }
            for what, q in cases.items():
                assert refusal(q, "cpp") == refusal(q, "torch"), (dtype, c, what)


def test_table_checks_match_validate_table():
    # codec_cpp checks the table in C++ (format.py's torch ops are slow for a
    # hot path); it must refuse exactly the entries validate_table refuses,
    # with the reference's message, and decode the rest like the reference.
    g = torch.Generator().manual_seed(4)

    def pick(*choices):
        return choices[int(torch.randint(0, len(choices), (1,), generator=g))]

    def rand(hi):
        return int(torch.randint(0, hi + 1, (1,), generator=g))

    seen = {"refused": 0, "ok": 0}  # ok: the table passes; its chunks may still be refused
    for _ in range(300):
        dtype, codec_name = pick(*DTYPES), pick(*CODED)
        info = F.DTYPES[dtype]
        C = 64
        numel = 1 + rand(3 * C)
        nch = F.nchunks_for(numel, C)
        n = F.chunk_lengths(numel, nch, C, "cpu")
        rows = []
        for c in range(nch):
            nc = int(n[c])
            if rand(9) == 0:  # anything the 16 bytes can say
                rows.append([pick(0, 1, 2), pick(0, 1, 2, 3, 4, 8, 9, 12),
                             pick(0, info.emax, rand(255)),
                             pick(0, 3, rand(255)), rand(70), rand(70)] + [rand(70) for _ in range(4)])
            elif rand(4) == 0:
                rows.append([0] * 10)  # RAW
            else:  # an entry an encoder could write, with counts the codes may contradict
                zflags = pick(0, F.FLAG_ZPOS, F.FLAG_ZNEG, F.FLAG_ZPOS | F.FLAG_ZNEG)
                low16 = F.FLAG_LOW16 if dtype == torch.float32 and rand(1) else 0
                if dtype == torch.float32 and not low16 and rand(1):
                    low16 = F.FLAG_LOWBYTE  # (its bitmap zeroed below, or not)
                chain = sorted((rand(nc) for _ in range(5)), reverse=True)
                opens, n_esc = (chain[:4], chain[4]) if codec_name == "dense" else ([0] * 4, rand(nc))
                n_zero = rand(nc) if (zflags or codec_name == "dense") else 0
                rows.append([1, low16 | zflags, rand(info.emax), rand(3), n_zero, n_esc] + opens)
        t = torch.tensor(rows, dtype=torch.int64)
        table = F.ChunkTable(t[:, 0], t[:, 1], t[:, 2], t[:, 3], t[:, 4], t[:, 5], t[:, 6:])
        starts, seg = F.segment_layout(codec_name, info, n, table)
        seg = seg.clamp(min=0)
        lens = F.segment_nbytes(codec_name, info, n, table)
        h = F.Header(codec_name, dtype, (numel,), numel, C, nch, int(seg.sum()))
        body = torch.randint(0, 256, (int(seg.sum()),), generator=g, dtype=torch.uint8)
        offsets = F.segment_offsets(seg)
        for c in range(nch):  # zero padding: this test is about the table
            for k in range(5):
                ln = int(lens[k][c])
                if ln >= 0:
                    at = 16 * int(offsets[c]) + int(starts[c, k])
                    body[at + ln:at + F.align16(ln)] = 0
                    if k == 2 and dtype == torch.float32 and rand(2):
                        body[at:at + ln] = 0  # a LOWBYTE bitmap without bits: low is empty
        gap = torch.zeros(h.body_offset - h.offsets_offset - 4 * nch, dtype=torch.uint8)
        p = torch.cat([torch.frombuffer(bytearray(h.pack()), dtype=torch.uint8), table.to_bytes(),
                       F.offsets_to_bytes(offsets), gap, body])
        try:
            z.decode(p, backend="torch")
        except z.CorruptPayloadError as e:
            if "table entry" in str(e) or "body of" in str(e):
                with pytest.raises(z.CorruptPayloadError) as got:
                    cpp_decode(p)
                assert str(got.value) == str(e)
                seen["refused"] += 1
                continue
        seen["ok"] += 1
        assert_same_outcome(p, rows)
    assert min(seen.values()) > 30, seen


def test_inconsistent_counts_are_refused(isa):
    # A table that passes validate_table and adds up, but whose escape count
    # disagrees with the codes: the chunk decoder must notice.
    x = torch.randn(4096).bfloat16()
    x[:7] = torch.tensor(1e30)  # escapes in fixed3
    p = codec_cpp.encode(x, "fixed3")
    h = F.parse_header(p)
    t, _ = F.read_table(p, h)
    n_esc = int(t.n_esc[0])
    assert n_esc >= 7
    at = int(F.stream_starts(h, t, torch.zeros(1, dtype=torch.int64))[0, 3])
    for delta in (-1, 1, 16):  # 16: the padded esc part grows
        t2 = F.ChunkTable(t.mode, t.flags, t.base, t.phase, t.n_zero, t.n_esc + delta, t.n_open)
        esc = p[at:at + n_esc]
        esc = esc[:n_esc + delta] if delta < 0 else torch.cat([esc, esc[-1:].repeat(delta)])
        esc = torch.cat([esc, torch.zeros(F.align16(esc.numel()) - esc.numel(), dtype=torch.uint8)])
        body = torch.cat([p[h.body_offset:at], esc])
        h2 = F.Header(h.codec, h.dtype, h.shape, h.numel, h.chunk_elems, h.nchunks, body.numel())
        q = torch.cat([torch.frombuffer(bytearray(h2.pack()), dtype=torch.uint8), t2.to_bytes(),
                       p[h.offsets_offset:h.body_offset], body])
        assert assert_same_outcome(q, delta) == "corrupt"


# --------------------------------------------------------------------------
# Property tests
# --------------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(st.sampled_from(DTYPES), st.sampled_from(z.CODECS),
       st.lists(st.integers(0, (1 << 32) - 1), min_size=0, max_size=200),
       st.integers(0, 3), st.sampled_from(codec_cpp.ISAS), st.booleans())
def test_hypothesis_bytes_equal_torch(dtype, codec_name, words, mode, isa_name, verify):
    itemsize = torch.empty(0, dtype=dtype).element_size()
    mask = (1 << (8 * itemsize)) - 1
    w = [v & mask for v in words]
    if mode == 1:  # mostly +0.0
        w = [v if i % 5 == 0 else 0 for i, v in enumerate(w)]
    if mode == 2:  # a narrow exponent band
        w = [(v & (mask >> 4)) | (0x3F80 if itemsize == 2 else 0x3F800000) for v in w]
    if mode == 3:  # long enough for the 32-element SIMD blocks, with a tail
        w = (w * 11)[: 4096 + 45]
    lim = 1 << (8 * itemsize)
    x = torch.tensor([v - lim if v >= lim // 2 else v for v in w],
                     dtype=torch.int64).to(INT_VIEW[itemsize]).view(dtype)
    old = os.environ.get("ZIPCCL_FSDP_CPP_ISA")
    os.environ["ZIPCCL_FSDP_CPP_ISA"] = isa_name
    try:
        assert_same_as_torch(x, codec_name, verify=verify)
    finally:
        if old is None:
            del os.environ["ZIPCCL_FSDP_CPP_ISA"]
        else:
            os.environ["ZIPCCL_FSDP_CPP_ISA"] = old


# --------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------
def run_python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=600)


def test_failed_build_falls_back_to_torch(tmp_path):
    r = run_python("""
        import logging, torch
        logging.basicConfig(level=logging.DEBUG)
        import zipccl_fsdp as z
        from zipccl_fsdp import backends, codec_cpp, codec_torch
        assert not codec_cpp.available()
        assert codec_cpp.unavailable_reason()
        assert backends.module("auto", torch.device("cpu"), torch.bfloat16) is codec_torch
        x = torch.randn(100).bfloat16()
        assert torch.equal(z.decode(z.encode(x)).view(torch.int16), x.view(torch.int16))
        try:
            z.encode(x, backend="cpp")
        except RuntimeError as e:
            assert "unavailable" in str(e)
        else:
            raise AssertionError("backend='cpp' should raise")
        print("FELL BACK")
    """, {"CXX": str(tmp_path / "no-such-compiler"), "ZIPCCL_FSDP_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "FELL BACK" in r.stdout
    assert r.stderr.count("zipccl C++ codec unavailable") == 1  # logged once, at debug


@pytest.mark.slow
def test_concurrent_first_builds_share_one_cache(tmp_path):
    code = """
        import torch
        from zipccl_fsdp import codec_cpp
        assert codec_cpp.available(), codec_cpp.unavailable_reason()
        x = torch.randn(10000, generator=torch.Generator().manual_seed(0)).bfloat16()
        print(codec_cpp.encode(x, "dense").sum().item())
    """
    env = {**os.environ, "ZIPCCL_FSDP_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert len({o[0] for o in outs}) == 1
    assert len(list(tmp_path.glob("cpp-*/*.so"))) == 1


@pytest.mark.parametrize("codec_name", ["fixed3", "dense"])
def test_structural_errors_name_their_chunk(codec_name):
    """A code that decodes outside the dtype is refused with the chunk it is in,
    in the message and as ``.chunk`` (which protocol.decode_from reports)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3 * 4096 + 17, generator=g).half()
    x[-40:-30] = float("inf")  # escapes (e = emax is outside every window)
    p = z.encode(x, codec=codec_name, backend="cpp")
    h = F.parse_header(p)
    table, offsets = F.read_table(p, h)
    c = int(table.n_esc.nonzero().max())
    # the chunk's last escape byte: an exponent no fp16 has
    p[int(F.stream_starts(h, table, offsets)[c, 3]) + int(table.n_esc[c]) - 1] = 200
    with pytest.raises(z.CorruptPayloadError, match="outside the dtype") as e:
        z.decode(p, backend="cpp")
    with pytest.raises(z.CorruptPayloadError, match="outside the dtype") as want:
        z.decode(p, backend="torch")
    assert str(want.value) in str(e.value)  # the same refusal; cpp also names the chunk
    last_with_escapes = int(table.n_esc.nonzero().max())
    assert e.value.chunk == last_with_escapes, (e.value.chunk, table.n_esc.tolist())
    assert str(e.value).endswith(f"(chunk {last_with_escapes})")
