"""How a whole job scales with its rank count on this host: start, a few calls, finalize, exit.

    python benchmarks/scale.py [--sizes 8,32,64,128,256,384] [--clock virtual|off|virtual,off]
                               [--readme 64,128,256] [--profile-at 256] [--guard-gib 1] [--json PATH]

For each clock (``--clock``: one, or several comma-separated, each its own rows) and each N, one
job through ``stratacl-launch -n N --clock CLOCK`` runs this file as its rank body
(``--rank-body``):

    process start -> script start (Python and the library imported) -> init() returned
      -> small all_reduce (the first call) -> 1 MiB all_reduce -> all_gather of 256 B a rank
      -> all_gather into 1 MiB (1 MiB / N a rank: 1 MiB a rank would need N * N MiB of HBM)
      -> each of the four again, warm, each timed from a barrier to the slowest rank's return
      -> memory read from /proc/self/smaps -> finalize -> exit

Reported per N, from outside the job: the wall time of the whole job (launcher start to
launcher exit), the total CPU seconds of the job (launcher, daemon and ranks: the benchmark's
``RUSAGE_CHILDREN`` grows by the launcher's, which has waited for the daemon and the ranks),
the peak 1-minute load average and the peak count of runnable tasks (``/proc/loadavg``,
sampled every 0.2 s; both count the whole host), and the least MemAvailable seen. From inside:
time to the first call (launcher start to the slowest rank's return from it), each call's wall
(slowest rank) and CPU (summed over ranks, ``time.process_time`` of the rank's process, its
threads included), whether every result is exact on every rank, and the memory of a rank
outside its HBM.

Memory outside HBM: ``psutil``'s USS is the sum of the Private_Clean and Private_Dirty pages of
every mapping in ``/proc/self/smaps``. A rank's touched HBM pages are shared-memory pages (its
own segment, and the peers' segments it has mapped at shadow addresses) and count as private
while no other process has touched them, so they would inflate USS in a way that is the
emulated device's memory, not the rank's overhead. Here the private pages of mappings backed
by a shared-memory file (``/dev/shm/...``, deleted or not, or the job's memfds where
``/dev/shm`` has no room: the HBM segments and the control segment) are summed apart and subtracted; what remains is heap, Python objects, libraries'
private data and thread stacks. Page tables (VmPTE) are reported beside it. The table gives the
mean over the ranks and the largest rank: under ``--clock virtual`` the fabric model's timed
plans are mapped from the job's store (runtime/pipeline/_plans.py), so a rank's memory stays flat in N.

``--readme`` times the README's first command (``stratacl-launch -n N --clock virtual
examples/allreduce.py``) as a user would run it, at the given rank counts (``--readme-clock
off``: the same with the clock off). Its ranks run the example through ``--readme-rank``, which
only reads the rank's memory outside HBM (as above) when the example calls ``finalize()``; the
row is correct when the job exits 0 and prints "correct on every rank" twice.

``--guard-gib G`` (default 1): a job is stopped (its launcher's process group killed, the row
marked) when the host's MemAvailable falls below G GiB, before the kernel's OOM killer would
choose among every process on the (shared) host.

``--profile-at N`` adds, at that N, where the time went per phase (the slowest, median and
fastest rank of each phase's end, seconds after the launcher started) and a cProfile of rank
0's CPU time from init() to the end of its calls.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SMALL = 256                     # bytes per rank of the small calls
LARGE = 1 << 20                 # bytes per rank of the 1 MiB calls
PHASES = ("created", "script", "init", "first_call", "calls_done", "finalize")


# --- inside a rank ----------------------------------------------------------------------------
def _smaps_private() -> tuple[int, int, int]:
    """(USS, its part in shared-memory mappings, page tables) of this process, in bytes."""
    total = shm = 0
    in_shm = False
    with open("/proc/self/smaps", "rb") as f:
        for line in f:
            if line[:1].isdigit() or line[:1] in b"abcdef" and b"-" in line.split(b" ", 1)[0]:
                parts = line.split(None, 5)
                path = parts[5].strip() if len(parts) > 5 else b""
                # HBM is a /dev/shm name, or a memfd where /dev/shm has no room for the job's
                # (runtime/memory/_segments.py): both are the job's shared memory
                in_shm = path.startswith((b"/dev/shm/", b"/SYSV", b"/memfd:stratacl-"))
            elif line.startswith(b"Private_Clean:") or line.startswith(b"Private_Dirty:"):
                kb = int(line.split()[1]) * 1024
                total += kb
                if in_shm:
                    shm += kb
    pte = 0
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmPTE:"):
                pte = int(line.split()[1]) * 1024
    return total, shm, pte


def rank_body(profile: bool) -> None:
    script_at = time.time()
    import cProfile
    import pstats

    import numpy as np
    import psutil

    import stratacl

    prof = cProfile.Profile(time.process_time) if profile else None
    if prof is not None:
        prof.enable()
    created_at = psutil.Process().create_time()
    comm = stratacl.init()
    init_at = time.time()
    n, me = comm.size, comm.rank

    small = stratacl.empty((SMALL // 8,), np.float64)
    small[:] = me + 1
    comm.all_reduce(small, op="sum")           # the first call
    first_at = time.time()
    ok = [bool((small == n * (n + 1) / 2).all())]

    large = stratacl.empty((LARGE // 4,), np.float32)
    gs = stratacl.empty((SMALL // 8,), np.int64)
    # the large all_gather fills 1 MiB of output on every rank (1 MiB / N from each): with 1 MiB
    # from each, the outputs alone would touch N * N MiB of HBM (144 GiB at N = 384)
    gl = stratacl.empty((max(1, LARGE // 8 // n),), np.int64)
    out_s = stratacl.empty((n * gs.size,), np.int64)
    out_l = stratacl.empty((n * gl.size,), np.int64)

    def gathered(out, part):
        # one rank's block at a time: an N-sized expected array would be the rank's largest
        # private allocation and show in its memory
        blocks = out.reshape(n, part.size)
        return all(bool((blocks[r] == r).all()) for r in range(n))

    def fill_small():
        small[:] = me + 1

    def fill_large():
        large[:] = me % 7 + 1              # sums stay exact in float32 up to N = 2**21

    def fill_gather(part, out):
        def f():
            part[:] = me
            out[:] = -1
        return f

    calls = [
        ("all_reduce 256 B", fill_small, lambda: comm.all_reduce(small, op="sum"),
         lambda: (small == n * (n + 1) / 2).all()),
        ("all_reduce 1 MiB", fill_large, lambda: comm.all_reduce(large, op="sum"),
         lambda: (large == sum(r % 7 + 1 for r in range(n))).all()),
        ("all_gather 256 B", fill_gather(gs, out_s), lambda: comm.all_gather(out_s, gs),
         lambda: gathered(out_s, gs)),
        ("all_gather 1 MiB out", fill_gather(gl, out_l), lambda: comm.all_gather(out_l, gl),
         lambda: gathered(out_l, gl)),
    ]
    times = np.zeros((2, len(calls), 2), np.float64)    # [cold/warm][call][wall, cpu]
    for rep in range(2):
        for i, (name, fill, call, check) in enumerate(calls):
            if rep == 0 and i == 0:
                fill()                      # the small all_reduce's cold call was the first call
            fill()
            comm.barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            call()
            times[rep, i] = (time.perf_counter() - t0, time.process_time() - c0)
            ok.append(bool(check()))
    calls_at = time.time()
    if prof is not None:
        prof.disable()
    uss, shm, pte = _smaps_private()

    wall = times[..., 0].copy()
    cpu = times[..., 1].copy()
    comm.all_reduce(wall, op="max")
    comm.all_reduce(cpu, op="sum")
    verdict = np.array([all(ok)], np.int64)
    comm.all_reduce(verdict, op="min")
    mem = np.array([uss - shm, shm, pte, uss], np.float64)
    mem_max, mem_sum = mem.copy(), mem.copy()
    comm.all_reduce(mem_max, op="max")
    comm.all_reduce(mem_sum, op="sum")
    stamps = np.array([created_at, script_at, init_at, first_at, calls_at], np.float64)
    every = np.empty((n * stamps.size,), np.float64)
    comm.all_gather(every, stamps)
    if me == 0:
        row = {
            "calls": {name: {"cold_wall_s": wall[0, i], "warm_wall_s": wall[1, i],
                             "cold_cpu_s": cpu[0, i], "warm_cpu_s": cpu[1, i]}
                      for i, (name, *_rest) in enumerate(calls)},
            "correct": bool(verdict[0]),
            "uss_outside_hbm_max": mem_max[0], "uss_outside_hbm_mean": mem_sum[0] / n,
            "hbm_private_mean": mem_sum[1] / n, "page_tables_mean": mem_sum[2] / n, "uss_mean": mem_sum[3] / n,
            "stamps": every.reshape(n, stamps.size).tolist(),
        }
        if prof is not None:
            import io
            s = io.StringIO()
            st = pstats.Stats(prof, stream=s)
            st.sort_stats("cumulative").print_stats(25)
            st.sort_stats("tottime").print_stats(12)
            row["cprofile_rank0"] = s.getvalue()
        with open(os.environ["SCALE_OUT"], "w") as f:
            json.dump(row, f)
    stratacl.finalize()
    if me == 0:
        with open(os.environ["SCALE_OUT"] + ".fin", "w") as f:
            f.write(repr(time.time()))
    sys.exit(0 if verdict[0] else 1)


def readme_rank(script: str) -> None:
    """Run the README example ``script`` as this rank's program; when it calls ``finalize()``,
    write this rank's memory outside HBM to ``$SCALE_OUT/<rank>``."""
    import runpy

    import stratacl
    finalize = stratacl.finalize

    def measured_finalize():
        uss, shm, pte = _smaps_private()
        with open(os.path.join(os.environ["SCALE_OUT"], os.environ["STRATACL_RANK"]), "w") as f:
            json.dump([uss - shm, pte], f)
        finalize()

    stratacl.finalize = measured_finalize
    sys.argv = [script]
    runpy.run_path(script, run_name="__main__")


# --- outside the job --------------------------------------------------------------------------
class _HostSampler:
    """Peak load, peak runnable tasks and least MemAvailable while a job runs; the job's process
    group is killed if MemAvailable falls below ``guard`` bytes (the host is shared: better
    a stopped row than the kernel's OOM killer choosing among everyone's processes)."""

    def __init__(self, period: float = 0.2, guard: int = 0, pgid: int | None = None):
        self.period = period
        self.guard, self.pgid, self.stopped = guard, pgid, False
        self.peak_load = 0.0
        self.peak_runnable = 0
        self.min_available = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with open("/proc/loadavg") as f:
                parts = f.read().split()
            self.peak_load = max(self.peak_load, float(parts[0]))
            self.peak_runnable = max(self.peak_runnable, int(parts[3].split("/")[0]))
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        kb = int(line.split()[1])
                        self.min_available = kb if self.min_available is None else min(self.min_available, kb)
                        break
            if self.pgid is not None and self.min_available is not None and self.min_available * 1024 < self.guard:
                self.stopped = True
                try:
                    os.killpg(self.pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.pgid = None
            self._stop.wait(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _launcher() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "stratacl-launch")
    if os.path.exists(exe):
        return [exe]
    found = shutil.which("stratacl-launch")
    return [found] if found else [sys.executable, "-m", "stratacl_launcher"]


GUARD = 1.0 * 2**30      # MemAvailable (bytes) below which a job is stopped (--guard-gib)


def _run_job(argv: list[str], env: dict[str, str], timeout: float) -> dict:
    """Run one launcher command; its wall, CPU (with every descendant it waited for), host peaks."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open("/proc/loadavg") as f:
        load_before = float(f.read().split()[0])
    t0 = time.time()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    with _HostSampler(guard=GUARD, pgid=p.pid) as host:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            stdout, stderr = p.communicate()
            stderr += f"\nscale.py: stopped after {timeout} s (--timeout)"
    if host.stopped:
        stderr += f"\nscale.py: stopped when MemAvailable fell below {GUARD / 2**30:.1f} GiB (--guard-gib)"
    wall = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"t0": t0, "wall_s": wall, "cpu_s": cpu, "returncode": p.returncode, "stopped_low_memory": host.stopped,
            "load_before": load_before, "peak_load": host.peak_load, "peak_runnable": host.peak_runnable,
            "min_mem_available_gib": (host.min_available or 0) / 2 ** 20,
            "stdout": stdout[-4000:], "stderr": stderr[:3000] + "\n...\n" + stderr[-1500:]}


def measure(n: int, clock: str, profile: bool, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        env = dict(os.environ, SCALE_OUT=out)
        argv = _launcher() + ["-n", str(n), "--clock", clock, os.path.abspath(__file__), "--rank-body"]
        if profile:
            argv.append("--cprofile")
        job = _run_job(argv, env, timeout)
        inside = {}
        if os.path.exists(out):
            with open(out) as f:
                inside = json.load(f)
            with open(out + ".fin") as f:
                inside["finalize_at"] = float(f.read())
    row = {"n": n, "clock": clock, **{k: v for k, v in job.items() if k not in ("stdout", "stderr", "t0")}}
    if job["returncode"] != 0 or not inside:
        row.update(correct=False, stderr=job["stderr"])
        return row
    t0 = job["t0"]
    stamps = inside.pop("stamps")
    row["first_call_s"] = max(s[3] for s in stamps) - t0
    row.update({k: v for k, v in inside.items() if k != "finalize_at"})
    row["phases"] = _phases(stamps, t0, inside["finalize_at"], job["wall_s"])
    return row


def _phases(stamps: list[list[float]], t0: float, fin: float, wall: float) -> dict:
    """Each phase's end over the ranks, seconds after launcher start: slowest, median, fastest."""
    out = {}
    for j, name in enumerate(PHASES[:5]):
        ends = sorted(s[j] - t0 for s in stamps)
        out[name] = {"last": ends[-1], "median": ends[len(ends) // 2], "first": ends[0]}
    out["finalize"] = {"last": fin - t0}
    out["launcher_exit"] = {"last": wall}
    return out


def readme(n: int, timeout: float, clock: str = "virtual") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        argv = _launcher() + ["-n", str(n), "--clock", clock, os.path.abspath(__file__), "--readme-rank",
                              os.path.join(ROOT, "examples", "allreduce.py")]
        job = _run_job(argv, dict(os.environ, SCALE_OUT=tmp), timeout)
        mem = []
        for name in os.listdir(tmp):
            with open(os.path.join(tmp, name)) as f:
                mem.append(json.load(f))
    row = {"n": n, "clock": clock, **{k: v for k, v in job.items() if k not in ("t0", "stderr")},
           "correct": job["returncode"] == 0 and job["stdout"].count("correct on every rank") == 2}
    if mem:
        row.update(ranks_measured=len(mem), uss_outside_hbm_max=max(m[0] for m in mem),
                   uss_outside_hbm_mean=sum(m[0] for m in mem) / len(mem),
                   page_tables_mean=sum(m[1] for m in mem) / len(mem))
    if not row["correct"]:
        row["stderr"] = job["stderr"]
    return row


def _fmt(rows: list[dict], readme_rows: list[dict]) -> str:
    lines = []
    head = (f"{'N':>4} {'job wall':>9} {'job CPU':>8} {'1st call':>9} {'ar 256B':>8} {'ar 1MiB':>8} "
            f"{'ag 256B':>8} {'ag 1MiB':>8} {'CPU/call':>9} {'load':>6} {'runq':>5} "
            f"{'USS-HBM':>15} {'PTE':>6} {'memavail':>8}  result")
    for i, r in enumerate(rows):
        if i == 0 or r["clock"] != rows[i - 1]["clock"]:
            lines += [f"--clock {r['clock']}", head, "-" * len(head)]
        if "calls" not in r:
            lines.append(f"{r['n']:>4} {r['wall_s']:>8.1f}s {r['cpu_s']:>7.1f}s  FAILED (exit {r['returncode']}"
                         f"{', stopped: MemAvailable low' if r.get('stopped_low_memory') else ''})")
            continue
        c = r["calls"]
        warm = [c[k]["warm_wall_s"] * 1e3 for k in c]
        cpu = sum(c[k]["warm_cpu_s"] for k in c) / len(c)
        lines.append(
            f"{r['n']:>4} {r['wall_s']:>8.1f}s {r['cpu_s']:>7.1f}s {r['first_call_s']:>8.2f}s "
            + " ".join(f"{w:>6.2f}ms" for w in warm)
            + f" {cpu:>8.3f}s {r['peak_load']:>6.1f} {r['peak_runnable']:>5d} "
            f"{r['uss_outside_hbm_mean'] / 2**20:>5.1f}/{r['uss_outside_hbm_max'] / 2**20:>5.1f}Mi "
            f"{r['page_tables_mean'] / 2**20:>4.1f}Mi "
            f"{r['min_mem_available_gib']:>6.1f}Gi  {'correct' if r['correct'] else 'WRONG'}")
    lines.append("ar/ag: warm call wall, slowest rank, ms; CPU/call: mean over the four warm calls of the CPU "
                 "summed over ranks; USS-HBM: USS outside HBM a rank, mean / largest rank; load: peak 1-min load; runq: "
                 "peak runnable tasks; memavail: least MemAvailable during the job")
    for r in rows:
        if "phases" in r and "cprofile_rank0" in r:
            lines.append(f"\nWhere the time went at N = {r['n']} (s after launcher start: last / median / first rank)")
            for name, v in r["phases"].items():
                lines.append(f"  {name:<14} " + " / ".join(f"{v[k]:7.2f}" for k in ("last", "median", "first")
                                                            if k in v))
            lines.append("  cold calls (ms): " + ", ".join(f"{k} {v['cold_wall_s'] * 1e3:.1f}"
                                                      for k, v in r["calls"].items()))
            lines.append("  rank 0, init() to the end of its calls, cProfile of CPU time (time.process_time), by cumulative time:")
            lines += ["    " + ln for ln in r["cprofile_rank0"].splitlines() if ln.strip()]
    if readme_rows:
        lines.append(f"\nREADME example (stratacl-launch -n N --clock {readme_rows[0]['clock']} examples/allreduce.py):")
        for r in readme_rows:
            mem = (f"USS-HBM {r['uss_outside_hbm_mean'] / 2**20:.1f} / {r['uss_outside_hbm_max'] / 2**20:.1f} MiB  "
                   f"PTE {r['page_tables_mean'] / 2**20:.1f} MiB  " if "uss_outside_hbm_mean" in r else "")
            lines.append(f"  N={r['n']:<4} wall {r['wall_s']:6.1f} s  CPU {r['cpu_s']:6.1f} s  peak load "
                         f"{r['peak_load']:5.1f}  least MemAvailable {r['min_mem_available_gib']:.1f} GiB  {mem}"
                         f"{'correct' if r['correct'] else 'FAILED exit ' + str(r['returncode'])}"
                         f"{' (stopped: MemAvailable low)' if r.get('stopped_low_memory') else ''}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,32,64,128,256,384")
    ap.add_argument("--clock", default="virtual", help="virtual, off, or both comma-separated (rows for each)")
    ap.add_argument("--readme", default="", help="rank counts at which to time the README example")
    ap.add_argument("--readme-clock", default="virtual", choices=("virtual", "off"),
                    help="the README example's --clock (its own is virtual)")
    ap.add_argument("--profile-at", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    ap.add_argument("--guard-gib", type=float, default=GUARD / 2**30,
                    help="stop a job when the host's MemAvailable falls below this (GiB)")
    ap.add_argument("--json")
    ap.add_argument("--rank-body", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cprofile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--readme-rank", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.readme_rank:
        readme_rank(a.readme_rank)
        return
    if a.rank_body:
        rank_body(a.cprofile and os.environ.get("STRATACL_RANK") == "0")
        return
    globals()["GUARD"] = a.guard_gib * 2**30
    clocks = [c for c in a.clock.split(",") if c]
    if not clocks or any(c not in ("virtual", "off") for c in clocks):
        ap.error(f"--clock: virtual, off or both comma-separated, got {a.clock!r}")
    rows, readme_rows = [], []
    for clock, n in [(c, int(s)) for c in clocks for s in a.sizes.split(",") if s]:
        row = measure(n, clock, n == a.profile_at and clock == clocks[0], a.timeout)
        rows.append(row)
        print(f"clock {clock} N={n}: wall {row['wall_s']:.1f} s, CPU {row['cpu_s']:.1f} s, "
              f"{'correct' if row.get('correct') else 'FAILED'}", file=sys.stderr, flush=True)
        if not row.get("correct"):
            print(row.get("stderr", ""), file=sys.stderr)
    for n in [int(s) for s in a.readme.split(",") if s]:
        readme_rows.append(readme(n, a.timeout, a.readme_clock))
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "clock": a.clock,
              "cpus": os.cpu_count(), "load_after": load, "command": " ".join(sys.argv),
              "rows": rows, "readme": readme_rows}
    print(_fmt(rows, readme_rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
