"""Deterministic per-rank data, so every rank can compute what every peer holds.

``rank_data`` is a hash of (tag, rank, element index): any sub-range can be produced without
the rest, so checking one rank's chunk of a reduction costs only that chunk.
"""
from __future__ import annotations

import time
import zlib

import numpy as np
import pytest

def ranks(*ns: int, slow_from: int = 32) -> list:
    """Rank counts for ``@pytest.mark.parametrize("n", ranks(...))``: those of ``slow_from`` ranks
    and more carry the ``slow`` mark, so the fast tier (``pytest -m "not slow"``, docs/testing.md)
    keeps the small jobs of every test and the suite keeps them all."""
    return [pytest.param(n, marks=pytest.mark.slow) if n >= slow_from else n for n in ns]


DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64,
          np.uint16, np.uint32, np.uint64]


def _hash(tag: str, rank: int, start: int, stop: int) -> np.ndarray:
    # in place, one array: a 32-rank job's ranks spend half their time making each other's data
    h = np.arange(start, stop, dtype=np.uint64)
    h += np.uint64(zlib.crc32(f"{tag}/{rank}".encode()))
    h *= np.uint64(0x9E3779B97F4A7C15)
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(32)
    return h


def rank_data(rank: int, count: int, dtype, tag: str, reduce_op: str | None = None,
              start: int = 0, stop: int | None = None) -> np.ndarray:
    """Elements [start, stop) of the ``count`` values rank ``rank`` contributes to case ``tag``.

    Floats for ``prod`` stay near 1 so that 32-way products neither overflow nor underflow.
    """
    stop = count if stop is None else stop
    dt = np.dtype(dtype)
    h = _hash(f"{tag}/{count}/{dt.str}", rank, start, stop)
    if dt.kind == "b":
        h &= np.uint64(1)
        return h.astype(dt)
    if dt.kind in "iu":                         # the low bits, two's complement for signed types
        return h.astype(dt, casting="unsafe", copy=False)
    f = (h % np.uint64(256) if reduce_op == "prod" else h % np.uint64(65536)).astype(np.float64)
    if reduce_op == "prod":                     # 1 + (k - 128) / 1024
        f -= 128.0
        f /= 1024.0
        f += 1.0
    else:                                       # k / 8192 - 4
        f /= 8192.0
        f -= 4.0
    return f.astype(dt, copy=False)


def place(a: np.ndarray, in_hbm: bool) -> np.ndarray:
    """``a`` copied into this rank's HBM (zero copy for the library), or as a plain numpy array
    (the staged path)."""
    if not in_hbm:
        return a.copy()
    import stratacl
    h = stratacl.empty(a.shape, a.dtype)
    h[...] = a
    return h


def attempt(fn):
    """``(exception class name, message)`` of what ``fn()`` raised, or None if it returned."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the caller inspects whatever was raised
        return type(e).__name__, str(e)
    return None


def after_peer_gave_up(flag, deadline_s: float = 120.0) -> None:
    """Return once the peer that waits for this rank has written ``flag`` (a file) to say its
    own timeout fired: the late rank then arrives for certain after it, whatever the host's
    load, with no sleep setting the pace (the loop only polls, under a deadline)."""
    deadline = time.monotonic() + deadline_s
    while not flag.exists():
        assert time.monotonic() < deadline, "the waiting rank never reported its timeout"
        time.sleep(0.05)
