"""Small functions about where tensors live, how they are cut and padded, and
how host bytes reach a device, shared by the collectives, pipeline.py and
format.py."""
from __future__ import annotations

import torch


def starts(counts: list) -> list:
    """Exclusive prefix sums: where each of ``counts`` begins."""
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


def split_flat(flat: torch.Tensor, counts: list) -> list:
    """Views of consecutive runs of ``counts`` elements of ``flat``, in order."""
    return [flat[s:s + c] for s, c in zip(starts(counts), counts)]


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors share any byte of memory."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    if not (a0 < b0 + b.nbytes and b0 < a0 + a.nbytes):
        return False  # (the cheap test first: raw lanes ask it of every all-to-all)
    return a.device == b.device  # equal addresses on two devices are two memories


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.nbytes == b.nbytes


def zero_padded(payload: torch.Tensor, width: int) -> torch.Tensor:
    """``payload`` (uint8), or a copy of it zero-padded to ``width`` bytes: what
    an all-gather slot of the largest payload's width sends."""
    if payload.numel() == width:
        return payload
    send = torch.empty(width, dtype=torch.uint8, device=payload.device)
    send[:payload.numel()].copy_(payload)
    send[payload.numel():].zero_()
    return send


def padded_in_place(payload: torch.Tensor, width: int) -> torch.Tensor:
    """``payload`` (uint8) widened to ``width`` bytes of the buffer it starts,
    zeros after it: for a payload that ``codec.encode(..., room=r)`` made,
    r >= ``width`` (a payload without that room raises: its storage is too
    short for the view)."""
    if payload.numel() == width:
        return payload
    send = payload.as_strided((width,), (1,))
    send[payload.numel():].zero_()
    return send


def staged(t: torch.Tensor, device) -> torch.Tensor:
    """CPU tensor ``t``, pinned when it is bound for a GPU; copy it there with
    ``non_blocking=True``. From pageable memory a copy makes the host wait for
    everything queued on the stream (torch synchronizes after it, and in a
    pipelined call that is the collective in flight); from pinned memory it
    is queued, and the caching host allocator keeps the pinned bytes until
    it has run."""
    return t.pin_memory() if torch.device(device).type == "cuda" else t


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """CPU tensor ``t`` on ``device``, copied without a host sync (``staged``)."""
    return staged(t, device).to(device, non_blocking=True)


def device_ints(values: list, device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``, copied without a host sync."""
    return to_device(torch.tensor(values, dtype=torch.int64), device)


def gather_source(own: torch.Tensor, slots: list, rank: int) -> torch.Tensor:
    """``own``, or a copy of it when writing the gathered slots would overwrite
    it before it reaches its own slot (FSDP2 passes the input as a view into
    the output; only exactly its own slot is safe)."""
    if any(overlaps(own, s) for r, s in enumerate(slots) if r != rank) or (
            overlaps(own, slots[rank]) and not same_memory(own, slots[rank])):
        return own.clone()
    return own


def stream_per_device(streams: dict, device: torch.device):
    """The CUDA stream ``streams`` holds for ``device``, taken from torch's
    stream pool once. A new one per call cycles through the pool's 32
    streams, which ProcessGroupNCCL draws its streams from too: every 32nd
    call would run on the stream its own collectives run on (correct, but
    nothing overlaps)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in streams:
        streams[index] = torch.cuda.Stream(device=index)
    return streams[index]
