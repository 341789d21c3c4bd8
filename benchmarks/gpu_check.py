"""One-shot GPU check of the Triton codec: bitwise agreement with the torch
backend, then throughput beside a device-to-device copy.

Run from the repository root on a CUDA machine (the package need not be
installed)::

    python benchmarks/gpu_check.py --out results/

(a) For bf16, fp16 and fp32 and every codec, at sizes including odd ones and
    special bit patterns: the triton payload equals the torch backend's byte
    for byte, and each backend decodes the other's payload bit-exactly.
    A few corrupt payloads must raise CorruptPayloadError. Then what the
    kernels' self-check under backend="auto" decided per dtype and codec.
(b) GB/s (input bytes / time; CUDA events, warmup, median of several) of
    triton encode and decode for fixed3 and dense on Gaussian bf16 at 4 MiB
    to 1 GiB, and at 256 MiB on the chunks real traffic makes beside
    Gaussian ones: fp32 bf16-casts (LOW16), bf16 and fp32 x * mask (30%
    zeros of both signs: the zero paths), fp32 sums of 8 bf16 values
    (LOWBYTE: lm_head's gradient under torchtitan's chunked loss), fp32 with
    3/4 of its chunks +0.0 (ZERO chunks: an embedding gradient's unused
    rows), and Gaussian fp16 (fixed3), beside ``Tensor.copy_`` of the same
    bytes; the torch backend at 64 MiB for comparison.
(c) Where a fixed3 call's time goes: wall time beside each kernel's device
    time (torch.profiler), and the host's time by function (cProfile).
(d) The compressed collectives and zipccl's DDP hook on this device
    (tests/device_collectives.py): 2 gloo ranks sharing it, results bit for
    bit against CPU references.

Prints one table and writes it as ``gpu_check.md`` and ``gpu_check.csv`` in
``--out``. A failing case prints its error and the run continues; the exit
status is 1 if any correctness check failed. ``--smoke`` runs tiny sizes on
CPU under TRITON_INTERPRET=1 (set here when no GPU is present) to test this
script itself. ``--sweep`` also times the fixed3 kernels at a few warp counts
and its decode at 1, 2, 4 and 8 chunks a program, at 256 MiB bf16 (7
settings, each compiled anew: a minute or two more).
"""
from __future__ import annotations

import argparse
import cProfile
import csv
import datetime
import os
import pstats
import statistics
import sys
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

MiB = 1 << 20
TARGETS = "targets on an H200 at 256 MiB bf16: encode >= 1000 GB/s, decode >= 1500 GB/s"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=".", help="directory for gpu_check.md and gpu_check.csv")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes; without CUDA, CPU tensors under TRITON_INTERPRET=1")
    p.add_argument("--sweep", action="store_true",
                   help="also time fixed3 at a few warp counts and decode chunks a program "
                   "(256 MiB bf16)")
    p.add_argument("--reps", type=int, default=7, help="timed repetitions per case (median)")
    return p.parse_args()


ARGS = parse_args()
if not torch.cuda.is_available():
    if not ARGS.smoke:
        sys.exit("gpu_check: no CUDA device; use --smoke to test the script on CPU")
    # Triton reads this when @triton.jit decorates the kernels, i.e. on import.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402

import zipccl_fsdp as z  # noqa: E402
from zipccl_fsdp import backends as zbackends  # noqa: E402
from zipccl_fsdp import format as F  # noqa: E402
from zipccl_fsdp.triton_kernels import codec_decode, codec_encode  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
INT_VIEW = {2: torch.int16, 4: torch.int32}
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
FAILURES = []


def bits(t):
    return t.reshape(-1).view(INT_VIEW[t.element_size()])


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------
SPECIAL = {
    torch.float32: [0x7FC00000, 0x7F800001, 0xFFC12345, 0x7FFFFFFF, 0x7F800000, 0xFF800000,
                    0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF],
    torch.float16: [0x7E00, 0x7C01, 0xFE55, 0x7FFF, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x0001,
                    0x83FF, 0x7BFF, 0xFBFF],
    torch.bfloat16: [0x7FC0, 0x7F81, 0xFFC5, 0x7FFF, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001,
                     0x807F, 0x7F7F, 0xFF7F],
}


def mixed(n: int, dtype, seed: int = 0) -> torch.Tensor:
    """Chunk-sized stretches of different data: Gaussian with special bit
    patterns sprinkled in, random bits, 60% zeros, tiny sigma, bf16 casts."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    size = torch.empty(0, dtype=dtype).element_size()
    x = torch.randn(n, generator=g, device=DEV).to(dtype)
    C = F.CHUNK_ELEMS
    for c in range(-(-n // C)):
        lo, hi = c * C, min(n, (c + 1) * C)
        kind = c % 5
        if kind == 1:
            r = torch.randint(-(1 << (8 * size - 1)), 1 << (8 * size - 1), (hi - lo,),
                              generator=g, device=DEV)
            x[lo:hi] = r.to(INT_VIEW[size]).view(dtype)
        elif kind == 2:
            x[lo:hi][torch.rand(hi - lo, generator=g, device=DEV) < 0.6] = 0
        elif kind == 3:
            x[lo:hi] = (torch.randn(hi - lo, generator=g, device=DEV) * 3e-4).to(dtype)
        elif kind == 4:
            x[lo:hi] = torch.randn(hi - lo, generator=g, device=DEV).bfloat16().to(dtype)
    words = torch.tensor(SPECIAL[dtype], dtype=torch.int64)
    words = torch.where(words >= 1 << (8 * size - 1), words - (1 << (8 * size)), words)
    sp = words.to(INT_VIEW[size]).view(dtype).to(DEV)
    if n:
        idx = torch.randint(0, n, (min(n, 3 * sp.numel()),), generator=g, device=DEV)
        x[idx] = sp.repeat(3)[: idx.numel()]
    return x


# --------------------------------------------------------------------------
# (a) correctness
# --------------------------------------------------------------------------
def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"  {'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        FAILURES.append(name)


def correctness(sizes) -> None:
    print(f"(a) triton vs torch backend on {DEV.type}, sizes {sizes}", flush=True)
    for dtype in DTYPES:
        for codec in z.CODECS:
            for n in sizes:
                name = f"{SHORT[dtype]} {codec} n={n}"
                try:
                    x = mixed(n, dtype, seed=n)
                    pt = z.encode(x, codec=codec, backend="torch")
                    pg = z.encode(x, codec=codec, backend="triton")
                    same = pt.numel() == pg.numel() and torch.equal(pt, pg)
                    yg = z.decode(pt, backend="triton")
                    yt = z.decode(pg, backend="torch")
                    dec = torch.equal(bits(yg), bits(x)) and torch.equal(bits(yt), bits(x))
                    check(name, same and dec,
                          f"bytes {'equal' if same else f'DIFFER ({pt.numel()} vs {pg.numel()})'}, "
                          f"cross decode {'bit-exact' if dec else 'WRONG'}")
                except Exception as e:  # keep going: report every case
                    check(name, False, f"raised {type(e).__name__}: {e}")
                    traceback.print_exc()
    corrupt_checks()


def corrupt_checks() -> None:
    x = mixed(3 * F.CHUNK_ELEMS + 5, torch.float16, seed=7)
    for codec in ("fixed3", "dense"):
        p = z.encode(x, codec=codec, backend="torch")
        h = F.parse_header(p)
        cases = {
            "table mode byte": lambda b: b.__setitem__(h.table_offset, 7),
            "body bytes": lambda b: b.__setitem__(slice(h.body_offset, h.body_offset + 64), 0xFF),
            "esc count": lambda b: b.__setitem__(h.table_offset + 6, b[h.table_offset + 6] ^ 1),
            "segment offset": lambda b: b.__setitem__(h.offsets_offset + 4,
                                                      b[h.offsets_offset + 4] ^ 1),
            "header numel": lambda b: b.__setitem__(9, b[9] ^ 1),
        }
        for what, mutate in cases.items():
            for how, dec in (("", lambda b: z.decode(b, backend="triton")),
                             (" out=", lambda b: z.decode(b, out=torch.empty_like(x),
                                                          backend="triton"))):
                b = p.clone()
                mutate(b)
                try:
                    dec(b)
                    check(f"corrupt {codec} {what}{how}", False, "did not raise")
                except z.CorruptPayloadError as e:
                    check(f"corrupt {codec} {what}{how}", True, f"raised: {e}")
                except Exception as e:
                    check(f"corrupt {codec} {what}{how}", False,
                          f"raised {type(e).__name__}: {e}")


def self_check() -> None:
    """What the Triton kernels' self-check under backend="auto" decided on
    this device, per dtype and codec (zipccl_fsdp/backends.py): "triton",
    or "torch" with the warning it gave. Without CUDA ("auto" takes the
    kernels on CUDA only) the check itself is run, under the interpreter."""
    print(f"(a) self-check of the Triton kernels under backend='auto' on {DEV}", flush=True)
    for dtype in DTYPES:
        for codec in z.CODECS:
            with warnings.catch_warnings(record=True) as got:
                warnings.simplefilter("always")
                if DEV.type == "cuda":
                    used = zbackends.module("auto", DEV, dtype, codec).__name__
                    detail = "; ".join(str(w.message) for w in got)
                else:
                    detail = zbackends.run(DEV, dtype, codec) or ""
                    used = "torch" if detail else "triton"
            verdict = "triton" if "triton" in used else "torch"
            ROWS.append(dict(data="self-check", dtype=SHORT[dtype], op="auto backend",
                             backend=verdict, codec=codec, error=detail[:200]))
            check(f"self-check {SHORT[dtype]} {codec}", verdict == "triton",
                  f"auto uses {verdict}" + (f": {detail}" if detail else ""))


# --------------------------------------------------------------------------
# (b) throughput
# --------------------------------------------------------------------------
def timeit(fn, reps: int) -> float:
    """Median seconds of fn() over reps runs after warmup."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if DEV.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


ROWS = []


def bench_row(data: str, x: torch.Tensor, op: str, backend: str, codec: str, fn, copy_s,
              ratio=None, reps=None) -> None:
    nbytes = x.numel() * x.element_size()
    row = dict(data=data, dtype=SHORT[x.dtype], MiB=round(nbytes / MiB, 3), op=op,
               backend=backend, codec=codec)
    try:
        s = timeit(fn, reps or ARGS.reps)
        row.update(ms=round(s * 1e3, 4), GBps=round(nbytes / s / 1e9, 1),
                   ratio=None if ratio is None else round(ratio, 4),
                   copy_GBps=round(nbytes / copy_s / 1e9, 1) if copy_s else None,
                   vs_copy=round(copy_s / s, 3) if copy_s else None, error="")
    except Exception as e:  # one failure must not end the run
        row.update(error=f"{type(e).__name__}: {e}"[:200])
        traceback.print_exc()
    ROWS.append(row)
    print("  " + "  ".join(f"{k}={v}" for k, v in row.items() if v not in ("", None)), flush=True)


def bench_tensor(data: str, x: torch.Tensor, backends=("triton",), codecs=("fixed3", "dense"),
                 reps=None, encode_warps=None, decode_tuning=None) -> None:
    """Encode and decode rows of ``x`` per backend and codec beside a copy of
    its bytes; ``encode_warps``: the triton encoder at that many warps a
    program (codec_encode.encode's argument) instead of its default;
    ``decode_tuning``: the triton decoder's shape of programs
    (codec_decode.Tuning) instead of its default."""
    copy_s = None
    try:
        dst = torch.empty_like(x)
        copy_s = timeit(lambda: dst.copy_(x), reps or ARGS.reps)
        dst = None  # free it (not del: the lambda above refers to it)
    except Exception as e:
        print(f"  copy failed: {e}")
    for backend in backends:
        for codec in codecs:
            if backend == "triton":
                # Each codec's decode timed with its own kernel: a decode plan
                # that has seen both codecs at one size keeps the kernel of both
                # (codec_decode._Plan).
                codec_decode.reset()

            def enc(codec=codec, backend=backend):
                if encode_warps is None:
                    return z.encode(x, codec=codec, backend=backend)
                return codec_encode.encode(x, codec, encode_warps)
            try:
                p = enc()
                ratio = x.numel() * x.element_size() / p.numel()
                out = torch.empty_like(x)
            except Exception as e:
                print(f"  {backend} {codec} encode failed: {type(e).__name__}: {e}")
                traceback.print_exc()
                ROWS.append(dict(data=data, dtype=SHORT[x.dtype], op="encode", backend=backend,
                                 codec=codec, error=f"{type(e).__name__}: {e}"[:200]))
                continue
            bench_row(data, x, "encode", backend, codec, enc, copy_s, ratio, reps)
            def dec(backend=backend):
                if decode_tuning is None:
                    return z.decode(p, out=out, backend=backend)
                return codec_decode.decode_into(p, out, decode_tuning)
            bench_row(data, x, "decode", backend, codec, dec, copy_s, ratio, reps)
            if not torch.equal(bits(out), bits(x)):
                check(f"bench {data} {backend} {codec} round trip", False, "decode differs")
            p = out = None  # free them (the lambdas above refer to them)


def throughput(smoke: bool) -> None:
    print(f"(b) throughput on {torch.cuda.get_device_name() if DEV.type == 'cuda' else 'CPU'}; "
          f"{TARGETS}", flush=True)
    sizes = [16 * 1024 + 6] if smoke else [4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB]
    reps = 1 if smoke else None
    for nbytes in sizes:
        g = torch.Generator(device=DEV).manual_seed(0)
        x = torch.randn(nbytes // 2, generator=g, device=DEV).bfloat16()
        bench_tensor(f"gauss bf16 {nbytes / MiB:g} MiB", x, reps=reps)
        if nbytes == (64 * MiB if not smoke else sizes[0]):
            bench_tensor(f"gauss bf16 {nbytes / MiB:g} MiB", x, backends=("torch",), reps=reps)
        if nbytes == (256 * MiB if not smoke else sizes[0]):
            x32 = torch.randn(nbytes // 4, generator=g, device=DEV).bfloat16().float()
            bench_tensor(f"fp32 bf16-casts {nbytes / MiB:g} MiB", x32, reps=reps)
            # x * mask: 30% zeros of both signs, every chunk through the
            # zero paths (fixed3's _encode_zero_pairs / _words and
            # _decode_zero_pairs / _words, dense's _encode_zeros /
            # _decode_zeros)
            keep = torch.rand(nbytes // 2, generator=g, device=DEV) >= 0.3
            bench_tensor(f"x*mask bf16 {nbytes / MiB:g} MiB", x * keep.to(x.dtype), reps=reps)
            bench_tensor(f"x*mask fp32 {nbytes / MiB:g} MiB", x32 * keep[: x32.numel()].float(),
                         reps=reps)
            del keep
            # sums of 8 bf16 values in fp32: LOWBYTE chunks (the general paths)
            tails = x32.clone()
            for _ in range(7):
                tails += torch.randn(x32.numel(), generator=g, device=DEV).bfloat16().float()
            bench_tensor(f"fp32 sums of 8 bf16 {nbytes / MiB:g} MiB", tails, reps=reps)
            del tails
            # ZERO chunks: the last 3/4 of the tensor +0.0 (an embedding
            # gradient's unused rows run for whole chunks)
            x32[x32.numel() // 4:] = 0
            bench_tensor(f"fp32 3/4 zero chunks {nbytes / MiB:g} MiB", x32, reps=reps)
            del x32
            x16 = torch.randn(nbytes // 2, generator=g, device=DEV).half()
            bench_tensor(f"gauss fp16 {nbytes / MiB:g} MiB", x16, codecs=("fixed3",), reps=reps)
            del x16
        del x
        if DEV.type == "cuda":
            torch.cuda.empty_cache()


def sweep(smoke: bool) -> None:
    """Time the encode kernels at a few warp counts (codec_encode.encode's
    ``warps``; the decode kernels' are codec_decode.Tuning's, at one chunk a
    program), then the fixed3 decode at 4 warps and 1, 2, 4 and 8 chunks a
    program (``Tuning.per_choices``). The dense kernels take 4 warps only
    (32 elements a thread of a 4096-element chunk)."""
    n = (16 * 1024 + 6) if smoke else 128 * MiB  # bf16 elements: 256 MiB
    x = torch.randn(n, generator=torch.Generator(device=DEV).manual_seed(0), device=DEV).bfloat16()
    print(f"(sweep) encode/decode num_warps at {n * 2 / MiB:g} MiB bf16", flush=True)
    # The warp counts at one chunk a decode program (at 2 warps, 64 elements
    # a thread, several chunks a program spill fp32's decode).
    for warps in (4, 8, 2):
        tuning = codec_decode.Tuning(warps=warps, fixed3_warps_16=warps, fixed3_warps_32=warps,
                                     per_choices=())
        bench_tensor(f"sweep fixed3 warps={warps}", x, codecs=("fixed3",),
                     reps=1 if smoke else 5, encode_warps=warps, decode_tuning=tuning)
    for per in (1, 2, 4, 8):
        # at 4 warps; at the smoke size too, several chunks a program
        wanted = 1 if smoke else codec_decode.TUNING.programs_wanted
        tuning = codec_decode.Tuning(fixed3_warps_16=4, fixed3_warps_32=4,
                                     per_choices=(per,) if per > 1 else (), programs_wanted=wanted)
        bench_tensor(f"sweep fixed3 decode chunks_per_program={per}", x, codecs=("fixed3",),
                     reps=1 if smoke else 5, decode_tuning=tuning)


def breakdown(smoke: bool) -> None:
    """Where a fixed3 call's time goes: the wall time (as in the table) beside
    the device time of each kernel and copy it launches (torch.profiler). The
    difference is time the GPU waits on the host: launches, the header, and
    the syncs (encode reads the body length; decode(out=) the error word).
    The first H200 run suggested ~0.4 ms of it per 256 MiB call (the 256 MiB
    and 1 GiB rows do not scale by 4); this measures it."""
    from torch.profiler import ProfilerActivity, profile
    cuda = DEV.type == "cuda"
    n = (16 * 1024 + 6) if smoke else 128 * MiB
    x = torch.randn(n, generator=torch.Generator(device=DEV).manual_seed(0), device=DEV).bfloat16()
    p = z.encode(x, codec="fixed3", backend="triton")
    out = torch.empty_like(x)
    reps = 1 if smoke else 5
    print(f"(c) where the time goes, fixed3, {n * 2 / MiB:g} MiB bf16 "
          f"({'device' if cuda else 'CPU: smoke only'} time per call)", flush=True)
    for op, fn in (("encode", lambda: z.encode(x, codec="fixed3", backend="triton")),
                   ("decode", lambda: z.decode(p, out=out, backend="triton"))):
        wall = timeit(fn, reps)
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(reps):
                fn()
            if cuda:
                torch.cuda.synchronize()
        busy = {}
        for e in prof.events():
            if str(e.device_type).endswith("CUDA" if cuda else "CPU"):
                t = getattr(e, "device_time", None) if cuda else e.cpu_time
                t = t if t is not None else getattr(e, "cuda_time", 0)
                busy[e.name] = busy.get(e.name, 0.0) + t / 1e3 / reps  # us -> ms per call
        total = sum(busy.values()) if cuda else None
        for name, ms in sorted(busy.items(), key=lambda kv: -kv[1])[:8]:
            ROWS.append(dict(data=f"breakdown {op}", dtype="bf16", MiB=round(n * 2 / MiB, 3),
                             op=f"{op}: {name[:40]}", backend="triton", codec="fixed3",
                             ms=round(ms, 4), error=""))
        ROWS.append(dict(data=f"breakdown {op}", dtype="bf16", MiB=round(n * 2 / MiB, 3),
                         op=f"{op}: wall / device busy", backend="triton", codec="fixed3",
                         ms=round(wall * 1e3, 4),
                         vs_copy=None if total is None else round(total / (wall * 1e3), 3),
                         error="" if cuda else "CPU: device times not measured"))
        print(f"  {op}: wall {wall * 1e3:.3f} ms" + (
            f", device busy {total:.3f} ms ({total / (wall * 1e3):.0%})" if cuda else "")
            + "; " + ", ".join(f"{k[:30]} {v:.3f}" for k, v in
                               sorted(busy.items(), key=lambda kv: -kv[1])[:4]), flush=True)
        host_profile(op, fn, reps, n)


# The host steps of a codec call whose time section (c) reports with their
# callees: Triton launches (triton_kernels/_launch.py's Launcher, and
# JITFunction.run on a specialization's first call), the syncs (tolist, item,
# and parse_header's read of the header), the header upload.
HOST_STEPS = ("jit.py:run", "_launch.py:__call__", "'tolist'", "'item'", "format.py:parse_header",
              "format.py:copy_into", "'pin_memory'", "codec_encode.py:_read_units")


def host_profile(op: str, fn, reps: int, n: int) -> None:
    """The host's side of the same calls, by function (cProfile, own time
    per call): Triton's launcher, torch ops, and the syncs (a sync's time is
    the wait for the device). Finds the cause of a wall time above the
    device's busy time. cProfile adds ~1 us to each Python call it sees, so
    Python-heavy rows read high; the total is printed beside the wall time."""
    fn()
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    for _ in range(reps):
        fn()
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    prof.disable()
    wall = (time.perf_counter() - t) / reps
    own, with_callees = {}, {}
    for (path, line, func), (_, _, tottime, cumtime, _) in pstats.Stats(prof).stats.items():
        name = f"{os.path.basename(path)}:{func}" if path != "~" else func
        own[name] = own.get(name, 0.0) + tottime * 1e3 / reps
        if any(step in name for step in HOST_STEPS):
            with_callees[name] = with_callees.get(name, 0.0) + cumtime * 1e3 / reps
    top = sorted(own.items(), key=lambda kv: -kv[1])[:8]
    steps = sorted(with_callees.items(), key=lambda kv: -kv[1])
    for label, rows in (("host", top), ("host, with callees", steps)):
        for name, ms in rows:
            ROWS.append(dict(data=f"{label} {op}", dtype="bf16", MiB=round(n * 2 / MiB, 3),
                             op=f"{op} {label}: {name[:48]}", backend="triton", codec="fixed3",
                             ms=round(ms, 4), error=""))
    print(f"  {op} host, profiled: {wall * 1e3:.3f} ms per call; own time: "
          + ", ".join(f"{k[:40]} {v:.3f}" for k, v in top[:5]) + "; with callees: "
          + ", ".join(f"{k[:40]} {v:.3f}" for k, v in steps), flush=True)


# --------------------------------------------------------------------------
# (d) the collectives on this device
# --------------------------------------------------------------------------
def collectives() -> None:
    """tests/device_collectives.py in 2 gloo ranks that share this device:
    all-gather, reduce-scatter, all-reduce and all-to-all, one-shot and
    pipelined, fixed3 and dense, with checksums, and one adaptive call (which
    calibrates on the device), each bit for bit against a reference computed
    on the CPU. On a GPU this is the first run of what CI cannot reach: the
    Triton backend inside the collectives and pipeline.py's side stream,
    stream waits and size rows. Then zipccl's DDP hook (tests/
    device_collectives.py, task_ddp_hook_on), whose calls run on a worker
    thread and stream of their own (zipccl_fsdp/background.py). Runs last:
    if it hangs, (a)-(c) are already written."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from device_collectives import task_collectives_on, task_ddp_hook_on
    from dist_utils import DistPool
    pool = DistPool(2, pg_timeout_s=120)
    try:
        for name, task in ((f"collectives on {DEV.type}, 2 gloo ranks", task_collectives_on),
                           (f"DDP hook on {DEV.type}, 2 gloo ranks", task_ddp_hook_on)):
            print(f"(d) {name}: results bit for bit against CPU references", flush=True)
            t0 = time.time()
            try:
                res = pool.run(task, DEV.type, timeout_s=300)
                check(name, res[0] == res[1] and res[0]["checked"] > 0,
                      f"{res[0]} in {time.time() - t0:.0f} s")
            except Exception as e:  # noqa: BLE001 - reported as a failure, the report written
                check(name, False, f"after {time.time() - t0:.0f} s: {str(e)[-3000:]}")
    finally:
        pool.close()


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------
COLS = ["data", "dtype", "MiB", "op", "backend", "codec", "ms", "GBps", "ratio", "copy_GBps",
        "vs_copy", "error"]


def report(quiet: bool = False) -> None:
    stamp = (f"{torch.cuda.get_device_name() if DEV.type == 'cuda' else 'CPU (interpreter)'}; "
             f"torch {torch.__version__}; triton {triton.__version__}; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    lines = ["# zipccl triton codec: gpu_check", "", stamp, "", TARGETS, "",
             "| " + " | ".join(COLS) + " |", "|" + "---|" * len(COLS)]
    for r in ROWS:
        lines.append("| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in COLS)
                     + " |")
    lines += ["", f"correctness failures: {len(FAILURES)}"] + [f"- {f}" for f in FAILURES]
    table = "\n".join(lines)
    if not quiet:
        print("\n" + table)
    os.makedirs(ARGS.out, exist_ok=True)
    with open(os.path.join(ARGS.out, "gpu_check.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(ARGS.out, "gpu_check.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS + ["stamp"])
        w.writeheader()
        for r in ROWS:
            w.writerow({**{c: r.get(c) for c in COLS}, "stamp": stamp})


def main() -> int:
    t0 = time.time()
    sizes = [0, 7, 4097] if ARGS.smoke else [0, 1, 7, 4097, 3 * 4096 + 5,
                                                               1_000_003]
    for part in (lambda: correctness(sizes), self_check, lambda: throughput(ARGS.smoke),
                 lambda: breakdown(ARGS.smoke)) + (
            (lambda: sweep(ARGS.smoke),) if ARGS.sweep else ()):
        try:
            part()
        except Exception:  # report and go on to the next part
            traceback.print_exc()
    report(quiet=True)  # written before (d), which starts processes that could hang
    collectives()
    report()
    print(f"gpu_check done in {time.time() - t0:.0f} s", flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
