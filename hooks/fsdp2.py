"""FSDP2 comms backed by zipccl's compressed collectives, and their installation.

FSDP2 (``fully_shard``) takes one custom ``AllGather`` and one custom
``ReduceScatter`` per module (``set_custom_all_gather`` /
``set_custom_reduce_scatter``; setting them on the root does not reach the
children), calls them with keyword arguments ``output_tensor=``,
``input_tensor=``, ``group=``, ``async_op=`` (and ``op=``), ignores the
reduce-scatter's return value and asks them to ``allocate`` its buffers. The
comms here only forward to ``zipccl_fsdp.collectives``; all work is there.

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


def _param_groups(name: str, module: FSDPModule) -> list:
    # FSDP2 exposes the comms only as setters; reading them back (to refuse
    # symmetric memory and foreign comms, and to restore them) needs its state.
    try:
        state = module._get_fsdp_state()
        if hasattr(state, "_fsdp_param_groups"):  # torch >= 2.13: one group per mesh
            return list(state._fsdp_param_groups)
        group = state._fsdp_param_group  # torch 2.11: at most one
        return [group] if group is not None else []
    except AttributeError as e:  # torch moved its internals
        raise RuntimeError(f"zipccl cannot read the FSDP2 state of module {name!r} in this "
                           f"torch version ({torch.__version__}): {e}") from e


def _fsdp_modules(model: nn.Module) -> list:
    return [(name or "<root>", m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def install(model: nn.Module, hook) -> None:
    """Set ``hook``'s comms on every FSDP2 module under ``model`` (the root included).

    Checks every module before changing any, and raises ``ValueError`` naming
    the first module FSDP2 (or zipccl) refuses: several parameter groups
    (per-parameter meshes), symmetric-memory comms, or another custom comm.
    """
    modules = _fsdp_modules(model)
    for name, module in modules:
        groups = _param_groups(name, module)
        if len(groups) > 1:
            raise ValueError(
                f"zipccl cannot hook FSDP2 module {name!r} ({type(module).__name__}): it has "
                f"{len(groups)} parameter groups (per-parameter meshes from "
                f"shard_placement_fn), and FSDP2 takes custom comms only for one")
        for group in groups:
            ag, rs = group._all_gather_comm, group._reduce_scatter_comm
            for comm, ours, torchs in ((ag, ZipCCLAllGather, _TORCH_ALL_GATHERS),
                                       (rs, ZipCCLReduceScatter, _TORCH_REDUCE_SCATTERS)):
                if isinstance(comm, ours) or isinstance(comm, torchs):
                    continue
                if "SymmMem" in type(comm).__name__:
                    raise ValueError(
                        f"zipccl cannot hook FSDP2 module {name!r} ({type(module).__name__}): "
                        f"it uses symmetric-memory comms ({type(comm).__name__}, from "
                        f"set_symm_mem_for_comm), which read raw buffers zipccl would replace")
                raise ValueError(
                    f"zipccl cannot hook FSDP2 module {name!r} ({type(module).__name__}): it "
                    f"already has a custom comm {type(comm).__name__}; remove it first")
    for name, module in modules:
        for group in _param_groups(name, module):
            ag, rs = group._all_gather_comm, group._reduce_scatter_comm
            # On re-registration (by this or another hook) keep torch's originals.
            old_hook = getattr(ag, "hook", None) or getattr(rs, "hook", None)
            orig = (old_hook._fsdp2_saved.pop(module, None) if old_hook else None) or (None, None)
            hook._fsdp2_saved[module] = (ag if isinstance(ag, _TORCH_ALL_GATHERS) else orig[0],
                                         rs if isinstance(rs, _TORCH_REDUCE_SCATTERS) else orig[1])
        module.set_custom_all_gather(hook.all_gather_comm)
        module.set_custom_reduce_scatter(hook.reduce_scatter_comm)


def remove(model: nn.Module, hook) -> int:
    """Give every FSDP2 module under ``model`` that uses ``hook``'s comms torch's
    comms back (those it had before, else the defaults); return how many."""
    restored = 0
    for name, module in _fsdp_modules(model):
        for group in _param_groups(name, module):
            if (group._all_gather_comm is not hook.all_gather_comm
                    and group._reduce_scatter_comm is not hook.reduce_scatter_comm):
                continue
            ag, rs = hook._fsdp2_saved.pop(module, (None, None))
            module.set_custom_all_gather(ag if ag is not None else DefaultAllGather())
            module.set_custom_reduce_scatter(rs if rs is not None else DefaultReduceScatter())
            restored += 1
    return restored
