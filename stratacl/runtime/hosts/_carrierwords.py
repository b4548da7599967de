"""Where the words a carrier carries between hosts sit in a host's control segment
(runtime/services/_control.py's layout): the world communicator's slots (a member's index is its world
rank), their point-to-point announcements, answers and reasons, and the descriptors they name.
``serve`` (runtime/hosts/_carrier.py) reads and writes them through one ``CarrierWords``.
"""
from __future__ import annotations

import numpy as np

from ..services import DESC_FIXED, P2P_DESC, REASON_BYTES, Layout


class CarrierWords:
    """Where the words ``serve`` carries sit in a control segment (the world communicator's
    slots: a member's index is its world rank)."""

    def __init__(self, ctl):
        lay = ctl.layout
        self.ctl, self.lay = ctl, lay
        self._arrival, self._gen = Layout.SLOT_ARRIVAL, Layout.SLOT_GEN
        self._p2p_desc = P2P_DESC

    def own(self, r: int, slot: int) -> slice:       # r's words in its slot: all but counter, gen
        at = self.lay.slot(r, slot)
        return slice(at + self._arrival, at + self.lay.slot_bytes)

    def collective(self, r: int, slot: int) -> list[slice]:
        """The parts of ``own`` a barrier's block carries to other hosts: the arrival word, the
        root counter, the call descriptors and their reasons, the card. Not the point-to-point
        words (sequence numbers, answers, send descriptors and their reasons): those travel
        with their send or answer (TAG_SEND, TAG_DONE), and a block written over them could
        announce a send or an answer before its descriptor, bytes or modeled time. Nor the
        ring-step counter, for the same reason: it travels alone (TAG_RING), once the bytes
        the next step pulls are read."""
        at, lay = self.lay.slot(r, slot), self.lay
        return [slice(at + self._arrival, at + Layout.SLOT_SEND_SEQ),
                slice(at + lay.slot_root_done(), at + lay.slot_ring_step()),
                slice(at + lay.slot_desc(0), at + lay.slot_reason(2)),
                slice(at + lay.slot_reason(2 + 2 * self.ctl.world), at + lay.slot_bytes)]

    def write_collective(self, r: int, slot: int, block: bytes, at: int) -> int:
        """Write the ``collective`` parts of r's words from another host's block, whose copy of
        ``own`` starts at byte ``at``; returns the bytes of ``own`` the block holds."""
        own = self.own(r, slot)
        words = np.frombuffer(block, np.uint8, own.stop - own.start, at)
        for part in self.collective(r, slot):
            self.ctl.u8[part] = words[part.start - own.start:part.stop - own.start]
        return own.stop - own.start

    def gen(self, r: int, slot: int) -> int:         # the generation word of the communicator whose
        return self.ctl.base + self.lay.slot(r, slot) + self._gen     # member 0 is r, in its slot

    def card(self, r: int, slot: int) -> tuple[list[int], list[int]]:
        """The members (world ranks) and their slots of the communicator in r's ``slot``."""
        at = self.lay.slot(r, slot)
        i32 = self.ctl.i32
        n = int(i32[(at + self.lay.slot_members()) // 4])
        members = i32[(at + self.lay.slot_members()) // 4 + 1:][:n].tolist()
        return members, i32[(at + self.lay.slot_slots()) // 4:][:n].tolist()

    def ring_step(self, a: int, slot: int) -> int:            # a's ring steps finished, ever (u32)
        return self.lay.slot(a, slot) + self.lay.slot_ring_step()

    # the point-to-point words of member a (world rank, in its ``slot`` of the communicator)
    # towards the member of index b there
    def send_seq(self, a: int, slot: int, b: int) -> int:     # a's announcement of its send to b (u32)
        return self.lay.slot(a, slot) + Layout.SLOT_SEND_SEQ + 4 * b

    def send_desc(self, a: int, slot: int, b: int) -> int:    # a's descriptor of that send (P2P_DESC int64)
        return self.lay.slot(a, slot) + self.lay.slot_p2p_desc() + 8 * self._p2p_desc * b

    def recv_done(self, a: int, slot: int, b: int) -> int:    # a's answer to b's send: done (u32) ...
        return self.lay.slot(a, slot) + self.lay.slot_recv_done() + 4 * b

    def recv_status(self, a: int, slot: int, b: int) -> int:  # ... and its status (u32, 0: received)
        return self.lay.slot(a, slot) + self.lay.slot_recv_status() + 4 * b

    def send_reason(self, a: int, slot: int, b: int) -> slice:  # why a rejected its send to b, if it did
        return self._reason(a, slot, 2 + b)

    def recv_reason(self, a: int, slot: int, b: int) -> slice:  # why a rejected or failed its receive from b
        return self._reason(a, slot, 2 + self.ctl.world + b)

    def _reason(self, a: int, slot: int, which: int) -> slice:
        at = self.lay.slot(a, slot) + self.lay.slot_reason(which)
        return slice(at, at + REASON_BYTES)

    def descriptor(self, offset: int) -> np.ndarray:
        return self.ctl.i64[offset // 8:offset // 8 + DESC_FIXED]

    def extension(self, offset: int, n: int) -> np.ndarray:   # the first n extension words of a descriptor
        return self.ctl.i64[offset // 8 + DESC_FIXED:offset // 8 + DESC_FIXED + n]
