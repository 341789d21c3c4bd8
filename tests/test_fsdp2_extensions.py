"""Tensor subclasses: FSDP2's all-gather extensions
(``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``, which torchao's float8
training uses) train bitwise the same with the hook as without it, and the
codec refuses, with an error, a tensor whose elements are not in memory of its
own instead of reading address 0.

The subclasses are small ones written here after torch's own tests
(test/distributed/_composable/fsdp/test_fully_shard_extensions.py): a
``TwoTensor`` whose extension all-gathers the wrapper itself (the comm then
gets wrapper tensors, whose ``data_ptr()`` is 0), and a float8-style wrapper
whose extension all-gathers its data cast to float8 or bf16, as uint8 bytes.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.autograd.grad_mode import _unsafe_preserve_version_counter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.two_tensor import TwoTensor

from zipccl_fsdp.config import ZipCCLConfig

PG_TIMEOUT_S = 30
STEPS = 4
DIM = 64


# --------------------------------------------------------------------------
# The codec's front door
# --------------------------------------------------------------------------
def test_codec_refuses_a_wrapper_subclass_without_crashing():
    # In a subprocess: reading address 0 kills the process (SIGSEGV), which
    # must fail this test, not pytest. Every backend, encode and decode.
    code = """
import torch, zipccl_fsdp
from torch.testing._internal.two_tensor import TwoTensor
a = torch.randn(5000).bfloat16()
t = TwoTensor(a, a.clone())
p = zipccl_fsdp.encode(a, codec="dense")
calls = {"encode": lambda b: zipccl_fsdp.encode(t, codec="dense", backend=b),
         "decode_out": lambda b: zipccl_fsdp.decode(p, out=t, backend=b),
         "decode_payload": lambda b: zipccl_fsdp.decode(TwoTensor(p, p.clone()), backend=b)}
for backend in ("cpp", "torch", "auto"):
    for what, call in calls.items():
        try:
            call(backend)
        except TypeError as e:
            assert "TwoTensor" in str(e) and "not in memory of its own" in str(e), e
            print("refused", backend, what, flush=True)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    assert done.stdout.count("refused") == 9, done.stdout


# --------------------------------------------------------------------------
# FSDP2 with all-gather extensions, 2 gloo ranks
# --------------------------------------------------------------------------
def _two_tensor_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
    return (self.to(torch.bfloat16),), None  # a TwoTensor reaches the comm


def _two_tensor_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
    (tensor,) = all_gather_outputs
    if out is not None:
        with torch.no_grad(), _unsafe_preserve_version_counter(out):
            out.copy_(tensor)
        return None
    upcast = tensor.to(param_dtype)
    return upcast, (tensor, upcast)


class Float8Like(torch.Tensor):
    """A wrapper subclass whose parameter is all-gathered as ``inside``: its
    data cast to float8_e4m3fn, or to bf16, sent as uint8 bytes, and cast
    back after the all-gather (what torchao's float8 weights do)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, inside: str):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, data.stride(),
                                                   data.storage_offset(), dtype=data.dtype,
                                                   device=data.device)

    def __init__(self, data: torch.Tensor, inside: str):
        self._data = data
        self._inside = inside

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        # gloo has no float8 collectives: float8 goes as its bytes, as uint8
        inner = torch.float8_e4m3fn if self._inside == "float8" else torch.bfloat16
        return (self._data.to(inner).view(torch.uint8),), None

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        (tensor,) = all_gather_outputs
        tensor = tensor.view(torch.float8_e4m3fn if self._inside == "float8" else torch.bfloat16)
        if out is not None:
            with torch.no_grad(), _unsafe_preserve_version_counter(out):
                out.copy_(tensor)
            return None
        upcast = tensor.to(param_dtype)
        return upcast, (tensor, upcast)

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        inside = [x._inside for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, cls)]
        out = func(*pytree.tree_map_only(cls, lambda x: x._data, args),
                   **pytree.tree_map_only(cls, lambda x: x._data, kwargs or {}))
        return pytree.tree_map_only(torch.Tensor, lambda x: cls(x, inside[0]), out)

    def __tensor_flatten__(self):
        return ["_data"], self._inside

    @staticmethod
    def __tensor_unflatten__(inner, inside, outer_size, outer_stride):
        return Float8Like(inner["_data"], inside)


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, DIM, bias=False), nn.ReLU(),
                          nn.Linear(DIM, DIM, bias=False))
    for layer in (model[0], model[2]):
        w = layer.weight.detach()
        if kind == "two_tensor":
            layer.weight = nn.Parameter(TwoTensor(w, w.clone()))
        else:
            layer.weight = nn.Parameter(Float8Like(w.clone(), kind))
    return model


def _plain_bits(t: torch.Tensor) -> list:
    """The int32 bits of a local shard, of each tensor a wrapper holds."""
    inner = [t] if type(t) is torch.Tensor else [getattr(t, n) for n in t.__tensor_flatten__()[0]]
    return [x.detach().contiguous().view(torch.int32).flatten().tolist() for x in inner]


def task_train_extensions(kind: str, hooked: bool):
    rank = dist.get_rank()
    patched = kind == "two_tensor"
    if patched:
        TwoTensor.fsdp_pre_all_gather = _two_tensor_pre_all_gather
        TwoTensor.fsdp_post_all_gather = _two_tensor_post_all_gather
    try:
        model = _model(kind)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        fully_shard(model[0], mesh=mesh)
        fully_shard(model[2], mesh=mesh)
        fully_shard(model, mesh=mesh)
        hook = None
        if hooked:
            from zipccl_fsdp.hooks.registry import ZipCCLHook
            # min_bytes=0 and "always": every call zipccl can compress is compressed
            hook = ZipCCLHook(ZipCCLConfig(policy="always", min_bytes=0,
                                           unsupported_dtype="raw"))
            model.register_comm_hook(hook)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(10 + rank)
        losses = []
        for _ in range(STEPS):
            x = torch.randn(8, DIM, generator=g)
            loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().view(torch.int32).item())
        shards = [_plain_bits(p.to_local()) for p in model.parameters()]
        calls = None
        if hook is not None:
            calls = {k: int(v["calls"]) for k, v in hook.stats().items()}
            hook.remove(model)
        return losses, shards, calls
    finally:
        if patched:
            del TwoTensor.fsdp_pre_all_gather, TwoTensor.fsdp_post_all_gather


@pytest.mark.parametrize("kind", ["two_tensor", "float8", "uint8"])
def test_fsdp2_all_gather_extensions_train_bitwise_equal_with_the_hook(pool2, kind):
    plain = pool2.run(task_train_extensions, kind, False)
    hooked = pool2.run(task_train_extensions, kind, True)
    for (losses0, shards0, _), (losses1, shards1, calls) in zip(plain, hooked):
        assert losses1 == losses0
        assert shards1 == shards0
        assert calls["all_gather"] > 0 and calls["reduce_scatter"] > 0, calls  # it ran
