"""A real slow link on one machine: a network namespace of our own whose
loopback is rate-limited with ``tc``. Processes started with ``prefix()``
talk over that loopback, so gloo traffic between them crosses the limit.

Only the loopback inside a namespace this module created is ever shaped;
the namespace is deleted on exit, after an error, Ctrl-C or SIGTERM.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from contextlib import contextmanager


def can_shape() -> tuple[bool, str]:
    """(True, "") when namespaces and tc can be used, else (False, why)."""
    if os.geteuid() != 0:
        return False, "not root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"'{tool}' is not installed"
    return True, ""


def _run(*cmd: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")


class SlowLink:
    """A namespace ``name`` with loopback shaped to ``rate`` (tc syntax, e.g.
    "1gbit"; None = unshaped). ``prefix()`` runs a command inside it."""

    def __init__(self, rate: str | None):
        self.rate = rate
        self.name = f"zipccl-{uuid.uuid4().hex[:8]}"

    def prefix(self) -> list:
        return ["ip", "netns", "exec", self.name]

    def create(self) -> None:
        _run("ip", "netns", "add", self.name)
        try:
            _run("ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up")
            if self.rate:
                # A 256 KB burst (2 ms at 1 Gbit/s): the loopback sends 64 KB GSO
                # packets, which tbf drops at a 64 KB burst (gloo then stalls); a
                # larger one would let more of each call through unshaped. The
                # latency bounds the queue.
                _run("ip", "netns", "exec", self.name, "tc", "qdisc", "add", "dev", "lo",
                     "root", "tbf", "rate", self.rate, "burst", "256kb", "latency", "50ms")
        except Exception:
            self.delete()
            raise

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


@contextmanager
def slow_link(rate: str | None):
    """Yield a created SlowLink; delete its namespace however the block ends."""
    link = SlowLink(rate)
    link.create()
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):  # turn SIGTERM into an exception so finally runs
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: rely on finally alone
        previous = None
    try:
        yield link
    finally:
        link.delete()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
