"""StrataCL-emu: an emulated AI supernode on one Linux host, running StrataCL for real.

Inside a rank::

    import numpy as np, stratacl
    comm = stratacl.init()
    x = stratacl.empty((n,), dtype=np.float32)     # lives in this rank's HBM
    comm.all_reduce(x, op="sum")
    stratacl.finalize()

Nothing happens at import: no daemon, no shared memory, no threads until ``init()``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import ub as ub
from ._config import Config as Config
from ._config import SETTINGS as SETTINGS
from ._errors import BootstrapError as BootstrapError
from ._errors import CollectiveMismatch as CollectiveMismatch
from ._errors import CommTimeout as CommTimeout
from ._errors import ConfigError as ConfigError
from ._errors import OutOfMemory as OutOfMemory
from ._errors import PeerFailure as PeerFailure
from ._errors import RankFailure as RankFailure
from ._errors import RegistrationError as RegistrationError
from ._errors import StrataError as StrataError
from ._spawn import spawn as spawn
from .runtime._comm import Communicator as Communicator
from .runtime._world import finalize as finalize
from .runtime._world import init as init
from .runtime._world import is_initialized as is_initialized
from .runtime._world import runtime as _runtime

__version__ = "0.1.0"

__all__ = [
    "BootstrapError", "CollectiveMismatch", "CommTimeout", "Communicator", "Config", "ConfigError",
    "OutOfMemory", "PeerFailure", "RankFailure", "RegistrationError", "SETTINGS", "StrataError",
    "config", "empty", "empty_cache", "empty_like", "finalize", "init", "is_initialized", "memory_stats",
    "spawn", "stats", "ub", "zeros",
]


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
    out["calls"] = dict(rt.stats["calls"])
    out["registration"] = rt.reg.stats()
    out["memory"] = rt.allocator.stats()
    return out


def __getattr__(name: str):
    if name == "config":
        return _runtime().config
    raise AttributeError(f"module 'stratacl' has no attribute {name!r}")
