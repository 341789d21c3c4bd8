"""The failure paths of the collectives and the DDP hook, each bounded in
time: a table of case, outcome and seconds.

Each case runs on 2 gloo ranks (a pool of processes with a short process-group
timeout, respawned after any case that did not pass on every rank, since a
rank may be left inside a collective) or in this process, through the public
API: ``zipccl_fsdp.all_reduce``, ``all_to_all_single``, ``reduce_scatter_single``,
``all_gather_single``, ``encode``/``decode``, ``max_encoded_nbytes``,
``ZipCCLConfig``, ``ZipCCLHook`` on DDP. Damage "in transit" is made by wrapping
the torch.distributed sends the collectives make. A case that gives no result
within its wall limit is reported as a hang and its processes are killed.

``pass`` means what README promises under "Errors": an exact result, or
the named error on every rank within 10 s.

Usage::

    python benchmarks/fault_matrix.py            # every case
    python benchmarks/fault_matrix.py --only 1 2 # some
"""
from __future__ import annotations

import argparse
import io
import math
import os
import struct
import sys
import tempfile
import time
import zlib

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

import zipccl_fsdp as Z  # noqa: E402
from zipccl_fsdp import CorruptPayloadError, ZipCCLConfig, ZipCCLConfigError  # noqa: E402

PG_TIMEOUT_S = 10
CASE_LIMIT_S = 4 * PG_TIMEOUT_S + 30
WITHIN_S = 10.0


def _try(fn):
    """(exception or None, seconds, value)"""
    t0 = time.monotonic()
    try:
        v = fn()
        return None, time.monotonic() - t0, v
    except Exception as e:  # noqa: BLE001 - the outcome
        return e, time.monotonic() - t0, None


def _name(e) -> str:
    return "returned" if e is None else type(e).__name__


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(ints[t.element_size()])


def _raises_within(e, dt, kind) -> tuple:
    ok = isinstance(e, kind) and dt < WITHIN_S
    return ok, f"{_name(e)} {dt:.1f}s"


class _Damage:
    """Flips one bit in the next send bound for rank ``to`` (on a copy) of the
    torch.distributed calls the collectives make."""

    def __init__(self, to: int, raw_too: bool = False) -> None:
        from zipccl_fsdp import collectives as C

        self.C, self.to, self.raw_too, self.fired = C, to, raw_too, 0
        self._a2a = dist.all_to_all_single
        dist.all_to_all_single = self._all_to_all

    def restore(self) -> None:
        dist.all_to_all_single = self._a2a

    def _all_to_all(self, output, input, output_split_sizes=None, input_split_sizes=None,
                    group=None, async_op=False):
        if not self.fired and (self.raw_too or input.dtype == torch.uint8):
            splits = input_split_sizes or [input.shape[0] // dist.get_world_size()] * \
                dist.get_world_size()
            row = input[0].numel() if input.dim() > 1 else 1
            start, n = sum(splits[:self.to]) * row, splits[self.to] * row
            if n:
                self.fired += 1
                input = input.clone()
                flat = input.view(-1)[start:start + n].view(torch.uint8)
                flat[flat.numel() // 2] ^= 1 << 3
        return self._a2a(output, input, output_split_sizes, input_split_sizes, group=group,
                         async_op=async_op)


# --------------------------------------------------------------------------
# Cases run on every rank: each returns (ok, outcome)
# --------------------------------------------------------------------------
def r1_ddp_failed_backward():
    from hook_failure_cases import backward_after_damage

    r = backward_after_damage()
    ok = (r["caught"] == "CorruptPayloadError" and r["elapsed"] < WITHIN_S and r["idle"]
          and r["probe"] == [3.0] * 4)
    return ok, (f"{r['caught']} {r['elapsed']:.1f}s, worker idle: {r['idle']}, "
                f"next all_reduce ok: {r['probe'] == [3.0] * 4}")


def r2_all_reduce_sizes_differ():
    x = torch.randn(8192 + dist.get_rank()).to(torch.bfloat16)
    e, dt, _ = _try(lambda: Z.all_reduce(x, config=ZipCCLConfig(policy="always", min_bytes=0)))
    return _raises_within(e, dt, ValueError)


def r3_check_consistency_differs():
    cfg = ZipCCLConfig(policy="always", min_bytes=0, check_consistency=dist.get_rank() == 0)
    x = torch.randn(8192).to(torch.bfloat16)
    e, dt, _ = _try(lambda: Z.all_reduce(x, config=cfg))
    return _raises_within(e, dt, ZipCCLConfigError)


def _a2a_overlap_outcomes(cfg) -> set:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = set()
    for trial in range(3):
        g = torch.Generator().manual_seed(10 * trial + rank)
        x = torch.randn(8, 512, generator=g).to(torch.bfloat16)
        want = torch.empty_like(x)
        dist.all_to_all_single(want, x.clone())
        for how in ("in place", "shifted"):
            if how == "in place":
                buf = x.clone()
                inp = outp = buf
            else:
                big = torch.empty(9, 512, dtype=x.dtype)
                big[:8] = x
                inp, outp = big[:8], big[1:]
            e, _, _ = _try(lambda: Z.all_to_all_single(outp, inp, config=cfg))
            if e is not None:
                out.add(f"{how}: {_name(e)}")
            else:
                out.add(f"{how}: {'exact' if torch.equal(_bits(outp), _bits(want)) else 'WRONG'}")
            dist.barrier()
    return out


def r4_all_to_all_overlap():
    policies = {"always": ZipCCLConfig(policy="always", min_bytes=0),
                "never": ZipCCLConfig(policy="never"),
                "adaptive raw": ZipCCLConfig(min_bytes=0, link_gbps=10000.0, codec_gbps=1.0)}
    parts, ok = [], True
    for name, cfg in policies.items():
        got = _a2a_overlap_outcomes(cfg)
        # One outcome per layout, the same every trial; never a wrong result.
        ok &= not any("WRONG" in g for g in got) and len(got) == 2
        parts.append(f"{name}: {', '.join(sorted(got))}")
    return ok, "; ".join(parts)


def r5_verify_raw_split():
    rank = dist.get_rank()
    cfg = ZipCCLConfig(policy="never", verify=True)
    x = torch.randn(2, 4096).to(torch.bfloat16)
    out = torch.empty_like(x)
    damage = _Damage(to=0, raw_too=True) if rank == 1 else None
    try:
        e, dt, _ = _try(lambda: Z.all_to_all_single(out, x, config=cfg))
    finally:
        if damage is not None:
            damage.restore()
    ok, outcome = _raises_within(e, dt, CorruptPayloadError)  # on every rank
    if rank == 1:
        return ok and damage.fired == 1, f"sent damaged ({damage.fired} sends): {outcome}"
    return ok, outcome


def r6_nan_payload_vs_pieces():
    rank = dist.get_rank()
    n = 2 * 65536 + 6
    x = torch.randn(n).to(torch.float16)
    pos = torch.arange(0, n, 3)  # dense: some fall in every piece's scalar tail
    x.view(torch.int16)[pos] = (0x7C01 + 37 * rank + pos % 200).to(torch.int16)
    outs = {}
    for pieces in (1, 2, 3, 7):
        out = torch.empty(n // 2, dtype=torch.float16)
        cfg = ZipCCLConfig(policy="always", min_bytes=0, pipeline_pieces=pieces)
        e, _, _ = _try(lambda: Z.reduce_scatter_single(out, x.clone(), config=cfg))
        if e is not None:
            return False, f"{pieces} pieces: {_name(e)}"
        outs[pieces] = _bits(out)
    diff = {p: int((outs[p] != outs[1]).sum()) for p in (2, 3, 7)}
    return all(v == 0 for v in diff.values()), f"elements differing from 1 piece: {diff}"


def r10_ops_differ():
    op = dist.ReduceOp.SUM if dist.get_rank() == 0 else dist.ReduceOp.AVG
    x = torch.randn(8192).to(torch.bfloat16)
    e, dt, _ = _try(lambda: Z.all_reduce(x, op=op, config=ZipCCLConfig(policy="always",
                                                                        min_bytes=0)))
    return _raises_within(e, dt, ValueError)  # a call argument, as sizes are


def r12_save_ddp_with_hook():
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    def build():
        torch.manual_seed(0)
        m = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
        m.register_comm_hook(None, Z.ZipCCLHook(ZipCCLConfig(policy="always", min_bytes=0)))
        return m

    def step(m):
        g = torch.Generator().manual_seed(dist.get_rank())
        m(torch.randn(8, 16, generator=g)).square().mean().backward()
        with torch.no_grad():
            for p in m.parameters():
                p -= 0.1 * p.grad
        return [_bits(p).clone() for p in m.parameters()]

    saved = build()
    buf = io.BytesIO()
    e, _, _ = _try(lambda: torch.save(saved, buf))
    if e is not None:
        return False, f"torch.save: {_name(e)}: {str(e)[:80]}"
    buf.seek(0)
    e, _, loaded = _try(lambda: torch.load(buf, weights_only=False))
    if e is not None:
        return False, f"torch.load: {_name(e)}"
    e, _, got = _try(lambda: step(loaded))
    if e is not None:
        return False, f"step after load: {_name(e)}: {str(e)[:80]}"
    want = step(build())
    same = all(torch.equal(a, b) for a, b in zip(got, want))
    return same, f"saved, loaded, trained: {'bit for bit' if same else 'DIFFERENT'}"


def r13_all_gather_sizes_differ():
    x = torch.randn(4096 + dist.get_rank()).to(torch.bfloat16)
    out = torch.empty(2 * 4096, dtype=x.dtype)
    e, dt, _ = _try(lambda: Z.all_gather_single(out, x, config=ZipCCLConfig(policy="always",
                                                                            min_bytes=0)))
    return _raises_within(e, dt, ValueError)


def r14_reduce_scatter_bad_output():
    x = torch.randn(8192).to(torch.bfloat16)
    out = torch.empty(4096 + dist.get_rank(), dtype=x.dtype)
    e, dt, _ = _try(lambda: Z.reduce_scatter_single(out, x, config=ZipCCLConfig(
        policy="always", min_bytes=0)))
    return _raises_within(e, dt, ValueError)


def r15_special_values_exact():
    """+-inf, both zeros, subnormals and NaN payloads through a compressed all_reduce
    with verify: the sum must be torch's fp32 sum, bit for bit."""
    rank = dist.get_rank()
    specials = torch.tensor([0x0000, 0x8000, 0x7F80, 0xFF80, 0x0001, 0x8001, 0x7FC1, 0x3F80],
                            dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = torch.randn(8192).to(torch.bfloat16)
    x[rank::7][:specials.numel()] = specials
    every = [torch.empty_like(x) for _ in range(2)]
    dist.all_gather(every, x)
    want = (every[0].float() + every[1].float()).to(torch.bfloat16)
    t = x.clone()
    e, _, _ = _try(lambda: Z.all_reduce(t, config=ZipCCLConfig(policy="always", min_bytes=0,
                                                               verify=True)))
    if e is not None:
        return False, _name(e)
    nan_w, nan_t = torch.isnan(want), torch.isnan(t)
    same = torch.equal(nan_w, nan_t) and torch.equal(_bits(t)[~nan_t], _bits(want)[~nan_w])
    return same, "exact (NaN positions and every other bit)" if same else "WRONG"


# --------------------------------------------------------------------------
# Cases run in this process
# --------------------------------------------------------------------------
def l7_forged_header():
    """A header with a valid CRC and lengths that add up to the payload's: 32 GiB
    of fp32 in a 32 MiB payload (its chunk table, zeros)."""
    from zipccl_fsdp import format as F

    p = Z.encode(torch.randn(4096 * 4))
    hdr = struct.Struct("<4sBBBBQII4QII")
    f = list(hdr.unpack(p[:F.HEADER_NBYTES].numpy().tobytes()))
    numel = 1 << 33
    f[4], f[5] = 1, numel  # ndim, numel
    f[7] = math.ceil(numel / f[6])  # nchunks, consistent with numel
    f[8:12] = [0, 0, 0, 0]  # no stream bytes
    f[12] = 0  # no checksums
    dims = struct.pack("<Q", numel)
    f[-1] = zlib.crc32(hdr.pack(*f[:-1], 0)[:F.HEADER_NBYTES - 4] + dims)
    forged = torch.zeros(F.HEADER_NBYTES + 8 + F.CHUNK_ENTRY_NBYTES * f[7], dtype=torch.uint8)
    forged[:F.HEADER_NBYTES + 8] = torch.frombuffer(bytearray(hdr.pack(*f) + dims),
                                                     dtype=torch.uint8)
    e, dt, _ = _try(lambda: Z.decode(forged))
    return isinstance(e, CorruptPayloadError), f"{_name(e)}: {str(e)[:70]}"


def l8_max_encoded_nbytes():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-32768, 32767, (4, 4, 4096), generator=g, dtype=torch.int16).view(
        torch.bfloat16)
    got, bound = Z.encode(x).numel(), Z.max_encoded_nbytes(x.numel(), x.dtype)
    bad = []
    for args in ((-1, torch.bfloat16), (1.5, torch.bfloat16)):
        e, _, _ = _try(lambda: Z.max_encoded_nbytes(*args))
        bad.append(isinstance(e, ValueError))
    e, _, _ = _try(lambda: Z.max_encoded_nbytes(16, torch.bfloat16, ndim=17))
    bad.append(isinstance(e, ValueError))
    ok = got <= bound and all(bad)
    return ok, (f"payload {got} B, bound {bound} B; ValueError for numel=-1, 1.5, ndim=17: "
                f"{bad}")


def l9_cpp_decode_overlap():
    if "cpp" not in Z.BACKENDS:
        return True, "no C++ backend"
    x = torch.randn(4096 * 3).to(torch.bfloat16)
    p = Z.encode(x, backend="cpp")
    buf = torch.zeros(p.numel() + x.numel() * 2 + 64, dtype=torch.uint8)
    buf[:p.numel()] = p
    out = buf[64:64 + x.numel() * 2].view(torch.bfloat16)  # overlaps the payload
    e, _, _ = _try(lambda: Z.decode(buf[:p.numel()], out=out, backend="cpp"))
    if e is None:
        ok = torch.equal(_bits(out), _bits(x))
        return ok, "decoded exactly" if ok else "WRONG"
    clear = isinstance(e, ValueError) and not isinstance(e, CorruptPayloadError)
    return clear, f"{_name(e)}: {str(e)[:70]}"


def l11_process_exit():
    import torch.multiprocessing as mp

    import exit_soak

    ctx = mp.get_context("spawn")
    codes = [exit_soak.one_run(ctx, 2, True) for _ in range(2)]
    ok = all(c == 0 for run in codes for c in run)
    return ok, f"rank exit codes of 2 runs: {codes}"


def l16_truncated_payload():
    p = Z.encode(torch.randn(4096 * 2 + 5).to(torch.bfloat16), verify=True)
    cuts = sorted({1, 8, 40, p.numel() // 2, p.numel() - 1})
    got = []
    for c in cuts:
        e, _, _ = _try(lambda: Z.decode(p[:c].clone()))
        got.append(_name(e))
    return all(g == "CorruptPayloadError" for g in got), f"cuts {cuts}: {sorted(set(got))}"


def l17_bad_config():
    got = []
    for kw in ({"policy": "bogus"}, {"min_bytes": -1}, {"codec": "zstd"}):
        e, _, _ = _try(lambda: ZipCCLConfig(**kw))
        got.append(isinstance(e, ValueError))
    return all(got), f"ValueError for policy='bogus', min_bytes=-1, codec='zstd': {got}"


CASES = [
    ("1", "DDP backward after a damaged bucket (verify)", "ranks", r1_ddp_failed_backward),
    ("2", "all_reduce, numel 8192 vs 8193", "ranks", r2_all_reduce_sizes_differ),
    ("3", "check_consistency True vs False", "ranks", r3_check_consistency_differs),
    ("4", "all_to_all, output overlaps input", "ranks", r4_all_to_all_overlap),
    ("5", "verify=True, raw split damaged", "ranks", r5_verify_raw_split),
    ("6", "fp16 NaN payloads vs pipeline pieces", "ranks", r6_nan_payload_vs_pieces),
    ("7", "decode of a forged 32 GiB header", "local", l7_forged_header),
    ("8", "max_encoded_nbytes, 3-D tensor, bad args", "local", l8_max_encoded_nbytes),
    ("9", "C++ decode, out overlaps payload", "local", l9_cpp_decode_overlap),
    ("10", "ranks pass SUM vs AVG", "ranks", r10_ops_differ),
    ("11", "2 ranks exit after create/destroy", "local", l11_process_exit),
    ("12", "torch.save / load of DDP with hook", "ranks", r12_save_ddp_with_hook),
    ("13", "all_gather, numel differs", "ranks", r13_all_gather_sizes_differ),
    ("14", "reduce_scatter, wrong output numel", "ranks", r14_reduce_scatter_bad_output),
    ("15", "all_reduce of inf/zeros/subnormal/NaN", "ranks", r15_special_values_exact),
    ("16", "decode of truncated payloads", "local", l16_truncated_payload),
    ("17", "ZipCCLConfig with bad values", "local", l17_bad_config),
]


def _ready() -> bool:
    return True


def _on_ranks(fn, init_file: str):
    """Run ``fn`` on this rank; its (ok, outcome). Then replace the default
    process group by a fresh one (``init_file``): a failed case can leave the
    old one out of step, and every case must start in step."""
    import datetime

    e, _, res = _try(fn)
    ok, outcome = res if e is None else (False, f"harness: {_name(e)}: {str(e)[:100]}")
    rank, world = dist.get_rank(), dist.get_world_size()
    from zipccl_fsdp import background

    if hasattr(background, "stop"):
        background.stop(timeout_s=PG_TIMEOUT_S)
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    return ok, outcome


def main(argv=None) -> int:
    from dist_utils import DistPool, DistPoolError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="case numbers to run")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.only or c[0] in args.only]
    pool = DistPool(2, pg_timeout_s=PG_TIMEOUT_S)
    rdv = tempfile.TemporaryDirectory(prefix="zipccl_faults_")
    rows, started = [], False
    t_all = time.monotonic()
    try:
        for num, title, where, fn in cases:
            t0 = time.monotonic()
            if where == "local":
                e, _, res = _try(fn)
                ok, outcome = res if e is None else (False, f"harness: {_name(e)}: {e}")
            else:
                if not started:  # spawning the ranks is not the case's time
                    pool.run(_ready, timeout_s=600)
                    started, t0 = True, time.monotonic()
                try:
                    got = pool.run(_on_ranks, fn, os.path.join(rdv.name, f"case{num}"),
                                   timeout_s=CASE_LIMIT_S)
                    ok = all(g[0] for g in got)
                    outcome = " / ".join(f"r{r}: {g[1]}" for r, g in enumerate(got))
                except DistPoolError as err:  # the pool is closed: the next case respawns it
                    ok, outcome = False, "HANG or crash: " + str(err).splitlines()[0][:150]
                    started = False
            dt = time.monotonic() - t0
            rows.append((num, title, "pass" if ok else "FAIL", outcome, dt))
            print(f"| {num} | {title} | {'pass' if ok else 'FAIL'} | {outcome} | {dt:.1f} |",
                  flush=True)
    finally:
        pool.close()
        rdv.cleanup()
    print(f"\nfault_matrix: {sum(r[2] == 'pass' for r in rows)}/{len(rows)} pass, "
          f"{time.monotonic() - t_all:.0f} s in all")
    return 0 if all(r[2] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
