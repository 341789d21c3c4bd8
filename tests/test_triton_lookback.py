"""zipccl_fsdp.triton_kernels._lookback: the decoupled look-back prefix sum the encoders
place their chunk segments with, run under the interpreter without CUDA
(programs run in order there) and compiled on a GPU."""
import pytest
import torch

from zipccl_fsdp.triton_kernels import available

if not available():
    pytest.skip("triton is not installed", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from zipccl_fsdp.triton_kernels._lookback import chunk_offset, ticket  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
AGG, INC = 1 << 40, 2 << 40


@triton.jit
def _prefix_kernel(counter_ptr, status_ptr, units_ptr, out_ptr, order_ptr):
    c = ticket(counter_ptr)
    n = tl.load(units_ptr + c)
    tl.store(out_ptr + c, chunk_offset(status_ptr, c, n))
    tl.store(order_ptr + tl.program_id(0), c)


@triton.jit
def _one_kernel(status_ptr, out_ptr, c, n):
    tl.store(out_ptr, chunk_offset(status_ptr, c, n))


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_exclusive_prefix_and_published_status(n):
    g = torch.Generator().manual_seed(n)
    units = torch.randint(0, 1 << 30, (n,), generator=g, dtype=torch.int64)
    units[n // 2] = 0  # an empty segment
    counter = torch.zeros(1, dtype=torch.int32, device=DEV)
    status = torch.zeros(n, dtype=torch.int64, device=DEV)
    out = torch.full((n,), -1, dtype=torch.int64, device=DEV)
    order = torch.full((n,), -1, dtype=torch.int32, device=DEV)
    _prefix_kernel[(n,)](counter, status, units.to(DEV), out, order)
    incl = torch.cumsum(units, 0)
    assert torch.equal(out.cpu(), incl - units)
    assert torch.equal(status.cpu(), INC | incl)  # every program left its inclusive prefix
    assert sorted(order.cpu().tolist()) == list(range(n))  # each ticket taken once
    assert int(counter.item()) == n


def test_walks_back_over_aggregates():
    """Predecessors that have published only their aggregate are summed
    until one with an inclusive prefix; the words before it are not read."""
    status = torch.tensor([INC | 999, INC | 5, AGG | 3, AGG | 2, 0, 0], dtype=torch.int64,
                          device=DEV)
    out = torch.zeros(1, dtype=torch.int64, device=DEV)
    _one_kernel[(1,)](status, out, 4, 11)
    assert int(out.item()) == 5 + 3 + 2
    assert int(status[4].item()) == INC | (10 + 11)
    assert int(status[5].item()) == 0
    _one_kernel[(1,)](status, out, 0, 11)  # program 0: no predecessor
    assert int(out.item()) == 0 and int(status[0].item()) == INC | 11
