"""The ``zipccl`` command's message for a missing optional dependency names
what is missing and the extra that provides it."""
from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _installed() -> bool:
    try:
        return bool(importlib.metadata.requires("zipccl-fsdp"))
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.parametrize("missing,extra", [("triton", "triton"), ("torchtitan", "titan")])
def test_titan_without_a_dependency_names_it_and_its_extra(missing, extra):
    # ``sys.modules[name] = None`` makes every import of it fail as a missing module does.
    code = (f"import sys; sys.modules[{missing!r}] = None\n"
            "from zipccl_fsdp.cli import main\n"
            "main(['titan', '--help'])\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert f"needs {missing}," in last, last
    if _installed():  # the extras are read from the installed package's metadata
        assert f"zipccl-fsdp[{extra}]" in last, last
        if extra != "titan":
            assert "[titan]" not in last, last
