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
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import zipccl_fsdp as z  # noqa: E402
from fuzz_cases import MUTATIONS, run  # noqa: E402


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
