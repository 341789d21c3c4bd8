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
# hooks -> zipccl_fsdp: imported last, once everything above exists.
from hooks.registry import ZipCCLHook, zipccl_hook, register_comm_hook  # noqa: E402
from hooks.ddp import ddp_comm_hook  # noqa: E402
from hooks.dtensor import (  # noqa: E402
    DTensorCompression, DTensorCompressionMode, compress_dtensor_comms,
    enable_dtensor_compression, disable_dtensor_compression,
)

__version__ = "0.1.0"

__all__ = [
    "CODECS", "BACKENDS", "encode", "decode", "max_encoded_nbytes",
    "CorruptPayloadError", "ZipCCLConfigError", "ZipCCLConfig", "CommStats", "TensorBoardStats",
    "all_gather_single", "reduce_scatter_single", "all_reduce", "all_to_all_single",
    "stats", "reset_stats",
    "ZipCCLHook", "zipccl_hook", "register_comm_hook", "ddp_comm_hook",
    "DTensorCompression", "DTensorCompressionMode", "compress_dtensor_comms",
    "enable_dtensor_compression", "disable_dtensor_compression",
]
