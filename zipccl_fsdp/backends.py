"""Which codec backend runs a call: the one owner of that choice.

``module(backend, device, dtype, codec)`` names the module (``codec_torch``,
``codec_cpp`` or ``zipccl_fsdp.triton_kernels.exponent_codec``) that encodes or decodes
a tensor of ``dtype`` with ``codec`` on ``device``:

* ``"torch"``, ``"cpp"``, ``"triton"``: that backend (``"triton"`` runs the
  kernels as they are: tests and ``benchmarks/gpu_check.py`` compare them
  with the torch backend themselves);
* ``"auto"``: the Triton kernels on CUDA, the C++ codec on the CPU (torch
  where it is not built, or where triton is missing).

The Triton kernels under ``"auto"`` pass a self-check first. The first use
of a (device, dtype, codec) encodes a small probe tensor on the device
(``probe``: one Gaussian chunk with NaN payloads, infinities and
subnormals, which the kernels' hot path takes, and a ragged tail with every
special value, both zeros included), decodes the payload into a tensor of
its own, and compares the payload with the torch backend's bytes and the
decoded words with the probe's. On any difference or error it warns once,
naming the device, the triton version and the codec, and that key uses the
torch backend from then on. Each key is checked once per process, on the
thread of its first call: one encode and one decode launch, and three host
syncs (the encoder's length read, the decoder's error word, and one copy of
both results to the host; a fourth, a second decode launch, where the
decoder's plan for the probe's size last decoded another codec,
``codec_decode._Plan``), a cost paid once per key, not per call.

A decode whose output the caller holds does not know the payload's codec
before its launch (``decode(payload, out=)`` reads nothing of the header on
the host): it takes the kernels when every codec of its (device, dtype)
passed, which it checks on that first call; otherwise ``module`` returns
None and the caller reads the header, whose codec then picks the backend.
"""
from __future__ import annotations

import os
import threading
import warnings

import torch

from . import codec_torch
from . import format as F

BACKENDS = ("auto", "torch", "cpp", "triton")
# Device types on which "auto" takes the Triton kernels (where triton runs).
AUTO_TRITON_DEVICES = ("cuda",)

_TRITON_AVAILABLE: list = []  # [whether triton imports, whether the kernels are interpreted]


def triton_usable(device: torch.device) -> bool:
    """Whether the triton backend runs on ``device``: CUDA, or any device
    when the kernels are interpreted. TRITON_INTERPRET is read once, beside
    triton's import: triton reads it when it decorates the kernels (on
    their first use), so a later change of it would not change what they
    run on."""
    if not _TRITON_AVAILABLE:
        from zipccl_fsdp.triton_kernels import available
        _TRITON_AVAILABLE.extend((available(), os.environ.get("TRITON_INTERPRET") == "1"))
    if not _TRITON_AVAILABLE[0]:
        return False
    return device.type == "cuda" or _TRITON_AVAILABLE[1]


# (backend, device) -> backend module, or _CHECKED (the Triton kernels
# behind their self-check), as _resolve chose it. Every input of that choice
# is fixed for the process (triton's and the C++ extension's availability,
# the interpreter flag, the device's type), so the call that resolved a pair
# once answers for it; a pair that raised is not kept and raises again.
_RESOLVED: dict = {}
_CHECKED = object()


def module(backend: str, device: torch.device, dtype: torch.dtype, codec: str | None = None):
    """The backend module for a call on ``device`` with a tensor of ``dtype``
    and ``codec`` (None: a decode that does not know its payload's codec
    yet; then None where the answer depends on it). Raises ValueError for
    an unknown backend or one that cannot run on ``device``."""
    try:
        got = _RESOLVED[backend, device]
    except (KeyError, TypeError):  # not resolved yet; or an unhashable backend (refused below)
        got = _RESOLVED[backend, device] = _resolve(backend, device)
    if got is not _CHECKED:
        return got
    return SELF_CHECK.module(device, dtype, codec)


def _resolve(backend: str, device: torch.device):
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if backend == "auto":
        if device.type in AUTO_TRITON_DEVICES and triton_usable(device):
            return _CHECKED
        if device.type == "cpu":
            from . import codec_cpp
            backend = "cpp" if codec_cpp.available() else "torch"
        else:
            backend = "torch"
    if backend == "torch":
        return codec_torch
    if backend == "cpp":
        if device.type != "cpu":
            raise ValueError(f"the cpp backend runs on CPU tensors, got a {device.type} tensor")
        from . import codec_cpp
        return codec_cpp
    if not triton_usable(device):
        from .cli import install_hint

        missing = "" if _TRITON_AVAILABLE[0] else f" (not installed; {install_hint('triton')})"
        raise ValueError(f"the triton backend needs triton{missing} and a CUDA tensor "
                         "(or TRITON_INTERPRET=1 for CPU tensors)")
    from zipccl_fsdp.triton_kernels import exponent_codec
    return exponent_codec


def probe(dtype: torch.dtype) -> torch.Tensor:
    """The self-check's input (CPU, seeded): one chunk of N(0, 1) with NaN
    payloads, infinities and subnormals at a few places and no zero (what
    the kernels' hot path takes), then a ragged tail of 300 whose first
    values are every special pattern: NaNs of several payloads and both
    signs, both infinities, both zeros, the smallest and largest
    subnormals, the smallest normal, the largest finite values; the rest
    Gaussian with a third of it zeroed by a mask (zeros of both signs)."""
    info = F.dtype_info(dtype)
    word = {2: torch.int16, 4: torch.int32}[info.itemsize]
    sign = 1 << (8 * info.itemsize - 1)
    emax = ((1 << info.exp_bits) - 1) << info.man_bits
    top = (1 << info.man_bits) - 1
    specials = [emax | (1 << (info.man_bits - 1)), emax | 1, sign | emax | 5, sign - 1,
                emax, sign | emax, 0, sign, 1, sign | top, 1 << info.man_bits,
                emax - 1, sign | (emax - 1), sign | 3]
    g = torch.Generator().manual_seed(0x5E1F)
    C = F.CHUNK_ELEMS
    x = torch.randn(C + 300, generator=g)
    x[C:] *= (torch.rand(300, generator=g) > 1 / 3).float()
    x = x.to(dtype)
    head = x[:C]
    head[head == 0] = 1.0  # (a draw may round to zero)
    w = x.view(word)
    lim = 1 << (8 * info.itemsize)
    signed = torch.tensor([v - lim if v >= lim // 2 else v for v in specials], dtype=word)
    w[C:C + len(specials)] = signed
    hot = signed[[0, 1, 2, 4, 5, 8, 9]]  # no zero: the chunk stays on the hot path
    w[torch.arange(len(hot)) * 577 + 3] = hot
    return x


class SelfCheck:
    """The verdicts of the Triton kernels' self-check, by (device, dtype,
    codec): the module that key uses (the kernels, or the torch backend
    after a failure, warned once)."""

    def __init__(self):
        self._verdicts: dict = {}
        self._lock = threading.Lock()

    def module(self, device: torch.device, dtype: torch.dtype, codec: str | None):
        """The module for a call of ``codec`` (None: any of the format's
        codecs; None when they do not all use the kernels)."""
        if codec is not None:
            got = self._verdicts.get((device, dtype, codec))
            return got if got is not None else self._check(device, dtype, codec)
        mods = [self.module(device, dtype, c) for c in F.CODEC_IDS]
        return mods[0] if all(m is mods[0] for m in mods) else None

    def _check(self, device: torch.device, dtype: torch.dtype, codec: str):
        with self._lock:  # one check per key, whichever thread asks first
            key = (device, dtype, codec)
            got = self._verdicts.get(key)
            if got is None:
                failure = run(device, dtype, codec)
                if failure is None:
                    from zipccl_fsdp.triton_kernels import exponent_codec
                    got = exponent_codec
                else:
                    _warn(device, dtype, codec, failure)
                    got = codec_torch
                self._verdicts[key] = got
            return got

    def verdicts(self) -> dict:
        """(device, dtype, codec) -> "triton" or "torch", for the keys checked."""
        return {k: "torch" if m is codec_torch else "triton" for k, m in self._verdicts.items()}

    def forget(self) -> None:
        """Drop every verdict: the next use of each key checks it again."""
        with self._lock:
            self._verdicts.clear()


SELF_CHECK = SelfCheck()


def run(device: torch.device, dtype: torch.dtype, codec: str) -> str | None:
    """The self-check of one key: None when the Triton kernels encode the
    probe into the torch backend's bytes and decode that payload back to
    the probe's words, else what went wrong. Host syncs: the encoder's
    length read, the decoder's error word (twice where its plan for this
    size last decoded another codec), one copy of both results to the
    host."""
    from zipccl_fsdp.triton_kernels import exponent_codec
    x = probe(dtype)
    want = codec_torch.encode(x, codec)  # on the CPU: no device work
    try:
        xd = x.to(device)
        got = exponent_codec.encode(xd, codec)
        out = torch.empty_like(xd)
        exponent_codec.decode_into(got, out)
        both = torch.cat([got, out.view(-1).view(torch.uint8)]).cpu()
    except Exception as e:  # noqa: BLE001 - any failure of the kernels is the verdict
        return f"{type(e).__name__}: {e}"
    payload, words = both[:got.numel()], both[got.numel():]
    if payload.numel() != want.numel():
        return f"the payload is {payload.numel()} bytes, the torch backend's {want.numel()}"
    if not torch.equal(payload, want):
        at = int((payload != want).nonzero()[0, 0])
        return f"the payload differs from the torch backend's from byte {at}"
    if not torch.equal(words, x.view(-1).view(torch.uint8)):
        at = int((words != x.view(-1).view(torch.uint8)).nonzero()[0, 0]) // x.element_size()
        return f"the decoded tensor differs from the probe from element {at}"
    return None


def _warn(device: torch.device, dtype: torch.dtype, codec: str, failure: str) -> None:
    import triton
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"{device.type}, Triton interpreter")
    warnings.warn(f"zipccl-fsdp: the Triton kernels failed their self-check for codec {codec!r} "
                  f"and {dtype} on {device} ({name}) with triton {triton.__version__}: "
                  f"{failure}. Calls of that codec and dtype on that device use the torch "
                  f"backend.", RuntimeWarning, stacklevel=2)
