"""zipccl on the FSDP2 layouts of large runs, in plain FSDP2 code, on 4 gloo ranks.

- Several parameter groups per module (what torchtitan builds for MoE experts
  under expert parallelism: experts sharded on a second mesh through
  ``shard_placement_fn``): every group gets zipccl's comms on its own
  process group.
- HSDP (replicate 2 x shard 2): the cross-replica gradient all-reduce goes
  through zipccl's ``all_reduce`` on the replicate group (``hooks/hsdp.py``).

Each compressed run (``policy="always"``, 3 steps) must give the reference's
losses and final parameters bit for bit. The reference for the multi-group
model is FSDP2 with a rank-order reduce-scatter written here (four-term fp32
sums depend on their order; zipccl sums in rank order); for HSDP on 2 x 2
every sum has two terms, so native HSDP is the reference.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_common
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (DefaultAllGather,
                                                                   DefaultReduceScatter)
from torch.distributed.tensor import Shard

import zipccl_fsdp.hooks.fsdp2
from zipccl_fsdp.hooks.fsdp2 import FSDP2InternalsError, ZipCCLAllGather, ZipCCLReduceScatter, _param_groups
from zipccl_fsdp.hooks.hsdp import ReplicateAllReduce
from zipccl_fsdp.hooks.registry import ZipCCLHook
from test_fsdp2 import AllToAllSumReduceScatter
from test_fsdp2 import train as train_fsdp2
from zipccl_fsdp.config import ZipCCLConfig

PER_PARAM_MESH = hasattr(_fsdp_common, "ShardPlacementResult")
STEPS = 3
VOCAB, DIM, HIDDEN, EXPERTS, LAYERS, SEQ, BATCH = 128, 32, 64, 4, 2, 8, 2
MP = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


class Block(nn.Module):
    """A dense MLP and, optionally, a bank of experts (every token uses all, mean)."""

    def __init__(self, experts: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)
        self.experts = nn.Parameter(torch.randn(EXPERTS, DIM, DIM) * 0.1) if experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        x = x + self.down(F.gelu(self.up(h)))
        if self.experts is not None:
            x = x + torch.einsum("bsd,edf->bsf", h, self.experts) / EXPERTS
        return x


class Model(nn.Module):
    def __init__(self, experts: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(experts) for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_moe() -> nn.Module:
    """Dense parameters FSDP over all 4 ranks; experts FSDP over pairs (a second mesh)."""
    torch.manual_seed(0)
    model = Model(experts=True)
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    ep_mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("ep", "efsdp"))
    expert_info = _fsdp_common.FSDPMeshInfo(ep_mesh["efsdp"], shard_mesh_dim=0)

    def placement(param):
        if any(param is b.experts for b in model.blocks):
            return _fsdp_common.ShardPlacementResult(Shard(0), expert_info)
        return None

    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=MP, shard_placement_fn=placement)
    fully_shard(model, mesh=mesh, mp_policy=MP)
    return model


def build_hsdp() -> nn.Module:
    torch.manual_seed(0)
    model = Model(experts=False)
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2),
                            mesh_dim_names=("replicate", "shard"))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=MP)
    fully_shard(model, mesh=mesh, mp_policy=MP)
    return model


def train(model: nn.Module, steps: int = STEPS) -> tuple[list, list]:
    """Loss bits per step and a digest of each local parameter shard at the end."""
    return train_fsdp2(model, steps, vocab=VOCAB, batch=BATCH, seq=SEQ)


def groups_of(model) -> list:
    return [(name, g) for name, m in zipccl_fsdp.hooks.fsdp2._fsdp_modules(model)
            for g in _param_groups(name, m)]


def task_moe(mode: str):
    model = build_moe()
    groups = groups_of(model)
    counts = {name: sum(1 for n, _ in groups if n == name) for name, _ in groups}
    assert counts["blocks.0"] == 2 and counts["<root>"] == 1, counts  # dense + experts
    hook = None
    if mode == "reference":
        for _, g in groups:
            g._reduce_scatter_comm = AllToAllSumReduceScatter()
    else:
        hook = ZipCCLHook(ZipCCLConfig(policy="always", codec="dense", min_bytes=0))
        assert model.register_comm_hook(hook) is hook
        sizes = set()
        for _, g in groups:
            assert isinstance(g._all_gather_comm, ZipCCLAllGather)
            assert isinstance(g._reduce_scatter_comm, ZipCCLReduceScatter)
            sizes.add(g._all_gather_process_group.size())
        assert sizes == {2, 4}, sizes  # each group on its own mesh
    losses, digests = train(model)
    stats = hook.stats() if hook else None
    if hook:
        assert hook.remove(model) is None
        for _, g in groups:
            assert type(g._all_gather_comm) is DefaultAllGather
            assert type(g._reduce_scatter_comm) is DefaultReduceScatter
    return {"losses": losses, "digests": digests, "stats": stats}


def task_hsdp(mode: str):
    model = build_hsdp()
    hook = None
    groups = groups_of(model)
    if mode == "zipccl":
        hook = ZipCCLHook(ZipCCLConfig(policy="always", codec="dense", min_bytes=0))
        model.register_comm_hook(hook)
        for _, g in groups:
            assert isinstance(g._all_reduce_hook, ReplicateAllReduce)
            assert not g._is_hsdp  # FSDP2 runs no all-reduce of its own
    elif mode == "zipccl_no_all_reduce":
        hook = ZipCCLHook(ZipCCLConfig(policy="always", codec="dense", min_bytes=0,
                                       compress_all_reduce=False))
        model.register_comm_hook(hook)
        for _, g in groups:
            assert g._all_reduce_hook is None and g._is_hsdp
    losses, digests = train(model)
    stats = hook.stats() if hook else None
    if hook:
        # Re-registering with another hook, then remove(): native HSDP again.
        other = ZipCCLHook(ZipCCLConfig(policy="always", min_bytes=0))
        model.register_comm_hook(other)
        for _, g in groups:
            assert g._all_reduce_hook.hook is other
        other.remove(model)
        for _, g in groups:
            assert g._is_hsdp and g._all_reduce_hook is None
            assert g.post_forward_mesh_info is None or g.post_forward_mesh_info is g.mesh_info
            assert type(g._all_gather_comm) is DefaultAllGather
        train(model, steps=1)
        assert other.stats()["all_reduce"]["calls"] == 0
    return {"losses": losses, "digests": digests, "stats": stats}


def task_hsdp_refusals():
    out = {}

    def step_error(setup) -> str:
        """The error of one training step of a hooked HSDP model after ``setup``."""
        model = build_hsdp()
        model.register_comm_hook(ZipCCLHook(ZipCCLConfig(policy="always")))
        setup(model)
        try:
            train(model, steps=1)
        except RuntimeError as e:
            return str(e)
        return "no error"

    def force_sum(model):
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)

    # No all-reduce (gradient accumulation): refused at the step, on every rank.
    out["no_all_reduce"] = step_error(lambda model: model.set_requires_all_reduce(False))
    # Sum-only reductions without a divide factor: FSDP2 would divide by the
    # whole data-parallel size around the sums; refused, naming the way out.
    out["force_sum"] = step_error(force_sum)
    # A foreign all-reduce hook is not replaced.
    model = build_hsdp()
    model.blocks[0].set_all_reduce_hook(lambda t: None)
    try:
        model.register_comm_hook(ZipCCLHook())
    except ValueError as e:
        out["foreign"] = str(e)
    assert groups_of(model)[0][1]._is_hsdp  # nothing changed
    # A torch whose FSDP2 state lacks what zipccl reads: a clear error, nothing changed.
    model = build_hsdp()
    out["internals"] = internals_error(model, groups_of(model)[1][1], "_all_reduce_hook_stream")
    assert all(type(g._all_gather_comm) is DefaultAllGather for _, g in groups_of(model))
    out["groups"] = internals_error(model, model._get_fsdp_state(), "_fsdp_param_groups")
    return out


def internals_error(model, owner, name: str) -> str:
    """The error of registering a hook on ``model`` while ``owner`` (a part of
    its FSDP2 state) lacks the attribute ``name``, as a torch without it
    would; ``owner`` gets it back."""
    saved = getattr(owner, name)
    delattr(owner, name)
    try:
        model.register_comm_hook(ZipCCLHook())
    except FSDP2InternalsError as e:
        return str(e)
    finally:
        setattr(owner, name, saved)
    return "no error"


def _check_same(reference: list, runs: list) -> list:
    for rank, (r, z) in enumerate(zip(reference, runs)):
        assert z["losses"] == r["losses"], f"rank {rank}: losses differ"
        assert z["digests"] == r["digests"], f"rank {rank}: final parameters differ"
    assert len(set(reference[0]["losses"])) > 1  # training moved
    return [z["stats"] for z in runs]


def _compressed(s: dict, kind: str) -> None:
    assert s[kind]["compressed_calls"] > 0, (kind, s[kind])
    assert s[kind]["wire_bytes"] < s[kind]["raw_bytes"], (kind, s[kind])


@pytest.mark.skipif(not PER_PARAM_MESH, reason="this torch has no per-parameter meshes")
def test_moe_groups_each_on_own_mesh_bitwise(pool4):
    reference = pool4.run(task_moe, "reference", timeout_s=300)
    for s in _check_same(reference, pool4.run(task_moe, "zipccl", timeout_s=300)):
        _compressed(s, "all_gather")
        _compressed(s, "reduce_scatter")


def test_hsdp_replicate_all_reduce_compressed_bitwise(pool4):
    native = pool4.run(task_hsdp, "native", timeout_s=300)
    for s in _check_same(native, pool4.run(task_hsdp, "zipccl", timeout_s=300)):
        for kind in ("all_gather", "reduce_scatter", "all_reduce"):
            _compressed(s, kind)
    for s in _check_same(native, pool4.run(task_hsdp, "zipccl_no_all_reduce", timeout_s=300)):
        assert s["all_reduce"]["calls"] == 0, s["all_reduce"]
        _compressed(s, "reduce_scatter")


def test_hsdp_refusals_name_what_is_wrong(pool4):
    for out in pool4.run(task_hsdp_refusals, timeout_s=300):
        assert "set_requires_all_reduce(False)" in out["no_all_reduce"], out
        assert "set_gradient_divide_factor()" in out["force_sum"], out
        assert "all-reduce hook" in out["foreign"] and "'blocks.0'" in out["foreign"], out
        assert torch.__version__ in out["internals"], out
        assert "'_all_reduce_hook_stream'" in out["internals"], out
        assert "'_fsdp_param_groups'" in out["groups"], out
