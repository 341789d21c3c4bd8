"""What an install holds and what a user's first commands meet: the wheel's
files and metadata, no generic top-level import names, recipes found by
name, the CLI's help without torch, and messages that name the pip extra
to install."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAPPED = {"hooks": "zipccl_fsdp.hooks", "triton_kernels": "zipccl_fsdp.triton_kernels",
          "recipes": "zipccl_fsdp.recipes"}


def _python(code: str, cwd, **env) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that finds this checkout the way the
    tests do (PYTHONPATH), from ``cwd``."""
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=300)


def test_pyproject_installs_every_folder_inside_the_package():
    """Every folder of Python files is a listed package, and the repository's
    top-level folders are mapped under zipccl_fsdp (no top-level name of theirs)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["package-dir"] == {package: folder for folder, package in MAPPED.items()}
    listed = set(tool["packages"])
    want = {"zipccl_fsdp.recipes"}
    for folder in ("zipccl_fsdp", "hooks", "triton_kernels"):
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            base = MAPPED.get(folder, folder)
            want.add(".".join((base, *rel)))
    assert listed == want
    assert all(p == "zipccl_fsdp" or p.startswith("zipccl_fsdp.") for p in listed)


def test_wheel_holds_the_subpackages_and_recipes_under_the_package(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("zipccl_fsdp", "hooks", "triton_kernels", "recipes"):
        shutil.copytree(ROOT / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode and "No module named 'setuptools'" in r.stderr + r.stdout:
        pytest.skip("setuptools is not installed in this environment")
    assert r.returncode == 0, r.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = zf.read(info).decode()
        top = zf.read(info.replace("METADATA", "top_level.txt")).decode().split()
    assert top == ["zipccl_fsdp"]
    assert {n.split("/")[0] for n in names} == {"zipccl_fsdp", info.split("/")[0]}
    for folder, package in MAPPED.items():
        for path in (ROOT / folder).iterdir():
            if path.suffix in (".py", ".toml"):
                assert f"{package.replace('.', '/')}/{path.name}" in names, path
    assert "zipccl_fsdp/csrc/codec.cpp" in names
    assert "Requires-Python: >=3.11" in meta
    assert "Requires-Dist: ninja" in meta


def test_a_users_hooks_module_changes_nothing(tmp_path):
    """Modules named hooks and triton_kernels next to a user's script are the
    user's: zipccl_fsdp neither refuses them nor loads them."""
    for name in ("hooks", "triton_kernels"):
        (tmp_path / f"{name}.py").write_text(f"raise RuntimeError('the user\\'s {name}')\n")
    r = _python(f"""
        import zipccl_fsdp
        from zipccl_fsdp import zipccl_hook
        from zipccl_fsdp.triton_kernels import available
        import zipccl_fsdp.hooks.registry as reg, zipccl_fsdp.triton_kernels as tk, sys
        assert reg.__file__.startswith({str(ROOT)!r}), reg.__file__
        assert tk.__file__.startswith({str(ROOT)!r}), tk.__file__
        assert 'hooks' not in sys.modules and 'triton_kernels' not in sys.modules
        try:
            import hooks
        except RuntimeError as e:
            assert "the user's hooks" in str(e)
        else:
            raise AssertionError("import hooks did not reach the user's module")
        print("ok")
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_import_and_help_do_not_import_torch(tmp_path):
    r = _python("""
        import sys, contextlib, io
        import zipccl_fsdp
        from zipccl_fsdp import cli
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                cli.main(["--help"])
            except SystemExit as e:
                assert e.code == 0, e.code
        assert "titan" in out.getvalue()
        assert "torch" not in sys.modules, "torch imported"
        print("ok")
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_public_names_load_on_first_use_and_stats_stays_a_function(tmp_path):
    """The submodule ``stats`` imported first (as a hook's import does) must not
    replace the public function ``zipccl_fsdp.stats``."""
    r = _python("""
        import zipccl_fsdp
        from zipccl_fsdp.stats import CommStats
        assert callable(zipccl_fsdp.stats), zipccl_fsdp.stats
        assert set(zipccl_fsdp.stats()) >= {"all_gather", "reduce_scatter"}
        assert zipccl_fsdp.CommStats is CommStats
        assert zipccl_fsdp.format.CHUNK_ELEMS > 0      # a submodule, loaded on access
        assert set(zipccl_fsdp.__all__) <= set(dir(zipccl_fsdp))
        for name in zipccl_fsdp.__all__:
            getattr(zipccl_fsdp, name)
        try:
            zipccl_fsdp.no_such_name
        except AttributeError as e:
            assert "no_such_name" in str(e)
        else:
            raise AssertionError("no AttributeError")
        print("ok")
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.parametrize("command", [["demo"], ["titan", "--recipe", "llama3_tiny_cpu"]])
def test_a_command_without_torchtitan_names_the_extra(tmp_path, command):
    r = _python(f"""
        import sys
        sys.modules["torchtitan"] = None   # as if not installed
        from zipccl_fsdp.cli import main
        main({command!r})
    """, cwd=tmp_path)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    assert "needs torchtitan: pip install 'zipccl-fsdp[titan]'" in r.stderr, r.stderr


def test_install_hints_name_the_extra():
    from zipccl_fsdp.cli import install_hint

    assert install_hint("triton.language") == "pip install 'zipccl-fsdp[triton]'"
    assert install_hint("triton", "titan") == "pip install 'zipccl-fsdp[titan]'"
    assert install_hint("zstandard").startswith("pip install 'zipccl-fsdp[dev]'")
    assert install_hint("safetensors") == "pip install safetensors"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    from zipccl_fsdp.cli import EXTRAS

    for module, extra in EXTRAS.items():
        assert any(req.startswith(module) for req in extras[extra]), (module, extra)


# --------------------------------------------------------------------------
# The C++ codec's first-use build (codec_cpp): a line before it, a cache key
# per environment, and messages that say how to fix a missing toolchain.
# --------------------------------------------------------------------------
def test_build_dir_key_separates_environments(monkeypatch, tmp_path):
    import torch

    from zipccl_fsdp import codec_cpp

    monkeypatch.setenv("ZIPCCL_FSDP_CACHE_DIR", str(tmp_path))
    here = codec_cpp._build_dir(codec_cpp._SOURCES)
    assert here == codec_cpp._build_dir(codec_cpp._SOURCES)
    assert here.parent == tmp_path
    with monkeypatch.context() as m:  # another venv's torch
        m.setattr(torch, "__file__", str(tmp_path / "other-venv" / "torch" / "__init__.py"))
        assert codec_cpp._build_dir(codec_cpp._SOURCES) != here
    with monkeypatch.context() as m:  # another compiler
        m.setenv("CXX", "clang++")
        assert codec_cpp._build_dir(codec_cpp._SOURCES) != here
    with monkeypatch.context() as m:
        m.setattr(codec_cpp, "_CFLAGS", [*codec_cpp._CFLAGS, "-g"])
        assert codec_cpp._build_dir(codec_cpp._SOURCES) != here


_FAKE_BUILD = """
    import torch.utils.cpp_extension as ext
    def load(**kwargs):
        raise RuntimeError("compiler stopped here")
    ext.load = load
    from zipccl_fsdp import codec_cpp
    print(codec_cpp.available())
"""


def test_a_build_says_what_it_does_before_it_starts(tmp_path):
    """Without any logging set-up (a user's script), one line names the build
    and its folder before the compiler runs; a build folder that holds the
    library loads without it."""
    r = _python(_FAKE_BUILD, cwd=tmp_path, ZIPCCL_FSDP_CACHE_DIR=str(tmp_path / "cache"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
    lines = r.stderr.splitlines()
    building = [i for i, line in enumerate(lines) if "building its C++ codec into" in line]
    assert len(building) == 1 and str(tmp_path / "cache") in lines[building[0]], r.stderr
    assert any("compiler stopped here" in line for line in lines[building[0] + 1:]), r.stderr
    (build_dir,) = (tmp_path / "cache").iterdir()
    (build_dir / "zipccl_codec_cpp.so").write_bytes(b"")
    r = _python(_FAKE_BUILD, cwd=tmp_path, ZIPCCL_FSDP_CACHE_DIR=str(tmp_path / "cache"))
    assert "building" not in r.stderr and "compiler stopped here" in r.stderr, r.stderr


def test_a_missing_compiler_says_how_to_fix_it(tmp_path):
    r = _python("""
        from zipccl_fsdp import codec_cpp
        print(codec_cpp.available())
        print(codec_cpp.unavailable_reason())
    """, cwd=tmp_path, CXX="no-such-compiler-here", ZIPCCL_FSDP_CACHE_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr
    available, reason = r.stdout.strip().splitlines()
    assert available == "False"
    assert "no-such-compiler-here" in reason and "apt-get install g++" in reason
    assert "CXX" in reason
    assert "torch backend" in r.stderr and "apt-get install g++" in r.stderr  # the warning


def test_ninja_is_found_in_its_environment_bin_off_path(monkeypatch, tmp_path):
    """The PyPI ninja's program sits in its environment's bin, on PATH only
    while the environment is activated; the build finds it anyway, and with no
    ninja at all the error says what to install."""
    import os
    import types

    from zipccl_fsdp import codec_cpp

    bin_dir = tmp_path / "venv-bin"
    bin_dir.mkdir()
    fake = bin_dir / "ninja"
    fake.write_text("#!/bin/sh\necho 1.13.0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    monkeypatch.setitem(sys.modules, "ninja", types.SimpleNamespace(BIN_DIR=str(bin_dir)))
    with codec_cpp._ninja_on_path():
        assert os.environ["PATH"].split(os.pathsep)[0] == str(bin_dir)
    assert os.environ["PATH"] == str(tmp_path / "nothing-here")
    fake.unlink()
    with pytest.raises(RuntimeError, match="pip install ninja"):
        with codec_cpp._ninja_on_path():
            pass
    assert os.environ["PATH"] == str(tmp_path / "nothing-here")


def test_the_printed_tensorboard_command_runs_in_a_fresh_shell(tmp_path):
    """No activated environment, no PATH of ours, another working folder."""
    from zipccl_fsdp.run_report import tensorboard_command

    command = tensorboard_command(pathlib.Path("outputs") / "demo")
    assert str(pathlib.Path("outputs/demo").resolve()) in command
    r = subprocess.run(["env", "-i", "/bin/sh", "-c", f"{command} --version_tb"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_the_triton_backend_without_triton_names_the_extra(tmp_path):
    r = _python("""
        import sys
        sys.modules["triton"] = None   # as if not installed
        import torch, zipccl_fsdp
        try:
            zipccl_fsdp.encode(torch.zeros(8, dtype=torch.bfloat16), backend="triton")
        except ValueError as e:
            print(e)
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "needs triton (not installed; pip install 'zipccl-fsdp[triton]')" in r.stdout, r.stdout
