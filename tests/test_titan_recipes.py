"""``zipccl titan`` trains recipes/llama3_tiny_cpu.toml with and without zipccl.

Three real runs through the CLI (torchrun, 2 gloo ranks, 20 steps): one with
zipccl's comms, ``--capture 2`` and ``--profile 4``, one with ``--policy
never`` (zipccl's comms sending every byte raw) and one with
``--no-compress``. Read back from torchtitan's TensorBoard event files:
every logged loss and gradient norm is bitwise the same in all three; the
compressed run carries ``zipccl/<kind>/{raw_MB,wire_MB,ratio,comm_ms,
encode_ms,decode_ms}`` for all-gathers and reduce-scatters at every step,
per step (not running totals), with fewer bytes on the wire than raw. The
capture file goes through ``zipccl bench codec --input`` and ``zipccl
inspect``; the trace holds zipccl's record_function ranges. Fast checks:
every recipe in recipes/ passes the launcher's and torchtitan's checks, bad
recipe keys are errors naming key and file, and the ``--help`` texts.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("tokenizers")

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
TINY = RECIPES / "llama3_tiny_cpu.toml"
STEPS = 20
RUN_TIMEOUT_S = 240
TAGS = ("raw_MB", "wire_MB", "ratio", "comm_ms", "encode_ms", "decode_ms", "compressed_fraction")


def _env(cache: Path) -> dict:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p),
        OMP_NUM_THREADS="1",
        ZIPCCL_FSDP_CACHE_DIR=str(cache),
        HF_HOME=str(cache / "hf"),
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
    )
    return env


def _zipccl(args: list, env: dict, timeout: int = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zipccl_fsdp.cli", *map(str, args)],
                          cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def _scalars(dump: Path) -> dict:
    from zipccl_fsdp.run_report import read_scalars

    return read_scalars(dump)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, build_cache):
    env = _env(build_cache)
    out = {}
    for name, extra in (("zipccl", ["--capture", "2", "--profile", "4"]),
                        ("never", ["--policy", "never"]), ("raw", ["--no-compress"])):
        dump = tmp_path_factory.mktemp(name)
        proc = _zipccl(["titan", "--recipe", TINY, "--steps", STEPS, "--dump-folder", dump,
                        *extra, "--", "--comm.init_timeout_seconds", "60"], env)
        if proc.returncode != 0:
            pytest.fail(f"zipccl titan ({name}) exited {proc.returncode}:\n{proc.stdout[-6000:]}")
        out[name] = (dump, _scalars(dump), proc.stdout)
    out["env"] = env
    return out


def _bits(values: dict) -> list:
    return [(step, struct.pack("<f", v).hex()) for step, v in sorted(values.items())]


def test_losses_bitwise_identical_with_and_without_compression(runs):
    for tag in ("loss_metrics/global_avg_loss", "loss_metrics/global_max_loss", "grad_norm"):
        raw, zc = runs["raw"][1][tag], runs["zipccl"][1][tag]
        assert sorted(zc) == list(range(1, STEPS + 1)), tag
        assert all(math.isfinite(v) for v in zc.values()), (tag, zc)
        assert _bits(zc) == _bits(raw), tag
        assert _bits(zc) == _bits(runs["never"][1][tag]), tag


def _assert_compressed(scalars: dict) -> None:
    assert set(scalars["zipccl/config/compressed"].values()) == {1.0}, (
        "the zipccl run fell back to FSDP2's comms: does zipccl_fsdp export "
        "register_comm_hook and ZipCCLHook?")


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_per_step_zipccl_scalars_beside_torchtitans(runs, kind):
    scalars = runs["zipccl"][1]
    _assert_compressed(scalars)
    assert "loss_metrics/global_avg_loss" in scalars  # the same event files
    for name in TAGS:
        assert sorted(scalars[f"zipccl/{kind}/{name}"]) == list(range(1, STEPS + 1)), name
    raw, wire = scalars[f"zipccl/{kind}/raw_MB"], scalars[f"zipccl/{kind}/wire_MB"]
    for step in raw:
        assert 0 < wire[step] < raw[step], (step, raw[step], wire[step])
        ratio = scalars[f"zipccl/{kind}/ratio"][step]
        assert ratio == pytest.approx(raw[step] / wire[step], rel=1e-4)
    # Per step, not cumulative: every step after the first moves the same tensors.
    assert raw[STEPS] == pytest.approx(raw[2], rel=1e-6)
    calls = scalars[f"zipccl/{kind}/calls"]
    compressed = scalars[f"zipccl/{kind}/compressed_calls"]
    assert all(compressed[s] > 0 and calls[s] >= compressed[s] for s in calls)
    fraction = scalars[f"zipccl/{kind}/compressed_fraction"]
    assert all(fraction[s] == pytest.approx(compressed[s] / calls[s]) for s in calls)


def test_baseline_run_has_no_zipccl_traffic(runs):
    scalars = runs["raw"][1]
    assert set(scalars["zipccl/config/compressed"].values()) == {0.0}
    assert not [t for t in scalars if t.startswith(("zipccl/all_gather", "zipccl/reduce_scatter"))]


def test_titan_says_what_it_installed_and_what_it_saved(runs):
    """One line from the ranks when zipccl's comms are installed; at the end
    the demo's table per collective and a TensorBoard command by full path."""
    from zipccl_fsdp.run_report import tensorboard_command

    dump, scalars, out = runs["zipccl"]
    assert out.count("zipccl: compressed comms installed (FSDP2 comm hook): "
                     "all_gather, reduce_scatter; codec=dense, min_bytes=4096, policy=always"
                     ) == 1, out[-6000:]
    tail = out[out.index(f"zipccl titan: {STEPS} steps, {dump}"):].splitlines()
    assert tail[1].split() == ["collective", "raw", "MB", "wire", "MB", "ratio", "comm", "ms",
                               "encode", "ms", "decode", "ms", "compressed"]
    rows = {line.split()[0]: line.split() for line in tail[3:5]}
    assert sorted(rows) == ["all_gather", "reduce_scatter"], tail
    for kind, row in rows.items():
        warm = {n: sum(v for s, v in scalars[f"zipccl/{kind}/{n}"].items() if s >= 2)
                for n in ("raw_MB", "wire_MB", "calls", "compressed_calls")}
        assert float(row[3]) == pytest.approx(warm["raw_MB"] / warm["wire_MB"], abs=0.006), row
        assert float(row[3]) > 1, row
        assert row[-1] == f"{warm['compressed_calls'] / warm['calls']:.0%}", row
    assert tail[-1] == f"zipccl titan: {tensorboard_command(dump / 'tb')}"
    dump, _, out = runs["raw"]
    assert out.count("zipccl: comms not installed (--no-compress): FSDP2's own") == 1
    assert not any(line.startswith("collective ") for line in out.splitlines())
    assert out.rstrip().endswith(f"zipccl titan: {tensorboard_command(dump / 'tb')}")


def test_capture_round_trips_through_bench_codec_and_inspect(runs):
    from safetensors.torch import load_file

    from zipccl_fsdp.capture import read_capture_metadata

    _assert_compressed(runs["zipccl"][1])
    dump = runs["zipccl"][0]
    for rank in (0, 1):
        path = dump / f"capture_rank{rank}.safetensors"
        meta = read_capture_metadata(str(path))
        tensors = load_file(str(path))
        assert sorted(meta) == sorted(tensors) == [
            "all_gather.0", "all_gather.1", "reduce_scatter.0", "reduce_scatter.1"]
        for name, record in meta.items():
            assert record["kind"] == name.split(".")[0]
            assert record["rank"] == rank and record["step"] == 1
            assert record["dtype"] == str(tensors[name].dtype).split(".")[-1]
    path = dump / "capture_rank0.safetensors"
    bench = _zipccl(["bench", "codec", "--input", path, "--repeat", "1", "--no-zstd"],
                    runs["env"])
    assert bench.returncode == 0, bench.stdout[-3000:]
    rows = [line for line in bench.stdout.splitlines() if "zipccl dense" in line]
    assert len(rows) == 2, bench.stdout  # bf16 parameters, fp32 gradients
    assert all(line.rstrip().endswith("yes") for line in rows), bench.stdout
    inspect = _zipccl(["inspect", path], runs["env"])
    assert inspect.returncode == 0, inspect.stdout[-3000:]
    assert "4 tensors" in inspect.stdout
    assert "reduce_scatter.1" in inspect.stdout and "all_gather" in inspect.stdout


def test_profile_writes_tensorboard_trace_with_zipccl_ranges(runs):
    traces = sorted((runs["zipccl"][0] / "profiling" / "traces").glob("rank0.*.pt.trace.json"))
    assert len(traces) == 1, traces
    events = json.loads(traces[0].read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    for phase in ("zipccl::all_gather::encode", "zipccl::reduce_scatter::exchange"):
        assert phase in names


# ------------------------------------------------------------ fast checks
def _launch_args(recipe, *extra) -> argparse.Namespace:
    from zipccl_fsdp.titan import launch

    p = argparse.ArgumentParser()
    launch.add_arguments(p)
    return p.parse_args(["--recipe", str(recipe), *extra])


@pytest.fixture
def quiet_env(build_cache):
    return build_cache


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.toml")), ids=lambda p: p.name)
def test_every_recipe_passes_launcher_and_torchtitan_checks(recipe, quiet_env):
    from zipccl_fsdp.titan import launch
    from zipccl_fsdp.titan.comms import SETTINGS_ENV, RunSettings

    prepared = launch.prepare(_launch_args(recipe, "--dump-folder", "x"))
    r = launch.load_recipe(recipe)
    assert r.description and r.zipccl.get("codec")
    cmd = prepared.cmd
    assert cmd[cmd.index("--nproc_per_node") + 1] == str(r.nproc)
    assert cmd[cmd.index("--module") + 1] == r.module
    assert cmd[cmd.index("--config") + 1] == r.config
    settings = RunSettings(**json.loads(prepared.env[SETTINGS_ENV]))
    cfg = settings.zipccl_config()
    assert settings.compress and cfg.codec == r.zipccl["codec"]
    assert cfg.policy == r.zipccl.get("policy", "adaptive")


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text('[titan]\nmodule = "zipccl_fsdp.titan"\nconfig = "llama3_tiny"\n' + text)
    return path


@pytest.mark.parametrize("text, key", [
    ("[training]\nstepz = 3\n", "training.stepz"),
    ("[zipccl]\ncodecs = 'dense'\n", "codecs"),
    ("nprocs = 2\n", "nprocs"),  # a top-level key is a torchtitan setting
    ("[paralellism]\ndata_parallel_shard_degree = 2\n", "paralellism"),
])
def test_unknown_recipe_key_is_an_error_naming_key_and_file(tmp_path, quiet_env, text, key):
    from zipccl_fsdp.cli import main

    path = _write(tmp_path, text)
    with pytest.raises(SystemExit) as e:
        main(["titan", "--recipe", str(path), "--dry-run"])
    message = str(e.value.code)
    assert str(path) in message and key in message and "unknown key" in message


def test_bad_recipe_values_and_options_are_errors(tmp_path, quiet_env):
    from zipccl_fsdp.cli import main

    for text, words in (("[zipccl]\ncollectives = ['all_gathr']\n", "all_gathr"),
                        ("[zipccl]\ncodec = 'zstd'\n", "codec"),
                        ("[zipccl]\nmin_bytes = 'big'\n", "min_bytes"),
                        ("[zipccl]\npolicy = 'sometimes'\n", "policy"),
                        ("[zipccl]\nlink_gbps = 'fast'\n", "link_gbps"),
                        ("[zipccl]\nlink_gbps = -1.0\n", "link_gbps"),
                        ("[zipccl]\npipeline_pieces = 2.5\n", "pipeline_pieces")):
        with pytest.raises(SystemExit) as e:
            main(["titan", "--recipe", str(_write(tmp_path, text)), "--dry-run"])
        assert words in str(e.value.code)
    with pytest.raises(SystemExit) as e:
        main(["titan", "--recipe", str(TINY), "--dry-run", "--no-compress", "--capture", "1"])
    assert "--capture" in str(e.value.code)
    with pytest.raises(SystemExit) as e:
        main(["titan", "--recipe", str(TINY), "--dry-run", "--profile", "3-1"])
    assert "3-1" in str(e.value.code)


def test_policy_keys_reach_the_config(tmp_path, quiet_env):
    from zipccl_fsdp.titan import launch
    from zipccl_fsdp.titan.comms import SETTINGS_ENV, RunSettings

    path = _write(tmp_path, "[zipccl]\npolicy = 'adaptive'\nlink_gbps = 1\n"
                            "link_latency_us = 250.0\ncodec_gbps = 2.5\npipeline_pieces = 4\n")
    prepared = launch.prepare(_launch_args(path, "--dump-folder", "x"))
    cfg = RunSettings(**json.loads(prepared.env[SETTINGS_ENV])).zipccl_config()
    assert (cfg.policy, cfg.link_gbps, cfg.link_latency_us, cfg.codec_gbps,
            cfg.pipeline_pieces) == ("adaptive", 1, 250.0, 2.5, 4)


def test_policy_option_overrides_the_recipes(tmp_path, quiet_env):
    from zipccl_fsdp.titan import launch
    from zipccl_fsdp.titan.comms import SETTINGS_ENV, RunSettings

    path = _write(tmp_path, "[zipccl]\npolicy = 'always'\n")
    for policy in ("never", "adaptive", "always"):
        prepared = launch.prepare(_launch_args(path, "--dump-folder", "x", "--policy", policy))
        cfg = RunSettings(**json.loads(prepared.env[SETTINGS_ENV])).zipccl_config()
        assert cfg.policy == policy
    with pytest.raises(ValueError, match="--policy"):
        launch.prepare(_launch_args(path, "--dump-folder", "x", "--policy", "never",
                                    "--no-compress"))


def _help(capsys, *words) -> str:
    from zipccl_fsdp.cli import main

    with pytest.raises(SystemExit) as e:
        main([*words, "--help"])
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_titan_help_says_what_each_option_does(capsys):
    text = _help(capsys, "titan")
    for phrase in ("--recipe", "--nproc", "--steps", "--no-compress", "baseline", "--capture",
                   "capture_rank<R>.safetensors", "--profile", "TensorBoard traces",
                   "--dump-folder", "--dry-run", "after '--'"):
        assert phrase in text, phrase


def test_demo_help_says_what_each_option_does(capsys):
    text = _help(capsys, "demo")
    for phrase in ("--steps", "--rate", "1gbit", "--out", "bitwise equal"):
        assert phrase in text, phrase


def test_a_shipped_recipe_is_found_by_name(tmp_path, monkeypatch, quiet_env):
    """From any folder, ``--recipe llama3_tiny_cpu`` (or with ``.toml``) is the
    shipped recipe; an unknown name is an error listing the shipped ones."""
    from zipccl_fsdp.titan import launch

    monkeypatch.chdir(tmp_path)
    for name in ("llama3_tiny_cpu", "llama3_tiny_cpu.toml"):
        prepared = launch.prepare(_launch_args(name, "--dump-folder", "x"))
        assert launch.find_recipe(name).resolve() == TINY.resolve()
        assert "llama3_tiny" in prepared.cmd
    own = tmp_path / "llama3_tiny_cpu.toml"  # a file of that name in the folder wins
    own.write_text(TINY.read_text().replace('nproc = 2', 'nproc = 3'))
    assert launch.load_recipe("llama3_tiny_cpu.toml").nproc == 3
    assert launch.load_recipe("llama3_tiny_cpu").nproc == 2
    with pytest.raises(launch.RecipeError, match="shipped: .*llama3_tiny_cpu"):
        launch.find_recipe("llama3_tiny_gpu")
    with pytest.raises(launch.RecipeError, match="no such recipe file"):
        launch.load_recipe("elsewhere/llama3_tiny_cpu.toml")
