"""Argument checks shared by the communicator's operations."""
from __future__ import annotations

import numpy as np


def _expect(cond: bool, message, kind: type = ValueError) -> None:
    """Raise ``kind(message)`` unless ``cond``; ``message`` may be a callable, built only on failure."""
    if not cond:
        raise kind(message() if callable(message) else message)


def _flat(a: np.ndarray, operation: str, what: str, writable: bool = False) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{operation}: the {what} must be a numpy array, got {type(a).__name__}")
    if writable and not a.flags.writeable:
        raise ValueError(f"{operation}: the {what} array is read-only")
    if a.ndim == 1:          # the common case, without a new view
        return a
    return a.reshape(-1) if a.flags.c_contiguous else a


def _copy_back(x: np.ndarray, flat: np.ndarray) -> None:
    x[...] = flat.reshape(x.shape)
