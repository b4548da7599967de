"""Waiting with deadlines: barriers and flags in the control segment.

Every wait is a short yielding spin, then futex sleeps in slices that double from SLICE to
MAX_SLICE; between slices the job's first failure and the waited-for peers' states are checked,
so a dead peer is reported within one slice, and a peer that never arrives within ``timeout`` seconds gives ``CommTimeout``
naming the missing ranks.

A barrier is one atomic fetch-add on a counter in the leader's communicator slot; the last
arriver publishes the generation in a futex word and wakes everyone.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Callable

from ..._errors import CommTimeout, PeerFailure
from .. import _native
from ._control import (
    FAILED_CARRIER, FAILED_DAEMON, FAILED_EXIT, FAILED_GONE, FAILED_SHUTDOWN, FAILED_SIGNAL, STATE_DEAD,
    STATE_FINALIZED, Control, carrier_failure,
)

# Yielding polls before sleeping on the futex. A poll that yields hands the core to another
# rank without the cost of a futex sleep and a wake-up, which is most of a barrier's cost once
# several ranks share a core: barrier at N = 8 on 2 cores 39 -> 17 us, at N = 32 229 -> 131 us,
# 4 KiB all_reduce at N = 32 740 -> 580 us (3, 10, 30 or 100 polls: within noise). It works only
# if the ranks share one scheduling group; the launcher keeps them in its session for that.
SPIN_POLLS = 10
SLICE = 0.05             # seconds of a wait's first sleep between health checks
# Each further sleep of a long wait is twice the last, up to MAX_SLICE: a waiter whose peers
# are slow wakes a few times a second, not 20 (with a health check that reads every peer's
# state, O(N)). At N = 256 on 2 cores, 20 wake-ups a second per waiting rank cost the ranks
# still starting more than a core. A failure is seen within MAX_SLICE.
MAX_SLICE = 0.8
WAKE_ALL = 0x7FFFFFFF


def _signal_name(value: int) -> str:
    try:
        return signal.Signals(value).name
    except ValueError:
        return f"signal {value}"


def _describe_failure(kind: int, value: int) -> str:
    if kind == FAILED_SIGNAL:
        try:
            return f"killed by {signal.Signals(value).name}"
        except ValueError:
            return f"killed by signal {value}"
    if kind == FAILED_EXIT:
        if value == 0:
            return "exited (code 0) without finalizing"
        return f"exited with code {value}"
    if kind == FAILED_GONE:
        return "ended without finalizing"
    return "failed"


class JobHealth:
    """Answers 'may I keep waiting?' for one rank."""

    def __init__(self, ctl: Control, rank: int):
        self.ctl, self.rank = ctl, rank

    def check(self, operation: str, waiting_for: list[int]) -> None:
        failure = self.ctl.failure()
        if failure is not None:
            frank, kind, value = failure
            if kind == FAILED_DAEMON:
                how = _describe_failure(FAILED_SIGNAL if value < 0 else FAILED_EXIT, abs(value))
                raise PeerFailure(f"{operation}: rank {self.rank}: the job is shutting down: its bootstrap "
                                  f"daemon ended ({how})", None, operation)
            if kind == FAILED_CARRIER:
                raise PeerFailure(f"{operation}: rank {self.rank}: the job is shutting down: "
                                  f"{carrier_failure(value)}", None, operation)
            if kind == FAILED_SHUTDOWN:
                why = ("it passed its deadline (--deadline)" if value == signal.SIGALRM
                       else f"the launcher got {_signal_name(value)}")
                raise PeerFailure(f"{operation}: rank {self.rank}: the job is shutting down: {why}",
                                  None, operation)
            # a rank that failed after this wait began (say, timing out on the same straggler)
            # is not the whole story: name the ranks this wait still misses too
            also = f" (rank(s) {waiting_for} had not arrived)" if waiting_for and frank not in waiting_for else ""
            raise PeerFailure(f"{operation}: rank {self.rank}: peer rank {frank} "
                              f"{_describe_failure(kind, value)}; this operation cannot complete{also}",
                              frank, operation)
        for p in waiting_for:
            st = self.ctl.state(p)
            if st in (STATE_FINALIZED, STATE_DEAD):
                how = "has died" if st == STATE_DEAD else "has finalized"
                raise PeerFailure(f"{operation}: rank {self.rank}: peer rank {p} {how} "
                                  f"and will not take part", p, operation)


def wait_until(ready: Callable[[], bool], futex_addr: int, health: JobHealth, operation: str,
               timeout: float, missing: Callable[[], list[int]], what: str) -> None:
    """Return once ``ready()``; sleep on ``futex_addr`` (a u32 whose change signals progress).
    Once the job has failed it raises at once: native code stops at its next barrier or
    transfer and hands the wait to here (_waits.c, failure_word)."""
    if health.ctl.failure() is not None:
        health.check(operation, missing())
    if ready():
        return
    for _ in range(SPIN_POLLS):
        _native.fence()
        if ready():
            return
        os.sched_yield()
    deadline = time.monotonic() + timeout
    nap = SLICE
    while True:
        seen = _native.load_u32(futex_addr)
        if ready():
            return
        left = deadline - time.monotonic()
        if left <= 0:
            gone = missing()
            raise CommTimeout(f"{operation}: rank {health.rank} waited {timeout:g} s for {what}; "
                              f"still missing: {gone}. Raise --timeout (STRATACL_TIMEOUT) if they are "
                              f"only slow.", operation, gone)
        _native.futex_wait(futex_addr, seen, min(nap, left), True)     # counted: see set_sleepers
        if not ready():
            health.check(operation, missing())
            nap = min(2 * nap, MAX_SLICE)

