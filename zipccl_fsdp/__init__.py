"""zipccl-fsdp: lossless compressed collectives for distributed training.

The public surface is this module; everything else is an implementation detail.
"""
from ._guard import check_sibling_package as _check

_check("triton_kernels")
_check("hooks")
del _check

from .errors import CorruptPayloadError, ZipCCLConfigError  # noqa: E402
from .codec import CODECS, BACKENDS, encode, decode, max_encoded_nbytes  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CODECS", "BACKENDS", "encode", "decode", "max_encoded_nbytes",
    "CorruptPayloadError", "ZipCCLConfigError",
]
