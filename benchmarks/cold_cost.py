"""Static cost of the dense kernels' cold functions, compiled for a GPU without one.

``kernel_cost.py`` counts a kernel's hot path (its inline code) and sets the
``noinline`` functions it calls apart as cold code. This prints, for each
such function of the dense encode and decode kernels, the instructions per
element a thread handles on the function's own longest path (the same
counting as offline.parse_hot_path: loops at their trips, a call of another
noinline function counted as the call alone), so that what a chunk off the
hot path costs can be read: a full chunk with zeros (encode
``_encode_general``, decode ``_decode_zeros``), the ragged last chunk, a RAW
chunk. A cold chunk also pays what the kernel did before the call (encode:
the load and the analysis of ``_encode_full``; decode: the header and the
chunk's entry).

    python benchmarks/cold_cost.py                 # every dtype
    python benchmarks/cold_cost.py --dtype fp16
"""
from __future__ import annotations

import argparse
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("cold_cost: unset TRITON_INTERPRET; this compiles the kernels for a GPU")

import torch  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
COLD = {"encode": ("_encode_general", "_encode_tail", "_write_raw"),
        "decode": ("_decode_zeros", "_decode_general", "_decode_raw")}


def cold_costs(dtype) -> list[tuple]:
    """(kernel, function, instructions per element on its longest path,
    static instructions) for the dense kernels' cold functions."""
    from triton_kernels import offline
    out = []
    for launch in offline.codec_launches(dtype, "dense"):
        op = launch.name.split(":")[0]
        sass = offline._run_on_cubin(offline.compile_launch(launch), "nvdisasm", "-c", "-g")
        lines = sass.splitlines()
        for name in COLD[op]:
            at = next(k for k, line in enumerate(lines)
                      if line.startswith("$") and re.search(rf"\$_{name}__", line))
            body = "\n".join(lines[at + 1:])
            hot = offline.parse_hot_path(body, 1, launch.loop_trips)
            per_thread = launch.elems_per_program / launch.trip_count / (32 * launch.num_warps)
            total = sum(w for (_, op_), w, on in zip(hot.rows, hot.weight, hot.on_path)
                        if on and op_ != "NOP")
            out.append((launch.name, name, total / per_thread, len(hot.rows)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", choices=list(DTYPES), action="append",
                   help="repeatable; default all")
    args = p.parse_args()
    print("| dtype | kernel | cold function | instr_per_elem | static_instr |")
    print("|---|---|---|---|---|")
    for dname in args.dtype or list(DTYPES):
        for kernel, name, per, static in cold_costs(DTYPES[dname]):
            print(f"| {dname} | {kernel} | {name} | {per:.1f} | {static} |", flush=True)


if __name__ == "__main__":
    main()
