"""Prepared calls: the argument checks of a repeated call, made once and replayed.

    op(arrays, scalars)
        -> key (operation, id of each array, the scalars)
        -> remembered entry whose arrays are these very objects, with the same shape,
           strides, dtype and writability?
               yes: its checked arguments (dtype code, input address and segment, where the
                    output is written, the compiled plan), no checks run
               no:  the operation's checks run (a bad argument raises on every rank of the
                    call, as always); a zero-copy result is remembered
        -> the operation proper (descriptor, barriers, copies), the same either way

Programs call the same operation on the same arrays again and again (a training step, a
benchmark loop), and the checks before the first byte moves then give the same answer each
time. At N = 32 on two cores every microsecond of a rank's Python costs about 16 of the call
(docs/performance.md), and the checks were most of that Python. This is MPI's persistent
request (MPI_Send_init, MPI_Bcast_init) made implicit: nothing to call, nothing to free.
A remembered full-mesh call also carries its MeshCall (runtime/communicator/_mesh.py): the rest of the
call in one native call.

What may be remembered (the operation decides; ``reusable`` in its check):
- only zero-copy calls: inputs read in place from this rank's HBM by an array that holds its
  block (an array of ``stratacl.empty`` or a view of one, so the segment cannot be released
  while the array lives), outputs written in place. Staged arguments are checked and copied
  every call.
- only calls on the communicator's default path (``path=`` of a call is checked every time).

Entries hold weak references: remembering a call keeps no array (and no HBM) alive. An array
that died and a new one that took its ``id`` fail the identity test. The cache is bounded
(CACHE_LIMIT entries, cleared when full) like the compiled plans.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import numpy as np

CACHE_LIMIT = 64


def _layout(a: np.ndarray) -> tuple:
    return a.shape, a.strides, a.dtype, a.flags.writeable


class PreparedCall:
    """The checked arguments of one call, valid while its arrays are unchanged."""

    __slots__ = ("_refs", "_layouts", "args")

    def __init__(self, arrays: tuple, args: tuple):
        self._refs = tuple(weakref.ref(a) for a in arrays)
        self._layouts = tuple(_layout(a) for a in arrays)
        self.args = args

    def holds(self, arrays: tuple) -> bool:
        i = 0
        for a in arrays:        # _layout inlined: this runs on every call
            if self._refs[i]() is not a or (a.shape, a.strides, a.dtype, a.flags.writeable) != self._layouts[i]:
                return False
            i += 1
        return True


class PreparedCalls:
    """A communicator's remembered calls (see the module docstring)."""

    def __init__(self, limit: int = CACHE_LIMIT):
        self._entries: dict[tuple, PreparedCall] = {}
        self._limit = limit

    def get(self, key: tuple | None, arrays: tuple, check: Callable[..., tuple[tuple, bool]], *args: Any) -> tuple:
        """The checked arguments of a call on ``arrays``: remembered under ``key`` (None: do not
        remember), or ``check(*args)``'s, which returns them and whether they may be reused."""
        if key is not None:
            entry = self._entries.get(key)
            if entry is not None and entry.holds(arrays):
                return entry.args
        checked, reusable = check(*args)
        if key is not None and reusable:
            if len(self._entries) >= self._limit:
                self._entries.clear()
            self._entries[key] = PreparedCall(arrays, checked)
        return checked
