"""torchtitan trains zipccl_fsdp.titan's tiny llama3 with FSDP2 on 2 gloo CPU ranks.

Runs the real entry point, ``torchrun -m torchtitan.train --module
zipccl_fsdp.titan``, for 5 steps of ``llama3_tiny`` (zipccl comms) and of
``llama3_tiny_baseline`` (FSDP2's own comms), then reads the TensorBoard
event files back: the losses are logged at every step and finite, zipccl's
own scalars sit in the same event file, and the two runs have bit-identical
losses and gradient norms. With 2 ranks a reduction adds two numbers, which
is order-independent, so any difference would come from the comms changing
bits: this is the end-to-end losslessness check. (Until zipccl_fsdp provides
``register_comm_hook``, both runs use FSDP2's comms and the comparison checks
that training is deterministic.) Two fast tests check the pieces on their
own: the CPU attention against FlexAttention's forward, and the generated
tokenizer and corpus.
"""
from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("tokenizers")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

REPO = Path(__file__).resolve().parents[1]
STEPS = 5
RUN_TIMEOUT_S = 240
CONFIGS = ("llama3_tiny", "llama3_tiny_baseline")


def _train(config: str, dump: Path, cache: Path) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", "--nnodes", "1", "--nproc_per_node", "2",
        "-m", "torchtitan.train",
        "--module", "zipccl_fsdp.titan", "--config", config,
        "--training.steps", str(STEPS),
        "--dump_folder", str(dump),
        "--comm.init_timeout_seconds", "60",
        "--comm.train_timeout_seconds", "60",
    ]
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(
            p for p in (str(REPO), env.get("PYTHONPATH")) if p
        ),
        OMP_NUM_THREADS="1",
        ZIPCCL_FSDP_CACHE_DIR=str(cache / "zipccl"),
        HF_HOME=str(cache / "hf"),
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
    )
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=RUN_TIMEOUT_S,
    )
    if proc.returncode != 0:
        pytest.fail(f"{config} exited {proc.returncode}:\n{proc.stdout[-6000:]}")


def _scalars(dump: Path) -> tuple[list[Path], dict[str, list[tuple[int, float]]]]:
    files = sorted(dump.glob("tb/*/events.out.tfevents.*"))
    acc = EventAccumulator(str(files[0].parent)) if files else None
    if acc is None:
        return files, {}
    acc.Reload()
    return files, {
        tag: [(e.step, e.value) for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    out = {}
    for config in CONFIGS:
        dump = tmp_path_factory.mktemp(config)
        _train(config, dump, cache)
        out[config] = _scalars(dump)
    return out


@pytest.mark.parametrize("config", CONFIGS)
def test_losses_logged_every_step_and_finite(runs, config):
    files, scalars = runs[config]
    assert len(files) == 1, f"expected one event file (rank 0), got {files}"
    loss = scalars["loss_metrics/global_avg_loss"]
    assert [step for step, _ in loss] == list(range(1, STEPS + 1))
    values = [v for _, v in loss]
    assert all(math.isfinite(v) for v in values), values
    assert values[-1] < values[0], f"loss did not fall: {values}"


@pytest.mark.parametrize("config", CONFIGS)
def test_zipccl_scalars_share_torchtitans_event_file(runs, config):
    import zipccl_fsdp

    _, scalars = runs[config]
    flag = scalars["zipccl/config/compressed"]
    assert [step for step, _ in flag] == list(range(1, STEPS + 1))
    hook_available = hasattr(zipccl_fsdp, "register_comm_hook")
    expected = float(config == "llama3_tiny" and hook_available)
    assert {v for _, v in flag} == {expected}


def test_compressed_run_is_bit_identical_to_baseline(runs):
    def bits(config, tag):
        return [struct.pack("<f", v).hex() for _, v in runs[config][1][tag]]

    for tag in ("loss_metrics/global_avg_loss", "grad_norm"):
        assert bits("llama3_tiny", tag) == bits("llama3_tiny_baseline", tag), tag


def test_cpu_attention_matches_flex_attention_forward():
    """Same document-causal masking as torchtitan's FlexAttention path."""
    import torch
    from torch.nn.attention.flex_attention import (
        and_masks,
        create_block_mask,
        flex_attention,
    )
    from torchtitan.models.common.attention import (
        create_varlen_metadata_for_document,
        get_causal_mask_mod,
        get_document_mask_mod,
    )

    from zipccl_fsdp.titan.cpu_attention import CpuDocumentCausalSDPA

    gen = torch.Generator().manual_seed(0)
    batch, seq, heads, head_dim = 3, 48, 2, 8
    doc_lengths = ([10, 30, 8], [48], [1, 5, 42])
    positions = torch.stack(
        [torch.cat([torch.arange(n) for n in row]) for row in doc_lengths]
    )
    q, k, v = (
        torch.randn(batch, seq, heads, head_dim, generator=gen) for _ in range(3)
    )
    out = CpuDocumentCausalSDPA.Config().build()(
        q, k, v, attention_masks=create_varlen_metadata_for_document(positions)
    )
    mask = create_block_mask(
        and_masks(get_causal_mask_mod(), get_document_mask_mod(positions)),
        batch, None, seq, seq, device="cpu",
    )
    ref = flex_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=mask
    ).transpose(1, 2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_assets_are_deterministic_and_readable_by_torchtitan(tmp_path):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from zipccl_fsdp.titan.assets import (
        VOCAB_SIZE,
        ensure_titan_assets,
        generate_corpus,
    )

    assert generate_corpus(50) == generate_corpus(50)
    assets = ensure_titan_assets(tmp_path)
    assert ensure_titan_assets(tmp_path) == assets  # found, not rebuilt
    tok = HuggingFaceTokenizer(tokenizer_path=str(assets.tokenizer_dir))
    assert (tok.bos_id, tok.eos_id) == (0, 1)
    ids = tok.encode("Ada carries the red box.", add_bos=True, add_eos=True)
    assert ids[0] == 0 and ids[-1] == 1 and max(ids) < VOCAB_SIZE
    assert tok.decode(ids[1:-1]) == "Ada carries the red box."
