"""Run torchtitan 0.3.0 on a host without accelerators: CPU tensors, gloo.

torchtitan 0.3.0 assumes an accelerator; everything it needs on a CPU-only
host is done here, from outside its source, and only when
``torch.accelerator.is_available()`` is false (on GPUs with NCCL nothing in
this module touches torchtitan):

- Device detection: ``torchtitan.tools.utils.get_device_info`` falls back to
  ``"cuda"`` when no accelerator is found, and several modules copy
  ``device_type``/``device_module`` at import. :func:`apply_cpu_shim`
  rebinds them to ``"cpu"`` and :class:`CpuDeviceModule`, which adds what
  torchtitan calls on ``torch.cuda`` (device name and properties, memory
  statistics, ``current_device() == 0`` for ``barrier(device_ids=...)``).
  ``init_distributed`` then picks gloo from
  ``Backend.default_device_backend_map["cpu"]``.
- :func:`cpu_trainer_config` adjusts a ``Trainer.Config``:
  ``parallelism.spmd_backend = "partial_dtensor"`` (the default
  ``"spmd_types"`` fails in ``fully_shard`` here, see the function),
  ``training.disable_cuda_graphs = True``, and FlexAttention replaced by
  :class:`~zipccl_fsdp.titan.cpu_attention.CpuDocumentCausalSDPA` because
  FlexAttention has no CPU backward (pytorch/pytorch#169224).
- gloo has no ``ReduceOp.PREMUL_SUM``, which FSDP2 uses for torchtitan's
  gradient divide factor of 1.0; see :mod:`zipccl_fsdp.titan.comms`.

One shim is needed on every device: :func:`ensure_set_timeout`. torchtitan
0.3.0 calls ``torch.distributed.set_timeout`` after the first step; that
public function only exists in torch after 2.13 (pytorch/pytorch#187387, and
torchtitan declined a fallback in pytorch/torchtitan#3811). With torch 2.13
we alias it to the private ``distributed_c10d._set_pg_timeout`` that it
replaced, which NCCL and gloo both implement.
"""
from __future__ import annotations

import os
import platform
import resource
import sys
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import torch


def accelerator_present() -> bool:
    """Return whether torch sees an accelerator (CUDA, ROCm, XPU, ...)."""
    return torch.accelerator.is_available()


class CpuDeviceModule:
    """``torch.cpu`` plus the ``torch.cuda`` calls torchtitan makes.

    Memory figures are the process's peak resident set size (there is no
    allocator to ask), reported as both "active" and "reserved" peaks so that
    torchtitan's memory columns show something true.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def set_device(device: Any) -> None:
        pass

    @staticmethod
    def synchronize(device: Any = None) -> None:
        pass

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return f"CPU {platform.machine()} ({os.cpu_count()} cores)"

    @staticmethod
    def get_device_properties(device: Any = None) -> SimpleNamespace:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return SimpleNamespace(
            name=CpuDeviceModule.get_device_name(), total_memory=total
        )

    @staticmethod
    def memory_stats(device: Any = None) -> dict[str, int]:
        # ru_maxrss is in KiB on Linux and in bytes on macOS
        scale = 1 if sys.platform == "darwin" else 1024
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
        return {
            "active_bytes.all.peak": peak,
            "reserved_bytes.all.peak": peak,
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass


def ensure_set_timeout() -> None:
    """Provide ``torch.distributed.set_timeout`` where torch lacks it."""
    import torch.distributed as dist

    if hasattr(dist, "set_timeout"):
        return
    from torch.distributed import distributed_c10d

    def set_timeout(timeout: timedelta, group: Any = None) -> None:
        """Set the timeout of ``group`` (default: the world); torch 2.13 alias."""
        distributed_c10d._set_pg_timeout(timeout, group)

    dist.set_timeout = set_timeout


_CPU_DEVICE_MODULE = CpuDeviceModule()


def apply_cpu_shim() -> bool:
    """Point torchtitan at the CPU when no accelerator is present.

    Idempotent. Returns whether the shim is active (False on accelerator
    hosts, where nothing is changed). Must run before the ``Trainer`` is
    built; the config functions of :mod:`zipccl_fsdp.titan` call it.
    """
    ensure_set_timeout()
    if accelerator_present():
        return False
    import torchtitan.tools.utils as tt_utils

    old_type, old_module = tt_utils.device_type, tt_utils.device_module
    # Modules that did `from torchtitan.tools.utils import device_type, ...`
    # hold their own reference; rebind those too (only where the value is the
    # detected one, so anything set deliberately is left alone).
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "torchtitan" or name.startswith("torchtitan.")):
            continue
        namespace = vars(module)
        if namespace.get("device_type") is old_type and isinstance(old_type, str):
            module.device_type = "cpu"
        if namespace.get("device_module") is old_module and old_module is not None:
            module.device_module = _CPU_DEVICE_MODULE
    tt_utils.device_type, tt_utils.device_module = "cpu", _CPU_DEVICE_MODULE
    return True


def cpu_trainer_config(config: Any) -> Any:
    """Adjust a torchtitan ``Trainer.Config`` in place to run on CPUs; return it.

    - ``spmd_backend = "partial_dtensor"`` (DTensor for the model-parallel
      axes only, plain FSDP2 for data parallel; the backend torchtitan keeps
      beside its default, pytorch/torchtitan#4085). With the default
      ``"spmd_types"``, torch 2.13's ``fully_shard(..., dp_mesh_dims=...)``
      rejects the token embedding here ("all parameters must be DTensors on
      the full SPMD mesh ... Got plain tensor for parameter 'weight'"); not
      checked on a GPU, so it is changed on CPUs only.
    - CUDA graphs off (they would only log that they cannot be used).
    - FlexAttention -> :class:`CpuDocumentCausalSDPA` (no CPU backward:
      pytorch/pytorch#169224), same document-causal masking.
    """
    from .cpu_attention import replace_flex_attention

    config.parallelism.spmd_backend = "partial_dtensor"
    config.training.disable_cuda_graphs = True
    if config.model_spec is not None:
        replace_flex_attention(config.model_spec)
    return config
