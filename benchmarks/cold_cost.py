"""Static cost of the codec kernels' cold functions, compiled for a GPU without one.

``kernel_cost.py`` counts a kernel's hot path (its inline code: the chunks
Gaussian data makes) and sets the ``noinline`` functions it calls apart as
cold code. This prints, for each such function of the encode and decode
kernels, the instructions per element of a chunk a thread handles on the
function's own longest path (``offline.cold_cost``: the same counting,
loops at their trips, a call of another noinline function counted as the
call alone), so that what a chunk off the hot path costs can be read:

- fixed3: a chunk with zeros to flag (encode: bf16 ``_encode_zero_pairs``,
  fp32 ``_encode_zero_words``, fp16 ``encode_chunk_general``; decode: bf16
  ``_decode_zero_pairs``, fp32 ``_decode_zero_words``, fp16
  ``_decode_zero_rem``), a bf16 or fp32 chunk that is ZERO, RAW,
  LOWBYTE or has exponents 0 that are not zeros to flag (encode
  ``encode_cold_chunk_general``), an fp32 LOWBYTE chunk (decode
  ``decode_chunk_general``), a RAW chunk (decode ``decode_raw_words``);
- dense: a full chunk with zeros (encode ``_encode_zeros``, decode
  ``_decode_zeros``), an fp32 chunk that may take LOWBYTE (encode
  ``_encode_general``), the ragged last chunk, a RAW chunk.

A cold chunk also pays what the kernel did before the call (encode: the
load and the statistics; decode: the header and the chunk's entry): the
``before_call`` column, the kernel's longest path from its entry to the
call (``offline.before_call``).

    python benchmarks/cold_cost.py                 # every dtype and codec
    python benchmarks/cold_cost.py --dtype fp16 --codec fixed3
    python benchmarks/cold_cost.py --codec dense --json out.json  # tests/test_triton_offline.py
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))  # offline.py
if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("cold_cost: unset TRITON_INTERPRET; this compiles the kernels for a GPU")

import torch  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
COLD = {("fixed3", "encode"): ("_encode_zero_pairs", "_encode_zero_words",
                                "encode_chunk_general", "encode_cold_chunk_general"),
        ("fixed3", "decode"): ("_decode_zero_pairs", "_decode_zero_words", "_decode_zero_rem",
                                "decode_zero_chunk_general", "decode_chunk_general",
                                "decode_raw_words"),
        ("dense", "encode"): ("_encode_zeros", "_encode_general", "_encode_tail", "_write_raw"),
        ("dense", "decode"): ("_decode_zeros", "_decode_general", "_decode_raw")}


def cold_costs(dtype, codec: str) -> list[tuple]:
    """(kernel, function, instructions per element of a chunk on its longest
    path, None where the kernel never calls it; the kernel's before its
    call) for the codec's cold functions."""
    import offline
    out = []
    for launch in offline.codec_launches(dtype, codec):
        compiled = offline.compile_launch(launch)
        for name in COLD[codec, launch.name.split(":")[0]]:
            out.append((launch.name, name, offline.cold_cost(launch, compiled, name),
                        offline.before_call(launch, compiled, name)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", choices=list(DTYPES), action="append",
                   help="repeatable; default all")
    p.add_argument("--codec", choices=["fixed3", "dense"], action="append",
                   help="repeatable; default both")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = p.parse_args()
    rows = []
    print("| dtype | codec | kernel | cold function | instr_per_elem | before_call |\n"
          "|---|---|---|---|---|---|")
    for dname in args.dtype or list(DTYPES):
        for codec in args.codec or ["fixed3", "dense"]:
            for kernel, name, per_elem, before in cold_costs(DTYPES[dname], codec):
                rows.append(dict(dtype=dname, codec=codec, kernel=kernel, function=name,
                                 instr_per_elem=per_elem, before_call=before))
                cost = "not called" if per_elem is None else f"{per_elem:.1f}"
                print(f"| {dname} | {codec} | {kernel} | {name} | {cost} | {before:.1f} |",
                      flush=True)
    print("\ninstr_per_elem: SASS instructions per element of a chunk a thread handles on the "
          "function's longest path (loops at their trips); before_call: the kernel's "
          "longest path from its entry to its call of the function (0: another cold "
          "function calls it), which a chunk that takes it pays too.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
