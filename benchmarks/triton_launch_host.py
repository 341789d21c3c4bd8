"""Host time of the Triton codec's launches and calls, measured without a GPU.

What the host spends in triton's Python and in the launchers before the
driver's launch: a stand-in driver names sm_90 as the target, loads no
binary and launches nothing (the real launcher's C call, a few us on a GPU
machine, is not included). The kernels are compiled for sm_90 on first use
(triton's cache makes later runs quick).

Two tables, each with both launch paths side by side in one run:

- per launch: each kernel of a 256 MiB bf16 encode and decode, through
  ``kernel[grid](...)`` (triton's binding, what the launchers did before
  ``triton_kernels/_launch.py``) and through the cached ``Launcher``;
- per call: ``encode`` then ``decode(out=)`` of 1 MiB (bf16 fixed3 and
  dense) with CPU tensors, i.e. the launchers' whole host path, torch ops
  included (on CPU, not CUDA: a CUDA op's host cost is not measured here).
  The stand-in analyze launch zeroes its segment lengths so the call goes
  on as for an empty payload.

Medians of 5 runs of N calls after a warm-up, for 3 rounds::

    python benchmarks/triton_launch_host.py [--calls N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("triton_launch_host: unset TRITON_INTERPRET; this times the compiled-kernel path")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from zipccl_fsdp import format as F  # noqa: E402

N_LEAD = 9  # launcher arguments before the kernel's own: grid x3, stream, function, ...


class _Utils:
    @staticmethod
    def load_binary(name, kernel, shared, device):
        # module (not None: triton loads again on every launch while it is
        # None), function handle, registers, spills, max threads
        return "module", 1000 + len(_COMPILED), 0, 0, 1024

    @staticmethod
    def get_device_properties(device):
        return {"max_shared_mem": 232448}


def _noop(*args):
    return None


def _zero_seg(*args):
    args[N_LEAD + 2].zero_()  # (x, meta, seg, ...): the segment lengths


class _NoLaunchDriver:
    """The parts of triton's CUDA driver that a launch reads, for sm_90."""
    utils = _Utils()

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    @staticmethod
    def launcher_cls(src, metadata):
        fn = _zero_seg if "analyze" in src.name else _noop
        tag = len(_COMPILED)  # which compiled kernel a launch went to
        _COMPILED.append(src.name)

        def launcher(*args):
            if _RECORD is not None:
                _RECORD.append((tag, args[:5], args[5], args[N_LEAD:]))
            return fn(*args)
        return launcher


_COMPILED: list = []
_RECORD: list | None = None


def _plain(record):
    """A launch record with tensors as (dtype, address), comparable with ==."""
    tag, grid, packed, args = record
    return tag, grid, packed, tuple((a.dtype, a.data_ptr()) if isinstance(a, torch.Tensor)
                                    else a for a in args)


def check_direct_launch() -> None:
    """The cached Launcher hands the driver's launcher exactly what
    ``kernel[grid]`` does, the same compiled kernel included, for aligned
    and misaligned inputs and for a size whose chunk count is 1 (triton
    specializes an int 1 as a constant) or not a multiple of 16."""
    global _RECORD
    from triton_kernels import _launch
    from triton_kernels import codec_decode as D
    from triton_kernels import codec_encode as E
    info = F.dtype_info(torch.bfloat16)
    C = F.CHUNK_ELEMS
    buf = torch.zeros(1 << 16, dtype=torch.int16)
    meta = torch.zeros((16, E.META_COLS), dtype=torch.int32)
    seg = torch.zeros(64, dtype=torch.int32)
    cum = torch.zeros(64, dtype=torch.int64)
    out = torch.zeros(1 << 16, dtype=torch.uint8)
    err = torch.zeros(1, dtype=torch.int32)
    checked = 0
    for codec in ("fixed3", "dense"):
        table, dec = D.launchers(info, codec, C)
        for x, numel in ((buf, 3 * C + 5), (buf[1:], 20 * C), (buf, 100), (buf[1:], C + 1)):
            nch = F.nchunks_for(numel, C)
            (an, a_const, _), (wr, w_const, _) = E.launch_plan(info, codec, C)
            a, w = E.launchers(info, codec, C, E.pairs(an, a_const, info, numel, C, x.data_ptr()),
                               E.pairs(wr, w_const, info, numel, C, x.data_ptr()))
            for run in (lambda: a(nch, x, meta, seg, numel, nch, C),
                        lambda: w(nch, x, meta, seg, cum, out, numel, nch, C, 96, 4096 + nch),
                        lambda: table(triton.cdiv(nch, D.TABLE_BLOCK), out, cum, err, 96, nch,
                                      numel, C),
                        lambda: dec(nch, out, cum, cum, x, err, 96, nch, numel, C, 4096,
                                    2, 3, 5, 7)):
                got = []
                for direct in (False, True, True):  # triton's path; a miss; a hit
                    _launch.DIRECT = direct
                    _RECORD = []
                    run()
                    got.append(_RECORD)
                _RECORD = None
                got = [[_plain(r) for r in g] for g in got]
                assert len(got[0]) == 1 and got[0] == got[1] == got[2], (codec, numel, got)
                checked += 1
    _launch.DIRECT = True
    print(f"direct launches match kernel[grid]: {checked} cases, "
          f"{len(_COMPILED)} compiled kernels")


def launches(codec: str = "fixed3") -> dict:
    """The four launches of a 256 MiB bf16 encode and decode, with the
    launchers' own Launchers (the tensors are small: a launch reads their
    addresses, not their sizes)."""
    from triton_kernels import codec_decode as D
    from triton_kernels import codec_encode as E
    C, numel = F.CHUNK_ELEMS, 128 << 20
    nch = F.nchunks_for(numel, C)
    info = F.dtype_info(torch.bfloat16)
    x = torch.zeros(1 << 16, dtype=torch.int16)
    meta = torch.zeros((16, E.META_COLS), dtype=torch.int32)
    seg = torch.zeros(64, dtype=torch.int32)
    cum = torch.zeros(64, dtype=torch.int64)
    out = torch.zeros(1 << 16, dtype=torch.uint8)
    err = torch.zeros(1, dtype=torch.int32)
    (an, a_const, _), (wr, w_const, _) = E.launch_plan(info, codec, C)
    a, w = E.launchers(info, codec, C, E.pairs(an, a_const, info, numel, C, x.data_ptr()),
                       E.pairs(wr, w_const, info, numel, C, x.data_ptr()))
    table, dec = D.launchers(info, codec, C)
    return {
        "encode: analyze": lambda: a(nch, x, meta, seg, numel, nch, C),
        "encode: write": lambda: w(nch, x, meta, seg, cum, out, numel, nch, C, 96, 4096),
        "decode: table": lambda: table(triton.cdiv(nch, D.TABLE_BLOCK), out, cum, err, 96, nch,
                                       numel, C),
        "decode: decode": lambda: dec(nch, out, cum, cum, x, err, 96, nch, numel, C, 4096,
                                      2, 3, 5, 7),
    }


def calls() -> dict:
    """encode + decode(out=) of 1 MiB of bf16, per codec."""
    from triton_kernels import codec_decode as D
    from triton_kernels import codec_encode as E
    x = torch.randn(1 << 19).bfloat16()
    out = torch.empty_like(x)

    def call(codec):
        p = E.encode(x, codec)
        D.decode(p, F.parse_header(p), out)

    # parse_header is the caller's (every collective parses the header it
    # received before decoding); it is timed here too.
    return {f"1 MiB {codec} encode+decode": (lambda c=codec: call(c))
            for codec in ("fixed3", "dense")}


def _median_us(fn, n: int) -> float:
    for _ in range(max(1, n // 10)):
        fn()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=1000, help="calls per timed run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--check", action="store_true",
                   help="only check that cached launches match kernel[grid] (a test runs it)")
    args = p.parse_args()
    from triton_kernels import _launch
    driver.set_active(_NoLaunchDriver())
    if args.check:
        check_direct_launch()
        return
    fns = {**launches(), **calls()}
    for fn in fns.values():
        fn()  # compile (or load from triton's cache), then fill the Launchers' caches
    print(f"triton host time in us (no-op launcher; triton {triton.__version__}; median of "
          f"5 x {args.calls}); kernel[grid] path -> cached Launcher")
    for rnd in range(args.rounds):
        row = []
        for name, fn in fns.items():
            got = []
            for direct in (False, True):
                _launch.DIRECT = direct
                got.append(_median_us(fn, args.calls))
            row.append(f"{name} {got[0]:.1f} -> {got[1]:.1f}")
        _launch.DIRECT = True
        print(f"  round {rnd}: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main()
