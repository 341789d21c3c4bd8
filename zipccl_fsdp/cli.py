"""The ``zipccl`` command: ``zipccl bench codec``, ``zipccl demo``, ``zipccl titan``, ...

Each subcommand lives in its own module and contributes ``add_arguments`` and
``run``; this file only wires them together, importing each lazily so that
``zipccl --help`` is fast.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

# (path of words, module, one-line help)
_COMMANDS = [
    (("bench", "codec"), "zipccl_fsdp.bench_codec",
     "ratio and GB/s of each codec beside zstd-3 and a plain copy"),
]


def _optional_commands():
    """Subcommands whose modules are present in this build."""
    extra = [
        (("bench", "link"), "zipccl_fsdp.bench_link",
         "collectives raw vs zipccl over a rate-limited loopback"),
        (("titan",), "zipccl_fsdp.titan.launch", "train a torchtitan recipe with zipccl comms"),
        (("demo",), "zipccl_fsdp.demo", "2 ranks train a tiny llama3 with and without zipccl"),
        (("inspect",), "zipccl_fsdp.inspect", "show what a capture or payload file holds"),
    ]
    found = []
    for words, mod, text in extra:
        if importlib.util.find_spec(mod) is not None:
            found.append((words, mod, text))
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zipccl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups: dict = {}
    for words, mod, text in _COMMANDS + _optional_commands():
        if len(words) == 1:
            p = sub.add_parser(words[0], help=text, description=text)
        else:
            if words[0] not in groups:
                g = sub.add_parser(words[0], help=f"{words[0]} commands")
                groups[words[0]] = g.add_subparsers(dest="subcommand", metavar="WHAT", required=True)
            p = groups[words[0]].add_parser(words[1], help=text, description=text)
        module = importlib.import_module(mod)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
