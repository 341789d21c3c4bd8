"""zipccl-fsdp: lossless compressed collectives for distributed training.

The public surface is this module; everything else is an implementation detail.

Example::

    >>> from zipccl_fsdp import zipccl_hook
    >>> fsdp_model.register_comm_hook(zipccl_hook)          # FSDP2
    >>> ddp_model.register_comm_hook(None, zipccl_hook)     # DDP
    >>> with zipccl_fsdp.compress_dtensor_comms():          # TP / EP
    ...     loss = tp_model(x).sum(); loss.backward()
"""
import sys as _sys
from pathlib import Path as _Path


class _CheckoutFinder:
    """Finds ``zipccl_fsdp.hooks`` and ``zipccl_fsdp.triton_kernels`` in a
    source checkout, where they are the folders ``hooks/`` and
    ``triton_kernels/`` beside this package's own (pyproject.toml installs
    them inside it). First on ``sys.meta_path``, so that a checkout on
    ``PYTHONPATH`` uses its own folders even where another checkout is
    installed in editable mode; it answers for those two names only."""

    def __init__(self, folders: dict) -> None:
        self.folders = folders

    def find_spec(self, name, path=None, target=None):
        folder = self.folders.get(name)
        if folder is None:
            return None
        import importlib.util

        return importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)])


def _install_checkout_finder() -> None:
    here = _Path(__file__).resolve().parent
    root = here.parent
    if (here / "hooks").is_dir() or not (root / "pyproject.toml").is_file():
        return  # installed from a wheel: the subpackages are folders of this one
    folders = {f"{__name__}.{sub}": root / sub for sub in ("hooks", "triton_kernels")
               if (root / sub / "__init__.py").is_file()}
    if folders:
        _sys.meta_path.insert(0, _CheckoutFinder(folders))


_install_checkout_finder()

from .errors import CorruptPayloadError, ZipCCLConfigError  # noqa: E402
from .codec import CODECS, BACKENDS, encode, decode, max_encoded_nbytes  # noqa: E402
from .config import ZipCCLConfig  # noqa: E402
from .stats import CommStats  # noqa: E402
from .tensorboard_stats import TensorBoardStats  # noqa: E402
from .collectives import (  # noqa: E402
    all_gather_single, reduce_scatter_single, all_reduce, all_to_all_single, stats, reset_stats,
)
# The integrations (hooks/) import zipccl_fsdp, never the other way at import
# time: their names are loaded on first use, so importing the codec or the
# format (as triton_kernels does) loads neither hooks nor FSDP.
_LAZY = {
    "ZipCCLHook": "zipccl_fsdp.hooks.registry", "zipccl_hook": "zipccl_fsdp.hooks.registry",
    "register_comm_hook": "zipccl_fsdp.hooks.registry", "ddp_comm_hook": "zipccl_fsdp.hooks.ddp",
    "DTensorCompression": "zipccl_fsdp.hooks.dtensor", "compress_dtensor_comms": "zipccl_fsdp.hooks.dtensor",
    "enable_dtensor_compression": "zipccl_fsdp.hooks.dtensor", "disable_dtensor_compression": "zipccl_fsdp.hooks.dtensor",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'zipccl_fsdp' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "CODECS", "BACKENDS", "encode", "decode", "max_encoded_nbytes",
    "CorruptPayloadError", "ZipCCLConfigError", "ZipCCLConfig", "CommStats", "TensorBoardStats",
    "all_gather_single", "reduce_scatter_single", "all_reduce", "all_to_all_single",
    "stats", "reset_stats",
    "ZipCCLHook", "zipccl_hook", "register_comm_hook", "ddp_comm_hook",
    "DTensorCompression", "compress_dtensor_comms",
    "enable_dtensor_compression", "disable_dtensor_compression",
]
