"""Host performance against Open MPI, in one run: the table of docs/performance.md.

    python benchmarks/host_performance.py                     # N = 8 and 32, every operator, 3 repetitions
    python benchmarks/host_performance.py --ranks 8 --repeat 1 --ops all_gather,sendrecv  # a slice
    python benchmarks/host_performance.py --ops none --no-memory                # latency rows only

For every (N, operator) it runs ``stratacl-bench OP -n N ... --vs mpi -J`` ``--repeat`` times
(each run measures StrataCL, then Open MPI, then the host copy limit, back to back) and prints
medians over the repetitions: StrataCL's busbw, MPI's, their ratio, and StrataCL's busbw as a
fraction of the host limit. Sizes are per-rank payloads (input for all_gather, output for
reduce_scatter, the whole buffer otherwise), 64 KiB to 16 MiB (4 MiB for all_gather and
reduce_scatter at N = 32), converted to nccl-tests' size column by the bench. Then the latency
rows (barrier, 4 KiB all_reduce and all_gather) and the private memory (USS) of ranks during a
4 MiB-per-rank all_gather sweep at N = 32.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

KiB, MiB = 1024, 1024 * 1024
OPS = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "broadcast", "sendrecv")


def per_rank_sizes(op: str, n: int) -> list[int]:
    top = 4 * MiB if (n >= 32 and op in ("all_gather", "reduce_scatter")) else 16 * MiB
    sizes, s = [], 64 * KiB
    while s <= top:
        sizes.append(s)
        s *= 4
    return sizes


def bench_size(op: str, n: int, per_rank: int) -> int:
    """nccl-tests' size column for a per-rank payload."""
    return per_rank * n if op in ("all_gather", "reduce_scatter") else per_rank


def run_bench(op: str, n: int, lo: int, hi: int, iters: int, extra: list[str], warmup: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = ["stratacl-bench", op, "-n", str(n), "-b", str(lo), "-e", str(hi), "-f", "4", "-w", str(warmup),
               "--warmup-seconds", "1", "-i", str(iters), "-c", "1", "--vs", "mpi", "-J", out, *extra]
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=3600)
        with open(out) as f:
            return json.load(f)


def median_rows(runs: list[dict]) -> list[dict]:
    rows = []
    for i, r0 in enumerate(runs[0]["rows"]):
        ours = [r["rows"][i] for r in runs]
        peer = [r["peers"]["mpi"][i] for r in runs if isinstance(r.get("peers", {}).get("mpi"), list)]
        row = dict(size=r0["size"], count=r0["count"],
                   time_us=statistics.median(o["time_us"] for o in ours),
                   busbw=statistics.median(o["busbw"] for o in ours),
                   wrong=max(o["wrong"] for o in ours),
                   limit_fraction=statistics.median(o.get("limit_fraction", 0.0) for o in ours))
        if peer:
            row["mpi_time_us"] = statistics.median(p["time_us"] for p in peer)
            row["mpi_busbw"] = statistics.median(p["busbw"] for p in peer)
            row["busbw_ratio"] = statistics.median(o["busbw"] / p["busbw"] if p["busbw"] else float("nan")
                                                   for o, p in zip(ours, peer))
            row["time_ratio"] = statistics.median(o["time_us"] / p["time_us"] for o, p in zip(ours, peer))
        rows.append(row)
    return rows


def uss_probe(comm, per_rank: int, iters: int):
    """Largest USS (private memory) of this rank while it runs all_gathers of up to ``per_rank``
    bytes, and the same without HBM pages: a page of the rank's own HBM that no other process
    maps (its output buffer) counts as unique too."""
    import psutil
    import stratacl
    proc = psutil.Process()

    def sample():
        uss = proc.memory_full_info().uss
        hbm = sum(m.private_clean + m.private_dirty for m in proc.memory_maps(grouped=True)
                  if "/dev/shm/stratacl-" in m.path)
        return uss, uss - hbm

    peak, peak_own = sample()
    for size in (64 * KiB, 256 * KiB, MiB, per_rank):
        x = stratacl.empty((size,), np.uint8)
        out = stratacl.empty((comm.size * size,), np.uint8)
        for _ in range(iters):
            comm.all_gather(out, x)
            uss, own = sample()
            peak, peak_own = max(peak, uss), max(peak_own, own)
        del x, out
    return peak, peak_own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="8,32")
    ap.add_argument("--ops", default=",".join(OPS),
                    help=f"bandwidth rows, comma separated, from {', '.join(OPS)}; 'none' for none "
                         f"(barrier is a latency row)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--small-iters", type=int, default=50, help="timed iterations below 1 MiB")
    ap.add_argument("--iters", type=int, default=30, help="timed iterations from 1 MiB to below 16 MiB")
    ap.add_argument("--large-iters", type=int, default=10, help="timed iterations from 16 MiB")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    a = ap.parse_args()
    ranks = [int(r) for r in a.ranks.split(",")]
    ops = [o for o in a.ops.split(",") if o and o != "none"]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        ap.error(f"--ops: no bandwidth rows for {', '.join(unknown)} (choose from {', '.join(OPS)}, or none)")
    report: dict = {"bandwidth": {}, "latency": {}, "memory": {}}
    print("| N | operator | per-rank payload | StrataCL busbw (GB/s) | MPI busbw (GB/s) | ratio | % of host limit | #wrong |")
    print("|---|---|---|---|---|---|---|---|")
    for n in ranks:
        for op in ops:
            sizes = per_rank_sizes(op, n)
            small = [s for s in sizes if s < MiB]
            mid = [s for s in sizes if MiB <= s < 16 * MiB]
            large = [s for s in sizes if s >= 16 * MiB]
            rows = []
            # more iterations from 1 MiB than before: a loop's last call also absorbs how far
            # the ranks drifted apart (a ring of 1 MiB sendrecv at N = 8: about 0.1 ms). Until
            # the sweep put a barrier after each timed loop, the ranks done first went on to
            # the data check while others were still in their last calls, which cost those
            # calls 2.5-8 ms; with 10 iterations the 1-4 MiB cells measured mostly that.
            # Iterations fall with the payload to bound the run's length (nccl-tests runs 5
            # warm-up and 20 timed iterations by default); every size also warms up for 1 s
            # of wall time, both libraries alike: freshly started rank processes take about a
            # second to settle (a 4 KiB all_reduce at N = 8 goes from 157 to 64 us per call
            # over its first 1200 calls)
            for part, iters, warmup in ((small, a.small_iters, 10), (mid, a.iters, 3), (large, a.large_iters, 3)):
                if part:
                    runs = [run_bench(op, n, bench_size(op, n, part[0]), bench_size(op, n, part[-1]), iters, [],
                                      warmup) for _ in range(a.repeat)]
                    rows += median_rows(runs)
            report["bandwidth"][f"{n}/{op}"] = rows
            for per, r in zip(sizes, rows):
                print(f"| {n} | {op} | {per // KiB} KiB | {r['busbw']:.3f} | {r.get('mpi_busbw', float('nan')):.3f} | "
                      f"{r.get('busbw_ratio', float('nan')):.2f} | {100 * r['limit_fraction']:.0f}% | {r['wrong']} |",
                      flush=True)
    if not a.no_latency:
        print()
        print("| N | operation | StrataCL (us) | MPI (us) | ratio (time) |")
        print("|---|---|---|---|---|")
        for n in ranks:
            for op, size in (("barrier", 0), ("all_reduce", 4 * KiB), ("all_gather", 4 * KiB * n)):
                runs = [run_bench(op, n, max(size, 4), max(size, 4), 500 if op == "barrier" else 100,
                                  ["--no-limit"], 20) for _ in range(a.repeat)]
                r = median_rows(runs)[0]
                report["latency"][f"{n}/{op}"] = r
                print(f"| {n} | {op}{'' if op == 'barrier' else ' 4 KiB'} | {r['time_us']:.0f} | "
                      f"{r.get('mpi_time_us', float('nan')):.0f} | {r.get('time_ratio', float('nan')):.2f} |",
                      flush=True)
    if not a.no_memory:
        import stratacl
        peaks = stratacl.spawn(uss_probe, 32, args=(4 * MiB, 3), hbm_size="1G")
        uss = [p[0] for p in peaks]
        own = [p[1] for p in peaks]
        report["memory"] = {"uss_max_mib": max(uss) / MiB, "uss_median_mib": statistics.median(uss) / MiB,
                            "uss_without_hbm_max_mib": max(own) / MiB}
        print()
        print(f"USS of a rank during a 4 MiB-per-rank all_gather sweep at N = 32: median "
              f"{statistics.median(uss) / MiB:.1f} MiB, max {max(uss) / MiB:.1f} MiB; without the rank's "
              f"HBM pages: median {statistics.median(own) / MiB:.1f} MiB, max {max(own) / MiB:.1f} MiB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
