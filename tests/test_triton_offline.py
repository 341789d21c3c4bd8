"""The Triton kernels compiled for an H100/H200 (sm_90) on a machine without
a GPU: the interpreter (test_triton_codec.py) checks what they compute, this
checks what they compile to (benchmarks/kernel_cost.py, in a subprocess,
because the interpreter's test module replaces the jit functions in this
one).

- Every kernel compiles for the GPU: some rules (a noinline function takes
  scalars only, layouts, types) are enforced by the compiler only.
- No spills: not one local-memory store or load in a kernel's code, its
  noinline functions included.
- The counter reads sm_80, sm_90 and sm_100 alike: the loops on a kernel's
  longest path, escape loops included, are found on each.
- fixed3 reads the input with 16-byte loads and writes decoded words with
  16-byte stores, and moves the sm stream in 16-byte words: the chunks
  that omit zeros (byte-wise sm) take the zero paths or fixed3_general.py,
  off the hot path; every kernel stays under the v1 kernels' counts plus
  ~12%.
- The zero path (a chunk with zeros to flag) is counted apart from the hot
  path: bf16 fixed3's decode within 2x of the hot path (the 1.3x goal: not
  yet, a strict xfail).
- ``--summary``: its lines, the host-sync instrument, and the kernels'
  bounds (one input read, one encode sync, none before decode's launch,
  instructions per element: met; fixed3 fp16 within 10% of bf16's own
  count: not yet, so a strict xfail).
- The cached launches (triton_kernels/_launch.py) reach the same compiled
  kernel with the same arguments as ``kernel[grid]``.
- The by-line views (``kernel_cost.py --lines``, ``--zero-lines``) add up to
  the counts they break down, a noinline zero path's own lines included.
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
import offline  # noqa: E402  (tools/offline.py; conftest.py puts tools/ on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CEILING = {"bf16": {"encode": 57.0, "decode": 40.0},
           "fp16": {"encode": 59.0, "decode": 50.0},
           "fp32": {"encode": 68.0, "decode": 41.0}}
DENSE_CEILING = {"bf16": {"encode": 169.0, "decode": 126.5},
                 "fp16": {"encode": 198.5, "decode": 151.0},
                 "fp32": {"encode": 230.0, "decode": 162.5}}


def _compiled_run(args: list, timeout: int) -> str:
    """Run ``python ARGS`` from the repository root without the interpreter
    (its kernels are compiled, for a GPU this machine lacks, by triton's
    bundled ptxas: skipped when this triton has none); its stdout."""
    if not os.path.exists(offline._bin("ptxas")):
        pytest.skip("this triton has no bundled ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, *args], env=env, cwd=ROOT, timeout=timeout,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _script_json(script: str, timeout: int):
    """The JSON a ``python -c`` script prints on its last line (_compiled_run)."""
    return json.loads(_compiled_run(["-c", script], timeout).strip().splitlines()[-1])


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("kernel_cost") / "rows.json"
    stdout = _compiled_run([os.path.join(ROOT, "benchmarks", "kernel_cost.py"), "--summary",
                            "--json", str(out)], 1200)
    rows = json.loads(out.read_text())
    rows.append(dict(kernel="stdout", text=stdout))
    return rows


SASS = """\
        .global         k
k:
	//## File "/x/k.py", line 10
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
	//## File "/x/k.py", line 12
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/               @P0 BRA `(.L_x_0) ;
	//## File "/x/k.py", line 14
        /*0030*/               @P1 BRA `(.L_x_1) ;
        /*0040*/                   CALL.REL.NOINC `($k$cold) ;
.L_x_1:
        /*0050*/                   EXIT ;
$k$cold:
        /*0060*/                   STG.E.U8 desc[UR4][R2.64], R3 ;
        /*0070*/                   RET.REL.NODEC R4 `(k) ;
"""


def test_sass_parser_weighs_loops_and_sets_noinline_code_apart():
    """What the counts mean, on hand-written SASS: a backward branch makes a
    loop that runs trip_count times, a forward one does not, and the code
    from the first noinline function on is cold."""
    hot = offline.parse_hot_path(SASS, trip_count=4)
    assert [op for _, op in hot.rows] == ["MOV", "IADD3", "BRA", "BRA", "CALL.REL.NOINC", "EXIT"]
    assert hot.weight == [1, 4, 4, 1, 1, 1]
    assert hot.on_path == [True] * 6  # the call's side is the longer one
    assert [where for where, _ in hot.rows][:3] == ["k.py:10", "k.py:12", "k.py:12"]
    assert hot.cold_instructions == 2


# An if/else (lines 20 / 22) and a loop (line 31) inside the chunk loop
# (line 34); line 40 is a warp collective's fallback, reached by BRA.DIV.
SASS_PATHS = """\
        .global         k
k:
	//## File "/x/k.py", line 10
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
	//## File "/x/k.py", line 20
        /*0010*/               @P0 BRA `(.L_x_1) ;
        /*0020*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0030*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0040*/                   BRA `(.L_x_2) ;
.L_x_1:
	//## File "/x/k.py", line 22
        /*0050*/                   IADD3 R2, R2, 0x2, RZ ;
.L_x_2:
	//## File "/x/k.py", line 30
        /*0060*/                   BRA.DIV UR4, `(.L_x_9) ;
.L_x_8:
        /*0070*/                   SHFL.BFLY PT, R3, R2, 0x1, 0x1f ;
.L_x_3:
	//## File "/x/k.py", line 31
        /*0080*/                   LOP3.LUT R2, R2, 0x1, RZ, 0xc0, !PT ;
        /*0090*/               @P1 BRA `(.L_x_3) ;
	//## File "/x/k.py", line 34
        /*00a0*/               @P2 BRA `(.L_x_0) ;
        /*00b0*/               @!P3 EXIT ;
        /*00c0*/                   EXIT ;
.L_x_9:
	//## File "/x/k.py", line 40
        /*00d0*/                   WARPSYNC.COLLECTIVE R4, `(.L_x_10) ;
.L_x_10:
        /*00e0*/                   BRA `(.L_x_8) ;
"""


def test_sass_parser_takes_the_longest_path_with_loops_at_their_trips():
    """The count is the longest way through the control flow: one side of
    an if/else (the longer), each loop's body as often as it runs (a loop
    inside another: the product), nothing reached only by BRA.DIV."""
    hot = offline.parse_hot_path(SASS_PATHS, trip_count=4, loop_trips={"k.py:31": 2.5})
    ops = [op for _, op in hot.rows]
    assert len(ops) == 15
    assert sorted(hot.loops) == [("k.py:31", 2.5, 2), ("k.py:34", 4, 10)]
    assert hot.weight == [1] + [4] * 7 + [10.0, 10.0, 4] + [1] * 4
    path = [i for i, on in enumerate(hot.on_path) if on]
    # entry, the if's two-IADD3 side (not index 5), the loops, both exits;
    # not the fallback at 13 and 14
    assert path == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12]
    assert sum(hot.weight[i] for i in path) == 51
    assert hot.cold_instructions == 0


def test_sass_parser_counts_a_ptxas_subroutine_at_its_call():
    """A 64-bit division is a call of a ptxas subroutine: its instructions
    count where it is called, and the subroutine is not a cold noinline
    function."""
    sass = SASS.replace("CALL.REL.NOINC `($k$cold)", "CALL.REL.NOINC `($__internal_0_$__div)")
    sass = sass.replace("$k$cold:", "$__internal_0_$__div:")
    hot = offline.parse_hot_path(sass, trip_count=4)
    assert hot.weight == [1, 4, 4, 1, 1 + 2, 1]


def test_sass_parser_sets_the_zero_path_apart():
    """The zero path (the source lines of a tagged inline function, or the
    calls of a tagged noinline one with the callee's instructions) is
    counted apart: the hot path is the longest way that runs none of it,
    zero_total the longest that runs some of it; without one, None."""
    assert offline.parse_hot_path(SASS_PATHS, trip_count=4).zero_total is None
    hot = offline.parse_hot_path(SASS_PATHS, trip_count=4, loop_trips={"k.py:31": 2.5},
                                 zero_lines={"k.py:22"})
    path = [i for i, on in enumerate(hot.on_path) if on]
    assert path == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12]  # as without a zero path
    zpath = [i for i, on in enumerate(hot.zero_on_path) if on]
    assert zpath == [0, 1, 5, 6, 7, 8, 9, 10, 11, 12]  # the if's other side, at line 22
    assert hot.zero_total == 51 - 3 * 4 + 4
    # A call of a zero function: the hot path goes around it (the branch at
    # line 14), the zero path through it with the callee's 7 instructions.
    hot = offline.parse_hot_path(SASS, trip_count=4, zero_calls={"$k$cold": 7})
    assert [i for i, on in enumerate(hot.on_path) if on] == [0, 1, 2, 3, 5]
    assert hot.zero_total == 1 + 4 + 4 + 1 + (1 + 7) + 1


def test_path_to_call_counts_the_kernel_up_to_a_cold_call():
    """cold_cost's before_call: the longest way from the kernel's entry to
    its call of a named noinline function, each instruction once (a back
    edge taken as the loop's exit), NOPs not counted, the call included; 0
    for a function the kernel does not call."""
    sass = SASS.replace("$k$cold", "$k$_zeros__p0")
    assert offline.path_to_call(sass, "_zeros") == 5  # MOV, the loop's two, the branch, the call
    assert offline.path_to_call(sass, "_other") == 0
    # SASS_PATHS with a call at its end: the if's longer side (two IADD3 and
    # a branch), not BRA.DIV's fallback; a NOP on the way is not counted
    sass = SASS_PATHS.replace("/*00c0*/                   EXIT ;",
                              "/*00c0*/                   CALL.REL.NOINC `($k$_zeros__p0) ;")
    assert offline.path_to_call(sass, "_zeros") == 12
    sass = sass.replace("/*0030*/                   IADD3 R2, R2, 0x1, RZ ;",
                        "/*0030*/                   NOP ;")
    assert offline.path_to_call(sass, "_zeros") == 11


def test_zero_path_tags_are_found():
    """The functions tagged ``# offline: zero path``: fixed3's noinline
    zero paths and general functions (the zero path where the kernel has no
    other); no inline one, so no source line of the kernels."""
    lines, names = offline.zero_path()
    assert not any(ln.startswith(("fixed3_decode.py:", "fixed3_encode.py:")) for ln in lines)
    assert {"_encode_zero_pairs", "_encode_zero_words", "_decode_zero_pairs",
            "_decode_zero_words", "_decode_zero_rem", "encode_chunk_general",
            "decode_zero_chunk_general"} <= names
    # (the general entries for a chunk without zeros to flag are no zero path)
    assert not {"decode_chunk_general", "encode_cold_chunk_general"} & names


# A uniform branch as sm_100 writes it: the condition an operand before the
# target (``BRA.U UP4, `(...)``), not a guard. Line 20 branches around a
# cold call into a loop at line 31 (its back edge such a branch too), all
# inside the loop of line 34; the cold function saves a register (STL).
SASS_UNIFORM = """\
        .global         k
k:
	//## File "/x/k.py", line 10
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
	//## File "/x/k.py", line 20
        /*0010*/                   BRA.U UP4, `(.L_x_1) ;
        /*0020*/                   CALL.REL.NOINC `($k$cold) ;
        /*0030*/                   BRA `(.L_x_2) ;
.L_x_1:
	//## File "/x/k.py", line 31
        /*0040*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0050*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0060*/                   BRA.U !UP1, `(.L_x_1) ;
.L_x_2:
	//## File "/x/k.py", line 34
        /*0070*/               @P2 BRA `(.L_x_0) ;
        /*0080*/                   EXIT ;
$k$cold:
        /*0090*/                   STL [R1+0x8], R3 ;
        /*00a0*/                   LDL R3, [R1+0x8] ;
        /*00b0*/                   RET.REL.NODEC R4 `(k) ;
"""


def test_sass_parser_reads_uniform_branches_and_counts_every_spill():
    """sm_100's uniform branches (the predicate an operand) are conditional
    branches: the path may take them, and one going back closes a loop,
    here the inner loop the longest path runs 4 x 2.5 times. Every STL/LDL
    counts as a spill, in a cold function too."""
    hot = offline.parse_hot_path(SASS_UNIFORM, trip_count=4, loop_trips={"k.py:31": 2.5})
    assert sorted(hot.loops) == [("k.py:31", 2.5, 3), ("k.py:34", 4, 7)]
    assert sorted(hot.path_loops) == ["k.py:31", "k.py:34"]
    path = [i for i, on in enumerate(hot.on_path) if on]
    assert path == [0, 1, 4, 5, 6, 7, 8]  # around the cold call, through the loop
    assert sum(hot.weight[i] for i in path) == 1 + 4 + 3 * 10 + 4 + 1
    assert offline.spill_instructions(SASS_UNIFORM) == 2
    assert offline.spill_instructions(SASS) == 0


# A loop as sm_100 may close it: the back edge (line 40) after the body's
# last line, the loop's own line (33) in effect at its header label.
SASS_LATE_BACK_EDGE = """\
        .global         k
k:
	//## File "/x/k.py", line 33
        /*0000*/                   UMOV UR6, URZ ;
.L_x_0:
	//## File "/x/k.py", line 36
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
	//## File "/x/k.py", line 40
        /*0020*/                   LOP3.LUT R3, R3, R2, RZ, 0xfc, !PT ;
        /*0030*/                   BRA.U UP0, `(.L_x_0) ;
        /*0040*/                   EXIT ;
"""


def test_sass_parser_names_a_loop_by_its_header_when_the_back_edge_line_has_no_trips():
    """A back edge whose source line names no trips takes those of the line
    in effect at the loop's header, else of a line of its body (sm_100
    closed fixed3_general's row loops after their last line, and they
    counted one trip); the back edge's own line wins when it names trips."""
    hot = offline.parse_hot_path(SASS_LATE_BACK_EDGE, trip_count=1, loop_trips={"k.py:33": 8})
    assert hot.loops == [("k.py:40", 8, 3)]
    assert sum(w for w, on in zip(hot.weight, hot.on_path) if on) == 1 + 3 * 8 + 1
    hot = offline.parse_hot_path(SASS_LATE_BACK_EDGE, trip_count=1,
                                 loop_trips={"k.py:33": 8, "k.py:40": 2})
    assert hot.loops == [("k.py:40", 2, 3)]
    # Other lines' code scheduled before the header: a line of the body.
    hot = offline.parse_hot_path(SASS_LATE_BACK_EDGE, trip_count=1, loop_trips={"k.py:36": 8})
    assert hot.loops == [("k.py:40", 8, 3)]


def _kernel(rows, dtype, codec, name):
    return next(r for r in rows if (r["dtype"], r["codec"], r["kernel"]) == (dtype, codec, name))


SUMMARY_KEYS = ("encode_instr", "decode_instr", "input_reads", "encode_host_syncs",
                "decode_host_syncs_before_launch", "encode_spills", "decode_spills",
                "zero_encode_instr", "zero_decode_instr")


def test_summary_lines(rows):
    """--summary prints one line per dtype and codec with the fields of SUMMARY_KEYS,
    the values of the JSON rows (instructions summed over the call's
    kernels)."""
    text = next(r["text"] for r in rows if r["kernel"] == "stdout")
    lines = [ln.split() for ln in text.splitlines() if ln.startswith("summary ")]
    assert [(ln[1], ln[2]) for ln in lines] == [(d, c) for d in ("bf16", "fp16", "fp32")
                                                for c in ("fixed3", "dense")]
    for ln in lines:
        fields = dict(kv.split("=") for kv in ln[3:])
        assert tuple(fields) == SUMMARY_KEYS
        row = _kernel(rows, ln[1], ln[2], "summary")
        assert float(fields["encode_instr"]) == row["encode_instr"] == _kernel(
            rows, ln[1], ln[2], "encode (all kernels)")["instr_per_elem"]
        assert int(fields["encode_host_syncs"]) == len(row["sync_sites"]["encode"])
        for op in ("encode", "decode"):
            zero = _kernel(rows, ln[1], ln[2], f"{op} (all kernels)")["zero_instr"]
            assert row[f"zero_{op}_instr"] == zero
            assert fields[f"zero_{op}_instr"] == ("none" if zero is None else str(zero))
            # every kernel has a zero path (tagged code or a tagged call)
            assert zero is not None and zero > row[f"{op}_instr"], (ln, zero)
        for op in ("encode", "decode"):
            kernels = [r for r in rows if "regs" in r and (r["dtype"], r["codec"]) == tuple(ln[1:3])
                       and r["kernel"].startswith(op)]
            assert int(fields[f"{op}_spills"]) == row[f"{op}_spills"] == sum(
                r["spills"] for r in kernels)


def test_host_syncs_are_counted(rows):
    """The instrument sees the reads the launchers make: encode's read of
    the body length in codec_encode.py; decode(out=)'s read of the error
    word in codec_decode.py, after its launch, and no read of the header
    (format.py's parse_header) at all."""
    for dtype in ("bf16", "fp16", "fp32"):
        for codec in ("fixed3", "dense"):
            sites = _kernel(rows, dtype, codec, "summary")["sync_sites"]
            assert any(s.startswith("triton_kernels/codec_encode.py:") for s in sites["encode"])
            assert any(s.startswith("triton_kernels/codec_decode.py:") for s in sites["decode"])
            assert not any(s.startswith("zipccl_fsdp/format.py:") for s in sites["decode"])
            assert set(sites["decode_before_launch"]) <= set(sites["decode"])


# The kernels' bounds (format v2), offline: fixed3 bf16 encode <=
# 32 and decode <= 24 instructions per element, fp16 and fp32 within 10%,
# dense <= 80 / 60, one read of the input, one host sync in encode (the
# length at the end) and none before decode's launch with out=.
#
# "fp16 and fp32 within 10% of bf16" is taken as within 10% of bf16's
# bounds (35.2 / 26.4), every dtype: a bound relative to bf16's own count
# would pass a slower bf16 kernel and fail a faster one, and per element it
# asks fp32, twice the bytes, to cost what bf16 does. Met as well, per byte
# of input (what a fraction of a device copy measures): fp32 within 10% of
# bf16. fp16 decode is not within 10% of bf16's own count (docs/benchmarks.md,
# "Kernel cost (offline SASS)": fp16's 3-bit rem stream costs
# about 2 instructions an element more at any speed).
BOUND = {"fixed3": (32.0, 24.0), "dense": (80.0, 60.0)}


def test_kernels_within_their_instruction_and_sync_bounds(rows):
    bf = _kernel(rows, "bf16", "fixed3", "summary")
    assert bf["encode_instr"] <= 32.0 and bf["decode_instr"] <= 24.0, bf
    for dtype, size in (("bf16", 2), ("fp16", 2), ("fp32", 4)):
        for codec, (enc, dec) in BOUND.items():
            r = _kernel(rows, dtype, codec, "summary")
            assert r["encode_instr"] <= 1.1 * enc and r["decode_instr"] <= 1.1 * dec, r
            if codec == "dense":
                assert r["encode_instr"] <= enc and r["decode_instr"] <= dec, r
            assert r["input_reads"] == 1, r
            assert r["encode_host_syncs"] == 1, r
            assert r["decode_host_syncs_before_launch"] == 0, r
        f3 = _kernel(rows, dtype, "fixed3", "summary")
        if size == 4:  # per byte of input
            assert f3["encode_instr"] / 4 <= 1.1 * bf["encode_instr"] / 2, f3
            assert f3["decode_instr"] / 4 <= 1.1 * bf["decode_instr"] / 2, f3


@pytest.mark.xfail(strict=True, reason="fixed3 fp16 decode counts 1.19x bf16's (17.7 against "
                   "14.9): the rem stream's ~2 instructions an element (docs/benchmarks.md, "
                   "'Kernel cost (offline SASS)'); encode is within 10%")
def test_fixed3_fp16_within_ten_percent_of_bf16(rows):
    """The relative bound read literally for fp16 (the same bytes an element
    as bf16): within 10% of bf16's own count."""
    bf = _kernel(rows, "bf16", "fixed3", "summary")
    f16 = _kernel(rows, "fp16", "fixed3", "summary")
    assert f16["encode_instr"] <= 1.1 * bf["encode_instr"], (f16, bf)
    assert f16["decode_instr"] <= 1.1 * bf["decode_instr"], (f16, bf)


@pytest.mark.parametrize("dtype, bound", [("bf16", 2.0), ("fp32", 2.0), ("fp16", 2.5)])
def test_fixed3_zero_chunk_decode_takes_the_zero_path(rows, dtype, bound):
    """A full chunk with zeros to flag (``x * mask``) costs fixed3's decode
    at most 2x the Gaussian hot path's instructions per element for bf16
    and fp32, 2.5x for fp16 (whose rem bits are read too): its zero path
    (fixed3_general's noinline walk, which reads the chunk twice, costs
    about 3.5x, 4.1x and 4.2x), at the decode kernel's registers (168 for
    16-bit words)."""
    r = _kernel(rows, dtype, "fixed3", "summary")
    assert r["zero_decode_instr"] <= bound * r["decode_instr"], r
    if dtype != "fp32":
        assert _kernel(rows, dtype, "fixed3", "decode: decode")["regs"] <= 168


@pytest.mark.parametrize("dtype, regs", [("bf16", 96), ("fp32", 168)])
def test_fixed3_zero_chunk_encode_takes_the_zero_path(rows, dtype, regs):
    """A full bf16 or fp32 chunk with zeros to flag costs fixed3's encode at
    most 3x the hot path's instructions per element: its zero path
    (fixed3_encode._encode_zero_pairs / _encode_zero_words; fixed3_general's
    walk costs 3.6x and 5.1x), with no more registers than the kernel had
    without it (the same occupancy for Gaussian chunks)."""
    r = _kernel(rows, dtype, "fixed3", "summary")
    assert r["zero_encode_instr"] <= 3.0 * r["encode_instr"], r
    assert _kernel(rows, dtype, "fixed3", "encode: encode")["regs"] <= regs


@pytest.mark.xfail(strict=True, reason="fixed3 bf16's zero chunk counts about 2.6x (encode: "
                   "the hot path's statistics, then a noinline zero path that reads the "
                   "chunk again and stores each kept sm byte at its rank; an inline zero "
                   "path counted 1.8x but took the kernel from 96 to 167 registers, which "
                   "Gaussian chunks would pay in occupancy) and 1.7x (decode) the hot path: "
                   "decode gathers each kept element's sm byte at its rank, ranks the kept "
                   "elements and flags the zeros on top of the hot path's work")
def test_fixed3_bf16_zero_chunk_within_1_3x_of_the_hot_path(rows):
    """The goal for a chunk with zeros of either sign: no more than 1.3x
    the Gaussian hot path's instructions per element, encode and decode."""
    r = _kernel(rows, "bf16", "fixed3", "summary")
    assert r["zero_encode_instr"] <= 1.3 * r["encode_instr"], r
    assert r["zero_decode_instr"] <= 1.3 * r["decode_instr"], r


def test_every_kernel_compiles_without_spills(rows):
    """No kernel stores or loads local memory (sm_90), hot path or cold."""
    kernels = [r for r in rows if "regs" in r]
    assert len(kernels) == 3 * 2 * 2  # one encode and one decode kernel per dtype and codec
    assert [(r["dtype"], r["codec"], r["kernel"], r["spills"]) for r in kernels
            if r["spills"]] == []


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_fixed3_wide_input_and_output(rows, dtype):
    """Encode reads the input with 16-byte loads; decode writes the words
    with 16-byte stores."""
    encode = _kernel(rows, dtype, "fixed3", "encode: encode")
    decode = _kernel(rows, dtype, "fixed3", "decode: decode")
    assert "128" in encode["loads"], encode["loads"]
    assert "128" in decode["stores"], decode["stores"]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fixed3_sm_words(rows, dtype):
    """With nothing omitted, encode stores the sm stream in 16-byte words and
    decode loads it so (one store and one load of 128 bits per 8 sm words)."""
    encode = _kernel(rows, dtype, "fixed3", "encode: encode")
    decode = _kernel(rows, dtype, "fixed3", "decode: decode")
    assert encode["stores"].get("128", 0) >= 2, encode["stores"]
    assert decode["loads"].get("128", 0) >= 2, decode["loads"]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fixed3_sm_accesses_are_wide(rows, dtype):
    """No byte-wise sm on the hot path: a byte store is a padding's, not an
    element's (the zero-omitting byte scatter is the zero path's or
    fixed3_general's, whose accesses the hot path's counts leave out)."""
    encode = _kernel(rows, dtype, "fixed3", "encode: encode")
    decode = _kernel(rows, dtype, "fixed3", "decode: decode")
    assert "64" in encode["stores"] or "128" in encode["stores"], encode["stores"]
    assert "64" in decode["loads"] or "128" in decode["loads"], decode["loads"]
    assert "U8" not in encode["stores"] or encode["stores"]["U8"] <= 16, encode["stores"]


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_instructions_per_element_under_ceiling(rows, dtype):
    """Every kernel under the v1 kernels' counts plus ~12%, and fixed3
    under half of dense: the fast codec stays the fast one."""
    for op in ("encode", "decode"):
        got = _kernel(rows, dtype, "fixed3", f"{op} (all kernels)")["instr_per_elem"]
        assert got <= CEILING[dtype][op], (dtype, op, got)
        dense = _kernel(rows, dtype, "dense", f"{op} (all kernels)")["instr_per_elem"]
        assert dense <= DENSE_CEILING[dtype][op], (dtype, op, dense)
        assert got < dense / 2, (dtype, op, got, dense)  # fixed3 stays the fast codec


def test_cached_launches_match_triton():
    """triton_kernels/_launch.py's Launcher skips triton's argument binding
    after a specialization's first call: with a stand-in driver, every
    launch of the four kernels, for aligned and misaligned inputs and
    chunk counts of 1 and others, reaches the same compiled kernel with the
    same arguments as ``kernel[grid]`` does, through ``__call__`` (tensors),
    ``by_address`` (pointers as addresses) and ``bind`` (the int tail fixed;
    one bound launcher across calls of different alignments, as a codec
    plan's is)."""
    stdout = _compiled_run([os.path.join(ROOT, "benchmarks", "triton_launch_host.py"),
                            "--check"], 900)
    assert "direct launches match kernel[grid]: 112 cases" in stdout, stdout


def test_dense_within_its_instruction_bounds(rows):
    """The dense part of test_kernels_within_their_instruction_and_sync_bounds: dense
    encode <= 80 and decode <= 60 instructions per element on the longest
    path of the hot path (a full chunk without zeros), summed over the
    call's kernels, with one read of the input, fp16 and fp32 within 10% of
    bf16."""
    bf = _kernel(rows, "bf16", "dense", "summary")
    for dtype in ("bf16", "fp16", "fp32"):
        dense = _kernel(rows, dtype, "dense", "summary")
        assert dense["encode_instr"] <= 80.0 and dense["decode_instr"] <= 60.0, dense
        assert dense["encode_instr"] <= 1.1 * bf["encode_instr"], dense
        assert dense["decode_instr"] <= 1.1 * bf["decode_instr"], dense
        assert dense["input_reads"] == 1, dense


_OTHER_WARPS = """
import json, sys, torch
sys.path.insert(0, "tools")
import offline
out = []
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    launch = offline.codec_launches(dtype, "fixed3", encode_warps=4)[0]
    out.append(offline.sass_stats(launch, offline.compile_launch(launch)).spills)
print(json.dumps(out))
"""


def test_fixed3_encode_compiles_at_four_warps_too():
    """The encoder runs 2 warps (codec_encode.WARPS) and keeps its 4-warp
    tile as the other choice a GPU may prefer; the interpreter accepts code
    the compiler refuses, so compile that width as well."""
    assert _script_json(_OTHER_WARPS, 600) == [0, 0, 0]


_BY_LINE = """
import inspect, json, sys, torch
sys.path.insert(0, "tools")
import offline
from zipccl_fsdp.triton_kernels import fixed3_decode
src, first = inspect.getsourcelines(fixed3_decode._decode_zero_pairs.fn)
callee = [f"fixed3_decode.py:{first + k}" for k in range(len(src))]
out = {}
for launch in offline.codec_launches(torch.bfloat16, "fixed3"):
    compiled = offline.compile_launch(launch, 90)
    st = offline.sass_stats(launch, compiled)
    hot = offline.line_profile(launch, compiled, top=10**6)
    zero = offline.line_profile(launch, compiled, top=10**6, zero=True)
    out[launch.name] = dict(hot=st.per_element, zero=st.zero_per_element,
                            hot_lines=sum(n for _, n, _ in hot),
                            zero_lines=sum(n for _, n, _ in zero),
                            callee_lines=sum(n for w, n, _ in zero if w in callee))
print(json.dumps(out))
"""


def test_by_line_views_add_up_to_the_counts():
    """bf16 fixed3: the longest path by source line sums to instr_per_elem,
    and the zero path's to zero_instr, decode's through its noinline
    _decode_zero_pairs, whose own lines are among them (the view had left a
    noinline callee out: an empty table for decode)."""
    out = _script_json(_BY_LINE, 600)
    assert sorted(out) == ["decode: decode", "encode: encode"], out
    for name, v in out.items():
        assert v["hot_lines"] == pytest.approx(v["hot"], rel=1e-9), (name, v)
        assert v["zero_lines"] == pytest.approx(v["zero"], rel=1e-9), (name, v)
    dec = out["decode: decode"]
    assert dec["callee_lines"] > 0, dec


_ARCHS = """
import json, sys, torch
sys.path.insert(0, "tools")
import offline
out = {}
for arch in (80, 90, 100):
    for launch in offline.codec_launches(torch.bfloat16, "fixed3"):
        st = offline.sass_stats(launch, offline.compile_launch(launch, arch))
        out[f"{arch} {launch.name}"] = dict(per_element=st.per_element, spills=st.spills,
                                            path_loops=st.path_loops)
print(json.dumps(out))
"""


def test_counter_reads_every_arch():
    """fixed3 bf16's kernels, each with an escape loop (one trip per escape
    of a thread, inside decode's chunk loop), compiled for sm_80, sm_90 and
    sm_100: on each the longest path runs the escape loop, so the count is
    the kernel's and within the hot path's bounds (32 / 24 instructions an
    element), no arch more than 10% from sm_90's, and no kernel spills."""
    got = _script_json(_ARCHS, 900)
    escape = offline.tagged_loops("escape rounds")
    for op, bound in (("encode: encode", 32.0), ("decode: decode", 24.0)):
        ref = got[f"90 {op}"]["per_element"]
        for arch in (80, 90, 100):
            st = got[f"{arch} {op}"]
            assert any(line in escape for line in st["path_loops"]), (arch, op, st)
            assert 0.9 * ref <= st["per_element"] <= min(bound, 1.1 * ref), (arch, op, st, ref)
            assert st["spills"] == 0, (arch, op, st)


_DENSE_ARCHS = """
import json, sys, torch
sys.path.insert(0, "tools")
import offline
out = {}
for arch in (80, 100):
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16),
                        ("fp32", torch.float32)):
        for launch in offline.codec_launches(dtype, "dense"):
            st = offline.sass_stats(launch, offline.compile_launch(launch, arch))
            out[f"{arch} {name} {launch.name}"] = st.spills
print(json.dumps(out))
"""


def test_dense_kernels_do_not_spill_on_sm80_or_sm100():
    """dense's kernels, every dtype, compiled for sm_80 and sm_100 (sm_90's
    are test_every_kernel_compiles_without_spills'): no local-memory store
    or load, the noinline functions (zero chunks, the ragged tail, RAW)
    included."""
    got = _script_json(_DENSE_ARCHS, 1200)
    assert len(got) == 2 * 3 * 2
    assert {k: v for k, v in got.items() if v} == {}


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """benchmarks/cold_cost.py's rows for dense (sm_90): each cold function's
    longest path and the kernel's before its call."""
    out = tmp_path_factory.mktemp("cold_cost") / "cold.json"
    _compiled_run([os.path.join(ROOT, "benchmarks", "cold_cost.py"), "--codec", "dense",
                   "--json", str(out)], 1200)
    return json.loads(out.read_text())


def _zero_chunk(cold, dtype, op):
    """A full chunk with zeros: the kernel's path up to the call and the
    zero function's (dense_encode._encode_zeros, dense_decode._decode_zeros)."""
    fn = {"encode": "_encode_zeros", "decode": "_decode_zeros"}[op]
    r = next(r for r in cold if (r["dtype"], r["function"]) == (dtype, fn))
    assert r["before_call"] > 0, r  # the kernel calls it
    return r["before_call"] + r["instr_per_elem"]


_NOT_YET = pytest.mark.xfail(strict=True, reason="fp16 dense encode's zero chunk counts 1.42x "
                             "the hot path (its rem bits and sm bytes at their rank among the "
                             "kept), fp32's 1.46x (three sm bytes an element)")


@pytest.mark.parametrize("dtype", ["bf16", pytest.param("fp16", marks=_NOT_YET),
                                   pytest.param("fp32", marks=_NOT_YET)])
def test_dense_encode_zero_chunk_within_1_3x_of_the_hot_path(rows, cold, dtype):
    """A full chunk with zeros of either sign (x * mask data) costs dense
    encode no more than 1.3x a Gaussian chunk's hot path: the kernel's work
    before the call plus _encode_zeros' longest path."""
    hot = _kernel(rows, dtype, "dense", "encode: encode")["instr_per_elem"]
    assert _zero_chunk(cold, dtype, "encode") <= 1.3 * hot, (dtype, hot)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_dense_decode_zero_chunk_within_1_3x_of_the_hot_path(rows, cold, dtype):
    """The same for decode: the kernel's work before _decode_zeros and its
    longest path, no more than 1.3x the hot path's."""
    hot = _kernel(rows, dtype, "dense", "decode: decode")["instr_per_elem"]
    assert _zero_chunk(cold, dtype, "decode") <= 1.3 * hot, (dtype, hot)
