"""Which host each rank of the job is on, and what that changes for this rank (``HostMap``).

A job whose ranks span hosts (``stratacl-launch --emulate-hosts K`` on one machine) gives every
host its own copy of the control segment and lets no rank map a segment of another host. A
peer on another host is reached through the host's carrier (jobs/_carrier.py): its HBM through
a mirror the carrier refreshes at barriers (the peer's descriptor in hand, a pull maps the
mirror at the peer's shadow addresses, as it would the peer's segment), its words through the
control blocks the carriers trade at the same barriers; a point-to-point call's words and
bytes when its sender announces them (the carriers forward a send's descriptor and number,
and the receiver's answer). What else would need a word outside those (communicators split
across hosts, one-sided calls, ring steps) is refused with ``NotImplementedError`` naming the
operation, rather than left to time out.
"""
from __future__ import annotations

from ._control import H_CARRIER


class HostMap:
    """``host_of[r]``: the host of rank r, or None when the job is on one host."""

    def __init__(self, rank: int, world: int, host_of: list[int] | None, ctl_base: int):
        self.rank, self.world = rank, world
        self.host_of = list(host_of) if host_of is not None and len(set(host_of)) > 1 else None
        self.host = self.host_of[rank] if self.host_of is not None else 0
        self._carrier_word = ctl_base + H_CARRIER

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

    def barrier_words(self, members: list[int], slots) -> tuple[int | None, int]:
        """(members on this host, the carrier's barrier word) for a communicator of
        ``members`` (world ranks) in their control-segment ``slots``; (None, 0) when it is on
        this host alone. Only the world communicator (every rank, slot 0) is carried: another
        one, even of every rank, has slots of its own that the carriers do not trade."""
        if not self.spans(members):
            return None, 0
        if list(members) != list(range(self.world)) or any(slots):
            raise NotImplementedError(
                f"a communicator of ranks {members[:8]}{'...' if len(members) > 8 else ''} spans hosts "
                f"{sorted({self.host_of[m] for m in members})}: across hosts only the world communicator is "
                f"carried so far (split within one host, or use the world communicator)")
        return sum(self.host_of[m] == self.host for m in members), self._carrier_word

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

    def refuse(self, operation: str, members: list[int]) -> None:
        """Raise for ``operation`` on a communicator of ``members`` spanning hosts: it needs
        words or bytes outside a barrier, which the carriers do not carry yet."""
        if self.spans(members):
            raise NotImplementedError(
                f"{operation}: not carried across hosts yet (the communicator spans hosts "
                f"{sorted({self.host_of[m] for m in members})}); barriers and full-mesh collectives of the "
                f"world communicator are")
