"""What zipccl learns at run time, kept apart from what the user sets.

A ``ZipCCLConfig`` is settings only (frozen, no caches). Everything the
collectives learn while they run lives in one ``Runtime`` per *owner*:

* the process groups whose ranks were found to agree on the config
  (``protocol.check_agreement``);
* the adaptive policy of the config: its calibration (measured speeds) and
  its running ratios and decisions (``policy.py``);
* the raw lanes of calls sure to go raw (``collectives/_lanes.py``).

The owner is whoever owns the ``CommStats`` a call counts into: a
``ZipCCLHook`` (FSDP2 and DDP), a ``DTensorCompression``, or, for the free
functions called without ``stats=``, the module's default
(``stats.MODULE_STATS``). The collectives reach it as ``stats.runtime``, so no
collective takes one more argument and every integration keeps its state in
the same place. Two owners never share state, whatever their configs. Within
an owner the state is per config *object* (``ConfigState``), as if it hung on
the config: a config made anew is checked and calibrated anew, and its state
goes when the config does, so a config made per call leaves nothing behind.

A ``Runtime`` holds process groups and is process-local: whatever pickles an
owner (a hook pickled with its model) leaves it out and starts a new one.
"""
from __future__ import annotations

import weakref

__all__ = ["Runtime", "ConfigState", "holds_groups", "release_groups"]

_RUNTIMES: "weakref.WeakSet" = weakref.WeakSet()
"""Every live ``Runtime`` (weakly: an owner's runtime goes with its owner)."""


class ConfigState:
    """One owner's state for one config object. It holds no reference to the
    config (the policy keeps an equal copy), so the state goes with the config."""

    __slots__ = ("checked_groups", "policy", "lanes")

    def __init__(self) -> None:
        self.checked_groups: set = set()
        """Group keys whose ranks agreed on the config (``protocol.check_agreement``)."""
        self.policy = None
        """The config's ``policy.Policy``, created at its first decision."""
        self.lanes: dict = {}
        """(kind, process group, dtype, device) -> raw lane (``collectives/_lanes.py``)."""


class Runtime:
    """The run-time state of one owner, per config object (see the module docstring)."""

    __slots__ = ("_states", "last", "__weakref__")

    def __init__(self) -> None:
        self._states: dict = {}   # id(config) -> (weakref to config, ConfigState)
        self.last: tuple = (None, None)
        """(config, state) of the last ``state`` call, read by the raw lanes."""
        _RUNTIMES.add(self)

    def state(self, config) -> ConfigState:
        """The state of ``config`` (created on first use, dropped when the config
        is). The last config asked for is answered at once."""
        last = self.last
        if last[0] is config:
            return last[1]
        key = id(config)
        entry = self._states.get(key)
        if entry is None or entry[0]() is not config:
            entry = self._states[key] = (weakref.ref(config, self._dropper(key)), ConfigState())
        self.last = (config, entry[1])
        return entry[1]

    def _dropper(self, key: int):
        """A weakref callback that forgets the state of a config once it is gone
        (it holds the runtime weakly: the states must not keep it alive either)."""
        runtime = weakref.ref(self)

        def drop(ref) -> None:
            rt = runtime()
            if rt is not None and rt._states.get(key, (None,))[0] is ref:
                del rt._states[key]
        return drop

    def states(self) -> list:
        """Every live config's state, in the order first used."""
        return [state for _, state in self._states.values()]


_GROUP_CACHES: list = []


def holds_groups(forget) -> None:
    """Register ``forget()``, which drops a module's own cached references to
    process groups, to be called by ``release_groups`` (each cache keeps its
    owner; this module need not know them)."""
    _GROUP_CACHES.append(forget)


def release_groups() -> None:
    """Drop every reference zipccl keeps to a process group: the raw lanes of
    every live runtime and the caches registered with ``holds_groups`` (the
    collectives' last group). Those references are weak, so no group's
    backend (and gloo's worker threads) outlives
    ``torch.distributed.destroy_process_group`` through them; this forgets
    them too. Later calls open their lanes and look their group up again."""
    for runtime in list(_RUNTIMES):
        for state in runtime.states():
            state.lanes.clear()
        runtime.last = (None, None)
    for forget in _GROUP_CACHES:
        forget()
