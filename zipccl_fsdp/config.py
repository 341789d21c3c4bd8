"""``ZipCCLConfig``: what the compressed collectives compress, and how.

Every rank of a process group must use the same values for the fields that
decide the wire protocol (``ZipCCLConfig.protocol_fields()``: every field but
``backend``, ``check_consistency`` and, unless the policy is "adaptive",
``codec``): they choose between raw and compressed paths or change the wire
bytes, and ranks that choose differently would call different collectives
and hang. The first call with a config on a group checks this
(``check_consistency``) and raises ``ZipCCLConfigError`` on every rank when
they disagree, naming the field and the ranks (``protocol.check_agreement``;
the fields are ``protocol_fields()``, plus the payload format version and
the codec set of the build). ``backend``, and ``codec`` outside "adaptive",
may differ between ranks: payloads are self-describing.

A config is settings only: frozen, every field a plain value the user sets.
What the collectives learn while they run (agreement checks, the adaptive
policy's measurements and ratios, raw lanes) lives in the ``Runtime`` of
whoever owns the call's ``CommStats`` (``runtime.py``), so ``DEFAULT_CONFIG``
is no process-wide state.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, get_args

CodecName = Literal["auto", "raw", "fixed3", "dense"]
BackendName = Literal["auto", "torch", "cpp", "triton"]

_CODECS = get_args(CodecName)
_BACKENDS = get_args(BackendName)
_UNSUPPORTED = ("raise", "raw")
_POLICIES = ("always", "never", "adaptive")


@dataclass(frozen=True)
class ZipCCLConfig:
    """Settings of the compressed collectives and of the comm hooks built on them.

    Frozen and plain: what the calls learn while they run lives elsewhere
    (module docstring), so one config may serve many hooks and groups.
    Every field is a keyword argument; each one's docstring below says more.

    Args:
        codec (str): "auto", "dense", "fixed3" or "raw".
        backend (str): "auto", "torch", "cpp" or "triton".
        min_bytes (int): units of encoding smaller than this go raw.
        compress_all_gather, compress_reduce_scatter, compress_all_reduce,
            compress_all_to_all (bool): which collective kinds compress.
        unsupported_dtype (str): "raise" or "raw" for dtypes the codec lacks.
        check_consistency (bool): check at a group's first call that the
            ranks agree on the protocol fields.
        verify (bool): per-chunk checksums checked by the receiver.
        policy (str): "adaptive", "always" or "never".
        link_gbps, link_latency_us, codec_gbps (float, optional): speeds for
            the adaptive policy; None measures them.
        pipeline_pieces (int): pieces of a compressed message; 0 lets the
            policy choose.

    Raises:
        ValueError: a field of the wrong type or out of its range, naming it.

    Example::

        >>> cfg = ZipCCLConfig(codec="dense", min_bytes=1 << 20, compress_all_to_all=False)
        >>> all_gather_single(out, inp, config=cfg)
    """

    codec: CodecName = "auto"
    """Exponent code for compressed payloads: "dense" (tiered prefix code),
    "fixed3" (fixed 3-bit codes: faster, larger), "raw" (framing only; for
    tests and measurement) or "auto" (the default): under
    ``policy="adaptive"``, per call whichever of fixed3 and dense the policy
    predicts faster; under "always", the codec module's default, "dense",
    which sends fewer bytes than "fixed3" on model data (ratios and speeds:
    docs/benchmarks.md, "Codec speed and ratio")."""

    backend: BackendName = "auto"
    """Codec backend: "auto" (Triton on CUDA, C++ or torch on CPU), "torch",
    "cpp" or "triton". Payloads are byte-identical across backends."""

    min_bytes: int = 64 * 1024
    """Messages whose unit of encoding (an all-gather shard, a reduce-scatter
    chunk, an all-to-all split) holds fewer raw bytes than this are sent raw.
    Below it the ~100-byte header and the size exchange cost more than the
    bytes saved. 0 compresses everything that is not empty."""

    compress_all_gather: bool = True
    """Compress all-gathers (FSDP2 parameter unshard)."""

    compress_reduce_scatter: bool = True
    """Compress reduce-scatters (FSDP2 gradient reduction). When off, the
    reduce-scatter still runs as a raw all-to-all plus a local fp32 sum in
    rank order, so the result is bitwise the same either way."""

    compress_all_reduce: bool = True
    """Compress all-reduces (DDP buckets): reduce-scatter + all-gather."""

    compress_all_to_all: bool = True
    """Compress all-to-alls (MoE token dispatch)."""

    unsupported_dtype: Literal["raise", "raw"] = "raise"
    """What to do with a dtype the codec does not handle (only bf16, fp16 and
    fp32 are): "raise" a TypeError on every rank before any communication, or
    "raw": run torch's own collective (data movement), or for reductions the
    raw all-to-all + local sum in rank order, which needs a float dtype."""

    check_consistency: bool = True
    """On the first call of this config on a process group, all-gather a
    fingerprint of the protocol fields and raise ``ZipCCLConfigError`` on every
    rank if the ranks disagree. It costs one small all-gather per group, once:
    a vector as wide as a size row of the schedule per rank (a few int64s per
    rank of the group); on a mismatch a second one
    of ``protocol.PROTOCOL_SLOTS`` int64s (256 bytes) per rank finds the fields
    and the ranks. It must itself be equal on every rank."""

    verify: bool = False
    """Integrity mode: every payload carries a checksum per 4096 elements
    (``encode(verify=True)``) that the receiver checks on what it decoded; a
    mismatch raises ``CorruptPayloadError`` on every rank of the call, naming
    the collective, the sending rank and the chunk (any single flipped bit is
    caught, ``benchmarks/bitflip_transit.py``). Raw sends are covered too: a
    call or split that would go raw (below ``min_bytes``, the policy's raw
    calls, ``policy="never"``) is framed by the codec "raw" and goes through
    the same schedule. Not covered: dtypes the codec does not handle (handed
    to torch) and the pieces after a failed encode (the framing encoder is
    what failed). The payload grows by 4 bytes per 4096 elements; the cost in
    time and memory is measured in docs/benchmarks.md ("Verify cost",
    ``benchmarks/verify_cost.py``)."""

    policy: Literal["adaptive", "always", "never"] = "adaptive"
    """How each call chooses between raw and compressed (``policy.py``).
    "adaptive" by default, so that zipccl never makes a fast link slower.
    "always": compress every message of at least ``min_bytes`` (one piece
    unless ``pipeline_pieces`` > 1): for tests, measurements and links known
    to be slow.
    "never": send everything raw (reductions still sum in fp32 in rank order,
    so results are bitwise those of the compressed path). "adaptive": per call,
    raw, compressed, or compressed and pipelined, and with ``codec="auto"``
    fixed3 or dense, whichever a cost model predicts fastest from the message
    size, a running ratio per call site, the link's bandwidth and latency
    (``link_gbps``, else measured at the first call on a process group) and the
    codec's speed (``codec_gbps``, else measured). Measured speeds are agreed
    across the group (the slowest rank's) and ratios come from the size
    exchanges every rank sees, so all ranks take the same decision; with
    ``link_gbps`` and ``codec_gbps`` given nothing is timed, and the decisions
    depend only on the calls and their data (README, "Pinning the
    decisions"). Compression must save ``1 - cost.MARGIN`` of the raw time
    in the model, so a fast link stays raw. Numerics: under every policy a
    reduce-scatter or all-reduce of a dtype the codec handles sums in fp32 in
    rank order, raw or compressed, so no decision changes its bits."""

    link_gbps: float | None = None
    """Link bandwidth for the adaptive policy, in Gbit/s that one rank gets
    while every rank of the group sends at once (its share of a shared link).
    None: measured at the first adaptive call on each process group (a few
    all-gathers, the slowest rank's times; counted under
    ``stats()["calibration"]``)."""

    link_latency_us: float | None = None
    """Latency of one small collective for the adaptive policy, in
    microseconds. None: measured with the bandwidth, or 100 when ``link_gbps``
    is given."""

    codec_gbps: float | None = None
    """Encode and decode speed for the adaptive policy, in GB/s of tensor
    bytes, for both codecs and every dtype. None: measured on 1 MiB of
    Gaussian data at the first adaptive call per process group and dtype (the
    slowest rank's; counted under ``stats()["calibration"]``)."""

    pipeline_pieces: int = 0
    """Pieces a compressed message is cut into, so that encoding one piece,
    moving the previous one and decoding the one before overlap (async
    collectives; on CUDA the codec runs on a side stream). 0: the adaptive
    policy picks the count from its cost model ("always" sends one piece);
    n >= 1: n pieces. Results are bitwise the same for every count."""

    def __post_init__(self) -> None:
        if self.codec not in _CODECS:
            raise ValueError(f"ZipCCLConfig.codec must be one of {_CODECS}, got {self.codec!r}")
        if self.backend not in _BACKENDS:
            raise ValueError(f"ZipCCLConfig.backend must be one of {_BACKENDS}, "
                             f"got {self.backend!r}")
        min_bytes = self.min_bytes
        if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
            raise ValueError(f"ZipCCLConfig.min_bytes must be an int >= 0, got {self.min_bytes!r}")
        for name in _SWITCHES + ("check_consistency", "verify"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ZipCCLConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.unsupported_dtype not in _UNSUPPORTED:
            raise ValueError(f"ZipCCLConfig.unsupported_dtype must be one of {_UNSUPPORTED}, "
                             f"got {self.unsupported_dtype!r}")
        if self.policy not in _POLICIES:
            raise ValueError(f"ZipCCLConfig.policy must be one of {_POLICIES}, "
                             f"got {self.policy!r}")
        for name in ("link_gbps", "link_latency_us", "codec_gbps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0):
                raise ValueError(f"ZipCCLConfig.{name} must be None or a number > 0, "
                                 f"got {value!r}")
        pieces = self.pipeline_pieces
        if isinstance(pieces, bool) or not isinstance(pieces, int) or pieces < 0:
            raise ValueError(f"ZipCCLConfig.pipeline_pieces must be an int >= 0, got {pieces!r}")

    def compresses(self, kind: str) -> bool:
        """Whether collectives of ``kind`` ("all_gather", ...) are compressed."""
        return getattr(self, f"compress_{kind}")

    def protocol_fields(self) -> dict:
        """The fields every rank of a group must agree on, by name: those that
        choose between raw and compressed paths or change the wire bytes. A new
        field of that kind belongs here (``protocol.check_agreement`` exchanges
        them and names the one that differs)."""
        return {"min_bytes": self.min_bytes,
                **{name: getattr(self, name) for name in _SWITCHES},
                "unsupported_dtype": self.unsupported_dtype,
                "verify": self.verify,
                "policy": self.policy,
                # Under "adaptive" the codec set is an input of every decision.
                "policy_codec": self.codec if self.policy == "adaptive" else "",
                "link_gbps": self.link_gbps,
                "link_latency_us": self.link_latency_us,
                "codec_gbps": self.codec_gbps,
                "pipeline_pieces": self.pipeline_pieces}


_SWITCHES = tuple(f.name for f in fields(ZipCCLConfig) if f.name.startswith("compress_"))
"""The ``compress_<kind>`` fields: each is a protocol field and a bool."""

KINDS = tuple(name[len("compress_"):] for name in _SWITCHES)
"""The collectives zipccl implements, one per ``compress_<kind>`` switch, in
field order: the switch is where a kind is declared, and every module reads
the kinds from here (``stats.KINDS``; the size rows send a kind's index)."""


DEFAULT_CONFIG = ZipCCLConfig()
