"""A DDP step whose first bucket arrives damaged, and what its caller sees.

``backward_after_damage()`` runs inside an initialized gloo group of two
ranks: one clean step of a small DDP model with the zipccl hook under
``verify=True``, then a step whose first bucket rank 1 damages in transit to
rank 0 (``DamageOnce``), then a plain all-reduce and another step. It returns
what each rank caught, how long that took and what came after. Shared by
tests/test_hook_failures.py and ``benchmarks/fault_matrix.py``; imports no
pytest.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from bitflip_cases import payload_nbytes
from zipccl_fsdp import background
from zipccl_fsdp import protocol as C
from zipccl_fsdp.config import ZipCCLConfig
from zipccl_fsdp.errors import CorruptPayloadError
from zipccl_fsdp.hooks.registry import ZipCCLHook

RAISE_WITHIN_S = 10  # the failed step raises on every rank within this
VERIFY = ZipCCLConfig(policy="always", min_bytes=0, verify=True)


class DamageOnce:
    """Damages the next uint8 payload this rank sends to rank ``to``: the last
    byte of the payload (its last chunk's checksum) gets one bit flipped, on a
    copy, so only the receiver sees it. Patches the two sends the collectives
    use (``protocol.all_gather_single``, ``dist.all_to_all_single``)."""

    def __init__(self, to: int) -> None:
        self.to, self.armed, self.fired = to, True, 0
        self._ag, self._a2a = C.all_gather_single, dist.all_to_all_single
        C.all_gather_single, dist.all_to_all_single = self._all_gather, self._all_to_all

    def restore(self) -> None:
        C.all_gather_single, dist.all_to_all_single = self._ag, self._a2a

    def _damage(self, t: torch.Tensor, start: int, nbytes: int) -> torch.Tensor:
        self.armed, self.fired = False, self.fired + 1
        t = t.clone()
        t[start + nbytes - 1] ^= 1
        return t

    def _all_gather(self, output, input, group=None, async_op=False):
        if self.armed and input.dtype == torch.uint8 and input.numel():
            input = self._damage(input, 0, payload_nbytes(input))
        return self._ag(output, input, group=group, async_op=async_op)

    def _all_to_all(self, output, input, output_split_sizes=None, input_split_sizes=None,
                    group=None, async_op=False):
        if (self.armed and input.dtype == torch.uint8 and input_split_sizes
                and input_split_sizes[self.to]):
            start = sum(input_split_sizes[:self.to])
            piece = input[start:start + input_split_sizes[self.to]]
            input = self._damage(input, start, payload_nbytes(piece))
        return self._a2a(output, input, output_split_sizes, input_split_sizes, group=group,
                         async_op=async_op)


def _model() -> DDP:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 96), nn.ReLU(), nn.Linear(96, 96), nn.ReLU(),
                        nn.Linear(96, 8))
    return DDP(net, bucket_cap_mb=0.01)  # several buckets: some queue behind the damaged one


def _step(model: DDP, opt, g: torch.Generator) -> None:
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
    opt.zero_grad(set_to_none=True)
    (model(x) - y).square().mean().backward()
    opt.step()


def backward_after_damage() -> dict:
    """One clean step, one whose first bucket arrives damaged at rank 0, then
    what the caller does next: a plain all-reduce and another step."""
    rank = dist.get_rank()
    model = _model()
    model.register_comm_hook(None, ZipCCLHook(VERIFY))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(7 + rank)
    _step(model, opt, g)  # buckets rebuilt, agreement check done
    dist.barrier()
    damage = DamageOnce(to=0) if rank == 1 else None
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
    opt.zero_grad(set_to_none=True)
    loss = (model(x) - y).square().mean()
    t0 = time.monotonic()
    caught = cause = message = None
    try:
        loss.backward()
    except CorruptPayloadError as e:
        caught, message = "CorruptPayloadError", str(e)
    except Exception as e:  # noqa: BLE001 - reported to the test
        caught, message = type(e).__name__, str(e)
        cause = type(e.__cause__).__name__ if e.__cause__ is not None else None
    elapsed = time.monotonic() - t0
    idle = background.idle()  # before anything else can let the worker catch up
    if damage is not None:
        damage.restore()
    probe = torch.full((4,), float(rank + 1))
    t1 = time.monotonic()
    dist.all_reduce(probe)  # the caller's own collective, right after the failure
    probe_s = time.monotonic() - t1
    _step(model, opt, g)  # the same model trains on
    return {"caught": caught, "cause": cause, "message": message, "elapsed": elapsed,
            "idle": idle, "probe": probe.tolist(), "probe_s": probe_s,
            "fired": damage.fired if damage is not None else None,
            "params": [p.detach().clone().view(torch.int32) for p in model.parameters()]}
