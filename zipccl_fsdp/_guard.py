"""Refuse to run beside foreign modules named ``triton_kernels`` or ``hooks``.

Both names are generic and other distributions install top-level packages
under them too. Whichever is found first on ``sys.path`` wins at import, so a
foreign one would silently replace our kernels or hooks; we check a marker
attribute instead and fail with a message that says what was found where.
"""
import importlib.util
import sys

MARKER = "__zipccl_fsdp_part__"


def check_sibling_package(name: str) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ImportError(
            f"zipccl_fsdp needs its top-level package {name!r}, which is not "
            f"installed; reinstall zipccl-fsdp (pip install -e .)"
        )
    # Read the marker without importing the package: importing ``hooks`` here
    # would load FSDP and DDP for a user of the codec alone.
    module = sys.modules.get(name)
    if module is not None:
        ours = getattr(module, MARKER, False)
    else:
        try:
            with open(spec.origin, encoding="utf-8") as f:
                ours = f"{MARKER} = True" in f.read()
        except (OSError, TypeError):
            ours = False
    if not ours:
        where = spec.origin or list(spec.submodule_search_locations or [])
        raise ImportError(
            f"a foreign module named {name!r} shadows zipccl-fsdp's own (found at "
            f"{where}); another distribution installs a top-level {name!r} too. "
            f"Uninstall it or put zipccl-fsdp first on sys.path."
        )
