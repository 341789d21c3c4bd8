"""The ``zipccl`` command: ``zipccl demo``, ``zipccl bench codec``, ``zipccl titan``, ...

Each subcommand lives in its own module with ``add_arguments(parser)`` and
``run(args) -> int``. Only the module of the command being run is imported
(``zipccl titan`` imports torchtitan, ``zipccl bench codec`` does not), so a
missing optional dependency breaks only the command that needs it, with a
message that names the pip extra that provides it (``install_hint``); and
``zipccl --help`` imports no command, nor torch.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# (words, module, one-line help)
COMMANDS = [
    (("demo",), "zipccl_fsdp.demo",
     "2 ranks train a small llama3 with and without zipccl and print what was saved"),
    (("bench", "codec"), "zipccl_fsdp.bench_codec",
     "ratio and GB/s of each codec beside zstd-3 and a plain copy"),
    (("bench", "link"), "zipccl_fsdp.bench_link",
     "collectives raw vs zipccl over a rate-limited loopback"),
    (("titan",), "zipccl_fsdp.titan.launch",
     "train a torchtitan recipe (a file, or the name of a shipped recipe) with zipccl comms"),
    (("inspect",), "zipccl_fsdp.inspect", "show what a capture or payload file holds"),
]


EXTRAS = {"torchtitan": "titan", "tokenizers": "titan", "triton": "triton",
          "zstandard": "dev", "matplotlib": "dev"}
"""Optional module -> the pip extra of zipccl-fsdp that installs it (pyproject.toml)."""


def install_hint(module: str, extra: str | None = None) -> str:
    """What to run for a missing module: the extra that provides it (``extra``,
    else the one ``EXTRAS`` names), if any."""
    top = module.split(".")[0]
    extra = extra or EXTRAS.get(top)
    if extra is None:
        return f"pip install {top}"
    return f"pip install 'zipccl-fsdp[{extra}]'"


def missing(words, exc: ImportError, extra: str | None = None) -> SystemExit:
    """The exit of a command that needs a module that is not installed."""
    name = exc.name.split(".")[0] if exc.name else str(exc)
    return SystemExit(f"zipccl {' '.join(words)} needs {name}: {install_hint(name, extra)}")


def require(words, *modules: str, extra: str | None = None) -> None:
    """Exit, naming the extra to install, if one of ``modules`` is not installed
    (before a command starts work that would end in an ImportError)."""
    import importlib.util

    for name in modules:
        if importlib.util.find_spec(name) is None:
            raise missing(words, ModuleNotFoundError(f"No module named {name!r}", name=name),
                          extra)


def _load(module: str, words) -> object:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(words, exc) from None


def build_parser(argv: list) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zipccl", description="zipccl-fsdp: lossless compressed collectives for PyTorch training")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups: dict = {}
    for words, module, text in COMMANDS:
        if len(words) == 1:
            p = sub.add_parser(words[0], help=text, description=text)
        else:
            if words[0] not in groups:
                g = sub.add_parser(words[0], help=f"{words[0]} commands")
                groups[words[0]] = g.add_subparsers(dest="subcommand", metavar="WHAT", required=True)
            p = groups[words[0]].add_parser(words[1], help=text, description=text)
        if list(words) == argv[:len(words)]:  # the command being run: load it
            mod = _load(module, words)
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except ModuleNotFoundError as exc:
        # An optional dependency the command imports only when it runs (the
        # demo's torchtitan): say which extra installs it, not a traceback.
        if (exc.name or "").split(".")[0] not in EXTRAS:
            raise
        words = [w for w in (args.command, getattr(args, "subcommand", None)) if w]
        raise missing(words, exc) from None


if __name__ == "__main__":
    sys.exit(main())
