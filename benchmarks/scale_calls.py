"""What one warm call costs a whole job as N grows: a loop of identical calls per job.

    python benchmarks/scale_calls.py [--sizes 64,128,256,384] [--reps 30] [--clock off] [--json PATH]

For each N, one job per call kind through ``stratacl-launch -n N --clock CLOCK`` runs this file
as its rank body: three calls to warm up, a barrier, then ``--reps`` identical calls, each rank
timing the loop with ``time.process_time`` (its process's CPU, threads included) and
``time.perf_counter``; the job's CPU per call is the sum over ranks divided by the reps, and
the wall per call rank 0's loop time divided by the reps. Every result of the last call is
checked exactly on every rank. Kinds:

    barrier       comm.barrier(): the synchronisation alone
    ar 256 B      all_reduce of 32 float64 (each rank reduces the whole buffer from every peer)
    ag 256 B      all_gather of 32 int64 a rank (N x 256 B of output a rank)
    ar 1 MiB      all_reduce of 262144 float32 (reduce-scatter of 1 MiB / N from each peer,
                  then all-gather of the other chunks: 2 MiB moved a rank at every N)

Beside the numbers the table gives CPU per call over N^2 (microseconds per rank pair) and the
growth from the smallest N to the largest against N log N and N^2. ``benchmarks/scale.py``
times the whole job (start, cold and warm calls, memory); this isolates the warm calls.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("barrier", "ar 256 B", "ag 256 B", "ar 1 MiB")


def _rank_body(kind: str, reps: int) -> None:
    import numpy as np

    import stratacl
    comm = stratacl.init()
    n, me = comm.size, comm.rank
    if kind == "barrier":
        def call():
            comm.barrier()

        def check():
            return True
    elif kind == "ar 256 B":
        x = stratacl.empty((32,), np.float64)

        def call():
            x[:] = me + 1
            comm.all_reduce(x, op="sum")

        def check():
            return bool((x == n * (n + 1) / 2).all())
    elif kind == "ag 256 B":
        x = stratacl.empty((32,), np.int64)
        out = stratacl.empty((n * 32,), np.int64)
        x[:] = me

        def call():
            comm.all_gather(out, x)

        def check():
            return bool((out.reshape(n, 32) == np.arange(n)[:, None]).all())
    else:
        x = stratacl.empty((1 << 18,), np.float32)

        def call():
            x[:] = me % 7 + 1
            comm.all_reduce(x, op="sum")

        def check():
            return bool((x == sum(r % 7 + 1 for r in range(n))).all())
    for _ in range(3):
        call()
    comm.barrier()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(reps):
        call()
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    mine = stratacl.empty((2,), np.float64)
    mine[:] = (cpu, 1.0 if check() else 0.0)
    every = stratacl.empty((2 * n,), np.float64)
    comm.all_gather(every, mine)
    if me == 0:
        e = every.reshape(n, 2)
        print(json.dumps({"n": n, "kind": kind, "wall_per_call_s": wall / reps,
                          "job_cpu_per_call_s": float(e[:, 0].sum()) / reps,
                          "correct": bool(e[:, 1].all())}), flush=True)
    stratacl.finalize()


def _launcher() -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "stratacl-launch")
    return exe if os.path.exists(exe) else "stratacl-launch"


def _job(n: int, kind: str, reps: int, clock: str, timeout: float) -> dict:
    argv = [_launcher(), "-n", str(n), "--clock", clock, "--timeout", str(timeout),
            os.path.abspath(__file__), "--rank-body", kind, "--reps", str(reps)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 120)
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    return {"n": n, "kind": kind, "error": (p.stderr or p.stdout).strip().splitlines()[-1:]}


def _table(rows: list[dict], sizes: list[int]) -> str:
    lines = ["| N | call | wall / call | job CPU / call | CPU / call / N^2 | result |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['n']} | {r['kind']} | | | | failed: {r['error']} |")
            continue
        cpu = r["job_cpu_per_call_s"]
        lines.append(f"| {r['n']} | {r['kind']} | {r['wall_per_call_s'] * 1e3:.2f} ms | {cpu * 1e3:.2f} ms | "
                     f"{cpu / r['n'] ** 2 * 1e6:.3f} us | {'correct' if r['correct'] else 'WRONG'} |")
    lo, hi = min(sizes), max(sizes)
    nlogn = hi * math.log(hi) / (lo * math.log(lo))
    lines.append(f"\nGrowth of the job's CPU per call from N = {lo} to {hi} (N log N: x{nlogn:.1f}; "
                 f"N^2: x{(hi / lo) ** 2:.1f}):")
    for kind in dict.fromkeys(r["kind"] for r in rows):
        by_n = {r["n"]: r for r in rows if r["kind"] == kind and "error" not in r}
        if lo in by_n and hi in by_n:
            g = by_n[hi]["job_cpu_per_call_s"] / by_n[lo]["job_cpu_per_call_s"]
            lines.append(f"- {kind}: x{g:.1f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,128,256,384")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of: " + ", ".join(KINDS))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--clock", choices=("off", "virtual"), default="off")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    ap.add_argument("--json")
    ap.add_argument("--rank-body", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_body:
        _rank_body(a.rank_body, a.reps)
        return
    sizes = [int(s) for s in a.sizes.split(",")]
    kinds = [k.strip() for k in a.kinds.split(",")]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        ap.error(f"--kinds: unknown {unknown}; expected some of {list(KINDS)}")
    rows = []
    for n in sizes:
        for kind in kinds:
            rows.append(_job(n, kind, a.reps, a.clock, a.timeout))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(_table(rows, sizes))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "clock": a.clock, "reps": a.reps,
                       "command": "python benchmarks/scale_calls.py " + " ".join(sys.argv[1:]), "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
