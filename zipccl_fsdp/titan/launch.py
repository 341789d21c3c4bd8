"""``zipccl titan``: train a torchtitan recipe (``recipes/*.toml``) under torchrun.

``--recipe`` takes a file or the name of a recipe shipped with the package
(``llama3_tiny_cpu``: ``recipes_dir()``, package data of the wheel).

A recipe names a torchtitan config function, the torchtitan settings to
change, and how zipccl compresses::

    description = "what this setup is for"   # optional

    [titan]                       # what to run
    module = "zipccl_fsdp.titan"  # torchtitan --module
    config = "llama3_tiny"        # torchtitan --config (a config function of it)
    nproc = 2                     # ranks on this machine (torchrun --nproc_per_node)

    [training]                    # every other key or table is a torchtitan
    steps = 20                    # setting, passed on as a CLI override:
    [parallelism]                 # --training.steps 20
    data_parallel_shard_degree = -1

    [zipccl]                      # zipccl's comms (see ZIPCCL_KEYS)
    codec = "dense"
    collectives = ["all_gather", "reduce_scatter"]
    min_bytes = 65536
    telemetry = true

Every key is checked before anything starts: a key the recipe format or the
named torchtitan config does not have is an error naming the key and the
file, and torchtitan's own parser then checks the values. The ranks are
started with ``python -m torch.distributed.run --standalone`` (one machine)
running ``-m torchtitan.train --module M --config F <recipe settings>
<options> <overrides>``; later settings win. The ``[zipccl]`` table and the
``--no-compress`` and ``--capture`` options reach the ranks as JSON in the
environment variable ``ZIPCCL_TITAN_SETTINGS``
(:class:`zipccl_fsdp.titan.comms.RunSettings`).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TITAN_KEYS = {
    "module": "torchtitan --module: a module with config functions",
    "config": "torchtitan --config: the config function to call",
    "nproc": "ranks on this machine (torchrun --nproc_per_node); default 1",
}
ZIPCCL_KEYS = {
    "codec": 'exponent code: "dense", "fixed3", "raw" or "auto" (ZipCCLConfig.codec)',
    "backend": 'codec backend: "auto", "torch", "cpp" or "triton"',
    "collectives": "kinds to compress, of all_gather, reduce_scatter, all_reduce, "
                   "all_to_all (default: all)",
    "min_bytes": "messages smaller than this go raw (ZipCCLConfig.min_bytes)",
    "telemetry": "log zipccl/<kind>/raw_MB, wire_MB, ratio, comm_ms, ... to TensorBoard",
    "dtensor": "also compress DTensor and functional collectives (tensor parallelism, "
               "MoE all-to-all)",
    "unsupported_dtype": 'dtypes the codec lacks: "raise" or "raw"',
    "verify": "integrity mode: per-chunk checksums checked by the receiver (ZipCCLConfig.verify)",
    "policy": 'raw or compressed per call: "adaptive" (default), "always" or "never" '
              '(ZipCCLConfig.policy)',
    "link_gbps": "link bandwidth per rank for the adaptive policy, Gbit/s (default: measured)",
    "link_latency_us": "latency of a small collective for the adaptive policy, microseconds",
    "codec_gbps": "codec speed for the adaptive policy, GB/s (default: measured)",
    "pipeline_pieces": "pieces per compressed message; 0: the adaptive policy chooses",
}
_NUMBER = (int, float)
_ZIPCCL_TYPES = {"codec": str, "backend": str, "collectives": list, "min_bytes": int,
                 "telemetry": bool, "dtensor": bool, "unsupported_dtype": str, "verify": bool,
                 "policy": str, "link_gbps": _NUMBER, "link_latency_us": _NUMBER,
                 "codec_gbps": _NUMBER, "pipeline_pieces": int}
_CONFIG_KEYS = ("codec", "backend", "min_bytes", "unsupported_dtype", "verify", "policy",
                "link_gbps", "link_latency_us", "codec_gbps", "pipeline_pieces")
"""[zipccl] keys that are ``ZipCCLConfig`` fields of the same name."""


class RecipeError(ValueError):
    """A recipe that cannot be run as written; the message names file and key."""


@dataclass
class Recipe:
    """A parsed recipe. ``settings``: torchtitan dotted key -> TOML value."""

    path: Path
    module: str
    config: str
    nproc: int = 1
    description: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    zipccl: dict[str, Any] = field(default_factory=dict)


def recipes_dir() -> Path:
    """The recipes shipped with zipccl-fsdp: ``zipccl_fsdp/recipes`` of an
    installed wheel, the repository's ``recipes/`` in a source checkout."""
    package = Path(__file__).resolve().parents[1]
    inside = package / "recipes"
    return inside if inside.is_dir() else package.parent / "recipes"


def find_recipe(name: str | os.PathLike) -> Path:
    """A recipe file: ``name`` if that file exists, else the shipped recipe of
    that name (``llama3_tiny_cpu`` or ``llama3_tiny_cpu.toml``)."""
    path = Path(name)
    if path.exists() or path.parent != Path("."):
        return path
    shipped = recipes_dir() / (path.name if path.suffix == ".toml" else f"{path.name}.toml")
    if shipped.is_file():
        return shipped
    names = sorted(p.stem for p in recipes_dir().glob("*.toml"))
    raise RecipeError(f"{name}: no such recipe file, and no shipped recipe of that name; "
                      f"shipped: {', '.join(names) or '(none found)'}")


def load_recipe(path: str | os.PathLike) -> Recipe:
    """Read and check the format of a recipe (not yet its torchtitan keys):
    a file, or the name of a shipped recipe (``find_recipe``)."""
    import tomllib

    path = find_recipe(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such recipe file") from None
    except tomllib.TOMLDecodeError as e:
        raise RecipeError(f"{path}: not valid TOML: {e}") from None
    titan = data.pop("titan", None)
    if not isinstance(titan, dict):
        raise RecipeError(f"{path}: needs a [titan] table with module and config")
    _check_keys(path, "titan", titan, TITAN_KEYS)
    for key in ("module", "config"):
        if not isinstance(titan.get(key), str) or not titan[key]:
            raise RecipeError(f"{path}: [titan] {key} must be a non-empty string")
    nproc = titan.get("nproc", 1)
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise RecipeError(f"{path}: [titan] nproc must be an integer >= 1, got {nproc!r}")
    zipccl = data.pop("zipccl", {})
    if not isinstance(zipccl, dict):
        raise RecipeError(f"{path}: zipccl must be a table")
    _check_keys(path, "zipccl", zipccl, ZIPCCL_KEYS)
    for key, value in zipccl.items():
        want = _ZIPCCL_TYPES[key]
        if isinstance(value, bool) != (want is bool) or not isinstance(value, want):
            kind = "number" if want is _NUMBER else want.__name__
            raise RecipeError(f"{path}: [zipccl] {key} must be a {kind}, got {value!r}")
    description = data.pop("description", "")
    settings: dict[str, Any] = {}
    _flatten(data, "", settings)
    return Recipe(path=path, module=titan["module"], config=titan["config"], nproc=nproc,
                  description=str(description), settings=settings, zipccl=zipccl)


def _check_keys(path: Path, table: str, got: dict, known: dict) -> None:
    for key in got:
        if key not in known:
            hint = difflib.get_close_matches(key, known, n=1)
            raise RecipeError(
                f"{path}: unknown key {key!r} in [{table}]"
                + (f" (did you mean {hint[0]!r}?)" if hint else "")
                + f"; [{table}] takes: {', '.join(known)}")


def _flatten(table: dict, prefix: str, out: dict) -> None:
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten(value, dotted + ".", out)
        else:
            out[dotted] = value


def run_settings(recipe: Recipe, *, compress: bool = True, capture: int = 0,
                 capture_dir: str = ".", capture_steps: tuple = (), policy: str | None = None):
    """The ``RunSettings`` the ranks get: the [zipccl] table plus the options
    (``policy``: ``--policy``, in place of the table's)."""
    from zipccl_fsdp.config import ZipCCLConfig

    from ..stats import KINDS
    from .comms import RunSettings

    table = dict(recipe.zipccl)
    if policy is not None:
        table["policy"] = policy
    config: dict[str, Any] = {k: table[k] for k in _CONFIG_KEYS if k in table}
    if "collectives" in table:
        unknown = [k for k in table["collectives"] if k not in KINDS]
        if unknown:
            raise RecipeError(f"{recipe.path}: [zipccl] collectives: unknown kind "
                              f"{unknown[0]!r}; kinds: {', '.join(KINDS)}")
        for kind in KINDS:
            config[f"compress_{kind}"] = kind in table["collectives"]
    try:
        ZipCCLConfig(**config)
    except ValueError as e:
        raise RecipeError(f"{recipe.path}: [zipccl]: {e}") from None
    return RunSettings(compress=compress, config=config, dtensor=table.get("dtensor", False),
                       telemetry=table.get("telemetry", True), capture=capture,
                       capture_dir=capture_dir, capture_steps=tuple(capture_steps))


def load_titan_config(recipe: Recipe) -> Any:
    """Call the recipe's torchtitan config function, resolving ``module`` as torchtitan does."""
    from torchtitan.config.manager import ConfigManager

    try:
        # torchtitan's own --module/--config resolution (private in 0.3.0, which
        # the package pins), so a recipe names what the trainer will load.
        with _quiet_logging():
            config, _ = ConfigManager()._load_config(
                ["--module", recipe.module, "--config", recipe.config])
    except (ImportError, ValueError) as e:
        raise RecipeError(f"{recipe.path}: [titan] module {recipe.module!r} / config "
                          f"{recipe.config!r}: {e}") from None
    return config


@contextlib.contextmanager
def _quiet_logging():
    """Mute the warnings config functions log (the ranks log them again)."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def check_settings(recipe: Recipe, config: Any, settings: dict[str, Any] | None = None) -> None:
    """Raise ``RecipeError`` for a setting ``config`` (a ``Trainer.Config``) has no field for."""
    for dotted in (recipe.settings if settings is None else settings):
        node, walked = config, []
        for part in dotted.split("."):
            if not dataclasses.is_dataclass(node):
                raise RecipeError(f"{recipe.path}: unknown key {dotted!r}: "
                                  f"{'.'.join(walked)} is a value, not a table")
            names = [f.name for f in dataclasses.fields(node)]
            if part not in names:
                hint = difflib.get_close_matches(part, names, n=1)
                where = ".".join(walked) or "the top level"
                raise RecipeError(
                    f"{recipe.path}: unknown key {dotted!r}: the torchtitan config "
                    f"{recipe.module}:{recipe.config} has no {part!r} in {where}"
                    + (f" (did you mean {hint[0]!r}?)" if hint else ""))
            node = getattr(node, part)
            walked.append(part)
        if dataclasses.is_dataclass(node):
            raise RecipeError(f"{recipe.path}: key {dotted!r} is a table of torchtitan "
                              f"settings; set its keys instead")


def cli_tokens(settings: dict[str, Any]) -> list[str]:
    """torchtitan (tyro) CLI tokens for ``{dotted key: value}``."""
    out: list[str] = []
    for dotted, value in settings.items():
        head, _, last = dotted.rpartition(".")
        if isinstance(value, bool):  # tyro flags: --a.b / --a.no_b
            out.append(f"--{dotted}" if value else f"--{head + '.' if head else ''}no_{last}")
        elif isinstance(value, list):
            out += [f"--{dotted}", *map(str, value)]
        else:
            out += [f"--{dotted}", str(value)]
    return out


@dataclass
class Launch:
    """A prepared run: the command, its environment and where it writes."""

    cmd: list[str]
    env: dict[str, str]
    dump_folder: Path
    settings: Any


def prepare(args: argparse.Namespace) -> Launch:
    """Check the recipe and options of ``args``; build the torchrun command.

    Raises ``RecipeError`` (message names file and key) or ``ValueError``.
    """
    from .comms import SETTINGS_ENV

    recipe = load_recipe(args.recipe)
    overrides = list(args.overrides or [])
    if overrides[:1] == ["--"]:
        overrides = overrides[1:]
    for token in overrides:
        name = token.split("=", 1)[0]
        if name in ("--module", "--config", "--dump_folder"):
            raise ValueError(f"{name} is set by the recipe or by --dump-folder; "
                             f"not as a torchtitan override")
    settings = dict(recipe.settings)
    recipe_dump = settings.pop("dump_folder", None)
    if args.dump_folder:
        dump = Path(args.dump_folder)
    elif recipe_dump:
        dump = Path(str(recipe_dump))
    else:
        dump = Path("outputs") / (recipe.path.stem + ("_baseline" if args.no_compress else ""))
    if args.capture and args.no_compress:
        raise ValueError("--capture records what zipccl's comms send; it cannot be "
                         "combined with --no-compress")
    policy = getattr(args, "policy", None)
    if policy is not None and args.no_compress:
        raise ValueError("--policy chooses how zipccl's comms send; it cannot be combined "
                         "with --no-compress (torch's own comms)")
    if args.capture < 0:
        raise ValueError(f"--capture must be >= 0, got {args.capture}")
    capture_steps = parse_capture_steps(getattr(args, "capture_steps", None))
    if capture_steps and not args.capture:
        raise ValueError("--capture-steps needs --capture N (tensors of each kind per step)")
    if args.nproc is not None and args.nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {args.nproc}")
    nproc = args.nproc or recipe.nproc
    run = run_settings(recipe, compress=not args.no_compress, capture=args.capture,
                       capture_dir=str(dump.resolve()), capture_steps=capture_steps,
                       policy=policy)
    config = load_titan_config(recipe)
    check_settings(recipe, config, settings)
    options: dict[str, Any] = {}
    if args.steps is not None:
        if args.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {args.steps}")
        options["training.steps"] = args.steps
    if args.profile:
        from .profiling import parse_steps

        parse_steps(args.profile)
        if not hasattr(config.profiler, "trace_steps") and not any(
                "zipccl_profiler" in token for token in overrides):
            raise ValueError(
                f"--profile needs zipccl's profiler, which the torchtitan config "
                f"{recipe.module}:{recipe.config} does not select; use a config of "
                f"zipccl_fsdp.titan or add --override.imports "
                f"zipccl_fsdp.titan.profiling.zipccl_profiler")
        options["profiler.trace_steps"] = args.profile
    titan_args = ["--module", recipe.module, "--config", recipe.config,
                  *cli_tokens(settings), *cli_tokens(options),
                  "--dump_folder", str(dump), *overrides]
    _check_with_torchtitan(recipe, titan_args)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc_per_node", str(nproc), "--local-ranks-filter", "0", "--role", "rank",
           "--tee", "3", "-m", "torchtitan.train", *titan_args]
    env = dict(os.environ)
    env[SETTINGS_ENV] = run.to_env()
    # torchrun sets 1 thread per rank when unset; share the cores instead.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return Launch(cmd=cmd, env=env, dump_folder=dump, settings=run)


def parse_capture_steps(text: str | None) -> tuple:
    """``"1,50,100"`` -> (1, 50, 100); None or "" -> ()."""
    if not text:
        return ()
    try:
        steps = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise ValueError(f"--capture-steps takes step numbers separated by commas, "
                         f"e.g. 1,50,100; got {text!r}") from None
    if steps[0] < 1:
        raise ValueError(f"--capture-steps: steps start at 1, got {text!r}")
    return steps


def _check_with_torchtitan(recipe: Recipe, titan_args: list[str]) -> None:
    """Let torchtitan's parser check every value now, not after the ranks start."""
    from torchtitan.config.manager import ConfigManager

    try:
        with _quiet_logging():
            ConfigManager().parse_args(list(titan_args))
    except SystemExit as e:  # tyro printed what it rejected
        raise RecipeError(f"{recipe.path}: torchtitan rejected the settings of this "
                          f"recipe with the command-line options (see above)") from e


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Train a torchtitan recipe (a TOML file) with zipccl's compressed "
                     "comms: torchrun on this machine, logs of rank 0, TensorBoard under "
                     "<dump folder>/tb.")
    p.epilog = ("torchtitan overrides go after '--', e.g.: zipccl titan --recipe "
                "llama3_tiny_cpu --steps 5 -- --training.seq_len 128")
    p.add_argument("--recipe", required=True, metavar="RECIPE",
                   help="the recipe (TOML): torchtitan module/config, settings, [zipccl]; "
                        "a file, or the name of a shipped recipe: "
                        + ", ".join(sorted(r.stem for r in recipes_dir().glob("*.toml"))))
    p.add_argument("--nproc", type=int, metavar="N",
                   help="ranks on this machine (default: the recipe's [titan] nproc)")
    p.add_argument("--steps", type=int, metavar="N",
                   help="training steps (sets --training.steps; default: the recipe's)")
    p.add_argument("--no-compress", action="store_true",
                   help="baseline: FSDP2's own uncompressed comms, same recipe otherwise "
                        "(default dump folder gets a _baseline suffix)")
    p.add_argument("--policy", choices=("always", "never", "adaptive"),
                   help="zipccl's policy in place of the recipe's [zipccl] policy; 'never' "
                        "runs zipccl's comms sending every byte raw (the same summation "
                        "order as compressed: the bitwise reference on more than 2 ranks)")
    p.add_argument("--capture", type=int, default=0, metavar="N",
                   help="save the inputs of the first N calls of each collective kind "
                        "(all_gather, reduce_scatter, HSDP's all_reduce, dtensor_<kind>) of "
                        "each rank to <dump folder>/capture_rank<R>.safetensors, for "
                        "'zipccl bench codec --input' and 'zipccl inspect'")
    p.add_argument("--capture-steps", metavar="STEPS",
                   help="with --capture N: capture the first N of each kind at each of these "
                        "training steps instead (e.g. 1,50,100), one file per step: "
                        "<dump folder>/capture_rank<R>_step<S>.safetensors")
    p.add_argument("--profile", metavar="STEPS",
                   help="trace these training steps with the torch profiler, e.g. 3, 3-5 or "
                        "2,7; TensorBoard traces (zipccl::<kind>::<phase> ranges included) in "
                        "<dump folder>/profiling/traces")
    p.add_argument("--dump-folder", metavar="DIR",
                   help="torchtitan's dump folder: TensorBoard events, traces, captures "
                        "(default: the recipe's dump_folder, else outputs/<recipe name>)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the recipe, print the command and its settings, start nothing")
    p.add_argument("overrides", nargs=argparse.REMAINDER, metavar="-- OVERRIDES",
                   help="torchtitan CLI overrides after '--', e.g. -- --training.seq_len 128 "
                        "(they win over the recipe and the options above)")


def run(args: argparse.Namespace) -> int:
    from ..cli import require

    require(("titan",), "torchtitan", "triton", "tokenizers", extra="titan")
    try:
        launch = prepare(args)
    except ValueError as e:  # RecipeError included
        raise SystemExit(f"zipccl titan: {e}") from None
    print(f"zipccl titan: {shlex.join(launch.cmd)}", flush=True)
    print(f"zipccl titan: ZIPCCL_TITAN_SETTINGS={launch.settings.to_env()}", flush=True)
    if args.dry_run:
        return 0
    started = time.time()
    code = subprocess.run(launch.cmd, env=launch.env).returncode
    if code == 0:
        print(summary(launch, since=started), flush=True)
    return code


def summary(launch: Launch, since: float | None = None) -> str:
    """What the run's zipccl comms moved, per collective, read back from the
    TensorBoard event files written after ``since`` (the demo's table), and a
    TensorBoard command that runs in a fresh shell."""
    from ..run_report import collective_table, read_scalars, tensorboard_command

    lines = []
    if launch.settings.compress:
        scalars = read_scalars(launch.dump_folder, since)
        steps = max((max(v) for v in scalars.values() if v), default=0)
        lines += ["", f"zipccl titan: {steps} steps, {launch.dump_folder}",
                  *collective_table(scalars, steps)]
    lines.append(f"zipccl titan: {tensorboard_command(launch.dump_folder / 'tb')}")
    return "\n".join(lines)
