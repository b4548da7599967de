"""A one-shot all_reduce as a user's operator, on the host: stratacl.fabric against MPI one-sided.

    python benchmarks/one_sided.py [--nranks 8] [--bytes 1M] [-w 3] [-i 20] [--mpi-btl vader,tcp] [--json out.json]

Both sides run the same algorithm on N processes of this host, float32 sum, every rank's
output checked: every rank reads every peer's whole buffer and adds them in rank order.

    stratacl   fabric.SliceMap of N reduce slices, run by fabric.run (zero copy from the peers'
               HBM at their shared addresses; one phase; the departure barrier)
    MPI        Open MPI (the pip wheel), mpi4py: a window over each rank's buffer
               (Win.Create), then per peer Lock(shared), Get into a scratch buffer, Unlock,
               and a numpy add; a Barrier ends the call. --mca osc rdma over the byte transport
               ``--mpi-btl`` names: vader (shared memory, the default), tcp (loopback sockets:
               what a window read costs when its bytes cross a network stack), or both, each
               its own row

The time of a call is the slowest rank's mean over ``-i`` calls after ``-w`` warm-up calls.
Bus bandwidth follows nccl-tests for all_reduce: algbw = bytes / time, busbw = algbw x 2(N-1)/N.
Nothing else should run on the host meanwhile.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

MPIRUN_FLAGS = ("--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1", "--mca", "pml", "ob1",
                "--mca", "osc", "rdma")
BTLS = ("vader", "tcp")


def _bytes(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1].upper()] if text[-1].upper() in mult else int(text)


def strata_rank(comm, nbytes: int, warmup: int, iters: int) -> tuple[float, bool]:
    import stratacl
    from stratacl import fabric
    n, me = comm.size, comm.rank
    count = nbytes // 4
    x = stratacl.empty((count,), np.float32)
    x[...] = np.arange(count, dtype=np.float32) % 13 + me
    out = stratacl.empty((count,), np.float32)
    smap = fabric.SliceMap()
    for p in range(n):
        smap.reduce(p, x.nbytes)
    for _ in range(warmup):
        fabric.run(comm, smap, x, out, name="one_shot_all_reduce")
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fabric.run(comm, smap, x, out, name="one_shot_all_reduce")
    dt = (time.perf_counter() - t0) / iters
    want = (np.arange(count, dtype=np.float32) % 13) * n + sum(range(n))
    return dt, bool(np.array_equal(out, want.astype(np.float32)))


def mpi_rank(nbytes: int, warmup: int, iters: int, out_path: str) -> None:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    n, me = comm.size, comm.rank
    count = nbytes // 4
    x = np.arange(count, dtype=np.float32) % 13 + me
    win = MPI.Win.Create(x, comm=comm)
    tmp = np.empty(count, np.float32)
    out = np.empty(count, np.float32)

    def call():
        out[...] = 0
        for p in range(n):
            win.Lock(p, MPI.LOCK_SHARED)
            win.Get(tmp, p)
            win.Unlock(p)
            np.add(out, tmp, out=out)
        comm.Barrier()
    for _ in range(warmup):
        call()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    dt = (time.perf_counter() - t0) / iters
    want = (np.arange(count, dtype=np.float32) % 13) * n + sum(range(n))
    ok = bool(np.array_equal(out, want.astype(np.float32)))
    slowest = comm.allreduce(dt, op=MPI.MAX)
    every_ok = comm.allreduce(int(ok), op=MPI.MIN)
    win.Free()
    if me == 0:
        with open(out_path, "w") as f:
            json.dump({"time_s": slowest, "exact": bool(every_ok)}, f)


def run_mpi(n: int, nbytes: int, warmup: int, iters: int, btl: str = "vader") -> dict:
    scripts = os.path.dirname(sys.executable)
    mpirun = os.path.join(scripts, "mpirun")
    if not os.path.exists(mpirun):
        return {"error": f"no mpirun beside {sys.executable}: pip install -e '.[mpi]'"}
    with tempfile.TemporaryDirectory(prefix="stratacl-onesided-") as tmp:
        out = os.path.join(tmp, "mpi.json")
        root = ("--allow-run-as-root",) if os.geteuid() == 0 else ()
        cmd = [mpirun, *root, *MPIRUN_FLAGS, "--mca", "btl", f"self,{btl}", "-np", str(n), sys.executable, os.path.abspath(__file__), "--mpi-rank",
               str(nbytes), str(warmup), str(iters), out]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0 or not os.path.exists(out):
            return {"error": f"mpirun failed ({proc.returncode}): {proc.stderr[-1500:]}"}
        with open(out) as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--mpi-rank":
        mpi_rank(int(argv[1]), int(argv[2]), int(argv[3]), argv[4])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nranks", type=int, default=8)
    p.add_argument("--bytes", default="1M")
    p.add_argument("-w", "--warmup", type=int, default=3)
    p.add_argument("-i", "--iters", type=int, default=20)
    p.add_argument("--mpi-btl", default="vader", help="Open MPI byte transports to run the MPI side over, "
                                                        "comma-separated: vader (shared memory), tcp")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    btls = a.mpi_btl.split(",")
    if not set(btls) <= set(BTLS):
        p.error(f"--mpi-btl: {a.mpi_btl!r}; choose from {', '.join(BTLS)}")
    import stratacl
    n, nbytes = a.nranks, _bytes(a.bytes)
    results = stratacl.spawn(strata_rank, n, args=(nbytes, a.warmup, a.iters), timeout=1800)
    strata = {"time_s": max(t for t, _ in results), "exact": all(ok for _, ok in results)}
    mpis = {btl: run_mpi(n, nbytes, a.warmup, a.iters, btl) for btl in btls}
    factor = 2 * (n - 1) / n
    rows = []
    print(f"one-shot all_reduce, N = {n}, {nbytes} bytes, float32 sum (host wall time, slowest rank)")
    print(f"{'side':<28} {'time us':>10} {'busbw GB/s':>11}  exact")
    sides = [("stratacl.fabric (zero copy)", strata)] + [(f"MPI_Get over {btl}", r) for btl, r in mpis.items()]
    for name, r in sides:
        if "error" in r:
            print(f"{name:<28} {'-':>10} {'-':>11}  {r['error']}")
            rows.append({"side": name, **r})
            continue
        busbw = nbytes / r["time_s"] / 1e9 * factor
        print(f"{name:<28} {r['time_s'] * 1e6:>10.1f} {busbw:>11.2f}  {r['exact']}")
        rows.append({"side": name, "time_us": r["time_s"] * 1e6, "busbw_gbs": busbw, "exact": r["exact"]})
    for btl, mpi in mpis.items():
        if "error" not in mpi:
            print(f"MPI over {btl} / stratacl time: {mpi['time_s'] / strata['time_s']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": "python benchmarks/one_sided.py " + " ".join(argv), "nranks": n, "bytes": nbytes,
                       "rows": rows}, f, indent=1)
    return 0 if strata["exact"] and all(m.get("exact", True) for m in mpis.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
