"""Host time of one Triton launch of the codec kernels, measured without a GPU.

What ``kernel[grid](...)`` costs the host in triton's Python (argument
binding, specialization, the compiled-kernel cache lookup, launch metadata)
before the driver's launch: a stand-in driver names sm_90 as the target,
loads no binary and launches nothing. The real launcher's C call (a few us
on a GPU machine) is not included. The kernels are compiled for sm_90 on
first use (triton's cache makes later runs quick). Prints us per launch,
median of 5 x 2000 launches after a warm-up, for 3 rounds.

    python benchmarks/triton_launch_host.py
"""
from __future__ import annotations

import os
import statistics
import sys
import time

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("triton_launch_host: unset TRITON_INTERPRET; this times the compiled-kernel path")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from zipccl_fsdp import format as F  # noqa: E402


class _Utils:
    @staticmethod
    def load_binary(name, kernel, shared, device):
        return None, None, 0, 0, 1024  # module, function, registers, spills, max threads

    @staticmethod
    def get_device_properties(device):
        return {"max_shared_mem": 232448}


class _NoLaunchDriver:
    """The parts of triton's CUDA driver that a launch reads, for sm_90."""
    utils = _Utils()

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    @staticmethod
    def launcher_cls(src, metadata):
        return lambda *args: None


def launches(codec: str = "fixed3") -> dict:
    """The four launches of a 256 MiB bf16 encode and decode, with the
    launchers' own constexprs and warps (the tensors are small: a launch
    reads their addresses, not their sizes)."""
    from triton_kernels import codec_decode as D
    from triton_kernels import codec_encode as E
    C, numel = F.CHUNK_ELEMS, 128 << 20
    nch = F.nchunks_for(numel, C)
    info = F.dtype_info(torch.bfloat16)
    x = torch.zeros(1 << 16, dtype=torch.int16)
    meta = torch.zeros((16, E.META_COLS), dtype=torch.int32)
    seg = torch.zeros(64, dtype=torch.int32)
    cum = torch.zeros(64, dtype=torch.int64)
    out = torch.zeros(1 << 16, dtype=torch.uint8)
    err = torch.zeros(1, dtype=torch.int32)
    (an, a_const, a_w), (wr, w_const, w_w) = E.launch_plan(info, codec, C)
    a_const = E.with_pairs(an, a_const, info, numel, C, x.data_ptr())
    w_const = E.with_pairs(wr, w_const, info, numel, C, x.data_ptr())
    dk, d_const, d_w = D.launch_plan(info, codec, C)
    table = dict(CODEC=F.CODEC_IDS[codec], ITEMSIZE=2, EXP_BITS=8, BLOCK=D.TABLE_BLOCK)
    return {
        "encode: analyze": lambda: an[(nch,)](x, meta, seg, numel, nch, C, num_warps=a_w,
                                              **a_const),
        "encode: write": lambda: wr[(nch,)](x, meta, seg, cum, out, numel, nch, C, 96, 4096,
                                            num_warps=w_w, **w_const),
        "decode: table": lambda: D._table_kernel[(triton.cdiv(nch, D.TABLE_BLOCK),)](
            out, cum, err, 96, nch, numel, C, **table),
        "decode: decode": lambda: dk[(nch,)](out, cum, cum, x, err, 96, nch, numel, C, 4096,
                                             1, 2, 3, 4, num_warps=d_w, **d_const),
    }


def main() -> None:
    driver.set_active(_NoLaunchDriver())
    fns = launches()
    for fn in fns.values():
        fn()  # compile (or load from triton's cache)
    print("triton launch, host time per launch in us (no-op launcher; "
          f"triton {triton.__version__}, median of 5 x 2000)")
    for rnd in range(3):
        row = []
        for name, fn in fns.items():
            for _ in range(200):
                fn()
            times = []
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(2000):
                    fn()
                times.append((time.perf_counter() - t) / 2000 * 1e6)
            row.append(f"{name} {statistics.median(times):.1f}")
        print(f"  round {rnd}: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main()
