"""Host time of the Triton codec's launches and calls, measured without a GPU.

What the host spends in triton's Python and in the launchers before the
driver's launch: a stand-in driver names sm_90 as the target, loads no
binary and launches nothing (the real launcher's C call, a few us on a GPU
machine, is not included). The kernels are compiled for sm_90 on first use
(triton's cache makes later runs quick).

Two tables, each with both launch paths side by side in one run:

- per launch: the kernel of a 256 MiB bf16 encode and of its decode
  (format v2: one each), through ``kernel[grid](...)`` (triton's binding)
  and through the cached ``Launcher`` (``triton_kernels/_launch.py``);
- per call: ``encode`` then ``decode_into`` (``decode(out=)``: no header
  read on the host) of 1 MiB (bf16, each codec whose v2 kernels this build
  has) with CPU tensors, i.e. the launchers' whole host path, torch ops
  included (on CPU, not CUDA: a CUDA op's host cost is not measured here).
  The stand-in launch leaves the body length 0, so the call goes on as for
  an empty body. One more row makes the fixed3 calls through
  ``zipccl_fsdp.encode`` / ``decode(out=)``: what the public API's checks
  and backend dispatch add (the triton backend taken for CPU tensors).

Medians of 5 runs of N calls after a warm-up, for 3 rounds, in wall-clock
time, and for the cached Launcher also in CPU time of the calling thread::

    python benchmarks/triton_launch_host.py [--calls N] [--cached-only]
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
        fn = _noop
        tag = len(_COMPILED)  # which compiled kernel a launch went to
        _COMPILED.append(src.name)

        def launcher(*args):
            if _RECORD is not None:
                _RECORD.append((tag, args[:5], args[5], args[N_LEAD:]))
            return fn(*args)
        return launcher


_COMPILED: list = []
_RECORD: list | None = None


def _plain(record, addresses_only: bool = False):
    """A launch record with tensors as (dtype, address) (or as the address),
    comparable with ==."""
    tag, grid, packed, args = record
    return tag, grid, packed, tuple(
        (a.data_ptr() if addresses_only else (a.dtype, a.data_ptr()))
        if isinstance(a, torch.Tensor) else a for a in args)


KERNEL_CODECS = ("fixed3", "dense")  # the codecs with kernels (raw needs none)


def _runs(codec: str, x, numel: int, by_address: bool = False, bound: bool = False) -> list:
    """The encode and decode launches of ``numel`` elements read from ``x``
    (``bound``: through ``Launcher.bind`` of the int arguments after the
    addresses, as the codec's plans launch)."""
    from zipccl_fsdp.triton_kernels import codec_decode as D
    from zipccl_fsdp.triton_kernels import codec_encode as E
    info = F.dtype_info(torch.bfloat16)
    C = F.CHUNK_ELEMS
    nch = F.nchunks_for(numel, C)
    header = F.Header(codec, torch.bfloat16, (numel,), numel, C, nch, 0)
    out = torch.zeros(1 << 16, dtype=torch.uint8)
    scratch = torch.zeros(E.region_nwords(nch), dtype=torch.int64)
    err = torch.zeros(1, dtype=torch.int32)
    enc = E.launcher(info, codec, C)
    dec = D.launcher(info, C)
    args = E.launch_args(enc.kernel, x, out, scratch, numel, nch, C, header)
    dargs = (out, x, err, 4096 + 16 * nch, numel, nch, C, F.nchunks_for(numel), 0)
    if bound:  # Launcher.bind: the leading arguments only, the pointers as addresses
        eb, db = enc.bind(args[5:]), dec.bind(dargs[4:])
        return [lambda: eb(nch, _addresses(args[:5]), lambda: args),
                lambda: db(nch, _addresses(dargs[:4]), lambda: dargs)]
    if by_address:  # Launcher.by_address, the pointers as addresses
        return [lambda: enc.by_address(nch, _addresses(args), lambda: args),
                lambda: dec.by_address(nch, _addresses(dargs), lambda: dargs)]
    return [lambda: enc(nch, *args), lambda: dec(nch, *dargs)]


def _addresses(args: tuple) -> tuple:
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)


def check_direct_launch() -> None:
    """The cached Launcher hands the driver's launcher exactly what
    ``kernel[grid]`` does, the same compiled kernel included, for aligned
    and misaligned inputs and for a size whose chunk count is 1 (triton
    specializes an int 1 as a constant) or not a multiple of 16, through
    ``Launcher``, ``Launcher.by_address`` and ``Launcher.bind``."""
    global _RECORD
    from zipccl_fsdp.triton_kernels import _launch
    from zipccl_fsdp.triton_kernels import codec_decode as D
    from zipccl_fsdp.triton_kernels import codec_encode as E
    C = F.CHUNK_ELEMS
    buf = torch.zeros(1 << 16, dtype=torch.int16)
    checked = 0
    for codec in KERNEL_CODECS:
        for x, numel in ((buf, 3 * C + 5), (buf[1:], 20 * C), (buf, 100), (buf[1:], C + 1)):
            for by_address, bound in ((False, False), (True, False), (True, True)):
                for run in _runs(codec, x, numel, by_address, bound):
                    got = []
                    for direct in (False, True, True):  # triton's path; a miss; a hit
                        _launch.DIRECT = direct
                        _RECORD = []
                        run()
                        got.append(_RECORD)
                    _RECORD = None
                    # by address: the launcher gets ints where triton passes tensors
                    got = [[_plain(r, by_address) for r in g] for g in got]
                    assert len(got[0]) == 1 and got[0] == got[1] == got[2], (codec, numel, got)
                    checked += 1
    # One Bound across calls of different alignments (as a codec plan's is,
    # for inputs at any address): each call gets the kernel triton picks.
    for codec in KERNEL_CODECS:
        for numel in (3 * C + 5, 1):
            views = (buf, buf[1:], buf[8:], buf[1:])
            info = F.dtype_info(torch.bfloat16)
            el, dl = E.launcher(info, codec, C), D.launcher(info, C)
            nch = F.nchunks_for(numel, C)
            header = F.Header(codec, torch.bfloat16, (numel,), numel, C, nch, 0)
            out = torch.zeros(1 << 16, dtype=torch.uint8)
            scratch = torch.zeros(E.region_nwords(nch), dtype=torch.int64)
            err = torch.zeros(1, dtype=torch.int32)
            eb = el.bind(E.launch_args(el.kernel, buf, out, scratch, numel, nch, C, header)[5:])
            db = dl.bind((numel, nch, C, F.nchunks_for(numel), 0))
            for v in views + views:
                ea = E.launch_args(el.kernel, v, out, scratch, numel, nch, C, header)
                da = (out, v, err, 4096 + 16 * nch) + db.fixed
                for launcher, b, a, n_head in ((el, eb, ea, 5), (dl, db, da, 4)):
                    got = []
                    for direct in (False, True):
                        _launch.DIRECT = direct
                        _RECORD = []
                        if direct:
                            b(nch, _addresses(a[:n_head]), lambda a=a: a)
                        else:
                            launcher(nch, *a)
                        got.append([_plain(r, True) for r in _RECORD])
                    _RECORD = None
                    assert len(got[0]) == 1 and got[0] == got[1], (codec, numel, got)
                    checked += 1
    _launch.DIRECT = True
    # The codec's own calls: a Launcher's first by_address call checks that
    # the addresses are those of the tensors triton's path gets.
    for codec in KERNEL_CODECS:
        for n in (C + 3, 5 * C):
            x = torch.randn(n).bfloat16()
            for _ in range(2):
                D.decode_into(E.encode(x, codec), torch.empty_like(x))
    print(f"direct launches match kernel[grid]: {checked} cases, "
          f"{len(_COMPILED)} compiled kernels")


def launches(codec: str = "fixed3") -> dict:
    """The encode and the decode launch of 256 MiB of bf16, with the
    launchers' own Launchers (the tensors are small: a launch reads their
    addresses, not their sizes)."""
    enc, dec = _runs(codec, torch.zeros(1 << 16, dtype=torch.int16), 128 << 20)
    return {"encode": enc, "decode": dec}


def calls() -> dict:
    """encode + decode(out=) of 1 MiB of bf16, per codec."""
    from zipccl_fsdp.triton_kernels import codec_decode as D
    from zipccl_fsdp.triton_kernels import codec_encode as E
    x = torch.randn(1 << 19).bfloat16()
    out = torch.empty_like(x)

    def call(codec):
        D.decode_into(E.encode(x, codec), out)

    def public(codec):  # zipccl_fsdp's argument checks and backend dispatch too
        z.decode(z.encode(x, codec=codec, backend="triton"), out=out, backend="triton")

    import zipccl_fsdp as z
    from zipccl_fsdp import backends
    backends.triton_usable = lambda device: True  # a CPU tensor stands in for a CUDA one
    backends._RESOLVED.clear()  # backends resolved before the stand-in (none, in this script)
    rows = {f"1 MiB {c} encode+decode(out=)": (lambda c=c: call(c)) for c in KERNEL_CODECS}
    rows["1 MiB fixed3 zipccl_fsdp.encode+decode(out=)"] = lambda: public("fixed3")
    return rows


def _median_us(fn, n: int) -> tuple:
    """(wall-clock, CPU time of this thread) per call in us, each the median
    of 5 runs of n calls: CPU time leaves out the time the process waits for
    a core, which a loaded machine adds to the wall clock."""
    for _ in range(max(1, n // 10)):
        fn()
    wall, cpu = [], []
    for _ in range(5):
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(n):
            fn()
        cpu.append((time.thread_time() - c) / n * 1e6)
        wall.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=1000, help="calls per timed run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cached-only", action="store_true",
                   help="time the cached Launcher path only (not kernel[grid]): quicker runs")
    p.add_argument("--check", action="store_true",
                   help="only check that cached launches match kernel[grid] (a test runs it)")
    args = p.parse_args()
    from zipccl_fsdp.triton_kernels import _launch
    driver.set_active(_NoLaunchDriver())
    if args.check:
        check_direct_launch()
        return
    fns = {**launches(), **calls()}
    for fn in fns.values():
        fn()  # compile (or load from triton's cache), then fill the Launchers' caches
    paths = (True,) if args.cached_only else (False, True)
    print(f"triton host time in us (no-op launcher; triton {triton.__version__}; median of "
          f"5 x {args.calls}); " + ("cached Launcher" if args.cached_only else
                                    "kernel[grid] path -> cached Launcher") + " (its CPU time)")
    for rnd in range(args.rounds):
        row = []
        for name, fn in fns.items():
            got = []
            for direct in paths:
                _launch.DIRECT = direct
                got.append(_median_us(fn, args.calls))
            row.append(f"{name} " + "".join(f"{w:.1f} -> " for w, _ in got[:-1])
                       + f"{got[-1][0]:.1f} (cpu {got[-1][1]:.1f})")
        _launch.DIRECT = True
        print(f"  round {rnd}: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main()
