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
    return a.reshape(-1) if a.flags.c_contiguous else a


class _Output:
    """A contiguous 1-D target for an output; non-contiguous outputs go through a copy."""

    def __init__(self, a: np.ndarray):
        self.a = a

    def __enter__(self) -> np.ndarray:
        if self.a.ndim == 1 and self.a.flags.c_contiguous:
            self.tmp = None
            return self.a
        self.tmp = np.ascontiguousarray(self.a).reshape(-1)
        return self.tmp

    def __exit__(self, *exc) -> None:
        if self.tmp is not None and exc[0] is None:
            self.a[...] = self.tmp.reshape(self.a.shape)


def _copy_back(x: np.ndarray, flat: np.ndarray) -> None:
    x[...] = flat.reshape(x.shape)
