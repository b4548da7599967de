"""The flight recorder: every rank's last calls, read from the control segment.

Each rank keeps its last FLIGHT_ENTRIES calls, collective and point-to-point, on any
communicator, in its region of the control segment (_native.h, FL_*): native code opens an
entry as a collective publishes its descriptor (op, call number on its communicator, element
count, input bytes, root, the entry barrier's number, the time) and notes every barrier the
rank then arrives at; a send, recv or sendrecv opens one with its peers and sequence numbers
and closes it when it completes. Nothing waits for the recorder: a few stores per call and
per barrier. The slot holding a communicator's barrier counter lists its members
(Layout.slot_members), so that entries name world ranks.

Whoever maps the segment can read it, also after a rank died or hung; the launcher does when
a job fails (jobs/_outcome.py, format_failure), from the file rather than the mapping
(Control.read), so that no page it reads can raise SIGBUS in it. A collective's state follows from its
barrier numbers and the communicator's barrier counter (barrier k has completed once the
counter reaches k x size):

    entered      the descriptor is published; the entry barrier has not completed
    arrived      every member arrived; the data moves (or moved, for a call whose end needs
                 no barrier: a rooted call's readers, a split)
    data done    at a later barrier (a two-phase call's middle, the departure), not completed
    departed     that barrier completed

A point-to-point call is entered (posted, waiting for its peers) until it departs.
``stragglers`` compares the ranks' newest calls communicator by communicator and names the
ranks that are behind (never entered the call the others are in) or in a different operation,
and the ranks waiting on a peer in a point-to-point call, with what that peer does.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..._operators import OPERATORS
from .._native import (
    FL_CALL, FL_COMM, FL_COUNT, FL_DST, FL_K_DONE, FL_K_ENTRY, FL_K_LAST, FL_ME, FL_N, FL_NBYTES, FL_OP, FL_RECV_CALL,
    FL_ROOT, FL_SEQ, FL_SRC, FL_T_ENTER, FL_T_LAST, FL_WORDS, FLIGHT_ENTRIES, FLIGHT_HEADER,
)
from ._control import WORLD_INIT_CALLS, Control

_NAMES = {op.code: op.name for op in OPERATORS}
P2P = frozenset(op.name for op in OPERATORS if op.family == "p2p")


def op_name(code: int) -> str:
    """A recorded operation code in words (the operator table's name), never a bare number."""
    if code == 0:
        return "no call"
    return _NAMES.get(code, f"an unknown operation (code {code})")


@dataclasses.dataclass(frozen=True)
class FlightEntry:
    """One recorded call of one rank. ``comm``: the communicator (its barrier counter's offset
    in the control segment, the same on every member); ``index``: the rank's index in it;
    ``members``: its members' world ranks (None if not recorded); ``dst``, ``src``: a
    point-to-point call's peers as world ranks (None: no such half), ``call`` and
    ``recv_call`` its sequence numbers with them; ``world`` the job's size; times in seconds
    of CLOCK_MONOTONIC (``time.monotonic()``)."""
    rank: int
    seq: int
    comm: int
    size: int
    index: int
    op: str
    call: int
    count: int
    nbytes: int
    root: int
    entry_barrier: int
    last_barrier: int
    entered_at: float
    last_at: float | None
    state: str
    members: tuple[int, ...] | None = None
    dst: int | None = None
    src: int | None = None
    recv_call: int = 0
    world: int = 0

    @property
    def p2p(self) -> bool:
        return self.op in P2P

    def call_name(self) -> str:
        """The call in a few words: ``all_gather #12``, ``recv from rank 3 #2``; a program's
        calls on a communicator are numbered from 1 (#0: init()'s own barrier on the world)."""
        if not self.p2p:
            return f"{self.op} #{self.call}" if self.call > 0 else f"{self.op} of stratacl.init()"
        halves = []
        if self.dst is not None:
            halves.append(f"to rank {self.dst} #{self.call}")
        if self.src is not None:
            halves.append(f"from rank {self.src} #{self.recv_call}")
        return f"{self.op} {' and '.join(halves)}"

    def describe(self, now: float) -> str:
        if self.p2p:
            what = f"{self.call_name()} ({self.count} elements)"
        else:
            what = (f"{self.op} (call #{self.call} on a communicator of {self.size}" if self.call > 0
                    else f"{self.op} of stratacl.init() (on a communicator of {self.size}")
            if self.members is not None and self.size < self.world:
                what += f" {list(self.members)}"
            what += f", {self.count} elements"
            what += f", root {self.root})" if self.op == "broadcast" else ")"
        since = self.last_at if self.state in ("data done", "departed") and self.last_at else self.entered_at
        return f"{what}: {self.state} {now - since:.1f} s ago"


def _state(ctl: Control, comm: int, size: int, k_entry: int, k_last: int) -> str:
    if k_entry == 0:                                    # a point-to-point call
        return "departed" if k_last == FL_K_DONE else "entered"
    counter = int.from_bytes(ctl.read(comm, 8), "little")

    def passed(k: int) -> bool:
        return counter >= k * size

    if k_last <= k_entry:
        return "arrived" if k_last == k_entry and passed(k_entry) else "entered"
    return "departed" if passed(k_last) else "data done"


def _members(ctl: Control, comm: int, size: int) -> tuple[int, ...] | None:
    """The members' world ranks as the communicator's slot lists them (None if it does not)."""
    if not 0 < size <= ctl.world:
        return None
    words = np.frombuffer(ctl.read(comm + ctl.layout.slot_members(), 4 * (1 + size)), dtype=np.int32)
    if int(words[0]) != size:
        return None
    members = tuple(int(m) for m in words[1:])
    return members if all(0 <= m < ctl.world for m in members) else None


def read(ctl: Control, rank: int) -> list[FlightEntry]:
    """``rank``'s recorded calls, oldest first."""
    # read from the file, not the mapping (Control.read): a reader of a failed job never dies of SIGBUS
    words = np.frombuffer(ctl.read(ctl.layout.flight(rank), 8 * (FLIGHT_HEADER + FLIGHT_ENTRIES * FL_WORDS)),
                          dtype=np.int64)
    total = int(words[0])
    entries = words[FLIGHT_HEADER:].reshape(FLIGHT_ENTRIES, FL_WORDS)
    out = []
    for seq in range(max(1, total - FLIGHT_ENTRIES + 1), total + 1):
        e = entries[seq % FLIGHT_ENTRIES]
        if int(e[FL_SEQ]) != seq:
            continue        # being written when the rank stopped
        comm, size = int(e[FL_COMM]), int(e[FL_N])
        k_entry, k_last = int(e[FL_K_ENTRY]), int(e[FL_K_LAST])
        call = int(e[FL_CALL])
        if k_entry and comm == ctl.layout.world_slot():
            call -= WORLD_INIT_CALLS       # the program's calls from 1; init()'s barrier is #0
        members = _members(ctl, comm, size)

        def world(i: int) -> int | None:
            if i < 0:
                return None
            return members[i] if members is not None and i < len(members) else i

        out.append(FlightEntry(
            rank, seq, comm, size, int(e[FL_ME]), op_name(int(e[FL_OP])),
            call, int(e[FL_COUNT]), int(e[FL_NBYTES]), int(e[FL_ROOT]), k_entry, k_last,
            int(e[FL_T_ENTER]) / 1e9, int(e[FL_T_LAST]) / 1e9 if k_last else None,
            _state(ctl, comm, size, k_entry, k_last), members, world(int(e[FL_DST])), world(int(e[FL_SRC])),
            int(e[FL_RECV_CALL]), ctl.world))
    return out


def read_all(ctl: Control) -> dict[int, list[FlightEntry]]:
    return {r: read(ctl, r) for r in range(ctl.world)}


def stragglers(records: dict[int, list[FlightEntry]], world: int) -> list[str]:
    """What the ranks' newest calls say. Communicator by communicator, the ranks behind the
    others in its collectives (their newest collective there is older than the others', or
    they made none there) and the ranks in another operation than the others in the same
    call; then every rank waiting in a point-to-point call, with what its peers do."""
    newest = {r: recs[-1] for r, recs in records.items() if recs}
    by_comm: dict[int, dict[int, FlightEntry]] = {}
    for r, recs in records.items():
        for e in recs:
            if not e.p2p:
                by_comm.setdefault(e.comm, {})[r] = e      # oldest first: the newest stays
    lines = []
    for comm, last in sorted(by_comm.items()):
        any_entry = next(iter(last.values()))
        size, members = any_entry.size, any_entry.members
        top = max(e.call for e in last.values())
        ahead = [r for r, e in last.items() if e.call == top]
        ops: dict[str, list[int]] = {}
        for r in ahead:
            ops.setdefault(last[r].op, []).append(r)
        majority = max(ops, key=lambda op: len(ops[op]))
        if size == world:
            where = f"call #{top} on the communicator of {size} ranks (world)"
        elif members is not None:
            where = f"call #{top} on the communicator of {size} ranks {list(members)}"
        else:
            where = f"call #{top} on a communicator of {size} ranks that rank(s) {sorted(last)} are in"
        if len(ops) > 1:
            for op, ranks in sorted(ops.items()):
                if op != majority:
                    lines.append(f"rank(s) {ranks} entered {op} as {where}, where rank(s) {sorted(ops[majority])} "
                                 f"entered {majority}")
        behind = sorted(r for r, e in last.items() if e.call < top)
        # a rank whose records are not here (one on another host, jobs/_hostjob.py) is not
        # said to have made no call: nothing is known of it
        if size == world:
            behind += [r for r in range(world) if r not in last and r in records]
        elif members is not None:
            behind += [r for r in members if r not in last and r in records]
        elif len(last) < size:
            # the communicator's slot did not list its members (its index 0 never made it)
            silent = size - len(last)
            lines.append(f"{silent} of the {size} members of the communicator of rank(s) {sorted(last)} made no "
                         f"call on it: {'it' if silent == 1 else 'they'} never entered {majority}, call #{top} there")
        for r in sorted(behind):
            now_in = newest.get(r)
            doing = (f"its newest call is {now_in.call_name()} on "
                     f"{'this' if now_in.comm == comm else 'another'} communicator, {now_in.state}"
                     if now_in is not None else "it made no call")
            lines.append(f"rank {r} never entered {majority}, {where}: {doing}")
    for r, e in sorted(newest.items()):
        if not e.p2p or e.state != "entered":
            continue
        for peer in (p for p in (e.dst, e.src) if p is not None):
            theirs = newest.get(peer)
            doing = (f"rank {peer}'s newest call is {theirs.call_name()}, {theirs.state}" if theirs is not None
                     else f"rank {peer} made no call")
            lines.append(f"rank {r} waits in {e.call_name()}: {doing}")
    return lines
