"""What the cross-host carrier costs per barrier and per GB, against a copy within the host.

    python benchmarks/carrier_cost.py [--hosts 2] [--ranks-per-host 4] [--bytes 4M] [-i 10]
                                      [--btl tcp] [--json PATH]

Starts ``--hosts`` carriers (stratacl/runtime/hosts/_carrier.py) under the Open MPI wheel's ``mpirun``
on this machine, each with ``--ranks-per-host`` HBM segments, and times, best and median of
``-i`` rounds:

    exchange      one block of slot words per host (4 KiB a rank: a communicator slot's size)
                  traded by every host (an MPI all-gather): what a barrier spanning hosts adds
                  before anything is read
    read          every carrier reads ``--bytes`` from each rank of every other host into its
                  mirrors (``Carrier.read``: MPI_Get under passive-target locks over
                  ``--btl``), all at once: a full-mesh call's pulls across hosts, each byte once
    local copy    the same bytes copied within one process (numpy, segment to mirror): what
                  the same pulls cost a rank through the host's shared memory, before the
                  fabric model's accounting

Reported per GB read and as the ratio read / local copy. Every mirror is checked exactly
against its owner's bytes after the last round.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def _carrier_body(a) -> None:
    import numpy as np
    from mpi4py import MPI

    from stratacl.runtime.hosts._carrier import Carrier
    comm = MPI.COMM_WORLD
    host, hosts, per = comm.rank, comm.size, a.ranks_per_host
    nbytes = _size(a.bytes)
    host_of = [r // per for r in range(hosts * per)]
    mine = [r for r in range(hosts * per) if host_of[r] == host]
    others = [r for r in range(hosts * per) if host_of[r] != host]
    seg = {r: mmap.mmap(-1, nbytes) for r in mine}
    mir = {r: mmap.mmap(-1, nbytes) for r in others}
    for r in mine:
        np.frombuffer(seg[r], np.uint8)[:] = (np.arange(nbytes) * (r + 3) % 251).astype(np.uint8)
    carrier = Carrier(comm, nbytes, host_of, seg, mir)
    block = bytes(4096 * per)
    wants = [(r, 0, nbytes) for r in others]
    times = {"exchange": [], "read": [], "local copy": []}
    scratch = np.empty(nbytes, np.uint8)
    scratch[:] = 1
    for _ in range(a.iters):
        comm.Barrier()
        t0 = time.perf_counter()
        comm.allgather(block)
        times["exchange"].append(time.perf_counter() - t0)
        comm.Barrier()
        t0 = time.perf_counter()
        carrier.read(wants)
        times["read"].append(time.perf_counter() - t0)
        src, dst = np.frombuffer(seg[mine[0]], np.uint8), scratch
        t0 = time.perf_counter()
        for _r in others:
            np.copyto(dst, src)
        times["local copy"].append(time.perf_counter() - t0)
    comm.Barrier()
    exact = all(bool((np.frombuffer(mir[r], np.uint8) == (np.arange(nbytes) * (r + 3) % 251).astype(np.uint8)).all())
                for r in others)
    rows = comm.gather({k: v for k, v in times.items()}, root=0)
    ok = comm.allreduce(int(exact), op=MPI.MIN)
    carrier.close()
    if host == 0:
        # per round: the slowest host's time
        per_round = {k: [max(r[k][i] for r in rows) for i in range(a.iters)] for k in times}
        read = nbytes * len(others)
        out = {"hosts": hosts, "ranks_per_host": per, "bytes": nbytes, "read_per_host": read, "exact": bool(ok),
               **{k: {"best_s": min(v), "median_s": statistics.median(v)} for k, v in per_round.items()}}
        print("@@ " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=4)
    ap.add_argument("--bytes", default="4M", help="bytes read from each rank of another host")
    ap.add_argument("-i", "--iters", type=int, default=10)
    ap.add_argument("--btl", default="tcp", help="Open MPI byte transport between carriers (tcp; vader: shared memory)")
    ap.add_argument("--json")
    ap.add_argument("--carrier-body", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.carrier_body:
        _carrier_body(a)
        return
    mpirun = shutil.which("mpirun", path=os.path.dirname(sys.executable))
    if mpirun is None:
        sys.exit("no mpirun beside this Python: pip install -e '.[cluster]'")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    argv = [mpirun, *root, "--oversubscribe", "--bind-to", "none", "--mca", "btl", f"self,{a.btl}", "--mca", "pml",
            "ob1", "--mca", "osc", "rdma", "-n", str(a.hosts), sys.executable, os.path.abspath(__file__),
            "--carrier-body", "--ranks-per-host", str(a.ranks_per_host), "--bytes", a.bytes, "-i", str(a.iters)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    rec = next((json.loads(x[3:]) for x in p.stdout.splitlines() if x.startswith("@@ ")), None)
    if p.returncode or rec is None:
        sys.exit(f"carriers failed ({p.returncode}): {p.stderr[-2000:]}")
    gb = rec["read_per_host"] / 1e9
    print(f"{a.hosts} hosts x {a.ranks_per_host} ranks, {rec['bytes'] / 2**20:.0f} MiB from each rank of another "
          f"host ({rec['read_per_host'] / 2**20:.0f} MiB a host), btl {a.btl}, {a.iters} rounds, "
          f"{'exact' if rec['exact'] else 'NOT EXACT'}")
    print("| step | best | median | per GB (median) |")
    print("|---|---|---|---|")
    print(f"| exchange ({4 * a.ranks_per_host} KiB a host) | {rec['exchange']['best_s'] * 1e6:.0f} us | "
          f"{rec['exchange']['median_s'] * 1e6:.0f} us | |")
    for k in ("read", "local copy"):
        print(f"| {k} | {rec[k]['best_s'] * 1e3:.2f} ms | {rec[k]['median_s'] * 1e3:.2f} ms | "
              f"{rec[k]['median_s'] / gb:.3f} s |")
    print(f"read / local copy (median): {rec['read']['median_s'] / rec['local copy']['median_s']:.1f}x")
    if a.json:
        rec.update(btl=a.btl, iters=a.iters, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   command="python benchmarks/carrier_cost.py " + " ".join(sys.argv[1:]))
        with open(a.json, "w") as f:
            json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
