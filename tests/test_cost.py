"""The cost model alone (no processes): what a plan of a call is predicted to
take, raw and compressed, in one piece or several, its sums included."""
from __future__ import annotations

import pytest

from zipccl_fsdp import cost as M


def test_cost_model_pipelines_large_messages_on_slow_links():
    slow = M.LinkSpeed(150e-6, 62e6)          # the 1 Gbit namespace: 62 MB/s per rank
    fast = M.LinkSpeed(150e-6, 3.7e9)         # about an unthrottled loopback
    codec = {"dense": M.CodecSpeed(1.0e9, 1.5e9, 50e-6)}
    f = {"dense": 0.67}
    big = (M.gather(2, 32 << 20),)
    plan, t, raw = M.best_plan(big, slow, codec, f)
    assert plan.compress and plan.pieces > 1 and t < M.MARGIN * raw
    # more pieces hide more of the codec, up to the per-piece latencies
    assert M.predict(big, slow, codec["dense"], 0.67, 8) < M.predict(big, slow, codec["dense"],
                                                                      0.67, 1)
    assert not M.best_plan(big, fast, codec, f)[0].compress
    assert not M.best_plan((M.gather(2, 64),), slow, codec, f)[0].compress


def test_cost_model_prices_the_rank_order_sum():
    """A reduce-scatter part sums every rank's chunk, compressed and raw; where
    torch's all-reduce sums (two ranks), the raw call has no sum of its own."""
    link = M.LinkSpeed(150e-6, 62e6)
    fast_sum = M.CodecSpeed(1.0e9, 1.5e9, 50e-6)                  # no reduce_bps: free
    slow_sum = M.CodecSpeed(1.0e9, 1.5e9, 50e-6, reduce_bps=0.5e9)
    rs = M.scatter_reduce(4, 1 << 20)
    assert rs.reduce == rs.raw_reduce == 4 << 20
    torch_sums = M.scatter_reduce(2, 1 << 20, raw_reduces=False)
    assert torch_sums.reduce == 2 << 20 and torch_sums.raw_reduce == 0
    assert M.predict_raw((rs,), link, slow_sum) == pytest.approx(
        M.predict_raw((rs,), link) + (4 << 20) / 0.5e9)
    assert M.predict_raw((torch_sums,), link, slow_sum) == M.predict_raw((torch_sums,), link)
    one = M.predict((rs,), link, fast_sum, 0.6, 1)
    assert M.predict((rs,), link, slow_sum, 0.6, 1) == pytest.approx(one + (4 << 20) / 0.5e9)
    # in pieces, each piece's share is summed beside the next piece's transfer
    four = M.predict((rs,), link, fast_sum, 0.6, 4)
    assert four + (1 << 20) / 0.5e9 <= M.predict((rs,), link, slow_sum, 0.6, 4) < (
        four + (4 << 20) / 0.5e9)
    # the in-situ slowdown slows the sum with the codec
    assert slow_sum.slowed(2.0).reduce_bps == 0.25e9
