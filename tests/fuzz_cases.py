"""Damaged payloads for the decoder, and the loop that decodes them.

``run(cases, ...)`` mutates valid payloads (both zero signs in the bases)
and decodes each: the result must be the exact original or a
``CorruptPayloadError``; anything else is a crash or a wrong tensor. Shared
by ``tests/test_fuzz.py`` (short runs) and ``benchmarks/fuzz_decode.py``
(long ones); imports no pytest.
"""
from __future__ import annotations

import struct
import time
import zlib
from collections import Counter

import torch

import zipccl_fsdp as z
from zipccl_fsdp import format as F

INT = {2: torch.int16, 4: torch.int32}
MUTATIONS = ("bitflip", "multiflip", "truncate", "extend", "header_field", "table_field",
             "random_bytes", "random_after_header")


def base_payloads(verify: bool, backend: str, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for codec in z.CODECS:
            for n in (1, 7, 300, 4097, 9000):
                x = torch.randn(n, generator=g).to(dtype)
                if n > 10:
                    x[: n // 4] = 0
                    x[n // 4: n // 2] = -0.0  # both zero codes (ZPOS and ZNEG chunks)
                    x[5] = float("nan")
                    x[6] = float("-inf")
                if dtype == torch.float32 and n == 9000:
                    x = x.bfloat16().float()
                out.append((x, z.encode(x, codec=codec, backend=backend, verify=verify)))
    return out


def _fix_crc(b: bytearray) -> None:
    ndim = b[7] if len(b) > 7 else 0
    if len(b) < F.HEADER_NBYTES + 8 * ndim or ndim > F.MAX_NDIM:
        return
    crc = zlib.crc32(bytes(b[:F.HEADER_NBYTES - 4]) + bytes(b[F.HEADER_NBYTES:F.HEADER_NBYTES + 8 * ndim]))
    b[F.HEADER_NBYTES - 4:F.HEADER_NBYTES] = struct.pack("<I", crc)


def mutate(p: bytes, kind: str, rng: torch.Generator) -> bytes:
    r = lambda hi: int(torch.randint(0, max(hi, 1), (1,), generator=rng))  # noqa: E731
    b = bytearray(p)
    if kind == "bitflip":
        i = r(len(b) * 8)
        b[i // 8] ^= 1 << (i % 8)
    elif kind == "multiflip":
        for _ in range(2 + r(6)):
            i = r(len(b) * 8)
            b[i // 8] ^= 1 << (i % 8)
    elif kind == "truncate":
        b = b[: r(len(b))]
    elif kind == "extend":
        b += bytes(r(256) for _ in range(1 + r(64)))
    elif kind == "header_field":  # a plausible edit that passes the header CRC
        off = r(F.HEADER_NBYTES - 4)
        b[off] = r(256)
        _fix_crc(b)
    elif kind == "table_field":  # chunk table and offsets bytes, header left intact
        start = F.align16(F.HEADER_NBYTES + 8 * b[7])
        nch = struct.unpack_from("<I", b, 20)[0]
        end = min(len(b), start + (F.CHUNK_ENTRY_NBYTES + F.OFFSET_NBYTES) * nch)
        for _ in range(1 + r(3)):
            i = start + r(max(end - start, 1))
            if i < len(b):
                b[i] = r(256)
    elif kind == "random_bytes":
        b = bytearray(r(256) for _ in range(r(512)))
    elif kind == "random_after_header":
        start = F.HEADER_NBYTES + 8 * b[7]
        b[start:] = bytes(r(256) for _ in range(len(b) - start))
    return bytes(b)


def run(cases: int, verify: bool = True, backend: str = "auto", seed: int = 0,
        report_every: int = 0) -> dict:
    bases = base_payloads(verify, backend, seed)
    rng = torch.Generator().manual_seed(seed + 1)
    outcomes: Counter = Counter()
    per_kind: Counter = Counter()
    slowest = (0.0, "")
    examples = {}
    for i in range(cases):
        x, p = bases[i % len(bases)]
        kind = MUTATIONS[(i // len(bases)) % len(MUTATIONS)] if i >= len(bases) else "none"
        data = bytes(p.tolist()) if kind == "none" else mutate(bytes(p.tolist()), kind, rng)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
            torch.empty(0, dtype=torch.uint8)
        t0 = time.perf_counter()
        try:
            y = z.decode(payload, backend=backend)
        except z.CorruptPayloadError:
            outcome = "refused"
        except Exception as exc:  # noqa: BLE001 - anything else is a finding
            outcome = "crash"
            examples.setdefault("crash", f"{kind}: {type(exc).__name__}: {exc}")
        else:
            same = (y.dtype == x.dtype and y.shape == x.shape and
                    torch.equal(y.reshape(-1).view(INT[y.element_size()]),
                                x.reshape(-1).view(INT[x.element_size()])))
            outcome = "exact" if same else "wrong"
            if not same:
                examples.setdefault("wrong", f"{kind} on {x.dtype}[{x.numel()}]")
        dt = time.perf_counter() - t0
        if dt > slowest[0]:
            slowest = (dt, f"{kind} on {x.dtype}[{x.numel()}], {len(data)} bytes")
        outcomes[outcome] += 1
        per_kind[(kind, outcome)] += 1
        if report_every and (i + 1) % report_every == 0:
            print(f"  {i + 1} cases: {dict(outcomes)}", flush=True)
    return dict(cases=cases, outcomes=dict(outcomes), per_kind=dict(per_kind),
                slowest_s=slowest[0], slowest_case=slowest[1], examples=examples)
