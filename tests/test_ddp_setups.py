"""The DDP hook in training setups where collectives zipccl does not issue
share the process group with the buckets' all-reduces.

DDP's reducer all-reduces its used-parameter map under
``find_unused_parameters`` (and in ``static_graph``'s first iteration),
autograd runs the backward of ``torch.distributed.nn.functional`` collectives
between buckets, and ``join()`` shadows a finished rank's all-reduces. Each
test trains the same tiny model twice in one task, with DDP's default
all-reduce and with the default ``ZipCCLHook()`` (and once with
``policy="always"``, so that buckets really are compressed), and compares
the losses and the integer views of every parameter after ``STEPS`` steps.
On a mixed order the ranks hang until the process-group timeout or gloo
aborts one: the pool then fails the test (a dead rank at once, a hang at
``RUN_TIMEOUT_S``).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from zipccl_fsdp.hooks.registry import ZipCCLHook
from zipccl_fsdp.config import ZipCCLConfig

PG_TIMEOUT_S = 30  # the pool's process groups (conftest reads it)
RUN_TIMEOUT_S = 90  # a task that takes longer has hung
STEPS = 5
ALWAYS = ZipCCLConfig(policy="always", min_bytes=0)
INT_VIEW = {torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(INT_VIEW[t.dtype])


class Branches(nn.Module):
    """A trunk and two heads; ``use`` says which heads the forward runs."""

    def __init__(self, use: tuple = ("a", "b")) -> None:
        super().__init__()
        self.use = use
        self.trunk = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.a = nn.Linear(64, 8)
        self.b = nn.Linear(64, 8)

    def forward(self, x):
        h = self.trunk(x)
        return sum(getattr(self, name)(h) for name in self.use)


class Clip(nn.Module):
    """A CLIP-style model: embeddings, gathered from every rank with autograd's
    all-gather (its backward is a collective of its own in DDP's backward),
    then a head applied to the gathered embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64))
        self.head = nn.Linear(64, 64)

    def forward(self, x):
        emb = self.encoder(x)
        every = torch.cat(dist_fn.all_gather(emb))
        keys = self.head(every)
        return emb @ keys.t()  # (batch, world * batch) logits


class Sparse(nn.Module):
    """An embedding with sparse gradients (DDP gives it a bucket of its own) and
    a dense head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(40, 64, sparse=True)
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x):
        ids = (x.abs() * 10).long().clamp_(max=39)
        return self.head(self.emb(ids).mean(1))


def _loss(model_name: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if model_name == "clip":
        labels = torch.arange(out.shape[0]) + dist.get_rank() * out.shape[0]
        return nn.functional.cross_entropy(out, labels)
    return (out - y).square().mean()


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "clip":
        return Clip()
    if name == "sparse":
        return Sparse()
    return Branches(("a",) if name == "some unused" else ("a", "b"))


def train(model_name: str, options: dict, hook, *, no_sync: bool = False,
          uneven: bool = False) -> tuple:
    """STEPS steps of SGD on rank-specific data; (losses, parameters at the end).
    ``no_sync``: every other step accumulates without communication.
    ``uneven``: rank r trains STEPS + 2 r steps under ``Join``."""
    model = DDP(_model(model_name), bucket_cap_mb=0.01, **options)  # a few buckets
    if hook is not None:
        model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05,
                          momentum=0.0 if model_name == "sparse" else 0.9)
    g = torch.Generator().manual_seed(10 + dist.get_rank())
    losses = []
    steps = STEPS + 2 * dist.get_rank() if uneven else STEPS
    with Join([model], enable=uneven):
        for step in range(steps):
            x = torch.randn(8, 16, generator=g)
            y = torch.randn(8, 8, generator=g)
            if no_sync and step % 2 == 0:
                with model.no_sync():
                    _loss(model_name, model(x), y).backward()
                continue
            loss = _loss(model_name, model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach().clone())
    return losses, [p.detach().clone() for p in model.parameters()]


def run_same_as_without_hook(model_name: str, options: dict, cfg, **how) -> dict:
    want = train(model_name, options, None, **how)
    hook = ZipCCLHook() if cfg is None else ZipCCLHook(cfg)
    got = train(model_name, options, hook, **how)
    assert len(got[0]) == len(want[0])
    for step, (a, b) in enumerate(zip(got[0], want[0])):
        assert torch.equal(bits(a), bits(b)), f"loss of step {step} differs"
    for i, (a, b) in enumerate(zip(got[1], want[1])):
        assert torch.equal(bits(a), bits(b)), f"parameter {i} differs"
    return hook.stats()["all_reduce"]


CASES = {
    "unused_some": ("some unused", dict(find_unused_parameters=True), {}),
    "unused_none": ("all used", dict(find_unused_parameters=True), {}),
    "static_graph": ("all used", dict(static_graph=True), {}),
    "static_graph_unused": ("some unused", dict(static_graph=True), {}),
    "bucket_view": ("all used", dict(gradient_as_bucket_view=True), {}),
    "no_sync": ("all used", {}, dict(no_sync=True)),
    "no_sync_unused": ("some unused", dict(find_unused_parameters=True), dict(no_sync=True)),
    "join": ("all used", {}, dict(uneven=True)),
    "join_unused": ("some unused", dict(find_unused_parameters=True), dict(uneven=True)),
    "clip": ("clip", {}, {}),
    "clip_unused_map": ("clip", dict(find_unused_parameters=True), {}),
    "sparse": ("sparse", {}, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_default_hook_trains_as_ddp_does(pool2, case):
    model_name, options, how = CASES[case]
    results = pool2.run(run_same_as_without_hook, model_name, options, None, **how,
                        timeout_s=RUN_TIMEOUT_S)
    for st in results:
        assert st["calls"] > 0, st


@pytest.mark.parametrize("case", ["unused_some", "static_graph", "no_sync_unused",
                                  "join_unused", "clip_unused_map", "sparse"])
def test_compressed_buckets_train_as_ddp_does(pool2, case):
    model_name, options, how = CASES[case]
    results = pool2.run(run_same_as_without_hook, model_name, options, ALWAYS, **how,
                        timeout_s=RUN_TIMEOUT_S)
    for st in results:
        assert st["compressed_calls"] > 0, st
        assert 0 < st["wire_bytes"] < st["raw_bytes"], st
