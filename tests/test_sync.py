"""Waiting: a wake of a communicator word is skipped only while nobody sleeps on one."""
from __future__ import annotations

import time

import numpy as np

import stratacl
from stratacl.runtime import _native
from stratacl.runtime.services import _sync
from stratacl.runtime.services._control import H_SLEEPERS
from stratacl.runtime import runtime


LONG_SLICE = 10.0          # seconds: Python's counted waits sleep this long unless woken


def late_arrivals(comm, rounds: int):
    """Rank 0 comes late to a barrier, a broadcast and a send: once the others are counted asleep
    in Python's waits (or 20 s into the rounds, if they never are). Returns how long after rank
    0's arrival each wait ended, and the sleepers' count just before rank 0 arrived.

    Python's waits here sleep LONG_SLICE between health checks instead of 50 ms, so a wake
    skipped wrongly costs a waiter seconds, not milliseconds: the test can tell a missed wake
    from a loaded host by a deadline, without timing anything finely."""
    _sync.SLICE = LONG_SLICE
    word = runtime().ctl.base + H_SLEEPERS
    me, n = comm.rank, comm.size
    x = stratacl.zeros((1000,), np.float32)
    stamps = stratacl.zeros((n,), np.float64)
    mine = stratacl.zeros((1,), np.float64)
    ops = [comm.barrier, lambda: comm.broadcast(x, root=0),
           lambda: comm.send(x, 1) if me == 0 else comm.recv(x, 0) if me == 1 else None]
    lags, asleep = [], []
    deadline = time.monotonic() + 20              # for all rounds: a count that never comes fails once
    for r in range(rounds):
        if me == 0:                               # every other rank waits for rank 0 in some call
            while _native.load_u32(word) < n - 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            asleep.append(_native.load_u32(word))
            mine[0] = time.monotonic()
            ops[r % 3]()
        else:
            ops[r % 3]()
            mine[0] = time.monotonic()
        comm.all_gather(stamps, mine)
        waiters = range(1, n) if r % 3 < 2 else [1]
        lags += [float(stamps[i] - stamps[0]) for i in waiters]
    return lags, asleep


def test_sleeping_waiters_are_counted_and_woken_at_once():
    """A wake of a communicator word is skipped only while nobody is counted asleep
    (_waits.c, set_sleepers). A wake skipped wrongly leaves a sleeper to the end of its slice,
    LONG_SLICE here: a wait ending half a slice after the last arrival was not woken. (How soon
    a woken waiter runs is the host's business, not this test's.)"""
    results = stratacl.spawn(late_arrivals, 4, args=(12,), timeout=60)
    lags, asleep = results[0][0], results[0][1]
    assert asleep == [3] * 12, f"peers waiting for a late rank were not counted asleep: {asleep}"
    assert max(lags) < LONG_SLICE / 2, f"waits ended {sorted(lags)} s after the last arrival: not woken"


def barrier_forms(comm):
    """Every way of calling barrier, each followed by a check that it waited for everyone: the
    native common case, a keyword, debug logging (the Python path, which logs), asynchronous,
    and blocking once a worker thread exists. Returns what this rank read from its right-hand
    peer's word after each, the barrier records logged, and the barriers counted."""
    import logging
    me, n = comm.rank, comm.size
    word = stratacl.zeros((1,), np.int64)
    addrs = stratacl.zeros((n,), np.int64)
    mine = stratacl.zeros((1,), np.int64)
    mine[0] = word.ctypes.data
    comm.all_gather(addrs, mine)
    right = stratacl.ub.view(int(addrs[(me + 1) % n]), (1,), np.int64)
    log = logging.getLogger("stratacl")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())

    def logged():
        log.addHandler(handler)
        log.setLevel(logging.DEBUG)
        try:
            comm.barrier()
        finally:
            log.setLevel(logging.WARNING)
            log.removeHandler(handler)

    forms = [comm.barrier, lambda: comm.barrier(path="mte"), logged, comm.barrier,
             lambda: comm.barrier(async_op=True).wait(), comm.barrier]
    before = stratacl.stats()["calls"].get("barrier", 0)
    seen = []
    for i, form in enumerate(forms, 1):
        if me == i % n:
            time.sleep(0.02)          # late, so that a barrier that does not wait shows a stale word
        word[0] = i
        form()
        seen.append(int(right[0]))
        comm.barrier()                # nobody writes i + 1 before everyone has read i
    counted = stratacl.stats()["calls"].get("barrier", 0) - before
    return seen, [m for m in records if m.startswith("barrier call")], counted


def test_every_form_of_barrier_waits_for_everyone():
    for n in (1, 3):
        for seen, logged, counted in stratacl.spawn(barrier_forms, n, timeout=60):
            assert seen == [1, 2, 3, 4, 5, 6], seen
            assert len(logged) == 1, logged
            assert counted == 12, counted
