"""Arrays in HBM and the per-rank counters: the functions ``stratacl`` re-exports."""
from __future__ import annotations

from typing import Any

import numpy as np

from .runtime import NATIVE_CALLS, runtime as _runtime
from .runtime.memory import fmt_bytes, summary_table


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
    """This rank's HBM allocator statistics under ``torch.cuda.memory_stats()``'s names
    (``allocated_bytes.all.current``, ``reserved_bytes.large_pool.peak``, ``num_ooms``, ...),
    plus its registrations as an owner (``registered_bytes.all.current``,
    ``num_chunk_registrations``, ``deregistrations_in_flight``, ...). Every key is described in
    docs/memory.md. Local: no peer is involved."""
    rt = _runtime()
    out = rt.allocator.stats()
    out.update(rt.reg.memory_stats())
    return out


def memory_summary() -> str:
    """A table of ``memory_stats()``, as ``torch.cuda.memory_summary()`` prints. Local."""
    rt = _runtime()
    a = rt.allocator
    kind = a.kind + (f" (chunks of {_fmt(a.chunk)})" if a.kind == "expandable" else "")
    if a.kind == "caching" and rt.config.allocator == "expandable":
        kind += " (registration=pool rules out expandable)"
    s = memory_stats()
    notes = [f"allocator: {kind}", f"registration: {rt.config.registration}; HBM capacity {_fmt(a.hbm.capacity)}",
             f"registered: {_fmt(s['registered_bytes.all.current'])} now, {_fmt(s['registered_bytes.all.peak'])} "
             f"at peak", f"registrations: {s['num_registrations']} ({s['num_chunk_registrations']} chunks), "
             f"deregistrations: {s['num_deregistrations']}",
             f"in flight: {s['registrations_in_flight']} registrations to send, "
             f"{s['deregistrations_in_flight']} releases awaiting peers ({_fmt(s['deregistration_in_flight_bytes'])})"]
    return summary_table(s, f"StrataCL HBM memory summary, rank {rt.rank}", notes)


def reset_peak_memory_stats() -> None:
    """Set every ``*.peak`` of ``memory_stats()`` to its current value. Local."""
    rt = _runtime()
    rt.allocator.reset_peak()
    rt.reg.reset_peak()


def reset_accumulated_memory_stats() -> None:
    """Zero the accumulated ``*.allocated`` / ``*.freed`` fields, ``num_alloc_retries`` and
    ``num_ooms`` of the allocator's statistics. Local."""
    _runtime().allocator.reset_accumulated()


def empty_cache() -> int:
    """Unmap every cached HBM segment (caching) or chunk (expandable) no array uses; returns the
    bytes released. Peers unmap them in the background."""
    return _runtime().allocator.empty_cache()


def _fmt(n: int) -> str:
    return fmt_bytes(n)


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
    if rt.hosts.spanned:
        out["bytes_carried"] = rt.hosts.bytes_carried()
    out["memory"] = memory_stats()
    if rt.config.clock != "off":
        out["clock"] = rt.clock.stats()
    if rt.sdma is not None:
        out["sdma"] = dict(rt.sdma.counters)
    return out
