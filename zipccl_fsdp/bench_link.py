"""``zipccl bench link``: collectives, and a tiny training run, raw vs zipccl over a real slow link.

As root, the ranks run inside a network namespace of our own whose loopback
is rate-limited with tc (``--rate``, default 1gbit), so gloo traffic crosses a
real bottleneck; every rank's traffic shares that one loopback. Each round
runs every variant once (raw; zipccl; with ``--with-never`` zipccl's own raw
path), in an order rotated from round to round and each after 10 ms of idle
link, so that none profits from a refilled tbf burst more than another; the
first round warms up and lets the adaptive policy calibrate. The time of a
call is the slowest rank's, and a row shows medians of ``--repeat`` rounds and
their ratio (raw / zipccl: above 1 means zipccl is faster). Beside it: what
the policy did (``plan``: raw, or codec x pieces), what its cost model
predicted for raw and for its plan, and the measured ratio of raw to wire
bytes. Tables and how they were taken: docs/benchmarks.md, "Link benchmark".

Message size is the full tensor on each rank: the all-gather output, the
reduce-scatter input, the all-reduce tensor, the all-to-all input. Data is
Gaussian (bf16, or fp32 exact casts of bf16: FSDP2's gradients) or, with
``--input``, the tensors of a capture file (``zipccl titan --capture``) tiled
to the size. ``--titan`` also trains a torchtitan recipe (by default the
demo's, ``recipes/llama3_debugmodel.toml``: torchtitan's llama3 debugmodel)
inside the same namespace, alternating raw (FSDP2's own comms) and zipccl
runs, and reports the median step time.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .bench_codec import parse_size

CASES = {
    "all_gather": "bf16",
    "reduce_scatter": "bf16-casts",
    "all_reduce": "bf16",
    "all_to_all": "bf16",
}
"""Collective -> data measured by default (``--collectives`` picks)."""

_CAPTURE_KIND = {"all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
                 "all_reduce": "reduce_scatter", "all_to_all": "all_gather"}
"""With ``--input``: which captured kind feeds each collective (gradients for
reductions, parameters otherwise)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------
# Worker: one rank
# --------------------------------------------------------------------------
def _capture_data(path: str, kind: str) -> torch.Tensor:
    from safetensors.torch import load_file
    tensors = load_file(path)
    want = _CAPTURE_KIND[kind]
    parts = [t.reshape(-1) for name, t in sorted(tensors.items())
             if name.split(".")[0] == want and t.is_floating_point() and t.numel()]
    if not parts:
        parts = [t.reshape(-1) for _, t in sorted(tensors.items())
                 if t.dtype in (torch.bfloat16, torch.float16, torch.float32) and t.numel()]
    if not parts:
        raise SystemExit(f"{path}: no float tensors to measure")
    dtype = parts[0].dtype
    return torch.cat([p for p in parts if p.dtype == dtype])


def _data(spec: dict, kind: str, size: int, rank: int, world: int) -> torch.Tensor:
    """This rank's message of ``size`` bytes for ``kind`` (numel a multiple of world)."""
    if spec.get("input"):
        src = _capture_data(spec["input"], kind)
        numel = size // src.element_size() // world * world
        reps = -(-numel // max(src.numel(), 1)) + 1
        tiled = src.repeat(reps)
        shift = rank * src.numel() // max(world, 1)  # ranks hold different values
        return tiled[shift:shift + numel].clone()
    data = spec["cases"][kind]
    itemsize = 4 if data == "bf16-casts" else 2
    numel = size // itemsize // world * world
    g = torch.Generator().manual_seed(1000 * rank + size % 997)
    x = torch.randn(numel, generator=g)
    return x.bfloat16().float() if data == "bf16-casts" else x.bfloat16()


def _calls(kind: str, x: torch.Tensor, world: int, cfg, dist, zc, st):
    """(raw call, zipccl call counted in ``st``, its call site, its traffic for the model)."""
    from . import cost as M
    from ._reduce import SUM, torch_sums_alike
    from .protocol import all_gather_single as ag_raw
    from .protocol import reduce_scatter_single as rs_raw
    numel, itemsize = x.numel(), x.element_size()
    if kind == "all_gather":
        inp = x[: numel // world].clone()
        out = torch.empty(numel, dtype=x.dtype)
        return (lambda: ag_raw(out, inp),
                lambda: zc.all_gather_single(out, inp, config=cfg, stats=st),
                ("all_gather", tuple(inp.shape), x.dtype),
                (M.gather(world, inp.numel() * itemsize),))
    if kind == "reduce_scatter":
        out = torch.empty(numel // world, dtype=x.dtype)
        return (lambda: rs_raw(out, x),
                lambda: zc.reduce_scatter_single(out, x, config=cfg, stats=st),
                ("reduce_scatter", tuple(x.shape), x.dtype),
                (M.scatter_reduce(world, out.numel() * itemsize),))
    if kind == "all_reduce":
        buf = x.clone()
        return (lambda: dist.all_reduce(buf), lambda: zc.all_reduce(buf, config=cfg, stats=st),
                ("all_reduce", tuple(buf.shape), x.dtype),
                (M.scatter_reduce(world, numel // world * itemsize,
                                  not torch_sums_alike(world, SUM, x.dtype, x.device)),
                 M.gather(world, numel // world * itemsize)))
    out = torch.empty_like(x)
    send = numel // world * (world - 1) * itemsize
    return (lambda: dist.all_to_all_single(out, x),
            lambda: zc.all_to_all_single(out, x, config=cfg, stats=st),
            ("all_to_all", (), x.dtype),
            (M.Traffic(send, send, send, world - 1, world - 1),))


def _worker(spec: dict) -> None:
    import torch.distributed as dist

    from . import collectives as zc
    from . import policy as P
    from .protocol import group_key
    from .config import ZipCCLConfig
    from .stats import CommStats

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    results = []
    for size in spec["sizes"]:
        for kind in spec["collectives"]:
            # A fresh config per row: the policy calibrates in the warm-up round.
            cfg = ZipCCLConfig(codec=spec["codec"], policy=spec["policy"],
                               min_bytes=spec["min_bytes"])
            x = _data(spec, kind, size, rank, world)
            st = CommStats()
            raw, zc_call, site, parts = _calls(kind, x, world, cfg, dist, zc, st)
            variants = [("raw", raw), ("zipccl", zc_call)]
            if spec.get("with_never"):
                never = ZipCCLConfig(policy="never", min_bytes=spec["min_bytes"])
                variants.append(("never", _calls(kind, x, world, never, dist, zc, CommStats())[1]))
            times = {name: [] for name, _ in variants}
            decisions_before = None
            for i in range(spec["repeat"] + 1):  # round 0 warms up and calibrates
                if i == 1:
                    decisions_before = dict(P.of(cfg, st).decisions)
                    st_before = st.snapshot()[kind]
                # Rotate the order so every variant goes first equally often, and
                # let the link idle before each call: a tbf bucket refills while
                # idle (its burst), and a call that follows another finds it empty.
                for name, fn in variants[i % len(variants):] + variants[:i % len(variants)]:
                    dist.barrier()
                    time.sleep(spec.get("gap_s", 0.01))
                    dist.barrier()
                    t0 = time.perf_counter()
                    fn()
                    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank is the time
                    if i:
                        times[name].append(float(t))
            after = dict(P.of(cfg, st).decisions)
            used = {k: after[k] - decisions_before.get(k, 0) for k in after
                    if after[k] - decisions_before.get(k, 0)}
            plan = ", ".join(f"{k[1]}" + (f" x{k[2]}" if k[1] != "raw" and k[2] > 1 else "")
                             for k, _ in sorted(used.items(), key=lambda kv: -kv[1]))
            s_now = st.snapshot()[kind]
            if not plan:  # no decision counted: a pinned policy, or every call raw for its size
                pinned = s_now["compressed_calls"] > st_before["compressed_calls"]
                plan = f"{cfg.codec} pinned" if pinned else "raw"
            wire = s_now["wire_bytes"] - st_before["wire_bytes"]
            rawb = s_now["raw_bytes"] - st_before["raw_bytes"]
            model = {}
            report = P.of(cfg, st).calibration.report()
            probe = report["probes"].get((group_key(group), x.dtype, x.device.type))
            if probe:  # the in-situ A/B that calibrated this row (Calibration._in_situ)
                model.update(codec_slowdown=probe["slowdown"], ab_raw_ms=probe["raw_s"] * 1e3,
                             ab_zipccl_ms=probe["zipccl_s"] * 1e3)
            if report["speeds"]:
                try:
                    e = P.of(cfg, st).explain(group, site, x.dtype, x.device, parts)
                    model.update(pred_raw_ms=e["predicted_raw_s"] * 1e3,
                                 pred_zipccl_ms=e["predicted_s"] * 1e3,
                                 link_MBps=e["link"].bytes_per_s / 1e6,
                                 latency_us=e["link"].latency_s * 1e6)
                except KeyError:
                    pass
            r = statistics.median(times["raw"])
            c = statistics.median(times["zipccl"])
            data = "capture" if spec.get("input") else spec["cases"][kind]
            row = dict(collective=kind, data=data, size_mib=size / 2**20, raw_ms=r * 1e3,
                       zipccl_ms=c * 1e3, speedup=r / c, plan=plan,
                       wire_ratio=(rawb / wire) if wire else 1.0, runs=spec["repeat"],
                       pred_raw_ms=model.get("pred_raw_ms"),
                       pred_zipccl_ms=model.get("pred_zipccl_ms"),
                       link_MBps=model.get("link_MBps"), latency_us=model.get("latency_us"),
                       codec_slowdown=model.get("codec_slowdown"),
                       ab_raw_ms=model.get("ab_raw_ms"), ab_zipccl_ms=model.get("ab_zipccl_ms"),
                       never_ms=statistics.median(times["never"]) * 1e3 if "never" in times
                       else None)
            results.append(row)
            if rank == 0:
                print("  " + _format_row(row), flush=True)
    if rank == 0:
        with open(spec["out"], "w") as fh:
            json.dump(results, fh)
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------
def run_ranks(spec: dict, nproc: int, prefix: list) -> list:
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        spec = dict(spec, out=os.path.join(tmp, "result.json"))
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as fh:
            json.dump(spec, fh)
        procs = []
        for rank in range(nproc):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                       OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // nproc)))
            procs.append(subprocess.Popen(
                [*prefix, sys.executable, "-m", "zipccl_fsdp.bench_link", "--worker", spec_path],
                env=env))
        try:
            codes = [p.wait() for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(codes):
            raise SystemExit(f"a rank failed (exit codes {codes})")
        with open(spec["out"]) as fh:
            return json.load(fh)


def _titan_runs(args, prefix: list) -> dict:
    """Train the recipe alternately raw and with zipccl; median step time of each run."""
    from . import demo, run_report
    from .titan import launch
    from .titan.comms import SETTINGS_ENV

    recipe = args.recipe or str(demo._default_recipe())
    times: dict = {"raw": [], "zipccl": []}
    fractions = []
    out = Path(tempfile.mkdtemp(prefix="zipccl_bench_titan_"))
    try:
        for i in range(args.titan_runs):
            for name in (("raw", "zipccl") if i % 2 == 0 else ("zipccl", "raw")):
                dump = out / f"{name}{i}"
                ns = argparse.Namespace(recipe=recipe, nproc=None, steps=args.titan_steps,
                                        no_compress=name == "raw", capture=0, profile=None,
                                        dump_folder=str(dump), dry_run=False, overrides=[])
                prepared = launch.prepare(ns)
                env = dict(prepared.env, GLOO_SOCKET_IFNAME="lo", HF_DATASETS_OFFLINE="1",
                           HF_HUB_OFFLINE="1")
                if name == "zipccl":
                    # The recipe's [zipccl] table, with this command's policy and codec.
                    settings = json.loads(env[SETTINGS_ENV])
                    settings["config"].update(policy=args.policy, codec=args.codec)
                    env[SETTINGS_ENV] = json.dumps(settings, sort_keys=True)
                dump.mkdir(parents=True)
                code = demo._train(name, [*prefix, *prepared.cmd], env, dump / "train.log",
                                   args.titan_steps, max(args.titan_steps, 1))
                if code:
                    raise SystemExit(f"zipccl bench link: the {name} training failed")
                scalars = run_report.read_scalars(dump)
                steps = {s: v for s, v in scalars.get("time_metrics/end_to_end(s)", {}).items()
                         if s >= 3}  # steps 1-2: start-up, calibration, first encodes
                if not steps:
                    raise SystemExit(f"zipccl bench link: no step times in {dump}")
                times[name].append(statistics.median(steps.values()))
                if name == "zipccl":
                    calls = sum(sum(scalars.get(f"zipccl/{k}/calls", {}).values())
                                for k in ("all_gather", "reduce_scatter"))
                    comp = sum(sum(scalars.get(f"zipccl/{k}/compressed_calls", {}).values())
                               for k in ("all_gather", "reduce_scatter"))
                    fractions.append(comp / calls if calls else 0.0)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    r, c = statistics.median(times["raw"]), statistics.median(times["zipccl"])
    print("  titan step medians per run (ms): raw "
          + ", ".join(f"{t * 1e3:.0f}" for t in times["raw"]) + "; zipccl "
          + ", ".join(f"{t * 1e3:.0f}" for t in times["zipccl"]), flush=True)
    return dict(collective="titan step", data=Path(recipe).stem, size_mib=0.0,
                raw_ms=r * 1e3, zipccl_ms=c * 1e3, speedup=r / c,
                plan=f"compressed {statistics.fmean(fractions):.0%} of calls" if fractions else "",
                wire_ratio=None, runs=args.titan_runs, pred_raw_ms=None, pred_zipccl_ms=None,
                link_MBps=None, latency_us=None, never_ms=None,
                raw_runs_ms=[t * 1e3 for t in times["raw"]],
                zipccl_runs_ms=[t * 1e3 for t in times["zipccl"]])


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _format_row(r: dict) -> str:
    return (f"{r['collective']:<15} {r['data']:<15} {r['size_mib']:>6g} {r['raw_ms']:>9.1f} "
            f"{r['zipccl_ms']:>10.1f} {r['speedup']:>10.2f}  {r['plan']:<14} "
            f"{_fmt(r.get('wire_ratio'), '.2f'):>6} {_fmt(r.get('pred_raw_ms'), '.1f'):>9} "
            f"{_fmt(r.get('pred_zipccl_ms'), '.1f'):>10}"
            + (f" {_fmt(r.get('never_ms'), '.1f'):>9}" if r.get("never_ms") is not None else ""))


def format_table(rows: list, link: str) -> str:
    head = (f"{'collective':<15} {'data':<15} {'MiB':>6} {'raw ms':>9} {'zipccl ms':>10} "
            f"{'raw/zipccl':>10}  {'plan':<14} {'ratio':>6} {'model raw':>9} {'model zip':>10}"
            + (f" {'never ms':>9}" if any(r.get("never_ms") is not None for r in rows) else ""))
    lines = [f"link: {link}", head, "-" * len(head)]
    lines += [_format_row(r) for r in rows]
    speeds = [r for r in rows if r.get("link_MBps")]
    if speeds:
        lines.append(f"calibrated link: {speeds[-1]['link_MBps']:.0f} MB/s per rank, latency "
                     f"{speeds[-1]['latency_us']:.0f} us (the last row's; model columns in ms)")
    return "\n".join(lines)


def plot(rows: list, path: str, link: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, data in sorted({(r["collective"], r["data"]) for r in rows if r["size_mib"]}):
        pts = [(r["size_mib"], r["speedup"]) for r in rows
               if r["collective"] == kind and r["data"] == data]
        ax.plot(*zip(*pts), marker="o", label=f"{kind} ({data})")
    for r in rows:
        if r["collective"] == "titan step":
            ax.axhline(r["speedup"], color="tab:purple", ls="--", lw=1,
                       label=f"{r['data']} step time ({r['speedup']:.2f})")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (MiB)")
    ax.set_ylabel("speedup (raw time / zipccl time)")
    ax.set_title(f"zipccl vs raw, {link}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rate", default="1gbit",
                   help="tc rate of the namespace loopback, e.g. 1gbit, 10gbit, or 'none' for "
                        "unthrottled (default: 1gbit)")
    p.add_argument("--sizes", default="1MiB,4MiB,16MiB,64MiB",
                   help="comma-separated message sizes (default: 1MiB,4MiB,16MiB,64MiB)")
    p.add_argument("--collectives", default="all_gather,reduce_scatter,all_reduce",
                   help=f"comma-separated, of {', '.join(CASES)} (default: all_gather,"
                        f"reduce_scatter,all_reduce); data: "
                        + ", ".join(f"{k} {v}" for k, v in CASES.items()))
    p.add_argument("--nproc", type=int, default=2, help="ranks (default: 2)")
    p.add_argument("--codec", default="auto",
                   help="zipccl codec; 'auto' lets the adaptive policy choose (default: auto)")
    p.add_argument("--policy", default="adaptive", choices=("adaptive", "always", "never"),
                   help="ZipCCLConfig.policy of the zipccl calls (default: adaptive)")
    p.add_argument("--min-bytes", type=int, default=0,
                   help="ZipCCLConfig.min_bytes of the zipccl calls (default: 0)")
    p.add_argument("--repeat", type=int, default=5,
                   help="timed rounds per row, every variant once a round in rotated order "
                        "(median; default 5)")
    p.add_argument("--with-never", action="store_true",
                   help="also time zipccl with policy='never' (column 'never ms'): zipccl's own "
                        "raw path, which for reductions is an all-to-all and an fp32 sum in rank "
                        "order rather than torch's reduction")
    p.add_argument("--input", metavar="FILE.safetensors",
                   help="message data from this capture file (zipccl titan --capture), tiled "
                        "to each size, instead of Gaussian data")
    p.add_argument("--titan", action="store_true",
                   help="also train a torchtitan recipe raw and with zipccl (alternating "
                        "runs) and report the median step time")
    p.add_argument("--recipe", metavar="FILE", help="with --titan: the recipe "
                                                    "(default: recipes/llama3_debugmodel.toml)")
    p.add_argument("--titan-steps", type=int, default=20,
                   help="with --titan: steps per run; steps 1-2 are left out (default: 20)")
    p.add_argument("--titan-runs", type=int, default=2,
                   help="with --titan: runs of each (default: 2)")
    p.add_argument("--csv", metavar="FILE", help="write the rows to this CSV file")
    p.add_argument("--plot", metavar="FILE.png", help="plot speedup against message size")
    p.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from .netns import can_shape, slow_link
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    kinds = [k.strip() for k in args.collectives.split(",") if k.strip()]
    bad = [k for k in kinds if k not in CASES]
    if bad:
        raise SystemExit(f"zipccl bench link: unknown collective {bad[0]!r}; "
                         f"choose from {', '.join(CASES)}")
    if args.input and not os.path.exists(args.input):
        raise SystemExit(f"zipccl bench link: {args.input}: no such file")
    spec = dict(sizes=sizes, collectives=kinds, cases=CASES, codec=args.codec,
                policy=args.policy, min_bytes=args.min_bytes, repeat=args.repeat,
                with_never=args.with_never,
                input=os.path.abspath(args.input) if args.input else None)
    rate = None if args.rate.lower() in ("none", "unlimited", "0") else args.rate
    ok, why = can_shape()
    if ok:
        link = f"namespace loopback shaped to {rate}" if rate else "namespace loopback, unthrottled"
    else:
        link = f"plain loopback, unthrottled ({why}: cannot create a shaped namespace)"
    print(f"zipccl bench link: {args.nproc} ranks, {link}, policy {args.policy}, codec "
          f"{args.codec}, median of {args.repeat} rotated rounds", flush=True)
    if ok:
        with slow_link(rate) as ns:
            rows = run_ranks(spec, args.nproc, ns.prefix()) if sizes and kinds else []
            if args.titan:
                rows.append(_titan_runs(args, ns.prefix()))
    else:
        rows = run_ranks(spec, args.nproc, []) if sizes and kinds else []
        if args.titan:
            rows.append(_titan_runs(args, []))
    print(format_table(rows, link))
    stamp = dict(link=link, policy=args.policy, codec=args.codec,
                 time=datetime.datetime.now().isoformat(timespec="seconds"),
                 torch=torch.__version__)
    if args.csv and rows:
        fields = list(stamp) + [k for k in rows[0] if k not in ("raw_runs_ms", "zipccl_runs_ms")]
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({**stamp, **r})
        print(f"rows written to {args.csv}")
    if args.plot and rows:
        plot(rows, args.plot, link)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        with open(sys.argv[2]) as fh:
            _worker(json.load(fh))
    else:
        raise SystemExit("use: zipccl bench link")
