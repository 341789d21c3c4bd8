"""The triton backend against the torch reference: byte-identical payloads,
cross decoding both ways, other chunk sizes, corrupt payloads.

Without CUDA the kernels run on CPU tensors under the Triton interpreter.
Triton reads TRITON_INTERPRET when ``@triton.jit`` decorates a function,
its own library's included, so conftest.py sets it before any test module
imports triton. With CUDA the same tests run compiled on the GPU instead,
and the CPU case is skipped. The interpreter is slow (a dense chunk takes
~2 s), so the inputs pack their special cases into few chunks.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from zipccl_fsdp.triton_kernels import available

if not available():
    pytest.skip("triton is not installed", allow_module_level=True)

import zipccl_fsdp as z  # noqa: E402
from zipccl_fsdp import format as F  # noqa: E402
from codec_cases import INT_VIEW, bits, case, from_bits, signed, special_words  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


def _interpreted() -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    from zipccl_fsdp.triton_kernels import fixed3_encode
    return isinstance(fixed3_encode.fixed3_encode_kernel, InterpretedFunction)


DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        HAS_CUDA or not _interpreted(),
        reason="CPU tensors need the interpreter, which this file uses only without CUDA")),
    pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")),
]
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CODED = ("fixed3", "dense")
C = F.CHUNK_ELEMS


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _specials(dtype):
    size = torch.empty(0, dtype=dtype).element_size()
    return from_bits(signed(special_words(dtype), size), dtype)


def mixed(n: int, dtype, seed: int = 0) -> torch.Tensor:
    """n elements whose chunks exercise different paths of the format.

    Tiny sizes: special values (NaNs with several payloads, +-inf, +-0,
    subnormals, max finite). 4097: a chunk of large bf16-cast values (fp32
    LOW16; the exponent window clamped at the top) and a 1-element chunk.
    3 chunks + 5: Gaussian with the special values sprinkled in; random bit
    patterns (a RAW chunk); 60% exact zeros (ZERO_SLOT / ZERO_FIRST, omitted
    zeros, fp16 rem compaction); 5 subnormals (the window clamped at 0).
    """
    g = _gen(seed)
    size = torch.empty(0, dtype=dtype).element_size()
    sp = _specials(dtype)
    if n <= 16:
        return sp.repeat(2)[:n].clone()
    big = torch.finfo(dtype).max / 8
    if n <= C + 1:
        x = (torch.randn(n, generator=g) * big).bfloat16().to(dtype)
        x[:4] = torch.tensor([0.0, -0.0, float("inf"), float("-inf")]).to(dtype)
        return x
    x = torch.randn(n, generator=g).to(dtype)
    idx = torch.randint(0, C, (3 * sp.numel(),), generator=g)
    x[idx] = sp.repeat(3)
    lim = 1 << (8 * size - 1)
    x[C:2 * C] = torch.randint(-lim, lim, (C,), generator=g).to(INT_VIEW[size]).view(dtype)
    zero_heavy = x[2 * C:3 * C]
    zero_heavy[torch.rand(C, generator=g) < 0.6] = 0
    x[3 * C:] = (torch.randn(n - 3 * C, generator=g, dtype=torch.float64)
                 * torch.finfo(dtype).tiny).to(dtype)
    return x


SIZES = (0, 1, 7, C + 1, 3 * C + 5)


def _check_against_torch(x: torch.Tensor, codec: str) -> None:
    pt = z.encode(x, codec=codec, backend="torch")
    pg = z.encode(x, codec=codec, backend="triton")
    assert pg.dtype == torch.uint8 and pg.dim() == 1 and pg.device == x.device
    assert pg.numel() == pt.numel(), (pg.numel(), pt.numel())
    assert torch.equal(pg, pt), f"first differing byte {int((pg != pt).nonzero()[0, 0])}"
    # Cross decode, compared as integer views (NaN payloads, -0.0).
    yg = z.decode(pt, backend="triton")
    assert yg.shape == x.shape and yg.dtype == x.dtype
    assert torch.equal(bits(yg), bits(x))
    out = torch.empty_like(x)
    assert z.decode(pg, out=out, backend="torch") is out
    assert torch.equal(bits(out), bits(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", z.CODECS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_payload_bytes_equal_torch_backend(device, dtype, codec):
    for n in SIZES:
        x = mixed(n, dtype, seed=n).to(device)
        if n == 3 * C + 5:
            x = x.view(1, n)  # a 2-D shape in the header
        _check_against_torch(x, codec)


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_bf16_casts_and_zeros(device):
    """LOW16 with Gaussian magnitudes, and an all-zero chunk."""
    x = torch.randn(2 * C, generator=_gen(3)).bfloat16().float()
    x[C:] = 0
    for codec in CODED:
        _check_against_torch(x.to(device), codec)


def _fixed3_paths(payload: torch.Tensor) -> tuple:
    """Which branches the fixed3 kernels take for the payload's chunks (the
    conditions in fixed3_encode_kernel and fixed3_decode_chunk): counts of
    (coded, no zero omitted, one sm byte an element: sm at element order;
    coded with zeros omitted: sm at kept rank; coded fp32 with 3 sm bytes;
    raw)."""
    h = F.parse_header(payload)
    table, offsets = F.read_table(payload, h)
    coded = table.mode == F.MODE_CODED
    one_byte = (table.flags & F.FLAG_LOW16) != 0 if h.dtype == torch.float32 else coded
    omitted = table.n_zero > 0
    return (int((coded & one_byte & ~omitted).sum()), int((coded & omitted).sum()),
            int((coded & ~one_byte).sum()), int((~coded).sum()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fixed3_branches_and_aligned_segments(device, dtype):
    """A Gaussian chunk (sm in element order); one with +0.0 omitted and an
    odd count kept, one with -0.0 omitted (sm at kept rank; fp16 rem by
    atomics); random bits (raw); fp32 also without LOW16 (3 sm bytes). Each
    branch occurs, every chunk's sub-streams start 16-byte aligned
    (format.hot_path_chunks), and the payload decodes from an odd address."""
    g = _gen(21)
    x = torch.randn(5 * C + 64, generator=g)
    if dtype == torch.float32:
        x[:3 * C] = x[:3 * C].bfloat16().float()  # LOW16: one sm byte per element
    x = x.to(dtype)
    x[C + 3:2 * C] = 0  # 3 kept: an odd sm segment
    neg = x[2 * C:3 * C]
    neg[torch.rand(C, generator=g) < 0.3] = -0.0
    size = x.element_size()
    lim = 1 << (8 * size - 1)
    x[3 * C:4 * C] = torch.randint(-lim, lim, (C,), generator=g).to(INT_VIEW[size]).view(dtype)
    x = x.to(device)
    _check_against_torch(x, "fixed3")
    p = z.encode(x, codec="fixed3", backend="torch")
    paths = _fixed3_paths(p)
    want = (1, 1, 0 if dtype != torch.float32 else 1, 1)
    assert all(got >= w for got, w in zip(paths, want)) and paths[1] >= 2, paths
    h = F.parse_header(p)
    table, offsets = F.read_table(p, h)
    assert bool(F.hot_path_chunks(h, table, offsets).all())
    buf = torch.zeros(p.numel() + 1, dtype=torch.uint8, device=device)
    buf[1:] = p
    assert torch.equal(bits(z.decode(buf[1:], backend="triton")), bits(x))
    out = torch.empty_like(x)
    z.decode(buf[1:], out=out, backend="triton")
    assert torch.equal(bits(out), bits(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fixed3_ragged_tails(device, dtype):
    """The fixed3 kernels store and load the codes, sm and rem streams as
    whole 32-bit words over each padded sub-stream: ragged last chunks of
    several lengths (numel 262244 = 64 chunks + 100, at small scale), with
    and without omitted zeros of both signs, fp32 with and without LOW16,
    specials sprinkled in, runs of escapes. Byte-identical to torch (padding included) and
    decoded bit for bit."""
    g = _gen(41)
    sp = _specials(dtype)
    for tail in (1, 3, 100, 2051, C - 1):
        x = torch.randn(C + tail, generator=g)
        if dtype == torch.float32 and tail % 2:
            x = x.bfloat16().float()  # LOW16 chunks
        x = x.to(dtype)
        if tail in (3, 2051):  # both signed zeros, flagged in the tail chunk
            x = x * (torch.rand(x.numel(), generator=g) > 0.25).to(dtype)
        x[torch.randint(0, x.numel(), (sp.numel(),), generator=g)] = sp
        # Escape runs: threads whose elements all escape (the escape loops'
        # longest runs), across a thread boundary, and in the tail chunk.
        x[5:45] = 1e30
        x[C + tail // 2:C + tail // 2 + 9] = -1e-30
        _check_against_torch(x.to(device), "fixed3")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fixed3_window_at_the_top(device, dtype):
    """Chunks whose normals all sit in the largest finite binade: the
    window is clamped to the top of the exponent range, so the code just
    past it (ESC) stands for EMAX + 1, and the decoder must not let that
    reach the sign. Escapes of both signs below the window, +-inf and NaN
    in it; one chunk plain, one with both zero signs omitted, one with
    +0.0 omitted. Byte-identical to torch, decoded bit for bit."""
    info = F.dtype_info(dtype)
    emax = (1 << info.exp_bits) - 1
    size = info.itemsize
    g = _gen(51)
    n = 3 * C + 7
    sign = torch.randint(0, 2, (n,), generator=g) << (info.man_bits + info.exp_bits)
    man = torch.randint(0, 1 << info.man_bits, (n,), generator=g)
    w = sign | ((emax - 1) << info.man_bits) | man
    lim = 1 << (8 * size)
    w = torch.where(w >= lim // 2, w - lim, w)
    x = w.to(INT_VIEW[size]).view(dtype).clone()
    low = torch.rand(n, generator=g) < 0.05  # escapes below the window, both signs
    x[low] = x[low] * 2.0 ** -8
    x[torch.randint(0, n, (12,), generator=g)] = _specials(dtype)[:12]
    mask = (torch.rand(n, generator=g) > 0.3).to(dtype)
    x[C:2 * C] = x[C:2 * C] * mask[C:2 * C]  # -0.0 where negative, +0.0 elsewhere
    x[2 * C:] = torch.where(mask[2 * C:] != 0, x[2 * C:], torch.zeros((), dtype=dtype))
    p = z.encode(x, codec="fixed3", backend="torch")
    table, _ = F.read_table(p, F.parse_header(p))
    full = slice(0, 3)  # (the 7-element tail chunk is raw)
    assert bool((table.mode[full] == F.MODE_CODED).all()) and bool((table.n_esc[full] > 0).all())
    # base >= EMAX - 2: every window (5 to 7 wide) is clamped to the top.
    assert bool((table.base[full] >= emax - 2).all()), table.base.tolist()
    assert table.flags.tolist()[:3] == [0, F.FLAG_ZPOS | F.FLAG_ZNEG, F.FLAG_ZPOS]
    _check_against_torch(x.to(device), "fixed3")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", CODED)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_signed_zeros_from_a_mask(device, dtype, codec):
    """x * mask: -0.0 wherever x was negative, +0.0 elsewhere (both zero
    flags set), mixed with NaN payloads, +-inf and subnormals; also each
    sign alone. Byte-identical to torch, decoded bit for bit."""
    g = _gen(31)
    x = torch.randn(3 * C + 17, generator=g)
    mask = (torch.rand(x.numel(), generator=g) > 0.3).float()
    x = (x * mask).to(dtype)
    sp = _specials(dtype)
    x[torch.randint(0, x.numel(), (sp.numel(),), generator=g)] = sp
    x[C:2 * C] = x[C:2 * C].abs()  # +0.0 only
    x[2 * C:3 * C] = -x[2 * C:3 * C].abs()  # -0.0 only (and negative NaNs)
    h = F.parse_header(z.encode(x, codec=codec, backend="torch"))
    assert h.nchunks == 4
    _check_against_torch(x.to(device), codec)


@pytest.mark.parametrize("device", DEVICES)
def test_fixed3_zeros_flagged_with_the_window_at_exponent_0(device):
    """bf16 x * mask at magnitudes near the smallest normal, both zero signs
    flagged: the window starts at exponent 0 or 1, below the two zero codes
    (lo < z), so the exponent lo - z + code of the zero path wraps below 0
    before it is cut to its field. Byte-identical to torch, decoded bit for
    bit; every chunk but the tail is coded with both flags."""
    g = _gen(43)
    for scale in (2.0 ** -126, 2.0 ** -124):
        x = torch.randn(2 * C + 9, generator=g) * scale
        x = (x * (torch.rand(x.numel(), generator=g) > 0.3).float()).bfloat16()
        p = z.encode(x, codec="fixed3", backend="torch")
        table, _ = F.read_table(p, F.parse_header(p))
        assert table.mode[:2].tolist() == [F.MODE_CODED] * 2
        assert table.flags[:2].tolist() == [F.FLAG_ZPOS | F.FLAG_ZNEG] * 2
        assert int(table.base[:2].max()) <= 3, table.base
        _check_against_torch(x.to(device), "fixed3")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk_elems, n, zeros", [
    (1000, 2500, True),     # not a power of 2: a masked tile
    (8, 21, True),          # the smallest chunk the header allows
    (65528, 70000, False),  # near the u16 limit
    (10000, 20005, True),
])
def test_other_chunk_sizes(device, chunk_elems, n, zeros, monkeypatch):
    """Both backends read F.CHUNK_ELEMS when encoding; decode takes the
    header's (with out=, the kernel finds it is not the launch's and the
    host launches again with the header's). The dense encoder takes 4096 only
    and says so; the dense decoder takes every chunk size the format allows.
    (The big chunk has no zeros: compacting fp16 rem bits takes the
    interpreter minutes at that size.)"""
    monkeypatch.setattr(F, "CHUNK_ELEMS", chunk_elems)
    x = torch.randn(n, generator=_gen(5)).to(torch.float16)
    if zeros:
        x[::7] = 0
    x[3] = float("nan")
    _check_against_torch(x.to(device), "fixed3")
    assert F.parse_header(z.encode(x, codec="fixed3", backend="torch")).chunk_elems == chunk_elems
    monkeypatch.setattr(F, "CHUNK_ELEMS", 4096)
    out = torch.empty_like(x).to(device)
    p = z.encode(x[:C + 3].to(device), codec="fixed3", backend="torch")
    monkeypatch.setattr(F, "CHUNK_ELEMS", chunk_elems)
    z.decode(p, out=out[:C + 3], backend="triton")  # a 4096 payload, CHUNK_ELEMS patched
    assert torch.equal(bits(out[:C + 3]), bits(x[:C + 3].to(device)))
    if n < 30000:  # the interpreter runs the torch encode of dense slowly
        with pytest.raises(NotImplementedError, match="dense kernels take chunks of 4096"):
            z.encode(x.to(device), codec="dense", backend="triton")
        pd = z.encode(x.to(device), codec="dense", backend="torch")
        yd = torch.empty_like(x).to(device)
        z.decode(pd, out=yd, backend="triton")  # any chunk size the format allows
        assert torch.equal(bits(yd), bits(x.to(device)))


def _exponent_spread(n: int, dtype, g, spread: int, zeros: float) -> torch.Tensor:
    """n words whose exponents are uniform within ``spread`` of a random
    centre (so every dense rank, tier and escape occurs at spread >= 9, and
    a constant exponent at 0), random signs and mantissas, a fraction of
    exact zeros."""
    info = F.dtype_info(dtype)
    emax = (1 << info.exp_bits) - 1
    centre = int(torch.randint(10, emax - 10, (1,), generator=g))
    e = torch.randint(max(0, centre - spread), min(emax, centre + spread) + 1, (n,), generator=g)
    man = torch.randint(0, 1 << info.man_bits, (n,), generator=g)
    sign = torch.randint(0, 2, (n,), generator=g)
    w = (sign << (info.exp_bits + info.man_bits)) | (e << info.man_bits) | man
    lim = 1 << (8 * info.itemsize)
    x = torch.where(w >= lim // 2, w - lim, w).to(INT_VIEW[info.itemsize]).view(dtype)
    x[torch.rand(n, generator=g) < zeros] = 0
    return x


@pytest.mark.parametrize("device", DEVICES)
def test_random_exponent_spreads_agree_with_torch(device, monkeypatch):
    """Random sizes, chunk sizes, dtypes, exponent spreads (one exponent
    to far wider than a chunk's code) and zero fractions, some inputs at an
    odd address: every payload byte-identical to the torch backend's and
    decoded bit for bit (dense at 4096-element chunks, the one size its
    kernels take)."""
    g = _gen(6)
    for case in range(16):
        pick = torch.randint(0, 1 << 20, (6,), generator=g).tolist()
        chunk = (8, 64, 264, 1000, 4096)[pick[0] % 5]
        monkeypatch.setattr(F, "CHUNK_ELEMS", chunk)
        dtype = DTYPES[pick[1] % 3]
        n = 1 + pick[2] % (3 * chunk + 40)
        spread = (0, 3, 5, 9, 14)[pick[3] % 5]
        zeros = (0.0, 0.05, 0.3, 0.9)[pick[4] % 4]
        x = _exponent_spread(n + 1, dtype, g, spread, zeros)
        x = x[1:] if pick[5] % 2 else x[:n]  # odd address, or aligned
        # The dense kernels take 4096-element chunks only (test_other_chunk_sizes).
        for codec in CODED if chunk == 4096 else ("fixed3",):
            _check_against_torch(x.to(device), codec)


def _payload(device, codec, dtype=torch.float16, n=2 * C + 5):
    x = torch.randn(n, generator=_gen(11)).to(dtype)
    x[::5] = 0
    x[10:20] = float("inf")  # escapes (e = emax is outside every window)
    p = z.encode(x.to(device), codec=codec, backend="torch")
    return x, p, F.parse_header(p)


def _entry(h, c, field):
    return h.table_offset + 16 * c + field


def _get_u16(b, at):
    return int(b[at]) | int(b[at + 1]) << 8


def _set_u16(b, at, v):
    b[at], b[at + 1] = v & 0xFF, v >> 8


def _raises_like_torch(b: torch.Tensor, x: torch.Tensor, match: str | None,
                       tuning=None) -> None:
    """torch and triton refuse ``b`` with the same error, decoding with and
    without out= (with out=, triton checks the header on the device);
    ``tuning``: the Triton decode's (codec_decode.Tuning), else its default."""
    with pytest.raises((z.CorruptPayloadError, ValueError), match=match) as want:
        z.decode(b, backend="torch")
    with pytest.raises(type(want.value)) as got:
        _triton_decode(b, torch.empty_like(x).to(b.device), tuning, header=True)
    assert str(got.value) == str(want.value)
    with pytest.raises(type(want.value)) as got:
        _triton_decode(b, torch.empty_like(x).to(b.device), tuning)
    assert str(got.value) == str(want.value)


def _triton_decode(p: torch.Tensor, out: torch.Tensor, tuning=None, header: bool = False):
    """``z.decode(p, out=out, backend="triton")``, or without ``out`` when
    ``header`` (the header read on the host first); with ``tuning``, the
    Triton decoder's entry points at that tuning."""
    if tuning is None:
        return z.decode(p, backend="triton") if header else \
            z.decode(p, out=out, backend="triton")
    from zipccl_fsdp.triton_kernels import codec_decode
    if header:
        return codec_decode.decode(p, F.parse_header(p), out, tuning)
    codec_decode.decode_into(p, out, tuning)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", CODED)
def test_corrupt_payloads_raise(device, codec):
    x, p, h = _payload(device, codec)
    body = h.body_offset
    cases = [
        (lambda b: b.__setitem__(_entry(h, 0, 0), 7), "chunk table entry 0 is invalid"),
        (lambda b: b.__setitem__(_entry(h, 1, 3), 9), "chunk table entry 1 is invalid"),
        (lambda b: _set_u16(b, _entry(h, 0, 6), _get_u16(b, _entry(h, 0, 6)) + 16),
         "disagrees"),  # 16 escapes more: a valid entry whose segment is longer
        (lambda b: b.__setitem__(h.offsets_offset + 4, int(b[h.offsets_offset + 4]) + 1),
         "segment offset of chunk 1"),
        (lambda b: b.__setitem__(slice(body, body + 40), 0xFF), "disagree with"),
        (lambda b: b.__setitem__(-1, 200), "padding"),  # the esc segment's last pad byte
        (lambda b: b.__setitem__(h.offsets_offset + 4 * h.nchunks, 1), "padding after the "),
        (lambda b: b.__setitem__(0, ord("X")), "bad magic"),
        (lambda b: b.__setitem__(4, 1), "format version 1"),
        (lambda b: b.__setitem__(9, int(b[9]) ^ 1), "header checksum"),  # numel
        (lambda b: b.__setitem__(64, int(b[64]) ^ 2), "header checksum"),  # a dim
        (lambda b: b.__setitem__(61, int(b[61]) ^ 0x80), "header checksum"),  # the CRC
    ]
    for mutate, msg in cases:
        b = p.clone()
        mutate(b)
        _raises_like_torch(b, x, msg)
    for cut in (1, 16, p.numel() - 40):  # truncated payloads
        _raises_like_torch(p[:-cut].clone(), x, None)  # any error, the same from both


@pytest.mark.parametrize("device", DEVICES)
def test_out_that_does_not_fit_is_refused(device):
    """decode(out=) with the header checked on the device: a payload of
    another dtype or numel raises the host path's ValueError after the
    launch, and writes nothing outside out."""
    x, p, h = _payload(device, "fixed3")
    for out in (torch.empty(x.numel(), dtype=torch.bfloat16, device=device),
                torch.empty(x.numel() - 1, dtype=x.dtype, device=device),
                torch.empty(x.numel() + 4096, dtype=x.dtype, device=device)):
        with pytest.raises(ValueError, match="payload holds"):
            z.decode(p, out=out, backend="triton")


@pytest.mark.parametrize("device", DEVICES)
def test_decode_out_argument_errors_are_the_torch_backends(device):
    """decode(out=) on the triton backend asks its argument checks as one
    test (codec._decode_device_header) and names what is wrong only when it
    fails: each bad call gets the torch backend's error, word for word (a
    payload that is not 1-D uint8, an out that is not contiguous, an out
    overlapping the payload at its start, inside it and at its end), and
    the good calls beside them decode (an out adjacent to the payload on
    either side)."""
    x, p, h = _payload(device, "fixed3", dtype=torch.bfloat16, n=C + 3)
    nb = 2 * x.numel()  # out's bytes
    buf = torch.zeros(p.numel() + 2 * nb, dtype=torch.uint8, device=device)
    strided = torch.empty(2 * x.numel(), dtype=x.dtype, device=device)[::2]
    bad = [(p.view(1, -1), torch.empty_like(x, device=device)),  # 2-D payload
           (p[:p.numel() // 2 * 2].view(torch.int16), torch.empty_like(x, device=device)),
           (p, strided)]
    for at in (0, 16, p.numel() - 2):  # out's first byte at, from the payload's start
        bad.append((buf[nb - at:nb - at + p.numel()], buf[nb:2 * nb].view(x.dtype)))
    bad.append((buf[nb:nb + p.numel()], buf[2:2 + nb].view(x.dtype)))  # out ends inside it
    for payload, out in bad:
        if payload.dtype == torch.uint8 and payload.dim() == 1:
            payload.copy_(p)
        with pytest.raises((TypeError, ValueError)) as want:
            z.decode(payload, out=out, backend="torch")
        with pytest.raises(type(want.value)) as got:
            z.decode(payload, out=out, backend="triton")
        assert str(got.value) == str(want.value)
    for payload, out in ((buf[nb:nb + p.numel()], buf[:nb].view(x.dtype)),  # out just before
                         (buf[:p.numel()], buf[p.numel():p.numel() + nb].view(x.dtype))):
        payload.copy_(p)
        assert torch.equal(bits(z.decode(payload, out=out, backend="triton")), bits(x.to(device)))


@pytest.mark.parametrize("device", DEVICES)
def test_kept_buffers_start_clean_every_call(device, monkeypatch):
    """Each thread keeps its encode scratch per plan (a ring of launch
    regions: ticket, body length, the header template the kernel writes the
    header from, look-back status words) and its decode error words (a
    ring), across calls: a region or word that still held an earlier call's
    words would take the wrong tickets, offsets or errors, and a template of
    another plan the wrong header. Rings of 2 here, so every ring wraps
    (its one restoring copy or zeroing) several times. Calls alternate
    dtypes, codecs, shapes of 1, 2 and 4 dims and sizes of one chunk count
    and of others, each payload byte-equal to the torch backend's and each
    decode bit-exact; a corrupt payload's error must not reach the next
    decode; two threads encoding at once get their own buffers."""
    import threading
    from zipccl_fsdp.triton_kernels import codec_decode as D
    from zipccl_fsdp.triton_kernels import codec_encode as E
    monkeypatch.setattr(E, "RING", 2)
    monkeypatch.setattr(D, "ERR_RING", 2)
    monkeypatch.setattr(E._TLS, "rings", {}, raising=False)  # rings made at these sizes
    monkeypatch.setattr(D._TLS, "err", {}, raising=False)
    xs = [mixed(3 * C + 5, torch.bfloat16, seed=1).to(device).view(19, 647),
          mixed(3 * C + 5, torch.float32, seed=2).to(device),
          mixed(4 * C, torch.float16, seed=3).to(device).view(2, 8, 32, 32),  # one chunk count
          mixed(C + 1, torch.bfloat16, seed=4).to(device)]
    bad = None
    for rnd in range(3):
        for i, x in enumerate(xs):
            codec = CODED[(i + rnd) % 2]
            want = z.encode(x, codec=codec, backend="torch")
            p = z.encode(x, codec=codec, backend="triton")
            assert torch.equal(p, want), (rnd, i, codec)
            # twice: a plan's ring of 2 wraps at its third call (rounds 0 and 2)
            assert torch.equal(z.encode(x, codec=codec, backend="triton"), want), (rnd, i, codec)
            out = torch.empty_like(x)
            z.decode(p, out=out, backend="triton")
            assert torch.equal(bits(out), bits(x)), (rnd, i, codec)
            if x.dtype == torch.bfloat16 and rnd < 2:
                if bad is None:
                    bad = p.clone()
                    bad[-1] = 0xFF  # a padding byte: the error word gets a bit set
                    bad_x = x
                with pytest.raises(z.CorruptPayloadError):
                    z.decode(bad, out=torch.empty_like(bad_x), backend="triton")
    got, errors = {}, []
    if device == "cpu":
        # The interpreter rebinds triton.language for the kernel it runs, so
        # two interpreted launches at once break each other: one at a time,
        # the rest of the two calls (their buffers, zeroing, reads) still
        # interleaved.
        from triton.runtime.interpreter import GridExecutor
        launch, one = GridExecutor.__call__, threading.Lock()

        def one_launch(self, *args, **kwargs):
            with one:
                return launch(self, *args, **kwargs)
        monkeypatch.setattr(GridExecutor, "__call__", one_launch)

    def run(k):
        try:
            got[k] = z.encode(xs[k], codec="fixed3", backend="triton")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in (0, 2):
        assert torch.equal(got[k], z.encode(xs[k], codec="fixed3", backend="torch")), k


def test_header_template_gives_every_body_length():
    """The encode kernel writes the header from the plan's template
    (_lookback.store_total): the header with a body length of 0, then per
    bit of the length its CRC-32 term. The kernel's formula, mirrored here,
    gives format.HeaderBytes' bytes for lengths of every bit (the
    interpreted tests reach only small ones), for 0 to 16 dims."""
    import random
    import struct
    from zipccl_fsdp.triton_kernels import codec_encode as E
    rng = random.Random(5)
    lengths = [0, 16, 2 ** 40 - 16, 2 ** 44 - 16] + [16 * rng.randrange(2 ** 40) for _ in range(30)]
    for shape in [(), (5,), (3, 4), (2, 3, 4, 5, 6), (1,) * 16]:
        numel = 1
        for d in shape:
            numel *= d
        h = F.Header("dense", torch.float16, shape, numel, C, F.nchunks_for(numel, C), 0)
        words = E._region_words(h)
        assert len(words) == E.STATUS and words[:E.TEMPLATE] == [0, 0]
        n, terms = words[E.NWORDS], words[E.TERMS:E.TERMS + 64]
        for body in lengths:
            w = [v & (2 ** 64 - 1) for v in words[E.TEMPLATE:E.NWORDS]]
            delta = 0
            for i in range(64):
                if body >> i & 1:
                    delta ^= terms[i]
            w[3] = body
            w[7] ^= delta << 32
            got = struct.pack(f"<{len(w)}Q", *w)[:8 * n]
            assert got == bytes(F.HeaderBytes(h).with_body(body)), (shape, body)


@pytest.mark.parametrize("device", DEVICES)
def test_checksummed_payloads(device):
    """verify=True payloads from triton: decode(out=) learns from the
    device word that sums follow and checks them; a changed sm byte that
    decodes to another value is caught by its chunk's sum."""
    x = torch.randn(C + 100, generator=_gen(8)).bfloat16().to(device)
    p = z.encode(x, codec="fixed3", backend="triton", verify=True)
    assert torch.equal(p, z.encode(x, codec="fixed3", backend="torch", verify=True))
    out = torch.empty_like(x)
    z.decode(p, out=out, backend="triton")
    assert torch.equal(bits(out), bits(x))
    h = F.parse_header(p)
    table, offsets = F.read_table(p, h)
    starts = F.stream_starts(h, table, offsets)
    b = p.clone()
    at = int(starts[1, 1])  # chunk 1's first sm byte
    b[at] ^= 1
    with pytest.raises(z.CorruptPayloadError, match="checksum mismatch in chunk 1"):
        z.decode(b, out=out, backend="triton")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", CODED)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_random_corruption_agrees_with_torch(device, codec, dtype):
    """Random byte flips in the table and streams: triton raises exactly when
    torch does, and otherwise decodes the same bits. fp32: the first chunk,
    a fifth of it +0.0 and a seventh -0.0, takes fixed3's fp32 zero path."""
    x, p, h = _payload(device, codec, dtype=dtype, n=C + 300)
    if dtype == torch.float32:
        x[1::7] = -0.0
        p = z.encode(x.to(device), codec=codec, backend="torch")
        h = F.parse_header(p)
        table, _ = F.read_table(p, h)
        assert int(table.flags[0]) & 6 == 6, "both zero signs flagged"
    g = _gen(17)
    for _ in range(12):
        b = p.clone()
        k = int(torch.randint(1, 4, (1,), generator=g))
        at = torch.randint(h.table_offset, p.numel(), (k,), generator=g).to(device)
        b[at] = torch.randint(0, 256, (k,), generator=g, dtype=torch.uint8).to(device)
        out = torch.empty_like(x).to(device)
        try:
            want = z.decode(b, backend="torch")
        except z.CorruptPayloadError:
            with pytest.raises(z.CorruptPayloadError):
                z.decode(b, backend="triton")
            with pytest.raises(z.CorruptPayloadError):
                z.decode(b, out=out, backend="triton")
            continue
        assert torch.equal(bits(z.decode(b, backend="triton")), bits(want))
        assert torch.equal(bits(z.decode(b, out=out, backend="triton")), bits(want))


def test_package_imports_without_triton():
    """CPU-only installs: no triton, the package imports and encodes on CPU."""
    code = textwrap.dedent("""
        import sys
        sys.modules["triton"] = None  # makes "import triton" fail
        import torch, zipccl_fsdp as z
        from zipccl_fsdp.triton_kernels import available
        assert not available()
        x = torch.randn(100).bfloat16()
        p = z.encode(x, backend="torch")
        assert torch.equal(z.decode(p, backend="torch").view(torch.int16), x.view(torch.int16))
        try:
            z.encode(x, backend="triton")
        except ValueError as e:
            assert "needs triton" in str(e)
        else:
            raise AssertionError("backend='triton' without triton must refuse")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                       env={**env, "PYTHONPATH": root})
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("device", DEVICES)
def test_fixed3_low16_with_zeros_omitted(device):
    """fp32 exact bf16 casts times a mask: every chunk LOW16 (one sm byte an
    element) with both signed zeros flagged and omitted, so the encoder's
    zero-omitting sm scatter runs with one byte a kept element (ragged last
    chunk). Byte-identical to torch, decoded bit for bit."""
    g = _gen(53)
    x = torch.randn(2 * C + 37, generator=g).bfloat16().float()
    x = x * (torch.rand(x.numel(), generator=g) > 0.3).float()
    pt = z.encode(x, codec="fixed3", backend="torch")
    h = F.parse_header(pt)
    table, _ = F.read_table(pt, h)
    assert bool(((table.flags & F.FLAG_LOW16) != 0).all())
    assert bool((table.n_zero > 0).all()) and bool(((table.flags & 6) == 6).all())
    _check_against_torch(x.to(device), "fixed3")


def _goes_general(x: torch.Tensor, payload: torch.Tensor) -> list:
    """Which chunks the fixed3 kernels hand to fixed3_general (the
    conditions in fixed3_encode.py and fixed3_decode.py), by chunk:
    (encode, decode). Encode: a chunk with so many exponent fields of 0
    that a zero sign could be flagged (at least 1/64 of the chunk), or one
    stored RAW. Decode: a chunk with a flagged zero (RAW chunks decode
    apart)."""
    info = F.dtype_info(x.dtype)
    emax = (1 << info.exp_bits) - 1
    w = bits(x).to(torch.int64) & ((1 << (8 * info.itemsize)) - 1)
    table, _ = F.read_table(payload, F.parse_header(payload))
    out = []
    for c in range(F.nchunks_for(x.numel())):
        e = (w[c * C:(c + 1) * C] >> info.man_bits) & emax
        coded = int(table.mode[c]) == F.MODE_CODED
        many0 = int((e == 0).sum()) << F.FIXED_ZERO_SLOT_SHIFT >= e.numel()
        out.append((many0 or not coded, coded and int(table.flags[c]) & 6 != 0))
    return out


@pytest.mark.parametrize("device", [p for p in DEVICES if p.values[0] == "cpu"])
@pytest.mark.parametrize("enc_warps, dec_warps", [(2, 4), (4, 2)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fixed3_hot_and_general_chunks(device, dtype, enc_warps, dec_warps, decode_plans,
                                       monkeypatch):
    """Each chunk takes the path its data asks for, and every path writes
    and reads the torch backend's bytes. Hot (too few exponent fields of 0
    for a zero sign to be flagged): Gaussian, fp32 with and without LOW16,
    a thread with escapes of distinct exponents in the upper half of its
    elements, a thread whose elements all escape (the escape loop's longest
    run), a lone +0.0, a NaN and an infinity, a subnormal, 63 zeros of both
    signs (one short of a flag), a ragged tail. General (fixed3_general):
    both zero signs flagged, +0.0 flagged with three -0.0 kept, 64
    subnormals (no zero to flag, but too many exponents 0 to know without
    counting the signs), random bits (RAW), fp32 LOW16 with zeros; decode's
    zero paths take all of these but the RAW chunk, and for bf16 and fp32
    encode's those with flagged zeros. At 64 elements a thread
    (64-bit escape masks) and 32, for encode and decode. The general
    functions and the encode zero path are counted through their calls
    under the interpreter."""
    from zipccl_fsdp.triton_kernels import codec_encode, fixed3_decode, fixed3_encode
    tuning = decode_plans.Tuning(warps=dec_warps, fixed3_warps_16=dec_warps,
                                 fixed3_warps_32=dec_warps)
    calls = {"encode": 0, "encode_zero": 0, "decode": 0}

    def counted(name, fn):
        def call(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return call
    monkeypatch.setattr(fixed3_encode, "encode_chunk_general",
                        counted("encode", fixed3_encode.encode_chunk_general))
    monkeypatch.setattr(fixed3_encode, "encode_cold_chunk_general",
                        counted("encode", fixed3_encode.encode_cold_chunk_general))
    for name in ("_encode_zero_pairs", "_encode_zero_words"):
        monkeypatch.setattr(fixed3_encode, name,
                            counted("encode_zero", getattr(fixed3_encode, name)))
    monkeypatch.setattr(fixed3_decode, "decode_chunk_general",
                        counted("decode", fixed3_decode.decode_chunk_general))
    monkeypatch.setattr(fixed3_decode, "decode_zero_chunk_general",
                        counted("decode", fixed3_decode.decode_zero_chunk_general))
    g = _gen(61)
    chunks = 11
    x = torch.randn(chunks * C + 1000, generator=g)
    if dtype == torch.float32:
        x[:C] = x[:C].bfloat16().float()  # LOW16, hot
    x = x.to(dtype)
    if dtype == torch.float16:  # Gaussian fp16 has subnormals: none but those placed below
        x[x.abs() < 2 ** -14] = 1.0
    far = [2.0 ** k for k in (10, -10, 12, -12, 14, -14)]
    for k, at in enumerate(range(64 + 33, 64 + 63, 5)):  # upper half of element 64's thread
        x[at] = far[k % len(far)] * (1 + k / 64)
    x[C + 3 * 64:C + 4 * 64] = -2.0 ** 13  # a whole thread of escapes (64 or 2 x 32)
    mask = (torch.rand(x.numel(), generator=g) > 0.3).to(dtype)
    x[2 * C:3 * C] = x[2 * C:3 * C] * mask[2 * C:3 * C]  # both zero signs flagged
    x[3 * C:4 * C] = (x[3 * C:4 * C] * mask[3 * C:4 * C]).abs()  # +0.0 flagged
    x[3 * C + 7:3 * C + 10] = -0.0  # three -0.0, kept
    x[4 * C + 100] = 0.0  # one zero: not flagged
    x[5 * C + 5] = float("nan")
    x[5 * C + 4000] = float("-inf")
    tiny = torch.finfo(torch.float32).tiny / 4 if dtype != torch.float16 else 1e-7
    x[5 * C + 17] = tiny
    x[6 * C:6 * C + 64 * 61:61] = tiny  # 64 subnormals
    size = torch.empty(0, dtype=dtype).element_size()
    lim = 1 << (8 * size - 1)
    x[7 * C:8 * C] = torch.randint(-lim, lim, (C,), generator=g).to(INT_VIEW[size]).view(dtype)
    if dtype == torch.float32:
        x[8 * C:9 * C] = (x[8 * C:9 * C] * mask[8 * C:9 * C]).bfloat16().float()  # LOW16, zeros
    x[9 * C + 1:9 * C + 1 + 63 * 50:50] = torch.tensor([0.0, -0.0]).to(dtype).repeat(32)[:63]
    p = z.encode(x, codec="fixed3", backend="torch")
    paths = _goes_general(x, p)
    enc_general = sum(e for e, _ in paths)
    dec_general = sum(d for _, d in paths)
    want_general = [False, False, True, True, False, False, True, True, dtype == torch.float32,
                    False, False, False]
    assert [e for e, _ in paths] == want_general, paths
    assert dec_general == 2 + (dtype == torch.float32), paths
    # encode's zero paths (bf16, fp32) take the chunks with flagged zeros
    enc_zero = {torch.bfloat16: 2, torch.float16: 0, torch.float32: 3}[dtype]
    enc_general -= enc_zero
    table, _ = F.read_table(p, F.parse_header(p))
    assert int(table.n_esc[1]) >= 64 and int(table.mode[7]) == F.MODE_RAW
    dec_general = 0  # decode's zero paths take every coded chunk here
    pg = codec_encode.encode(x.to(device), "fixed3", enc_warps)  # enc_warps warps a program
    assert pg.numel() == p.numel(), (pg.numel(), p.numel())
    assert torch.equal(pg.cpu(), p), f"first differing byte {int((pg.cpu() != p).nonzero()[0, 0])}"
    y = _triton_decode(p.to(device), torch.empty_like(x).to(device), tuning, header=True)
    assert torch.equal(bits(y), bits(x.to(device)))
    assert calls == {"encode": enc_general, "encode_zero": enc_zero, "decode": dec_general}, (
        calls, paths)
    calls.update(encode=0, encode_zero=0, decode=0)
    out = torch.full_like(x, 7.0).to(device)
    _triton_decode(p.to(device), out, tuning)
    assert torch.equal(bits(out), bits(x.to(device)))
    assert calls == {"encode": 0, "encode_zero": 0, "decode": dec_general}, calls


@pytest.mark.parametrize("device", [p for p in DEVICES if p.values[0] == "cpu"])
@pytest.mark.parametrize("dec_warps", (2, 4))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fixed3_code_bits_past_n_are_ignored(device, dtype, dec_warps, decode_plans):
    """The last code byte's bits past 3 n belong to no element: every
    encoder writes zeros there, and the torch reference ignores them. Set
    to ones (an escape code just past the last element of a ragged chunk
    the hot path decodes), the triton decoder gives the same values, writes
    nothing past n and reports no error, at 64 and 32 elements a thread
    (escape masks of 64 and 32 bits)."""
    tuning = decode_plans.Tuning(warps=dec_warps, fixed3_warps_16=dec_warps,
                                 fixed3_warps_32=dec_warps)
    n = C + 1001  # the tail's codes end 3 bits into byte 375
    x = torch.randn(n, generator=_gen(81)).to(dtype)
    if dtype == torch.float16:
        x[x.abs() < 2 ** -14] = 1.0  # no subnormal: every chunk hot
    p = z.encode(x, codec="fixed3", backend="torch")
    h = F.parse_header(p)
    table, offsets = F.read_table(p, h)
    assert table.mode.tolist() == [F.MODE_CODED] * 2 and table.flags.tolist() == [0, 0]
    last = int(F.stream_starts(h, table, offsets)[1, 0]) + 3 * 1001 // 8
    p[last] |= 0xF8
    want = torch.empty_like(x)
    z.decode(p, out=want, backend="torch")
    assert torch.equal(bits(want), bits(x))
    buf = torch.full((n + 64,), 7.0, dtype=dtype)
    _triton_decode(p, buf[:n], tuning)
    assert torch.equal(bits(buf[:n]), bits(x))
    assert torch.equal(bits(buf[n:]), bits(torch.full((64,), 7.0, dtype=dtype)))


@pytest.fixture
def decode_plans():
    """zipccl_fsdp.triton_kernels.codec_decode with its plans and launchers forgotten
    before and after the test (a test that changes how many chunks a
    program takes must not leave plans made under its settings)."""
    from zipccl_fsdp.triton_kernels import codec_decode as D
    D.reset()
    yield D
    D.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_decode_kernel_by_codec_and_chunks_a_program(device, decode_plans, monkeypatch):
    """decode(out=) launches the kernel of both codecs for a geometry's first
    payload, learns the codec from program 0's report in the error word,
    and launches that codec's own kernel after: fixed3's takes several
    chunks a program (here, with programs_wanted = 1 and per_choices (4, 2):
    1, 2, 4 and 4 for 1, 2, 4 and 10 chunks, so the last program's group of
    the 10 ends two past the last chunk, which is ragged). A payload of the other codec decodes
    nothing in it (ERR_CODEC) and is decoded again by the kernel of both,
    which the geometry keeps from then on. Every decode bit-exact; a
    corrupt chunk in the middle of a group and a corrupt header are refused
    with the torch backend's errors."""
    D = decode_plans
    tuning = D.Tuning(programs_wanted=1, per_choices=(4, 2))  # 2: the choice, and a group of 2
    launched = []
    real = D._launch

    def record(plan, codecs, payload, out):
        launched.append((codecs, plan.launch(codecs)[1]))
        return real(plan, codecs, payload, out)
    monkeypatch.setattr(D, "_launch", record)
    for n, per in ((1, 1), (C + 1, 2), (3 * C + 5, 4), (9 * C + 1, 4)):
        x = mixed(n, torch.bfloat16, seed=n).to(device)
        nch = F.nchunks_for(n)
        assert D.chunks_per_program(nch, "fixed3", tuning) == per
        assert D.chunks_per_program(nch, "dense", tuning) == 1
        grid = -(-nch // per)
        payloads = {c: z.encode(x, codec=c, backend="torch") for c in CODED}
        launched.clear()

        def decoded(codec):
            out = torch.full_like(x, 7.0)
            _triton_decode(payloads[codec], out, tuning)
            return bits(out)
        assert torch.equal(decoded("fixed3"), bits(x))
        assert torch.equal(decoded("fixed3"), bits(x))
        assert launched == [("both", nch), ("fixed3", grid)], (n, launched)
        if nch == 10:  # chunk 5: the second of program 1's four
            b = payloads["fixed3"].clone()
            b[_entry(F.parse_header(b), 5, 0)] = 7
            _raises_like_torch(b, x, "chunk table entry 5 is invalid", tuning)
            b = payloads["fixed3"].clone()
            b[0] = ord("X")
            _raises_like_torch(b, x, "bad magic", tuning)
        launched.clear()
        assert torch.equal(decoded("dense"), bits(x))
        assert launched == [("fixed3", grid), ("both", nch)], (n, launched)
        launched.clear()
        assert torch.equal(decoded("fixed3"), bits(x))
        assert torch.equal(decoded("dense"), bits(x))
        assert launched == [("both", nch), ("both", nch)], (n, launched)
    # A geometry whose first payloads are RAW (codec "raw") learns nothing
    # from them; its first coded payload teaches it.
    x = torch.randn(C + 9, generator=_gen(71)).bfloat16()
    x[-8:] = _specials(torch.bfloat16).repeat(2)[:8]
    x = x.to(device)
    raw = z.encode(x, codec="raw", backend="torch")
    launched.clear()
    for p in (raw, raw, z.encode(x, codec="dense", backend="torch"), raw):
        out = torch.full_like(x, 7.0)
        _triton_decode(p, out, tuning)
        assert torch.equal(bits(out), bits(x))
    assert launched == [("both", 2), ("both", 2), ("both", 2), ("dense", 2)], launched


def _tails(device, seed=2):
    """fp32 chunks: mantissa tails (LOWBYTE, which the hot paths hand to the
    general ones), Gaussian, bf16 casts (LOW16), tails with x * mask zeros
    and specials, and a ragged tail chunk of 1003 elements."""
    x = case("tail_mixed", 4 * C + 1003, torch.float32, seed=seed)
    x[3 * C:] = case("mantissa_tail", C + 1003, torch.float32, seed=seed + 1)
    return x.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", CODED)
def test_fp32_mantissa_tails_take_lowbyte(device, codec):
    x = _tails(device)
    p = z.encode(x.cpu(), codec=codec, backend="torch")
    table, _ = F.read_table(p, F.parse_header(p))
    assert ((table.flags & F.FLAG_LOWBYTE) != 0).tolist() == [True, False, False, True, True]
    zero_flags = F.FLAG_ZPOS | F.FLAG_ZNEG
    assert int(table.flags[0]) & zero_flags == 0 and int(table.flags[3]) & zero_flags != 0
    _check_against_torch(x, codec)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", CODED)
def test_a_lowbyte_bitmap_that_disagrees_is_refused(device, codec):
    """16 more bits in chunk 0's bitmap (its low stream would outgrow the
    offsets), and a bitmap bit past the ragged last chunk's end."""
    x = _tails(device)
    p = z.encode(x, codec=codec, backend="torch")
    h = F.parse_header(p)
    table, offsets = F.read_table(p, h)
    start = F.stream_starts(h, table, offsets)[:, 2].tolist()
    bm = p[start[0]:start[0] + C // 8].cpu()
    unset = [i for i in range(C) if not (int(bm[i // 8]) >> (i % 8)) & 1][:16]
    q = p.clone()
    for i in unset:
        q[start[0] + i // 8] |= 1 << (i % 8)
    with pytest.raises(z.CorruptPayloadError, match="segment offset of chunk 1"):
        z.decode(q, backend="triton")
    q = p.clone()
    q[start[4] + 1003 // 8] |= 0x80
    with pytest.raises(z.CorruptPayloadError, match="padding after a sub-stream of chunk 4"):
        z.decode(q, backend="triton")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codec", ["fixed3", "dense"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zero_chunks_equal_torch(device, dtype, codec):
    """Whole chunks of +0.0 (ZERO, no segment) beside chunks of +0.0 but for
    one -0.0, NaN or subnormal, a ragged all-zero tail; the same bytes as
    the torch backend, and ZERO entries that break the format are refused
    with torch's errors."""
    for n in (7, C + 1, 3 * C + 5):  # 3 C + 5: ZERO, one-odd, Gaussian, a ZERO ragged tail
        _check_against_torch(case("zero_runs", n, dtype, seed=n).to(device), codec)
    x = case("zero_runs", 3 * C, dtype, seed=6).to(device)
    p = z.encode(x, codec=codec, backend="torch")
    h = F.parse_header(p.cpu())
    assert [int(p[h.table_offset + 16 * c]) for c in range(3)] == [2, 1, 2]
    for at, value in ((0, 3), (1, 2), (2, 127), (4, 1)):
        b = p.clone()
        b[h.table_offset + at] = value
        _raises_like_torch(b, x, "chunk table entry 0")
    b = p.clone()
    b[h.table_offset + 16:h.table_offset + 32] = 0
    b[h.table_offset + 16] = 2  # chunk 1, CODED, relabelled ZERO
    _raises_like_torch(b, x, None)
