"""Static cost of the Triton codec kernels, compiled for a GPU without one.

Compiles every kernel as encode/decode launch it for 256 MiB of each dtype
(``triton_kernels/offline.py``), for sm_90 (H100/H200) by default, and
prints a table from the SASS: registers, shared memory (bytes), register
spills inside the hot path's loops, hot-path instructions per element (loops counted as often as
they run), the cold code apart, the widths of global loads and stores on
the hot path, shuffles and barriers. No GPU and no timing: the figures are
deterministic for a given triton, so a change to a kernel can be judged
here, before a GPU run confirms it (``benchmarks/gpu_check.py``).

    python benchmarks/kernel_cost.py                      # every dtype and codec
    python benchmarks/kernel_cost.py --dtype bf16 --codec fixed3 --lines "encode: write"
    python benchmarks/kernel_cost.py --json out.json      # for tests/test_triton_offline.py
"""
from __future__ import annotations

import argparse
import json
import os
import sys

if os.environ.get("TRITON_INTERPRET") == "1":  # the kernels must be real jit functions
    sys.exit("kernel_cost: unset TRITON_INTERPRET; this compiles the kernels for a GPU")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from triton_kernels import offline  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", choices=list(DTYPES), action="append",
                   help="repeatable; default all")
    p.add_argument("--codec", choices=["fixed3", "dense"], action="append",
                   help="repeatable; default all")
    p.add_argument("--arch", type=int, default=90, help="sm_<arch> (default 90)")
    p.add_argument("--lines", metavar="KERNEL",
                   help='also print the hot path per source line of this kernel, '
                        'e.g. "encode: write"')
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = p.parse_args()

    cols = ["dtype", "codec", "kernel", "regs", "smem", "loop_spills", "instr_per_elem",
            "hot_instr", "cold_instr", "loads", "stores", "shfl", "bar"]
    print(f"# Triton codec kernels, static cost (sm_{args.arch}, 256 MiB launches)\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    rows = []
    profiles = []
    for dname in args.dtype or list(DTYPES):
        for codec in args.codec or ["fixed3", "dense"]:
            totals = {"encode": 0.0, "decode": 0.0}
            for launch in offline.codec_launches(DTYPES[dname], codec):
                compiled = offline.compile_launch(launch, args.arch)
                st = offline.sass_stats(launch, compiled)
                totals[launch.name.split(":")[0]] += st.per_element
                row = dict(dtype=dname, codec=codec, kernel=launch.name, regs=st.registers,
                           smem=st.shared_bytes, loop_spills=st.loop_spills,
                           instr_per_elem=round(st.per_element, 1),
                           hot_instr=st.instructions, cold_instr=st.cold_instructions,
                           loads=st.loads, stores=st.stores, shfl=st.shuffles,
                           bar=st.barriers)
                rows.append(row)
                fmt = {**row, "loads": _widths(st.loads), "stores": _widths(st.stores)}
                print("| " + " | ".join(str(fmt[c]) for c in cols) + " |", flush=True)
                if args.lines and launch.name == args.lines:
                    profiles.append((dname, codec, launch.name,
                                     offline.line_profile(launch, compiled)))
            for op, v in totals.items():
                rows.append(dict(dtype=dname, codec=codec, kernel=f"{op} (all kernels)",
                                 instr_per_elem=round(v, 1)))
                print(f"| {dname} | {codec} | **{op}, all kernels** |  |  |  | **{v:.1f}** |"
                      + " |" * 6)
    print("\ninstr_per_elem: hot-path SASS instructions per element a thread handles, loops "
          "counted as often as they run; loads/stores: global accesses by width (bits, or "
          "U8/U16), static counts.")
    for dname, codec, name, prof in profiles:
        print(f"\n## {dname} {codec} {name}: hot path by source line\n")
        print("| instr/elem | line | opcodes |\n|---|---|---|")
        for where, n, ops in prof:
            print(f"| {n:.2f} | {where} | {ops} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def _widths(d: dict) -> str:
    return " ".join(f"{w}x{n}" for w, n in sorted(d.items())) or "-"


if __name__ == "__main__":
    main()
