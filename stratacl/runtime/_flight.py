"""The flight recorder: every rank's last collective calls, read from the control segment.

Each rank keeps its last FLIGHT_ENTRIES calls, on any communicator, in its region of the
control segment (_native.h, FL_*): native code opens an entry as the call publishes its
descriptor (op, call number on its communicator, element count, input bytes, root, the
entry barrier's number, the time) and notes every barrier the rank then arrives at. Nothing
is written from Python and nothing waits for it: a few stores per call and per barrier.

Whoever maps the segment can read it, also after a rank died or hung; the launcher does when
a job fails (jobs/_supervisor.py, format_failure). A call's state follows from its barrier
numbers and the communicator's barrier counter (barrier k has completed once the counter
reaches k x size):

    entered      the descriptor is published; the entry barrier has not completed
    arrived      every member arrived; the data moves (or moved, for a call whose end needs
                 no barrier: a rooted call's readers, a split)
    data done    at a later barrier (a two-phase call's middle, the departure), not completed
    departed     that barrier completed

``stragglers`` compares the ranks' newest calls communicator by communicator and names the
ranks that are behind (never entered the call the others are in) or in a different operation.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ._control import Control
from ._native import (FL_CALL, FL_COMM, FL_COUNT, FL_K_ENTRY, FL_K_LAST, FL_ME, FL_N, FL_NBYTES, FL_OP, FL_ROOT,
                      FL_SEQ, FL_T_ENTER, FL_T_LAST, FL_WORDS, FLIGHT_ENTRIES, FLIGHT_HEADER)
from ._protocol import OP_NAMES


@dataclasses.dataclass(frozen=True)
class FlightEntry:
    """One recorded call of one rank. ``comm``: the communicator (its barrier counter's offset
    in the control segment, the same on every member); ``index``: the rank's index in it;
    times in seconds of CLOCK_MONOTONIC (``time.monotonic()``)."""
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

    def describe(self, now: float) -> str:
        what = f"{self.op} (call #{self.call} on a communicator of {self.size}, {self.count} elements"
        what += f", root {self.root})" if self.op == "broadcast" else ")"
        since = self.last_at if self.state in ("data done", "departed") and self.last_at else self.entered_at
        return f"{what}: {self.state} {now - since:.1f} s ago"


def _state(ctl: Control, comm: int, size: int, k_entry: int, k_last: int) -> str:
    counter = int(ctl.u64[comm // 8])

    def passed(k: int) -> bool:
        return counter >= k * size

    if k_last <= k_entry:
        return "arrived" if k_last == k_entry and passed(k_entry) else "entered"
    return "departed" if passed(k_last) else "data done"


def read(ctl: Control, rank: int) -> list[FlightEntry]:
    """``rank``'s recorded calls, oldest first."""
    off = ctl.layout.flight(rank) // 8
    words = np.array(ctl.i64[off:off + FLIGHT_HEADER + FLIGHT_ENTRIES * FL_WORDS])
    total = int(words[0])
    entries = words[FLIGHT_HEADER:].reshape(FLIGHT_ENTRIES, FL_WORDS)
    out = []
    for seq in range(max(1, total - FLIGHT_ENTRIES + 1), total + 1):
        e = entries[seq % FLIGHT_ENTRIES]
        if int(e[FL_SEQ]) != seq:
            continue        # being written when the rank stopped
        comm, size = int(e[FL_COMM]), int(e[FL_N])
        k_entry, k_last = int(e[FL_K_ENTRY]), int(e[FL_K_LAST])
        out.append(FlightEntry(
            rank, seq, comm, size, int(e[FL_ME]), OP_NAMES.get(int(e[FL_OP]), f"op#{int(e[FL_OP])}"),
            int(e[FL_CALL]), int(e[FL_COUNT]), int(e[FL_NBYTES]), int(e[FL_ROOT]), k_entry, k_last,
            int(e[FL_T_ENTER]) / 1e9, int(e[FL_T_LAST]) / 1e9 if k_last else None,
            _state(ctl, comm, size, k_entry, k_last)))
    return out


def read_all(ctl: Control) -> dict[int, list[FlightEntry]]:
    return {r: read(ctl, r) for r in range(ctl.world)}


def stragglers(records: dict[int, list[FlightEntry]], world: int) -> list[str]:
    """What the ranks' newest calls say, communicator by communicator: the ranks behind the
    others (their newest call there is older than the others', or they made none on the world
    communicator) and the ranks in another operation than the others in the same call."""
    newest = {r: recs[-1] for r, recs in records.items() if recs}
    by_comm: dict[int, dict[int, FlightEntry]] = {}
    for r, recs in records.items():
        for e in recs:
            by_comm.setdefault(e.comm, {})[r] = e          # oldest first: the newest stays
    lines = []
    for comm, last in sorted(by_comm.items()):
        size = next(iter(last.values())).size
        top = max(e.call for e in last.values())
        ahead = [r for r, e in last.items() if e.call == top]
        ops: dict[str, list[int]] = {}
        for r in ahead:
            ops.setdefault(last[r].op, []).append(r)
        majority = max(ops, key=lambda op: len(ops[op]))
        if size == world:
            where = f"call #{top} on the communicator of {size} ranks (world)"
        elif len(last) == size:
            where = f"call #{top} on the communicator of {size} ranks {sorted(last)}"
        else:
            where = f"call #{top} on a communicator of {size} ranks that rank(s) {sorted(last)} are in"
        if len(ops) > 1:
            for op, ranks in sorted(ops.items()):
                if op != majority:
                    lines.append(f"rank(s) {ranks} entered {op} as {where}, where rank(s) {sorted(ops[majority])} "
                                 f"entered {majority}")
        behind = sorted(r for r, e in last.items() if e.call < top)
        if size == world:
            behind += [r for r in range(world) if r not in last]
        elif len(last) < size:
            # who the silent members are is not recorded: a communicator names only its members' slots
            silent = size - len(last)
            lines.append(f"{silent} of the {size} members of the communicator of rank(s) {sorted(last)} made no "
                         f"call on it: {'it' if silent == 1 else 'they'} never entered {majority}, call #{top} there")
        for r in sorted(behind):
            now_in = newest.get(r)
            doing = (f"its newest call is {now_in.op} #{now_in.call} on "
                     f"{'this' if now_in.comm == comm else 'another'} communicator, {now_in.state}"
                     if now_in is not None else "it made no collective call")
            lines.append(f"rank {r} never entered {majority}, {where}: {doing}")
    return lines
