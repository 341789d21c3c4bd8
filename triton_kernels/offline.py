"""Compile the codec kernels for a GPU without one, and count their SASS.

CI and most development machines have no GPU, and the Triton interpreter
checks what a kernel computes but not how it compiles: a kernel can pass
every interpreted test and still fail to compile for the GPU, spill
registers, or load bytes one at a time. Triton's CUDA backend and the
``ptxas``/``nvdisasm`` bundled with it run without a driver, so this module
compiles each kernel exactly as ``encode``/``decode`` launch it (same
constexprs, warps and argument specialization) for a given architecture and
reads the machine code:

- registers, stack bytes, shared memory, and register spills (local
  stores and loads) inside the hot path's loops;
- instructions of the hot path, with every loop counted as often as it
  runs (its trip count is the sub-block count, ``NSUB``), per element a
  thread handles: the kernel's instruction cost, which bounds its speed when
  it is issue-bound;
- global loads and stores of the hot path by width (a ``U8`` access per
  element is what keeps a kernel far from memory bandwidth), shuffles and
  barriers.

The hot path is the kernel's own code; cold paths are ``noinline``
functions it calls (a raw chunk, an unaligned or zero-omitting segment),
which the SASS holds after the kernel and which are counted apart. Both
sides of an inlined branch are counted, so for a kernel without cold
functions the figure is an upper bound on the path a chunk takes.
``benchmarks/kernel_cost.py`` prints the table.
"""
from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from zipccl_fsdp import format as F

from . import codec_decode as D
from . import codec_encode as E

_TRITON_DTYPE = {"i8": "*i8", "u8": "*u8", "i16": "*i16", "i32": "*i32", "i64": "*i64"}


@dataclass
class Launch:
    """One kernel launch as encode/decode make it: runtime arguments in order
    (an int, or a pointer's element type such as ``"*i16"``), constexprs,
    warps, and the number of elements one program handles."""
    name: str
    kernel: object
    args: dict
    constexprs: dict
    num_warps: int
    elems_per_program: int
    trip_count: int = 1
    reads_input: int = 0  # 1: the kernel reads every element of the call's input


@dataclass
class SassStats:
    name: str
    registers: int
    stack_bytes: int
    shared_bytes: int
    loop_spills: int           # STL/LDL inside hot-path loops
    instructions: int          # static, hot path
    per_element: float         # hot path, loops counted trip_count times, per element per thread
    cold_instructions: int = 0  # static, in noinline functions
    loads: dict = field(default_factory=dict)   # width -> static count (LDG), hot path
    stores: dict = field(default_factory=dict)  # width -> static count (STG), hot path
    shuffles: int = 0
    barriers: int = 0


def _bin(tool: str) -> str:
    import triton.backends.nvidia as nv
    return os.path.join(os.path.dirname(nv.__file__), "bin", tool)


def _signature(launch: Launch):
    sig, attrs = {}, {}
    names = launch.kernel.arg_names
    for name, v in launch.args.items():
        if isinstance(v, str):  # a pointer: torch allocations are 256-byte aligned
            sig[name] = v
            attrs[(names.index(name),)] = [["tt.divisibility", 16]]
        elif v == 1:
            raise ValueError(f"{launch.name}: {name}=1 would be specialized as a constant")
        else:
            sig[name] = "i32" if -2**31 <= v < 2**31 else "i64"
            if v % 16 == 0:
                attrs[(names.index(name),)] = [["tt.divisibility", 16]]
    given = dict(launch.constexprs)
    for param in launch.kernel.params:  # constexprs left at their defaults
        if param.is_constexpr and param.name not in given and param.default is not inspect._empty:
            given[param.name] = param.default
    missing = [n for n in names if n not in sig and n not in given]
    if missing:
        raise ValueError(f"{launch.name}: no value for kernel arguments {missing}")
    for name in given:
        sig[name] = "constexpr"
    ordered = {n: sig[n] for n in names}
    constexprs = {(names.index(n),): v for n, v in given.items()}
    return ordered, constexprs, attrs


def compile_launch(launch: Launch, arch: int = 90):
    """The compiled kernel (``.asm['cubin']``, ``.asm['ptx']``) for sm_<arch>."""
    sig, constexprs, attrs = _signature(launch)
    src = ASTSource(fn=launch.kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=launch.num_warps))


_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"BRA\s+`?\(?(\.L_x_\d+)")


def _run_on_cubin(compiled, *tool_args: str) -> str:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        return subprocess.run([_bin(tool_args[0]), *tool_args[1:], path], check=True,
                              capture_output=True, text=True).stdout


@dataclass
class _Hot:
    """The hot path's instructions in order: (source line, opcode) and how
    often each runs per program; plus the cold code's size."""
    rows: list
    weight: list
    cold_instructions: int


def _hot_path(launch: Launch, compiled) -> _Hot:
    return parse_hot_path(_run_on_cubin(compiled, "nvdisasm", "-c", "-g"), launch.trip_count)


def parse_hot_path(sass: str, trip_count: int) -> _Hot:
    """Read ``nvdisasm -c -g`` output: the kernel's instructions up to its
    first noinline function, each with its source line and how often it
    runs. A loop is a backward branch; its body runs ``trip_count`` times
    (the kernels' loops walk the chunk's sub-blocks and do not nest)."""
    where, rows, labels, branches, cold = "?", [], {}, [], 0
    for line in sass.splitlines():
        if line.startswith("$"):  # the first noinline function: cold from here on
            cold = sum(bool(_INSTR.search(x)) for x in sass[sass.index(line):].splitlines())
            break
        m = re.search(r'//## File "(.*)", line (\d+)', line)
        if m:
            where = f"{os.path.basename(m.group(1))}:{m.group(2)}"
            continue
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(rows)
            continue
        m = _INSTR.search(line)
        if not m:
            continue
        b = _BRANCH.search(line)
        if b:
            branches.append((len(rows), b.group(1)))
        rows.append((where, m.group(3)))
    weight = [1] * len(rows)
    for at, label in branches:
        start = labels.get(label)
        if start is not None and start <= at:
            for i in range(start, at + 1):
                weight[i] = trip_count
    return _Hot(rows, weight, cold)


def _per_thread(launch: Launch) -> float:
    return launch.elems_per_program / (32 * launch.num_warps)


def sass_stats(launch: Launch, compiled) -> SassStats:
    usage = _run_on_cubin(compiled, "cuobjdump", "--dump-resource-usage")
    reg, local, stack, shared = (int(re.search(rf"{key}:(\d+)", usage).group(1))
                                 for key in ("REG", "LOCAL", "STACK", "SHARED"))
    hot = _hot_path(launch, compiled)
    ops = [op for _, op in hot.rows]
    loads, stores = {}, {}
    for op in ops:
        head = op.split(".")[0]
        if head in ("LDG", "STG"):
            width = next((s for s in op.split(".")[1:] if s in
                          ("U8", "S8", "U16", "S16", "64", "128")), "32")
            counts = loads if head == "LDG" else stores
            counts[width] = counts.get(width, 0) + 1
    return SassStats(
        name=launch.name, registers=reg, stack_bytes=local + stack, shared_bytes=shared,
        loop_spills=sum(op.split(".")[0] in ("STL", "LDL") and w > 1
                        for op, w in zip(ops, hot.weight)),
        instructions=len(ops),
        per_element=sum(w for op, w in zip(ops, hot.weight) if op != "NOP") / _per_thread(launch),
        cold_instructions=hot.cold_instructions, loads=loads, stores=stores,
        shuffles=sum(op.startswith("SHFL") for op in ops),
        barriers=sum(op.startswith("BAR") for op in ops))


def line_profile(launch: Launch, compiled, top: int = 20) -> list[tuple]:
    """The hot path's instructions per element by source line, largest
    first: (file:line, instructions per element, most frequent opcodes).
    A jitted helper's lines count where the helper is written (the debug
    info has no inlining), so one helper line may sum several call sites."""
    hot = _hot_path(launch, compiled)
    total, ops = {}, {}
    for (where, op), w in zip(hot.rows, hot.weight):
        op = op.split(".")[0]
        total[where] = total.get(where, 0) + w
        bucket = ops.setdefault(where, {})
        bucket[op] = bucket.get(op, 0) + w
    ranked = sorted(total.items(), key=lambda kv: -kv[1])[:top]
    return [(where, n / _per_thread(launch),
             ", ".join(f"{op} {c}" for op, c in
                       sorted(ops[where].items(), key=lambda kv: -kv[1])[:4]))
            for where, n in ranked]


def codec_launches(dtype, codec: str, numel: int = 128 << 20, ndim: int = 1,
                   encode_warps: int | None = None) -> list[Launch]:
    """The launches of encode and decode of ``numel`` elements of ``dtype``
    (a torch dtype) with ``codec``, with realistic argument values: one
    kernel each (format v2); the encode one program per chunk, at
    ``encode_warps`` warps when given, else at ``codec_encode.SETTINGS``';
    the decode ``codec_decode.chunks_per_program`` chunks a program (its
    chunk loop counted that many times)."""
    info = F.dtype_info(dtype)
    C = F.CHUNK_ELEMS
    nch = F.nchunks_for(numel, C)
    word = {2: "*i16", 4: "*i32"}[info.itemsize]
    header = F.Header(codec, dtype, (numel,) * ndim, numel, C, nch, 0)
    enc, enc_const, enc_warps = (E.launch_plan(info, codec, C) if encode_warps is None
                                 else E._launch_plan(info, codec, C, encode_warps))
    enc_args = dict(x_ptr=word, out_ptr="*u8", ticket_ptr="*i32", status_ptr="*i64",
                    total_ptr="*i64", numel=numel, nch=nch)
    if "C" in enc.arg_names and "C" not in enc_const:
        enc_args["C"] = C
    enc_args.update(table_off=header.table_offset, offsets_off=header.offsets_offset,
                    body_off=header.body_offset)
    per = D.chunks_per_program(nch, codec)
    dec = D.launcher(info, C, per, codec)  # the kernel decode_into launches once it knows the codec
    return [
        Launch("encode: encode", enc, enc_args, enc_const, enc_warps, C, reads_input=1),
        Launch("decode: decode", D.decode_kernel,
               dict(p_ptr="*u8", out_ptr=word, err_ptr="*i32",
                    pay_nbytes=header.body_offset + numel * info.itemsize * 3 // 4 + 16,
                    numel=numel, nch=nch, C=C, nsums=F.nchunks_for(numel), body_only=0),
               dec.constexprs, dec.num_warps, per * C, trip_count=per, reads_input=1),
    ]
