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
step, the bytes the neighbour's next step pulls read first. What else would need a word outside
those (one-sided calls) is refused with ``NotImplementedError`` naming the operation, rather
than left to time out.
"""
from __future__ import annotations

from .. import _native
from ..services import COMM_SLOTS, H_CARRIER, H_CARRIER_READ


class HostMap:
    """``host_of[r]``: the host of rank r, or None when the job is on one host."""

    def __init__(self, rank: int, world: int, host_of: list[int] | None, ctl_base: int):
        self.rank, self.world = rank, world
        self.host_of = list(host_of) if host_of is not None and len(set(host_of)) > 1 else None
        self.host = self.host_of[rank] if self.host_of is not None else 0
        self._queue = ctl_base + H_CARRIER
        self._read = ctl_base + H_CARRIER_READ

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

    def refuse_peers(self, operation: str, peers, what: str = "point-to-point calls") -> None:
        """Raise for ``operation`` (one of ``what``) with any of ``peers`` (world ranks; None:
        not a peer) on another host: its words are not carried across hosts yet."""
        if self.host_of is None:
            return
        far = sorted({p for p in peers if p is not None and self.host_of[p] != self.host})
        if far:
            raise NotImplementedError(
                f"{operation}: rank {self.rank} (host {self.host}) and rank {far[0]} (host {self.host_of[far[0]]}) "
                f"are on different hosts, and {what} are not carried across hosts yet")
