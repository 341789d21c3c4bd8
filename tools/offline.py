"""Compile the codec kernels for a GPU without one, and count their SASS.

CI and most development machines have no GPU, and the Triton interpreter
checks what a kernel computes but not how it compiles: a kernel can pass
every interpreted test and still fail to compile for the GPU, spill
registers, or load bytes one at a time. Triton's CUDA backend and the
``ptxas``/``nvdisasm`` bundled with it run without a driver, so this module
compiles each kernel exactly as ``encode``/``decode`` launch it (same
constexprs, warps and argument specialization) for a given architecture and
reads the machine code:

- registers, stack bytes, shared memory, and spills: every local-memory
  store and load (``STL``/``LDL``) of the kernel's code, its noinline
  functions included, in loops or not;
- instructions per element a thread handles on the kernel's longest path
  (the costliest way through its control flow, each loop counted as often
  as it runs: the chunk loop ``trip_count`` times, a data-dependent loop
  as its tag in the source says, ``loop_trips``): the kernel's instruction
  cost, which bounds its speed when it is issue-bound;
- global loads and stores of the inline code by width, its zero path
  apart (a ``U8`` access per element is what keeps a kernel far from
  memory bandwidth), shuffles and barriers;
- the same count of instructions for a chunk with zeros to flag, along the
  longest path through the kernel's zero path (``zero_path``).

The hot path is the kernel's own (inline) code; cold paths are
``noinline`` functions it calls (a chunk Gaussian data does not make: a
RAW chunk, zeros to flag where the kernel has no inline zero path), which
the SASS holds after the kernel and which are counted apart. The zero path
(inline code for a chunk with zeros to flag, or the calls of the noinline
functions that code such a chunk) is counted apart from the hot path too.
A program takes one side of each branch, so the longest path bounds what
any chunk's program executes on the hot path; the sum over all inline code
(``all_inline_per_element``), which adds up both sides of every branch, is
kept beside it.
``benchmarks/kernel_cost.py`` prints the table.

A development tool, not part of the installed package (nothing installed
imports it): the scripts and tests that use it put ``tools/`` on
``sys.path`` and ``import offline``.
"""
from __future__ import annotations

import functools
import inspect
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import zipccl_fsdp.triton_kernels
from zipccl_fsdp.triton_kernels import codec_decode as D
from zipccl_fsdp.triton_kernels import codec_encode as E
from zipccl_fsdp import format as F

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
    # Trip counts of other loops, by the source line of their back edge
    # ("file.py:123"); see parse_hot_path.
    loop_trips: dict = field(default_factory=dict)


@dataclass
class SassStats:
    name: str
    registers: int
    stack_bytes: int
    shared_bytes: int
    spills: int                # STL/LDL anywhere in the kernel's code, noinline functions included
    instructions: int          # static, inline code
    per_element: float         # the longest path, loops counted as they run, per element per thread
    # the same for a chunk with zeros to flag: the longest path through the
    # zero path (parse_hot_path); None when the kernel has none
    zero_per_element: float | None = None
    cold_instructions: int = 0  # static, in noinline functions
    loads: dict = field(default_factory=dict)   # width -> static count (LDG), hot path
    stores: dict = field(default_factory=dict)  # width -> static count (STG), hot path
    shuffles: int = 0
    barriers: int = 0
    all_inline_per_element: float = 0.0  # every inline instruction, both sides of each branch
    loops: list = field(default_factory=list)  # (back edge's line, trips, body instructions)
    path_loops: list = field(default_factory=list)  # back edges' lines of the loops on the path


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
# A branch and its target. Its condition is a guard (``@P0 BRA``) or, for a
# uniform branch on sm_100, an operand before the target (``BRA.U UP4,
# `(.L_x_5)``, ``BRA.U !UP0, ...``); ``BRA.DIV UR4, ...`` names a register.
_BRANCH = re.compile(r"\bBRA(?:\.[A-Z0-9.]+)?\s+(?:(!?U?P[0-9T]+|U?R[0-9Z]+)\s*,\s*)?"
                     r"`?\(?(\.L_x_\d+)")
_SPILL = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?(STL|LDL)\b")


def _run_on_cubin(compiled, *tool_args: str) -> str:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        return subprocess.run([_bin(tool_args[0]), *tool_args[1:], path], check=True,
                              capture_output=True, text=True).stdout


@dataclass
class _Hot:
    """The kernel's inline instructions in order: (source line, opcode), how
    often each runs per program (the product of the trip counts of the loops
    around it), and which of them lie on the longest path; the cold code's
    size; the loops found, as (source line of the back edge, trip count,
    instructions in the body), and the lines of those the longest path
    goes through."""
    rows: list
    weight: list
    cold_instructions: int
    on_path: list = field(default_factory=list)
    loops: list = field(default_factory=list)
    path_loops: list = field(default_factory=list)  # the loops the longest path runs, by line
    # The longest path through the zero path (see parse_hot_path), its
    # instructions summed as they run (calls of zero functions with the
    # callee's); None when no path reaches it.
    zero_total: float | None = None
    zero_on_path: list = field(default_factory=list)
    in_zero_path: list = field(default_factory=list)  # each instruction: the zero path's
    # The zero path's noinline functions (section label -> their own longest
    # path's instructions), when it is theirs rather than inline code.
    zero_calls: dict = field(default_factory=dict)


def _sass(compiled) -> str:
    return _run_on_cubin(compiled, "nvdisasm", "-c", "-g")


def _hot_path(launch: Launch, sass: str) -> _Hot:
    """The kernel's hot path and zero path (parse_hot_path): the zero path
    is the kernel's inline one where it has one, else its calls of the
    tagged noinline functions (``zero_path``)."""
    lines, names = zero_path()
    hot = parse_hot_path(sass, launch.trip_count, launch.loop_trips, lines)
    if hot.zero_total is None:
        calls = {}
        for label, body in function_sections(sass).items():
            if any(_label_of(name, label) for name in names):
                calls[label] = _function_instructions(body, launch)
        z = parse_hot_path(sass, launch.trip_count, launch.loop_trips, lines, calls)
        hot.zero_total, hot.zero_on_path, hot.in_zero_path = (z.zero_total, z.zero_on_path,
                                                              z.in_zero_path)
        hot.zero_calls = calls
    return hot


def spill_instructions(sass: str) -> int:
    """Local-memory stores and loads (``STL``/``LDL``, any width) in the
    whole of ``nvdisasm`` output: the kernel, its noinline functions and
    ptxas's subroutines, in loops or not. ptxas puts there what does not fit in
    the registers, and a noinline function the registers it must save for
    its caller; either way a trip to memory."""
    return sum(bool(_SPILL.search(line)) for line in sass.splitlines())


def _label_of(function: str, label: str) -> bool:
    """Whether the SASS label of a noinline function (``$<kernel>$<name>__<suffix>``
    or ``$<name>__<suffix>``) is that of the jitted function ``function``."""
    return re.search(rf"\$_?{re.escape(function)}__", label) is not None


@dataclass
class _Flow:
    """The kernel's inline instructions (up to its first noinline function)
    as a control-flow graph: per instruction its (source line, opcode) and
    branch facts (``pred``: conditional; ``target``; ``sub``: a ptxas
    subroutine it calls; ``callee``: a function it calls), its successors
    with each back edge taken as the loop's exit (``succ``), the back edges
    (``back``: instruction -> the loop header's), the source line in effect
    at each label's instruction, the ptxas subroutines' sizes and the
    instruction count of the code after the kernel (``cold``)."""
    rows: list
    branches: list
    head_where: dict
    succ: list
    back: dict
    subs: dict
    cold: int


def _flow(sass: str) -> _Flow:
    """Parse ``nvdisasm -c -g`` output into a _Flow (parse_hot_path's rules)."""
    where, rows, labels, branches, cold = "?", [], {}, [], 0
    head_where = {}  # a label's row -> the source line in effect at it
    lines = sass.splitlines()
    subs, sub, kernel_done = {}, None, False
    for k, line in enumerate(lines):
        if line.startswith("$"):
            if not kernel_done:  # the first noinline function: cold from here on
                cold = sum(bool(_INSTR.search(x)) for x in lines[k:])
                kernel_done = True
            sub = line.split(":")[0] if line.startswith("$__internal_") else None
            if sub:
                subs[sub] = 0
            continue
        if kernel_done:
            if sub and _INSTR.search(line):
                subs[sub] += 1
            continue
        m = re.search(r'//## File "(.*)", line (\d+)', line)
        if m:
            where = f"{os.path.basename(m.group(1))}:{m.group(2)}"
            continue
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(rows)
            head_where.setdefault(len(rows), where)
            continue
        m = _INSTR.search(line)
        if not m:
            continue
        op = m.group(3)
        b = _BRANCH.search(line)
        c = re.search(r"CALL\S*\s+`\((\$__internal_[^)]*)\)", line)
        callee = re.search(r"CALL\S*\s+`\((\$[^)]*)\)", line)
        rows.append((where, op))
        # conditional: a guard, or a predicate operand other than the true one
        cond = bool(m.group(2)) or bool(b and b.group(1) and b.group(1).lstrip("!")
                                        not in ("PT", "UPT") and "P" in b.group(1))
        branches.append(dict(pred=cond, op=op, target=b.group(2) if b else None,
                             sub=c.group(1) if c else None,
                             callee=callee.group(1) if callee else None))
    n = len(rows)
    succ, back = [], {}  # back: a back edge's source -> the loop's header
    for i, br in enumerate(branches):
        op, head = br["op"], br["op"].split(".")[0]
        nxt = [i + 1] if i + 1 < n else []
        if head == "BRA" and br["target"] in labels and op != "BRA.DIV":
            t = labels[br["target"]]
            if t <= i:  # a back edge; leaving the loop continues after it
                back[i] = t
                succ.append(nxt)
            else:
                succ.append(sorted(set(nxt + [t])) if br["pred"] else [t])
        elif head in ("EXIT", "RET") and not br["pred"]:
            succ.append([])
        else:
            succ.append(nxt)
    return _Flow(rows, branches, head_where, succ, back, subs, cold)


def path_to_call(sass: str, function: str) -> int:
    """Instructions (NOPs not counted) on the kernel's longest way from its
    entry to its call of the noinline function whose name contains
    ``function``, the call included, each instruction once (a back edge on
    the way taken as the loop's exit): the kernel's work a chunk that takes
    that cold path does before it. 0 when the kernel does not call it."""
    f = _flow(sass)
    calls = [i for i, br in enumerate(f.branches)
             if br["callee"] and _label_of(function, br["callee"])]
    if not calls:
        return 0
    # best[i]: the most instructions on a way from the entry through i
    best = [float("-inf")] * len(f.rows)
    best[0] = 0
    for i, (_, op) in enumerate(f.rows):  # every edge of succ goes forward
        if best[i] == float("-inf"):
            continue
        best[i] += op != "NOP"
        for j in f.succ[i]:
            best[j] = max(best[j], best[i])
    return int(max(best[i] for i in calls))


def parse_hot_path(sass: str, trip_count: float, loop_trips: dict | None = None,
                   zero_lines: set | frozenset = frozenset(), zero_calls: dict | None = None
                   ) -> _Hot:
    """Read ``nvdisasm -c -g`` output: the kernel's instructions up to its
    first noinline function (cold from there on), each with its source line,
    how often it runs, and whether it lies on the longest path.

    The zero path: instructions of the source lines ``zero_lines`` and calls
    of the noinline functions ``zero_calls`` names (its section label ->
    the instructions on the callee's own longest path, counted at the call
    as it runs) are the code a chunk with zeros to flag takes. With any of
    them, the longest path is the costliest that runs none of them (the hot
    path, ``on_path``), and ``zero_total`` the cost of the costliest that
    runs at least one, the callee's instructions included.

    A loop is a backward branch; its body runs ``loop_trips[line]`` times,
    ``line`` the back edge's source line ("file.py:123") or, when that line
    names no trips, the line in effect at the loop's header label, or else
    the first line of the loop's own body (not an inner loop's) that names
    trips and no other loop's (sm_100 may close a loop after the body's
    last line and schedule other lines' code before its header), else
    ``trip_count``; a loop inside another runs the product. The longest path
    is the costliest way from the kernel's entry to an exit through its
    control flow with each back edge taken as the loop's exit: a program
    takes one side of each branch, so this bounds what any chunk's program
    executes when its loops run as counted, where the sum over all inline
    code would add up both sides of every branch. ``BRA.DIV`` (the fallback
    of a warp collective reached by a diverged warp, which the kernels'
    uniform branches never make) counts as not taken. A call of a ptxas
    subroutine (``$__internal_...``, a 64-bit division) counts the
    subroutine's instructions at the call."""
    f = _flow(sass)
    rows, branches, succ, back = f.rows, f.branches, f.succ, f.back
    head_where, subs, cold, n = f.head_where, f.subs, f.cold, len(f.rows)
    loop_trips = loop_trips or {}
    reached, todo = set(), [0] if n else []
    while todo:  # (code reached only through BRA.DIV is not the hot path's)
        i = todo.pop()
        if i not in reached:
            reached.add(i)
            todo.extend(succ[i] + ([back[i]] if i in back else []))
    latches = {}  # loop header -> its back edges
    for i, t in back.items():
        if i in reached:
            latches.setdefault(t, []).append(i)
    # A loop is its header to its last back edge (a loop whose body skips
    # to the next trip has several); its trips are named by that edge's line.
    weight, loops = [1] * n, []
    spans = sorted((t, max(ends)) for t, ends in latches.items())
    named = {t: next((w for w in (rows[i][0], head_where.get(t)) if w in loop_trips), None)
             for t, i in spans}
    taken = set(named.values())
    for t, i in spans:
        inner = [(a, b) for a, b in spans if t <= a and b < i]
        line = named[t] or next((rows[j][0] for j in range(t, i + 1)
                                 if rows[j][0] in loop_trips and rows[j][0] not in taken
                                 and not any(a <= j <= b for a, b in inner)), None)
        trips = loop_trips[line] if line else trip_count
        loops.append((rows[i][0], trips, i + 1 - t))
        for j in range(t, i + 1):
            weight[j] *= trips
    cost = [weight[i] * (1 + subs.get(branches[i]["sub"], 0)) for i in range(n)]
    zero_calls = zero_calls or {}
    extra = [weight[i] * zero_calls.get(branches[i]["callee"], 0) for i in range(n)]
    is_zero = [rows[i][0] in zero_lines or branches[i]["callee"] in zero_calls
               for i in range(n)]
    own = [0 if rows[i][1] == "NOP" else cost[i] for i in range(n)]  # (as per_element counts)
    # best: the costliest way from i to an exit that runs no zero-path
    # instruction (-inf where i is one); through: one that runs at least one.
    none = float("-inf")
    best, step = [0.0] * (n + 1), [None] * n
    through = [none] * (n + 1)
    for i in range(n - 1, -1, -1):  # every edge left goes forward
        if is_zero[i]:
            best[i] = none
            after = max((max(best[s], through[s]) for s in succ[i]), default=0.0)
            through[i] = own[i] + extra[i] + after
            continue
        nxt = max(succ[i], key=lambda s: best[s], default=None)
        best[i] = cost[i] + (best[nxt] if nxt is not None else 0)
        step[i] = nxt
        through[i] = own[i] + max((through[s] for s in succ[i]), default=none)
    on_path, i = [False] * n, 0 if n else None
    while i is not None:
        on_path[i] = True
        i = step[i]
    path_loops = [rows[max(ends)][0] for t, ends in sorted(latches.items())
                  if any(on_path[t:max(ends) + 1])]
    zero_total = through[0] if n and through[0] > none else None
    zero_on_path = [False] * n
    i, free = (0 if zero_total is not None else None), False
    while i is not None:  # through's choices, then best's once past the zero path
        zero_on_path[i] = True
        if free:
            i = step[i]
        elif is_zero[i]:
            i = max(succ[i], key=lambda s: max(best[s], through[s]), default=None)
            free = i is not None and best[i] > through[i]
        else:
            i = max(succ[i], key=lambda s: through[s], default=None)
    return _Hot(rows, cost, cold, on_path, loops, path_loops, zero_total, zero_on_path, is_zero)


def function_sections(sass: str) -> dict:
    """The SASS text of each noinline function after the kernel, by name
    (the ``$kernel$module$_name...`` label), without its label line."""
    out, name, body = {}, None, []
    for line in sass.splitlines():
        if line.startswith("$"):
            if name:
                out[name] = "\n".join(body)
            name, body = line.rstrip(":"), []
        elif name:
            body.append(line)
    if name:
        out[name] = "\n".join(body)
    return out


def cold_cost(launch: Launch, compiled, function: str) -> float | None:
    """Instructions per element of a chunk a thread handles on the longest
    path of the noinline function whose name contains ``function`` (its
    loops counted as ``launch.loop_trips`` names them, else once; a call of
    another noinline function counted as the call alone): what a chunk that
    takes that cold path executes there, beside what the kernel did before
    the call. None when the kernel has no such function (it never calls it)."""
    sass = _sass(compiled)
    body = next((text for name, text in function_sections(sass).items()
                 if _label_of(function, name)), None)
    if body is None:
        return None
    return _function_instructions(body, launch) / (_per_thread(launch) / launch.trip_count)


def before_call(launch: Launch, compiled, function: str) -> float:
    """Instructions per element of a chunk a thread handles on the kernel's
    longest path to its call of the noinline function whose name contains
    ``function`` (path_to_call): the kernel's work a chunk that takes that
    cold path pays before it, beside cold_cost's. 0 when the kernel does not
    call it itself."""
    return path_to_call(_sass(compiled), function) / (_per_thread(launch) / launch.trip_count)


def _function_instructions(body: str, launch: Launch) -> float:
    """The instructions on a noinline function's own longest path (its SASS
    section ``body``), its loops at ``launch.loop_trips``' trips, else once."""
    hot = parse_hot_path(body, 1, launch.loop_trips)
    return sum(w for (_, op), w, on in zip(hot.rows, hot.weight, hot.on_path)
               if on and op != "NOP")


def _per_thread(launch: Launch) -> float:
    return launch.elems_per_program / (32 * launch.num_warps)


def sass_stats(launch: Launch, compiled) -> SassStats:
    usage = _run_on_cubin(compiled, "cuobjdump", "--dump-resource-usage")
    reg, local, stack, shared = (int(re.search(rf"{key}:(\d+)", usage).group(1))
                                 for key in ("REG", "LOCAL", "STACK", "SHARED"))
    sass = _sass(compiled)
    hot = _hot_path(launch, sass)
    ops = [op for _, op in hot.rows]
    loads, stores = {}, {}
    for op, zero in zip(ops, hot.in_zero_path):
        head = op.split(".")[0]
        if zero:  # (the zero path's accesses are not the hot path's)
            continue
        if head in ("LDG", "STG"):
            width = next((s for s in op.split(".")[1:] if s in
                          ("U8", "S8", "U16", "S16", "64", "128")), "32")
            counts = loads if head == "LDG" else stores
            counts[width] = counts.get(width, 0) + 1
    return SassStats(
        name=launch.name, registers=reg, stack_bytes=local + stack, shared_bytes=shared,
        spills=spill_instructions(sass),
        instructions=len(ops),
        per_element=sum(w for op, w, on in zip(ops, hot.weight, hot.on_path)
                        if on and op != "NOP") / _per_thread(launch),
        zero_per_element=None if hot.zero_total is None else hot.zero_total / _per_thread(launch),
        all_inline_per_element=sum(w for op, w in zip(ops, hot.weight)
                                   if op != "NOP") / _per_thread(launch),
        loops=hot.loops, path_loops=hot.path_loops,
        cold_instructions=hot.cold_instructions, loads=loads, stores=stores,
        shuffles=sum(op.startswith("SHFL") for op in ops),
        barriers=sum(op.startswith("BAR") for op in ops))


def line_profile(launch: Launch, compiled, top: int = 20, zero: bool = False) -> list[tuple]:
    """The longest path's instructions per element by source line, largest
    first: (file:line, instructions per element, most frequent opcodes),
    NOPs left out as the per-element counts leave them; with ``zero``, the
    zero path's, a call of a tagged noinline function with the callee's own
    longest path by its lines (what ``zero_instr`` counts). A jitted
    function's lines count where the function is written (the debug info
    has no inlining), so one of its lines may sum several call sites."""
    sass = _sass(compiled)
    hot = _hot_path(launch, sass)
    total, ops = {}, {}

    def add(where, op, w):
        if op == "NOP":
            return
        op = op.split(".")[0]
        total[where] = total.get(where, 0) + w
        bucket = ops.setdefault(where, {})
        bucket[op] = bucket.get(op, 0) + w

    callees = {}
    if zero and hot.zero_calls:
        sections, branches = function_sections(sass), _flow(sass).branches
        for label in hot.zero_calls:
            callees[label] = parse_hot_path(sections[label], 1, launch.loop_trips)
    for i, ((where, op), w, on) in enumerate(zip(hot.rows, hot.weight,
                                                 hot.zero_on_path if zero else hot.on_path)):
        if not on:
            continue
        add(where, op, w)
        callee = callees.get(branches[i]["callee"]) if callees else None
        if callee is not None:
            for (cw, cop), cwt, con in zip(callee.rows, callee.weight, callee.on_path):
                if con:
                    add(cw, cop, w * cwt)
    ranked = sorted(total.items(), key=lambda kv: -kv[1])[:top]
    return [(where, n / _per_thread(launch),
             ", ".join(f"{op} {c}" for op, c in
                       sorted(ops[where].items(), key=lambda kv: -kv[1])[:4]))
            for where, n in ranked]


# A loop whose trips depend on the data is named in the kernel's source by a
# comment on its line, e.g. ``# offline: escape rounds`` (one trip per
# escape of the thread that has the most in its chunk). The loop's step is
# a value the compiler cannot see as a constant, so it is not unrolled and
# its back edge is that line's.
LOOP_TAG = "# offline: "


def tagged_loops(tag: str) -> list:
    """The source lines ("file.py:123") of the kernels' loops tagged ``tag``."""
    import glob
    found = []
    kernels = os.path.dirname(zipccl_fsdp.triton_kernels.__file__)
    for path in sorted(glob.glob(os.path.join(kernels, "*.py"))):
        with open(path) as f:
            for k, line in enumerate(f, 1):
                if line.rstrip().endswith(LOOP_TAG + tag):
                    found.append(f"{os.path.basename(path)}:{k}")
    return found


# The code a chunk with zeros to flag takes is named the same way: a
# function whose ``def`` ends with ``# offline: zero path`` (on the line of
# the closing parenthesis). An inline one is its body's source lines; a
# noinline one, its calls (counted with the callee's instructions).
ZERO_TAG = LOOP_TAG + "zero path"


@functools.lru_cache(maxsize=1)
def zero_path() -> tuple:
    """(the source lines "file.py:123" of the tagged inline functions'
    bodies, the names of the tagged noinline functions) over the kernels."""
    import glob
    lines, names = set(), set()
    kernels = os.path.dirname(zipccl_fsdp.triton_kernels.__file__)
    for path in sorted(glob.glob(os.path.join(kernels, "*.py"))):
        with open(path) as f:
            text = f.read().splitlines()
        for k, line in enumerate(text):
            if not line.rstrip().endswith(ZERO_TAG):
                continue
            d = k
            while not text[d].startswith("def "):
                d -= 1
            name = re.match(r"def (\w+)", text[d]).group(1)
            if "noinline=True" in text[d - 1]:
                names.add(name)
                continue
            end = k + 1
            while end < len(text) and not re.match(r"[^\s#]", text[end]):
                end += 1
            lines.update(f"{os.path.basename(path)}:{j + 1}" for j in range(d, end))
    return frozenset(lines), frozenset(names)


@functools.lru_cache(maxsize=64)
def escape_trips(dtype, per_thread: int, codec: str = "fixed3", numel: int = 1 << 22) -> float:
    """The trips an escape loop (one trip per escape of the thread that has
    the most in its chunk) makes for Gaussian data: over the chunks of
    ``numel`` elements of N(0, 1) in ``dtype``, the mean of the largest
    count of escapes among a chunk's runs of ``per_thread`` consecutive
    elements (a thread's), with the locator the torch reference places and
    no flagged zero (the kernels' hot path): fixed3's exponents outside the
    window, dense's of rank ``format.DENSE_ESC``. A seeded draw, so the
    figure is the same on every run."""
    from zipccl_fsdp import codec_torch as CT
    info = F.dtype_info(dtype)
    C = F.CHUNK_ELEMS
    g = torch.Generator().manual_seed(0)
    x = torch.randn(numel, generator=g).to(dtype)
    W, valid = CT._words(x, info, numel // C, C)
    e, _ = CT._split(W, info)
    base, phase = CT._locator(e, valid, info)
    if codec == "fixed3":
        lo, width = CT._fixed_window(base, phase, torch.zeros_like(base), info)
        d = e - lo[:, None]
        esc = (d < 0) | (d >= width[:, None])
    else:
        lut, _ = CT._dense_rank_lut(e.device)
        d = (e - base[:, None]).clamp(-CT._R, CT._R) + CT._R
        esc = lut[0, 0, phase[:, None], d] == F.DENSE_ESC
    worst = esc.to(torch.int32).view(numel // C, C // per_thread, per_thread).sum(2).amax(1)
    return round(float(worst.double().mean()), 2)


def _loop_trips(dtype, per_thread: int) -> dict:
    """The trips of the kernels' tagged loops at ``per_thread`` elements a
    thread: escape loops as Gaussian data makes them (escape_trips), the
    general paths' walks over a chunk one row of 8 a thread a trip."""
    trips = {}
    for tag, n in (("escape rounds", escape_trips(dtype, per_thread)),
                   ("dense escape rounds", escape_trips(dtype, per_thread, "dense")),
                   ("chunk rows", per_thread // 8)):
        trips.update({line: n for line in tagged_loops(tag)})
    return trips


def codec_launches(dtype, codec: str, numel: int = 128 << 20, ndim: int = 1,
                   encode_warps: int | None = None) -> list[Launch]:
    """The launches of encode and decode of ``numel`` elements of ``dtype``
    (a torch dtype) with ``codec``, with realistic argument values: one
    kernel each (format v2); the encode one program per chunk, at
    ``encode_warps`` warps when given, else at ``codec_encode.WARPS``';
    the decode ``codec_decode.chunks_per_program`` chunks a program (its
    chunk loop counted that many times)."""
    info = F.dtype_info(dtype)
    C = F.CHUNK_ELEMS
    nch = F.nchunks_for(numel, C)
    word = {2: "*i16", 4: "*i32"}[info.itemsize]
    header = F.Header(codec, dtype, (numel,) * ndim, numel, C, nch, 0)
    enc, enc_const, enc_warps = E.launch_plan(info, codec, C, encode_warps)
    enc_args = dict(x_ptr=word, out_ptr="*u8", ticket_ptr="*i32", status_ptr="*i64",
                    total_ptr="*i64", numel=numel, nch=nch)
    if "C" in enc.arg_names and "C" not in enc_const:
        enc_args["C"] = C
    enc_args.update(table_off=header.table_offset, offsets_off=header.offsets_offset,
                    body_off=header.body_offset)
    per = D.chunks_per_program(nch, codec)
    dec = D.launcher(info, C, per, codec)  # the kernel decode_into launches once it knows the codec
    enc_trips = _loop_trips(dtype, C // (32 * enc_warps))
    dec_trips = _loop_trips(dtype, C // (32 * dec.num_warps))
    return [
        Launch("encode: encode", enc, enc_args, enc_const, enc_warps, C, reads_input=1,
               loop_trips=enc_trips),
        Launch("decode: decode", D.decode_kernel,
               dict(p_ptr="*u8", out_ptr=word, err_ptr="*i32",
                    pay_nbytes=header.body_offset + numel * info.itemsize * 3 // 4 + 16,
                    numel=numel, nch=nch, C=C, nsums=F.nchunks_for(numel), body_only=0),
               dec.constexprs, dec.num_warps, per * C, trip_count=per, reads_input=1,
               loop_trips=dec_trips),
    ]
