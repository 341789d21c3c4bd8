"""Run torch's own DDP tests without and with zipccl's DDP comm hook, and compare.

The tests are pytorch's, from the pytorch source tree of the installed torch
(https://github.com/pytorch/pytorch at tag ``v<torch version>``; this script
fetches nothing). Give it the root of that tree, or a folder laid out like
it, holding:

* ``test/distributed/test_distributed_spawn.py`` (``spawn``): runs the DDP
  block of ``torch/testing/_internal/distributed/distributed_test.py``
  (installed with torch) with ``BACKEND=gloo WORLD_SIZE=2``;
* ``test/distributed/algorithms/ddp_comm_hooks/test_ddp_hooks.py``
  (``hooks``, and ``hooks_cpu``: a copy of it that runs on CPU, below);
* ``test/distributed/test_c10d_gloo.py`` (``c10d_gloo``, optional: its DDP
  tests; it imports ``test_c10d_common.py`` from the same folder).

torch's test utilities import ``expecttest`` (in pytorch's test
requirements): install it, or ``pip install --target DIR expecttest`` and
put DIR on ``PYTHONPATH``.

Each file runs twice under pytest, once as it is and once with
``ZIPCCL_TORCH_TESTS_INJECT=1``, which makes every Python process (the
spawned ranks too: a ``sitecustomize.py`` on ``PYTHONPATH`` calls
``inject()`` below) register a ``ZipCCLHook`` on every DDP model the tests
build that has no comm hook of its own, as a user would: on the model's
process group (``zipccl_fsdp.register_comm_hook(model, hook)``), before the
model's first forward. A test that registers a hook itself
(``register_comm_hook``, a builtin hook, DDP's mixed precision or fused
optimizer, which register one) keeps its own: DDP takes one per model. The
script prints, per file and run, the pass / skip / fail counts, how many of
the passing tests had a bucket reduced (and sent compressed) by zipccl's
hook, and the tests whose outcome differs; it exits 1 if a test that passes
without the hook does not pass with it.

Examples (pytorch checked out at the tag of the installed torch)::

    PYTHONPATH=$PWD:DIR python tools/torch_ddp_tests.py ~/pytorch
    PYTHONPATH=$PWD:DIR python tools/torch_ddp_tests.py ~/pytorch --runs zipccl \
        --config '{"policy": "always", "min_bytes": 0}' --work W   # compressed buckets
    # with two GPUs or more: the whole DDP block
    PYTHONPATH=$PWD:DIR python tools/torch_ddp_tests.py ~/pytorch --files spawn \
        -k "ddp or DistributedDataParallel"
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

FILES = {
    "spawn": "test/distributed/test_distributed_spawn.py",
    "hooks": "test/distributed/algorithms/ddp_comm_hooks/test_ddp_hooks.py",
    "c10d_gloo": "test/distributed/test_c10d_gloo.py",
}
# test_ddp_hooks.py's tests all need two accelerators; "hooks_cpu" is a copy
# of it, written into the work folder, whose tests run on CPU with gloo: the
# same tests with the accelerator requirements taken out and the models left
# on CPU (these text replacements must each apply, or the copy is not made).
CPU_HOOKS_EDITS = (
    ("    @requires_accelerator_dist_backend()\n", ""),
    ("    @skip_if_lt_x_gpu(2)\n", ""),
    ("device_id = gpus_for_rank(self.world_size)[self.rank][0]", 'device_id = "cpu"'),
    ("device_ids=[device_id],", "device_ids=None,"),
)
# The tests of distributed_test.py's DDP block that run without GPUs: the
# others of ``-k "ddp or DistributedDataParallel"`` (79 in torch 2.13) carry
# ``skip_if_lt_x_gpu``/``skip_if_no_gpu`` (or are skipped outright) and are
# skipped by each rank before they build a model, with or without the hook;
# on a machine with two GPUs or more pass that wider -k. Two tests named for
# neither also train DDP models on CPU: the static graph API and no_sync.
SPAWN_CPU = ("test_DistributedDataParallelCPU or test_DistributedDataParallel_requires_grad "
             "or test_ddp_create_graph or test_ddp_logging_data_cpu "
             "or test_dump_DDP_relevant_env_vars or test_static_graph_api_cpu "
             "or test_grads_same_across_ranks_with_no_sync")
# test_c10d_gloo.py's DDP tests, its comm hook tests among them, are the class
# DistributedDataParallelTest: its own and those it takes from
# test_c10d_common.py's CommonDistributedDataParallelTest (about 40, of which
# a dozen run without GPUs; the others are skipped by each rank).
DEFAULT_K = {
    "spawn": SPAWN_CPU,
    "hooks": "",
    "hooks_cpu": "",
    "c10d_gloo": "DistributedDataParallel",
}


# --------------------------------------------------------------------------
# In the test processes
# --------------------------------------------------------------------------
def inject() -> None:
    """Make every DDP model without a comm hook of its own register a
    ``ZipCCLHook`` (config from ``ZIPCCL_TORCH_TESTS_CONFIG``, JSON keyword
    arguments of ``ZipCCLConfig``) on its process group before its first
    forward; log, at exit, per process, the test, the models hooked and the
    buckets zipccl reduced to ``ZIPCCL_TORCH_TESTS_LOG``."""
    import atexit

    from torch.nn.parallel import DistributedDataParallel as DDP

    import zipccl_fsdp
    from zipccl_fsdp.config import ZipCCLConfig

    config = ZipCCLConfig(**json.loads(os.environ.get("ZIPCCL_TORCH_TESTS_CONFIG") or "{}"))
    hook = zipccl_fsdp.ZipCCLHook(config)
    counts = {"hooked": 0, "own_hook": 0, "late_own_hook": 0}
    installing = []

    def mark_own(register):
        def wrapper(self, *args, **kwargs):
            if not installing:
                if getattr(self, "_zipccl_injected", False):
                    # The test registers a hook after a forward that registered
                    # ours: DDP refuses a second one, which the test would not
                    # have met without us. Logged, so that its failure is read so.
                    counts["late_own_hook"] += 1
                self._zipccl_own_hook = True
                counts["own_hook"] += 1
            return register(self, *args, **kwargs)
        return wrapper

    DDP.register_comm_hook = mark_own(DDP.register_comm_hook)
    DDP._register_builtin_comm_hook = mark_own(DDP._register_builtin_comm_hook)
    forward = DDP.forward

    def forward_with_hook(self, *args, **kwargs):
        if not (getattr(self, "_zipccl_own_hook", False)
                or getattr(self, "_zipccl_injected", False)):
            self._zipccl_injected = True
            counts["hooked"] += 1
            # zipccl's registry: the hook on the model's own process group,
            # with a state that pickles with the model (torch.save of a DDP
            # model pickles its comm hooks and their states).
            installing.append(True)
            try:
                zipccl_fsdp.register_comm_hook(self, hook)
            finally:
                installing.pop()
        return forward(self, *args, **kwargs)

    DDP.forward = forward_with_hook
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
    log = os.environ.get("ZIPCCL_TORCH_TESTS_LOG")

    def report() -> None:
        if not log or not (counts["hooked"] or counts["own_hook"]):
            return
        st = hook.stats().get("all_reduce", {})
        with open(log, "a") as f:
            f.write(json.dumps({"test": test, "pid": os.getpid(),
                                "buckets": int(st.get("calls", 0)),
                                "compressed": int(st.get("compressed_calls", 0)),
                                **counts}) + "\n")

    atexit.register(report)


SITECUSTOMIZE = """\
import os, sys
if os.environ.get("ZIPCCL_TORCH_TESTS_INJECT") == "1":
    sys.path.insert(0, {tools!r})
    import torch_ddp_tests
    torch_ddp_tests.inject()
"""


# --------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------
def _outcomes(xml_path: str) -> dict[str, str]:
    """{test id: "passed" | "skipped" | "failed"} from pytest's JUnit XML."""
    out = {}
    if not os.path.exists(xml_path):
        return out
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        tags = {child.tag for child in case}
        out[name] = ("failed" if tags & {"failure", "error"} else
                     "skipped" if "skipped" in tags else "passed")
    return out


def _cpu_hooks_copy(root: str, work: str) -> str | None:
    """Write the CPU copy of test_ddp_hooks.py into ``work``; its path, or None
    (with the reason printed) when the source is missing or has changed."""
    src = os.path.join(root, FILES["hooks"])
    if not os.path.exists(src):
        print(f"[hooks_cpu] {FILES['hooks']} not under {root}: not run")
        return None
    text = open(src).read()
    for old, new in CPU_HOOKS_EDITS:
        if old not in text:
            print(f"[hooks_cpu] {FILES['hooks']} has no {old.strip()!r}: no CPU copy made")
            return None
        text = text.replace(old, new)
    path = os.path.join(work, "test_ddp_hooks_cpu.py")
    with open(path, "w") as f:
        f.write(text)
    return path


def _run(which: str, path: str, k: str, inject_on: bool, work: str, args) -> dict[str, str]:
    tag = f"{which}-{'zipccl' if inject_on else 'torch'}"
    xml = os.path.join(work, tag + ".xml")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (work, env.get("PYTHONPATH", "")) if p)
    env["ZIPCCL_TORCH_TESTS_INJECT"] = "1" if inject_on else "0"
    env["ZIPCCL_TORCH_TESTS_CONFIG"] = args.config
    env["ZIPCCL_TORCH_TESTS_LOG"] = os.path.join(work, tag + ".log")
    env.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", str(args.test_timeout))
    if which == "spawn":
        temp = tempfile.mkdtemp(dir=work)
        open(os.path.join(temp, "barrier"), "w").close()
        # A file init method, as each test's setUp sets one: the spawned ranks
        # import the test module under the same environment and must find the
        # same test class name (its name says whether INIT_METHOD is env://).
        env.update(BACKEND="gloo", WORLD_SIZE="2", TEMP_DIR=temp,
                   INIT_METHOD="file://" + os.path.join(temp, "init"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", xml,
           "-o", "junit_family=xunit2", path]
    if k:
        cmd += ["-k", k]
    print(f"[{tag}] {' '.join(cmd)}", flush=True)
    try:
        subprocess.run(cmd, env=env, cwd=work, timeout=args.timeout,
                       stdout=sys.stdout if args.verbose else subprocess.DEVNULL,
                       stderr=subprocess.STDOUT)
    except subprocess.TimeoutExpired:
        print(f"[{tag}] stopped after {args.timeout} s: the tests with no result are missing",
              flush=True)
    return _outcomes(xml)


def _hooked(log: str, key: str = "buckets") -> set[str]:
    """Tests in which zipccl's hook reduced at least one bucket (``key``
    "compressed": sent at least one compressed) on some rank."""
    out = set()
    if os.path.exists(log):
        for line in open(log):
            rec = json.loads(line)
            if rec.get(key, 0) > 0:
                out.add(rec["test"].rsplit("::", 1)[-1])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pytorch_root", help="root of a pytorch source tree (or a folder laid out "
                   "like it) at the installed torch's version")
    p.add_argument("--files", default="spawn,hooks,hooks_cpu",
                   help=f"comma list of {sorted(FILES) + ['hooks_cpu']}")
    p.add_argument("-k", default=None, help="pytest -k for every file (default: per file, "
                   + "; ".join(f"{w}: {k!r}" for w, k in DEFAULT_K.items()) + ")")
    p.add_argument("--config", default="{}", help="ZipCCLConfig keyword arguments, JSON "
                   "(default: the default config)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per pytest run")
    p.add_argument("--test-timeout", type=int, default=180,
                   help="seconds per test (DISTRIBUTED_TESTS_DEFAULT_TIMEOUT)")
    p.add_argument("--work", default=None, help="folder for the XML and logs (default: a new "
                   "temporary one)")
    p.add_argument("--runs", default="torch,zipccl", help="which runs to make; a run left "
                   "out is read from the XML an earlier call left in --work (two calls "
                   "with --runs torch and --runs zipccl may run at once)")
    p.add_argument("-v", "--verbose", action="store_true", help="show pytest's output")
    args = p.parse_args(argv)

    if args.runs.strip(","):
        for module in ("pytest", "expecttest"):
            if subprocess.run([sys.executable, "-c", f"import {module}"],
                              stderr=subprocess.DEVNULL).returncode:
                print(f"torch's tests need {module}, which {sys.executable} cannot import: "
                      f"pip install {module} (or --target DIR and DIR on PYTHONPATH)",
                      file=sys.stderr)
                return 2
    work = args.work or tempfile.mkdtemp(prefix="torch_ddp_tests.")

    os.makedirs(work, exist_ok=True)
    tools = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(work, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE.format(tools=tools))
    print(f"work folder: {work}; zipccl config: {args.config}", flush=True)

    rows, differ, late = [], [], []
    for which in args.files.split(","):
        if which == "hooks_cpu":
            path = _cpu_hooks_copy(args.pytorch_root, work)
            if path is None:
                continue
        else:
            path = os.path.join(args.pytorch_root, FILES[which])
            if not os.path.exists(path):
                print(f"[{which}] {FILES[which]} not under {args.pytorch_root}: not run")
                continue
        k = DEFAULT_K[which] if args.k is None else args.k
        base, ours = (_run(which, path, k, side == "zipccl", work, args)
                      if side in args.runs.split(",") else
                      _outcomes(os.path.join(work, f"{which}-{side}.xml"))
                      for side in ("torch", "zipccl"))
        log = os.path.join(work, f"{which}-zipccl.log")
        hooked, compressed = _hooked(log), _hooked(log, "compressed")
        late += sorted(_hooked(log, "late_own_hook"))
        for name, res in (("torch", base), ("zipccl hook", ours)):
            c = {o: sum(1 for v in res.values() if v == o) for o in ("passed", "skipped", "failed")}
            passed = [t.split("::")[-1] for t, v in res.items() if v == "passed"]
            rows.append((os.path.basename(path) if which == "hooks_cpu" else FILES[which], name,
                         len(res), c["passed"], c["skipped"], c["failed"],
                         sum(t in hooked for t in passed) if name != "torch" else "",
                         sum(t in compressed for t in passed) if name != "torch" else ""))
        for t in sorted(set(base) | set(ours)):
            if base.get(t) != ours.get(t):
                differ.append((t, base.get(t, "no result"), ours.get(t, "no result")))

    print("\n| file | run | tests | passed | skipped | failed | passed, hook reduced a bucket "
          "| passed, a bucket sent compressed |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print(f"\ntests whose outcome differs: {len(differ)}")
    for t, a, b in differ:
        print(f"  {t}: torch {a}, with zipccl's hook {b}")
    if late:
        print("tests that registered a hook of their own after a forward had registered "
              "zipccl's (DDP refuses a second: a failure there comes from the injection): "
              + ", ".join(late))
    return 1 if any(a == "passed" and b != "passed" for _, a, b in differ) else 0


if __name__ == "__main__":
    sys.exit(main())
