"""HBM allocators: numpy arrays in HBM, physical events only when the cache cannot serve.

    stratacl.empty(...)
          |  malloc(n): best-fit free block of the request's pool  -> no physical event
          |  miss: grow = map more HBM (a physical event)
          v                      |
    Block (kept alive by the array)   +--> interception.segment_mapped(seg | chunk)   (registration unit)
          |  array freed -> block back to the cache                -> no physical event
          v
    empty_cache() / OOM retry: wholly free memory is unmapped
                                  +--> interception.segment_released(seg | chunk)

Two allocators share the blocks, pools and statistics (``HbmAllocator``), as torch's caching
allocator does with and without ``expandable_segments``:

- ``CachingAllocator`` (``allocator=caching``, and always with ``registration=pool``): a miss
  maps a new fixed segment, sized as torch sizes them: 2 MiB for requests of at most 1 MiB (the
  small pool), 20 MiB for requests under 10 MiB, the request rounded up to 2 MiB above. A free
  block is only reused for requests it can hold; a segment is unmapped when wholly free.
- ``ExpandableAllocator`` (``_expandable.py``, ``allocator=expandable``): each pool reserves an
  address range and maps chunks of HBM into it as it grows.

Requests are rounded up to 512 B; requests of at most 1 MiB come from the small pool, larger
ones from the large pool. ``memory_stats()`` keys: ``_memstats.py``.
"""
from __future__ import annotations

import bisect
import collections
import threading
import time
import weakref
from typing import Protocol

import numpy as np

from ..._errors import OutOfMemory
from ._hbm import Hbm
from ._memstats import MemoryStats
from ._window import PAGE, RangeAllocator, ShadowWindow, round_up

BLOCK_ROUND = 512
SMALL_LIMIT = 1024 * 1024
SMALL_SEGMENT = 2 * 1024 * 1024        # torch's kSmallBuffer
LARGE_SEGMENT = 20 * 1024 * 1024       # torch's kLargeBuffer: the segment of a request under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * 1024 * 1024     # torch's kMinLargeAlloc
ACK_WAIT = 10.0                        # seconds an allocation waits for peers to give back released HBM


class Interception(Protocol):
    def segment_mapped(self, seg) -> None: ...
    def segment_released(self, seg) -> None: ...


class Segment:
    """A fixed segment of the caching allocator: one physical event, one registration."""

    __slots__ = ("va", "size", "hbm_offset", "epoch", "small", "first", "live_blocks")

    def __init__(self, va: int, size: int, hbm_offset: int, epoch: int, small: bool):
        self.va, self.size, self.hbm_offset, self.epoch, self.small = va, size, hbm_offset, epoch, small
        self.first: Block | None = None
        self.live_blocks = 0

    def __repr__(self) -> str:
        return f"Segment(va={self.va:#x}, size={self.size}, hbm_offset={self.hbm_offset:#x}, epoch={self.epoch})"


class Block:
    """A run of addresses in a pool: live (an array's), free (mapped, cached) or, in an
    expandable range, unmapped. ``seg``: what a descriptor names for a live block (its segment,
    or its chunk or chunks)."""

    __slots__ = ("seg", "va", "size", "small", "free", "mapped", "prev", "next", "requested")

    def __init__(self, seg, va: int, size: int, small: bool, mapped: bool = True):
        self.seg, self.va, self.size, self.small, self.mapped = seg, va, size, small, mapped
        self.free = True
        self.prev: Block | None = None
        self.next: Block | None = None
        self.requested = 0

    def __repr__(self) -> str:
        state = "free" if self.free and self.mapped else "unmapped" if self.free else "live"
        return f"Block({state}, va={self.va:#x}, size={self.size})"


def absorb(left: Block, right: Block) -> None:
    """Merge ``right`` into its left neighbour ``left``."""
    left.size += right.size
    left.next = right.next
    if right.next is not None:
        right.next.prev = left


def fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class HbmAllocator:
    """What both allocators share: pools of blocks, best fit, split and coalesce, deferred frees,
    the OOM path and the statistics. Subclasses say how memory is mapped (``_grow``), released
    (``empty_cache``) and named to peers (``registration_of``)."""

    kind = ""

    def __init__(self, rank: int, window: ShadowWindow, hbm: Hbm, interception: Interception):
        self.rank, self.window, self.hbm, self.interception = rank, window, hbm, interception
        self.lock = threading.RLock()
        self._free = {True: [], False: []}   # small? -> sorted [(size, va, id, block)] of free mapped blocks
        self._epoch = 0
        self._dead: collections.deque = collections.deque()   # blocks whose arrays died, not yet freed
        self.mstats = MemoryStats()

    # --- blocks -----------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> Block:
        size = round_up(max(nbytes, 1), BLOCK_ROUND)
        small = size <= SMALL_LIMIT
        with self.lock:
            self._reap()
            block = self._take_free(size, small)
            try:
                if block is None:
                    block = self._grow(size, small)
                    if block is None:
                        self.mstats.counters["num_alloc_retries"] += 1
                        self.empty_cache()
                        block = self._grow(size, small, wait=self.hbm.awaiting_bytes > 0)
            except OutOfMemory as e:         # the HBM's pages could not be reserved (runtime/memory/_hbm.py)
                self.mstats.counters["num_ooms"] += 1
                raise OutOfMemory(f"rank {self.rank}: out of memory allocating {fmt_bytes(nbytes)}: {e}") from None
            if block is None:
                self.mstats.counters["num_ooms"] += 1
                raise OutOfMemory(f"rank {self.rank}: out of HBM allocating {fmt_bytes(nbytes)}"
                                  f"{self._oom_detail(size, small)}. Free arrays, or raise --hbm-size "
                                  f"(STRATACL_HBM_SIZE).")
            self._split(block, size)
            block.free = False
            block.requested = nbytes
            self._activate(block)
            s = self.mstats
            for name in ("allocation", "active"):
                s.add(name, small, 1)
            for name in ("allocated_bytes", "active_bytes"):
                s.add(name, small, block.size)
            s.add("requested_bytes", small, nbytes)
            self._sync_inactive(small)
            return block

    def free_later(self, block: Block) -> None:
        """Called when an array dies, which can happen inside any allocation (a garbage-collector
        pass), even inside ``malloc`` itself: only queue the block; the next call frees it."""
        self._dead.append(block)

    def _reap(self) -> None:
        while self._dead:
            self.free(self._dead.popleft())

    def free(self, block: Block) -> None:
        with self.lock:
            if block.free:
                return
            small = block.small
            s = self.mstats
            for name in ("allocation", "active"):
                s.add(name, small, -1)
            for name in ("allocated_bytes", "active_bytes"):
                s.add(name, small, -block.size)
            s.add("requested_bytes", small, -block.requested)
            self._deactivate(block)
            block.free = True
            block = self._coalesce(block)
            self._insert_free(block)
            self._sync_inactive(small)

    def _coalesce(self, block: Block) -> Block:
        """Merge ``block`` (free, mapped, in no free list) with free mapped neighbours."""
        nxt, prv = block.next, block.prev
        if nxt is not None and nxt.free and nxt.mapped:
            self._remove_free(nxt)
            absorb(block, nxt)
        if prv is not None and prv.free and prv.mapped:
            self._remove_free(prv)
            absorb(prv, block)
            block = prv
        return block

    def _take_free(self, size: int, small: bool) -> Block | None:
        lst = self._free[small]
        i = bisect.bisect_left(lst, (size, 0, 0))
        if i == len(lst):
            return None
        return lst.pop(i)[3]

    def _split_rest(self, block: Block, at: int) -> Block:
        """Cut ``block`` at offset ``at``; the tail is a new free block, returned, in no list."""
        tail = Block(block.seg, block.va + at, block.size - at, block.small, block.mapped)
        tail.prev, tail.next = block, block.next
        if block.next is not None:
            block.next.prev = tail
        block.next = tail
        block.size = at
        return tail

    def _cut(self, block: Block, lo: int, hi: int, keep) -> Block:
        """Split [lo, hi) out of ``block`` and return it; what is left before and after goes to
        ``keep``."""
        mid = block
        if lo > block.va:
            mid = self._split_rest(block, lo - block.va)
            keep(block)
        if hi < mid.va + mid.size:
            keep(self._split_rest(mid, hi - mid.va))
        return mid

    def _split(self, block: Block, size: int) -> None:
        if self._should_split(block, size):
            self._insert_free(self._split_rest(block, size))

    def _should_split(self, block: Block, size: int) -> bool:
        rest = block.size - size
        return rest >= BLOCK_ROUND if block.small else rest > SMALL_LIMIT

    def _insert_free(self, block: Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.va, id(block), block))

    def _remove_free(self, block: Block) -> None:
        lst = self._free[block.small]
        i = bisect.bisect_left(lst, (block.size, block.va, id(block)))
        assert lst[i][3] is block
        lst.pop(i)

    def _next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def _wait_for_acks(self, ready) -> bool:
        """Released HBM comes back once peers have unmapped it: wait a bounded time for
        ``ready()`` (called under the HBM's condition) to hold."""
        deadline = time.monotonic() + ACK_WAIT
        with self.hbm.cond:
            while True:
                if ready():
                    return True
                if not self.hbm._awaiting:
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.hbm.cond.wait(min(left, 0.05))

    # --- what subclasses define -------------------------------------------------------------
    def _grow(self, size: int, small: bool, wait: bool = False) -> Block | None:
        """Map more HBM so a free block of at least ``size`` exists; return it, out of the free
        list, or None when HBM (or address space) is short."""
        raise NotImplementedError

    def _activate(self, block: Block) -> None:
        """``block`` became live: name its registration in ``block.seg``, count releasability."""

    def _deactivate(self, block: Block) -> None:
        """``block`` is about to be freed."""

    def _releasable(self, small: bool) -> int:
        """Bytes of pool ``small`` that ``empty_cache`` would unmap now."""
        raise NotImplementedError

    def _oom_detail(self, size: int, small: bool) -> str:
        raise NotImplementedError

    def empty_cache(self) -> int:
        """Unmap every wholly free segment or chunk. Returns the bytes released."""
        raise NotImplementedError

    def registration_of(self, addr: int, nbytes: int):
        """What a descriptor names for [addr, addr + nbytes) of this rank's HBM (a segment, a
        chunk or a run of chunks: va, size, hbm_offset, epoch), or None if it is not mapped."""
        raise NotImplementedError

    # --- statistics -------------------------------------------------------------------------
    def _sync_inactive(self, small: bool) -> None:
        s = self.mstats
        s.set("inactive_split_bytes", small, s.current("reserved_bytes", small) - s.current("allocated_bytes", small)
              - self._releasable(small))

    def _mapped(self, small: bool, nbytes: int, mappings: int) -> None:
        s = self.mstats
        s.add("reserved_bytes", small, nbytes)
        s.add("mapping", small, mappings)
        s.counters["num_device_alloc" if mappings > 0 else "num_device_free"] += abs(mappings)

    def stats(self) -> dict:
        """``memory_stats()``'s allocator part (see _memstats.py), plus the HBM's capacity."""
        with self.lock:
            self._reap()
            out = self.mstats.as_dict()
            out["hbm_capacity_bytes"] = self.hbm.capacity
            return out

    def reset_peak(self) -> None:
        with self.lock:
            self.mstats.reset_peak()

    def reset_accumulated(self) -> None:
        with self.lock:
            self.mstats.reset_accumulated()


class CachingAllocator(HbmAllocator):
    """Fixed segments, cached: torch's caching allocator without expandable segments."""

    kind = "caching"

    def __init__(self, rank: int, window: ShadowWindow, hbm: Hbm, interception: Interception,
                 pool_va: int | None = None):
        super().__init__(rank, window, hbm, interception)
        self.pool_va = pool_va            # pool mode: HBM offset o lives at pool_va + o, mapped once
        self.va = RangeAllocator(window.slice_start(rank), window.slice_bytes)
        self._segments: list[Segment] = []   # sorted by va
        self._seg_starts: list[int] = []
        self._empty_bytes = {True: 0, False: 0}   # bytes of segments with no live block, per pool

    @staticmethod
    def segment_size(size: int) -> int:
        if size <= SMALL_LIMIT:
            return SMALL_SEGMENT
        if size < MIN_LARGE_ALLOC:
            return LARGE_SEGMENT
        return round_up(size, PAGE)

    def _grow(self, size: int, small: bool, wait: bool = False) -> Block | None:
        seg = self._map_segment(self.segment_size(size), small, wait)
        if seg is None:
            return None
        block = Block(seg, seg.va, seg.size, small)
        seg.first = block
        return block

    def _map_segment(self, size: int, small: bool, wait: bool = False) -> Segment | None:
        offset = self.hbm.alloc(size)
        if offset is None and wait:
            got = []
            if self._wait_for_acks(lambda: got.append(self.hbm.phys.alloc(size)) or got[-1] is not None):
                offset = got[-1]
                self.hbm.reserve(offset, size)
        if offset is None:
            return None
        if self.pool_va is not None:
            va = self.pool_va + offset
        else:
            va = self.va.alloc(size)
            if va is None:
                self.hbm.release_after_acks(-1, offset, size, set())
                return None
            self.window.map(va, size, self.hbm.fd, offset)
        seg = Segment(va, size, offset, self._next_epoch(), small)
        i = bisect.bisect_left(self._seg_starts, va)
        self._seg_starts.insert(i, va)
        self._segments.insert(i, seg)
        self._mapped(small, size, 1)
        self.mstats.add("segment", small, 1)
        self._empty_bytes[small] += size
        self.interception.segment_mapped(seg)
        return seg

    def _activate(self, block: Block) -> None:
        seg = block.seg
        if seg.live_blocks == 0:
            self._empty_bytes[seg.small] -= seg.size
        seg.live_blocks += 1

    def _deactivate(self, block: Block) -> None:
        seg = block.seg
        seg.live_blocks -= 1
        if seg.live_blocks == 0:
            self._empty_bytes[seg.small] += seg.size

    def _releasable(self, small: bool) -> int:
        return self._empty_bytes[small]

    def _oom_detail(self, size: int, small: bool) -> str:
        s = self.mstats
        seg = self.segment_size(size)
        return (f" (segment of {fmt_bytes(seg)}): capacity {fmt_bytes(self.hbm.capacity)}, "
                f"{fmt_bytes(s.current('allocated_bytes'))} held by live arrays, "
                f"{fmt_bytes(s.current('reserved_bytes') - s.current('allocated_bytes'))} cached in "
                f"segments that also hold live arrays, largest free range {fmt_bytes(self.hbm.phys.largest_free)}")

    def release_segment(self, seg: Segment) -> None:
        with self.lock:
            i = bisect.bisect_left(self._seg_starts, seg.va)
            del self._seg_starts[i], self._segments[i]
            self._remove_free(seg.first)
            self._mapped(seg.small, -seg.size, -1)
            self.mstats.add("segment", seg.small, -1)
            self._empty_bytes[seg.small] -= seg.size
            if self.pool_va is None:
                # the owner takes its address back at once; peers unmap in the background
                self.window.unmap(seg.va, seg.size)
                self.va.free(seg.va, seg.size)
            self.interception.segment_released(seg)

    def empty_cache(self) -> int:
        released = 0
        with self.lock:
            self._reap()
            for seg in list(self._segments):
                if seg.live_blocks == 0:
                    released += seg.size
                    self.release_segment(seg)
            for small in (True, False):
                self._sync_inactive(small)
        return released

    def segment_of(self, addr: int) -> Segment | None:
        with self.lock:
            i = bisect.bisect_right(self._seg_starts, addr) - 1
            if i < 0:
                return None
            seg = self._segments[i]
            return seg if addr < seg.va + seg.size else None

    def registration_of(self, addr: int, nbytes: int):
        seg = self.segment_of(addr)
        if seg is None or addr + nbytes > seg.va + seg.size:
            return None
        return seg

    def segments(self) -> list[Segment]:
        with self.lock:
            return list(self._segments)


class _HbmArrayBase:
    """The owner of one HBM block; numpy arrays made from it keep it alive."""

    __slots__ = ("__array_interface__", "block", "__weakref__")

    def __init__(self, block: Block, shape: tuple[int, ...], dtype: np.dtype):
        self.block = block
        self.__array_interface__ = {"data": (block.va, False), "shape": shape, "typestr": dtype.str,
                                    "version": 3}


def hbm_base(a: np.ndarray) -> _HbmArrayBase | None:
    """The owner of the HBM block ``a`` (made by array_from_block, or a view of such an array)
    keeps alive, or None."""
    b = a.base
    while isinstance(b, np.ndarray):
        b = b.base
    return b if type(b) is _HbmArrayBase else None


def array_from_block(allocator: HbmAllocator, block: Block, shape: tuple[int, ...],
                     dtype: np.dtype) -> np.ndarray:
    base = _HbmArrayBase(block, shape, dtype)
    fin = weakref.finalize(base, allocator.free_later, block)
    fin.atexit = False
    return np.asarray(base)
