"""A rank's HBM: one sparse shared-memory segment (runtime/memory/_segments.py) and its physical ranges.

Physical ranges are carved out of the segment at a granularity (2 MiB pages for the caching
allocator, the chunk size for the expandable one). A released range is not
reused until every peer has acknowledged dropping its mapping of it (``release_after_acks``):
otherwise a peer still holding the old mapping could read bytes of a new owner. Released
pages are punched out of the segment so the host gets the memory back.

A segment on a mount with a size limit (POSIX shared memory in /dev/shm) has its pages
reserved (``fallocate``) when a range is carved, before anything maps or touches them: a full
mount then fails the allocation with ``OutOfMemory`` naming the size, where touching a page
would have killed the rank with SIGBUS. A memfd segment has no such limit and stays sparse
(only touched pages use memory): a 64 GiB die replayed untouched still fits the host.
"""
from __future__ import annotations

import errno
import os
import threading

from ..._errors import OutOfMemory
from .. import _native
from ._window import PAGE, RangeAllocator


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def limited(fd: int) -> bool:
    """Whether the file behind ``fd`` lives on a mount with a size limit (a tmpfs such as
    /dev/shm reports its blocks; the kernel's internal mount behind memfd reports none)."""
    try:
        return os.fstatvfs(fd).f_blocks != 0
    except OSError:
        return False


class Hbm:
    def __init__(self, rank: int, fd: int, capacity: int, granularity: int = PAGE):
        self.rank, self.fd, self.capacity = rank, fd, capacity
        self.phys = RangeAllocator(0, capacity, granularity)
        self._awaiting: dict[int, tuple[int, int, set]] = {}   # epoch -> (offset, size, peers yet to ack)
        self.cond = threading.Condition()
        self.reserves = limited(fd)

    def alloc(self, size: int) -> int | None:
        """An offset of ``size`` free bytes, its pages reserved (see the module docstring);
        None if no free range holds it. Raises OutOfMemory if the pages cannot be reserved."""
        with self.cond:
            offset = self.phys.alloc(size)
        if offset is not None:
            self.reserve(offset, size)
        return offset

    def reserve(self, offset: int, size: int, carved: bool = True) -> None:
        """Reserve the pages of [offset, offset + size), carved already, where the mount limits
        them; if it cannot, free the range (``carved``: back to the free ranges) and raise
        OutOfMemory (its message says where and why; the caller prefixes the rank and what it
        allocated)."""
        if not self.reserves:
            return
        try:
            os.posix_fallocate(self.fd, offset, size)
        except OSError as e:
            if carved:
                with self.cond:
                    self._free(offset, size)
            else:
                _native.punch_hole(self.fd, offset, size)
            if e.errno not in (errno.ENOSPC, errno.ENOMEM):
                raise
            st = os.fstatvfs(self.fd)
            raise OutOfMemory(
                f"no room for {_mib(size)} of HBM in /dev/shm, which backs this job's HBM: "
                f"{_mib(st.f_bavail * st.f_frsize)} free of {_mib(st.f_blocks * st.f_frsize)} "
                f"({os.strerror(e.errno)}). Free /dev/shm, or make it "
                f"larger (docker run --shm-size); a job started by stratacl-launch or init() puts its HBM there only "
                f"if /dev/shm holds all of it when the job starts (docs/memory.md)") from None

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
