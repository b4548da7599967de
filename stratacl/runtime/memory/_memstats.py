"""Memory statistics under the names of ``torch.cuda.memory_stats()``, and its summary table.

The allocators (``_allocator.py``, ``_expandable.py``) report every change to a ``MemoryStats``
as it happens; ``memory_stats()`` flattens it into torch's keys::

    <stat>.<pool>.<field>      stat: allocation, segment, active, allocated_bytes, reserved_bytes,
                                     active_bytes, inactive_split_bytes, requested_bytes
                                     and, here only, mapping (physical mappings)
                               pool: all, small_pool, large_pool
                               field: current, peak, allocated (sum of increases), freed (of decreases)
    num_alloc_retries, num_ooms, num_device_alloc, num_device_free

What each stat counts here:

- ``allocated_bytes`` / ``active_bytes``: bytes of live blocks (requests rounded up to 512 B);
  ``active`` equals ``allocated`` since there are no streams to wait for. ``requested_bytes``:
  the bytes asked for. ``allocation`` / ``active``: live blocks.
- ``reserved_bytes``: HBM mapped by the allocator: its segments (caching) or its mapped chunks
  (expandable). ``segment``: fixed segments (caching); for the expandable allocator the pools'
  ranges that have at least one chunk mapped (torch counts an expandable segment once too).
- ``inactive_split_bytes``: free bytes that ``empty_cache()`` cannot give back, because they
  share a segment (caching) or a chunk (expandable) with a live block. For a caching segment
  this is torch's "inactive, split" exactly (torch leaves expandable segments out of it).
- ``mapping``: physical mappings: segments (caching) or chunks (expandable); every one is a
  registration event. ``num_device_alloc`` / ``num_device_free`` count them as they are made
  and released, as torch counts cudaMalloc / cuMemMap and cudaFree / cuMemUnmap.
- ``num_alloc_retries``: allocations that had to release the cache and try again;
  ``num_ooms``: allocations that failed with OutOfMemory.
"""
from __future__ import annotations

from typing import Any

POOLS = ("all", "small_pool", "large_pool")
STATS = ("allocation", "segment", "active", "mapping", "allocated_bytes", "reserved_bytes", "active_bytes",
         "inactive_split_bytes", "requested_bytes")
FIELDS = ("current", "peak", "allocated", "freed")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")


class Stat:
    """One statistic of one pool, as torch's ``Stat``."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def add(self, delta: int) -> None:
        self.current += delta
        if delta > 0:
            self.allocated += delta
            if self.current > self.peak:
                self.peak = self.current
        else:
            self.freed -= delta


class MemoryStats:
    """The allocator's statistics; the allocator holds its lock while it updates them."""

    def __init__(self):
        self._stats = {name: (Stat(), Stat(), Stat()) for name in STATS}   # all, small, large
        self.counters = dict.fromkeys(COUNTERS, 0)

    def add(self, name: str, small: bool, delta: int) -> None:
        """Move ``name`` by ``delta`` in pool ``small`` and in the aggregate."""
        if delta:
            st = self._stats[name]
            st[0].add(delta)
            st[1 if small else 2].add(delta)

    def current(self, name: str, small: bool | None = None) -> int:
        return self._stats[name][0 if small is None else 1 if small else 2].current

    def set(self, name: str, small: bool, value: int) -> None:
        """Set ``name`` of pool ``small`` to ``value`` (the aggregate follows)."""
        self.add(name, small, value - self._stats[name][1 if small else 2].current)

    def reset_peak(self) -> None:
        for stats in self._stats.values():
            for s in stats:
                s.peak = s.current

    def reset_accumulated(self) -> None:
        for stats in self._stats.values():
            for s in stats:
                s.allocated = s.freed = 0
        self.counters["num_alloc_retries"] = self.counters["num_ooms"] = 0

    def as_dict(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, stats in self._stats.items():
            for pool, s in zip(POOLS, stats):
                for field in FIELDS:
                    out[f"{name}.{pool}.{field}"] = getattr(s, field)
        out.update(self.counters)
        return out


def _size(n: int, pref: int) -> str:
    """torch's ``_format_size``: the unit is chosen by ``pref`` (the row's peak)."""
    unit = "B  "
    for u in ("KiB", "MiB", "GiB", "TiB"):
        if pref < 768 * 1024:
            break
        unit, n, pref = u, n // 1024, pref / 1024
    return f"{n:6d} {unit}"


def _count(n: int, pref: int) -> str:
    unit = " "
    for u in ("K", "M"):
        if pref < 750 * 1000:
            break
        unit, n, pref = u, n // 1000, pref / 1000
    return f"{n:7d} {unit} "


def summary(stats: dict[str, Any], title: str, notes: list[str]) -> str:
    """The table ``torch.cuda.memory_summary()`` prints, over ``stats`` (memory_stats' dict)."""
    width = 75
    rule, double = "|" + "-" * width + "|", "|" + "=" * width + "|"
    lines = [double, "| " + title.center(width - 2) + " |", rule]
    for note in notes:
        lines.append("| " + note.ljust(width - 2)[:width - 2] + " |")
    lines.append(rule)
    lines.append("| " + f"OOMs: {stats['num_ooms']}".center(34) + " | "
                 + f"alloc retries: {stats['num_alloc_retries']}".center(36) + " |")
    lines += [double, "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |", rule]
    rows = (("Allocated memory", "allocated_bytes", _size), ("Active memory", "active_bytes", _size),
            ("Requested memory", "requested_bytes", _size), ("HBM reserved memory", "reserved_bytes", _size),
            ("Non-releasable memory", "inactive_split_bytes", _size), ("Allocations", "allocation", _count),
            ("Active allocs", "active", _count), ("HBM reserved segments", "segment", _count),
            ("HBM mappings", "mapping", _count))
    for label, name, fmt in rows:
        for pool, head in (("all", label), ("large_pool", "      from large pool"),
                           ("small_pool", "      from small pool")):
            vals = [stats[f"{name}.{pool}.{f}"] for f in FIELDS]
            pref = vals[1]
            cells = " | ".join(fmt(v, pref) for v in vals)
            lines.append(f"| {head:<21} | {cells} |")
        lines.append(rule)
    lines[-1] = double
    return "\n".join(lines)
