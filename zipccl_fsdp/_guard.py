"""Refuse to run beside foreign modules named ``triton_kernels`` or ``hooks``.

Both names are generic and other distributions install top-level packages
under them too. Whichever is found first on ``sys.path`` wins at import, so a
foreign one would silently replace our kernels or hooks; we check a marker
attribute instead and fail with a message that says what was found where.
"""
import importlib
import importlib.util

MARKER = "__zipccl_fsdp_part__"


def check_sibling_package(name: str) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ImportError(
            f"zipccl_fsdp needs its top-level package {name!r}, which is not "
            f"installed; reinstall zipccl-fsdp (pip install -e .)"
        )
    module = importlib.import_module(name)
    if not getattr(module, MARKER, False):
        where = getattr(module, "__file__", None) or list(getattr(module, "__path__", []))
        raise ImportError(
            f"a foreign module named {name!r} shadows zipccl-fsdp's own (found at "
            f"{where}); another distribution installs a top-level {name!r} too. "
            f"Uninstall it or put zipccl-fsdp first on sys.path."
        )
