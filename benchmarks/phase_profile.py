"""Where an all_gather's wall time goes, per rank: copying, waiting in barriers, the rest.

    python benchmarks/phase_profile.py -n 8 --per-rank 64K
    python benchmarks/phase_profile.py -n 32 --per-rank 64K --barrier

Inside every rank the backend's executor and the communicator's barrier are wrapped with
timers; the rest of a call is Python (argument checks, descriptors, readiness cache).
``--barrier`` also times the bare native barrier (arrive + wait, no Python) against
``comm.barrier()``: the difference is the Python cost of a call, paid once per rank and
phase, i.e. N / cores times per phase on a host with fewer cores than ranks.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import stratacl
from stratacl._config import parse_size


def profile(comm, per_rank: int, iters: int, barrier: bool):
    from stratacl.runtime import _comm, _execute, _native, _sync

    x = stratacl.empty((per_rank,), np.uint8)
    out = stratacl.empty((per_rank * comm.size,), np.uint8)
    spent = {"copy": 0.0, "barrier": 0.0}
    run_plan = _execute.run_plan
    sync = _comm.Communicator._sync

    def timed_run(*args):
        t0 = time.perf_counter()
        r = run_plan(*args)
        spent["copy"] += time.perf_counter() - t0
        return r

    def timed_sync(self, op):
        t0 = time.perf_counter()
        sync(self, op)
        spent["barrier"] += time.perf_counter() - t0

    _execute.run_plan = timed_run
    _comm.Communicator._sync = timed_sync
    for _ in range(3):
        comm.all_gather(out, x)
    spent["copy"] = spent["barrier"] = 0.0
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.all_gather(out, x)
    total = (time.perf_counter() - t0) / iters
    row = {"total": total, "copy": spent["copy"] / iters, "barrier": spent["barrier"] / iters}
    _comm.Communicator._sync = sync
    _execute.run_plan = run_plan
    if barrier:
        c = comm
        t0 = time.perf_counter()
        for _ in range(iters):
            c._syncs += 1
            _native.sync(c._cx, c._syncs, _sync.SPIN_POLLS, 10.0)
        row["native_barrier"] = (time.perf_counter() - t0) / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            comm.barrier()
        row["comm_barrier"] = (time.perf_counter() - t0) / iters
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--per-rank", default="64K")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--barrier", action="store_true")
    a = ap.parse_args()
    rows = stratacl.spawn(profile, a.n, args=(parse_size(a.per_rank), a.iters, a.barrier))
    keys = list(rows[0])
    print(f"all_gather of {a.per_rank} per rank on {a.n} ranks; microseconds per call, median over ranks")
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    print("| " + " | ".join(f"{np.median([r[k] for r in rows]) * 1e6:.1f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
