"""The host limit: how fast this host's cores can copy a working set as large as the operator's.

One worker process per host core copies its share of the footprint (half source, half
destination) over and over; the aggregate copy bandwidth is the bytes all workers copied
divided by the common wall time. The same footprint as the operator's means the same cache
effects: a 64 KiB sweep point is measured in cache, a 16 MiB one in DRAM. Each footprint is
copied both ways the library's kernels can write (ordinary stores, as memcpy; streaming stores,
collectives/_kernels.c) and the faster counts: the limit is the host's, not one method's.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np

from ..collectives import copy_many

STREAMING = (0, 1)     # copy_many's stream argument: ordinary stores, streaming stores


def _worker(footprints: list[int], seconds: float, start, results) -> None:
    out = []
    for fp in footprints:
        half = max(fp // 2, 4096)
        src = np.ones(half, np.uint8)
        dst = np.zeros(half, np.uint8)
        table = np.array([[dst.__array_interface__["data"][0], src.__array_interface__["data"][0], half]], np.int64)
        for stream in STREAMING:
            copy_many(table, stream)
            start.wait()
            copied, t0 = 0, time.perf_counter()
            while True:
                copy_many(table, stream)
                copied += half
                if time.perf_counter() - t0 >= seconds:
                    break
            out.append((copied, time.perf_counter() - t0))
            start.wait()
    results.put(out)


def copy_bandwidth_by_stores(footprints: list[int], workers: int | None = None,
                             seconds: float = 0.25) -> list[tuple[float, ...]]:
    """Aggregate copy bandwidth (GB/s, 1e9) of ``workers`` cores for each total footprint
    (bytes), once per way of storing (``STREAMING``: ordinary, streaming)."""
    workers = workers or os.cpu_count() or 1
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(workers)
    results = ctx.Queue()
    shares = [max(fp // workers, 8192) for fp in footprints]
    procs = [ctx.Process(target=_worker, args=(shares, seconds, start, results), daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    per_worker = [results.get(timeout=60 + 4 * seconds * len(footprints) * len(STREAMING)) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    ways = len(STREAMING)
    return [tuple(sum(w[i * ways + k][0] for w in per_worker) / max(w[i * ways + k][1] for w in per_worker) / 1e9
                  for k in range(ways)) for i in range(len(footprints))]


def copy_bandwidth(footprints: list[int], workers: int | None = None, seconds: float = 0.25) -> list[float]:
    """The host limit: for each footprint, the faster of the two ways of storing."""
    return [max(ways) for ways in copy_bandwidth_by_stores(footprints, workers, seconds)]
