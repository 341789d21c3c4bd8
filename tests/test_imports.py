"""Imports point one way: the kernels and the format load neither the hooks
nor FSDP, and no module of the package imports, at import time, a module
that imports it back."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"zipccl_fsdp": "zipccl_fsdp", "hooks": "zipccl_fsdp.hooks",
            "triton_kernels": "zipccl_fsdp.triton_kernels"}
"""Folder of the repository -> the package it is installed as (pyproject.toml)."""


def test_kernels_and_format_load_neither_hooks_nor_fsdp():
    code = ("import zipccl_fsdp.triton_kernels.codec_encode, zipccl_fsdp.format, sys; "
            "assert 'zipccl_fsdp.hooks' not in sys.modules, 'hooks'; "
            "assert 'torch.distributed.fsdp' not in sys.modules, 'fsdp'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _modules() -> dict:
    """module name -> path, for every .py file of the three packages."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            if folder == "zipccl_fsdp" and parts and parts[0] in PACKAGES:
                continue  # not a folder of the package (pyproject.toml maps them there)
            out[".".join((package, *parts))] = path
    return out


def _top_level_imports(name: str, path: pathlib.Path, known: dict) -> set:
    """Project modules ``name`` imports when it is imported (not inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    if f"{base}.{a.name}" in known:
                        edges.add(f"{base}.{a.name}")
                    elif base in known:
                        edges.add(base)
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list) and not isinstance(node, ast.ClassDef):
                    visit(inner)

    visit(ast.parse(path.read_text()).body)
    # Importing a module of another package runs that package's __init__ (and
    # its parents') first; a package importing its own modules is not a cycle.
    ancestors = {name.rsplit(".", i)[0] for i in range(name.count(".") + 1)}
    for e in list(edges):
        edges |= {e.rsplit(".", i)[0] for i in range(1, e.count(".") + 1)} - ancestors
    edges.discard(name)
    return edges


def test_no_import_cycle():
    known = _modules()
    graph = {name: _top_level_imports(name, path, known) for name, path in known.items()}
    state: dict = {}
    cycles = []

    def walk(node, stack):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert not cycles, cycles


def test_each_kind_is_declared_by_its_switch_and_has_its_module():
    """A collective kind is declared once, by its ``compress_<kind>`` field;
    ``stats.KINDS`` (which the stats, the size rows and TensorBoard read) is
    that list, and each kind has its module in ``zipccl_fsdp/collectives``."""
    import dataclasses
    import importlib

    from zipccl_fsdp.config import ZipCCLConfig
    from zipccl_fsdp.stats import KINDS

    switches = [f.name for f in dataclasses.fields(ZipCCLConfig)
                if f.name.startswith("compress_")]
    assert KINDS == tuple(s[len("compress_"):] for s in switches)
    assert KINDS == ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")  # row ids
    for kind in KINDS:
        module = importlib.import_module(f"zipccl_fsdp.collectives.{kind}")
        assert module.__all__, kind
