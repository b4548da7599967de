"""The host limit: how fast this host's cores can copy a working set as large as the operator's.

One worker process per host core copies its share of the footprint (half source, half
destination) over and over; the aggregate copy bandwidth is the bytes all workers copied
divided by the common wall time. The same footprint as the operator's means the same cache
effects: a 64 KiB sweep point is measured in cache, a 16 MiB one in DRAM.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np


def _worker(footprints: list[int], seconds: float, start, results) -> None:
    out = []
    for fp in footprints:
        half = max(fp // 2, 4096)
        src = np.ones(half, np.uint8)
        dst = np.zeros(half, np.uint8)
        np.copyto(dst, src)
        start.wait()
        copied, t0 = 0, time.perf_counter()
        while True:
            np.copyto(dst, src)
            copied += half
            if time.perf_counter() - t0 >= seconds:
                break
        out.append((copied, time.perf_counter() - t0))
        start.wait()
    results.put(out)


def copy_bandwidth(footprints: list[int], workers: int | None = None, seconds: float = 0.25) -> list[float]:
    """Aggregate copy bandwidth (GB/s, 1e9) of ``workers`` cores for each total footprint (bytes)."""
    workers = workers or os.cpu_count() or 1
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(workers)
    results = ctx.Queue()
    shares = [max(fp // workers, 8192) for fp in footprints]
    procs = [ctx.Process(target=_worker, args=(shares, seconds, start, results), daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    per_worker = [results.get(timeout=60 + 4 * seconds * len(footprints)) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    bw = []
    for i in range(len(footprints)):
        copied = sum(w[i][0] for w in per_worker)
        elapsed = max(w[i][1] for w in per_worker)
        bw.append(copied / elapsed / 1e9)
    return bw
