"""Imports point one way (CONTRIBUTING.md, "Layout and layering").

Every import of a module counts, the ones inside functions included: a cycle
hidden by an import in a function is still two modules that need each
other. The layering itself is checked too: the format at the bottom, the
codec backends (the Triton kernels among them) on it, the collectives above,
the hooks and the torchtitan integration on top.
"""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"zipccl_fsdp": "zipccl_fsdp", "hooks": "zipccl_fsdp.hooks",
            "triton_kernels": "zipccl_fsdp.triton_kernels"}
"""Folder of the repository -> the package it is installed as (pyproject.toml)."""

FORMAT_LAYER = {"zipccl_fsdp.format", "zipccl_fsdp._layout", "zipccl_fsdp.errors"}
"""The payload format and the two modules it imports; shared by every codec
backend, and importing nothing else of the project."""

def _backend(name: str) -> bool:
    return name in ("zipccl_fsdp.codec_torch", "zipccl_fsdp.codec_cpp") or \
        _within(name, "zipccl_fsdp.triton_kernels")


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("first", ["", "import torch.distributed.fsdp; "])
def test_importing_the_package_registers_the_fsdp2_method(first):
    """``import zipccl_fsdp`` is enough for ``model.register_comm_hook``,
    whether FSDP is imported before or after it."""
    code = (first + "import zipccl_fsdp, sys; from torch.distributed.fsdp import FSDPModule; "
            "assert hasattr(FSDPModule, 'register_comm_hook')")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _modules() -> dict:
    """module name (as installed) -> path, for every .py file of the package's folders."""
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


def _imports(name: str, path: pathlib.Path, known: dict) -> dict:
    """Every project module ``name`` imports, wherever the import statement
    is, mapped to whether one of those statements runs when ``name`` is
    imported (outside any function)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    at_import = set()

    def mark(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            at_import.add(id(node))
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    mark(inner)

    mark(tree.body)
    out: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                out[target] = out.get(target, False) or id(node) in at_import
    return out


def _graph(at_import_only: bool = False) -> dict:
    known = _modules()
    graph = {}
    for name, path in known.items():
        edges = {t for t, now in _imports(name, path, known).items() if now or not at_import_only}
        if at_import_only:
            # Importing a module of another package runs that package's
            # __init__ (and its parents') first; a package importing its own
            # modules is not a cycle. An import inside a function runs when
            # every package is long initialised, so only these edges get it.
            ancestors = {name.rsplit(".", i)[0] for i in range(name.count(".") + 1)}
            for e in list(edges):
                edges |= {e.rsplit(".", i)[0] for i in range(1, e.count(".") + 1)} - ancestors
            edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_function_level_imports_included():
    cycles = [sorted(c) for c in _cycles(_graph())]
    assert not cycles, f"modules that import each other (imports in functions included): {cycles}"


def test_no_cycle_at_import_time():
    """Stricter for what runs at import: no exception, and a module of
    another package counts its package's __init__ too."""
    cycles = _cycles(_graph(at_import_only=True))
    assert not cycles, [sorted(c) for c in cycles]


def test_cycle_finder_sees_imports_inside_functions(tmp_path, monkeypatch):
    """The graph reads an import inside a function: two modules that import
    each other only there are a cycle."""
    pkg = tmp_path / "zipccl_fsdp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import g\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", {"zipccl_fsdp": "zipccl_fsdp"})
    assert _cycles(_graph()) == [frozenset({"zipccl_fsdp.a", "zipccl_fsdp.b"})]
    assert _cycles(_graph(at_import_only=True)) == []


def test_the_format_imports_only_its_two_modules_and_they_nothing():
    graph = _graph()
    assert graph["zipccl_fsdp.format"] == {"zipccl_fsdp._layout", "zipccl_fsdp.errors"}
    assert graph["zipccl_fsdp._layout"] == set()
    assert graph["zipccl_fsdp.errors"] == set()


def test_codec_backends_import_only_the_format_and_each_other():
    """The torch reference, the C++ backend and every module of the Triton
    kernels see the format and other backends (the reference's checks give
    the others their error messages), nothing above them."""
    graph = _graph()
    backends = [name for name in graph if _backend(name)]
    assert "zipccl_fsdp.triton_kernels.codec_encode" in backends
    assert "zipccl_fsdp.codec_torch" in backends
    wrong = {name: sorted(t for t in graph[name] if t not in FORMAT_LAYER and not _backend(t))
             for name in backends}
    assert not {k: v for k, v in wrong.items() if v}


def test_only_the_integrations_import_the_hooks():
    """hooks -> zipccl_fsdp, never back; the torchtitan integration
    (``zipccl_fsdp.titan``), which installs the hooks, is the one exception."""
    graph = _graph()
    hooks = "zipccl_fsdp.hooks"
    importers = sorted(name for name, edges in graph.items()
                       if not _within(name, hooks) and any(_within(e, hooks) for e in edges))
    assert importers and all(name.startswith("zipccl_fsdp.titan.") for name in importers), importers


def _imported_names(path: pathlib.Path) -> set:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return names


def test_kernels_format_and_backends_know_nothing_of_torch_distributed():
    bad = {name: sorted(n for n in _imported_names(path) if n.startswith("torch.distributed"))
           for name, path in _modules().items() if name in FORMAT_LAYER or _backend(name)}
    assert not {k: v for k, v in bad.items() if v}


def test_collectives_know_nothing_of_fsdp():
    """Only the hooks, which are FSDP2's comms, and the torchtitan integration,
    which installs them, read FSDP."""
    bad = {name: sorted(n for n in _imported_names(path) if n.startswith("torch.distributed.fsdp"))
           for name, path in _modules().items()
           if not _within(name, "zipccl_fsdp.hooks") and not _within(name, "zipccl_fsdp.titan")}
    assert not {k: v for k, v in bad.items() if v}


def test_kernels_and_format_load_neither_hooks_nor_fsdp():
    code = ("import zipccl_fsdp.triton_kernels.codec_encode, zipccl_fsdp.format, sys; "
            "assert 'zipccl_fsdp.hooks' not in sys.modules, 'hooks'; "
            "assert 'torch.distributed.fsdp' not in sys.modules, 'fsdp'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_importing_the_package_does_not_import_benchmarks():
    """The benchmarks are scripts beside the package, never part of it."""
    code = ("import sys, zipccl_fsdp, zipccl_fsdp.collectives, zipccl_fsdp.cli; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'benchmarks'); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    imports = {name: sorted(n for n in _imported_names(path) if n.split(".")[0] == "benchmarks")
               for name, path in _modules().items()}
    assert not {k: v for k, v in imports.items() if v}


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


def test_nothing_installed_imports_offline():
    """offline.py, the SASS counter that runs ptxas, is a development tool
    (tools/, not installed): no module of the installed packages is named
    so or imports it, or anything of tools/ or benchmarks/, at module level
    or inside a function, and importing the package and the Triton backend
    loads none of them."""
    shut_out = ("offline", "tools", "benchmarks")
    for name, path in _modules().items():
        assert name.split(".")[-1] != "offline", f"{path} is installed"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):  # import a.b: its top-level name, or a module offline
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):  # from a.b import c (or from . import c)
                top = [node.module] if node.module and not node.level else []
                names = top + [f"{node.module or ''}.{a.name}" for a in node.names]
            else:
                continue
            bad = [n for n in names if n.split(".")[0] in shut_out
                   or n.split(".")[-1] == "offline"]
            assert not bad, f"{path}:{node.lineno} imports {bad}"
    code = ("import sys, zipccl_fsdp, zipccl_fsdp.triton_kernels.exponent_codec; "
            f"bad = [m for m in sys.modules if m.split('.')[0] in {shut_out!r} "
            "or m.split('.')[-1] == 'offline']; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
