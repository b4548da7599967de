"""A host's carrier's share of one-sided calls with a peer on another host (``FarRequests``):
the requests of this host's ranks (runtime/hosts/_hosts.py, ``far_put``, ``far_get``,
``far_update``) and the updates other hosts' carriers ask of this host's words. ``serve``
(runtime/hosts/_carrier.py) polls the first and hands it the messages of the second.

    a rank here writes its request (services/_control.py, R_ONESIDED) and rings the bell
      -> put: the bytes it wrote into this host's mirror of the peer go into the peer's
         segment (MPI_Put, complete there when the lock is released); get: the other way
         (MPI_Get); then the rank is answered
      -> an update of a word (an atomic, a signal): sent to the peer's host's carrier, which
         makes it with the code that host's ranks use (services/_pads.py, ``update_word``:
         atomic with theirs, their waiters woken) and sends back the value the word held,
         which answers the rank
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .. import _native
from ..services import (
    OS_A, OS_ARRIVAL, OS_B, OS_DONE, OS_GET, OS_KIND, OS_NBYTES, OS_OFFSET, OS_OLD, OS_PEER, OS_PUT, OS_SEQ,
    OS_STRIDE, OS_UPDATE, R_ONESIDED, UPDATES, update_word,
)

TAG_UPDATE, TAG_UPDATED = 17, 18         # carrier-to-carrier: an update of a far rank's word, and its answer


class FarRequests:
    """The one-sided requests of this host's ranks ``mine`` (world ranks), carried out by its
    carrier ``carrier`` (runtime/hosts/_carrier.py) over ``comm``; ``read(wants)`` reads into
    the mirrors as the carrier's event loop counts it."""

    def __init__(self, ctl, carrier, comm, mine: Sequence[int], host_of: Sequence[int], read: Callable):
        self.ctl, self.carrier, self.comm = ctl, carrier, comm
        self.mine, self.host_of, self.read = list(mine), host_of, read
        self.at = [ctl.layout.region(r) + R_ONESIDED for r in mine]       # each rank's request
        self._seq_at = np.array([q // 4 for q in self.at], np.int64)
        self._seen = ctl.u32[self._seq_at + OS_SEQ // 4].copy()

    def poll(self) -> bool:
        """Carry out (or send on) every request made since the last poll; True if there was one."""
        now = self.ctl.u32[self._seq_at + OS_SEQ // 4]
        moved = np.flatnonzero(now != self._seen)
        for i in moved:
            r, q, seq = self.mine[i], self.at[i], int(now[i])
            kind, peer, offset, nbytes = (self._field(q, f) for f in (OS_KIND, OS_PEER, OS_OFFSET, OS_NBYTES))
            if kind == OS_PUT:
                self.carrier.put([(peer, offset, nbytes)])
                self._answer(r, seq)
            elif kind == OS_GET:
                self.read([(peer, offset, nbytes)])
                self._answer(r, seq)
            else:
                arrival = self._field(q, OS_ARRIVAL) if nbytes else None
                self.comm.send((r, seq, peer, offset, UPDATES[kind - OS_UPDATE], self._field(q, OS_A),
                                self._field(q, OS_B), self._field(q, OS_STRIDE), arrival),
                               dest=self.host_of[peer], tag=TAG_UPDATE)
        self._seen = now.copy()
        return bool(moved.size)

    def update(self, msg, source: int) -> None:
        """Another host's rank asked (TAG_UPDATE) for an update of a word of a rank here: make it,
        and answer with the value the word held."""
        r, seq, peer, offset, kind, a, b, stride, arrival = msg
        c = self.carrier
        if self.host_of[peer] != c.host or not 0 <= offset <= c.hbm_size - 8:
            raise ValueError(f"carrier of host {c.host}: an update of rank {peer}'s word at {offset} is not for this "
                             f"host's HBM")
        old = update_word(c.address(peer) + offset, stride, kind, a, b, arrival, r)
        self.comm.send((r, seq, old), dest=source, tag=TAG_UPDATED)

    def updated(self, msg) -> None:
        """The answer (TAG_UPDATED) to the update a rank here asked for."""
        r, seq, old = msg
        self._answer(r, seq, old)

    def _field(self, q: int, at: int) -> int:
        return int(self.ctl.u64[(q + at) // 8])

    def _answer(self, r: int, seq: int, old: int = 0) -> None:
        q = self.ctl.base + self.ctl.layout.region(r) + R_ONESIDED
        _native.store_u64(q + OS_OLD, old)
        _native.store_u32(q + OS_DONE, seq)
        _native.futex_wake(q + OS_DONE, 2**31 - 1)
