"""zipccl_fsdp/background.py: calls run on one worker thread, in submission
order, and their futures carry the result, the call's exception or the
Work's failure. (The DDP hook on real process groups: tests/test_ddp.py.)"""
from __future__ import annotations

import multiprocessing as mp
import threading

import pytest
import torch
import torch.distributed as dist

from zipccl_fsdp import background


class _Work(dist.Work):
    """A Work whose future the test completes or fails, as a backend's would."""

    def __init__(self, fut: torch.futures.Future) -> None:
        super().__init__()
        self.fut = fut

    def get_future(self) -> torch.futures.Future:
        return self.fut


def _work(fut: torch.futures.Future):
    return _Work(fut)


def test_calls_run_in_order_on_the_worker():
    ran, gate = [], threading.Event()
    result = torch.arange(3)

    def call(i):
        def run():
            if i == 0:
                gate.wait(timeout=10)  # everything else queues behind the first call
            ran.append((i, threading.current_thread().name))
        return run

    futs = [background.submit(call(i), result) for i in range(50)]
    assert not any(f.done() for f in futs)  # submit returned before the first call ran
    gate.set()
    for f in futs:
        assert f.wait() is result
    assert [i for i, _ in ran] == list(range(50))
    assert {name for _, name in ran} == {"zipccl-collectives"}


def test_a_failing_call_fails_its_future_only():
    def boom():
        raise ValueError("bad bucket")

    result = torch.zeros(2)
    bad = background.submit(boom, result)
    good = background.submit(lambda: None, result)
    with pytest.raises(ValueError, match="bad bucket"):
        bad.wait()
    assert good.wait() is result


def test_the_future_waits_for_a_pending_work():
    inner = torch.futures.Future()
    result = torch.ones(4)
    fut = background.submit(lambda: _work(inner), result)
    marker = background.submit(lambda: None, result)
    marker.wait()  # the worker has run the first call: its Work is pending
    assert not fut.done()
    inner.set_result([result])
    assert fut.wait() is result


def test_a_failed_work_fails_the_future():
    inner = torch.futures.Future()
    fut = background.submit(lambda: _work(inner), torch.ones(1))
    inner.set_exception(RuntimeError("gloo: connection closed"))
    with pytest.raises(RuntimeError, match="connection closed"):
        fut.wait()


def _in_child(q) -> None:
    try:
        out = background.submit(lambda: None, torch.full((2,), 7.0)).wait()
        q.put(out.tolist())
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put(repr(e))


def test_a_forked_child_gets_its_own_worker():
    background.submit(lambda: None, torch.zeros(1)).wait()  # the parent's worker runs
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_in_child, args=(q,))
    p.start()
    try:
        got = q.get(timeout=30)  # the inherited worker has no thread: it would hang
    finally:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    assert got == [7.0, 7.0]


def test_here_runs_on_the_caller_after_the_jobs_before_it():
    ran = []
    result = torch.zeros(1)

    def slow():
        threading.Event().wait(0.2)  # still running when the next call is submitted
        ran.append(("queued", threading.current_thread().name))

    queued = background.submit(slow, result)
    fut = background.submit(lambda: ran.append(("here", threading.current_thread().name)),
                            result, here=True)
    assert fut.done() and fut.wait() is result
    assert ran == [("queued", "zipccl-collectives"), ("here", threading.current_thread().name)]
    assert queued.wait() is result

    def boom():
        raise ValueError("calibration failed")

    with pytest.raises(ValueError, match="calibration failed"):  # raised to the caller
        background.submit(boom, result, here=True)


def test_idle_until_every_job_has_run():
    gate = threading.Event()
    fut = background.submit(lambda: gate.wait(timeout=10) and None, torch.zeros(1))
    assert not background.idle()  # a job is queued or running: a caller must not issue
    gate.set()
    fut.wait()
    deadline = threading.Event()
    for _ in range(100):  # the worker counts the job done just after completing its future
        if background.idle():
            break
        deadline.wait(0.01)
    assert background.idle()


def test_stop_runs_every_job_waits_for_its_work_and_ends_the_thread():
    gate, ran = threading.Event(), []
    inner = torch.futures.Future()
    result = torch.ones(2)
    background.submit(lambda: gate.wait(timeout=10) and None, result)
    pending = background.submit(lambda: ran.append("work") or _work(inner), result)
    thread = background._worker.thread
    stopper = threading.Thread(target=lambda: ran.append(background.stop(timeout_s=20)))
    stopper.start()
    gate.set()
    stopper.join(timeout=1.0)
    assert stopper.is_alive()  # the jobs have run, but the Work the second returned is pending
    assert ran == ["work"] and not thread.is_alive()
    inner.set_result([result])
    stopper.join(timeout=10)
    assert ran == ["work", True] and pending.wait() is result
    assert background.idle()
    assert background.submit(lambda: None, result).wait() is result  # a new worker starts
    assert background._worker.thread is not thread


# --------------------------------------------------------------------------
# Shutdown (see background.py's module docstring): no gloo thread is left
# touching Python when the interpreter finalizes.
# --------------------------------------------------------------------------
def _thread_name(native_id: int) -> str:
    with open(f"/proc/self/task/{native_id}/comm") as f:
        return f.read().strip()


def _gloo_workers() -> int:
    import os

    return sum(1 for tid in os.listdir("/proc/self/task")
               if _thread_name(int(tid)).startswith("pt_gloo_runloop"))


def _group_goes_with_destroy() -> tuple:
    """A gloo group that ran zipccl's all_reduce (raw and compressed): after
    stop() and destroy_process_group, is its backend gone (its workers joined)?"""
    import gc

    import zipccl_fsdp as Z

    before = _gloo_workers()
    group = dist.new_group(backend="gloo")
    for policy in ("never", "always"):
        x = torch.arange(4096, dtype=torch.float32) * (dist.get_rank() + 1)
        Z.all_reduce(x, group=group, config=Z.ZipCCLConfig(policy=policy, min_bytes=0))
    with_group = _gloo_workers()
    assert background.stop(timeout_s=30)
    dist.destroy_process_group(group)
    del group
    gc.collect()
    return before, with_group, _gloo_workers()


@pytest.mark.timeout(300)
def test_stop_leaves_no_reference_that_keeps_a_destroyed_group_alive(pool2):
    for before, with_group, after in pool2.run(_group_goes_with_destroy):
        assert with_group > before  # the group has workers of its own
        assert after == before  # its backend was destroyed: nothing of zipccl's held it


def _completion_threads() -> dict:
    """Where the callbacks of futures from ``submit`` run when the Work the call
    returns is gloo's and still pending (rank 1 joins the all-reduce late)."""
    import time

    names = {}
    for how, here in (("queued", False), ("here", True)):
        t = torch.ones(1 << 16)
        if dist.get_rank() == 1:
            time.sleep(0.5)
        fut = background.submit(lambda: dist.all_reduce(t, async_op=True), t, here=here)
        seen = fut.then(lambda f: (threading.current_thread().name,
                                   _thread_name(threading.get_native_id())))
        names[how] = seen.wait()
        assert torch.equal(fut.wait(), torch.full((1 << 16,), 2.0))
    assert background.stop(timeout_s=30)
    return names


@pytest.mark.timeout(300)
def test_a_pending_gloo_work_completes_its_future_on_a_zipccl_thread(pool2):
    names = pool2.run(_completion_threads)[0]  # rank 0: its Work was pending for 0.5 s
    assert not any(os_name.startswith("pt_gloo") for _, os_name in names.values()), names
    assert {how: py for how, (py, _) in names.items()} == {
        "queued": "zipccl-completions", "here": "zipccl-completions"}, names


def _named_spinner(name: bytes, spin_s: float, release: threading.Event):
    """A thread whose OS name is ``name``: it runs for ``spin_s``, then sleeps
    until ``release`` is set (as a backend worker runs a Work, then waits)."""
    import ctypes
    import time

    libc = ctypes.CDLL(None)
    started = threading.Event()

    def run():
        libc.prctl(15, name, 0, 0, 0)  # PR_SET_NAME, this thread only
        started.set()
        end = time.monotonic() + spin_s
        while time.monotonic() < end:
            pass
        release.wait(timeout=30)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(timeout=10)
    return thread


def test_settle_waits_while_a_backend_worker_runs():
    import time

    release = threading.Event()
    thread = _named_spinner(b"pt_gloo_runloop", 0.6, release)
    try:
        t0 = time.monotonic()
        assert background._settle_backend_threads(0.1) is False  # still running at the limit
        assert background._settle_backend_threads(20) is True
        assert time.monotonic() - t0 >= 0.5  # not before the worker went to sleep
        assert thread.is_alive()  # asleep, not ended
        t1 = time.monotonic()
        assert background._settle_backend_threads(20) is True
        assert time.monotonic() - t1 < 5
    finally:
        release.set()
        thread.join(timeout=10)


def test_settle_ignores_other_threads():
    import time

    release = threading.Event()
    thread = _named_spinner(b"not_a_backend", 3.0, release)
    try:
        t0 = time.monotonic()
        assert background._settle_backend_threads(2) is True
        assert time.monotonic() - t0 < 1.5  # it did not wait for the spinning thread
    finally:
        release.set()
        thread.join(timeout=20)
