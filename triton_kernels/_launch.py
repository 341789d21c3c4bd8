"""Launch a compiled kernel without triton's per-call argument binding.

``kernel[grid](*args, **constexprs)`` binds every argument by name, computes
triton's specialization key (each pointer's 16-byte alignment, each int's
width, divisibility by 16 and equality to 1), looks the compiled kernel up,
builds launch metadata and only then calls the driver's launcher. For a
codec call of a few launches that host work is larger than the kernels of a
few-MB shard. ``Launcher`` fixes a kernel's constexprs and warps once, keeps
the compiled kernel per specialization it has seen, and on later calls
computes the same key from the positional arguments and calls the
compiled kernel's launcher directly (the call ``JITFunction.run`` ends with).

The first call with a new specialization goes through ``kernel[grid]``, so
compiling, triton's caches and its checks stay triton's. Under the
interpreter (``TRITON_INTERPRET=1``, CPU tensors) and when a launch hook is
installed (profilers such as proton read launch metadata) every call takes
that path too.

``Launcher.by_address`` launches with every pointer argument given as its
address (an int), which the compiled launcher takes as it is: the caller then
builds no tensor views for the kernel's pointers (a dtype view, a split of a
scratch buffer), and the launcher reads no ``data_ptr`` back. The tensors
are built only when triton's path runs (a new specialization, the
interpreter, a hook).

``Launcher.bind(fixed)`` is ``by_address`` for launches whose last runtime
arguments are the same ints every call (a codec plan's geometry: numel,
chunk count, offsets): their part of the specialization key and the
launcher's argument tail are computed once, so a call keys only its leading
arguments (the addresses and any int that varies per call).
"""
from __future__ import annotations

from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

_I32 = (-(1 << 31), 1 << 31)
# False: every call through kernel[grid] (benchmarks/triton_launch_host.py
# times both ways side by side).
DIRECT = True


def _hooked(rt=knobs.runtime) -> bool:
    """Whether a launch hook is installed (triton keeps empty hook chains)."""
    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
    return bool((enter is not None and getattr(enter, "calls", True))
                or (leave is not None and getattr(leave, "calls", True)))


def _key(device: int, args: tuple) -> tuple:
    """What triton specializes the runtime arguments on (see the module
    docstring): a tensor's dtype and 16-byte alignment; an int's equality
    to 1, divisibility by 16 and 32-bit range."""
    key = [device]
    for a in args:
        if type(a) is int:
            key.append(1 if a == 1 else (a % 16 == 0, _I32[0] <= a < _I32[1]))
        else:
            key.append((a.dtype, a.data_ptr() % 16 == 0))
    return tuple(key)


def _head_key(device: int, head: tuple) -> int:
    """A key of int arguments at least as fine as ``_key``'s, cheaper: each
    argument a 7-bit code (for an int of at least 2**31, every address in
    practice, never 1 nor 32-bit, its low 4 bits; else those, whether it is
    32-bit and whether it is 1) packed into one int after the device. For
    heads of one length (a ``Bound``'s calls) distinct codes give distinct
    keys; a finer key than triton's only means a second entry for the same
    compiled kernel."""
    key = device
    for a in head:
        key = key << 7 | (a & 15 if a >= _I32[1] else
                          (16 | a & 15 | (a == 1) << 5) if a >= _I32[0] else 64 | a & 15)
    return key


class Launcher:
    """``kernel`` with fixed constexprs and warps: ``launcher(grid, *args)``
    launches ``grid`` programs (1-D) with the runtime arguments in the
    kernel's order: tensors and Python ints."""

    def __init__(self, kernel, constexprs, num_warps: int):
        self.kernel = kernel
        self.constexprs = dict(constexprs)
        self.num_warps = num_warps
        self.compiled_path = isinstance(kernel, JITFunction)
        if self.compiled_path:
            # The launcher takes every parameter, constexprs included, in order;
            # the runtime arguments come first in this package's kernels.
            params = kernel.params
            first = next((i for i, p in enumerate(params) if p.is_constexpr), len(params))
            assert all(p.is_constexpr for p in params[first:]), kernel
            self.n_runtime = first
            self.tail = tuple(self.constexprs[p.name] if p.name in self.constexprs
                              else p.default for p in params[first:])
        self._compiled: dict = {}
        self._by_addr: dict = {}  # by_address's key -> the entry of _compiled
        self._ptr_dtypes = None  # by_address: each argument's dtype (None: an int)

    def __call__(self, grid: int, *args) -> None:
        if not (self.compiled_path and DIRECT) or _hooked():
            self.kernel[(grid,)](*args, num_warps=self.num_warps, **self.constexprs)
            return
        device = driver.active.get_current_device()
        key = _key(device, args)
        hit = self._compiled.get(key)
        if hit is None:
            assert len(args) == self.n_runtime, (self.kernel, len(args))
            compiled = self.kernel[(grid,)](*args, num_warps=self.num_warps, **self.constexprs)
            if hasattr(compiled, "result"):  # an async compile's future
                compiled = compiled.result()
            self._compiled[key] = (compiled.run, compiled.function, compiled.packed_metadata)
            return
        run, function, packed = hit
        run(grid, 1, 1, driver.active.get_current_stream(device), function, packed, None,
            None, None, *args, *self.tail)

    def by_address(self, grid: int, args: tuple, tensor_args, *parts) -> None:
        """Launch ``grid`` programs with ``args``, the runtime arguments with
        each pointer given as its address (``data_ptr()``, an int);
        ``tensor_args(*parts)`` gives the same arguments with tensors, and is
        called only when triton's path runs.

        The key is ``_key`` of ``args``, with an address specialized as an int
        (its 16-byte alignment and range), so a pointer's dtype is not in it:
        every call of one Launcher must pass the same dtype at each pointer
        position (a codec's plan fixes them; checked whenever the tensors are
        built)."""
        if not (self.compiled_path and DIRECT) or _hooked():
            self(grid, *tensor_args(*parts))
            return
        device = driver.active.get_current_device()
        key = _key(device, args)
        hit = self._by_addr.get(key)
        if hit is None:
            tensors = tensor_args(*parts)
            self._check_addresses(args, tensors)
            self(grid, *tensors)
            self._by_addr[key] = self._compiled[_key(device, tensors)]
            return
        run, function, packed = hit
        run(grid, 1, 1, driver.active.get_current_stream(device), function, packed, None,
            None, None, *args, *self.tail)

    def bind(self, fixed: tuple) -> "Bound":
        """Launches of this kernel whose runtime arguments end with ``fixed``
        (ints); see ``Bound``."""
        return Bound(self, fixed)

    def _check_addresses(self, args: tuple, tensors: tuple) -> None:
        """That ``args`` are ``tensors`` with addresses for pointers, and that
        each position's dtype is the one of this Launcher's earlier calls."""
        assert len(args) == len(tensors) == self.n_runtime, (self.kernel, len(args))
        dtypes = tuple(None if type(t) is int else t.dtype for t in tensors)
        assert all(a == (t if d is None else t.data_ptr())
                   for a, t, d in zip(args, tensors, dtypes)), (self.kernel, args)
        if self._ptr_dtypes is None:
            self._ptr_dtypes = dtypes
        assert dtypes == self._ptr_dtypes, (self.kernel, dtypes, self._ptr_dtypes)


class Bound:
    """``launcher.by_address`` with the trailing int arguments ``fixed``:
    ``bound(grid, head, tensor_args, *parts)`` launches with the runtime
    arguments ``head + fixed`` (pointers in ``head`` as addresses).

    The compiled kernel is kept per key of ``head`` alone (``_head_key``):
    ``fixed``'s part of triton's specialization is the same every call. A
    new key goes through ``launcher.by_address`` (its checks, then triton's
    path) and keeps what that found."""
    __slots__ = ("launcher", "fixed", "_tail", "_hits")

    def __init__(self, launcher: Launcher, fixed: tuple):
        assert all(type(a) is int for a in fixed), fixed
        self.launcher = launcher
        self.fixed = tuple(fixed)
        self._tail = self.fixed + (launcher.tail if launcher.compiled_path else ())
        self._hits: dict = {}

    def __call__(self, grid: int, head: tuple, tensor_args, *parts) -> None:
        launcher = self.launcher
        if not (launcher.compiled_path and DIRECT) or _hooked():
            launcher(grid, *tensor_args(*parts))
            return
        active = driver.active
        device = active.get_current_device()
        key = _head_key(device, head)
        hit = self._hits.get(key)
        if hit is None:
            args = head + self.fixed
            launcher.by_address(grid, args, tensor_args, *parts)
            self._hits[key] = launcher._by_addr[_key(device, args)]
            return
        run, function, packed = hit
        run(grid, 1, 1, active.get_current_stream(device), function, packed, None, None, None,
            *head, *self._tail)
