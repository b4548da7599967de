"""What the cross-host carrier costs per barrier and per GB, against a copy within the host; and
what it reads and takes per collective call.

    python benchmarks/carrier_cost.py [--hosts 2] [--ranks-per-host 4] [--bytes 4M] [-i 10]
                                      [--btl tcp] [--json PATH]
    python benchmarks/carrier_cost.py --calls|--onesided [--hosts 2] [--ranks-per-host 4] [-i 20]
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

``--calls`` runs a job instead: ``STRATACL_EMULATE_HOSTS=K mpirun -n K x ranks-per-host`` (the
user's mpirun, carriers in the first rank of each host, ``--btl`` between every process) of a
program that makes each collective below ``-i`` times on the same arrays (after two untimed
calls), a barrier before and after each, and reports per call, medians over the calls:

    read          the bytes each host's carrier read from the other hosts for the call
                  (stats()["bytes_carried"] before and after it; the barriers read nothing)
    wall          the slowest rank's time in the call (host time, the carriers' share in it)

Every result is checked exactly on every rank after the last call. ``--hosts 1`` runs the same
job on one host (no carrier): the reference the cross-host walls compare with.

``--onesided`` runs the same kind of job with one-sided calls (``stratacl.shmem``) from rank 0
to the last rank (on the other host of two; on rank 0's host with ``--hosts 1``), each ``-i``
times after two untimed ones, and reports the median wall of each at rank 0: put, get and
put_signal of 8 B and 1 MiB, and an atomic fetch_add; the bytes are checked exactly.
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


# (name, operation, input elements of float32 per rank): the collectives ``--calls`` makes
CALLS = (
    ("all_reduce 256 B (eager)", "all_reduce", 64),
    ("all_reduce 16 KiB (eager, by chunks)", "all_reduce", 4096),
    ("all_reduce 1 MiB", "all_reduce", 1 << 18),
    ("all_gather 64 KiB a rank", "all_gather", 1 << 14),
    ("reduce_scatter 1 MiB", "reduce_scatter", 1 << 18),
    ("all_to_all 1 MiB", "all_to_all", 1 << 18),
    ("broadcast 1 MiB, root 0", "broadcast", 1 << 18),
    ("gather 64 KiB a rank, root 0", "gather", 1 << 14),
    ("scatter 64 KiB a rank, root 0", "scatter", 1 << 14),
    ("reduce 1 MiB, root 0", "reduce", 1 << 18),
    ("all_to_all_v 1 MiB", "all_to_all_v", 1 << 18),
)


def _calls_body(a) -> None:
    import numpy as np

    import stratacl
    comm = stratacl.init()
    n, me = comm.size, comm.rank

    def call(op: str, count: int):
        """The call's arrays and three functions: ``fill(t)`` writes the inputs of call t (other
        values every call, so that bytes a carrier failed to bring would show), ``run()`` makes
        the call, ``exact(t)`` says whether its result is."""
        x = stratacl.empty((count,), np.float32)
        out = stratacl.empty((n * count if op in ("all_gather", "gather") else count,), np.float32)
        base = np.arange(count, dtype=np.float32) % 11
        own = stratacl.empty((count // n,), np.float32) if op == "reduce_scatter" else None
        whole = stratacl.empty((n * count,), np.float32) if op == "scatter" else None
        # all_to_all_v: rank i sends rank j (i + j) % 3 + 1 parts of count / (4 n) elements
        sends = np.array([[(i + j) % 3 + 1 for j in range(n)] for i in range(n)]) * (count // (4 * n))
        sent_at = np.cumsum(sends, axis=1) - sends       # where i's part for j starts in its x
        sums = np.arange(n)[:, None]                     # what rank p adds to base in call t: p + 100 t

        def fill(t: int) -> None:
            x[:] = base + me + 100 * t
            if whole is not None:
                whole[:] = np.arange(n * count) % 13 + 100 * t

        def total(t: int) -> np.ndarray:                 # the sum over ranks of rank p's x of call t
            return base * n + n * (n - 1) / 2 + n * 100 * t

        run = {
            "all_reduce": lambda: comm.all_reduce(x),
            "all_gather": lambda: comm.all_gather(out, x),
            "reduce_scatter": lambda: comm.reduce_scatter(own, x),
            "all_to_all": lambda: comm.all_to_all(out, x),
            "broadcast": lambda: comm.broadcast(x, 0),
            "gather": lambda: comm.gather(out, x, 0),
            "scatter": lambda: comm.scatter(x, whole if me == 0 else None, 0),
            "reduce": lambda: comm.reduce(out, x, "sum", 0),
            "all_to_all_v": lambda: comm.all_to_all_v(out, x, sends[me], sends[:, me]),
        }[op]

        def exact(t: int) -> bool:
            if op == "all_reduce":
                return (x == total(t)).all()
            if op in ("all_gather", "gather"):
                return (op == "gather" and me) or (out.reshape(n, count) == base + sums + 100 * t).all()
            if op == "reduce_scatter":
                return (own == total(t).reshape(n, -1)[me]).all()
            if op == "all_to_all":
                return (out.reshape(n, -1) == base.reshape(n, -1)[me] + sums + 100 * t).all()
            if op == "broadcast":
                return (x == base + 100 * t).all()
            if op == "scatter":
                return (x == np.arange(me * count, (me + 1) * count) % 13 + 100 * t).all()
            if op == "reduce":
                return me or (out == total(t)).all()
            got = np.concatenate([base[sent_at[p, me]:sent_at[p, me] + sends[p, me]] + p + 100 * t for p in range(n)])
            return (out[:got.size] == got).all()
        return fill, run, exact

    rows = []
    for name, op, count in CALLS:
        fill, run, exact = call(op, count)
        good = True
        for t in range(2):                          # untimed: plans compiled, segments mapped
            fill(t)
            run()
            good = good and bool(exact(t))
        read, wall = [], []
        for t in range(2, 2 + a.iters):
            fill(t)
            comm.barrier()
            b0 = stratacl.stats().get("bytes_carried", 0)     # none on one host (--hosts 1: the reference)
            t0 = time.perf_counter()
            run()
            wall.append(time.perf_counter() - t0)
            comm.barrier()
            read.append(stratacl.stats().get("bytes_carried", 0) - b0)
            good = good and bool(exact(t))
        rows.append({"name": name, "read": read, "wall": wall, "exact": good})
    # every rank's walls, and the read of each host's first rank (its host's carrier)
    got = comm_gather(comm, rows)
    if me == 0:
        first = sorted({min(r for r in range(n) if r * a.hosts // n == h) for h in range(a.hosts)})
        out = []
        for i, (name, op, count) in enumerate(CALLS):
            walls = [max(got[r][i]["wall"][j] for r in range(n)) for j in range(a.iters)]
            out.append({"name": name, "bytes": count * 4,
                        "read_per_host": [statistics.median(got[r][i]["read"]) for r in first],
                        "wall_s": {"best": min(walls), "median": statistics.median(walls)},
                        "exact": all(got[r][i]["exact"] for r in range(n))})
        print("@@ " + json.dumps({"hosts": a.hosts, "ranks": n, "rows": out}), flush=True)
    stratacl.finalize()


# (name, operation, bytes): what ``--onesided`` times from rank 0 to the last rank
ONESIDED = (
    ("put 8 B", "put", 8), ("put 1 MiB", "put", 1 << 20),
    ("get 8 B", "get", 8), ("get 1 MiB", "get", 1 << 20),
    ("put_signal 8 B", "put_signal", 8), ("put_signal 1 MiB", "put_signal", 1 << 20),
    ("atomic_fetch_add", "atomic", 8),
)


def _onesided_body(a) -> None:
    import numpy as np

    import stratacl
    from stratacl import shmem
    comm = stratacl.init()
    n, me = comm.size, comm.rank
    peer = n - 1
    box = shmem.zeros((1 << 20,), np.uint8)
    word = shmem.zeros((1,), np.uint64)
    sig = shmem.signal_pad(1)
    rows, good, box_of_peer = [], True, None
    for name, op, nbytes in ONESIDED:
        wall = []
        for t in range(2 + a.iters):
            data = ((np.arange(nbytes) + t + 7 * len(rows)) % 251).astype(np.uint8)
            if me == 0:
                t0 = time.perf_counter()
                if op == "put":
                    shmem.put(box[:nbytes], data, peer)
                elif op == "get":
                    got = np.empty(nbytes, np.uint8)
                    shmem.get(got, box[:nbytes], peer)
                elif op == "put_signal":
                    shmem.put_signal(box[:nbytes], data, sig[0:1], t + 1, shmem.SIGNAL_SET, peer)
                else:
                    shmem.atomic_fetch_add(word, 1, peer)
                if t >= 2:
                    wall.append(time.perf_counter() - t0)
                if op == "get":
                    good = good and np.array_equal(got, box_of_peer[:nbytes])
            elif me == peer and op == "put_signal":
                shmem.wait_until(sig[0:1], shmem.CMP_EQ, t + 1)
            comm.barrier()
            if me == peer and op in ("put", "put_signal"):
                good = good and np.array_equal(box[:nbytes], data)
            if op == "put":                      # what the next get reads: the last put's bytes
                box_of_peer = data
            comm.barrier()                       # checked before the next call writes again
        rows.append({"name": name, "wall": wall})
    if me == peer:
        good = good and int(word[0]) == 2 + a.iters
    ok = stratacl.zeros((1,), np.int64)
    ok[0] = int(good)
    comm.all_reduce(ok, "min")
    if me == 0:
        out = [{"name": r["name"], "wall_s": {"best": min(r["wall"]), "median": statistics.median(r["wall"])}}
               for r in rows]
        print("@@ " + json.dumps({"hosts": a.hosts, "ranks": n, "rows": out, "exact": bool(ok[0])}), flush=True)
    stratacl.finalize()


def comm_gather(comm, rows) -> list:
    """Every rank's ``rows`` at every rank (as JSON, through collectives of the job itself)."""
    import numpy as np

    import stratacl
    text = json.dumps(rows).encode()
    width = stratacl.zeros((1,), np.int64)
    width[0] = len(text)
    comm.all_reduce(width, "max")
    mine = stratacl.zeros((int(width[0]),), np.uint8)
    mine[:len(text)] = np.frombuffer(text, np.uint8)
    every = stratacl.empty((comm.size * mine.size,), np.uint8)
    comm.all_gather(every, mine)
    return [json.loads(every[r * mine.size:(r + 1) * mine.size].tobytes().rstrip(b"\0")) for r in range(comm.size)]


def _calls(a, mpirun: str, root: list[str]) -> None:
    n = a.hosts * a.ranks_per_host
    body = "--onesided-body" if a.onesided else "--calls-body"
    argv = [mpirun, *root, "--oversubscribe", "--bind-to", "none", "--mca", "btl", f"self,{a.btl}", "-n", str(n),
            sys.executable, os.path.abspath(__file__), body, "--hosts", str(a.hosts), "-i", str(a.iters)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(STRATACL_EMULATE_HOSTS=str(a.hosts), OMP_NUM_THREADS="1")
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    rec = next((json.loads(x[3:]) for x in p.stdout.splitlines() if x.startswith("@@ ")), None)
    if p.returncode or rec is None:
        sys.exit(f"the job failed ({p.returncode}): {p.stdout[-2000:]} {p.stderr[-2000:]}")
    print(f"{n} ranks over {a.hosts} emulated hosts (STRATACL_EMULATE_HOSTS, mpirun), btl {a.btl}, {a.iters} calls "
          f"each, medians")
    if a.onesided:
        print(f"| call, rank 0 -> rank {n - 1} | wall a call | exact |")
        print("|---|---|---|")
        for row in rec["rows"]:
            print(f"| {row['name']} | {row['wall_s']['median'] * 1e6:.0f} us | {'yes' if rec['exact'] else 'NO'} |")
    else:
        print("| call | read a call, each host | wall a call (slowest rank) | exact |")
        print("|---|---|---|---|")
        for row in rec["rows"]:
            read = ", ".join(f"{b / 2**20:.3f} MiB" for b in row["read_per_host"])
            print(f"| {row['name']} | {read} | {row['wall_s']['median'] * 1e3:.2f} ms | "
                  f"{'yes' if row['exact'] else 'NO'} |")
    if a.json:
        import stratacl
        here = os.path.dirname(os.path.dirname(os.path.abspath(stratacl.__file__)))
        commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        rec.update(btl=a.btl, iters=a.iters, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   command="python benchmarks/carrier_cost.py " + " ".join(sys.argv[1:]),
                   library=commit.stdout.strip() or None)
        with open(a.json, "w") as f:
            json.dump(rec, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=4)
    ap.add_argument("--bytes", default="4M", help="bytes read from each rank of another host")
    ap.add_argument("-i", "--iters", type=int, default=10)
    ap.add_argument("--btl", default="tcp", help="Open MPI byte transport between carriers (tcp; vader: shared memory)")
    ap.add_argument("--json")
    ap.add_argument("--calls", action="store_true", help="a job's collectives: bytes read and wall per call")
    ap.add_argument("--carrier-body", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--calls-body", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--onesided", action="store_true", help="a job's one-sided calls: wall per call at rank 0")
    ap.add_argument("--onesided-body", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.carrier_body:
        _carrier_body(a)
        return
    if a.calls_body:
        _calls_body(a)
        return
    if a.onesided_body:
        _onesided_body(a)
        return
    mpirun = shutil.which("mpirun", path=os.path.dirname(sys.executable))
    if mpirun is None:
        sys.exit("no mpirun beside this Python: pip install -e '.[cluster]'")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    if a.calls or a.onesided:
        _calls(a, mpirun, root)
        return
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
