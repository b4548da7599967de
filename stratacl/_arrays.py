"""Arrays in HBM and the per-rank counters: the functions ``stratacl`` re-exports."""
from __future__ import annotations

from typing import Any

import numpy as np

from .runtime._world import NATIVE_CALLS
from .runtime._world import runtime as _runtime


def empty(shape, dtype=np.float32) -> np.ndarray:
    """A numpy array in this rank's HBM (uninitialised). Freed back to the cache when unreferenced."""
    return _runtime().empty(shape, dtype)


def zeros(shape, dtype=np.float32) -> np.ndarray:
    """A zero-filled numpy array in this rank's HBM."""
    a = _runtime().empty(shape, dtype)
    a.fill(0)
    return a


def empty_like(a: np.ndarray, dtype=None) -> np.ndarray:
    """An HBM array with the shape (and dtype, unless given) of ``a``."""
    return _runtime().empty(a.shape, a.dtype if dtype is None else dtype)


def memory_stats() -> dict[str, Any]:
    """Caching-allocator counters of this rank (bytes held by arrays, cached, segments mapped...)."""
    return _runtime().allocator.stats()


def empty_cache() -> int:
    """Release every cached HBM segment no array uses; returns the bytes released."""
    return _runtime().allocator.empty_cache()


def stats() -> dict[str, Any]:
    """Counters of this rank: calls per operation, bytes pulled/staged/written, registration."""
    rt = _runtime()
    out = dict(rt.stats)
    calls = out["calls"] = dict(rt.stats["calls"])
    for name, count in zip(NATIVE_CALLS, rt.native_calls):
        if count:
            calls[name] = calls.get(name, 0) + count
    c = rt.byte_counters
    out["bytes_pulled"] = sum(k.pulled for k in c)
    out["bytes_local"] = sum(k.local for k in c)
    out["output_bytes_written"] = sum(k.written for k in c)
    out["registration"] = rt.reg.stats()
    out["memory"] = rt.allocator.stats()
    if rt.config.clock != "off":
        out["clock"] = rt.clock.stats()
    if rt.sdma is not None:
        out["sdma"] = dict(rt.sdma.counters)
    return out
