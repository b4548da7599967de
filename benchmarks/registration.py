"""Registration benchmark: what registration puts on a collective's critical path, and how long
registration metadata takes to reach every peer. A benchmark, not a test: it prints markdown tables
(progress goes to stderr). See docs/registration.md for a recorded run and how to read it.

    python benchmarks/registration.py                 # everything, 3 repetitions (~3 min on 2 cores)
    python benchmarks/registration.py --quick         # smoke run (~10 s)
    python benchmarks/registration.py --only broadcast --meta-ranks 2,8,32

A. First use of a freshly allocated buffer, per registration mode (``jit``, ``roa``, ``pool``)::

       every rank, K times:
           x = stratacl.empty(2 MiB)          a new HBM segment: a physical event (roa publishes it)
           gap                                 --gap: host idle (sleep), host busy (numpy) or none
           barrier
           all_gather(out, x[:size])           "first use": jit maps the N-1 peer segments in here;
                                               roa checks readiness, and maps a segment the
                                               background thread has not mapped yet itself
           all_gather(out, x[:size])           "warm": same buffer, nothing left to register
           del x; stratacl.empty_cache()       the segment is really released: the next is fresh

   Per call, from ``stratacl.stats()["registration"]``: jit: ``registrations_in_operator`` /
   ``registration_in_operator_ns`` (mappings inside the operator and their time). roa: a check
   that finds a peer segment not mapped yet ("late") counts in ``ready_waits`` / ``ready_wait_ns``
   (its whole time), and, if the operator then mapped the segment itself (a "fallback map": the
   background thread had not started on it), also in ``registrations_in_operator``; so roa's
   critical-path time is ``ready_wait_ns`` alone. The all_gather is timed twice: the whole call
   (two N-rank barriers included, so noisy) and its pull phase alone (between the barriers: the
   readiness checks or jit mappings, then the copies), by wrapping, inside the rank process, the
   communicator's source resolution and the full-mesh routine. A4 adds where the host's CPU went
   (all ranks, and their registration threads alone), and A5 repeats the roa case at N = 32 for
   several gaps (--gap-sweep).

B. Metadata broadcast latency (roa), ``metadata_path`` ``direct`` (the owner writes into every
   peer's mailbox ring) against ``relay`` (owner -> bootstrap daemon -> every peer)::

       for k in range(M):   barrier; rank k % N allocates a fresh segment; every other rank
                            sleeps until its registration thread has mapped it

   so allocations are spaced out and nothing queues. Each peer's registration unit records
   (owner, receive latency, mapped latency) per REGISTER message, measured from the moment the
   owner published the allocation (CLOCK_MONOTONIC, shared by all processes). A broadcast's
   latency is the maximum over peers.

The host is small (2 cores shared by up to 32 rank processes), so absolute times are noisy:
every figure is a median over ranks and iterations within a repetition, then the median over
repetitions, with the range over repetitions in brackets. Compare ratios, not microseconds.
Other work on the same host distorts everything: each job's progress line (stderr) and the last
line say how much of the host it took, and ``--wait-quiet S`` waits up to S seconds for a quiet
host before each job and reruns a job that shared the host.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import stratacl

FRESH_BYTES = 2 * 1024 * 1024     # above 1 MiB the caching allocator gives a request its own segment
GAP_WORK_ELEMS = 64 * 1024        # float64 elements of the numpy "compute" gap (512 KiB)
MODES = ("jit", "roa", "pool")
PATHS = ("direct", "relay")


# --- inside a rank ------------------------------------------------------------------------------
class _PullTimer:
    """Times the part of an all_gather between its two barriers: from the communicator resolving
    its sources (where every peer segment's readiness is checked, and jit / roa's fallback map
    it) to the end of the backend's execution of the copy phase."""

    def __init__(self):
        from stratacl.runtime.pipeline import _execute
        from stratacl.runtime.communicator import Communicator
        sources, gather = Communicator._peer_sources, _execute.run_plan
        self.t0 = None
        self.last = 0

        def timed_sources(comm, *args, **kwargs):
            self.t0 = time.perf_counter_ns()
            return sources(comm, *args, **kwargs)

        def timed_gather(*args):
            skipped = gather(*args)
            if self.t0 is None:
                raise RuntimeError("pull timer: all_gather ran without resolving its sources first")
            self.last, self.t0 = time.perf_counter_ns() - self.t0, None
            return skipped

        Communicator._peer_sources = timed_sources
        _execute.run_plan = timed_gather


def _gap(gap: tuple[str, float, int], work: np.ndarray) -> None:
    kind, ms, reps = gap
    if kind == "sleep":
        time.sleep(ms / 1e3)
    elif kind == "compute":
        for _ in range(reps):
            np.multiply(work, 1.0000001, out=work)


_COUNTERS = ("registrations_in_operator", "registration_in_operator_ns", "ready_waits", "ready_wait_ns")


def _registration_counters() -> dict:
    return stratacl.stats()["registration"]


def _registration_thread_cpu() -> float:
    """CPU seconds used so far by this rank's registration thread (NaN if it cannot be found)."""
    import threading
    for t in threading.enumerate():
        if t.name.startswith("stratacl-registration") and t.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    return float("nan")


def first_use_rank(comm, sizes: list[int], iters: int, gap: tuple[str, float, int]) -> dict:
    """Part A in one rank: one row per (size, iteration), and the CPU the whole loop took.
    ``gap`` is (kind, ms, numpy repetitions)."""
    pull = _PullTimer()
    cpu0, reg_cpu0, wall0 = time.process_time(), _registration_thread_cpu(), time.perf_counter()
    n, me = comm.size, comm.rank
    mode = _registration_counters()["mode"]
    out = stratacl.empty((n * max(sizes),), np.uint8)
    work = np.random.default_rng(me).random(GAP_WORK_ELEMS)
    expect = (np.arange(n) & 0xFF).astype(np.uint8)
    rows = []
    for size in sizes:
        o = out[:n * size]
        for it in range(-1, iters):                # iteration -1 warms code paths; not recorded
            x = stratacl.empty((max(size, FRESH_BYTES),), np.uint8)
            x[:size] = me & 0xFF
            allocated = time.perf_counter_ns()
            _gap(gap, work)
            comm.barrier()
            c0 = _registration_counters()
            t0 = time.perf_counter_ns()
            comm.all_gather(o, x[:size])
            t1 = time.perf_counter_ns()
            first_pull = pull.last
            c1 = _registration_counters()
            comm.all_gather(o, x[:size])
            t2 = time.perf_counter_ns()
            warm_pull = pull.last
            c2 = _registration_counters()
            if not np.array_equal(o[::size], expect):
                raise AssertionError(f"rank {me}: all_gather of {size} B gave {o[::size].tolist()}")
            del x
            stratacl.empty_cache()
            if it < 0:
                continue
            d1 = {k: c1[k] - c0[k] for k in _COUNTERS}
            d2 = {k: c2[k] - c1[k] for k in _COUNTERS}
            rows.append(dict(
                size=size, interval_ns=t0 - allocated, first_ns=t1 - t0, warm_ns=t2 - t1,
                first_pull_ns=first_pull, warm_pull_ns=warm_pull,
                # jit: mappings in the operator; roa: fallback maps (their time is in late_ns)
                op_maps=d1["registrations_in_operator"], op_map_ns=d1["registration_in_operator_ns"],
                # roa: checks that found a segment unmapped (fallback map, or the thread finishing it)
                lates=d1["ready_waits"], late_ns=d1["ready_wait_ns"],
                critical_ns=d1["ready_wait_ns"] if mode == "roa" else d1["registration_in_operator_ns"],
                warm_registrations=d2["registrations_in_operator"] + d2["ready_waits"]))
    rounds = (iters + 1) * len(sizes)
    return dict(rows=rows, cpu_per_round=(time.process_time() - cpu0) / rounds,
                reg_cpu_per_round=(_registration_thread_cpu() - reg_cpu0) / rounds,
                wall_per_round=(time.perf_counter() - wall0) / rounds)


def broadcast_rank(comm, count: int, timeout: float, keep: list | None = None) -> list:
    """Part B in one rank: allocation k is made by rank k % N; returns this rank's
    (owner, recv_ns, mapped_ns) records, in arrival order. The allocations go into ``keep``
    (if given), so that the caller can hold them beyond the call."""
    from stratacl.runtime import runtime
    reg = runtime().reg
    n, me = comm.size, comm.rank
    keep = [] if keep is None else keep            # kept alive: no RELEASE traffic during the run
    comm.barrier()
    reg.latencies.clear()
    base = reg.counters["background_maps"]
    expected = 0
    for k in range(count):
        comm.barrier()
        if k % n == me:
            keep.append(stratacl.empty((FRESH_BYTES,), np.uint8))
        else:
            expected += 1
            with reg.cond:                          # sleep until our registration thread mapped it
                if not reg.cond.wait_for(lambda: reg.counters["background_maps"] - base >= expected, timeout):
                    raise TimeoutError(f"rank {me}: allocation {k} of rank {k % n} not mapped after {timeout} s")
    comm.barrier()
    return list(reg.latencies)


# --- in the driver ------------------------------------------------------------------------------
def _busy_cpu_seconds() -> float:
    """CPU time the whole host has spent busy since boot (all processes, all cores)."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    """CPU time of this process and of its reaped children (every rank and daemon of a finished job)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class _Host:
    """Runs each job and measures how much CPU other work on the host took meanwhile.

    Foreign load = host busy time - our own (driver + ranks + daemon), as a share of the job's
    wall time x cores. Other jobs distort everything here; with ``wait_quiet`` > 0 a job starts
    only once the host is quiet (or after waiting that long), and a job that had more than
    ``MAX_FOREIGN`` of the host taken by others is run again, at most ``RETRIES`` times.
    """

    RETRIES = 3
    MAX_FOREIGN = 0.10

    def __init__(self, wait_quiet: float):
        self.wait_quiet = wait_quiet
        self.cores = os.cpu_count() or 1
        self.jobs = self.contended = self.reruns = 0
        self.foreign: list[float] = []

    def _foreign_share(self, job):
        busy0, own0, t0 = _busy_cpu_seconds(), _own_cpu_seconds(), time.monotonic()
        result = job()
        busy1, own1, t1 = _busy_cpu_seconds(), _own_cpu_seconds(), time.monotonic()
        return result, max(0.0, (busy1 - busy0) - (own1 - own0)) / ((t1 - t0) * self.cores), t1 - t0

    def _wait_until_quiet(self) -> None:
        deadline = time.monotonic() + self.wait_quiet
        while time.monotonic() < deadline:
            if self._foreign_share(lambda: time.sleep(1.0))[1] < self.MAX_FOREIGN / 2:
                return

    def run(self, label: str, job):
        for attempt in range(self.RETRIES + 1):
            if self.wait_quiet:
                self._wait_until_quiet()
            result, foreign, wall = self._foreign_share(job)
            contended = foreign > self.MAX_FOREIGN
            print(f"  {label}: {wall:5.1f} s, other load {100 * foreign:3.0f}% of the host"
                  + (" (contended)" if contended else ""), file=sys.stderr, flush=True)
            if not contended or not self.wait_quiet or attempt == self.RETRIES:
                break
            self.reruns += 1
        self.jobs += 1
        self.contended += contended
        self.foreign.append(foreign)
        return result

    def summary(self) -> str:
        return (f"{self.jobs} jobs; other load on the host during a job: median "
                f"{100 * _median(self.foreign):.0f}%, max {100 * max(self.foreign):.0f}%; "
                f"{self.contended} jobs above {100 * self.MAX_FOREIGN:.0f}% ({self.reruns} reruns)")


def _calibrate_compute(ms: float) -> int:
    """Repetitions of the gap's numpy op that take ``ms`` on one uncontended core."""
    work = np.random.default_rng(0).random(GAP_WORK_ELEMS)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(50):
            np.multiply(work, 1.0000001, out=work)
        best = min(best, (time.perf_counter() - t0) / 50)
    return max(1, round(ms / 1e3 / best))


def _median(values) -> float:
    return float(np.median(values)) if len(values) else float("nan")


def summarise_first_use(rows: list[dict], n: int) -> dict:
    """Medians over every (rank, iteration) row of one repetition, in microseconds."""
    a = {k: np.array([r[k] for r in rows], dtype=np.float64) for k in rows[0]}
    peers = max(n - 1, 1)
    return dict(
        first_call_us=_median(a["first_ns"]) / 1e3, warm_call_us=_median(a["warm_ns"]) / 1e3,
        first_pull_us=_median(a["first_pull_ns"]) / 1e3, warm_pull_us=_median(a["warm_pull_ns"]) / 1e3,
        extra_pull_us=_median(a["first_pull_ns"] - a["warm_pull_ns"]) / 1e3,
        critical_mean_us=float(np.mean(a["critical_ns"])) / 1e3,
        jit_us=_median(a["op_map_ns"]) / 1e3, jit_per_peer_us=_median(a["op_map_ns"] / peers) / 1e3,
        jit_maps=float(np.mean(a["op_maps"])),
        late_us=_median(a["late_ns"]) / 1e3, late_mean_us=float(np.mean(a["late_ns"])) / 1e3,
        late_p90_us=float(np.percentile(a["late_ns"], 90)) / 1e3, late_max_us=float(a["late_ns"].max()) / 1e3,
        late_frac=float(np.mean(a["lates"] > 0)), fallback_maps=float(np.mean(a["op_maps"])),
        fallback_frac=float(np.mean(a["op_maps"] > 0)),
        interval_us=_median(a["interval_ns"]) / 1e3,
        warm_registrations=int(a["warm_registrations"].sum()), samples=len(rows))


def summarise_broadcast(per_rank: list[list], n: int) -> dict:
    """Match the k-th record of owner o on every peer to o's k-th allocation (rings are FIFO)."""
    recv, bcast, bcast_mapped = [], [], []
    for owner in range(n):
        seqs = [[rec for rec in recs if rec[0] == owner] for p, recs in enumerate(per_rank) if p != owner]
        if not seqs:
            continue
        for j in range(min(len(s) for s in seqs)):
            lat = [s[j][1] for s in seqs]
            recv += lat
            bcast.append(max(lat))
            bcast_mapped.append(max(s[j][2] for s in seqs))
    b = np.array(bcast, dtype=np.float64) / 1e3
    return dict(peer_recv_us=_median(np.array(recv) / 1e3), bcast_us=_median(b),
                bcast_p90_us=float(np.percentile(b, 90)) if b.size else float("nan"),
                bcast_mapped_us=_median(np.array(bcast_mapped) / 1e3), broadcasts=int(b.size))


def _across(reps: list[dict], key: str) -> tuple[float, float, float]:
    v = np.array([r[key] for r in reps], dtype=np.float64)
    return float(np.median(v)), float(v.min()), float(v.max())


def _num(v: float) -> str:
    if v != v:
        return "-"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _cell(reps: list[dict], key: str, scale: float = 1.0) -> str:
    med, lo, hi = _across(reps, key)
    if len(reps) == 1 or lo == hi:
        return _num(med * scale)
    return f"{_num(med * scale)} [{_num(lo * scale)}-{_num(hi * scale)}]"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _first_use_job(args, host: _Host, n: int, mode: str, gap: tuple[str, float, int], label: str) -> dict:
    """One part-A job; returns {size: summary}, plus {"cpu": where the host's CPU went}."""
    per_rank = host.run(f"{label} N={n:<2} {mode:<4} gap {_gap_name(gap)}", lambda: stratacl.spawn(
        first_use_rank, n, args=(args.sizes, args.iters, gap), registration=mode, hbm_size=args.hbm_size))
    rows = [r for rank in per_rank for r in rank["rows"]]
    out: dict = {size: summarise_first_use([r for r in rows if r["size"] == size], n) for size in args.sizes}
    cpu = sum(r["cpu_per_round"] for r in per_rank)
    wall = _median([r["wall_per_round"] for r in per_rank])
    out["cpu"] = dict(cpu_ms=cpu * 1e3, reg_cpu_ms=sum(r["reg_cpu_per_round"] for r in per_rank) * 1e3,
                      wall_ms=wall * 1e3, busy=cpu / (wall * (os.cpu_count() or 1)))
    return out


def run_first_use(args, host: _Host) -> dict:
    """{(size or "cpu", N, mode): [summary per repetition]}; modes interleaved so drift hits them alike."""
    results: dict = {}
    for rep in range(args.repeat):
        for n in args.ranks:
            for mode in args.modes:
                label = f"A rep {rep + 1}/{args.repeat}"
                for size, s in _first_use_job(args, host, n, mode, args.gap, label).items():
                    results.setdefault((size, n, mode), []).append(s)
    return results


def run_gap_sweep(args, host: _Host) -> dict:
    """{(size or "cpu", N, gap name): [summary per repetition]}, roa only."""
    results: dict = {}
    for rep in range(args.repeat):
        for n in args.sweep_ranks:
            for gap in args.gap_sweep:
                label = f"S rep {rep + 1}/{args.repeat}"
                for size, s in _first_use_job(args, host, n, "roa", gap, label).items():
                    results.setdefault((size, n, _gap_name(gap)), []).append(s)
    return results


def run_broadcast(args, host: _Host) -> dict:
    """{(N, path): [summary per repetition]}."""
    results: dict = {}
    for rep in range(args.repeat):
        for n in args.meta_ranks:
            count = -(-args.meta_allocs // n) * n
            for path in PATHS:
                per_rank = host.run(f"B rep {rep + 1}/{args.repeat} N={n:<2} {path:<6}", lambda: stratacl.spawn(
                    broadcast_rank, n, args=(count, 30.0), registration="roa", metadata_path=path,
                    hbm_size=args.hbm_size))
                results.setdefault((n, path), []).append(summarise_broadcast(per_rank, n))
    return results


def report_first_use(args, results: dict) -> str:
    out = []
    modes = args.modes
    for size in args.sizes:
        cp_rows, pull_rows, call_rows = [], [], []
        for n in args.ranks:
            get = {m: results[(size, n, m)] for m in modes}
            cp = [str(n), _cell(next(iter(get.values())), "interval_us", 1e-3)]
            if "jit" in get:
                cp += [_cell(get["jit"], "jit_us"), _cell(get["jit"], "jit_per_peer_us"),
                       _num(_across(get["jit"], "jit_maps")[0])]
            if "roa" in get:
                cp += [_cell(get["roa"], "late_us"), _cell(get["roa"], "late_mean_us"),
                       _cell(get["roa"], "late_frac", 100), _cell(get["roa"], "fallback_maps")]
            if "pool" in get:
                cp += [_cell(get["pool"], "critical_mean_us")]
            cp_rows.append(cp)
            pull_rows.append([str(n)] + [f"{_cell(get[m], 'first_pull_us')} / {_cell(get[m], 'warm_pull_us')}"
                                         for m in modes] + [_cell(get[m], "extra_pull_us") for m in modes])
            call_rows.append([str(n)] + [f"{_cell(get[m], 'first_call_us', 1e-3)} / "
                                         f"{_cell(get[m], 'warm_call_us', 1e-3)}" for m in modes])
        head = ["N", "allocation to first use (ms)"]
        if "jit" in modes:
            head += ["jit: mapping in operator (us/call)", "jit: per peer (us)", "jit: maps/call"]
        if "roa" in modes:
            head += ["roa: late checks, median (us/call)", "roa: late checks, mean (us/call)",
                     "roa: calls with a late peer (%)", "roa: fallback maps/call"]
        if "pool" in modes:
            head += ["pool: mean (us/call)"]
        out += [f"### A1. Registration time on the critical path of the first all_gather "
                f"({_size(size)} per rank, gap {_gap_name(args.gap)})\n", _table(head, cp_rows), "",
                "### A2. Pull phase of the all_gather (us; between its barriers): first use / warm, "
                "and the first-use excess (median of first - warm)\n",
                _table(["N"] + [f"{m}: first / warm" for m in modes] + [f"{m}: excess" for m in modes], pull_rows),
                "", "### A3. Whole all_gather call (ms; both N-rank barriers included): first use / warm\n",
                _table(["N"] + [f"{m}: first / warm" for m in modes], call_rows), ""]
    cpu_rows = [[str(n), m, _cell(reps, "wall_ms"), _cell(reps, "cpu_ms"), _cell(reps, "reg_cpu_ms"),
                 _cell(reps, "busy", 100)] for n in args.ranks for m in modes for reps in [results[("cpu", n, m)]]]
    out += ["### A4. Where the host's CPU goes, per round (one fresh buffer per rank, its gap, barrier, "
            "two all_gathers, release)\n",
            _table(["N", "mode", "wall per round (ms)", "CPU of all ranks per round (ms)",
                    "of which registration threads (ms)", f"host busy (% of {os.cpu_count()} cores)"], cpu_rows), ""]
    warm = sum(r.get("warm_registrations", 0) for reps in results.values() for r in reps)
    if warm:
        out.append(f"WARNING: {warm} warm all_gather calls registered or waited (expected none)\n")
    return "\n".join(out)


def report_gap_sweep(args, results: dict) -> str:
    out = []
    for size in args.sizes:
        rows = []
        for n in args.sweep_ranks:
            for gap in args.gap_sweep:
                reps = results[(size, n, _gap_name(gap))]
                cpu = results[("cpu", n, _gap_name(gap))]
                rows.append([str(n), _gap_name(gap), _cell(reps, "interval_us", 1e-3),
                             _cell(reps, "late_frac", 100), _cell(reps, "fallback_maps"),
                             _cell(reps, "late_mean_us"), _cell(reps, "late_p90_us"),
                             _cell(reps, "late_max_us", 1e-3), f"{_cell(reps, 'first_pull_us')} / "
                             f"{_cell(reps, 'warm_pull_us')}", _cell(cpu, "busy", 100)])
        out += [f"### A5. roa against the allocation-to-use gap ({_size(size)} per rank)\n",
                _table(["N", "gap", "allocation to first use (ms)", "calls with a late peer (%)",
                        "fallback maps/call", "late checks, mean (us/call)", "late checks, p90 (us/call)",
                        "longest (ms)",
                        "pull phase first / warm (us)", "host busy (%)"], rows), ""]
    return "\n".join(out)


def report_broadcast(args, results: dict) -> str:
    rows = []
    for n in args.meta_ranks:
        for path in PATHS:
            reps = results[(n, path)]
            rows.append([str(n), path, _cell(reps, "peer_recv_us"), _cell(reps, "bcast_us"),
                         _cell(reps, "bcast_p90_us"), _cell(reps, "bcast_mapped_us"), str(reps[0]["broadcasts"])])
        d, r = results[(n, "direct")], results[(n, "relay")]
        ratio = sorted(a["bcast_us"] / b["bcast_us"] for a, b in zip(r, d))
        span = f" [{_num(ratio[0])}-{_num(ratio[-1])}]" if len(ratio) > 1 else ""
        rows.append([str(n), "relay / direct", "", f"{_num(float(np.median(ratio)))}x{span}", "", "", ""])
    head = ["N", "metadata path", "per-peer receive, median (us)", "broadcast = max over peers, median (us)",
            "broadcast p90 (us)", "mapped on every peer, median (us)", "broadcasts per rep"]
    return ("### B. Metadata broadcast latency (roa; one allocation at a time: each starts after a barrier "
            "and after every peer mapped the previous one)\n\n" + _table(head, rows) + "\n")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def _parse_gap(text: str) -> tuple[str, float, int]:
    """'none', 'sleep:MS' or 'compute:MS' -> (kind, ms, numpy repetitions)."""
    kind, _, ms = text.strip().partition(":")
    if kind == "none" and not ms:
        return ("none", 0.0, 0)
    if kind not in ("sleep", "compute") or not ms:
        raise argparse.ArgumentTypeError(f"not a gap: {text!r} (examples: none, sleep:5, compute:5)")
    value = float(ms)
    return (kind, value, _calibrate_compute(value) if kind == "compute" else 0)


def _gap_name(gap: tuple[str, float, int]) -> str:
    return gap[0] if gap[0] == "none" else f"{gap[0]} {gap[1]:g} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=_ints, default=[2, 4, 8, 16, 32], help="world sizes of part A (default 2,4,8,16,32)")
    p.add_argument("--modes", type=lambda s: [m for m in s.split(",") if m], default=list(MODES),
                   help="registration modes of part A (default jit,roa,pool)")
    p.add_argument("--sizes", type=lambda s: [_parse_size(v) for v in s.split(",") if v], default=[64 * 1024],
                   help="bytes each rank contributes to the all_gather (default 64K); the buffer itself is "
                        "at least 2 MiB so that it is a segment of its own")
    p.add_argument("--iters", type=int, default=20, help="fresh buffers per rank and size in part A (default 20)")
    p.add_argument("--gap", type=_parse_gap, default="sleep:5",
                   help="between allocation and first use in part A: sleep:MS (host idle, as while a device "
                        "computes), compute:MS (host CPU busy with numpy for MS on one uncontended core), or "
                        "none (only the barrier). Default sleep:5")
    p.add_argument("--gap-sweep", type=lambda s: [_parse_gap(g) for g in s.split(",") if g],
                   default="none,sleep:1,sleep:5,compute:5",
                   help="gaps of the roa sweep, part A5 (default none,sleep:1,sleep:5,compute:5)")
    p.add_argument("--sweep-ranks", type=_ints, default=[32], help="world sizes of the gap sweep (default 32)")
    p.add_argument("--meta-ranks", type=_ints, default=[8, 32], help="world sizes of part B (default 8,32)")
    p.add_argument("--meta-allocs", type=int, default=128, help="allocations per part-B job (default 128)")
    p.add_argument("--repeat", type=int, default=3, help="repetitions of everything (default 3)")
    p.add_argument("--only", choices=("first-use", "gap-sweep", "broadcast"), help="run one part only")
    p.add_argument("--hbm-size", default="1G", help="HBM per rank (default 1G)")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                   help="before each job, wait up to S seconds for the host to be quiet, and rerun a job "
                        "during which other work took more than 10%% of the host (default 0: neither)")
    p.add_argument("--json", help="also write the per-repetition summaries to this file")
    p.add_argument("--quick", action="store_true",
                   help="N = 2,8; 5 iterations; sweep none,sleep:5 at N = 8; part B at N = 8; one repetition")
    args = p.parse_args(argv)
    if args.quick:
        args.ranks, args.iters, args.repeat = [2, 8], 5, 1
        args.sweep_ranks, args.gap_sweep = [8], [_parse_gap("none"), _parse_gap("sleep:5")]
        args.meta_ranks, args.meta_allocs = [8], 32
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        p.error(f"unknown registration mode(s) {bad}; choose from {', '.join(MODES)}")

    host = _Host(args.wait_quiet)
    started = time.monotonic()
    command = " ".join(argv if argv is not None else sys.argv[1:])
    other_load = host._foreign_share(lambda: time.sleep(1.0))[1]
    print(f"# StrataCL-emu registration benchmark\n\n"
          f"command: `python benchmarks/registration.py {command}`  \n"
          f"host: {os.cpu_count()} cores, Python {sys.version.split()[0]}, numpy {np.__version__}; "
          f"share of the host busy with other work at start: {100 * other_load:.0f}%  \n"
          f"library: {os.path.dirname(stratacl.__file__)}  \n"
          f"each cell: median over ranks x iterations, then median over {args.repeat} repetition(s) "
          f"[min-max over repetitions]\n", flush=True)
    summaries: dict = {}
    if args.only in (None, "first-use"):
        a = run_first_use(args, host)
        print(report_first_use(args, a), flush=True)
        summaries["first_use"] = {f"{s}/{n}/{m}": v for (s, n, m), v in a.items()}
    if args.only in (None, "gap-sweep"):
        g = run_gap_sweep(args, host)
        print(report_gap_sweep(args, g), flush=True)
        summaries["gap_sweep"] = {f"{s}/{n}/{name}": v for (s, n, name), v in g.items()}
    if args.only in (None, "broadcast"):
        b = run_broadcast(args, host)
        print(report_broadcast(args, b), flush=True)
        summaries["broadcast"] = {f"{n}/{path}": v for (n, path), v in b.items()}
    print(f"total {time.monotonic() - started:.0f} s; {host.summary()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(command=command, summaries=summaries), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
