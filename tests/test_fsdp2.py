"""FSDP2 with zipccl's comms: same training, bit for bit, with fewer bytes.

A small pre-norm transformer block stack trained 5 steps under
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` on real gloo
process groups. On gloo FSDP2 reduces with ``ReduceOp.AVG`` (fp32, no divide
factor), which gloo computes as the sum divided by the world size; on two
ranks any summation order gives the same bits, so a zipccl run must equal the
run with torch's default comms exactly. On three ranks the reference run uses
a reduce-scatter written here: an uncompressed all-to-all, then the fp32 sum in
rank order.
"""
from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_common
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (DefaultAllGather,
                                                                   DefaultReduceScatter)

import zipccl_fsdp.hooks.fsdp2  # noqa: F401  (adds FSDPModule.register_comm_hook)
from zipccl_fsdp.hooks.fsdp2 import ZipCCLAllGather, ZipCCLReduceScatter
from zipccl_fsdp.hooks.fsdp2 import _param_groups
from zipccl_fsdp.hooks.registry import ZipCCLHook, register_comm_hook, zipccl_hook
from zipccl_fsdp.config import ZipCCLConfig

# torch >= 2.13 can give one module several parameter groups (per-parameter meshes).
PER_PARAM_MESH = hasattr(_fsdp_common, "ShardPlacementResult")
STEPS = 5
VOCAB, DIM, HEADS, HIDDEN, LAYERS, SEQ, BATCH = 512, 128, 4, 512, 3, 16, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.norm2 = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, HEADS, DIM // HEADS).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, DIM))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class AllToAllSumReduceScatter(ReduceScatter):
    """Reference: uncompressed all-to-all, then the fp32 sum in rank order (AVG, SUM)."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        world = group.size()
        recv = torch.empty_like(input_tensor)
        dist.all_to_all_single(recv, input_tensor, group=group)
        acc = torch.zeros(output_tensor.numel(), dtype=torch.float32, device=output_tensor.device)
        for r, part in enumerate(recv.view(world, -1)):
            if r == 0:
                acc.copy_(part)
            else:
                acc.add_(part.float())
        assert op == dist.ReduceOp.AVG, op  # what FSDP2 sends on gloo with fp32 reduce
        acc.div_(world)
        output_tensor.copy_(acc)


def param_groups(module) -> list:
    return _param_groups("", module)


def build(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = Model()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def train(model: nn.Module, steps: int = STEPS, *, vocab: int = VOCAB, batch: int = BATCH,
          seq: int = SEQ) -> tuple[list, list]:
    """Loss bits per step and a digest of each local parameter shard at the end:
    AdamW on next-token cross-entropy over random tokens of a per-rank seed."""
    rank = dist.get_rank()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().view(torch.int32).item())
    digests = [hashlib.sha256(p.to_local().detach().contiguous().view(torch.uint8).numpy()
                              .tobytes()).hexdigest()[:16] for p in model.parameters()]
    return losses, digests


def task_train(mode: str):
    model = build()
    hook = None
    if mode == "zipccl":  # compress every message of at least the default min_bytes
        hook = ZipCCLHook(ZipCCLConfig(policy="always"))
        assert model.register_comm_hook(hook) is hook
    elif mode == "zipccl_slow":  # the adaptive policy told the link is slow: it compresses
        hook = ZipCCLHook(ZipCCLConfig(link_gbps=0.01, codec_gbps=5.0))
        assert model.register_comm_hook(hook) is hook
    elif mode == "zipccl_fast":  # the adaptive policy told the codec is slower than the link
        hook = ZipCCLHook(ZipCCLConfig(link_gbps=100.0, codec_gbps=0.5))
        assert model.register_comm_hook(hook) is hook
    elif mode == "zipccl_default":  # the default hook: adaptive policy
        zipccl_hook.reset_stats()
        assert model.register_comm_hook(zipccl_hook) is zipccl_hook
        hook = zipccl_hook
    elif mode == "a2a_reference":
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_custom_reduce_scatter(AllToAllSumReduceScatter())
    losses, digests = train(model)
    stats = hook.stats() if hook else None
    lanes = sorted({key[0] for key in hook.runtime.state(hook.config).lanes}) if hook else None
    if hook:
        hook.remove(model)
    return {"losses": losses, "digests": digests, "stats": stats, "lanes": lanes}


def task_register_remove():
    """Every FSDP module gets the comms; remove() restores torch's defaults."""
    model = build()
    fsdp_modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    assert len(fsdp_modules) == LAYERS + 1
    hook = ZipCCLHook(ZipCCLConfig(policy="always", codec="dense", min_bytes=0))
    register_comm_hook(model, hook)
    for m in fsdp_modules:
        (group,) = param_groups(m)
        assert isinstance(group._all_gather_comm, ZipCCLAllGather)
        assert isinstance(group._reduce_scatter_comm, ZipCCLReduceScatter)
        assert group._all_gather_comm.hook is hook
    train(model, steps=1)
    s = hook.stats()
    # Per step: every module all-gathers in forward, the blocks again in backward.
    assert s["all_gather"]["calls"] >= LAYERS + 1 and s["reduce_scatter"]["calls"] == LAYERS + 1
    assert s["all_gather"]["compressed_calls"] == s["all_gather"]["calls"]
    # Re-registering with another hook replaces, and remove() still finds torch's comms.
    other = ZipCCLHook()
    model.register_comm_hook(other)
    assert param_groups(fsdp_modules[0])[0]._all_gather_comm.hook is other
    hook.remove(model)  # no longer installed: a no-op
    other.remove(model)
    for m in fsdp_modules:
        (group,) = param_groups(m)
        assert type(group._all_gather_comm) is DefaultAllGather
        assert type(group._reduce_scatter_comm) is DefaultReduceScatter
    before = hook.stats()
    train(model, steps=1)
    assert hook.stats() == before and other.stats()["all_gather"]["calls"] == 0
    return True


def task_refusals():
    """Modules FSDP2 cannot give a custom comm are named in the error."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    try:
        register_comm_hook(nn.Linear(4, 4))
    except TypeError as e:
        out["not_fsdp"] = str(e)
    # A foreign custom comm is not silently replaced.
    model2 = build()
    model2.blocks[1].set_custom_reduce_scatter(AllToAllSumReduceScatter())
    try:
        model2.register_comm_hook()
    except ValueError as e:
        out["foreign"] = str(e)
    # Two parameter groups: one parameter sharded on a second mesh (own process group).
    from torch.distributed.tensor import Shard

    if not PER_PARAM_MESH:
        return out
    FSDPMeshInfo = _fsdp_common.FSDPMeshInfo
    ShardPlacementResult = _fsdp_common.ShardPlacementResult

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    mesh = init_device_mesh("cpu", (world,))
    other_mesh = DeviceMesh.from_group(dist.new_group(list(range(world))), "cpu",
                                       mesh_dim_names=("ep",))
    other_info = FSDPMeshInfo(other_mesh, shard_mesh_dim=0)

    def placement(param):
        if param is model[1].weight:
            return ShardPlacementResult(Shard(0), other_info)
        return None

    fully_shard(model[1], mesh=mesh, shard_placement_fn=placement)
    fully_shard(model, mesh=mesh)
    # Several groups are hooked too (FSDP2's own setters refuse them), each
    # group's comm then runs on that group's process group
    # (tests/test_layouts_fsdp2.py trains such a model).
    hook = ZipCCLHook()
    model.register_comm_hook(hook)
    groups = model[1]._get_fsdp_state()._fsdp_param_groups
    assert len(groups) == 2
    assert all(g._all_gather_comm is hook.all_gather_comm for g in groups)
    assert all(g._reduce_scatter_comm is hook.reduce_scatter_comm for g in groups)
    hook.remove(model)
    assert all(type(g._all_gather_comm) is DefaultAllGather for g in groups)
    out["groups"] = len(groups)
    del rank
    return out


def _ratio(stats: dict, kind: str) -> float:
    return stats[kind]["wire_bytes"] / stats[kind]["raw_bytes"]


def _stats_of_same_training(reference: list, runs: list) -> list:
    """Each rank's hook stats, once its losses and final parameters are bitwise
    those of ``reference``."""
    for rank, (r, z) in enumerate(zip(reference, runs)):
        assert z["losses"] == r["losses"], f"rank {rank}: losses differ"
        assert z["digests"] == r["digests"], f"rank {rank}: final parameters differ"
    return [z["stats"] for z in runs]


def test_fsdp2_two_ranks_bitwise_equal_to_default_and_compressed(pool2):
    default = pool2.run(task_train, "default")
    for rank, s in enumerate(_stats_of_same_training(default, pool2.run(task_train, "zipccl"))):
        assert s["all_gather"]["compressed_calls"] > 0
        assert s["reduce_scatter"]["compressed_calls"] > 0
        ag, rs = _ratio(s, "all_gather"), _ratio(s, "reduce_scatter")
        print(f"rank {rank}: all_gather wire/raw {ag:.4f}, reduce_scatter wire/raw {rs:.4f}, "
              f"stats {s}")
        assert ag <= 0.7, s["all_gather"]
        assert rs <= 0.4, s["reduce_scatter"]
    # Training moved: the losses are not all the same.
    assert len(set(default[0]["losses"])) > 1
    # The default hook (policy "adaptive") decides from what it measures on
    # this loopback (raw or compressed, by the machine's load): the same bits
    # whichever way each call went.
    for s in _stats_of_same_training(default, pool2.run(task_train, "zipccl_default")):
        assert s["all_gather"]["calls"] > 0 and s["reduce_scatter"]["calls"] > 0, s
    # Told the codec is slower than the link, it sends every call raw: the
    # same bits, and its all-gathers take the raw lane (reduce-scatters keep
    # zipccl's own raw path, an all-to-all and an fp32 sum).
    runs = pool2.run(task_train, "zipccl_fast")
    assert all(run["lanes"] == ["all_gather"] for run in runs), [run["lanes"] for run in runs]
    for s in _stats_of_same_training(default, runs):
        assert s["all_gather"]["calls"] > 0 and s["reduce_scatter"]["calls"] > 0, s
        assert s["all_gather"]["compressed_calls"] == 0, s["all_gather"]
        assert s["reduce_scatter"]["compressed_calls"] == 0, s["reduce_scatter"]
    # Told the link is slow, it compresses (pipelined, in pieces): the same bits.
    for s in _stats_of_same_training(default, pool2.run(task_train, "zipccl_slow")):
        assert s["all_gather"]["compressed_calls"] > 0, s["all_gather"]
        assert s["reduce_scatter"]["compressed_calls"] > 0, s["reduce_scatter"]


def test_fsdp2_three_ranks_bitwise_equal_to_all_to_all_reference(pool3):
    reference = pool3.run(task_train, "a2a_reference")
    for rank, s in enumerate(_stats_of_same_training(reference,
                                                     pool3.run(task_train, "zipccl"))):
        print(f"rank {rank}: all_gather wire/raw {_ratio(s, 'all_gather'):.4f}, "
              f"reduce_scatter wire/raw {_ratio(s, 'reduce_scatter'):.4f}")
        assert _ratio(s, "all_gather") <= 0.7 and _ratio(s, "reduce_scatter") <= 0.4


def test_register_installs_everywhere_and_remove_restores(pool2):
    assert pool2.run(task_register_remove) == [True, True]


def test_refusals_name_the_module(pool2):
    for out in pool2.run(task_refusals):
        assert "Linear" in out["not_fsdp"] and "FSDP2" in out["not_fsdp"]
        assert "'blocks.1'" in out["foreign"] and "AllToAllSumReduceScatter" in out["foreign"]
        if PER_PARAM_MESH:
            assert out["groups"] == 2, out

