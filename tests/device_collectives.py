"""The compressed collectives on one device type, checked bit for bit.

``task_collectives_on(device)`` runs in every rank of a gloo group
(``dist_utils.DistPool``) and calls all-gather, reduce-scatter, all-reduce and
all-to-all on tensors of that device: one-shot and pipelined, fixed3 and
dense, with checksums, and once under the adaptive policy (which calibrates
on the device). Every input comes from ``collective_cases.make_data``, which
is deterministic per rank, so each rank builds every other rank's input
itself and checks its result against a reference computed on the CPU without
any collective.

On "cpu" this runs in CI (tests/test_device_collectives.py), which proves the
check. On "cuda" every rank uses device 0 of one GPU (gloo moves CUDA tensors
through host memory; NCCL refuses two ranks on one device). That is what no
CPU run reaches: the Triton backend inside the collectives, the codec's side
stream and the waits between it and the caller's stream
(``pipeline._Streams``), and the host reads of the size rows.
``benchmarks/gpu_check.py`` runs it there (section (d)); CI has no GPU.

Nothing here imports pytest: the GPU machine may not have it.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from collective_cases import assert_bits_equal, make_data, make_op, reference_reduce
from zipccl_fsdp import backends
from zipccl_fsdp.collectives import (all_gather_single, all_reduce, all_to_all_single,
                                     reduce_scatter_single)
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.stats import KINDS, CommStats

SIZES = (0, 1, 4097, 3 * 4096 + 5)
"""Elements per rank: empty, one, a chunk and one, three chunks and a ragged tail."""
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CONFIGS = (
    ZipCCLConfig(policy="always", min_bytes=0, codec="fixed3"),
    ZipCCLConfig(policy="always", min_bytes=0, codec="dense", pipeline_pieces=3),
    ZipCCLConfig(policy="always", min_bytes=0, codec="fixed3", pipeline_pieces=2, verify=True),
)
OPS = (("sum", 1.0), ("premul_sum", 0.37))


def _inputs(n: int, dtype: torch.dtype, seed: int, world: int, kind: str = "gauss") -> list:
    """Every rank's input (CPU)."""
    return [make_data(n, dtype, seed, r, kind) for r in range(world)]


def _check_result(got: torch.Tensor, want: torch.Tensor, device: torch.device, what: str):
    assert got.device.type == device.type, f"{what}: result on {got.device}, not {device}"
    assert_bits_equal(got.cpu(), want, what)


def task_collectives_on(device_name: str) -> dict:
    """Run the cases on ``device_name`` ("cpu" or "cuda"); return the number of
    checked results and the compressed calls per collective."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device(device_name)
    if dev.type == "cuda":
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):  # (the self-check runs)
            backend = backends.module("auto", dev, dtype).__name__
            assert backend == "zipccl_fsdp.triton_kernels.exponent_codec", \
                f"on CUDA the collectives would encode {dtype} with {backend}, not Triton"
    st = CommStats()
    checked = 0
    for ci, cfg in enumerate(CONFIGS):
        for dtype in DTYPES:
            for n in SIZES:
                seed = 100 * ci + n
                what = f"{dtype} n={n} codec={cfg.codec} pieces={cfg.pipeline_pieces}"
                # all-gather, and FSDP2's in-place form (the input is this rank's slot).
                xs = _inputs(n, dtype, seed, world)
                want = torch.cat(xs)
                got = torch.full((world * n,), 3.0, dtype=dtype, device=dev)
                all_gather_single(got, xs[rank].to(dev), config=cfg, stats=st)
                _check_result(got, want, dev, f"all_gather {what}")
                got = torch.full((world * n,), 3.0, dtype=dtype, device=dev)
                got[rank * n:(rank + 1) * n].copy_(xs[rank].to(dev))
                all_gather_single(got, got[rank * n:(rank + 1) * n], config=cfg, stats=st)
                _check_result(got, want, dev, f"in-place all_gather {what}")
                # all-to-all, equal splits: rank r's split j goes to rank j.
                xs = _inputs(world * n, dtype, seed + 1, world)
                want = torch.cat([x[rank * n:(rank + 1) * n] for x in xs])
                got = torch.full((world * n,), 5.0, dtype=dtype, device=dev)
                all_to_all_single(got, xs[rank].to(dev), config=cfg, stats=st)
                _check_result(got, want, dev, f"all_to_all {what}")
                checked += 3
                if dtype == torch.float16:
                    continue  # the reductions' dtypes are FSDP2's and DDP's: bf16, fp32
                kind = "bf16cast" if dtype == torch.float32 else "gauss"
                for op, factor in OPS:
                    xs = _inputs(world * n, dtype, seed + 2, world, kind)
                    want = reference_reduce([x[rank * n:(rank + 1) * n] for x in xs], op,
                                            factor, dtype)
                    got = torch.full((n,), 7.0, dtype=dtype, device=dev)
                    reduce_scatter_single(got, xs[rank].to(dev), make_op(op, factor),
                                          config=cfg, stats=st)
                    _check_result(got, want, dev, f"reduce_scatter {op} {kind} {what}")
                    xs = _inputs(n, dtype, seed + 3, world, kind)
                    got = xs[rank].to(dev, copy=True)  # in place: keep xs for the reference
                    all_reduce(got, make_op(op, factor), config=cfg, stats=st)
                    _check_result(got, reference_reduce(xs, op, factor, dtype), dev,
                                  f"all_reduce {op} {kind} {what}")
                    checked += 2
    # The adaptive policy calibrates on the device at its first call (link and
    # codec probes, the in-situ A/B), then decides; the result must not care.
    n = 1 << 19
    xs = _inputs(n, torch.bfloat16, 7, world)
    got = torch.empty(world * n, dtype=torch.bfloat16, device=dev)
    all_gather_single(got, xs[rank].to(dev), config=ZipCCLConfig(), stats=st)
    _check_result(got, torch.cat(xs), dev, "adaptive all_gather")
    checked += 1
    snap = st.snapshot()
    return {"checked": checked, **{k: snap[k]["compressed_calls"] for k in KINDS}}


def task_ddp_hook_on(device_name: str) -> dict:
    """zipccl's DDP comm hook (compressed, several buckets, run on zipccl's
    worker thread) on ``device_name``: after each of three backward passes
    every gradient equals the fp32 rank-order average of every rank's local
    gradients, which each rank computes itself without a collective. On
    CUDA this is what checks ``background.py``'s stream handling: the
    worker's stream waits for the gradients backward wrote, DDP's stream for
    the averages the worker wrote."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from zipccl_fsdp.hooks.registry import ZipCCLHook

    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device(device_name)
    if dev.type == "cuda":
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
    checked = 0
    hook = ZipCCLHook(CONFIGS[0])
    for dtype in (torch.bfloat16, torch.float32):
        torch.manual_seed(0)
        local = nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 192), nn.ReLU(),
                              nn.Linear(192, 16)).to(dev, dtype)
        model = DDP(copy.deepcopy(local), bucket_cap_mb=0.02)
        model.register_comm_hook(None, hook)
        for step in range(3):
            # Plain Gaussian inputs: NaN gradients would compare torch's NaN
            # arithmetic with numpy's (the collectives' tests cover specials).
            xs = [torch.randn(8, 64, generator=torch.Generator().manual_seed(50 + 7 * step + r))
                  .to(dtype) for r in range(world)]
            grads = []  # every rank's local gradients, computed here
            for x in xs:
                local.zero_grad(set_to_none=True)
                local(x.to(dev)).square().mean().backward()
                grads.append([p.grad.cpu() for p in local.parameters()])
            model.zero_grad(set_to_none=True)
            model(xs[rank].to(dev)).square().mean().backward()
            for i, p in enumerate(model.parameters()):
                want = reference_reduce([g[i].reshape(-1) for g in grads], "avg", 1.0, dtype)
                _check_result(p.grad.reshape(-1), want, dev,
                              f"DDP hook {dtype} step {step} parameter {i}")
                checked += 1
    st = hook.stats()["all_reduce"]
    return {"checked": checked, "calls": st["calls"], "compressed": st["compressed_calls"]}
