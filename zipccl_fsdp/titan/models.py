"""Model specs of the torchtitan configs: a tiny llama3 for CPU smoke runs.

The tiny model is torchtitan's llama3 ``debugmodel`` scaled down (dim 64,
2 layers, 4 heads of 16, SwiGLU hidden 192, vocab 2048: about 0.37 M
parameters), built with the same builders and initialisations as the
debugmodel. Those builders are private to ``torchtitan.models.llama3``; the
package pins ``torchtitan==0.3.0``, and :func:`llama3_tiny_spec` is the one
place that would follow a rename.
"""
from __future__ import annotations

import dataclasses

from torchtitan.models.common import (
    ComplexRoPE,
    Embedding,
    Linear,
    RMSNorm,
    compute_ffn_hidden_dim,
)
from torchtitan.models.llama3 import (
    _EMBEDDING_INIT,
    _NORM_INIT,
    _build_llama3_layers,
    _output_linear_init,
    Llama3Model,
    model_registry,
)
from torchtitan.protocols.model_spec import ModelSpec

TINY_DIM = 64
TINY_LAYERS = 2
TINY_HEADS = 4
TINY_VOCAB = 2048
TINY_MAX_SEQ_LEN = 4096
"""RoPE table length; torchtitan trims it to ``training.seq_len``."""


def llama3_tiny_config(attn_backend: str = "flex") -> Llama3Model.Config:
    """Return the tiny llama3 model config."""
    return Llama3Model.Config(
        dim=TINY_DIM,
        vocab_size=TINY_VOCAB,
        tok_embeddings=Embedding.Config(
            num_embeddings=TINY_VOCAB,
            embedding_dim=TINY_DIM,
            param_init=_EMBEDDING_INIT,
        ),
        norm=RMSNorm.Config(normalized_shape=TINY_DIM, param_init=_NORM_INIT),
        lm_head=Linear.Config(
            in_features=TINY_DIM,
            out_features=TINY_VOCAB,
            param_init=_output_linear_init(TINY_DIM),
        ),
        layers=_build_llama3_layers(
            fuse_qkv=True,
            n_layers=TINY_LAYERS,
            dim=TINY_DIM,
            n_heads=TINY_HEADS,
            hidden_dim=compute_ffn_hidden_dim(TINY_DIM, multiple_of=64),
            rope=ComplexRoPE.Config(
                dim=TINY_DIM // TINY_HEADS,
                max_seq_len=TINY_MAX_SEQ_LEN,
                theta=500000,
                scaling="llama",
            ),
            attn_backend=attn_backend,
        ),
    )


def llama3_tiny_spec() -> ModelSpec:
    """Return a llama3 ``ModelSpec`` (flavor ``"tiny"``) for the tiny model."""
    spec = model_registry("debugmodel")
    return dataclasses.replace(spec, flavor="tiny", model=llama3_tiny_config())


DSV3_TINY_DIM = 64
DSV3_TINY_LAYERS = 2
"""One dense layer, then one MoE layer."""
DSV3_TINY_EXPERTS = 4
DSV3_TINY_VOCAB = 2048


def deepseek_v3_tiny_config(attn_backend: str = "flex") -> "DeepSeekV3Model.Config":
    """Return a tiny DeepSeek-V3 MoE config: torchtitan's ``debugmodel`` scaled
    down (dim 64, 2 layers of which 1 MoE, 4 routed + 1 shared experts, top 2,
    multi-head latent attention with 4 heads; about 0.5 M parameters), built with
    the same private builders (``torchtitan.models.deepseek_v3``, pinned 0.3.0)."""
    from torchtitan.models.deepseek_v3 import (
        _EMBEDDING_INIT as DSV3_EMBEDDING_INIT,
        _NORM_INIT as DSV3_NORM_INIT,
        _build_dsv3_layers,
        _output_linear_init as dsv3_output_linear_init,
        DeepSeekV3Model,
    )

    dim, vocab, rope_dim = DSV3_TINY_DIM, DSV3_TINY_VOCAB, 16
    layers = _build_dsv3_layers(
        n_layers=DSV3_TINY_LAYERS,
        n_dense_layers=1,
        dim=dim,
        n_heads=4,
        q_lora_rank=0,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=rope_dim,
        v_head_dim=16,
        mscale=0.70,
        dense_hidden_dim=128,
        moe_hidden_dim=64,
        num_experts=DSV3_TINY_EXPERTS,
        num_shared_experts=1,
        router_top_k=2,
        router_score_func="softmax",
        attn_backend=attn_backend,
        moe_comm_backend="standard",
        non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(
            dim=rope_dim,
            max_seq_len=TINY_MAX_SEQ_LEN,
            theta=10000.0,
            scaling="yarn",
            rope_factor=40.0,
            beta_fast=32.0,
            beta_slow=1.0,
            original_seq_len=TINY_MAX_SEQ_LEN,
        ),
    )
    return DeepSeekV3Model.Config(
        vocab_size=vocab,
        dim=dim,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab, embedding_dim=dim, param_init=DSV3_EMBEDDING_INIT
        ),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=DSV3_NORM_INIT),
        lm_head=Linear.Config(
            in_features=dim, out_features=vocab, param_init=dsv3_output_linear_init(dim)
        ),
        layers=layers,
        mtp_layers=[],
    )


def deepseek_v3_tiny_spec() -> ModelSpec:
    """Return a DeepSeek-V3 ``ModelSpec`` (flavor ``"tiny"``) for the tiny MoE."""
    from torchtitan.models.deepseek_v3 import model_registry as dsv3_registry

    spec = dsv3_registry("debugmodel")
    return dataclasses.replace(spec, flavor="tiny", model=deepseek_v3_tiny_config())
