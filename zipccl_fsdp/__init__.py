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
import types as _types
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

# Every public name is loaded on first use (PEP 562): importing the package,
# or running ``zipccl --help``, does not import torch. The integrations
# (hooks/) import zipccl_fsdp, never the other way at import time, so
# importing the codec or the format (as triton_kernels does) loads neither
# hooks nor FSDP.
_EXPORTS = {
    **dict.fromkeys(("CorruptPayloadError", "ZipCCLConfigError"), ".errors"),
    **dict.fromkeys(("CODECS", "BACKENDS", "encode", "decode", "max_encoded_nbytes"), ".codec"),
    "ZipCCLConfig": ".config", "CommStats": ".stats", "TensorBoardStats": ".tensorboard_stats",
    **dict.fromkeys(("all_gather_single", "reduce_scatter_single", "all_reduce",
                     "all_to_all_single", "stats", "reset_stats"), ".collectives"),
    **dict.fromkeys(("ZipCCLHook", "zipccl_hook", "register_comm_hook"), ".hooks.registry"),
    "ddp_comm_hook": ".hooks.ddp",
    **dict.fromkeys(("DTensorCompression", "compress_dtensor_comms",
                     "enable_dtensor_compression", "disable_dtensor_compression"),
                    ".hooks.dtensor"),
}


_FSDP = "torch.distributed.fsdp"


def _register_fsdp_method() -> None:
    """Give ``FSDPModule`` its ``register_comm_hook`` (``zipccl_fsdp.hooks.registry`` adds
    it when imported) as soon as FSDP is loaded: now if it is, else right
    after its package is imported. Importing this package alone loads
    neither FSDP nor the hooks (the kernels and the format import it)."""
    import importlib
    import importlib.abc
    import importlib.util
    import sys

    if _FSDP in sys.modules:
        importlib.import_module("zipccl_fsdp.hooks.registry")
        return

    class _AfterFSDP(importlib.abc.MetaPathFinder):
        """Runs ``zipccl_fsdp.hooks.registry`` once FSDP's package has been executed."""

        def find_spec(self, fullname, path, target=None):
            if fullname != _FSDP:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                importlib.import_module("zipccl_fsdp.hooks.registry")

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AfterFSDP())


_register_fsdp_method()


def __getattr__(name: str):
    import importlib.util

    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # a submodule not imported yet
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_EXPORTS})


class _Package(_types.ModuleType):
    """This package's module type: the import system binds each submodule on
    its package when it is first imported, and the module ``stats`` must not
    replace the public function ``stats`` (nor any module a public name)."""

    def __setattr__(self, name, value):
        if name in _EXPORTS and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


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
