"""Host-DRAM mailbox: single-producer single-consumer rings in the control segment.

    sender --put--> ring[consumer][sender] --drain--> consumer's registration thread
                      |                                   ^
                      +---- doorbell[consumer] (futex) ---+

A ring carries fixed 64-byte messages. ``Mailbox`` is one endpoint's view: it drains every
inbound ring and keeps a per-destination outbound queue, so a full ring never blocks the
thread that must also drain its own inbound rings (two threads filling each other's rings
would otherwise deadlock). A consumer that drains a full ring rings its producer's doorbell,
so a producer with messages left over sleeps until there is room rather than polling.

The first word of a message is its header (kind, sender, destination or BROADCAST): the
mailbox's addressing, which the daemon reads to relay. What the kinds mean belongs to the
protocol that sends them (the registration unit, runtime.memory._registration); the rings only carry them.
"""
from __future__ import annotations

import collections

import numpy as np

from .. import _native
from ._control import R_DOORBELL, RING_ENTRIES, RING_ENTRY_WORDS, Control

BROADCAST = -1                 # destination of a message for every rank but its sender


def pack_header(kind: int, src: int, dst: int) -> int:
    return kind | (src << 8) | ((dst + 1) << 32)


def unpack_header(word: int) -> tuple[int, int, int]:
    return word & 0xFF, (word >> 8) & 0xFFFFFF, ((word >> 32) & 0xFFFFFFFF) - 1


class Mailbox:
    """Endpoint ``me`` (a rank, or ``world`` for the daemon) of the job's mailbox rings."""

    # the header format, for a protocol handed an endpoint rather than this module
    BROADCAST = BROADCAST
    pack_header = staticmethod(pack_header)
    unpack_header = staticmethod(unpack_header)

    def __init__(self, ctl: Control, me: int):
        self.ctl = ctl
        self.me = me
        self.world = ctl.world
        lay = ctl.layout
        self.doorbell = ctl.addr(lay.region(me) + R_DOORBELL)
        self._producers = list(range(ctl.world + 1)) if me < ctl.world else list(range(ctl.world))
        # inbound rings: heads gathered with one fancy index
        self._in_rings = [lay.ring(me, p) for p in self._producers]
        self._in_heads = np.array([r // 8 for r in self._in_rings], dtype=np.int64)
        self._in_tails = np.zeros(len(self._in_rings), dtype=np.uint64)
        self._out: dict[int, collections.deque] = collections.defaultdict(collections.deque)

    # --- sending ----------------------------------------------------------------------------
    def post(self, dst: int, words: tuple[int, ...]) -> None:
        """Queue a message for endpoint ``dst``; ``flush`` moves it into the ring."""
        self._out[dst].append(words)

    def flush(self, alive=None) -> int:
        """Move queued messages into their rings while there is room; returns how many remain.

        ``alive(dst)`` may say a consumer is gone, and its queue is dropped.
        """
        lay, u64 = self.ctl.layout, self.ctl.u64
        remaining = 0
        for dst, q in self._out.items():
            if not q:
                continue
            if alive is not None and not alive(dst):
                q.clear()
                continue
            ring = lay.ring(dst, self.me)
            head = int(u64[ring // 8])
            tail = _native.load_u64(self.ctl.base + ring + 64)
            sent = 0
            while q and head - tail < RING_ENTRIES:
                entry = (ring + 128) // 8 + (head % RING_ENTRIES) * RING_ENTRY_WORDS
                u64[entry:entry + RING_ENTRY_WORDS] = q.popleft()
                head += 1
                sent += 1
            if sent:
                _native.store_u64(self.ctl.base + ring, head)
                bell = self.ctl.addr(lay.region(dst) + R_DOORBELL)
                _ring(bell)
            remaining += len(q)
        return remaining

    # --- receiving --------------------------------------------------------------------------
    def doorbell_value(self) -> int:
        return _native.load_u32(self.doorbell)

    def drain(self) -> np.ndarray:
        """All messages that arrived since the last drain, as an (n, 8) uint64 array."""
        _native.fence()
        heads = self.ctl.u64[self._in_heads]
        ready = np.nonzero(heads != self._in_tails)[0]
        if ready.size == 0:
            return np.empty((0, RING_ENTRY_WORDS), dtype=np.uint64)
        out = []
        u64 = self.ctl.u64
        for i in ready:
            ring = self._in_rings[i]
            tail, head = int(self._in_tails[i]), int(heads[i])
            entries = u64[(ring + 128) // 8:(ring + 128) // 8 + RING_ENTRIES * RING_ENTRY_WORDS]
            entries = entries.reshape(RING_ENTRIES, RING_ENTRY_WORDS)
            idx = np.arange(tail, head) % RING_ENTRIES
            out.append(entries[idx].copy())
            self._in_tails[i] = head
            _native.store_u64(self.ctl.base + ring + 64, head)
            if head - tail >= RING_ENTRIES:
                # the ring was full: its producer may be asleep with messages queued for it
                _ring(self.ctl.addr(self.ctl.layout.region(self._producers[i]) + R_DOORBELL))
        return np.concatenate(out) if len(out) > 1 else out[0]

    def wait(self, seen_doorbell: int, timeout: float) -> None:
        """Sleep until the doorbell moves past ``seen_doorbell`` or ``timeout`` seconds pass."""
        _native.futex_wait(self.doorbell, seen_doorbell, timeout)

    def ring_own_doorbell(self) -> None:
        _ring(self.doorbell)


def _ring(bell: int) -> None:
    """Any producer may ring: the increment is atomic so the doorbell never moves backwards
    (it is the low half of a u64 whose upper half is unused), then the sleeper is woken."""
    _native.fetch_add_u64(bell, 1)
    _native.futex_wake(bell, 1)
