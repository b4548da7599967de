"""A rank's HBM: one sparse POSIX shared-memory segment and its physical ranges.

Physical ranges are carved out of the segment at a granularity (2 MiB pages for the caching
allocator, the chunk size for the expandable one). A released range is not
reused until every peer has acknowledged dropping its mapping of it (``release_after_acks``):
otherwise a peer still holding the old mapping could read bytes of a new owner. Released
pages are punched out of the segment so the host gets the memory back.
"""
from __future__ import annotations

import threading

from . import _native
from ._window import PAGE, RangeAllocator


class Hbm:
    def __init__(self, rank: int, fd: int, capacity: int, granularity: int = PAGE):
        self.rank, self.fd, self.capacity = rank, fd, capacity
        self.phys = RangeAllocator(0, capacity, granularity)
        self._awaiting: dict[int, tuple[int, int, set]] = {}   # epoch -> (offset, size, peers yet to ack)
        self.cond = threading.Condition()

    def alloc(self, size: int) -> int | None:
        with self.cond:
            return self.phys.alloc(size)

    def release_after_acks(self, epoch: int, offset: int, size: int, peers: set) -> None:
        """Free the range once every rank in ``peers`` has acknowledged ``epoch``'s release."""
        with self.cond:
            if not peers:
                self._free(offset, size)
            else:
                self._awaiting[epoch] = (offset, size, set(peers))

    def ack(self, epoch: int, peer: int) -> None:
        with self.cond:
            entry = self._awaiting.get(epoch)
            if entry is None:
                return
            entry[2].discard(peer)
            if not entry[2]:
                del self._awaiting[epoch]
                self._free(entry[0], entry[1])

    def forget_peers(self, gone) -> None:
        """Peers that finalized or died will never ack; stop waiting for them."""
        with self.cond:
            if not self._awaiting:
                return
            for epoch, (offset, size, peers) in list(self._awaiting.items()):
                for p in [p for p in peers if gone(p)]:
                    peers.discard(p)
                if not peers:
                    del self._awaiting[epoch]
                    self._free(offset, size)

    def _free(self, offset: int, size: int) -> None:
        _native.punch_hole(self.fd, offset, size)
        self.phys.free(offset, size)
        self.cond.notify_all()

    def is_awaiting(self, epoch: int) -> bool:
        """True while the release ``epoch`` waits for some peer's acknowledgement."""
        with self.cond:
            return epoch in self._awaiting

    @property
    def free_bytes(self) -> int:
        """HBM free for a new allocation now (released ranges count once acknowledged)."""
        with self.cond:
            return self.phys.length - self.phys.used

    def awaiting(self) -> tuple[int, int]:
        """Releases still waiting for peers' acknowledgements: (how many, bytes)."""
        with self.cond:
            return len(self._awaiting), sum(size for _, size, _ in self._awaiting.values())

    @property
    def awaiting_bytes(self) -> int:
        with self.cond:
            return sum(size for _, size, _ in self._awaiting.values())
