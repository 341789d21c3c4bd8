"""HSDP's cross-replica gradient all-reduce through zipccl's ``all_reduce``.

Native HSDP (``fully_shard`` on a 2-D replicate x shard mesh) reduce-scatters
a module's gradients inside its shard group, then all-reduces the result
across the replicas with a plain ``dist.all_reduce`` inside FSDP2's
``foreach_reduce`` (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``),
which no comm object reaches. ``foreach_reduce`` also takes an all-reduce
hook, ``hook(reduce_output)``, run after the reduce-scatter and before the
post-divide; with a shard-only mesh nothing else runs there. So for each HSDP
parameter group this module

1. makes FSDP2 see the group's mesh as shard-only: ``group.mesh_info``
   becomes an ``FSDPMeshInfo`` with the same fields (the same shard process
   group; the parameters keep their own 2-D mesh and placements, so DTensor
   views, the optimizer and gradient clipping are unchanged), so
   ``foreach_reduce`` skips its own all-reduce;
2. sets ``group._all_reduce_hook`` (what ``FSDPModule.set_all_reduce_hook``
   sets, which refuses modules with several groups) to a
   :class:`ReplicateAllReduce`, which runs
   ``zipccl_fsdp.collectives.all_reduce`` on the replicate process group with
   the reduce op native HSDP would use: ``AVG`` without a divide factor (FSDP2
   then averages inside the shard group too), ``SUM`` with one (FSDP2 applies
   the factor; torchtitan sets 1.0).

``remove`` gives the group its mesh info and hook back.

Summation order: the shard group's sum is zipccl's reduce-scatter (fp32, in
shard rank order), then the replicas' partial sums are added by zipccl's
all-reduce (fp32, in replicate rank order): ``sum_r (sum_s g[r, s])``, each
level divided as native HSDP divides it. With two ranks per level every sum
has two terms, so that is native HSDP's result bit for bit.

Not supported, refused with an error naming the module: a group that already
has an all-reduce hook; ``set_requires_all_reduce(False)`` (gradient
accumulation without the all-reduce: FSDP2 would then accumulate partial
sums that zipccl's hook never sees) is refused at the step it happens, on
every rank; a reduction FSDP2 would split into a pre- and a post-divide by
the whole data-parallel size (no divide factor together with fp16 reduction
or ``set_force_sum_reduction_for_comms``): set a divide factor.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch.distributed import ReduceOp

from zipccl_fsdp.collectives import all_reduce

from ._fsdp2_internals import internals_error

# The FSDP2 internals used here: FSDPParamGroup attributes of the same names
# and meaning in torch 2.11, 2.13 and 2.14.1 (read from the wheels' sources).
_GROUP_ATTRS = ("mesh_info", "post_forward_mesh_info", "_all_reduce_hook",
                "_all_reduce_hook_stream", "all_reduce_grads", "gradient_divide_factor",
                "force_sum_reduction_for_comms")
_NO_OVERFLOW_DTYPES = (torch.float32, torch.bfloat16)
"""Reduce dtypes for which FSDP2 divides inside the collectives
(``_get_gradient_divide_factors``)."""


def _mesh_info_classes():
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_common import (FSDPMeshInfo,
                                                                       HSDPMeshInfo)
    except ImportError as e:
        raise internals_error("FSDPMeshInfo / HSDPMeshInfo",
                              "torch.distributed.fsdp._fully_shard._fsdp_common") from e
    return FSDPMeshInfo, HSDPMeshInfo


def is_hsdp(group) -> bool:
    """Whether an FSDP2 parameter group uses native HSDP (a replicate x shard mesh)."""
    return isinstance(group.mesh_info, _mesh_info_classes()[1])


def check_group(name: str, group) -> None:
    """Raise if zipccl cannot take over ``group``'s replicate all-reduce (no-op if not HSDP)."""
    hook = getattr(group, "_all_reduce_hook", None)
    if isinstance(hook, ReplicateAllReduce):  # ours: re-registration restores it first
        return
    if not is_hsdp(group):
        return
    for attr in _GROUP_ATTRS:
        if not hasattr(group, attr):
            raise internals_error(repr(attr), f"FSDPParamGroup of module {name!r}")
    if not hasattr(group.mesh_info, "replicate_process_group"):
        raise internals_error("'replicate_process_group'",
                              f"the HSDP mesh info of module {name!r}")
    if hook is not None:
        raise ValueError(
            f"zipccl cannot hook the HSDP all-reduce of FSDP2 module {name!r}: it already "
            f"has an all-reduce hook ({type(hook).__name__}); remove it first, or use "
            f"ZipCCLConfig(compress_all_reduce=False)")
    if group._all_reduce_hook_stream is not None:
        raise ValueError(f"zipccl cannot hook the HSDP all-reduce of FSDP2 module {name!r}: "
                         f"it has an all-reduce hook stream set")


@dataclass
class _Saved:
    mesh_info: object
    post_forward_mesh_info: object


class ReplicateAllReduce:
    """An FSDP2 all-reduce hook: the cross-replica all-reduce of one HSDP
    parameter group's reduce-scatter output, through
    ``zipccl_fsdp.collectives.all_reduce`` with the owning hook's config and
    statistics (kind ``all_reduce``)."""

    def __init__(self, hook, group, replicate_group, name: str) -> None:
        self.hook, self.group, self.replicate_group, self.name = hook, group, replicate_group, name

    def op(self, reduce_output: torch.Tensor):
        """The reduce op native HSDP's all-reduce would use for this group now."""
        group = self.group
        if group.gradient_divide_factor is not None:
            return ReduceOp.SUM
        if (reduce_output.dtype not in _NO_OVERFLOW_DTYPES
                or group.force_sum_reduction_for_comms):
            raise RuntimeError(
                f"zipccl's HSDP all-reduce of FSDP2 module {self.name!r}: without a gradient "
                f"divide factor FSDP2 would divide by the whole data-parallel size around "
                f"the sums ({reduce_output.dtype} reduction or force_sum_reduction_for_comms), "
                f"which a shard-only reduce-scatter cannot reproduce; call "
                f"set_gradient_divide_factor() on the module")
        return ReduceOp.AVG

    def __call__(self, reduce_output: torch.Tensor) -> None:
        if not self.group.all_reduce_grads:
            raise RuntimeError(
                f"zipccl's HSDP all-reduce of FSDP2 module {self.name!r}: "
                f"set_requires_all_reduce(False) is not supported (FSDP2 would accumulate "
                f"gradients zipccl's all-reduce never sees); remove the hook for "
                f"gradient accumulation without all-reduce")
        op = self.op(reduce_output)
        tap = getattr(self.hook, "capture_tap", None)
        if tap is not None:
            tap("all_reduce", reduce_output)
        all_reduce(reduce_output, op=op, group=self.replicate_group,
                   config=self.hook.config, stats=self.hook.comm_stats)


def install(name: str, group, hook) -> _Saved | None:
    """Route ``group``'s replicate all-reduce through ``hook``; return what
    ``remove`` restores (None: not an HSDP group, nothing changed)."""
    if not is_hsdp(group):
        return None
    FSDPMeshInfo, _ = _mesh_info_classes()
    hsdp_info = group.mesh_info
    # The same fields (shard group, reduce-scatter group, mesh dims), seen by
    # FSDP2 as a shard-only mesh: foreach_reduce then runs no all-reduce of its own.
    shard_only = copy.copy(hsdp_info)
    shard_only.__class__ = FSDPMeshInfo
    saved = _Saved(hsdp_info, group.post_forward_mesh_info)
    group.mesh_info = shard_only
    if group.post_forward_mesh_info is hsdp_info:  # reshard_after_forward=True
        group.post_forward_mesh_info = shard_only
    group._all_reduce_hook = ReplicateAllReduce(hook, group, hsdp_info.replicate_process_group,
                                                name)
    return saved


def remove(group, saved: _Saved) -> None:
    """Undo ``install``: native HSDP again."""
    group.mesh_info = saved.mesh_info
    group.post_forward_mesh_info = saved.post_forward_mesh_info
    group._all_reduce_hook = None
