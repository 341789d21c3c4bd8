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

Order: every rank must issue the collectives of one communicator in the
same order. One thread that runs calls first in, first out keeps each rank's
program order among zipccl's calls, and ``submit(..., here=True)`` (the DDP
hook's calibrating call) waits until the worker has run every earlier job,
then runs the call on the caller's thread. But zipccl is not the only caller
on a group while the worker runs: DDP's reducer all-reduces its
used-parameter map from autograd's thread once the last bucket is handed
over (``find_unused_parameters``, the first iteration of ``static_graph``),
autograd runs the backward of ``torch.distributed.nn.functional``
collectives between buckets, and the user issues collectives as soon as
backward returns. A worker's call on that group would land among them in a
different place on each rank. So a call submitted here runs over
``own_group(group)``, zipccl's process group with the same ranks, which no
one else uses (the DDP hook passes that group to its calls, in place or
not).

Completion: a raw call's pending ``Work`` is waited on a second thread of
zipccl's (``zipccl-completions``), which then completes the future; no
Python callback is ever attached to a CPU backend's future, so gloo's worker
threads run no Python of zipccl's (a callback, or the release of the
callback and its value, which take the GIL on that thread).

Shutdown: nothing needs a call of the user's. zipccl holds no strong
reference to a process group (the worker and the completion thread drop a
finished call before waiting for the next; the collectives' caches are
weak; its own groups are held by torch's registry only), so
``torch.distributed.destroy_process_group`` destroys the backend and joins
gloo's worker threads when nothing else holds the group. That matters:
torch releases a tensor's Python object from whichever thread drops the
last C++ reference to it, and a gloo worker drops its ``Work``'s tensors
(taking the GIL) just after the waiter on that Work has been released. If
the interpreter starts to finalize before that thread gets the GIL,
CPython ends the thread with ``pthread_exit`` inside a ``noexcept`` C++
frame, and the process aborts (``terminate called without an active
exception``, SIGABRT). ``stop()``, also run at interpreter exit before
finalization, runs the queued calls, waits their Works, ends both threads,
drops the caches (``runtime.release_groups``) and waits until gloo's worker
threads are idle, for a group something else still holds (a DDP model
does, even once deleted).

CUDA: the call runs on a stream of the worker's, made to wait at submission
for the caller's current stream (an event), and the future names the
result's device, so ``wait()`` on it makes the waiting stream wait for the
call's kernels. Under CUDA graph capture nothing may leave the capturing
stream: ``submit`` runs the call on the caller's thread (it goes raw there,
``collectives.dispatch.capturing``).
"""
from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import weakref
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from . import runtime as _runtime
from ._layout import stream_per_device

_lock = threading.Lock()
_worker: "_Worker | None" = None
_completer: "_Completer | None" = None
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
            job = None  # its call holds a process group: not while waiting for the next
            with _lock:
                self.pending -= 1


class _Completer:
    """One daemon thread that waits pending CPU Works in the order they were
    handed over and completes each one's future (so that the future's
    callbacks run here, on a thread of zipccl's, never on gloo's)."""

    def __init__(self) -> None:
        self.items: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="zipccl-completions", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.items.get()
            if item is None:  # stop(): every Work before it has been waited
                return
            work, result, fut = item
            item = None  # nothing of a done call is held while waiting for the next
            try:
                work.get_future().wait()  # raises what the collective failed with
            except BaseException as e:  # noqa: BLE001 - it belongs to whoever waits on fut
                fut.set_exception(e)
            else:
                fut.set_result(result)
            work = result = fut = e = None


def _after_fork_in_child() -> None:
    # A forked child inherits the worker objects but not their threads, and
    # _lock as it was at the fork (a worker may have held it): start over.
    global _lock, _worker, _completer
    _lock = threading.Lock()
    _worker = None
    _completer = None
    _STREAMS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _the_worker() -> _Worker:
    """The process's worker, started on first use."""
    global _worker
    with _lock:
        if _worker is None:
            _worker = _Worker()
        return _worker


def _the_completer() -> _Completer:
    """The process's completion thread, started on first use."""
    global _completer
    with _lock:
        if _completer is None:
            _completer = _Completer()
        return _completer


_OWN_GROUPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""The caller's process group -> a weak reference to zipccl's group with its
ranks (torch's registry of groups holds that group, and drops it in
``destroy_process_group``)."""


def own_group(group=None):
    """zipccl's process group with the ranks, backend and timeout of ``group``
    (None: the default group), for the collectives this module runs off the
    caller's thread; ``group`` itself on a rank outside it.

    The first call for a group creates it, collectively over the ranks of
    ``group`` only (through the store, so no collective on any group is
    involved): every rank of ``group`` must make that first call at the same
    point of its program, as a DDP comm hook's first bucket is on every rank.
    Calls on it never share an order with the caller's: DDP's reducer,
    autograd and the user issue collectives on ``group`` while the worker
    runs its calls (see the module docstring).

    With NCCL and a device bound to the default group (eager init), torch
    makes a new group by splitting the default group's communicator, which
    every rank of the default group must join: there the first call must be
    made on every rank of the default group (a DDP model on a subgroup
    reaches it on the subgroup's ranks only)."""
    group = group if group is not None else _c10d._get_default_group()
    if dist._rank_not_in_group(group):
        return group
    ref = _OWN_GROUPS.get(group)
    ours = ref() if ref is not None else None
    if ours is None or ours not in _c10d._world.pg_map:
        ours = _new_group_like(group)
        _OWN_GROUPS[group] = weakref.ref(ours)
    return ours


def _new_group_like(group):
    """A new process group with ``group``'s ranks, backend and timeout, named
    after it (the same name on every rank, unique while ``group`` lives),
    registered with torch as ``new_group`` registers one, so that
    ``destroy_process_group()`` ends it."""
    name = f"zipccl:{group.group_name}"
    for pg, registered in _c10d._world.pg_names.items():
        if registered == name:
            return pg
    ranks = dist.get_process_group_ranks(group)
    timeout = group._get_backend(group._device_types[0]).options._timeout
    ours, _ = _c10d._new_process_group_helper(
        len(ranks), dist.get_rank(group), ranks, dist.get_backend(group),
        _c10d._get_default_store(), name, timeout=timeout, group_desc=name)
    _c10d._world.pg_group_ranks[ours] = {r: i for i, r in enumerate(ranks)}
    return ours


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
        if work is None:
            return _done(result)
        if cuda:  # the child future carries the Work's stream dependencies
            return work.get_future().then(lambda _: result)
        fut = torch.futures.Future()
        _complete(work, result, fut)
        return fut
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
    """End zipccl's threads cleanly; return whether everything ended within
    ``timeout_s``. Nothing needs it (see the module docstring); it runs at
    interpreter exit.

    In order: run every job submitted so far, wait for the ``Work`` each
    returned, end both threads (a later ``submit`` starts new ones), drop
    zipccl's references to process groups (``runtime.release_groups``), and
    wait until gloo's worker threads are idle (``_settle_backend_threads``):
    see the module docstring for why. At interpreter exit it runs before
    finalization begins. A failure of a call belongs to whoever
    waits on its future and is not raised here."""
    global _worker, _completer
    deadline = time.monotonic() + timeout_s
    with _lock:
        worker, _worker = _worker, None
    futures: list = []
    if worker is not None:
        worker.put(None)  # runs after every job before it; no job follows it
        worker.thread.join(max(0.0, deadline - time.monotonic()))
        if worker.thread.is_alive():  # a call is stuck: its future would never complete
            return False
        with _lock:
            futures, worker.futures = worker.futures, []
    with _lock:  # after the worker: no job of its hands over a Work any more
        completer, _completer = _completer, None
    if completer is not None:
        completer.items.put(None)
        completer.thread.join(max(0.0, deadline - time.monotonic()))
        if completer.thread.is_alive():  # a Work never completes
            return False
    for fut in futures:
        try:
            fut.wait()
        except BaseException:  # noqa: BLE001 - the waiter's to handle
            pass
    _runtime.release_groups()
    return _settle_backend_threads(max(0.0, deadline - time.monotonic()))


_BACKEND_THREADS = ("pt_gloo_runloop",)
"""Name prefixes of the backend threads that run a Work and then release its
tensors (torch names gloo's workers ``pt_gloo_runloop``)."""


def _settle_backend_threads(timeout_s: float, poll_s: float = 0.02) -> bool:
    """Return once no backend worker thread (``_BACKEND_THREADS``) can still be
    about to take the GIL: every one of them sleeping, at two readings
    ``poll_s`` apart, each after the GIL was free for ``poll_s`` (this thread
    sleeps meanwhile). A worker that was waiting for the GIL has taken it
    then and is running; one still busy with a Work's tail is running or
    runnable; a sleeping one waits for work. Return False if that is not
    reached within ``timeout_s`` (a collective still in flight). Reads
    ``/proc/self/task`` (Linux); elsewhere it frees the GIL for a few polls
    and returns True. Without such threads (no gloo group alive) it returns
    at once."""
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        time.sleep(3 * poll_s)
        return True
    if _backend_threads_sleeping(tasks) is None:
        return True
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < 2:
        time.sleep(poll_s)
        quiet = quiet + 1 if _backend_threads_sleeping(tasks) is not False else 0
        if quiet < 2 and time.monotonic() > deadline:
            return False
    return True


def _backend_threads_sleeping(tasks: str) -> "bool | None":
    """Whether every backend worker thread of this process is asleep (state S);
    None when there is none."""
    found = None
    for tid in os.listdir(tasks):
        try:
            with open(f"{tasks}/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended
            continue
        name_end = stat.rfind(b")")
        name = stat[stat.find(b"(") + 1:name_end].decode(errors="replace")
        if name.startswith(_BACKEND_THREADS):
            if stat[name_end + 2:name_end + 3] not in (b"S", b"Z", b"X"):
                return False
            found = True
    return found


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
    """Complete ``fut`` with ``result`` when ``work`` (None: nothing to wait for)
    has: here if it is complete, else on the completion thread (a callback on
    the Work's future would run on the backend's thread; see the module
    docstring)."""
    if work is None:
        fut.set_result(result)
        return
    done = work.get_future()
    if not done.done():
        _the_completer().items.put((work, result, fut))
        return
    try:
        done.wait()  # raises what the collective failed with
    except BaseException as e:  # noqa: BLE001 - it belongs to whoever waits on fut
        fut.set_exception(e)
        return
    fut.set_result(result)


def _stream(device: torch.device):
    return stream_per_device(_STREAMS, device)
