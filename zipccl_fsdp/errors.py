"""Exceptions raised by zipccl-fsdp."""


class CorruptPayloadError(ValueError):
    """A byte string is not a valid zipccl payload (bad magic, unknown version,
    truncated, lengths that disagree, codes that point outside their streams)."""


class ZipCCLConfigError(ValueError):
    """Ranks of one process group disagree on settings that change the wire bytes."""
