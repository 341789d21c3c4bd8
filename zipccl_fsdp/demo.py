"""``zipccl demo``: 2 ranks train a small llama3 twice, raw and with zipccl, and compare.

The model is torchtitan's own llama3 debugmodel (6 M parameters): the
smallest model whose per-layer messages (0.5-1.7 MB) are large enough for
the link, not its latency, to set their time on a 1 Gbit/s link, so that the
adaptive policy has something to gain (``recipes/llama3_tiny_cpu.toml``, the
smoke recipe, moves 6-130 KB messages whose time is latency).

Both runs are ``zipccl titan --recipe recipes/llama3_debugmodel.toml`` (FSDP2,
gloo, CPU), the first with ``--no-compress`` (FSDP2's own comms), the second
with zipccl's; the same seed and data. As root with ``ip`` and ``tc`` the ranks
run inside a network namespace of our own whose loopback is limited to
``--rate`` (:mod:`zipccl_fsdp.netns`), so their traffic crosses a real slow
link; otherwise they talk over the plain loopback and the demo says so.

Everything in the final table is read back from torchtitan's TensorBoard
event files: per collective the bytes rank 0 would have sent raw and did send
(``zipccl/<kind>/raw_MB``, ``wire_MB``, per step), the time in the exchange,
the encoder and the decoder; the median step time of each run
(``time_metrics/end_to_end(s)``); and whether the two runs' losses
(``loss_metrics/global_avg_loss``) are bitwise equal at every step.
"""
from __future__ import annotations

import argparse
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

from .run_report import collective_table, read_scalars, tensorboard_command, warm_steps

_RECIPE = "llama3_debugmodel.toml"
_STEP_LINE = re.compile(r"step:\s*(\d+)\s+loss:\s*([-\d.naninf]+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RUNS = (("raw", True), ("zipccl", False))  # (name, --no-compress)


def _default_recipe() -> Path:
    """The shipped recipes/llama3_debugmodel.toml."""
    from .titan.launch import find_recipe

    return find_recipe(_RECIPE)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("2 ranks train a small llama3 (FSDP2, CPU) twice, with FSDP2's own comms "
                     "and with zipccl's, over a rate-limited loopback when possible, then print "
                     "one table: bytes per collective, ratio, comm time, step times, and "
                     "whether the losses are bitwise equal.")
    p.add_argument("--steps", type=int, default=20,
                   help="training steps of each run (default: 20)")
    p.add_argument("--rate", default="1gbit",
                   help="tc rate of the namespace loopback, e.g. 1gbit, 100mbit, or 'none' for "
                        "an unthrottled namespace (default: 1gbit; needs root, ip and tc)")
    p.add_argument("--out", default="outputs/demo", metavar="DIR",
                   help="folder for the two runs (DIR/raw, DIR/zipccl: TensorBoard events and "
                        "logs; replaced if present; default: outputs/demo)")
    p.add_argument("--recipe", default=None, metavar="RECIPE",
                   help=f"recipe to train, a file or a shipped recipe's name (default: "
                        f"{Path(_RECIPE).stem})")
    p.add_argument("--every", type=int, default=5, metavar="N",
                   help="print a progress line every N steps (default: 5)")


def run(args: argparse.Namespace) -> int:
    from .cli import require
    from .netns import can_shape, slow_link

    require(("demo",), "torchtitan", "triton", "tokenizers", extra="titan")

    if args.steps < 2:
        raise SystemExit("zipccl demo: --steps must be >= 2")
    if args.recipe:
        from .titan.launch import RecipeError, find_recipe

        try:
            recipe = find_recipe(args.recipe)
        except RecipeError as e:
            raise SystemExit(f"zipccl demo: {e}") from None
    else:
        recipe = _default_recipe()
    out = Path(args.out)
    rate = None if args.rate.lower() in ("none", "unlimited", "0") else args.rate
    ok, why = can_shape()
    if ok:
        link = (f"namespace loopback limited to {rate}" if rate
                else "namespace loopback, unthrottled")
    else:
        link = f"plain loopback, NOT rate-limited ({why}: no shaped namespace)"
    print(f"zipccl demo: {recipe}, {args.steps} steps, twice (raw, then zipccl); link: {link}",
          flush=True)
    print(f"zipccl demo: codec backend on the ranks: {_warm_codec()}", flush=True)
    started = time.perf_counter()
    if ok:
        with slow_link(rate) as ns:
            code = _train_both(args, recipe, out, ns.prefix())
    else:
        code = _train_both(args, recipe, out, [])
    if code:
        return code
    print(format_table(read_runs(out), link=link, steps=args.steps, out=out,
                       seconds=time.perf_counter() - started))
    return 0


def _warm_codec() -> str:
    """Build the C++ codec here, once, so that the ranks load it instead of both
    compiling it at their first collective; say which backend they will use."""
    from . import codec_cpp

    if codec_cpp.available():
        return f"cpp ({codec_cpp.isa()})"
    return f"torch (the C++ codec is unavailable: {codec_cpp.unavailable_reason()})"


def _train_both(args, recipe: Path, out: Path, prefix: list) -> int:
    from .titan import launch

    for name, no_compress in _RUNS:
        dump = out / name
        if dump.exists():
            shutil.rmtree(dump)
        dump.mkdir(parents=True)
        ns = argparse.Namespace(recipe=str(recipe), nproc=None, steps=args.steps,
                                no_compress=no_compress, capture=0, profile=None,
                                dump_folder=str(dump), dry_run=False, overrides=[])
        try:
            prepared = launch.prepare(ns)
        except ValueError as e:
            raise SystemExit(f"zipccl demo: {e}") from None
        env = dict(prepared.env, GLOO_SOCKET_IFNAME="lo")  # the namespace has only lo
        env.setdefault("HF_DATASETS_OFFLINE", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        code = _train(name, [*prefix, *prepared.cmd], env, dump / "train.log",
                      args.steps, args.every)
        if code:
            return code
    return 0


def _train(name: str, cmd: list, env: dict, log_path: Path, steps: int, every: int) -> int:
    """Run one training; print a line every ``every`` steps; keep the log."""
    print(f"  {name:<6} starting {cmd[cmd.index('--nproc_per_node') + 1]} ranks "
          f"(log: {log_path})", flush=True)
    t0 = last_t = time.perf_counter()
    last_step = 0
    tail: list = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in proc.stdout:
            log.write(line)
            tail = (tail + [line])[-40:]
            m = _STEP_LINE.search(_ANSI.sub("", line))
            if not m:
                continue
            step, now = int(m.group(1)), time.perf_counter()
            if step % every == 0 or step in (1, steps):
                if last_step:
                    pace = f"{(now - last_t) / (step - last_step):5.2f} s/step"
                else:
                    pace = f"{now - t0:5.1f} s with start-up"
                print(f"  {name:<6} step {step:>3}/{steps}  loss {float(m.group(2)):8.5f}  "
                      f"{pace}", flush=True)
                last_t, last_step = now, step
        code = proc.wait()
    if code:
        print(f"  {name}: training failed (exit code {code}); last lines of {log_path}:",
              file=sys.stderr)
        sys.stderr.write("".join(tail))
        return code
    print(f"  {name:<6} done in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


def read_runs(out: Path) -> dict:
    return {name: read_scalars(out / name) for name, _ in _RUNS}


def _bits(values: dict) -> dict:
    return {step: struct.pack("<f", v) for step, v in values.items()}


def format_table(runs: dict, *, link: str, steps: int, out: Path, seconds: float) -> str:
    raw, zc = runs["raw"], runs["zipccl"]
    lines = ["", f"zipccl demo: 2 ranks, {steps} steps each, {link}",
             *collective_table(zc, steps)]
    link = zc.get("zipccl/calibration/link_MBps", {})
    if link:
        slow = ", ".join(f"{zc[tag][max(zc[tag])]:.1f}x ({tag.rsplit('_', 1)[1]})"
                         for tag in sorted(zc) if tag.startswith("zipccl/calibration/slowdown_"))
        lines.append(f"{'policy measured':<16}link {link[max(link)]:.0f} MB/s per rank"
                     + (f"; the codec ran {slow}" if slow else ""))
        if slow:
            lines.append(f"{'':<16}slower inside a collective than alone: what it decided with")
    t_raw = warm_steps(raw.get("time_metrics/end_to_end(s)", {}))
    t_zc = warm_steps(zc.get("time_metrics/end_to_end(s)", {}))
    if t_raw and t_zc:
        m_raw, m_zc = statistics.median(t_raw.values()), statistics.median(t_zc.values())
        lines.append(f"{'step time':<16}raw {m_raw * 1e3:.0f} ms, zipccl {m_zc * 1e3:.0f} ms "
                     f"(median; raw/zipccl {m_raw / m_zc:.2f})")
    tag = "loss_metrics/global_avg_loss"
    l_raw, l_zc = raw.get(tag, {}), zc.get(tag, {})
    same = l_raw and _bits(l_raw) == _bits(l_zc)
    n_equal = sum(1 for s in l_raw if s in l_zc and _bits({0: l_raw[s]}) == _bits({0: l_zc[s]}))
    final = f"; final loss {l_zc[max(l_zc)]:.5f}" if l_zc else ""
    lines.append(f"{'losses bitwise':<16}{'yes' if same else 'NO'} "
                 f"({n_equal} of {len(l_raw)} logged steps equal{final})")
    lines.append(f"{'tensorboard':<16}{tensorboard_command(out)}")
    lines.append(f"{'':<16}(whole demo {seconds:.0f} s)")
    return "\n".join(lines)


if __name__ == "__main__":
    from .cli import main

    sys.exit(main(["demo", *sys.argv[1:]]))
