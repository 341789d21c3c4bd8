"""torchtitan config functions for zipccl-fsdp (``--module zipccl_fsdp.titan``).

Train a tiny llama3 with FSDP2 on two CPU processes (gloo)::

    torchrun --standalone --nproc_per_node 2 -m torchtitan.train \\
        --module zipccl_fsdp.titan --config llama3_tiny \\
        --training.steps 20 --dump_folder outputs/tiny

Every field is overridable the usual torchtitan way (``--training.steps``,
``--dump_folder``, ``--metrics.log_freq``, ``--training.seq_len``, ...).

Config functions (``--config``):

``llama3_tiny``
    llama3 with dim 64, 2 layers, 4 heads, vocab 2048 (about 0.37 M
    parameters), seq 256, local batch 8, 20 steps: a CPU smoke run.
``llama3_debugmodel``
    torchtitan's own ``llama3_debugmodel`` (dim 256, 6 layers, about 6.2 M
    parameters). On CPUs its step is cut from 8 x 2048 tokens to 2 x 256 to
    keep CPU runs short (step times: docs/benchmarks.md, section "Figures
    behind constants").
``llama3_tiny_baseline``, ``llama3_debugmodel_baseline``
    the same without zipccl: FSDP2's default comms, for side-by-side runs.
``llama3_8b``
    torchtitan's ``llama3_8b`` with zipccl comms, for GPUs
    (``recipes/llama3_8b_fsdp8.toml``); unlike the others it keeps
    torchtitan's tokenizer path (``./assets/hf/Llama-3.1-8B``), c4 dataset,
    validation and checkpoints.
``deepseek_v3_debugmodel``
    torchtitan's smallest MoE, ``deepseek_v3`` flavor ``debugmodel`` (dim
    256, 6 layers, 8 routed + 2 shared experts, top 3), with zipccl comms;
    expert parallelism is set by the recipe
    (``recipes/deepseek_v3_debug_ep.toml``).
``deepseek_v3_tiny``
    the same MoE scaled down for CPU runs (dim 64, 2 layers of which one
    MoE, 4 routed + 1 shared experts, top 2; seq 256, local batch 8):
    ``recipes/deepseek_v3_tiny_ep_cpu.toml`` (expert parallel 2 x FSDP 2).

All of them: TensorBoard on (``<dump_folder>/tb/<time>/``, every step but
``llama3_8b``, which keeps torchtitan's ``log_freq``), zipccl's profiler
(``--profiler.trace_steps``, :mod:`zipccl_fsdp.titan.profiling`),
including zipccl's own tags (:mod:`zipccl_fsdp.titan.metrics`); seed 0; a
locally generated tokenizer and corpus (:mod:`zipccl_fsdp.titan.assets`), so
no download; no validation and no checkpoints. The non-baseline configs call
``zipccl_fsdp.register_comm_hook`` on every model part after ``fully_shard``
(:mod:`zipccl_fsdp.titan.comms`). Without an accelerator the CPU shim
(:mod:`zipccl_fsdp.titan.cpu_shim`) is applied; with one, torchtitan runs
unpatched but for ``torch.distributed.set_timeout``, which torch 2.13 lacks
and torchtitan 0.3.0 calls (see :func:`~zipccl_fsdp.titan.cpu_shim.ensure_set_timeout`).
"""
from __future__ import annotations

from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.optimizer import default_adamw
from torchtitan.config.override import derive as _derive
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.deepseek_v3 import config_registry as _deepseek_v3_registry
from torchtitan.models.llama3 import config_registry as _llama3_registry
from torchtitan.trainer import Trainer

from . import models as _models
from .assets import ensure_titan_assets as _ensure_titan_assets
from .comms import with_fsdp_comms as _with_fsdp_comms
from .cpu_shim import accelerator_present as _accelerator_present
from .cpu_shim import apply_cpu_shim as _apply_cpu_shim
from .cpu_shim import cpu_trainer_config as _cpu_trainer_config
from .metrics import ZipcclMetricsProcessor as _ZipcclMetricsProcessor
from .profiling import ZipcclProfiler as _ZipcclProfiler

# Step shapes on CPUs: small enough for a CPU run of a few steps (step times:
# docs/benchmarks.md, section "Figures behind constants").
_CPU_SEQ_LEN = 256
_TINY_LOCAL_BATCH = 8
_DEBUGMODEL_CPU_LOCAL_BATCH = 2
_TINY_LR = 3e-3
"""Higher than the debugmodel's 8e-4, so that the loss falls visibly within
the tiny runs' 20 steps (the losses: docs/benchmarks.md, section "Figures
behind constants")."""


def llama3_tiny() -> Trainer.Config:
    """Tiny llama3 (dim 64, 2 layers) with zipccl comms."""
    return _tiny(compress=True)


def llama3_tiny_baseline() -> Trainer.Config:
    """Tiny llama3 (dim 64, 2 layers) with FSDP2's default comms."""
    return _tiny(compress=False)


def llama3_debugmodel() -> Trainer.Config:
    """torchtitan's llama3 debugmodel with zipccl comms."""
    return _debugmodel(compress=True)


def llama3_debugmodel_baseline() -> Trainer.Config:
    """torchtitan's llama3 debugmodel with FSDP2's default comms."""
    return _debugmodel(compress=False)


def llama3_8b() -> Trainer.Config:
    """torchtitan's llama3 8B with zipccl comms (GPUs; torchtitan's data and tokenizer)."""
    config = _llama3_registry.llama3_8b()
    config.metrics = _derive(
        config.metrics, _ZipcclMetricsProcessor.Config, enable_tensorboard=True
    )
    config.profiler = _derive(config.profiler, _ZipcclProfiler.Config)
    config.model_spec = _with_fsdp_comms(config.model_spec, compress=True)
    if _apply_cpu_shim():
        _cpu_trainer_config(config)
    return config


def deepseek_v3_debugmodel() -> Trainer.Config:
    """torchtitan's DeepSeek-V3 debug MoE (8 experts) with zipccl comms."""
    config = _deepseek_v3_registry.deepseek_v3_debugmodel()
    return _finish(config, compress=True)


def deepseek_v3_tiny() -> Trainer.Config:
    """A tiny DeepSeek-V3 MoE (dim 64, 4 experts) with zipccl comms, for CPU runs."""
    return _tiny_cpu(_deepseek_v3_registry.deepseek_v3_debugmodel(),
                     _models.deepseek_v3_tiny_spec(), compress=True)


def _tiny(*, compress: bool) -> Trainer.Config:
    return _tiny_cpu(_llama3_registry.llama3_debugmodel(), _models.llama3_tiny_spec(),
                     compress=compress)


def _tiny_cpu(config: Trainer.Config, model_spec, *, compress: bool) -> Trainer.Config:
    """``config`` with ``model_spec`` and the loss, optimizer and batch of the
    tiny CPU runs."""
    config.model_spec = model_spec
    config.loss = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(
            global_vocab_size=decoder_vocab_size(config.model_spec)
        )
    )
    config.optimizer = default_adamw(lr=_TINY_LR)
    config.training.seq_len = _CPU_SEQ_LEN
    config.training.local_batch_size = _TINY_LOCAL_BATCH
    config.training.steps = 20
    return _finish(config, compress=compress)


def _debugmodel(*, compress: bool) -> Trainer.Config:
    config = _llama3_registry.llama3_debugmodel()
    config = _finish(config, compress=compress)
    if not _accelerator_present():
        config.training.seq_len = _CPU_SEQ_LEN
        config.training.local_batch_size = _DEBUGMODEL_CPU_LOCAL_BATCH
    return config


def _finish(config: Trainer.Config, *, compress: bool) -> Trainer.Config:
    """Settings shared by every config of this module."""
    assets = _ensure_titan_assets()
    config.hf_assets_path = str(assets.tokenizer_dir)
    config.dataloader = HuggingFaceTextDataLoader.Config(
        dataset="c4_test",  # torchtitan's local-folder loader; reads {"text": ...}
        dataset_path=str(assets.dataset_dir),
    )
    config.metrics = _ZipcclMetricsProcessor.Config(
        log_freq=1, enable_tensorboard=True
    )
    config.profiler = _derive(config.profiler, _ZipcclProfiler.Config)
    config.validator.enable = False
    config.checkpoint.enable = False
    if config.debug.seed is None:
        config.debug.seed = 0
    config.model_spec = _with_fsdp_comms(config.model_spec, compress=compress)
    if _apply_cpu_shim():
        _cpu_trainer_config(config)
    return config
