"""Fuzz ``zipccl_fsdp.decode`` with damaged payloads and random bytes.

Every case must end in one of two ways: the decoder returns exactly the
original tensor (the mutation hit bits that carry no information, e.g. stream
padding), or it raises CorruptPayloadError. Anything else is counted:

* crash: any other exception;
* wrong: a tensor returned that differs from the original. With checksums
  (the default, ``verify=True`` payloads) this must be 0. With ``--no-verify``
  a flipped sign/mantissa bit is a valid payload of another tensor, so wrong
  results are expected there and reported as undetectable.

Usage::

    python benchmarks/fuzz_decode.py --cases 100000
"""
from __future__ import annotations

import argparse
import os
import struct
import sys
import time
import zlib
from collections import Counter

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import zipccl_fsdp as z  # noqa: E402
from zipccl_fsdp import format as F  # noqa: E402

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="auto", choices=z.BACKENDS)
    ap.add_argument("--no-verify", action="store_true", help="payloads without checksums")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = run(args.cases, not args.no_verify, args.backend, args.seed,
              report_every=max(args.cases // 10, 1))
    print(f"\nfuzz_decode: {res['cases']} cases, verify={not args.no_verify}, backend={args.backend}, "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"{'mutation':<20} {'exact':>8} {'refused':>8} {'wrong':>8} {'crash':>8}")
    for kind in ("none",) + MUTATIONS:
        row = [res["per_kind"].get((kind, o), 0) for o in ("exact", "refused", "wrong", "crash")]
        print(f"{kind:<20} " + " ".join(f"{v:>8}" for v in row))
    print(f"slowest case: {res['slowest_s'] * 1e3:.1f} ms ({res['slowest_case']})")
    for k, v in res["examples"].items():
        print(f"first {k}: {v}")
    bad = res["outcomes"].get("crash", 0) + (0 if args.no_verify else res["outcomes"].get("wrong", 0))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
