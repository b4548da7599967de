"""Why the ranks share the launcher's session: a counter barrier of N processes, with and
without yielding polls, with the processes in one session or each in its own. A benchmark,
not a test: it prints a markdown table.

    python benchmarks/sched_groups.py                  # N = 8 and 32, about 20 s
    python benchmarks/sched_groups.py -n 32 --iters 5000

Every process runs the communicators' own barrier (``_native.sync``: one fetch-add, then
``polls`` sched_yield polls, then futex sleeps) in a loop, with no Python per barrier beyond
the loop. With autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled = 1) each
session is a scheduling group of its own, and sched_yield only yields to tasks of the caller's
group: a process alone in its session gets its core straight back, so its polls are spins and
the barrier costs as much as with futex sleeps. The launcher therefore keeps the ranks in its
session (stratacl/jobs/_supervisor.py), and waits poll before sleeping (runtime/services/_sync.py).
"""
from __future__ import annotations

import argparse
import mmap
import os
import struct
import time

import numpy as np

from stratacl.runtime import _native

COUNTER, GEN, ARRIVALS, RESULTS = 0, 64, 128, 2048     # offsets in the shared page
SLICE = 5.0                                            # seconds a barrier may take before the run fails


def _autogroup() -> str:
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return "on" if f.read().strip() == "1" else "off"
    except OSError:
        return "not available"


def _rank(shared: mmap.mmap, me: int, n: int, polls: int, iters: int, own_session: bool) -> int:
    if own_session:
        os.setsid()
    base = _native.data_address(shared)
    tally = np.zeros(_native.T_WORDS, dtype=np.int64)      # the barrier numbers native code takes
    cx = np.zeros(_native.CX_DESC, dtype=np.int64)
    cx[_native.CX_COUNTER], cx[_native.CX_GEN], cx[_native.CX_ARRIVAL] = base + COUNTER, base + GEN, base + ARRIVALS + 4 * me
    cx[_native.CX_N], cx[_native.CX_ME], cx[_native.CX_TALLY] = n, me, _native.data_address(tally)
    for timed in (False, True):
        t0 = time.perf_counter()
        for _ in range(iters if timed else max(iters // 10, 50)):
            if _native.sync(cx, polls, SLICE) < 0:
                return 1
    struct.pack_into("d", shared, RESULTS + 8 * me, (time.perf_counter() - t0) / iters * 1e6)
    return 0


def barrier_us(n: int, polls: int, iters: int, own_session: bool) -> float:
    """Mean time per barrier over the N processes, in microseconds."""
    shared = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_SHARED)
    pids = []
    try:
        for me in range(n):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = _rank(shared, me, n, polls, iters, own_session)
                finally:
                    os._exit(code)
            pids.append(pid)
        failed = 0
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            failed += os.waitstatus_to_exitcode(status) != 0
        pids = []
        if failed:
            raise RuntimeError(f"{failed} of {n} processes did not complete a barrier within {SLICE:g} s")
        return float(np.mean(struct.unpack_from(f"{n}d", shared, RESULTS)))
    finally:
        for pid in pids:          # only after an error in the parent
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        shared.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--ranks", default="8,32", help="process counts, comma separated")
    ap.add_argument("--polls", default="0,10", help="yielding polls before sleeping, comma separated")
    ap.add_argument("--iters", type=int, default=3000, help="timed barriers per configuration")
    a = ap.parse_args()
    print(f"autogroup scheduling: {_autogroup()}; {os.cpu_count()} cores\n")
    print("| N | sessions | polls | us per barrier |")
    print("|---|---|---|---|")
    for n in (int(v) for v in a.ranks.split(",")):
        for own in (False, True):
            for polls in (int(v) for v in a.polls.split(",")):
                us = barrier_us(n, polls, a.iters, own)
                print(f"| {n} | {'one per process' if own else 'shared'} | {polls} | {us:.1f} |", flush=True)


if __name__ == "__main__":
    main()
