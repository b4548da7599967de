"""Per-call software cost: tiny calls on 2 ranks, one per host core, best of 5 loops.

    python benchmarks/call_cost.py [-n 2] [--reps 5000]

With one rank per core nobody sleeps, and a 64-byte call's time is the software path: the
Python or native entry, the checks (or their prepared replay), the descriptor, the barriers'
cache-line round trips. That is what a change to the inside of the library can slow down, and
it is measured here without the scheduling noise that decides small calls at N = 8 or 32 on
two cores (docs/performance.md). Run it under each of two installs to compare them; ``plain``
rows pass numpy arrays outside HBM (staged, not prepared), ``hbm`` rows arrays of
``stratacl.empty`` (prepared after the first call).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import stratacl


def _loops(comm, reps: int) -> dict[str, float]:
    x = stratacl.empty((16,), np.float32)
    x[:] = 1
    plain = np.ones(16, np.float32)
    g = stratacl.empty((16 * comm.size,), np.float32)
    cases = {"all_reduce hbm": lambda: comm.all_reduce(x), "all_reduce plain": lambda: comm.all_reduce(plain),
             "broadcast hbm": lambda: comm.broadcast(x, 0), "broadcast plain": lambda: comm.broadcast(plain, 0),
             "all_gather hbm": lambda: comm.all_gather(g, x), "barrier": comm.barrier}
    out = {}
    for name, call in cases.items():
        for _ in range(200):
            call()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                call()
            best = min(best, (time.perf_counter() - t0) / reps * 1e6)
        out[name] = best
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nranks", type=int, default=2)
    p.add_argument("--reps", type=int, default=5000)
    args = p.parse_args()
    rows = stratacl.spawn(_loops, args.nranks, args=(args.reps,))
    print(f"{'call (64 B)':<18} {'us per call, slowest rank':>26}")
    for name in rows[0]:
        print(f"{name:<18} {max(r[name] for r in rows):>26.2f}")


if __name__ == "__main__":
    main()
