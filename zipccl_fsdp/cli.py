"""The ``zipccl`` command: ``zipccl demo``, ``zipccl bench codec``, ``zipccl titan``, ...

Each subcommand lives in its own module with ``add_arguments(parser)`` and
``run(args) -> int``. Only the module of the command being run is imported
(``zipccl titan`` imports torchtitan, ``zipccl bench codec`` does not), so a
missing optional dependency breaks only the command that needs it.
"""
from __future__ import annotations

import argparse
import importlib
import re
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
        missing = (exc.name or "").partition(".")[0]
        if not missing:
            raise SystemExit(f"zipccl {' '.join(words)} cannot load {module}: {exc}") from None
        provider = _extra_providing(missing)
        if provider is not None:
            hint = f"; install it with pip install 'zipccl-fsdp[{provider}]'"
        else:
            hint = f"; install {missing}" + (
                f" (the command's own dependencies come with pip install 'zipccl-fsdp[{extra}]')"
                if extra else "")
        raise SystemExit(f"zipccl {' '.join(words)} needs {missing}, which is not "
                         f"installed{hint}") from None


def _extra_providing(name: str) -> str | None:
    """The extra of the installed zipccl-fsdp whose requirements name the
    distribution ``name`` (a missing module's top-level name), preferring one
    meant for users over "dev"; None when no extra does or the metadata is
    not there. Read from the package's metadata, so that it names what
    pyproject.toml declares."""
    import importlib.metadata as metadata

    try:
        requires = metadata.requires("zipccl-fsdp") or []
    except metadata.PackageNotFoundError:
        return None
    found = []
    for line in requires:
        req, _, marker = line.partition(";")
        dist = re.split(r"[\s<>=!~\[(]", req.strip(), maxsplit=1)[0]
        extra = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)
        if extra and _normal(dist) == _normal(name):
            found.append(extra.group(1))
    found.sort(key=lambda e: e == "dev")
    return found[0] if found else None


def _normal(name: str) -> str:
    """A distribution or module name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


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
