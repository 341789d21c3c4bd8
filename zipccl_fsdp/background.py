"""Collectives run off the caller's thread, in the order they were submitted.

A compressed collective waits on the host: for its size exchange (on a slow
link, for the previous bucket's payload still on the wire, since a group's
collectives run in order), and on CUDA for the encoder's stream lengths and
the decoder's error word. Called on autograd's thread, as DDP calls its comm
hook, that wait holds up the rest of backward: the bucket's transfer cannot
overlap the gradients still being computed, which DDP's own all-reduce does.

``submit(call, result)`` hands ``call`` to one worker thread per process and
returns a ``Future`` of ``result`` at once; the future completes when the
``Work`` that ``call`` returns has (a compressed call's has when the call
returns; a raw one's is torch's own, pending). DDP waits for every bucket's
future at the end of backward, so the calls overlap the rest of it.

Order: every rank must issue its collectives in the same order. One thread
that runs calls first in, first out keeps each rank's program order, so
calls are issued as they would be on the caller's thread. A caller must not
also issue collectives on the same group on its own thread while the worker
has jobs: ``idle()`` says when it has none, and ``submit(..., here=True)``
waits for that, then runs the call on the caller's thread. The DDP hook
does so for the call that calibrates the policy and, when idle, for calls
that go raw; DDP issues nothing else until it has waited for every bucket.

CUDA: the call runs on a stream of the worker's, made to wait at submission
for the caller's current stream (an event), and the future names the
result's device, so ``wait()`` on it makes the waiting stream wait for the
call's kernels. Under CUDA graph capture nothing may leave the capturing
stream: ``submit`` runs the call on the caller's thread (it goes raw there,
``collectives._capturing``).
"""
from __future__ import annotations

import atexit
import os
import queue
import threading
from typing import Callable

import torch

from ._layout import stream_per_device

_lock = threading.Lock()
_worker: "_Worker | None" = None
_STREAMS: dict = {}  # device index -> the worker's stream (used on the worker only)


class _Worker:
    """One daemon thread that runs submitted jobs first in, first out."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.pending = 0  # jobs put and not yet run (under _lock)
        self.futures: list = []  # futures of submitted calls, not yet seen done (under _lock)
        self.thread = threading.Thread(target=self._run, name="zipccl-collectives", daemon=True)
        self.thread.start()

    def put(self, job, fut: "torch.futures.Future | None" = None) -> None:
        with _lock:
            self.pending += 1
            if fut is not None:
                self.futures = [f for f in self.futures if not f.done()]
                self.futures.append(fut)
        self.jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:  # stop(): every job before it has run
                return
            job()  # a job never raises: _job reports into its future
            with _lock:
                self.pending -= 1


def _after_fork_in_child() -> None:
    # A forked child inherits the worker object but not its thread, and
    # _lock as it was at the fork (the worker may have held it): start over.
    global _lock, _worker
    _lock = threading.Lock()
    _worker = None
    _STREAMS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _the_worker() -> _Worker:
    """The process's worker, started on first use."""
    global _worker
    with _lock:
        if _worker is None:
            _worker = _Worker()
        return _worker


def submit(call: Callable[[], object], result: torch.Tensor, *,
           here: bool = False) -> torch.futures.Future:
    """Run ``call()`` (which returns a ``Work`` or None) on the worker thread
    after every job submitted before it; return a future that completes with
    ``result`` when that Work has, or with the exception ``call`` raised or the
    Work failed with.

    ``here=True`` runs ``call`` on this thread once the worker has run every
    job submitted before it, and raises what it raises: for a call that
    times things (nothing of the caller's may run beside it), or one that
    costs less than the hand-over. Under CUDA graph capture ``call`` runs
    here too (nothing may leave the capturing stream)."""
    cuda = result.is_cuda
    if here or (cuda and torch.cuda.is_current_stream_capturing()):
        drain()
        work = call()
        return _done(result) if work is None else work.get_future().then(lambda _: result)
    fut = torch.futures.Future(devices=[result.device] if cuda else None)
    ready = None
    if cuda:
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(result.device))
    _the_worker().put(lambda: _job(call, result, fut, ready), fut)
    return fut


def idle() -> bool:
    """Whether the worker has run every job submitted so far (the Works they
    returned may still be pending: their collectives are issued)."""
    with _lock:
        return _worker is None or _worker.pending == 0


def drain() -> None:
    """Return once ``idle()``: every job submitted so far has run."""
    worker = _worker
    if worker is None or idle():
        return
    done = threading.Event()
    worker.put(done.set)
    done.wait()


def stop(timeout_s: float = 60.0) -> bool:
    """Run every job submitted so far, wait for the ``Work`` each returned, and
    end the worker thread (a later ``submit`` starts a new one); return whether
    it ended within ``timeout_s``.

    Call it before ``torch.distributed.destroy_process_group``: a thread still
    inside a collective, or a ``Work`` still pending, while the process group
    is torn down or the process exits is what a backend's destructors cannot
    survive. It also runs at interpreter exit. A failure of a call belongs to
    whoever waits on its future and is not raised here."""
    global _worker
    with _lock:
        worker, _worker = _worker, None
    if worker is None:
        return True
    worker.put(None)  # runs after every job before it; no job follows it
    worker.thread.join(timeout_s)
    if worker.thread.is_alive():  # a call is stuck: its future would never complete
        return False
    with _lock:
        futures, worker.futures = worker.futures, []
    for fut in futures:
        try:
            fut.wait()
        except BaseException:  # noqa: BLE001 - the waiter's to handle
            pass
    return True


atexit.register(stop)


def _job(call, result: torch.Tensor, fut: torch.futures.Future, ready) -> None:
    try:
        if ready is None:
            _complete(call(), result, fut)
            return
        device = result.device
        with torch.cuda.device(device), torch.cuda.stream(_stream(device)):
            torch.cuda.current_stream().wait_event(ready)
            work = call()
            if work is not None:
                work.wait()  # NCCL: this stream waits for the collective's; the host does not
            fut.set_result(result)  # records an event on this stream for the waiter
    except BaseException as e:  # noqa: BLE001 - it belongs to whoever waits on fut
        if not fut.done():
            fut.set_exception(e)


def _done(result: torch.Tensor) -> torch.futures.Future:
    fut = torch.futures.Future(devices=[result.device] if result.is_cuda else None)
    fut.set_result(result)
    return fut


def _complete(work, result: torch.Tensor, fut: torch.futures.Future) -> None:
    """Complete ``fut`` with ``result`` when ``work`` (None: nothing to wait for) has."""
    if work is None:
        fut.set_result(result)
        return

    def forward(done: torch.futures.Future) -> None:
        try:
            done.value()  # raises what the collective failed with
        except BaseException as e:  # noqa: BLE001
            fut.set_exception(e)
            return
        fut.set_result(result)

    work.get_future().add_done_callback(forward)


def _stream(device: torch.device):
    return stream_per_device(_STREAMS, device)
