"""The error for an FSDP2 whose internals are not where zipccl reads them.

Both FSDP2 modules of the hooks raise it (``fsdp2.py`` for the parameter
groups' comms, ``hsdp.py`` for the replicate all-reduce), so it lives apart
from either and each imports it at import time, with no cycle between them.
"""
from __future__ import annotations

import torch


class FSDP2InternalsError(RuntimeError):
    """FSDP2's state in this torch does not have what zipccl reads or writes."""


def internals_error(what: str, where: str) -> FSDP2InternalsError:
    """The error naming ``what`` FSDP2 internal is missing from ``where``."""
    return FSDP2InternalsError(
        f"zipccl cannot hook FSDP2 in torch {torch.__version__}: {where} has no {what} "
        f"(zipccl reads and writes it in torch 2.11 and 2.13; this torch moved it), "
        f"so the run would go raw or hang; train without zipccl's FSDP2 hook or use "
        f"a torch zipccl supports")
