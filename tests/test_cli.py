"""The ``zipccl`` command's message for a missing optional dependency names
what is missing and the extra that provides it."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _extras() -> dict:
    """pyproject.toml's extras: name -> the distributions it installs."""
    import tomllib

    table = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {name: {re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0].lower() for req in reqs}
            for name, reqs in table["project"]["optional-dependencies"].items()}


@pytest.mark.parametrize("missing", ["triton", "torchtitan"])
def test_titan_without_a_dependency_names_it_and_its_extra(missing):
    # ``sys.modules[name] = None`` makes every import of it fail as a missing module does.
    code = (f"import sys; sys.modules[{missing!r}] = None\n"
            "from zipccl_fsdp.cli import main\n"
            "main(['titan', '--help'])\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert f"needs {missing}" in last, last
    named = re.search(r"zipccl-fsdp\[(\w+)\]", last)
    assert named, last
    # The extra the message names installs what is missing.
    assert missing in _extras()[named.group(1)], last
