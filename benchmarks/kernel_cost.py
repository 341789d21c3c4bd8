"""Static cost of the Triton codec kernels, compiled for a GPU without one.

Compiles every kernel as encode/decode launch it for 256 MiB of each dtype
(``tools/offline.py``), for sm_90 (H100/H200) by default, and
prints a table from the SASS: registers, shared memory (bytes), spills
(every local-memory store and load of the kernel, its noinline functions
included, in loops or not), instructions per element on the
kernel's longest path (loops counted as often as they run) and over all its
inline code, the cold code apart, the same along the longest path through
its zero path (a chunk with zeros to flag), the widths of global loads and
stores on the hot path, shuffles and barriers. No GPU and no timing: the figures are
deterministic for a given triton, so a change to a kernel can be judged
here, before a GPU run confirms it (``benchmarks/gpu_check.py``).

    python benchmarks/kernel_cost.py                      # every dtype and codec
    python benchmarks/kernel_cost.py --dtype bf16 --codec fixed3 --lines "encode: encode"
    python benchmarks/kernel_cost.py --dtype bf16 --lines "decode: decode" --zero-lines
    python benchmarks/kernel_cost.py --json out.json      # for tests/test_triton_offline.py
    python benchmarks/kernel_cost.py --summary            # one line per dtype and codec

``--summary`` prints, per dtype and codec::

    summary <dtype> <codec> encode_instr=<x> decode_instr=<y> input_reads=<n>
        encode_host_syncs=<a> decode_host_syncs_before_launch=<b>
        encode_spills=<s> decode_spills=<t>
        zero_encode_instr=<z> zero_decode_instr=<w>

instructions per element on the longest path summed over the call's kernels
(the hot path: a chunk Gaussian data makes; zero_*: a full chunk with zeros
to flag, the longest path through the kernel's zero path, ``none`` where it
has none: ``offline.zero_path``);
input reads: how many of the call's kernels read its input (encode: the
tensor, decode: the payload's streams), each reading every element once;
host syncs: counted on the CPU by running ``encode`` and ``decode(out=)``
of the public API (backend "triton") under the Triton interpreter, in a
subprocess, with every device-to-host read of a tensor's values recorded
(``count_syncs``); the decode count is of those before its first launch;
spills: the ``spills`` column of the call's kernels, summed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))  # offline.py
COUNTING = "--count-syncs" in sys.argv  # the subprocess that runs under the interpreter
if os.environ.get("TRITON_INTERPRET") == "1" and not COUNTING:
    sys.exit("kernel_cost: unset TRITON_INTERPRET; this compiles the kernels for a GPU")

import torch  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Device-to-host reads: a tensor's values turned into Python objects or a
# host copy. (Under the interpreter every tensor is on the CPU, so a read is
# recognised by the call, not by the devices.)
_READS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")


def count_syncs(numel: int = 4096 + 5) -> dict:
    """Host syncs of the Triton path, per (dtype, codec): those of
    ``encode`` and those of ``decode(payload, out=)`` before its first
    kernel launch (and in all). Run under TRITON_INTERPRET=1 with CPU
    tensors. Reads made inside triton (the interpreter copying arguments)
    are launches, not syncs, and are not counted; consecutive reads on one
    source line (``.cpu().numpy()``) count once."""
    import triton
    from triton.runtime.interpreter import GridExecutor

    import zipccl_fsdp as z
    tri_dir = os.path.dirname(triton.__file__)
    log = []

    def record(kind):
        where = sys._getframe(2)
        fname = where.f_code.co_filename
        if fname.startswith(tri_dir):
            return
        at = f"{os.path.relpath(fname, ROOT)}:{where.f_lineno}"
        if kind == "launch" or not log or log[-1] != ("sync", at):
            log.append((kind, at))

    def wrap(name, orig):
        def read(self, *a, **k):
            record("sync")
            return orig(self, *a, **k)
        read.__name__ = name
        return read

    saved = {n: getattr(torch.Tensor, n) for n in _READS}
    launch = GridExecutor.__call__

    def launched(self, *a, **k):
        log.append(("launch", getattr(self.fn, "__name__", "?")))
        return launch(self, *a, **k)

    rows = {}
    try:
        for n, f in saved.items():
            setattr(torch.Tensor, n, wrap(n, f))
        GridExecutor.__call__ = launched
        for dname, dtype in DTYPES.items():
            g = torch.Generator().manual_seed(0)
            x = torch.randn(numel, generator=g).to(dtype)
            for codec in ("fixed3", "dense"):
                del log[:]
                p = z.encode(x, codec=codec, backend="triton")
                enc = [at for kind, at in log if kind == "sync"]
                out = torch.empty_like(x)
                del log[:]
                z.decode(p, out=out, backend="triton")
                first = next((i for i, (kind, _) in enumerate(log) if kind == "launch"),
                             len(log))
                before = [at for kind, at in log[:first] if kind == "sync"]
                total = [at for kind, at in log if kind == "sync"]
                assert torch.equal(out.view(-1).view(torch.uint8), x.view(-1).view(torch.uint8))
                rows[f"{dname} {codec}"] = dict(encode=enc, decode_before_launch=before,
                                                decode=total)
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)
        GridExecutor.__call__ = launch
    return rows


def _syncs_in_subprocess() -> dict:
    import subprocess
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--count-syncs"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if r.returncode:
        raise RuntimeError(f"kernel_cost --count-syncs failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    if COUNTING:
        print(json.dumps(count_syncs()))
        return
    import offline

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", choices=list(DTYPES), action="append",
                   help="repeatable; default all")
    p.add_argument("--codec", choices=["fixed3", "dense"], action="append",
                   help="repeatable; default all")
    p.add_argument("--arch", type=int, default=90, help="sm_<arch> (default 90)")
    p.add_argument("--lines", metavar="KERNEL",
                   help='also print the longest path per source line of this kernel, '
                        'e.g. "encode: encode"')
    p.add_argument("--zero-lines", action="store_true",
                   help="with --lines: the zero path's longest path instead of the hot path's")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    p.add_argument("--summary", action="store_true",
                   help="also count host syncs (under the interpreter) and print one "
                        "summary line per dtype and codec")
    args = p.parse_args()
    syncs = _syncs_in_subprocess() if args.summary else {}

    cols = ["dtype", "codec", "kernel", "regs", "smem", "spills", "instr_per_elem",
            "zero_instr", "all_inline", "hot_instr", "cold_instr", "loads", "stores", "shfl", "bar"]
    print(f"# Triton codec kernels, static cost (sm_{args.arch}, 256 MiB launches)\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    rows = []
    profiles = []
    for dname in args.dtype or list(DTYPES):
        for codec in args.codec or ["fixed3", "dense"]:
            totals = {"encode": 0.0, "decode": 0.0}
            zero = {"encode": 0.0, "decode": 0.0}  # None once a kernel has no zero path
            reads = {"encode": 0, "decode": 0}
            spills = {"encode": 0, "decode": 0}
            for launch in offline.codec_launches(DTYPES[dname], codec):
                op = launch.name.split(":")[0]
                reads[op] += launch.reads_input
                compiled = offline.compile_launch(launch, args.arch)
                st = offline.sass_stats(launch, compiled)
                totals[op] += st.per_element
                zero[op] = None if zero[op] is None or st.zero_per_element is None else (
                    zero[op] + st.zero_per_element)
                spills[op] += st.spills
                row = dict(dtype=dname, codec=codec, kernel=launch.name, regs=st.registers,
                           smem=st.shared_bytes, spills=st.spills,
                           instr_per_elem=round(st.per_element, 1),
                           zero_instr=_round(st.zero_per_element),
                           all_inline=round(st.all_inline_per_element, 1),
                           hot_instr=st.instructions, cold_instr=st.cold_instructions,
                           loads=st.loads, stores=st.stores, shfl=st.shuffles,
                           bar=st.barriers, loops=st.loops, path_loops=st.path_loops)
                rows.append(row)
                fmt = {**row, "loads": _widths(st.loads), "stores": _widths(st.stores),
                       "zero_instr": _text(row["zero_instr"])}
                print("| " + " | ".join(str(fmt[c]) for c in cols) + " |", flush=True)
                if args.lines and launch.name == args.lines:
                    profiles.append((dname, codec, launch.name,
                                     offline.line_profile(launch, compiled,
                                                          zero=args.zero_lines)))
            for op, v in totals.items():
                rows.append(dict(dtype=dname, codec=codec, kernel=f"{op} (all kernels)",
                                 instr_per_elem=round(v, 1), zero_instr=_round(zero[op]),
                                 input_reads=reads[op], spills=spills[op]))
                print(f"| {dname} | {codec} | **{op}, all kernels** |  |  |  | **{v:.1f}** | "
                      f"**{_text(_round(zero[op]))}** |" + " |" * 7)
    print("\ninstr_per_elem: SASS instructions per element a thread handles on the kernel's "
          "longest path, loops counted as often as they run (an escape loop as often as "
          "Gaussian data makes it: offline.escape_trips), its zero path apart; zero_instr: the "
          "same through the zero path (a full chunk with zeros to flag; with a noinline "
          "function, the callee's longest path at the call); all_inline: every inline "
          "instruction, both sides of each branch; loads/stores: global accesses of the inline "
          "code but its zero path by width (bits, or U8/U16), static counts.")
    summaries = []
    for dname in args.dtype or list(DTYPES):
        for codec in args.codec or ["fixed3", "dense"]:
            if not args.summary:
                continue
            enc, dec = (next(r for r in rows if (r["dtype"], r["codec"], r["kernel"])
                             == (dname, codec, f"{op} (all kernels)")) for op in ("encode", "decode"))
            sy = syncs[f"{dname} {codec}"]
            row = dict(dtype=dname, codec=codec, encode_instr=enc["instr_per_elem"],
                       decode_instr=dec["instr_per_elem"], input_reads=enc["input_reads"],
                       decode_input_reads=dec["input_reads"],
                       encode_host_syncs=len(sy["encode"]),
                       decode_host_syncs_before_launch=len(sy["decode_before_launch"]),
                       decode_host_syncs=len(sy["decode"]), sync_sites=sy,
                       encode_spills=enc["spills"], decode_spills=dec["spills"],
                       zero_encode_instr=enc["zero_instr"], zero_decode_instr=dec["zero_instr"])
            summaries.append(row)
            rows.append(dict(kernel="summary", **row))
    if summaries:
        print()
    for r in summaries:
        print(f"summary {r['dtype']} {r['codec']} encode_instr={r['encode_instr']} "
              f"decode_instr={r['decode_instr']} input_reads={r['input_reads']} "
              f"encode_host_syncs={r['encode_host_syncs']} "
              f"decode_host_syncs_before_launch={r['decode_host_syncs_before_launch']} "
              f"encode_spills={r['encode_spills']} decode_spills={r['decode_spills']} "
              f"zero_encode_instr={_text(r['zero_encode_instr'])} "
              f"zero_decode_instr={_text(r['zero_decode_instr'])}")
    for r in summaries[:1]:
        print(f"  (host syncs of {r['dtype']} {r['codec']}, by source line: {r['sync_sites']})")
    for dname, codec, name, prof in profiles:
        what = "the zero path's" if args.zero_lines else "longest path"
        print(f"\n## {dname} {codec} {name}: {what} by source line\n")
        print("| instr/elem | line | opcodes |\n|---|---|---|")
        for where, n, ops in prof:
            print(f"| {n:.2f} | {where} | {ops} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def _round(v):
    return None if v is None else round(v, 1)


def _text(v) -> str:
    return "none" if v is None else str(v)


def _widths(d: dict) -> str:
    return " ".join(f"{w}x{n}" for w, n in sorted(d.items())) or "-"


if __name__ == "__main__":
    main()
