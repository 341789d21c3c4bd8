"""What a torchtitan run wrote, read back for people: its TensorBoard scalars,
the per-collective table that ``zipccl demo`` and ``zipccl titan`` print,
and a TensorBoard command that works in a fresh shell. Imports neither torch
nor torchtitan at module level (the commands' parent processes need neither
to start)."""
from __future__ import annotations

import shlex
import statistics
import sys
from pathlib import Path


def read_scalars(dump: Path, since: float | None = None) -> dict:
    """``{tag: {step: value}}`` of the TensorBoard event files under ``dump/tb``
    (with ``since``, only of the files written after that ``time.time()``: a
    dump folder keeps the event files of earlier runs)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict = {}
    files = [p for p in dump.glob("tb/**/events.out.tfevents.*")
             if since is None or p.stat().st_mtime >= since]
    for folder in sorted({p.parent for p in files}):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return scalars


def warm_steps(values: dict) -> dict:
    """Steps 2 on: step 1 carries one-time costs (config check, first encodes)."""
    return {s: v for s, v in values.items() if s >= 2}


def tensorboard_command(logdir: Path) -> str:
    """A TensorBoard command that runs in a fresh shell: this environment's
    ``tensorboard`` by its full path (an environment that is not activated
    is not on PATH), on the absolute ``logdir``."""
    script = Path(sys.executable).parent / "tensorboard"
    program = [str(script)] if script.exists() else [sys.executable, "-m", "tensorboard.main"]
    return shlex.join([*program, "--logdir", str(Path(logdir).resolve())])


def collective_table(zc: dict, steps: int) -> list:
    """The lines of the per-collective table of a compressed run's scalars
    (``read_scalars``): raw MB, wire MB, ratio, comm/encode/decode ms per step
    and the share of calls sent compressed, per collective kind."""
    from .stats import KINDS  # here: the demo's parent process need not load torch to start

    head = (f"{'collective':<16}{'raw MB':>9}{'wire MB':>10}{'ratio':>8}{'comm ms':>10}"
            f"{'encode ms':>11}{'decode ms':>11}{'compressed':>12}")
    lines = [head, "-" * len(head)]
    for kind in KINDS:
        cols = {n: warm_steps(zc.get(f"zipccl/{kind}/{n}", {}))
                for n in ("raw_MB", "wire_MB", "comm_ms", "encode_ms", "decode_ms", "calls",
                          "compressed_calls")}
        if not cols["raw_MB"]:
            continue
        mean = {n: statistics.fmean(v.values()) if v else float("nan") for n, v in cols.items()}
        ratio = sum(cols["raw_MB"].values()) / max(sum(cols["wire_MB"].values()), 1e-12)
        calls = sum(cols["calls"].values())
        share = f"{sum(cols['compressed_calls'].values()) / calls:.0%}" if calls else "-"
        lines.append(f"{kind:<16}{mean['raw_MB']:>9.3f}{mean['wire_MB']:>10.3f}{ratio:>8.2f}"
                     f"{mean['comm_ms']:>10.1f}{mean['encode_ms']:>11.1f}"
                     f"{mean['decode_ms']:>11.1f}{share:>12}")
    if len(lines) == 2:
        lines.append("(no zipccl/<kind>/* scalars: was the run compressed?)")
    lines.append(f"{'':<16}per step, rank 0, mean of steps 2-{steps}; compressed: the")
    lines.append(f"{'':<16}calls the policy (ZipCCLConfig.policy) sent compressed")
    lines.append("-" * len(head))
    return lines
