"""The DTensor / functional-collectives override on real gloo process groups.

Every comparison runs the same computation twice in one process, once plain
and once inside ``compress_dtensor_comms``, and compares integer views
(never float values). On two ranks an fp32 sum of two operands is the same
whatever the order, so zipccl's rank-order reductions equal gloo's bit for bit.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

from zipccl_fsdp.hooks.dtensor import (DTensorCompression, compress_dtensor_comms,
                           disable_dtensor_compression, enable_dtensor_compression)
from zipccl_fsdp.config import ZipCCLConfig

CFG = ZipCCLConfig(policy="always", min_bytes=0)  # compress every non-empty message, however small
INT_VIEW = {torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.int64: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(INT_VIEW[t.dtype])


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.equal(bits(got), bits(want)), f"{what}: bits differ"


def assert_compressed(stats: dict, kinds) -> None:
    for kind in kinds:
        s = stats[kind]
        assert s["compressed_calls"] > 0, (kind, s)
        assert 0 < s["wire_bytes"] < s["raw_bytes"], (kind, s)


# --------------------------------------------------------------------------
# Tensor parallelism (runs inside the ranks)
# --------------------------------------------------------------------------
class Block(nn.Module):
    """norm (sequence parallel) -> w1 (colwise) -> w2 (rowwise, reduce-scatter
    back to sequence shards) -> w3 (colwise) -> w4 (rowwise, all-reduce)."""

    def __init__(self, dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)
        self.w3 = nn.Linear(dim, hidden)
        self.w4 = nn.Linear(hidden, dim)

    def forward(self, x):
        h = self.w2(torch.relu(self.w1(self.norm(x))))
        return self.w4(torch.relu(self.w3(h.full_tensor())))


def _tp_step(model, x):
    model.zero_grad(set_to_none=True)
    out = model(x)
    out.to_local().square().sum().backward()
    grads = {n: p.grad.to_local().clone() for n, p in model.named_parameters()}
    return out.to_local().detach().clone(), grads


def _parallelize(block: Block, tp_mesh) -> Block:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    return parallelize_module(block, tp_mesh, {
        "norm": SequenceParallel(),
        "w1": ColwiseParallel(input_layouts=Shard(1)),
        "w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        "w3": ColwiseParallel(input_layouts=Replicate()),
        "w4": RowwiseParallel(use_local_output=False),
    })


POLICY_CONFIGS = {
    "default": ZipCCLConfig(),  # adaptive: this fast loopback is measured, so all raw
    "adaptive_slow": ZipCCLConfig(min_bytes=0, link_gbps=0.01, codec_gbps=5.0),
}
"""The adaptive policy inside the compression: its calibration and its size
exchanges are collectives of their own, issued from within zipccl's kernels."""


def run_tensor_parallel(config: str = "always") -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = _parallelize(Block(), mesh)
    torch.manual_seed(1)
    x = torch.randn(2, 32, 64).chunk(dist.get_world_size(), dim=1)[rank].contiguous()
    want_out, want_grads = _tp_step(model, x)
    with compress_dtensor_comms(POLICY_CONFIGS.get(config, CFG)) as mode:
        got_out, got_grads = _tp_step(model, x)
    assert_bits_equal(got_out, want_out, "output")
    for name, want in want_grads.items():
        assert_bits_equal(got_grads[name], want, f"grad of {name}")
    return mode.stats()


def test_tensor_parallel_bitwise_and_compressed(pool2):
    for stats in pool2.run(run_tensor_parallel):
        assert_compressed(stats, ("all_gather", "reduce_scatter", "all_reduce"))
        assert not stats["passthrough"], stats["passthrough"]


def test_tensor_parallel_under_the_adaptive_policy(pool2):
    for stats in pool2.run(run_tensor_parallel, "default"):
        kinds = [k for k in ("all_gather", "reduce_scatter", "all_reduce") if k in stats]
        assert sum(stats[k]["calls"] for k in kinds) > 0, stats
        assert all(stats[k]["compressed_calls"] == 0 for k in kinds), stats
    for stats in pool2.run(run_tensor_parallel, "adaptive_slow"):
        assert sum(stats[k]["compressed_calls"] for k in ("all_gather", "reduce_scatter",
                                                          "all_reduce") if k in stats) > 0, stats


# --------------------------------------------------------------------------
# FSDP2 + TP on a 2x2 mesh: the FSDP2 hook and the DTensor override compose
# --------------------------------------------------------------------------
def _fsdp_tp_train(compress: bool) -> tuple:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from zipccl_fsdp.hooks.registry import ZipCCLHook
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(Block(dim=32, hidden=64), Block(dim=32, hidden=64))
    for block in model:
        fully_shard(_parallelize(block, mesh["tp"]), mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    hook = ZipCCLHook(CFG)
    if compress:
        model.register_comm_hook(hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dp, tp = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    g = torch.Generator().manual_seed(dp)  # data differs across dp, not across tp
    mode = DTensorCompression(CFG)
    losses, params = [], []
    for _ in range(3):
        # Activations of 8 x 32 x 32 fp32 (32 KiB a call): near-Gaussian fp32
        # codes at ~1.16x, so a message of a few KiB would not cover the
        # payload's fixed header, offsets and 16-byte alignment.
        x = torch.randn(8, 64, 32, generator=g).chunk(2, dim=1)[tp].contiguous()
        opt.zero_grad()
        with mode if compress else contextlib.nullcontext():
            out = model(x).to_local()
            loss = out.square().mean()
            loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        params.append([p.to_local().detach().clone() for p in model.parameters()])
    return losses, params, hook.stats(), mode.stats()


def run_fsdp_tp() -> tuple:
    want_losses, want_params, _, _ = _fsdp_tp_train(False)
    losses, params, fsdp_stats, tp_stats = _fsdp_tp_train(True)
    for step, (a, b) in enumerate(zip(losses, want_losses)):
        assert_bits_equal(a, b, f"loss of step {step}")
    for step, (ps, ws) in enumerate(zip(params, want_params)):
        for i, (a, b) in enumerate(zip(ps, ws)):
            assert_bits_equal(a, b, f"param {i} after step {step}")
    return fsdp_stats, tp_stats


def test_fsdp2_and_tensor_parallel_compose(pool4):
    for fsdp_stats, tp_stats in pool4.run(run_fsdp_tp):
        assert_compressed(fsdp_stats, ("all_gather", "reduce_scatter"))
        assert_compressed(tp_stats, ("all_gather", "reduce_scatter", "all_reduce"))
        assert not tp_stats["passthrough"], tp_stats["passthrough"]


# --------------------------------------------------------------------------
# MoE-style all-to-all with ragged splits
# --------------------------------------------------------------------------
# SPLITS[case][src][dst]: rows rank src sends to rank dst (0 = empty split)
SPLITS = {"ragged": [[2, 0], [5, 3]], "empty_rank": [[0, 0], [4, 1]], "even": [[3, 3], [3, 3]]}
WIDTH = 256


def _a2a(x, case, autograd):
    rank, world = dist.get_rank(), dist.get_world_size()
    send = SPLITS[case][rank]
    recv = [SPLITS[case][src][rank] for src in range(world)]
    x = x.detach().clone().requires_grad_(autograd)
    fn = funcol.all_to_all_single_autograd if autograd else funcol.all_to_all_single
    y = fn(x, recv, send, dist.group.WORLD)
    if isinstance(y, funcol.AsyncCollectiveTensor):
        y = y.wait()
    if not autograd:
        return y.clone(), None
    weight = torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).sin()
    (y * weight).sum().backward()
    return y.detach().clone(), x.grad.clone()


def run_all_to_all(dtype, config: str = "always") -> dict:
    rank = dist.get_rank()
    mode = DTensorCompression(POLICY_CONFIGS.get(config, CFG))
    for case in SPLITS:
        g = torch.Generator().manual_seed(rank)
        x = (torch.randn(sum(SPLITS[case][rank]), WIDTH, generator=g) * 0.1).to(dtype)
        for autograd in (False, True):
            want_y, want_g = _a2a(x, case, autograd)
            with mode:
                got_y, got_g = _a2a(x, case, autograd)
            assert_bits_equal(got_y, want_y, f"{case} output")
            if autograd:
                assert_bits_equal(got_g, want_g, f"{case} input grad")
    # MoE routing sends integer token counts first: left to torch, counted.
    counts = torch.tensor([rank + 1, 2 * rank + 1], dtype=torch.int64)
    want = funcol.all_to_all_single(counts, None, None, dist.group.WORLD).wait()
    with mode:
        got = funcol.all_to_all_single(counts, None, None, dist.group.WORLD).wait()
    assert torch.equal(got, want)
    return mode.stats()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_to_all_ragged_bitwise_and_compressed(pool2, dtype):
    for stats in pool2.run(run_all_to_all, dtype):
        assert_compressed(stats, ("all_to_all",))
        # 3 cases x (forward + forward/backward) = 9 compressed calls
        assert stats["all_to_all"]["calls"] == 9
        assert stats["passthrough"] == {
            "_c10d_functional.all_to_all_single.default:dtype torch.int64": 1}


def test_all_to_all_under_the_adaptive_policy(pool2):
    for stats in pool2.run(run_all_to_all, torch.bfloat16, "default"):
        assert stats["all_to_all"]["calls"] == 9 and stats["all_to_all"]["compressed_calls"] == 0
    for stats in pool2.run(run_all_to_all, torch.bfloat16, "adaptive_slow"):
        assert stats["all_to_all"]["calls"] == 9 and stats["all_to_all"]["compressed_calls"] > 0


# --------------------------------------------------------------------------
# shard_dim_alltoall (DTensor's Shard(i) -> Shard(j) off CPU), reduce ops, globals
# --------------------------------------------------------------------------
def run_shard_dim_alltoall() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(8, 6, 64, generator=g)  # local shard on dim 1, to reshard on dim 2
    # Reference: DTensor's own CPU fallback (all-gather on gather_dim, take a chunk).
    full = torch.cat([t for t in _gather_list(x)], dim=1)
    want = full.chunk(world, dim=2)[rank]
    name = dist.group.WORLD.group_name
    with compress_dtensor_comms(CFG) as mode:
        got = torch.ops._dtensor.shard_dim_alltoall(x, 1, 2, name)
    assert_bits_equal(got, want, "shard_dim_alltoall")
    assert_compressed(mode.stats(), ("all_to_all",))


def _gather_list(x):
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return out


def test_shard_dim_alltoall(pool2):
    pool2.run(run_shard_dim_alltoall)


def run_reduce_ops_and_passthrough() -> dict:
    rank = dist.get_rank()
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(rank))
    group = dist.group.WORLD
    with compress_dtensor_comms(CFG) as mode:
        s = funcol.all_reduce(x, "sum", group).wait()
        a = funcol.all_reduce(x, "avg", group).wait()
        rs = funcol.reduce_scatter_tensor(x, "avg", 0, group).wait()
        m = funcol.all_reduce(x, "max", group).wait()  # not a codec reduction: torch runs it
        b = funcol.broadcast(x, 0, group).wait()  # not intercepted: torch runs it
        ag = funcol.all_gather_tensor(x.bfloat16(), 0, group).wait()
    both = _gather_list(x)
    assert_bits_equal(s, both[0] + both[1], "sum")
    assert_bits_equal(a, (both[0] + both[1]) / 2, "avg")  # gloo has no AVG to compare with
    assert_bits_equal(rs, ((both[0] + both[1]) / 2).chunk(2)[rank], "reduce_scatter avg")
    assert_bits_equal(m, torch.maximum(both[0], both[1]), "max")
    assert_bits_equal(b, both[0], "broadcast")
    assert_bits_equal(ag, torch.cat(both).bfloat16(), "all_gather bf16")
    return mode.stats()


def run_capture_passes_through() -> dict:
    """Under CUDA graph capture torch's kernels run (a compressed call syncs
    the host). No CUDA here: the capture predicate is forced, which tests
    the passthrough itself."""
    from zipccl_fsdp import collectives as C
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
    saved = C._capturing
    C._capturing = lambda t: True
    try:
        with compress_dtensor_comms(CFG) as mode:
            s = funcol.all_reduce(x, "sum", dist.group.WORLD).wait()
    finally:
        C._capturing = saved
    both = _gather_list(x)
    assert_bits_equal(s, both[0] + both[1], "sum")
    return mode.stats()


def test_cuda_graph_capture_passes_through(pool2):
    for stats in pool2.run(run_capture_passes_through):
        assert stats["passthrough"] == {
            "_c10d_functional.all_reduce.default:cuda graph capture": 1}, stats["passthrough"]
        assert stats["all_reduce"]["calls"] == 0, stats["all_reduce"]


def test_reduce_ops_and_passthrough(pool2):
    for stats in pool2.run(run_reduce_ops_and_passthrough):
        assert stats["all_reduce"]["compressed_calls"] == 2
        assert stats["reduce_scatter"]["compressed_calls"] == 1
        assert stats["all_gather"]["compressed_calls"] == 1
        assert stats["passthrough"] == {"_c10d_functional.all_reduce.default:op max": 1}


def run_every_thread_and_only_collectives() -> dict:
    """zipccl's kernels serve every thread (autograd's backward threads too),
    no Python dispatch mode is involved, and they are gone after the block."""
    import threading
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    rank = dist.get_rank()
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(rank))
    both = _gather_list(x)
    group = dist.group.WORLD
    name = "_c10d_functional::all_gather_into_tensor"
    seen = {"before": torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")}
    with compress_dtensor_comms(CFG) as comp:
        seen["during"] = torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")
        seen["mode"] = _get_current_dispatch_mode()
        out = {}
        worker = threading.Thread(
            target=lambda: out.setdefault("ag", funcol.all_gather_tensor(x, 0, group).wait()))
        worker.start()
        worker.join()
        with compress_dtensor_comms(CFG) as inner:  # the newest compression handles calls
            funcol.all_reduce(x, "sum", group).wait()
            with pytest.raises(RuntimeError, match="exit it first"):
                comp.__exit__(None, None, None)
        funcol.all_reduce(x, "sum", group).wait()
    seen["after"] = torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")
    assert_bits_equal(out["ag"], torch.cat(both), "all_gather from another thread")
    funcol.all_gather_tensor(x, 0, group).wait()  # torch's own again: not counted
    seen["calls"] = {k: comp.stats()[k]["calls"] for k in ("all_gather", "all_reduce")}
    seen["inner_calls"] = inner.stats()["all_reduce"]["calls"]
    return seen


def test_every_thread_and_only_collectives(pool2):
    for seen in pool2.run(run_every_thread_and_only_collectives):
        assert seen["mode"] is None
        assert (seen["before"], seen["during"], seen["after"]) == (False, True, False)
        assert seen["calls"] == {"all_gather": 1, "all_reduce": 1}
        assert seen["inner_calls"] == 1


def run_enable_disable() -> tuple:
    x = torch.randn(256)
    group = dist.group.WORLD
    mode = enable_dtensor_compression(CFG)
    try:
        with pytest.raises(RuntimeError, match="already enabled"):
            enable_dtensor_compression(CFG)
        funcol.all_reduce(x, "sum", group).wait()
        with compress_dtensor_comms(CFG):
            with pytest.raises(RuntimeError, match="exit it first"):
                disable_dtensor_compression()
    finally:
        disable_dtensor_compression()
    disable_dtensor_compression()  # no-op
    funcol.all_reduce(x, "sum", group).wait()
    return mode.stats()["all_reduce"]["calls"]


def test_enable_disable(pool2):
    assert pool2.run(run_enable_disable) == [1, 1]


def test_config_type_checked():
    with pytest.raises(TypeError, match="ZipCCLConfig"):
        DTensorCompression({"min_bytes": 0})


def run_compiled() -> dict:
    """Inside ``torch.compile`` (inductor) the collectives are compressed too:
    its generated code calls the in-place and ``_out`` variants."""
    rank = dist.get_rank()
    group = dist.group.WORLD

    def f(x):
        s = funcol.all_reduce(x * 2, "sum", group)
        g = funcol.all_gather_tensor(x, 0, group)
        r = funcol.reduce_scatter_tensor(x, "sum", 0, group)
        return s + 1, g * 3, r - 1

    x = torch.randn(512, 8, generator=torch.Generator().manual_seed(rank))
    want = f(x)
    compiled = torch.compile(f, backend="inductor")
    with compress_dtensor_comms(CFG) as comp:
        got = compiled(x)
    for name, a, b in zip(("all_reduce", "all_gather", "reduce_scatter"), got, want):
        assert_bits_equal(a, b, f"compiled {name}")
    stats = comp.stats()
    return {k: stats[k]["compressed_calls"] for k in ("all_reduce", "all_gather", "reduce_scatter")}


def test_compiled_collectives_are_compressed(pool2):
    for calls in pool2.run(run_compiled):
        assert calls == {"all_reduce": 1, "all_gather": 1, "reduce_scatter": 1}, calls
