"""Document-causal attention with ``F.scaled_dot_product_attention`` for CPUs.

torchtitan's language models use FlexAttention with a causal, packed-document
mask; FlexAttention has no backward on CPU (pytorch/pytorch#169224, error
message added in pytorch/pytorch#169646), and torchtitan's own SDPA module
refuses masks. :class:`CpuDocumentCausalSDPA` keeps the same masking with
plain SDPA: its ``Config`` subclasses ``VarlenAttention.Config``, so the
trainer hands it the per-document offsets (``VarlenMetadata``, built from the
dataloader's positions with tensor ops only, no ``torch.compile``), and it
turns them into a dense boolean mask. The mask costs ``B * L * L`` bytes:
fine at the sequence lengths a CPU trains at.

Use it through :func:`replace_flex_attention` (what the CPU configs of
:mod:`zipccl_fsdp.titan` do) or, for any other torchtitan config, through the
override ``--override.imports zipccl_fsdp.titan.cpu_attention.cpu_sdpa_attention``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torchtitan.config.override import override
from torchtitan.models.common.attention import (
    FlexAttention,
    VarlenAttention,
    VarlenMetadata,
)
from torchtitan.protocols.module import Module


class CpuDocumentCausalSDPA(Module):
    """Inner attention: causal within each packed document, via SDPA.

    Takes and returns ``(B, L, N, H)`` like torchtitan's other inner
    attentions; ``attention_masks`` is the ``VarlenMetadata`` the trainer
    builds for ``VarlenAttention.Config`` subclasses.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        pass

    def __init__(self, config: Config) -> None:
        super().__init__()
        if tuple(config.window_size) != (-1, 0):
            raise ValueError(
                "CpuDocumentCausalSDPA supports causal attention only "
                f"(window_size=(-1, 0)), got {config.window_size}"
            )

    def forward(
        self,
        q_BLNH: torch.Tensor,
        k_BLNH: torch.Tensor,
        v_BLNH: torch.Tensor,
        *,
        attention_masks: VarlenMetadata,
        scale: float | None = None,
        enable_gqa: bool = False,
        out_transform: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if out_transform is not None:
            raise NotImplementedError("CpuDocumentCausalSDPA has no LSE output")
        if not isinstance(attention_masks, VarlenMetadata):
            raise TypeError(
                f"attention_masks must be VarlenMetadata, got {type(attention_masks)}"
            )
        batch, seq_len = q_BLNH.shape[:2]
        mask_B1LL = document_causal_mask(attention_masks.cu_seq_q, batch, seq_len)
        out_BNLH = F.scaled_dot_product_attention(
            q_BLNH.transpose(1, 2),
            k_BLNH.transpose(1, 2),
            v_BLNH.transpose(1, 2),
            attn_mask=mask_B1LL,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        return out_BNLH.transpose(1, 2)


def document_causal_mask(
    cu_seqlens: torch.Tensor, batch: int, seq_len: int
) -> torch.Tensor:
    """Return a ``(batch, 1, seq_len, seq_len)`` bool mask, True = attend.

    ``cu_seqlens`` are the document start offsets into the packed
    ``batch * seq_len`` tokens followed by the total (``VarlenMetadata``).
    """
    total = batch * seq_len
    starts = torch.zeros(total, dtype=torch.int32, device=cu_seqlens.device)
    starts[cu_seqlens[:-1].long()] = 1
    doc_BL = torch.cumsum(starts, dim=0).view(batch, seq_len)
    same_doc = doc_BL.unsqueeze(2) == doc_BL.unsqueeze(1)
    causal = torch.ones(
        seq_len, seq_len, dtype=torch.bool, device=cu_seqlens.device
    ).tril()
    return (same_doc & causal).unsqueeze(1)


@override(
    target=FlexAttention.Config,
    description="FlexAttention -> document-causal SDPA (CPU training)",
)
def cpu_sdpa_attention(cfg: FlexAttention.Config) -> CpuDocumentCausalSDPA.Config:
    """Replace a FlexAttention inner attention by :class:`CpuDocumentCausalSDPA`."""
    return CpuDocumentCausalSDPA.Config()


def replace_flex_attention(model_spec: Any) -> int:
    """Swap every FlexAttention config under ``model_spec`` in place.

    Does what ``--override.imports ...cpu_sdpa_attention`` does, but from a
    config function, so a user's own ``--override.imports`` on the command
    line (which replaces the list set in code) cannot drop it. Returns the
    number of attention configs replaced.
    """
    hits = list(model_spec.traverse(FlexAttention.Config))
    for _fqn, cfg, parent, attr in hits:
        new = cpu_sdpa_attention(cfg)
        if isinstance(parent, list):
            parent[attr] = new
        else:
            setattr(parent, attr, new)
    return len(hits)
