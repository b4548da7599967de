"""Argument checks shared by the communicator's operations."""
from __future__ import annotations

import numpy as np

from ...collectives import PLAN_COLUMNS
from .. import _native


def expect(cond: bool, message, kind: type = ValueError) -> None:
    """Raise ``kind(message)`` unless ``cond``; ``message`` may be a callable, built only on failure."""
    if not cond:
        raise kind(message() if callable(message) else message)


def dtype_of(a: np.ndarray, operation: str, what: str) -> np.dtype:
    """``a``'s dtype, once ``a`` is known to be an array (anything else is a TypeError, not an
    AttributeError from asking it for a dtype)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{operation}: the {what} must be a numpy array, got {type(a).__name__}")
    return a.dtype


def as_flat(a: np.ndarray, operation: str, what: str, writable: bool = False) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{operation}: the {what} must be a numpy array, got {type(a).__name__}")
    if writable and not a.flags.writeable:
        raise ValueError(f"{operation}: the {what} array is read-only")
    if a.ndim == 1:          # the common case, without a new view
        return a
    return a.reshape(-1) if a.flags.c_contiguous else a


def copy_back(x: np.ndarray, flat: np.ndarray) -> None:
    x[...] = flat.reshape(x.shape)


def aliased(out: np.ndarray, x: np.ndarray, in_place: tuple | None = None) -> bool:
    """Whether an operation writing ``out`` could change bytes of ``x`` that peers read in
    place (zero copy) during the call: they share memory, other than in the operator's
    in-place form, the pair ``in_place`` being the same bytes (all_gather: ``x`` and the rank's
    chunk of ``out``; reduce_scatter: ``out`` and the rank's chunk of ``x``). Such an input is
    staged, copied before anyone reads it, as MPI_IN_PLACE would take it."""
    if not np.may_share_memory(out, x):
        return False
    return in_place is None or not _exactly(*in_place)


def _exactly(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` is the same contiguous bytes as ``b``."""
    return (a.flags.c_contiguous and b.flags.c_contiguous and a.nbytes == b.nbytes
            and _native.data_address(a) == _native.data_address(b))


def fixed_address(a: np.ndarray, shape: tuple[int | None, ...]) -> int:
    """The address of an int64 array a native replay will read without asking for it (the
    replay's call holds the array): C-contiguous, ``shape`` (None: any extent)."""
    assert a.dtype == np.int64 and a.flags.c_contiguous and a.ndim == len(shape), a
    assert all(want is None or got == want for got, want in zip(a.shape, shape)), (a.shape, shape)
    addr = _native.data_address(a)
    assert addr != 0          # even an empty table has one: its phase's barrier still counts
    return addr


def fixed_table(t: np.ndarray | None) -> list[int]:
    """A compiled plan's table for a native replay: [address, rows], [0, 0] for none."""
    return [fixed_address(t, (None, PLAN_COLUMNS)), t.shape[0]] if t is not None else [0, 0]
