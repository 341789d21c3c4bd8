"""The ``zipccl`` command: ``zipccl demo``, ``zipccl bench codec``, ``zipccl titan``, ...

Each subcommand lives in its own module with ``add_arguments(parser)`` and
``run(args) -> int``. Only the module of the command being run is imported
(``zipccl titan`` imports torchtitan, ``zipccl bench codec`` does not), so a
missing optional dependency breaks only the command that needs it.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# (words, module, one-line help, pip extra it needs)
COMMANDS = [
    (("demo",), "zipccl_fsdp.demo",
     "2 ranks train a small llama3 with and without zipccl and print what was saved", "titan"),
    (("bench", "codec"), "zipccl_fsdp.bench_codec",
     "ratio and GB/s of each codec beside zstd-3 and a plain copy", None),
    (("bench", "link"), "zipccl_fsdp.bench_link",
     "collectives raw vs zipccl over a rate-limited loopback", None),
    (("titan",), "zipccl_fsdp.titan.launch",
     "train a torchtitan recipe (recipes/*.toml) with zipccl comms", "titan"),
    (("inspect",), "zipccl_fsdp.inspect", "show what a capture or payload file holds", None),
]


def _load(module: str, extra: str | None, words) -> object:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        hint = f"; install it with pip install 'zipccl-fsdp[{extra}]'" if extra else ""
        raise SystemExit(f"zipccl {' '.join(words)} needs {exc.name or exc}{hint}") from None


def build_parser(argv: list) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zipccl", description="zipccl-fsdp: lossless compressed collectives for PyTorch training")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups: dict = {}
    for words, module, text, extra in COMMANDS:
        if len(words) == 1:
            p = sub.add_parser(words[0], help=text, description=text)
        else:
            if words[0] not in groups:
                g = sub.add_parser(words[0], help=f"{words[0]} commands")
                groups[words[0]] = g.add_subparsers(dest="subcommand", metavar="WHAT", required=True)
            p = groups[words[0]].add_parser(words[1], help=text, description=text)
        if list(words) == argv[:len(words)]:  # the command being run: load it
            mod = _load(module, extra, words)
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
