"""The caching allocator: numpy arrays in HBM, physical events only on a cache miss.

    stratacl.empty(...)
          |  malloc(n): best-fit free block in a cached segment  -> no physical event
          |  miss: new segment = HBM range + address in own slice + mmap
          v                      |
    Block (kept alive by the array)   +--> interception.segment_mapped(seg)   (registration unit)
          |  array freed -> block back to the cache                -> no physical event
          v
    empty_cache() / OOM retry: fully free segments are released
                                  +--> interception.segment_released(seg)

Requests of at most 1 MiB share 2 MiB segments (the small pool); larger ones get their own
segment rounded up to 2 MiB (the large pool), as torch's caching allocator does.
"""
from __future__ import annotations

import bisect
import collections
import threading
import weakref
from typing import Protocol

import numpy as np

from .._errors import OutOfMemory
from ._hbm import Hbm
from ._window import PAGE, RangeAllocator, ShadowWindow, round_up

BLOCK_ROUND = 512
SMALL_LIMIT = 1024 * 1024


class Interception(Protocol):
    def segment_mapped(self, seg: "Segment") -> None: ...
    def segment_released(self, seg: "Segment") -> None: ...


class Segment:
    __slots__ = ("va", "size", "hbm_offset", "epoch", "small", "first", "live_blocks")

    def __init__(self, va: int, size: int, hbm_offset: int, epoch: int, small: bool):
        self.va, self.size, self.hbm_offset, self.epoch, self.small = va, size, hbm_offset, epoch, small
        self.first: Block | None = None
        self.live_blocks = 0

    def __repr__(self) -> str:
        return f"Segment(va={self.va:#x}, size={self.size}, hbm_offset={self.hbm_offset:#x}, epoch={self.epoch})"


class Block:
    __slots__ = ("seg", "va", "size", "free", "prev", "next", "requested")

    def __init__(self, seg: Segment, va: int, size: int):
        self.seg, self.va, self.size = seg, va, size
        self.free = True
        self.prev: Block | None = None
        self.next: Block | None = None
        self.requested = 0


def _fmt(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class CachingAllocator:
    def __init__(self, rank: int, window: ShadowWindow, hbm: Hbm, interception: Interception,
                 pool_va: int | None = None):
        self.rank, self.window, self.hbm, self.interception = rank, window, hbm, interception
        self.pool_va = pool_va            # pool mode: HBM offset o lives at pool_va + o, mapped once
        self.va = RangeAllocator(window.slice_start(rank), window.slice_bytes)
        self.lock = threading.RLock()
        self._free = {True: [], False: []}   # small? -> sorted [(size, va, id, block)]
        self._segments: list[Segment] = []   # sorted by va
        self._seg_starts: list[int] = []
        self._epoch = 0
        self._dead: collections.deque = collections.deque()   # blocks whose arrays died, not yet freed
        self.counters = dict(allocated_bytes=0, peak_allocated_bytes=0, reserved_bytes=0,
                             segments_mapped=0, segments_released=0, alloc_calls=0, free_calls=0,
                             cache_hits=0, num_ooms=0, num_alloc_retries=0)

    # --- blocks -----------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> Block:
        size = round_up(max(nbytes, 1), BLOCK_ROUND)
        small = size <= SMALL_LIMIT
        with self.lock:
            self._reap()
            self.counters["alloc_calls"] += 1
            block = self._take_free(size, small)
            if block is None:
                seg = self._new_segment(PAGE if small else round_up(size), small, nbytes)
                block = seg.first
            else:
                self.counters["cache_hits"] += 1
            self._split(block, size, small)
            block.free = False
            block.requested = nbytes
            block.seg.live_blocks += 1
            c = self.counters
            c["allocated_bytes"] += block.size
            c["peak_allocated_bytes"] = max(c["peak_allocated_bytes"], c["allocated_bytes"])
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
            self.counters["free_calls"] += 1
            self.counters["allocated_bytes"] -= block.size
            block.free = True
            block.seg.live_blocks -= 1
            nxt, prv = block.next, block.prev
            if nxt is not None and nxt.free:
                self._remove_free(nxt)
                block.size += nxt.size
                block.next = nxt.next
                if nxt.next is not None:
                    nxt.next.prev = block
            if prv is not None and prv.free:
                self._remove_free(prv)
                prv.size += block.size
                prv.next = block.next
                if block.next is not None:
                    block.next.prev = prv
                block = prv
            self._insert_free(block)

    def _take_free(self, size: int, small: bool) -> Block | None:
        lst = self._free[small]
        i = bisect.bisect_left(lst, (size, 0, 0))
        if i == len(lst):
            return None
        block = lst.pop(i)[3]
        return block

    def _split(self, block: Block, size: int, small: bool) -> None:
        rest = block.size - size
        if rest < (BLOCK_ROUND if small else SMALL_LIMIT + 1):
            return
        tail = Block(block.seg, block.va + size, rest)
        tail.prev, tail.next = block, block.next
        if block.next is not None:
            block.next.prev = tail
        block.next = tail
        block.size = size
        self._insert_free(tail)

    def _insert_free(self, block: Block) -> None:
        bisect.insort(self._free[block.seg.small], (block.size, block.va, id(block), block))

    def _remove_free(self, block: Block) -> None:
        lst = self._free[block.seg.small]
        i = bisect.bisect_left(lst, (block.size, block.va, id(block)))
        assert lst[i][3] is block
        lst.pop(i)

    # --- segments (the physical events) -----------------------------------------------------
    def _new_segment(self, size: int, small: bool, requested: int) -> Segment:
        seg = self._map_segment(size, small)
        if seg is None:
            self.counters["num_alloc_retries"] += 1
            self.empty_cache()
            seg = self._map_segment(size, small, wait=self.hbm.awaiting_bytes > 0)
        if seg is None:
            self.counters["num_ooms"] += 1
            c = self.counters
            raise OutOfMemory(
                f"rank {self.rank}: out of HBM allocating {_fmt(requested)} (segment of {_fmt(size)}): "
                f"capacity {_fmt(self.hbm.capacity)}, {_fmt(c['allocated_bytes'])} held by live arrays, "
                f"{_fmt(c['reserved_bytes'] - c['allocated_bytes'])} cached, largest free range "
                f"{_fmt(self.hbm.phys.largest_free)}. Free arrays, or raise --hbm-size (STRATACL_HBM_SIZE).")
        block = Block(seg, seg.va, seg.size)
        seg.first = block
        return seg

    def _map_segment(self, size: int, small: bool, wait: bool = False) -> Segment | None:
        offset = self.hbm.alloc(size)
        if offset is None and wait:
            offset = self._wait_for_acks(size)
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
        self._epoch += 1
        seg = Segment(va, size, offset, self._epoch, small)
        i = bisect.bisect_left(self._seg_starts, va)
        self._seg_starts.insert(i, va)
        self._segments.insert(i, seg)
        self.counters["reserved_bytes"] += size
        self.counters["segments_mapped"] += 1
        self.interception.segment_mapped(seg)
        return seg

    def _wait_for_acks(self, size: int) -> int | None:
        """Released ranges come back once peers have unmapped them; wait a bounded time."""
        import time
        deadline = time.monotonic() + 10.0
        with self.hbm.cond:
            while True:
                offset = self.hbm.phys.alloc(size)
                if offset is not None or not self.hbm._awaiting:
                    return offset
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.hbm.cond.wait(min(left, 0.05))

    def release_segment(self, seg: Segment) -> None:
        with self.lock:
            i = bisect.bisect_left(self._seg_starts, seg.va)
            del self._seg_starts[i], self._segments[i]
            self._remove_free(seg.first)
            self.counters["reserved_bytes"] -= seg.size
            self.counters["segments_released"] += 1
            if self.pool_va is None:
                # the owner takes its address back at once; peers unmap in the background
                self.window.unmap(seg.va, seg.size)
                self.va.free(seg.va, seg.size)
            self.interception.segment_released(seg)

    def empty_cache(self) -> int:
        """Release every segment with no live block. Returns the bytes released."""
        released = 0
        with self.lock:
            self._reap()
            for seg in list(self._segments):
                if seg.live_blocks == 0:
                    released += seg.size
                    self.release_segment(seg)
        return released

    def segment_of(self, addr: int) -> Segment | None:
        with self.lock:
            i = bisect.bisect_right(self._seg_starts, addr) - 1
            if i < 0:
                return None
            seg = self._segments[i]
            return seg if addr < seg.va + seg.size else None

    def segments(self) -> list[Segment]:
        with self.lock:
            return list(self._segments)

    def stats(self) -> dict:
        with self.lock:
            self._reap()
            out = dict(self.counters)
            out["num_segments"] = len(self._segments)
            out["capacity_bytes"] = self.hbm.capacity
            out["awaiting_peer_ack_bytes"] = self.hbm.awaiting_bytes
            out["cached_free_bytes"] = out["reserved_bytes"] - out["allocated_bytes"]
            return out


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


def array_from_block(allocator: CachingAllocator, block: Block, shape: tuple[int, ...],
                     dtype: np.dtype) -> np.ndarray:
    base = _HbmArrayBase(block, shape, dtype)
    fin = weakref.finalize(base, allocator.free_later, block)
    fin.atexit = False
    return np.asarray(base)
