"""``ZipCCLConfig``: what the compressed collectives compress, and how.

Every rank of a process group must use the same values for the fields that
decide the wire protocol (``min_bytes``, the ``compress_*`` switches and
``unsupported_dtype``): they choose between raw and compressed paths, and ranks
that choose differently would call different collectives and hang. The first
call with a config on a group checks this (``check_consistency``) and raises
``ZipCCLConfigError`` on every rank when they disagree. ``codec`` and
``backend`` may differ between ranks: payloads are self-describing.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

_CODECS = ("auto", "raw", "fixed3", "dense")
_BACKENDS = ("auto", "torch", "cpp", "triton")
_UNSUPPORTED = ("raise", "raw")


@dataclass(frozen=True)
class ZipCCLConfig:
    """Settings of the compressed collectives and of the comm hooks built on them.

    Example::

        >>> cfg = ZipCCLConfig(codec="dense", min_bytes=1 << 20, compress_all_to_all=False)
        >>> all_gather_single(out, inp, config=cfg)
    """

    codec: str = "dense"
    """Exponent code for compressed payloads: "dense" (tiered prefix code),
    "fixed3" (fixed 3-bit codes: faster, larger), "auto" (the codec module's
    default) or "raw" (framing only; for tests and measurement). "dense" by
    default: on FSDP2 bf16 parameters it sends 0.66 of the raw bytes against
    0.70 for "fixed3" (tests/test_fsdp2.py), and compression is only switched
    on for links slow enough that bytes matter more than codec speed. On an
    H200 (Triton) both encode 8 MiB of bf16 in under 1 ms; on the CPU backend
    dense encodes at 0.14 GB/s, fixed3 at 0.32 GB/s."""

    backend: str = "auto"
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

    unsupported_dtype: str = "raise"
    """What to do with a dtype the codec does not handle (only bf16, fp16 and
    fp32 are): "raise" a TypeError on every rank before any communication, or
    "raw": run torch's own collective (data movement), or for reductions the
    raw all-to-all + local sum in rank order, which needs a float dtype."""

    check_consistency: bool = True
    """On the first call of this config on a process group, all-gather a
    fingerprint of the protocol fields and raise ``ZipCCLConfigError`` on every
    rank if the ranks disagree (costs one tiny all-gather per group, once)."""

    _checked_groups: set = field(default_factory=set, init=False, repr=False,
                                 compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.codec not in _CODECS:
            raise ValueError(f"ZipCCLConfig.codec must be one of {_CODECS}, got {self.codec!r}")
        if self.backend not in _BACKENDS:
            raise ValueError(f"ZipCCLConfig.backend must be one of {_BACKENDS}, "
                             f"got {self.backend!r}")
        min_bytes = self.min_bytes
        if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
            raise ValueError(f"ZipCCLConfig.min_bytes must be an int >= 0, got {self.min_bytes!r}")
        for name in ("compress_all_gather", "compress_reduce_scatter", "compress_all_reduce",
                     "compress_all_to_all", "check_consistency"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ZipCCLConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.unsupported_dtype not in _UNSUPPORTED:
            raise ValueError(f"ZipCCLConfig.unsupported_dtype must be one of {_UNSUPPORTED}, "
                             f"got {self.unsupported_dtype!r}")

    def compresses(self, kind: str) -> bool:
        """Whether collectives of ``kind`` ("all_gather", ...) are compressed."""
        return getattr(self, f"compress_{kind}")

    def protocol_fingerprint(self) -> int:
        """A 63-bit hash of the fields every rank must agree on."""
        text = repr((self.min_bytes, self.compress_all_gather, self.compress_reduce_scatter,
                     self.compress_all_reduce, self.compress_all_to_all, self.unsupported_dtype))
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


DEFAULT_CONFIG = ZipCCLConfig()
