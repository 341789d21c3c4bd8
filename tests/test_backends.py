"""Backend selection (zipccl_fsdp/backends.py) and the Triton kernels'
self-check under ``backend="auto"``.

Without CUDA the kernels run on CPU tensors under the Triton interpreter
(conftest.py sets TRITON_INTERPRET), and "auto" is made to take them on the
CPU as it does on CUDA. A wrong kernel is made by patching a launcher so
that it flips a byte of what the kernel wrote, or raises; the self-check
must then warn once, naming the device, the triton version and the codec,
and that key must use the torch backend.
"""
import re
import warnings

import pytest
import torch

import zipccl_fsdp as z
from zipccl_fsdp import backends, codec_torch
from zipccl_fsdp import format as F
from codec_cases import bits

HAS_CUDA = torch.cuda.is_available()
DEV = torch.device("cuda", 0) if HAS_CUDA else torch.device("cpu")


def test_probe_holds_every_special_and_a_hot_chunk():
    """The probe: a full chunk without zeros (the kernels' hot path) that
    holds NaN payloads, infinities and subnormals, then a ragged tail with
    both zeros and every special pattern."""
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = backends.probe(dtype)
        info = F.dtype_info(dtype)
        C = F.CHUNK_ELEMS
        assert x.numel() > C and x.numel() % C != 0
        w = bits(x).to(torch.int64) & ((1 << (8 * info.itemsize)) - 1)
        e = (w >> info.man_bits) & ((1 << info.exp_bits) - 1)
        man = w & ((1 << info.man_bits) - 1)
        sign = w >> (8 * info.itemsize - 1)
        emax = (1 << info.exp_bits) - 1
        for part in (slice(0, C), slice(C, None)):
            ep, mp, sp = e[part], man[part], sign[part]
            nans = (ep == emax) & (mp != 0)
            assert len(set(mp[nans].tolist())) >= 3 and set(sp[nans].tolist()) == {0, 1}
            assert set(sp[(ep == emax) & (mp == 0)].tolist()) == {0, 1}  # both infinities
            assert ((ep == 0) & (mp != 0)).sum() >= 2  # subnormals
        assert not ((e[:C] == 0) & (man[:C] == 0)).any()  # no zero: the hot path
        zeros = (e[C:] == 0) & (man[C:] == 0)
        assert set(sign[C:][zeros].tolist()) == {0, 1} and zeros.sum() > 20
        assert torch.equal(bits(backends.probe(dtype)), bits(x))  # the same every time


@pytest.fixture
def auto_kernels(monkeypatch):
    """"auto" takes the Triton kernels on this test's device, with no backend
    resolved and no verdict made yet; the encode and decode launchers
    counted (``calls``)."""
    pytest.importorskip("triton")
    if not HAS_CUDA:
        from triton.runtime.interpreter import InterpretedFunction
        from zipccl_fsdp.triton_kernels import fixed3_encode
        if not isinstance(fixed3_encode.fixed3_encode_kernel, InterpretedFunction):
            pytest.skip("CPU tensors need the Triton interpreter")
    from zipccl_fsdp.triton_kernels import codec_decode, codec_encode
    monkeypatch.setattr(backends, "AUTO_TRITON_DEVICES", ("cuda", DEV.type))
    monkeypatch.setattr(backends, "_RESOLVED", {})
    monkeypatch.setattr(backends, "SELF_CHECK", backends.SelfCheck())
    calls = {"encode": 0, "decode": 0, "checks": 0}
    enc, dec, run = codec_encode.encode, codec_decode.decode_into, backends.run

    def encode(*a, **k):
        calls["encode"] += 1
        return enc(*a, **k)

    def decode_into(*a, **k):
        calls["decode"] += 1
        return dec(*a, **k)

    def checked(*a, **k):
        calls["checks"] += 1
        return run(*a, **k)
    monkeypatch.setattr(codec_encode, "encode", encode)
    monkeypatch.setattr(codec_decode, "decode_into", decode_into)
    monkeypatch.setattr(backends, "run", checked)
    return calls, enc, dec


def _data(dtype=torch.bfloat16, n=1000):
    x = torch.randn(n, generator=torch.Generator().manual_seed(3)).to(dtype)
    x[::7] = 0.0
    x[1::7] = -0.0
    x[5] = float("nan")
    return x.to(DEV)


def _warning(codec: str):
    import triton
    return rf"codec '{codec}'.* on {re.escape(str(DEV))} .*triton {re.escape(triton.__version__)}"


def test_a_correct_kernel_passes_and_is_used(auto_kernels):
    """A kernel that writes the torch backend's bytes passes its check, once
    per key, without a warning, and the calls of that key then run it."""
    calls, _, _ = auto_kernels
    x = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = z.encode(x, codec="fixed3")
        assert calls == {"encode": 2, "decode": 1, "checks": 1}  # the probe's, then the call's
        assert torch.equal(p.cpu(), codec_torch.encode(x.cpu(), "fixed3"))
        z.encode(x, codec="fixed3")
        assert calls == {"encode": 3, "decode": 1, "checks": 1}
    assert backends.SELF_CHECK.verdicts() == {(DEV, torch.bfloat16, "fixed3"): "triton"}
    assert backends.module("auto", DEV, torch.bfloat16, "fixed3").__name__ == (
        "zipccl_fsdp.triton_kernels.exponent_codec")


def test_a_wrong_payload_falls_back_to_torch(auto_kernels, monkeypatch):
    """An encoder that flips one byte of its payload: the check warns once,
    naming the device, triton's version and the codec, and the calls of
    that key are the torch backend's (right bytes, the kernel not run);
    another codec is checked on its own."""
    from zipccl_fsdp.triton_kernels import codec_encode
    calls, enc, _ = auto_kernels

    def flipped(x, codec, warps=None):
        p = enc(x, codec, warps)
        if codec == "fixed3":
            p[F.parse_header(p).body_offset + 5] ^= 0x10
        return p
    monkeypatch.setattr(codec_encode, "encode", flipped)
    x = _data()
    with pytest.warns(RuntimeWarning, match=_warning("fixed3")) as got:
        p = z.encode(x, codec="fixed3")
    assert len(got) == 1 and "differs from the torch backend's" in str(got[0].message)
    assert torch.equal(p.cpu(), codec_torch.encode(x.cpu(), "fixed3"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: not again
        p = z.encode(x, codec="fixed3")
        assert torch.equal(p.cpu(), codec_torch.encode(x.cpu(), "fixed3"))
        d = z.encode(x, codec="dense")  # its own key: passes
    assert torch.equal(d.cpu(), codec_torch.encode(x.cpu(), "dense"))
    assert backends.SELF_CHECK.verdicts() == {(DEV, torch.bfloat16, "fixed3"): "torch",
                                              (DEV, torch.bfloat16, "dense"): "triton"}
    assert calls["checks"] == 2


def test_a_wrong_decode_falls_back_to_torch(auto_kernels, monkeypatch):
    """A decoder that flips a bit of one decoded element: decode(out=), which
    does not know the payload's codec before its launch, checks every codec
    of the dtype, warns for each, and decodes with the torch backend."""
    from zipccl_fsdp.triton_kernels import codec_decode
    calls, _, dec = auto_kernels

    def flipped(payload, out):
        sums = dec(payload, out)
        out.view(-1).view(torch.uint8)[3] ^= 0x01
        return sums
    monkeypatch.setattr(codec_decode, "decode_into", flipped)
    x = _data(torch.float16, 500)
    p = codec_torch.encode(x.cpu(), "dense").to(DEV)
    out = torch.empty_like(x)
    with pytest.warns(RuntimeWarning) as got:
        assert z.decode(p, out=out) is out
    assert torch.equal(bits(out), bits(x))
    assert sorted(re.search(r"codec '(\w+)'", str(w.message)).group(1) for w in got) == [
        "dense", "fixed3", "raw"]
    for w, codec in zip(sorted(got, key=lambda w: str(w.message)), ("dense", "fixed3", "raw")):
        assert re.search(_warning(codec), str(w.message)), str(w.message)
        assert "decoded tensor differs" in str(w.message)
    assert set(backends.SELF_CHECK.verdicts().values()) == {"torch"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out2 = z.decode(p)
    assert torch.equal(bits(out2), bits(x))


def test_an_error_in_the_kernels_falls_back_to_torch(auto_kernels, monkeypatch):
    """A launch that raises: the check warns with the error and the call
    gets the torch backend's payload."""
    from zipccl_fsdp.triton_kernels import codec_encode

    def broken(x, codec, warps=None):
        raise RuntimeError("no kernel image is available")
    monkeypatch.setattr(codec_encode, "encode", broken)
    x = _data(torch.float32, 300)
    with pytest.warns(RuntimeWarning, match=_warning("dense")) as got:
        p = z.encode(x, codec="dense")
    assert "RuntimeError: no kernel image is available" in str(got[0].message)
    assert torch.equal(p.cpu(), codec_torch.encode(x.cpu(), "dense"))


def test_explicit_backends_are_not_checked(auto_kernels, monkeypatch):
    """backend="triton" runs the kernels as asked (the tests and gpu_check
    compare them with torch themselves): no self-check, no fallback."""
    from zipccl_fsdp.triton_kernels import codec_encode
    calls, enc, _ = auto_kernels
    x = _data(n=200)
    p = z.encode(x, codec="fixed3", backend="triton")
    assert calls["checks"] == 0 and calls["encode"] == 1
    assert torch.equal(p.cpu(), codec_torch.encode(x.cpu(), "fixed3"))
    assert backends.SELF_CHECK.verdicts() == {}
