"""The C++ CPU backend: the format of ``format.py`` at memory speed.

``csrc/codec.cpp`` (with ``csrc/codec_vbmi2.cpp``, its AVX-512 kernels built
apart, and ``csrc/reduce.cpp``, the rank-order sum's element loops) is
compiled on first use with ``torch.utils.cpp_extension.load`` into ``<cache>/cpp-<key>/``, where the
cache root is ``$ZIPCCL_FSDP_CACHE_DIR``, else ``$XDG_CACHE_HOME/zipccl_fsdp``,
else ``~/.cache/zipccl_fsdp``, and ``key`` hashes everything that makes two
builds differ (``_build_key``): the sources, the flags, the compiler, the
torch version and installation, and the Python version and headers. A
changed source never loads a stale build, and two environments (two venvs,
two torch builds) never share a directory, where each would rebuild the
other's library. A build logs one warning first (visible without any
logging set-up), saying what it builds and where; it needs a C++ compiler
and ninja (a dependency of the package: the PyPI ``ninja``, whose program
is found in its environment's ``bin`` even when that is not on PATH).
Processes that build at once are serialized by torch's ``FileBaton`` lock
file in that directory (a process killed mid-build leaves ``lock`` behind and
later builds wait on it: delete the file). The build targets baseline x86-64,
not the build machine, since a cache directory may be shared by several
machines; the hot loops pick their best version at run time (``isa()``):
AVX-512 VBMI2 where the CPU has it (its byte compress and expand move the
sign+mantissa bytes around omitted zeros in one instruction), else AVX2 +
BMI2, else portable code. ``ZIPCCL_FSDP_CPP_ISA`` caps the choice
(``avx2`` or ``generic``: the tests run every set this CPU has that way). A
compiler too old for the VBMI2 target (before GCC 8 or clang 6) builds
without that set.
Calls drop the GIL and run over chunks on ``torch.get_num_threads()`` threads.

If the build fails (no compiler, no ninja, a compile error), ``available()``
returns False, ``unavailable_reason()`` says why and how to fix it (also
logged once as a warning), and ``backend="auto"`` falls back to the torch
backend.

With ``verify`` the checksums of ``format.py`` ("Integrity") are computed
here too (``CHECKSUMS``): per chunk, while it is in cache, in the encode write
pass and in the decode loop (AVX2 with the portable code as fallback and
tail); ``codec.py`` compares them.

The payloads are byte-identical to ``codec_torch``'s, and ``decode`` refuses
exactly the payloads ``codec_torch.decode`` refuses: C++ applies the rules of
``format.validate_table``, ``validate_offsets`` and ``check_padding``
(format.py's own functions then raise the error), and the same count and
exponent checks to every chunk. On a corrupt payload ``out`` may be partly written before
CorruptPayloadError is raised.

Example::

    >>> import torch, zipccl_fsdp
    >>> from zipccl_fsdp import codec_cpp
    >>> x = torch.randn(1 << 20).bfloat16()
    >>> backend = "cpp" if codec_cpp.available() else "torch"
    >>> p = zipccl_fsdp.encode(x, codec="fixed3", backend=backend)
    >>> y = zipccl_fsdp.decode(p, backend=backend)
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import sys
import sysconfig
import threading
import time
from pathlib import Path

import torch

from . import format as F
from .errors import CorruptPayloadError

log = logging.getLogger(__name__)

_CSRC = Path(__file__).resolve().parent / "csrc"
_SOURCES = (_CSRC / "codec.cpp", _CSRC / "codec_vbmi2.cpp", _CSRC / "reduce.cpp")
"""The library's sources: the codec (its AVX-512 VBMI2 kernels in a translation
unit of their own), and the rank-order sum's element loops (``_reduce.py``
calls them through ``sum_add`` and ``sum_to_bf16``)."""
_NAME = "zipccl_codec_cpp"
# No -march: see the module docstring (the AVX2 kernels carry their own target
# attribute). -fopenmp: chunks run in an OpenMP loop on torch.get_num_threads()
# threads; the library's libgomp.so.1 resolves to the copy torch already loaded.
_CFLAGS = ["-O3", "-fopenmp"]
_LDFLAGS = ["-fopenmp"]

_lock = threading.Lock()
_state: dict = {"tried": False, "ext": None, "reason": None}


def _cache_root() -> Path:
    explicit = os.environ.get("ZIPCCL_FSDP_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "zipccl_fsdp"


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


def _build_key(sources) -> list:
    """What makes two builds differ: torch's builder puts the torch and Python
    include folders and the compiler into the build commands, and ninja
    rebuilds when a command changes."""
    compiler = _compiler()
    return [*(s.read_bytes() for s in sources), repr((_CFLAGS, _LDFLAGS)).encode(),
            compiler.encode(), str(shutil.which(compiler)).encode(),
            torch.__version__.encode(), str(Path(torch.__file__).resolve().parent).encode(),
            sys.version.encode(), str(sysconfig.get_paths()["include"]).encode()]


def _build_dir(sources) -> Path:
    key = hashlib.sha256()
    for part in _build_key(sources):
        key.update(part)
        key.update(b"\0")
    return _cache_root() / f"cpp-{key.hexdigest()[:16]}"


@contextlib.contextmanager
def _ninja_on_path():
    """torch's builder runs ``ninja`` from PATH. The PyPI ``ninja`` (a
    dependency) installs it into its environment's ``bin``, which is on PATH
    only while the environment is activated: add it for the build."""
    from torch.utils.cpp_extension import is_ninja_available

    if is_ninja_available():
        yield
        return
    try:
        from ninja import BIN_DIR
    except ImportError:
        BIN_DIR = str(Path(sys.executable).parent)
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([BIN_DIR, old]) if old else BIN_DIR
    try:
        if not is_ninja_available():
            raise RuntimeError("ninja is not installed: pip install ninja (a dependency of "
                               "zipccl-fsdp; reinstalling it brings ninja too)")
        yield
    finally:
        os.environ["PATH"] = old


def _expected_constants() -> list:
    """format.py's constants, flattened in the order csrc's zipccl_constants() writes them."""
    flat = [F.CHUNK_ELEMS, F.CHUNK_ENTRY_NBYTES, F.OFFSET_NBYTES, F.ALIGN,
            F.FIXED_ZERO_SLOT_SHIFT, F.DENSE_ZERO_FIRST_SHIFT, F.FIXED_BITS, F.FIXED_ESC,
            F.REM_BITS, F.DENSE_SLOTS, F.ZERO_SYMBOL, F.NEG_ZERO_SYMBOL, F.MODE_RAW,
            F.MODE_CODED, F.MODE_ZERO, F.FLAG_LOW16, F.FLAG_ZPOS, F.FLAG_ZNEG, F.FLAG_LOWBYTE,
            F.CODEC_IDS["raw"], F.CODEC_IDS["fixed3"], F.CODEC_IDS["dense"], *F.TIER_BITS,
            *F.TIER_SYMBOLS]
    for row in F.DENSE_ORDER:
        flat += row
    for row in F.FIXED_LO_BY_ZEROS:
        flat += row
    flat += [F.DTYPES[d].code for d in (torch.bfloat16, torch.float16, torch.float32)]
    return flat + [F.SUM_KEY_MUL, F.SUM_MUL1, F.SUM_MUL2]


_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "zipccl_best_isa": [],
    "zipccl_encode_plan": [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _I64, _I64],
    "zipccl_encode_write": [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _I64, _I64, _PTR, _I64,
                            _I64],
    "zipccl_decode": [_PTR, _I64, _PTR, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _PTR,
                      _I64, _I64],
    "zipccl_chunk_sums": [_PTR, _I64, _I64, _PTR, _I64, _I64],
    "zipccl_constants": [_PTR, _I64],
    "zipccl_advise_hugepages": [_PTR, _I64],
    "zipccl_sum_add": [_PTR, _PTR, _I64, _I64, _I64, _I64, _I64],
    "zipccl_sum_to_bf16": [_PTR, _PTR, _I64, _I64, _I64],
}
# Kernel sets, best last (csrc's isa numbers). ZIPCCL_FSDP_CPP_ISA caps the
# choice (tests force each one; "generic" also sidesteps the SIMD kernels if
# one is ever suspect). "avx512": the AVX2 kernels built again with AVX-512
# BW/VL/VBMI2 on 256-bit vectors.
ISAS = ("generic", "avx2", "avx512")


STALE_LOCK_S = 600  # far longer than a cold build; a lock this old was left by a killed process


def _remove_stale_lock(build_dir: Path) -> None:
    """torch's FileBaton waits forever on a lock file whose owner died mid-build."""
    lock = build_dir / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S:
        log.warning("removing %s, left %.0f s ago by a build that did not finish", lock, age)
        lock.unlink(missing_ok=True)


def _build(sources=_SOURCES):
    """Compile (or reuse) and load the library; raises on any failure."""
    from torch.utils.cpp_extension import load

    # torch would find these out too, but after a loud compiler warning.
    compiler = _compiler()
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler: {compiler!r} is not on PATH; install one "
                           f"(Debian/Ubuntu: apt-get install g++) or name it in CXX")
    build_dir = _build_dir(sources)
    build_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_lock(build_dir)
    if not (build_dir / f"{_NAME}.so").exists():
        log.warning("zipccl: building its C++ codec into %s (once per torch, Python and "
                    "compiler; later processes load it)", build_dir)
    with _ninja_on_path():
        path = load(name=_NAME, sources=[str(s) for s in sources], extra_cflags=_CFLAGS,
                    extra_ldflags=_LDFLAGS, build_directory=str(build_dir), verbose=False,
                    is_python_module=False)
    lib = ctypes.CDLL(path)
    for fn, argtypes in _SIGNATURES.items():
        getattr(lib, fn).argtypes = argtypes
        getattr(lib, fn).restype = _I64
    want = _expected_constants()
    got = torch.zeros(len(want) + 1, dtype=torch.int64)
    count = lib.zipccl_constants(got.data_ptr(), got.numel())
    if count != len(want) or got[:count].tolist() != want:
        raise RuntimeError("csrc/codec.cpp was written for other format constants than "
                           "format.py's; rebuild from a matching checkout")
    return lib


def _load():
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            try:
                _state["ext"] = _build()
            except Exception as exc:  # noqa: BLE001 - any build failure means "unavailable"
                _state["reason"] = f"{type(exc).__name__}: {exc}"
                log.warning("zipccl C++ codec unavailable, using the (slow) torch backend: %s",
                          _state["reason"])
    return _state["ext"]


def available() -> bool:
    """Whether the C++ extension is built and loaded (builds it on first call)."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why ``available()`` is False, or None."""
    _load()
    return _state["reason"]


def _ext():
    ext = _load()
    if ext is None:
        raise RuntimeError(f"the cpp backend is unavailable: {_state['reason']}")
    return ext


def isa() -> str:
    """The kernel set calls use: the best this CPU runs, capped by $ZIPCCL_FSDP_CPP_ISA."""
    return ISAS[_isa(_ext())]


def _isa(ext) -> int:
    best = ext.zipccl_best_isa()
    cap = os.environ.get("ZIPCCL_FSDP_CPP_ISA")
    if not cap:
        return best
    if cap not in ISAS:
        raise ValueError(f"ZIPCCL_FSDP_CPP_ISA={cap!r}; choose one of {ISAS}")
    return min(best, ISAS.index(cap))


# Buffers from this size up get transparent huge pages (below it the madvise
# call costs more than the page faults it saves).
_HUGEPAGE_MIN_NBYTES = 8 << 20


def _fresh_buffer(ext, nbytes: int) -> torch.Tensor:
    out = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes >= _HUGEPAGE_MIN_NBYTES:
        ext.zipccl_advise_hugepages(out.data_ptr(), nbytes)
    return out


# --------------------------------------------------------------------------
# Encode / decode: codec_torch's signatures, plus the checksums of format.py
# ("Integrity") computed here, in the passes that touch each chunk anyway
# (codec.py computes them with torch ops for backends without CHECKSUMS).
# --------------------------------------------------------------------------
CHECKSUMS = True
"""``encode(verify=True)`` and ``decode(sums=...)`` compute the checksums in C++."""
ROOM = True
"""``encode(room=...)`` writes the payload at the start of a buffer that large."""


def _sums_into(ext, x: torch.Tensor, sums: torch.Tensor) -> None:
    """The checksums of x (one u32 per CHUNK_ELEMS, little-endian) into the uint8 sums."""
    if x.numel() and ext.zipccl_chunk_sums(x.data_ptr(), F.dtype_info(x.dtype).code, x.numel(),
                                           sums.data_ptr(), torch.get_num_threads(),
                                           _isa(ext)) != 0:
        raise RuntimeError("zipccl_chunk_sums refused its arguments")


def chunk_sums(x: torch.Tensor) -> torch.Tensor:
    """``codec.chunk_sums`` in C++: the checksums of x as an int64 tensor."""
    x = x.contiguous()
    sums = torch.empty(4 * F.nchunks_for(x.numel()), dtype=torch.uint8)
    _sums_into(_ext(), x, sums)
    return sums.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def encode(x: torch.Tensor, codec: str, verify: bool = False, room: int = 0) -> torch.Tensor:
    """With ``verify``, the payload also carries the checksums (header flag
    CHECKSUM); with ``room``, it is the start of a buffer of that many bytes
    at least (``codec.encode``)."""
    info = F.dtype_info(x.dtype)
    ext = _ext()
    x = x.contiguous()
    numel = x.numel()
    if numel * info.itemsize > F.MAX_BODY_NBYTES - F.ALIGN:
        raise ValueError(f"a tensor of {numel * info.itemsize} bytes exceeds what format "
                         f"version {F.VERSION} addresses ({F.MAX_BODY_NBYTES - F.ALIGN} bytes)")
    C = F.CHUNK_ELEMS
    header = F.Header(codec, x.dtype, tuple(x.shape), numel, C if codec != "raw" else 0,
                      F.nchunks_for(numel, C) if codec != "raw" else 0, 0,
                      F.HEADER_FLAG_CHECKSUM if verify else 0)
    if codec == "raw":
        header.body_nbytes = numel * info.itemsize
        out = _fresh_buffer(ext, max(header.total_nbytes, room))[:header.total_nbytes]
        out[header.body_offset:header.sums_offset].copy_(x.reshape(-1).view(torch.uint8))
        if verify:
            _sums_into(ext, x, out[header.sums_offset:])
    elif numel == 0:
        out = torch.empty(max(header.table_offset, room), dtype=torch.uint8)[:header.table_offset]
    else:
        nch = header.nchunks
        table = torch.empty(nch * F.CHUNK_ENTRY_NBYTES, dtype=torch.uint8)
        offsets = torch.empty(nch, dtype=torch.int64)
        body = torch.empty(1, dtype=torch.int64)
        threads, isa_ = torch.get_num_threads(), _isa(ext)
        args = (x.data_ptr(), info.code, F.CODEC_IDS[codec], numel, table.data_ptr(),
                offsets.data_ptr())
        if ext.zipccl_encode_plan(*args, body.data_ptr(), threads, isa_) != 0:
            raise RuntimeError("zipccl_encode_plan refused its arguments")
        header.body_nbytes = int(body[0])
        out = _fresh_buffer(ext, max(header.total_nbytes, room))[:header.total_nbytes]
        sums = out.data_ptr() + header.sums_offset if verify else None
        if ext.zipccl_encode_write(*args, out.data_ptr(), header.table_offset,
                                   header.body_offset, sums, threads, isa_) != 0:
            raise RuntimeError("zipccl_encode_write refused its arguments")
    header.copy_into(out)
    return out


# csrc's Err codes that format.py's table checks also catch (re-run for their message)
_ERR_TABLE, _ERR_LENGTHS, _ERR_OFFSETS, _ERR_GAP = 1, 2, 6, 8
_ERRORS = {
    1: "chunk table entry {chunk} is invalid",
    2: "the body length disagrees with the chunk table",
    3: "dense tier open counts disagree with the table (chunk {chunk})",
    4: "decoded escape/zero counts disagree with the chunk table (chunk {chunk})",
    5: "a code decodes to an exponent outside the dtype (chunk {chunk})",
    6: "segment offset of chunk {chunk} disagrees with the chunk table",
    7: "padding after a sub-stream of chunk {chunk} is not zero",
    8: "padding after the segment offsets is not zero",
}


def _refuse_like_torch(payload: torch.Tensor, header: F.Header, info: F.DTypeInfo) -> None:
    """Raise codec_torch.decode's error for a table, offset or body-length fault."""
    from .codec_torch import check_table
    check_table(payload, header)


def decode(payload: torch.Tensor, header: F.Header, out: torch.Tensor,
           sums: torch.Tensor | None = None) -> torch.Tensor:
    """Decode into ``out``; with ``sums`` (uint8, 4 bytes per CHUNK_ELEMS), also write
    the checksums of what was decoded there, for codec.py to compare."""
    info = F.DTYPES[header.dtype]
    ext = _ext()
    if sums is not None and (sums.dtype != torch.uint8 or not sums.is_contiguous()
                             or sums.numel() != 4 * F.nchunks_for(header.numel)):
        raise ValueError("sums must be a contiguous uint8 tensor of 4 bytes per "
                         f"{F.CHUNK_ELEMS} elements")
    if header.codec == "raw":
        out.reshape(-1).view(torch.uint8).copy_(
            payload[header.body_offset:header.body_offset + header.body_nbytes])
        if sums is not None:
            _sums_into(ext, out, sums)
        return out
    if header.numel == 0:
        return out
    if not (out.is_contiguous() and out.dtype == header.dtype and out.numel() == header.numel
            and out.device.type == "cpu" and payload.device.type == "cpu"):
        raise ValueError("out must be a contiguous CPU tensor of the payload's dtype and numel")
    payload = payload.contiguous()
    # The table is checked in C++ (entry_ok: validate_table's rules, then the
    # offsets and body length against the segment sizes, then the padding),
    # not with format.py's torch ops, which cost more than decoding a small
    # payload. The tests check that both refuse the same tables; a refusal
    # re-runs format.py's checks to raise the reference's own message.
    status = ext.zipccl_decode(payload.data_ptr(), payload.numel(), out.data_ptr(), info.code,
                               F.CODEC_IDS[header.codec], header.numel, header.chunk_elems,
                               header.nchunks, header.table_offset, header.body_offset,
                               header.body_nbytes,
                               None if sums is None else sums.data_ptr(),
                               torch.get_num_threads(), _isa(ext))
    if status < 0:
        raise RuntimeError("zipccl_decode refused its arguments")
    if status:
        code = status & 0xFF
        if code in (_ERR_TABLE, _ERR_LENGTHS, _ERR_OFFSETS, _ERR_GAP):
            _refuse_like_torch(payload, header, info)
        err = CorruptPayloadError(_ERRORS[code].format(chunk=status >> 8))
        if "{chunk}" in _ERRORS[code]:
            err.chunk = status >> 8  # read by protocol.decode_from, which names it with the peer
        raise err
    return out


# --------------------------------------------------------------------------
# The rank-order sum's element loops (csrc/reduce.cpp): ``_reduce.py`` owns
# the reduction and decides when these run; its torch ops give the same bits.
# --------------------------------------------------------------------------
def loaded():
    """The library when a call of this process has already built and loaded
    it, else None; never builds (a sum alone does not start a compile)."""
    return _state["ext"]


def sum_add(ext, acc: torch.Tensor, src: torch.Tensor, first: bool) -> bool:
    """``acc`` (contiguous fp32) := ``src`` widened (``first``) or ``acc`` +
    ``src`` widened, ``src`` contiguous bf16 or fp32 of as many elements; returns
    whether ``acc`` now holds a NaN."""
    if src.dtype not in (torch.bfloat16, torch.float32) or src.numel() != acc.numel():
        raise ValueError(f"sum_add takes {acc.numel()} bf16 or fp32 elements, got "
                         f"{src.numel()} {src.dtype}")
    nan = ext.zipccl_sum_add(acc.data_ptr(), src.data_ptr(), int(src.dtype == torch.bfloat16),
                             acc.numel(), int(first), torch.get_num_threads(), _isa(ext))
    if nan < 0:
        raise RuntimeError("zipccl_sum_add refused its arguments")
    return nan == 1


def sum_to_bf16(ext, out: torch.Tensor, acc: torch.Tensor) -> None:
    """``out`` (contiguous bf16) := ``acc`` (contiguous fp32) rounded to nearest,
    ties to even, as torch's cast does, with every NaN ``CANONICAL_NAN``'s bits."""
    if out.dtype != torch.bfloat16 or out.numel() != acc.numel():
        raise ValueError(f"sum_to_bf16 writes {acc.numel()} bf16 elements, got "
                         f"{out.numel()} {out.dtype}")
    if ext.zipccl_sum_to_bf16(out.data_ptr(), acc.data_ptr(), acc.numel(),
                              torch.get_num_threads(), _isa(ext)) != 0:
        raise RuntimeError("zipccl_sum_to_bf16 refused its arguments")
