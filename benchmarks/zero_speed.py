"""Codec speed on data with zeros of both signs, against the same codec on Gaussian data.

``x * mask`` (dropout, ReLU backward, routing masks) leaves +0.0 and -0.0;
the codec flags each zero sign per chunk and codes it without a sign+mantissa
byte. This script measures what those chunks cost on the C++ backend: for
each data kind (Gaussian, ``x * mask`` at several zero fractions, +0.0-only
zeros) and codec, encode and decode speed in GB of input per CPU-second of
this process (``time.process_time``: the machine may be shared, and CPU time
counts only this process's work), and each speed's ratio to the same codec's
speed on Gaussian data.

The ratios are paired: a shared machine's speed drifts by tens of percent
within seconds (other tenants' memory traffic; CPU time does not hide it),
so a ratio of two medians measured seconds apart wanders as much. Each
round times every kind beside Gaussian data, alternately (gauss, kind,
gauss, kind, or the reverse in every other round: each timing follows one
of the other input, so neither finds its input in cache from the call
before, and a drift cancels over two rounds), and ``x gauss`` is the median
over rounds of those per-round ratios.

With ``--baseline REV`` the C++ source of that git revision is built too and
every measurement is made on both libraries, interleaved (round-robin over
codec, data kind and library, ``--rounds`` times, the libraries' order
turning each round), so the column ``vs base``, the median of each round's
ratio of the two, compares them side by side on a loaded machine.

``--isas avx512,avx2`` measures this revision's library once per kernel set
named (``codec_cpp.ISAS``, capped as ``ZIPCCL_FSDP_CPP_ISA`` does), in the
same interleaved rounds; each row's ``x gauss`` is against the same kernel
set's Gaussian speed, ``vs base`` against the baseline's best kernels, or
those ``--base-isa`` names.

Encode writes into warm memory: glibc is told (``mallopt``) to keep freed
blocks rather than return them to the kernel, so each call's fresh payload
buffer is memory already mapped. Otherwise every call page-faults its
payload in, a cost that belongs to the allocator rather than the codec and
that differs from process to process (how many huge pages a buffer gets
depends on its address), so that two builds of the same source would read
apart in encode speed.

Usage::

    python benchmarks/zero_speed.py [--mib 16] [--rounds 5] [--threads 1] [--dtype bf16]
        [--isas avx512,avx2] [--baseline main]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from zipccl_fsdp import codec_cpp  # noqa: E402
from zipccl_fsdp import format as F  # noqa: E402

FRACTIONS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)


def data(kind: str, numel: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """``gauss``, ``masked<P>`` (x * mask, P% zeros of both signs), ``pos<P>``
    (+0.0 only) or ``tail`` (sums of 3 bf16 values: fp32 mantissa tails, LOWBYTE chunks)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g).to(dtype)
    if kind == "gauss":
        return x
    if kind == "tail":
        return sum(torch.randn(numel, generator=g).bfloat16().float() for _ in range(3)).to(dtype)
    frac = int(kind.lstrip("maskedpos")) / 100
    keep = torch.rand(numel, generator=g) >= frac
    if kind.startswith("masked"):
        return x * keep.to(dtype)
    return torch.where(keep, x, torch.zeros((), dtype=dtype))


def _build_baseline(rev: str):
    """The C++ library built from ``rev``'s csrc (a separate build directory).
    Its format constants are not checked against format.py: a baseline may
    predate a threshold change (its payloads then differ, and decode with it)."""
    from torch.utils.cpp_extension import load

    d = Path(tempfile.mkdtemp(prefix="zipccl_base_"))
    srcs = []
    for s in codec_cpp._SOURCES:
        rel = s.relative_to(ROOT).as_posix()
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{rel}"],
                               capture_output=True)
        if shown.returncode:  # a source this revision does not have yet
            continue
        text = shown.stdout
        (d / s.name).write_bytes(text)
        srcs.append(d / s.name)
    build = codec_cpp._build_dir(tuple(srcs))
    build.mkdir(parents=True, exist_ok=True)
    path = load(name=codec_cpp._NAME, sources=[str(s) for s in srcs],
                extra_cflags=codec_cpp._CFLAGS, extra_ldflags=codec_cpp._LDFLAGS,
                build_directory=str(build), verbose=False, is_python_module=False)
    lib = ctypes.CDLL(path)
    for fn, argtypes in codec_cpp._SIGNATURES.items():
        getattr(lib, fn).argtypes = argtypes
        getattr(lib, fn).restype = codec_cpp._I64
    return lib


def _keep_freed_memory() -> None:
    """glibc keeps freed blocks of any size mapped: no block is its own mmap,
    and the heap is never trimmed."""
    try:
        libc = ctypes.CDLL(None)
        m_trim_threshold, m_mmap_max = -1, -4
        ok = libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1)
    except (OSError, AttributeError):  # not glibc
        ok = False
    if not ok:
        print("zero_speed: mallopt unavailable; encode speeds include page faults", file=sys.stderr)


def _cpu_time(fn, reps: int) -> float:
    """CPU seconds of this process per call of fn, over reps calls."""
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mib", type=int, default=16, help="input size per tensor (default 16)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median kept)")
    p.add_argument("--reps", type=int, default=4, help="calls timed together per cell and round")
    p.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads (default 1)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--codecs", default="fixed3,dense")
    p.add_argument("--kinds", default=",".join(["gauss", *(f"masked{round(f * 100)}"
                                                         for f in FRACTIONS), "pos30"]))
    p.add_argument("--baseline", metavar="REV", help="also measure the C++ source of this revision")
    p.add_argument("--base-isa", help="the kernel set to run the baseline with, of "
                   "('generic', 'avx2', 'avx512') (default: the best this CPU runs)")
    p.add_argument("--isas", help="comma-separated kernel sets to measure this revision's "
                   f"library with, of {codec_cpp.ISAS} (default: the best this CPU runs)")
    args = p.parse_args()
    _keep_freed_memory()
    torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    numel = (args.mib << 20) // torch.empty(0, dtype=dtype).element_size()
    kinds = args.kinds.split(",")
    codecs = args.codecs.split(",")
    cap = os.environ.get("ZIPCCL_FSDP_CPP_ISA")
    # name -> (library, ZIPCCL_FSDP_CPP_ISA while it runs; None: unset)
    libs = {"new": (codec_cpp._ext(), cap)}
    if args.isas:
        for name in args.isas.split(","):
            if name not in codec_cpp.ISAS:
                raise SystemExit(f"--isas: {name!r} is not one of {codec_cpp.ISAS}")
            os.environ["ZIPCCL_FSDP_CPP_ISA"] = name
            if codec_cpp.isa() != name:
                raise SystemExit(f"--isas: this CPU does not run the {name} kernels")
        libs = {f"new/{name}": (libs["new"][0], name) for name in args.isas.split(",")}
    if args.base_isa and not args.baseline:
        raise SystemExit("--base-isa names the baseline's kernel set: give --baseline too")
    if args.baseline:
        if args.base_isa and args.base_isa not in codec_cpp.ISAS:
            raise SystemExit(f"--base-isa: {args.base_isa!r} is not one of {codec_cpp.ISAS}")
        libs["base"] = (_build_baseline(args.baseline), args.base_isa)
    # Gaussian data is every row's partner: measured beside each kind.
    inputs = {k: data(k, numel, dtype) for k in dict.fromkeys(["gauss", *kinds])}
    state = codec_cpp._state
    mine = state["ext"]

    def use(lib_name):
        lib, isa = libs[lib_name]
        state["ext"] = lib
        if isa is None:
            os.environ.pop("ZIPCCL_FSDP_CPP_ISA", None)
        else:
            os.environ["ZIPCCL_FSDP_CPP_ISA"] = isa

    # Each library's payloads, checked bit for bit once (a baseline's
    # payloads may differ from this revision's, and decode with it).
    coded: dict = {}
    bits = {2: torch.int16, 4: torch.int32}[inputs["gauss"].element_size()]
    for lib_name in libs:
        use(lib_name)
        for k, x in inputs.items():
            for c in codecs:
                payload = codec_cpp.encode(x, c)
                header = F.parse_header(payload)
                out = torch.empty_like(x)
                codec_cpp.decode(payload, header, out)
                if not torch.equal(out.view(bits), x.view(bits)):
                    raise SystemExit(f"{lib_name} {c} {k}: round trip not bit-exact")
                coded[(k, c, lib_name)] = (payload, header, out)

    def timed(k, c, lib_name, op):
        x = inputs[k]
        if op == "enc":
            return _cpu_time(lambda: codec_cpp.encode(x, c), args.reps)
        payload, header, out = coded[(k, c, lib_name)]
        return _cpu_time(lambda: codec_cpp.decode(payload, header, out), args.reps)

    # (kind, codec, lib) -> {"enc"/"dec": per-round CPU seconds a call};
    # ratios: (kind, codec, lib) -> {"enc"/"dec": per-round Gaussian time
    # over this kind's, the two timed alternately}.
    cells: dict = {}
    ratios: dict = {}
    try:
        for r in range(args.rounds):
            for c in codecs:
                for k in kinds:
                    # the libraries' order turns each round: none is always first
                    names = list(libs)
                    names = names[r % len(names):] + names[:r % len(names)]
                    for lib_name in names:
                        use(lib_name)
                        cell = cells.setdefault((k, c, lib_name), dict(enc=[], dec=[]))
                        pair = ratios.setdefault((k, c, lib_name), dict(enc=[], dec=[]))
                        for op in ("enc", "dec"):
                            # Every timing follows one of the other input's
                            # (none finds its input in cache from the last);
                            # the order turns each round (drift cancels).
                            order = ("gauss", k) * 2 if r % 2 == 0 else (k, "gauss") * 2
                            t = dict.fromkeys(order, 0.0)
                            for kk in order:
                                t[kk] += timed(kk, c, lib_name, op)
                            cell[op].append(t[k] / order.count(k))
                            pair[op].append(t["gauss"] / t[k])
    finally:
        state["ext"] = mine
        if cap is None:
            os.environ.pop("ZIPCCL_FSDP_CPP_ISA", None)
        else:
            os.environ["ZIPCCL_FSDP_CPP_ISA"] = cap
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    gb = lambda s: nbytes / s / 1e9  # noqa: E731
    med = {key: dict(enc=gb(statistics.median(v["enc"])), dec=gb(statistics.median(v["dec"])),
                     ratio=nbytes / coded[key][0].numel()) for key, v in cells.items()}
    # Paired ratios: the median over rounds of each round's ratio.
    xg = {key: {op: statistics.median(v[op]) for op in ("enc", "dec")}
          for key, v in ratios.items()}
    vs_base = {}
    if args.baseline:
        for (k, c, lib_name), v in cells.items():
            b = cells[(k, c, "base")]
            vs_base[(k, c, lib_name)] = {op: statistics.median(
                bt / nt for bt, nt in zip(b[op], v[op])) for op in ("enc", "dec")}
    isas = args.isas or codec_cpp.isa()  # after the finally: the caller's cap
    print(f"zero_speed: {args.dtype} {args.mib} MiB, {args.threads} thread(s), isa "
          f"{isas}, median of {args.rounds} interleaved rounds x {args.reps} calls; "
          f"GB of input per CPU-second (median); 'x gauss': the median of each round's "
          f"Gaussian over this kind's CPU time, timed alternately beside each other; "
          f"'vs base': the median of each round's baseline over this time")
    print(f"load: {os.getloadavg()}")
    head = "| data | codec | lib | ratio | enc GB/cpu-s | dec GB/cpu-s | enc x gauss | dec x gauss |"
    if args.baseline:
        head += " enc vs base | dec vs base |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for k in kinds:
        for c in codecs:
            for lib_name in libs:
                m, x = med[(k, c, lib_name)], xg[(k, c, lib_name)]
                row = (f"| {k} | {c} | {lib_name} | {m['ratio']:.3f} | {m['enc']:.3f} | "
                       f"{m['dec']:.3f} | {x['enc']:.2f} | {x['dec']:.2f} |")
                if args.baseline:
                    b = vs_base[(k, c, lib_name)]
                    row += f" {b['enc']:.2f} | {b['dec']:.2f} |"
                print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
