"""What zipccl learns at run time, kept apart from what the user sets.

A ``ZipCCLConfig`` is settings only (frozen, no caches). Everything the
collectives learn while they run lives in one ``Runtime`` per *owner*:

* the process groups whose ranks were found to agree on the config
  (``integrity.check_agreement``);
* the adaptive policy of the config: its calibration (measured speeds) and
  its running ratios and decisions (``policy.py``);
* the raw lanes of calls sure to go raw (``_raw_lanes.py``).

The owner is whoever owns the ``CommStats`` a call counts into: a
``ZipCCLHook`` (FSDP2 and DDP), a ``DTensorCompression``, or, for the free
functions called without ``stats=``, the module's default
(``stats.MODULE_STATS``). The collectives reach it as ``stats.runtime``, so no
collective takes one more argument and every integration keeps its state in
the same place. Two owners never share state, whatever their configs; within
one owner, equal configs share one ``ConfigState`` (the state is a function
of the settings and of what was measured, not of which config object was
passed).

A ``Runtime`` holds process groups and is process-local: whatever pickles an
owner (a hook pickled with its model) leaves it out and starts a new one.
"""
from __future__ import annotations

__all__ = ["Runtime", "ConfigState"]


class ConfigState:
    """One owner's state for one config value."""

    __slots__ = ("config", "checked_groups", "policy", "lanes")

    def __init__(self, config) -> None:
        self.config = config
        self.checked_groups: set = set()
        """Group keys whose ranks agreed on ``config`` (``integrity.check_agreement``)."""
        self.policy = None
        """The config's ``policy.Policy``, created at its first decision."""
        self.lanes: dict = {}
        """(kind, process group, dtype, device) -> raw lane (``_raw_lanes.py``)."""


class Runtime:
    """The run-time state of one owner, per config (see the module docstring)."""

    __slots__ = ("_states", "last")

    def __init__(self) -> None:
        self._states: dict = {}
        self.last: tuple = (None, None)
        """(config, state) of the last ``state`` call, read by the raw lanes."""

    def state(self, config) -> ConfigState:
        """The state of ``config`` (created on first use). The last config asked
        for is answered by identity: hashing a config costs more than a raw
        lane's whole lookup."""
        last = self.last
        if last[0] is config:
            return last[1]
        state = self._states.get(config)
        if state is None:
            state = self._states[config] = ConfigState(config)
        self.last = (config, state)
        return state

    def states(self) -> list:
        """Every config's state, in the order first used."""
        return list(self._states.values())

