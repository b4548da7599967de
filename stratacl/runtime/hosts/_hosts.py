"""Which host each rank of the job is on, and what that changes for this rank (``HostMap``).

A job whose ranks span hosts (``stratacl-launch --emulate-hosts K`` on one machine) gives every
host its own copy of the control segment and lets no rank map a segment of another host. A
peer on another host is reached through the host's carrier (runtime/hosts/_carrier.py): its HBM through
a mirror the carrier refreshes at barriers (the peer's descriptor in hand, a pull maps the
mirror at the peer's shadow addresses, as it would the peer's segment), its words through the
control blocks the carriers trade at the same barriers, for any communicator whose members
span hosts (each member writes the communicator's card, members and slots, in its slot); a
point-to-point call's words and bytes when its sender announces them, on the world
communicator and on any other communicator spanning hosts (whose members hand the carrier its
card when they make it): the carriers forward a send's descriptor and number, and the
receiver's answer; a ring step's word when a member whose right neighbour is far finishes the
step, the bytes the neighbour's next step pulls read first; a one-sided call with a far peer
(``far_put``, ``far_get``, ``far_update``) as a request in the rank's region of the control
segment, which the carrier carries out (runtime/hosts/_carrier.py) while the rank waits: the
bytes with MPI's one-sided put and get between the peer's segment on its host and this host's
mirror of it, which the rank writes and reads at the peer's HBM offsets; an update of a word
(an atomic, a signal) by the peer's host's carrier, with the code ranks of that host use
(runtime/services/_pads.py), so it is atomic with theirs and wakes their waiters.
"""
from __future__ import annotations

import os
import threading

from .. import _native
from ..services import (
    COMM_SLOTS, H_CARRIER, H_CARRIER_BELL, H_CARRIER_READ, OS_A, OS_ARRIVAL, OS_B, OS_DONE, OS_GET, OS_KIND,
    OS_NBYTES, OS_OFFSET, OS_OLD, OS_PEER, OS_PUT, OS_SEQ, OS_STRIDE, OS_UPDATE, R_ONESIDED, UPDATES, wait_until,
)


class HostMap:
    """``host_of[r]``: the host of rank r, or None when the job is on one host."""

    def __init__(self, rank: int, world: int, host_of: list[int] | None, ctl_base: int, region: int = 0,
                 hbm_fds: list[int] | None = None):
        self.rank, self.world = rank, world
        self.host_of = list(host_of) if host_of is not None and len(set(host_of)) > 1 else None
        self.host = self.host_of[rank] if self.host_of is not None else 0
        self._queue = ctl_base + H_CARRIER
        self._read = ctl_base + H_CARRIER_READ
        self._bell = ctl_base + H_CARRIER_BELL
        # this rank's one-sided request to its carrier (services/_control.py, R_ONESIDED), and
        # the files of the far ranks' mirrors here (hbm_fds: a far rank's is its mirror)
        self._request = ctl_base + region + R_ONESIDED
        self._mirrors = hbm_fds
        self._asked = 0                  # requests made (mod 2**32 in the word)
        self._asking = threading.Lock()  # one request at a time: the rank's threads take turns

    def bytes_carried(self) -> int:
        """The bytes this host's carrier has read from other hosts into its mirrors since the job
        began (the host's count, the same on each of its ranks; 0 on one host). A barrier's
        reads are counted before it completes."""
        return _native.load_u64(self._read) if self.host_of is not None else 0

    @property
    def spanned(self) -> bool:
        return self.host_of is not None

    def remote(self) -> set[int]:
        """The ranks on other hosts than this rank's."""
        if self.host_of is None:
            return set()
        return {r for r, h in enumerate(self.host_of) if h != self.host}

    def spans(self, members: list[int]) -> bool:
        return self.host_of is not None and len({self.host_of[m] for m in members}) > 1

    def barrier_words(self, members: list[int], slots, rank: int) -> tuple[int | None, int, int]:
        """(members on this host, the carrier's queue, what this member's entries in it name)
        for a communicator of ``members`` (world ranks) in their control-segment ``slots``, of
        which this rank is member ``rank``; (None, 0, 0) when it is on this host alone."""
        if not self.spans(members):
            return None, 0, 0
        return (sum(self.host_of[m] == self.host for m in members), self._queue,
                members[rank] * COMM_SLOTS + slots[rank] + 1)

    # --- one-sided calls with a peer on another host ------------------------------------------
    def far_put(self, op: str, peer: int, runs, data, health, timeout: float) -> None:
        """Put ``data`` (bytes-like, as many bytes as the runs hold) into far rank ``peer``'s
        HBM at ``runs`` ((HBM offset, bytes) pairs of its segment): into this host's mirror,
        then by the carrier into the peer's segment. On return the bytes are there."""
        data, at = memoryview(data).cast("B"), 0
        for offset, nbytes in runs:
            _write_all(self._mirrors[peer], data[at:at + nbytes], offset)
            self._ask(op, peer, OS_PUT, offset, nbytes, health, timeout)
            at += nbytes

    def far_get(self, op: str, peer: int, runs, out, health, timeout: float) -> None:
        """Fill ``out`` (a writable bytes-like) from far rank ``peer``'s HBM at ``runs``: the
        carrier reads them into this host's mirror, which the rank reads."""
        out, at = memoryview(out).cast("B"), 0
        for offset, nbytes in runs:
            self._ask(op, peer, OS_GET, offset, nbytes, health, timeout)
            _read_all(self._mirrors[peer], out[at:at + nbytes], offset)
            at += nbytes

    def far_update(self, op: str, peer: int, offset: int, stride: int, kind: str, a: int, b: int,
                   arrival: int | None, health, timeout: float) -> int:
        """Update far rank ``peer``'s u64 word at HBM ``offset`` (services/_pads.py,
        ``update_word``: ``kind`` with operands a, b; a signal pad's word when ``stride``, logged
        with ``arrival``); returns the value it held. Done by the peer's host's carrier."""
        return self._ask(op, peer, OS_UPDATE + UPDATES.index(kind), offset, int(arrival is not None), health,
                         timeout, a, b, stride, arrival or 0)

    def _ask(self, op: str, peer: int, kind: int, offset: int, nbytes: int, health, timeout: float,
             a: int = 0, b: int = 0, stride: int = 0, arrival: int = 0) -> int:
        """One request to this host's carrier, carried out before it returns (the carrier's
        answer: the value the word held, for an update)."""
        w = self._request
        with self._asking:
            for field, value in ((OS_KIND, kind), (OS_PEER, peer), (OS_OFFSET, offset), (OS_NBYTES, nbytes),
                                 (OS_A, a), (OS_B, b), (OS_STRIDE, stride), (OS_ARRIVAL, arrival)):
                _native.store_u64(w + field, value)
            self._asked = seq = (self._asked + 1) & 0xFFFFFFFF
            _native.store_u32(w + OS_SEQ, seq)
            _native.fetch_add_u64(self._bell, 1)
            _native.futex_wake(self._bell, 1)
            wait_until(lambda: _native.load_u32(w + OS_DONE) == seq, w + OS_DONE, health, op, timeout,
                       lambda: [peer], f"its host's carrier to reach rank {peer} on host {self.host_of[peer]}")
            return int(_native.load_u64(w + OS_OLD))


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _read_all(fd: int, out: memoryview, offset: int) -> None:
    while len(out):
        n = os.preadv(fd, [out], offset)
        if n <= 0:
            raise OSError(f"a mirror read at offset {offset} returned {n} bytes")
        out, offset = out[n:], offset + n
