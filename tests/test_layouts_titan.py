"""``zipccl titan`` trains the three layout recipes on 4 gloo CPU ranks, 20 steps each.

- ``recipes/llama3_tiny_hsdp_cpu.toml``: HSDP, replicate 2 x shard 2;
- ``recipes/llama3_tiny_tp_fsdp_cpu.toml``: tensor parallel 2 x FSDP 2;
- ``recipes/deepseek_v3_tiny_ep_cpu.toml``: MoE, expert parallel 2 x FSDP 2.

Each compressed run (the recipe as written: ``policy = "always"``, with
``--capture 1``) is compared with ``--policy never`` (zipccl's comms sending
every byte raw, summing in the same rank order), from torchtitan's
TensorBoard event files: every logged loss, max loss and gradient norm
bitwise equal at every step. These 4-rank runs are not compared with
torch's own comms (``--no-compress``): README promises bitwise equality with
those on two ranks (on more, zipccl adds in rank order and gloo in an order
of its own, README "Layouts"), and the 2-rank recipe is compared with them
in ``test_titan_recipes.py``.
Also checked per step: a ``zipccl/<kind>/*`` tag for every kind the recipe
lists as compressed, with fewer bytes on the wire than raw; and the capture
holds every collective kind of the layout.
"""
from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("tokenizers")

from test_titan_recipes import RECIPES, _env, _scalars, _zipccl  # noqa: E402

STEPS = 20
RUN_TIMEOUT_S = 420
LAYOUTS = {
    # recipe: the kinds its capture must hold
    "llama3_tiny_hsdp_cpu": {"all_gather", "reduce_scatter", "all_reduce"},
    "llama3_tiny_tp_fsdp_cpu": {"all_gather", "reduce_scatter",
                                "dtensor_all_gather", "dtensor_reduce_scatter"},
    "deepseek_v3_tiny_ep_cpu": {"all_gather", "reduce_scatter", "dtensor_all_to_all"},
}


def _run(recipe: Path, dump: Path, env: dict, *extra) -> dict:
    proc = _zipccl(["titan", "--recipe", recipe, "--steps", STEPS, "--dump-folder", dump,
                    *extra], env, timeout=RUN_TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"zipccl titan {recipe.name} {extra} exited {proc.returncode}:\n"
                    f"{proc.stdout[-6000:]}")
    return _scalars(dump)


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def layout(request, tmp_path_factory, build_cache):
    from zipccl_fsdp.titan import launch

    name = request.param
    recipe = RECIPES / f"{name}.toml"
    env = _env(build_cache)
    dump = tmp_path_factory.mktemp(name)
    compressed = _run(recipe, dump, env, "--capture", "1")
    references = {"never": _run(recipe, tmp_path_factory.mktemp(name + "_never"), env,
                                "--policy", "never")}
    kinds = launch.load_recipe(recipe).zipccl["collectives"]
    return {"name": name, "compressed": compressed, "references": references, "dump": dump,
            "kinds": kinds}


def _bits(values: dict) -> list:
    return [(step, struct.pack("<f", v).hex()) for step, v in sorted(values.items())]


def test_losses_bitwise_equal_to_reference(layout):
    for tag in ("loss_metrics/global_avg_loss", "loss_metrics/global_max_loss", "grad_norm"):
        zc = layout["compressed"][tag]
        assert sorted(zc) == list(range(1, STEPS + 1)), tag
        assert all(math.isfinite(v) for v in zc.values()), (tag, zc)
        for which, ref in layout["references"].items():
            assert _bits(zc) == _bits(ref[tag]), (layout["name"], which, tag, zc, ref[tag])
    assert len(set(layout["compressed"]["loss_metrics/global_avg_loss"].values())) > 1


def test_every_listed_kind_is_compressed_every_step(layout):
    scalars = layout["compressed"]
    assert set(scalars["zipccl/config/compressed"].values()) == {1.0}
    for kind in layout["kinds"]:
        raw, wire = scalars[f"zipccl/{kind}/raw_MB"], scalars[f"zipccl/{kind}/wire_MB"]
        assert sorted(raw) == list(range(1, STEPS + 1)), kind
        for step in raw:
            assert 0 < wire[step] < raw[step], (layout["name"], kind, step, raw, wire)
        assert all(v > 0 for v in scalars[f"zipccl/{kind}/compressed_calls"].values()), kind


def test_capture_holds_every_kind_of_the_layout(layout):
    from zipccl_fsdp.capture import read_capture_metadata

    expected = LAYOUTS[layout["name"]]
    for rank in range(4):
        meta = read_capture_metadata(str(layout["dump"] / f"capture_rank{rank}.safetensors"))
        kinds = {record["kind"] for record in meta.values()}
        assert expected <= kinds, (layout["name"], rank, sorted(kinds))
        assert all(record["rank"] == rank for record in meta.values())


def test_capture_steps_option_is_checked():
    import argparse

    from zipccl_fsdp.titan import launch

    assert launch.parse_capture_steps("50,1,100,50") == (1, 50, 100)
    assert launch.parse_capture_steps(None) == ()
    for bad in ("1,x", "0,5"):
        with pytest.raises(ValueError, match="--capture-steps"):
            launch.parse_capture_steps(bad)
    p = argparse.ArgumentParser()
    launch.add_arguments(p)
    args = p.parse_args(["--recipe", str(RECIPES / "llama3_tiny_hsdp_cpu.toml"),
                         "--capture-steps", "1,3"])
    with pytest.raises(ValueError, match="needs --capture"):
        launch.prepare(args)
    args = p.parse_args(["--recipe", str(RECIPES / "llama3_tiny_hsdp_cpu.toml"),
                         "--capture", "2", "--capture-steps", "3,1", "--dump-folder", "x"])
    settings = launch.prepare(args).settings
    assert settings.capture == 2 and settings.capture_steps == (1, 3)
