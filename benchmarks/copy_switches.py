"""What the copies of an all_to_all cost made once between switches, as in the operator,
against made back to back, as the host limit's workers make them. A benchmark, not a test:
it prints a markdown table.

    python benchmarks/copy_switches.py                          # N = 8, 256 KiB .. 4 MiB (~1 min)
    python benchmarks/copy_switches.py -n 32 --sizes 1M

Every rank makes exactly the copies of its all_to_all (one block from each member's input,
read at its shared address, into its own output), in three ways:

- ``free``: over and over with no synchronisation. Each rank keeps its core until the
  scheduler preempts it, after many rounds, as the host limit's workers do;
- ``yield``: the same, giving the core away (sched_yield) after each round, so that, as in
  the operator, every round of every rank follows a switch from another rank;
- ``operator``: ``comm.all_to_all`` itself (the copies, two barriers, the descriptors).

A fourth row, ``copies alone (yield)``, is the time the yield way spends inside its copies,
timed in each rank and multiplied by the ranks per core: what a round would take if switching
and the interpreter cost nothing.

A round is every rank's copies once: the columns are wall time per round and the bytes copied
per round over that time, medians over ranks and then over ``--repeat`` runs. When ranks
outnumber cores, the operator is close to ``yield``; the gap between ``free`` and ``yield``
is what the copies lose when each is made once between switches (docs/performance.md,
"Copies in a call against copies in a loop").
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import stratacl
from stratacl._config import parse_size
from stratacl.collectives import _kernels


def rounds(comm, size: int, iters: int, pin: bool = False) -> dict:
    n, me = comm.size, comm.rank
    if pin:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[me % len(cpus)]})
    x = stratacl.empty((size,), np.uint8)
    out = stratacl.empty((size,), np.uint8)
    x[:] = me
    block = size // n
    mine = stratacl.empty((1,), np.int64)
    inputs = stratacl.empty((n,), np.int64)
    mine[0] = x.ctypes.data
    comm.all_gather(inputs, mine)
    for p in range(n):                    # map every input here before timing
        stratacl.ub.view(int(inputs[p]), (size,), np.uint8)
    table = np.array([(out.ctypes.data + p * block, int(inputs[p]) + me * block, block) for p in range(n)],
                     dtype=np.int64)
    stratacl.ub.wait_registered()
    stream = int(n * size >= _kernels.stream_footprint())     # the operator's rule (collectives/_kernels.c)

    def free():
        _kernels.copy_many(table, stream)

    copying = [0.0]                       # wall time inside the copies themselves, yield way
    clock = time.perf_counter

    def yielding():
        t = clock()
        _kernels.copy_many(table, stream)
        copying[0] += clock() - t
        os.sched_yield()

    def operator():
        comm.all_to_all(out, x)

    times = {}
    for name, f in (("free", free), ("yield", yielding), ("operator", operator)):
        for _ in range(max(iters // 10, 3)):
            f()
        comm.barrier()
        copying[0] = 0.0
        t0 = time.perf_counter()
        for _ in range(iters):
            f()
        comm.barrier()                    # the last rank's copies are in the round too
        times[name] = (time.perf_counter() - t0) / iters
        if name == "yield":
            times["copying"] = copying[0] / iters
        want = np.repeat(np.arange(n, dtype=np.uint8), block)
        if not np.array_equal(out[:n * block], want):
            raise AssertionError(f"rank {me}: {name}: wrong bytes")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=8, help="ranks (default 8)")
    ap.add_argument("--sizes", default="256K,1M,4M", help="per-rank payloads, comma separated")
    ap.add_argument("--iters", type=int, default=200, help="rounds per way (default 200)")
    ap.add_argument("--pin", action="store_true", help="pin rank r to core r mod cores")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size; the table shows their median")
    a = ap.parse_args()
    print(f"N = {a.n} ranks on {os.cpu_count()} cores; all_to_all's copies, wall time per round\n")
    print("| per-rank payload | way | us per round | GB/s copied | vs free |")
    print("|---|---|---|---|---|")
    for size in (parse_size(s) for s in a.sizes.split(",")):
        runs = [stratacl.spawn(rounds, a.n, args=(size, a.iters, a.pin)) for _ in range(a.repeat)]
        copied = a.n * (size // a.n) * (a.n - 1)          # the blocks read from peers, every rank

        def median(way: str) -> float:       # over runs, of the median over ranks
            return float(np.median([np.median([r[way] for r in per_rank]) for per_rank in runs]))
        free = median("free")
        for way in ("free", "yield", "operator"):
            t = median(way)
            print(f"| {size // 1024} KiB | {way} | {t * 1e6:.1f} | {copied / t / 1e9:.1f} | {t / free:.2f} |")
        # the yield way's copies alone: a core's share of the ranks, each one's copy time
        t = median("copying") * a.n / (os.cpu_count() or 1)
        print(f"| {size // 1024} KiB | copies alone (yield) | {t * 1e6:.1f} | {copied / t / 1e9:.1f} | {t / free:.2f} |")


if __name__ == "__main__":
    main()
