"""Lossless compressed collectives over ``torch.distributed`` (gloo and NCCL).

Names and positional arguments mirror torch's: ``all_gather_single``,
``reduce_scatter_single``, ``all_reduce`` and ``all_to_all_single``, each with
keyword-only ``config`` (a ``ZipCCLConfig``) and ``stats`` (a ``CommStats``;
the module's own by default, read with ``stats()``). They know nothing of
FSDP or DDP; ``hooks`` builds those integrations on top of them.

One module per collective (``all_gather.py``, ``reduce_scatter.py``,
``all_reduce.py``, ``all_to_all.py``) holds its signature, its checks and its
plan; the steps every call shares are in ``dispatch.py``. Each function checks its arguments,
asks the policy for a plan (``policy.py``), and then either hands the call to
torch (a raw data movement) or runs the one schedule of ``pipeline.py`` with
it, of which a one-piece compressed call and zipccl's own raw reduction are
cases. How each one moves bytes:

* all-gather: encode the own shard, all-gather the payload sizes (a row of
  int64 per rank), all-gather the payloads padded to the largest, decode each
  slot into the output. Padding keeps torch's (NCCL's ring/tree) all-gather;
  it costs max - own bytes, counted in ``pad_bytes``. The input may be a view
  into the output (FSDP2 passes it so): it is read (encoded) before any output
  slot is written.
* reduce-scatter: a sum of compressed bytes is meaningless, so each rank
  encodes the chunk meant for each peer, payloads go through
  ``all_to_all_single`` with exact split sizes (no padding), and each rank
  decodes and sums its chunk locally in fp32, in rank order 0..world-1, then
  scales (AVG, PREMUL_SUM) and casts. The raw path (below ``min_bytes``,
  with compression off, or sent raw by any policy) is an uncompressed
  all-to-all followed by the same sum, so the result is bitwise the same on
  either path and with every codec backend; a NaN result is the canonical
  quiet NaN (``_reduce.py``).
* all-reduce: the reduce-scatter above and the all-gather above, on chunks of
  ceil/floor(numel / world) elements (any numel), raw or compressed: never
  torch's own all-reduce, whose summation order is its own. A small raw one
  is one all-gather of the whole tensors and the same fp32 rank-order sum on
  every rank (``all_reduce.gathers_whole``).
* all-to-all: each split is encoded if it holds at least ``min_bytes`` (the
  receiver applies the same rule to its output split, so nothing marks it),
  payloads go through an all-to-all with exact splits. An output that
  overlaps the input is refused on every path alike.

A rank's own chunk of a reduce-scatter or all-to-all is never encoded nor sent.

Every check that can fail locally (dtype, op, shapes) runs before the first
communication. A rank whose arguments fail them tells its peers in the
exchange they make first (``protocol.refuse``): the agreement check, or the first size
row of a call that goes through the schedule; they raise ``ValueError``
naming it. No call decides raw or compressed, or which raw route, from its
own sizes before the ranks have agreed on them: a call raw for its size
(below ``min_bytes``, or chosen by the adaptive policy from it) exchanges its
size row before torch's call (``dispatch.announce``), and zipccl's own raw
reduction sends one with its first piece, so ranks whose sizes differ raise
``ValueError`` on every rank. A call every rank hands to torch for a reason
they share before any exchange (``cost.agreed_raw``) has none, and there
torch's rule holds: the peers wait until the process group's timeout. What
only the ranks together can see (a call that differs between ranks, a size no
slot can hold) is checked on the size rows, which every rank sees. Under
``verify`` a call that would go raw is framed and checked (``VERIFIED_RAW``).
``async_op=True`` returns a ``Work``: torch's own, possibly pending, for a
call sent raw; a completed one for a compressed call, which runs
synchronously underneath (the size exchange needs the host anyway).

What every collective takes after its tensors (and its ``op``):

* ``group`` (ProcessGroup, optional): the process group; None is the default
  group. A rank outside it gets None back, as from torch.
* ``async_op`` (bool): return a ``Work`` instead of None.
* ``config`` (ZipCCLConfig, keyword-only, optional): how to compress; None is
  ``DEFAULT_CONFIG``. Its protocol fields must be equal on every rank
  (checked at its first call on a group).
* ``stats`` (CommStats, keyword-only, optional): where the call is counted;
  None is the module's own (``stats()``).

What every collective raises:

* ``ValueError``: arguments wrong on this rank (shapes, dtypes, devices,
  overlapping buffers, an unsupported op, split sizes), before any payload
  moves; its peers raise too, naming it, unless they hand the call to torch
  raw (above).
* ``TypeError``: a dtype the codec does not code, under
  ``config.unsupported_dtype="raise"``.
* ``ZipCCLConfigError``: the ranks' configs disagree on a protocol field.
* ``CorruptPayloadError``: under ``config.verify``, a payload damaged in
  transit; every rank of the call raises.

What the ranks tell each other lives in ``protocol.py``: the size rows, the
agreement check at a group's first call (per-field, naming the ranks), the
refusal, ``ZipCCLConfig(verify=True)``'s settling exchange, and the fallback
to the raw collective on every rank when an encode fails (a payload size of
-1 in the size row). Measured costs of the size
exchange, the padding and a call's memory are in docs/benchmarks.md ("Link
benchmark", "Raw call overhead", "Collective memory").
"""
from __future__ import annotations

from .dispatch import CODED_DTYPES, reset_stats, stats
from .dispatch import capturing as _capturing  # noqa: F401 - the DTensor mode asks it too
from .dispatch import torch_all_gather as _all_gather_single  # noqa: F401 - for benchmarks
from .all_gather import all_gather_single
from .all_reduce import all_reduce, all_reduce_outlook
from .all_to_all import all_to_all_single
from .reduce_scatter import reduce_scatter_single

__all__ = ["all_gather_single", "reduce_scatter_single", "all_reduce", "all_to_all_single",
           "stats", "reset_stats", "CODED_DTYPES"]
