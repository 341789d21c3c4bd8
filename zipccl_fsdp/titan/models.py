"""Model specs of the torchtitan configs: a tiny llama3 for CPU smoke runs.

The tiny model is torchtitan's llama3 ``debugmodel`` scaled down (dim 64,
2 layers, 4 heads of 16, SwiGLU hidden 192, vocab 2048: about 0.37 M
parameters), built with the same helpers and initialisations as the
debugmodel. Those helpers are private to ``torchtitan.models.llama3``; the
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
