"""The zipccl DDP comm hook on real gloo process groups.

Two runs of the same training from the same initial weights, in one process:
one with DDP's default all-reduce (or a rank-order fp32 reference hook), one
with zipccl's hook, registered the three ways a user can: ``ddp_model.
register_comm_hook(state, hook)`` with a ``ZipCCLConfig`` or ``None`` as state,
and ``zipccl_fsdp``'s ``register_comm_hook(ddp_model, hook)``. Losses and
parameters are compared as integer views after every step.
"""
from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch._C._profiler import _ExperimentalConfig
from torch.nn.parallel import DistributedDataParallel as DDP

from zipccl_fsdp.hooks.registry import ZipCCLHook, register_comm_hook, zipccl_hook
from zipccl_fsdp import collectives as coll
from zipccl_fsdp.config import ZipCCLConfig

CFG = ZipCCLConfig(policy="always", min_bytes=0)  # compress every bucket chunk, however small
SLOW = ZipCCLConfig(min_bytes=0, link_gbps=0.01, codec_gbps=5.0)
"""The default policy, "adaptive", told the link is slow: it compresses."""
STEPS = 5
INT_VIEW = {torch.bfloat16: torch.int16, torch.float32: torch.int32}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(INT_VIEW[t.dtype])


def rank_order_hook(state, bucket):
    """Reference: every rank's raw bucket, summed in fp32 in rank order, / world, cast."""
    buf = bucket.buffer()
    world = dist.get_world_size()
    every = torch.empty(world * buf.numel(), dtype=buf.dtype)
    dist.all_gather_into_tensor(every, buf)
    acc = torch.zeros(buf.numel(), dtype=torch.float32)
    for part in every.view(world, -1):
        acc += part
    buf.copy_(acc.div_(world))
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def _mlp(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 96), nn.ReLU(), nn.Linear(96, 96), nn.ReLU(),
                         nn.Linear(96, 8)).to(dtype)


def _train(dtype: torch.dtype, register=None, model=None) -> tuple:
    """STEPS of SGD on rank-specific data; (losses, params after each step)."""
    if model is None:
        model = DDP(_mlp(dtype), bucket_cap_mb=0.01)  # several buckets, of uneven sizes
    if register is not None:
        register(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    losses, params = [], []
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=g).to(dtype)
        y = torch.randn(16, 8, generator=g).to(dtype)
        opt.zero_grad(set_to_none=True)
        loss = (model(x) - y).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        params.append([p.detach().clone() for p in model.parameters()])
    return losses, params


def _assert_same_training(got: tuple, want: tuple) -> None:
    for step, (gl, wl) in enumerate(zip(got[0], want[0])):
        assert torch.equal(bits(gl), bits(wl)), f"loss of step {step} differs"
    for step, (gp, wp) in enumerate(zip(got[1], want[1])):
        for i, (a, b) in enumerate(zip(gp, wp)):
            assert torch.equal(bits(a), bits(b)), f"param {i} after step {step} differs"


def _registration(how: str, hook: ZipCCLHook):
    if how == "state=config":
        return lambda model: model.register_comm_hook(CFG, hook)
    if how == "state=None":
        return lambda model: model.register_comm_hook(None, hook)
    return lambda model: register_comm_hook(model, hook)  # the registry: state = model's group


def run_against(dtype: torch.dtype, reference, how: str) -> dict:
    want = _train(dtype, None if reference is None else
                  lambda model: model.register_comm_hook(None, reference))
    hook = (zipccl_hook if how == "default hook" else ZipCCLHook(SLOW) if how == "adaptive slow"
            else ZipCCLHook(CFG))
    hook.reset_stats()
    # The hook's calls run on zipccl's worker thread: profile every thread.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                experimental_config=_ExperimentalConfig(
                                    profile_all_threads=True)) as prof:
        got = _train(dtype, _registration(how, hook))
    _assert_same_training(got, want)
    ranges = {e.name for e in prof.events() if e.name.startswith("zipccl::")}
    return hook.stats()["all_reduce"], ranges


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["state=config", "registry"])
def test_two_ranks_equal_ddp_default(pool2, dtype, how):
    for st, ranges in pool2.run(run_against, dtype, None, how):
        assert st["calls"] > STEPS and st["compressed_calls"] == st["calls"], st
        assert 0 < st["wire_bytes"] < st["raw_bytes"], st
        assert {"zipccl::all_reduce::encode", "zipccl::all_reduce::decode",
                "zipccl::all_reduce::exchange", "zipccl::all_reduce::reduce"} <= ranges, ranges


def test_three_ranks_equal_rank_order_reference(pool3):
    for st, _ in pool3.run(run_against, torch.float32, rank_order_hook, "state=config"):
        assert st["compressed_calls"] == st["calls"] > STEPS, st
        assert 0 < st["wire_bytes"] < st["raw_bytes"], st


def test_default_hook_state_none(pool2):
    # zipccl_hook with state None: default config (policy "adaptive"), whose
    # min_bytes keeps these small buckets raw, as does the fast loopback:
    # zipccl's rank-order raw sum, which on 2 ranks is the only order there is.
    for st, _ in pool2.run(run_against, torch.float32, None, "default hook"):
        assert st["calls"] > STEPS and st["compressed_calls"] == 0, st


FAST = ZipCCLConfig(min_bytes=0, link_gbps=400.0, codec_gbps=1.0)
"""The default policy told the link is fast: every bucket goes raw."""


def train_on_a_fast_link() -> tuple:
    want = _train(torch.bfloat16)
    hook = ZipCCLHook(FAST)
    got = _train(torch.bfloat16, lambda model: model.register_comm_hook(None, hook))
    _assert_same_training(got, want)
    return hook.stats()["all_reduce"], sorted(k[0] for k in hook.runtime.state(FAST).lanes)


def test_fast_link_buckets_go_raw_and_equal_ddp_default(pool2):
    # Raw buckets sum in zipccl's rank order (an all-reduce sums the same
    # whether it goes raw or compressed), these small ones from one all-gather
    # of the whole buckets, then the sum; on 2 ranks that is DDP's default sum.
    # That route is chosen by the bucket's size over zipccl's raw schedule, so
    # it exchanges the size row first (ranks whose sizes differ raise there)
    # and opens no raw lane, which would skip it.
    for st, lanes in pool2.run(train_on_a_fast_link):
        assert st["calls"] > STEPS and st["compressed_calls"] == 0, st
        assert st["size_bytes"] > 0, st
        assert lanes == []


def test_adaptive_policy_on_a_slow_link(pool2):
    for st, _ in pool2.run(run_against, torch.bfloat16, None, "adaptive slow"):
        assert st["calls"] > STEPS and st["compressed_calls"] > 0, st


def run_remove_and_reinstall() -> tuple:
    want = _train(torch.float32)
    hook = ZipCCLHook(CFG)
    model = DDP(_mlp(torch.float32), bucket_cap_mb=0.01)
    register_comm_hook(model, hook)
    hook.remove(model)  # DDP cannot unregister: the hook now runs torch's allreduce_hook
    got = _train(torch.float32, model=model)
    _assert_same_training(got, want)
    calls_removed = hook.stats()["all_reduce"]["calls"]
    hook.register(model)
    model(torch.randn(4, 32)).sum().backward()
    with pytest.raises(ValueError, match="one comm hook per model"):
        register_comm_hook(model, ZipCCLHook(CFG))
    return calls_removed, hook.stats()["all_reduce"]["calls"]


def test_remove_and_reinstall(pool2):
    for removed, after in pool2.run(run_remove_and_reinstall):
        assert removed == 0 and after > 0


def run_bad_state() -> str:
    model = DDP(_mlp(torch.float32))
    model.register_comm_hook("not a state", ZipCCLHook(CFG))
    try:
        model(torch.randn(4, 32)).sum().backward()
    except TypeError as e:  # raised on every rank, before any communication
        return str(e)
    return ""


def test_bad_state_raises_on_every_rank(pool2):
    for msg in pool2.run(run_bad_state):
        assert "state must be None, a ProcessGroup or a ZipCCLConfig" in msg


# --------------------------------------------------------------------------
# The hook's calls run on zipccl's worker thread (zipccl_fsdp/background.py)
# --------------------------------------------------------------------------
def run_backward_goes_on_while_a_bucket_is_in_flight() -> tuple:
    """In the second step (DDP's first puts every gradient in one bucket),
    the first bucket's all-reduce (the last layer's gradients) waits until
    backward has computed the first layer's weight gradient, the last one it
    computes. On autograd's thread that wait could only time out."""
    model = DDP(_mlp(torch.bfloat16), bucket_cap_mb=0.01)
    hook = ZipCCLHook(CFG)
    model.register_comm_hook(None, hook)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(dist.get_rank()))
    model(x.to(torch.bfloat16)).square().mean().backward()
    hook.reset_stats()
    first_grad_done = threading.Event()
    model.module[0].weight.register_hook(lambda g: first_grad_done.set())
    seen, real = [], coll.all_reduce

    def gated(*args, **kwargs):
        if not seen:
            seen.append((threading.current_thread().name, first_grad_done.wait(timeout=10)))
        return real(*args, **kwargs)

    coll.all_reduce = gated
    try:
        model(x.to(torch.bfloat16)).square().mean().backward()
    finally:
        coll.all_reduce = real
    return seen[0], hook.stats()["all_reduce"]


def test_backward_goes_on_while_a_bucket_is_in_flight(pool2):
    for (thread, overlapped), st in pool2.run(run_backward_goes_on_while_a_bucket_is_in_flight):
        assert thread == "zipccl-collectives" and overlapped, (thread, overlapped)
        assert st["calls"] > 1 and st["compressed_calls"] == st["calls"], st


def _mixed_mlp() -> nn.Module:
    """fp64 layers (a dtype the codec does not take) between bf16 ones: DDP
    buckets them apart, so one backward has raw and compressed buckets."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64).to(torch.float64), _Cast(torch.bfloat16),
                         nn.Linear(64, 64).to(torch.bfloat16), _Cast(torch.float64),
                         nn.Linear(64, 8).to(torch.float64))


class _Cast(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return x.to(self.dtype)


def run_raw_and_compressed_buckets_in_one_backward() -> dict:
    def train(register):
        model = DDP(_mixed_mlp(), bucket_cap_mb=0.001)
        if register is not None:
            register(model)
        g = torch.Generator().manual_seed(5 + dist.get_rank())
        grads = []
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            model(torch.randn(8, 32, generator=g, dtype=torch.float64)).square().mean().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        return grads

    hook = ZipCCLHook(ZipCCLConfig(policy="always", min_bytes=0, unsupported_dtype="raw"))
    got = train(lambda model: model.register_comm_hook(None, hook))
    want = train(None)
    for step, (gs, ws) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(gs, ws)):
            view = torch.int64 if a.dtype == torch.float64 else INT_VIEW[a.dtype]
            assert torch.equal(a.view(view), b.view(view)), f"grad {i} of step {step} differs"
    return hook.stats()["all_reduce"]


def test_raw_and_compressed_buckets_in_one_backward(pool2):
    # The worker issues every bucket's collectives in bucket order, raw or not.
    for st in pool2.run(run_raw_and_compressed_buckets_in_one_backward):
        assert 0 < st["compressed_calls"] < st["calls"], st


def run_an_error_in_the_worker_reaches_backward() -> str:
    model = DDP(_mixed_mlp(), bucket_cap_mb=0.001)
    model.register_comm_hook(None, ZipCCLHook(ZipCCLConfig(policy="always", min_bytes=0)))
    try:
        model(torch.randn(8, 32, dtype=torch.float64)).square().mean().backward()
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return f"{type(e).__name__}: {e}"
    return ""


def test_an_error_in_the_worker_reaches_backward(pool2):
    # unsupported_dtype="raise" (the default) and an fp64 bucket: raised on
    # zipccl's worker thread, before any communication, on every rank.
    for msg in pool2.run(run_an_error_in_the_worker_reaches_backward):
        assert "float64" in msg, msg


def run_where_the_calls_run(cfg: ZipCCLConfig) -> tuple:
    threads, real = [], coll.all_reduce

    def recording(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    coll.all_reduce = recording
    hook = ZipCCLHook(cfg)
    try:
        _train(torch.bfloat16, lambda model: model.register_comm_hook(None, hook))
    finally:
        coll.all_reduce = real
    return threads, hook.stats()["all_reduce"]["compressed_calls"]


def test_the_calibrating_call_runs_in_the_hook(pool2):
    # Told a slow link, the default policy times the codec at its first call,
    # in the hook: timed beside backward, the codec looks slower than it is
    # and the policy's decisions flip from run to run (docs/benchmarks.md,
    # "Calibration").
    # The calls after it may be compressed: the worker runs them.
    slow = ZipCCLConfig(min_bytes=0, link_gbps=0.01)
    for threads, compressed in pool2.run(run_where_the_calls_run, slow):
        assert threads[0] == "MainThread" and len(threads) > STEPS, threads
        assert set(threads[1:]) == {"zipccl-collectives"}, threads
        assert compressed > 0


def test_raw_calls_run_on_the_worker_after_calibrating(pool2):
    # On the loopback the policy calibrates (in the hook) and finds the link
    # too fast to ever compress; every later bucket is a raw all-reduce
    # through zipccl's rank-order schedule, which waits on the host: the
    # worker runs it, as it runs compressed ones.
    for threads, compressed in pool2.run(run_where_the_calls_run, ZipCCLConfig(min_bytes=0)):
        assert threads[0] == "MainThread" and len(threads) > STEPS, threads
        assert set(threads[1:]) == {"zipccl-collectives"}, threads
        assert compressed == 0


def test_never_runs_on_the_worker(pool2):
    # policy="never" reduces through zipccl's rank-order raw path, which
    # waits on the host: it must not run on autograd's thread.
    for threads, compressed in pool2.run(run_where_the_calls_run,
                                         ZipCCLConfig(policy="never", min_bytes=0)):
        assert set(threads) == {"zipccl-collectives"} and len(threads) > STEPS, threads
        assert compressed == 0


def run_with_ddp_options(**options) -> dict:
    """DDP's options that change how buckets meet gradients: with
    ``gradient_as_bucket_view`` the worker writes the averages straight into
    ``p.grad`` while backward goes on; ``static_graph`` delays the first
    reduction."""
    def model():
        return DDP(_mlp(torch.bfloat16), bucket_cap_mb=0.01, **options)

    want = _train(torch.bfloat16, model=model())
    hook = ZipCCLHook(CFG)
    got = _train(torch.bfloat16, lambda m: m.register_comm_hook(None, hook), model=model())
    _assert_same_training(got, want)
    return hook.stats()["all_reduce"]


@pytest.mark.parametrize("options", [dict(gradient_as_bucket_view=True),
                                     dict(static_graph=True)], ids=["bucket_view", "static"])
def test_ddp_options_equal_ddp_default(pool2, options):
    for st in pool2.run(run_with_ddp_options, **options):
        assert st["compressed_calls"] == st["calls"] > STEPS, st


def run_tensorboard_stats(logdir: str) -> dict:
    """STEPS of DDP training with a TensorBoardStats after each step, written
    to a real event file, read back with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from zipccl_fsdp import TensorBoardStats

    hook = ZipCCLHook(CFG)
    model = DDP(_mlp(torch.bfloat16), bucket_cap_mb=0.01)
    model.register_comm_hook(None, hook)
    writer = SummaryWriter(f"{logdir}/rank{dist.get_rank()}")
    tb = TensorBoardStats(writer, hook)
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(1, STEPS + 1):
        model(torch.randn(16, 32, generator=g).to(torch.bfloat16)).square().mean().backward()
        tb.log(step)
    writer.close()
    events = EventAccumulator(writer.log_dir)
    events.Reload()
    logged = {tag: [(e.step, e.value) for e in events.Scalars(tag)]
              for tag in events.Tags()["scalars"]}
    return logged, hook.stats()["all_reduce"]


def test_tensorboard_stats_writes_per_step_deltas(pool2, tmp_path):
    for logged, st in pool2.run(run_tensorboard_stats, str(tmp_path)):
        assert {"zipccl/all_reduce/raw_MB", "zipccl/all_reduce/wire_MB",
                "zipccl/all_reduce/ratio", "zipccl/all_reduce/comm_ms",
                "zipccl/all_reduce/compressed_fraction"} <= set(logged), sorted(logged)
        assert not any(tag.startswith("zipccl/all_gather") for tag in logged)  # no calls
        wire = logged["zipccl/all_reduce/wire_MB"]
        assert [s for s, _ in wire] == list(range(1, STEPS + 1))
        # Per-step values, not running totals: they add up to the hook's total.
        assert sum(v for _, v in wire) == pytest.approx(st["wire_bytes"] / 1e6, rel=1e-5)
        calls = [v for _, v in logged["zipccl/all_reduce/calls"]]
        assert sum(calls) == st["calls"] and all(c > 0 for c in calls)
        assert all(v == 1.0 for _, v in logged["zipccl/all_reduce/compressed_fraction"])


def run_uneven_inputs_under_join(cfg: ZipCCLConfig) -> dict:
    """DDP's ``join()``: rank 1 trains two more steps; rank 0, done, shadows
    its all-reduces by calling the hook on zero buckets. The last gradients
    and the parameters equal DDP's default under the same join."""
    def train(hook):
        model = DDP(_mlp(torch.float32), bucket_cap_mb=0.01)
        if hook is not None:
            model.register_comm_hook(None, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(3 + dist.get_rank())
        with model.join():
            for _ in range(3 + 2 * dist.get_rank()):
                opt.zero_grad(set_to_none=True)
                model(torch.randn(8, 32, generator=g)).square().mean().backward()
                opt.step()
        return [t.detach().clone() for p in model.parameters() for t in (p, p.grad)]

    want = train(None)
    hook = ZipCCLHook(cfg)
    got = train(hook)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(bits(a), bits(b)), f"tensor {i} differs"
    return hook.stats()["all_reduce"]


@pytest.mark.parametrize("cfg", [CFG, ZipCCLConfig(min_bytes=0, link_gbps=0.01)],
                         ids=["always", "adaptive"])
def test_uneven_inputs_under_join(pool2, cfg):
    results = pool2.run(run_uneven_inputs_under_join, cfg)
    assert results[0]["calls"] == results[1]["calls"], results  # the shadows are calls too
    assert all(st["compressed_calls"] > 0 for st in results), results
