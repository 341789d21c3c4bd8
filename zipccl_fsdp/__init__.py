"""zipccl-fsdp: lossless compressed collectives for distributed training.

The public surface is this module; everything else is an implementation detail.

Example::

    >>> from zipccl_fsdp import zipccl_hook
    >>> fsdp_model.register_comm_hook(zipccl_hook)          # FSDP2
    >>> ddp_model.register_comm_hook(None, zipccl_hook)     # DDP
    >>> with zipccl_fsdp.compress_dtensor_comms():          # TP / EP
    ...     loss = tp_model(x).sum(); loss.backward()
"""
from ._guard import check_sibling_package as _check

_check("triton_kernels")
_check("hooks")
del _check

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
    "ZipCCLHook": "hooks.registry", "zipccl_hook": "hooks.registry",
    "register_comm_hook": "hooks.registry", "ddp_comm_hook": "hooks.ddp",
    "DTensorCompression": "hooks.dtensor", "compress_dtensor_comms": "hooks.dtensor",
    "enable_dtensor_compression": "hooks.dtensor", "disable_dtensor_compression": "hooks.dtensor",
}


_FSDP = "torch.distributed.fsdp"


def _register_fsdp_method() -> None:
    """Give ``FSDPModule`` its ``register_comm_hook`` (``hooks.registry`` adds
    it when imported) as soon as FSDP is loaded: now if it is, else right
    after its package is imported. Importing this package alone loads
    neither FSDP nor the hooks (the kernels and the format import it)."""
    import importlib
    import importlib.abc
    import importlib.util
    import sys

    if _FSDP in sys.modules:
        importlib.import_module("hooks.registry")
        return

    class _AfterFSDP(importlib.abc.MetaPathFinder):
        """Runs ``hooks.registry`` once FSDP's package has been executed."""

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
                importlib.import_module("hooks.registry")

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AfterFSDP())


_register_fsdp_method()


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
