"""FSDP2 comms backed by zipccl's compressed collectives, and their installation.

FSDP2 (``fully_shard``) takes one custom ``AllGather`` and one custom
``ReduceScatter`` per module (``set_custom_all_gather`` /
``set_custom_reduce_scatter``; setting them on the root does not reach the
children), calls them with keyword arguments ``output_tensor=``,
``input_tensor=``, ``group=``, ``async_op=`` (and ``op=``), ignores the
reduce-scatter's return value and asks them to ``allocate`` its buffers. The
comms here only forward to ``zipccl_fsdp.collectives``; all work is there.

A module whose parameters live on several meshes (``shard_placement_fn``
returning per-parameter mesh infos, as torchtitan does for MoE experts under
expert parallelism) has one parameter group per mesh, each with its own
comms and process group; FSDP2's setters refuse such modules, so the comms
are set on each group (``FSDPParamGroup._all_gather_comm`` /
``_reduce_scatter_comm``, what the setters write). HSDP groups also get their
replicate all-reduce through zipccl (``hooks/hsdp.py``). Every FSDP2 internal
read or written is checked first (``_param_groups``, ``hsdp.check_group``):
a torch that moved one gets ``FSDP2InternalsError`` naming the torch
version and the attribute, on every rank, before anything changed.

``hooks/registry.py`` adds ``FSDPModule.register_comm_hook(hook=zipccl_hook)``.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    DefaultAllGather, DefaultReduceScatter, ProcessGroupAllocAllGather,
    ProcessGroupAllocReduceScatter)

from zipccl_fsdp.collectives import all_gather_single, reduce_scatter_single

from . import hsdp
# FSDP2InternalsError is imported from here too (it is the error this module raises).
from ._fsdp2_internals import FSDP2InternalsError, internals_error  # noqa: F401

# Comms we may replace, and restore on remove(): torch's own plain ones.
_TORCH_ALL_GATHERS = (DefaultAllGather, ProcessGroupAllocAllGather)
_TORCH_REDUCE_SCATTERS = (DefaultReduceScatter, ProcessGroupAllocReduceScatter)


class _Alloc:
    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # Plain caching-allocator buffers, like torch's DefaultAllocMixin.
        return torch.empty(*size, dtype=dtype, device=device)


class ZipCCLAllGather(_Alloc, AllGather):
    """FSDP2 all-gather comm: ``zipccl_fsdp.collectives.all_gather_single`` with the
    owning hook's config and statistics."""

    def __init__(self, hook) -> None:
        self.hook = hook

    def __reduce__(self):  # pickles as its hook's (settings only), see ZipCCLHook
        return (_all_gather_comm_of, (self.hook,))

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group,
                 async_op: bool = False):
        return all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op,
                                 config=self.hook.config, stats=self.hook.comm_stats)


class ZipCCLReduceScatter(_Alloc, ReduceScatter):
    """FSDP2 reduce-scatter comm: ``zipccl_fsdp.collectives.reduce_scatter_single``
    (fp32 sum in rank order; SUM, AVG and PREMUL_SUM, also on gloo; NCCL's
    own reduce-scatter for a call the adaptive policy sends raw on NCCL)."""

    def __init__(self, hook) -> None:
        self.hook = hook

    def __reduce__(self):
        return (_reduce_scatter_comm_of, (self.hook,))

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op,
                 async_op: bool = False):
        return reduce_scatter_single(output_tensor, input_tensor, op=op, group=group,
                                     async_op=async_op, config=self.hook.config,
                                     stats=self.hook.comm_stats)


def _all_gather_comm_of(hook):
    return hook.all_gather_comm


def _reduce_scatter_comm_of(hook):
    return hook.reduce_scatter_comm


def is_fsdp2_model(model) -> bool:
    """Whether ``model`` is a module ``fully_shard`` was applied to."""
    return isinstance(model, FSDPModule)


# FSDP2 internals read or written here (checked on torch 2.11, 2.13 and 2.14.1; see
# _check_internals). Each parameter group (torch._fully_shard._fsdp_param_group
# .FSDPParamGroup) holds its own comms, called with its own process group.
_GROUP_ATTRS = ("_all_gather_comm", "_reduce_scatter_comm", "mesh_info")


def _param_groups(name: str, module: FSDPModule) -> list:
    # FSDP2 exposes the comms only as setters (and those refuse several
    # groups); reading them back (to refuse symmetric memory and foreign comms,
    # and to restore them) and setting them per group needs its state.
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        raise internals_error("'_get_fsdp_state'", f"FSDPModule {name!r}")
    state = get_state()
    if hasattr(state, "_fsdp_param_groups"):  # torch >= 2.13: one group per mesh
        groups = list(state._fsdp_param_groups)
    elif hasattr(state, "_fsdp_param_group"):  # torch 2.11: at most one
        groups = [state._fsdp_param_group] if state._fsdp_param_group is not None else []
    else:
        raise internals_error("'_fsdp_param_groups' (or '_fsdp_param_group')",
                              f"the FSDP state of module {name!r}")
    for group in groups:
        for attr in _GROUP_ATTRS:
            if not hasattr(group, attr):
                raise internals_error(repr(attr), f"FSDPParamGroup of module {name!r}")
    return groups


def _fsdp_modules(model: nn.Module) -> list:
    return [(name or "<root>", m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def _set_comms(module: FSDPModule, groups: list, all_gather, reduce_scatter) -> None:
    if len(groups) == 1:
        # The public setters (they refuse several groups).
        module.set_custom_all_gather(all_gather)
        module.set_custom_reduce_scatter(reduce_scatter)
        return
    # Several groups (per-parameter meshes from shard_placement_fn, e.g.
    # torchtitan's MoE experts under expert parallelism): what the setters do
    # for one group, on each; every group then calls the comm with its own
    # mesh's process group.
    for group in groups:
        group._all_gather_comm = all_gather
        group._reduce_scatter_comm = reduce_scatter


def _check_module(name: str, module: FSDPModule, groups: list, hook) -> None:
    for group in groups:
        ag, rs = group._all_gather_comm, group._reduce_scatter_comm
        for comm, torchs in ((ag, _TORCH_ALL_GATHERS), (rs, _TORCH_REDUCE_SCATTERS)):
            if _zipccl_hook_of(comm) is not None or isinstance(comm, torchs):
                continue
            if "SymmMem" in type(comm).__name__:
                raise ValueError(
                    f"zipccl cannot hook FSDP2 module {name!r} ({type(module).__name__}): "
                    f"it uses symmetric-memory comms ({type(comm).__name__}, from "
                    f"set_symm_mem_for_comm), which read raw buffers zipccl would replace")
            raise ValueError(
                f"zipccl cannot hook FSDP2 module {name!r} ({type(module).__name__}): it "
                f"already has a custom comm {type(comm).__name__}; remove it first")
        if hook.config.compress_all_reduce:
            hsdp.check_group(name, group)


def _zipccl_hook_of(comm):
    """The ``ZipCCLHook`` a comm belongs to (zipccl's comms, and wrappers of
    them that name their hook, e.g. the capture's), or None."""
    hook = getattr(comm, "hook", None)
    return hook if hasattr(hook, "_fsdp2_saved") else None


def _installed_hook(groups: list):
    """The zipccl hook whose comms ``groups`` use, or None."""
    for group in groups:
        for comm in (group._all_gather_comm, group._reduce_scatter_comm):
            if _zipccl_hook_of(comm) is not None:
                return _zipccl_hook_of(comm)
    return None


def install(model: nn.Module, hook) -> None:
    """Set ``hook``'s comms on every parameter group of every FSDP2 module under
    ``model`` (the root included), each group on its own mesh's process group.

    HSDP groups (a replicate x shard mesh) also get their cross-replica
    gradient all-reduce through zipccl's ``all_reduce`` when
    ``hook.config.compress_all_reduce`` (see ``hooks/hsdp.py``).

    Checks every module before changing any, and raises ``ValueError`` naming
    the first module zipccl refuses (symmetric-memory comms, another custom
    comm or all-reduce hook), or ``FSDP2InternalsError`` naming the FSDP2
    attribute this torch lacks.
    """
    modules = [(name, module, _param_groups(name, module)) for name, module in _fsdp_modules(model)]
    for name, module, groups in modules:
        _check_module(name, module, groups, hook)
    for name, module, groups in modules:
        # On re-registration (by this or another hook) give torch's state back
        # first, so that what is saved below is torch's own.
        old_hook = _installed_hook(groups)
        if old_hook is not None:
            _restore(module, groups, old_hook)
        saved = []
        for group in groups:
            ag, rs = group._all_gather_comm, group._reduce_scatter_comm
            replicate = (hsdp.install(name, group, hook) if hook.config.compress_all_reduce
                         else None)
            saved.append((ag, rs, replicate))
        hook._fsdp2_saved[module] = saved
        _set_comms(module, groups, hook.all_gather_comm, hook.reduce_scatter_comm)


def _restore(module: FSDPModule, groups: list, hook) -> bool:
    saved = hook._fsdp2_saved.pop(module, None)
    if saved is None or len(saved) != len(groups):
        saved = [(None, None, None)] * len(groups)
    for group, (_, _, replicate) in zip(groups, saved):
        if replicate is not None:
            hsdp.remove(group, replicate)
    ag = [a if a is not None else DefaultAllGather() for a, _, _ in saved]
    rs = [r if r is not None else DefaultReduceScatter() for _, r, _ in saved]
    if len(groups) == 1:
        module.set_custom_all_gather(ag[0])
        module.set_custom_reduce_scatter(rs[0])
    else:
        for group, a, r in zip(groups, ag, rs):
            group._all_gather_comm, group._reduce_scatter_comm = a, r
    return True


def remove(model: nn.Module, hook) -> int:
    """Give every FSDP2 module under ``model`` that uses ``hook``'s comms torch's
    comms back (those it had before, else the defaults), and HSDP groups their
    native all-reduce; return how many modules."""
    restored = 0
    for name, module in _fsdp_modules(model):
        groups = _param_groups(name, module)
        if _installed_hook(groups) is not hook:
            continue
        restored += _restore(module, groups, hook)
    return restored
