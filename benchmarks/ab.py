"""A/B of two builds of StrataCL-emu with stratacl-bench, run alternately, medians compared.

    python benchmarks/ab.py --a /tmp/before/venv/bin/python --b /tmp/after/venv/bin/python \
        [--nranks 8,32] [--sizes 64K,1M] [--ops all] [--moe-tokens 128] [--rounds 3] [-w 3] [-i 20] \
        [--json out.json]

Each side is a Python interpreter with its own install of the project (for example two clones,
each with ``python -m venv venv && venv/bin/pip install -e .``). For every (operator, N) the
two sides' ``stratacl-bench OP -n N -b MIN -e MAX`` runs alternate, A first in odd rounds and B
first in even ones, so drift in the host's speed falls on both; the table shows the median
per-call time of each side over the rounds, B / A, and the spread (min-max) of each side. A
change to the inside of the library keeps speed when B / A stays within the spread.

``--moe-tokens T`` adds a low-latency MoE dispatch of T tokens per rank (``stratacl-bench
dispatch --mode ll``, hidden 7168, top-8 of 256 experts) at each N, as operator ``ll_dispatch``.
Each side runs the ``stratacl-bench`` installed beside its python, so the two builds may name
their modules differently.

Nothing else should run on the host meanwhile: ranks outnumber cores, and another process's
work lands in whichever side runs beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

OPS = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "broadcast", "sendrecv", "barrier")


PER_RANK_TIMES_N = ("all_gather", "reduce_scatter", "all_to_all")   # nccl-tests size: N x per rank


def _sizes(op: str, n: int, per_rank: list[int]) -> list[int]:
    """The sweep's sizes in stratacl-bench's (nccl-tests') meaning for these per-rank sizes."""
    if op == "barrier":
        return [0]
    return [s * n for s in per_rank] if op in PER_RANK_TIMES_N else list(per_rank)


def _run(python: str, op: str, n: int, sizes: list[int], warmup: int, iters: int) -> dict[int, float]:
    """One stratacl-bench sweep over ``sizes`` (ascending): per-call wall time (us) by size."""
    with tempfile.TemporaryDirectory(prefix="stratacl-ab-") as tmp:
        out = os.path.join(tmp, "rows.json")
        # the sweep's step: the smallest ratio of two neighbouring sizes (256, 64K, 1M: x16 from
        # 256 passes 64K and 1M), so every size asked for is a point of the sweep
        factor = min((b // a for a, b in zip(sizes, sizes[1:]) if a), default=2)
        if op == "ll_dispatch":
            cmd = [*_bench(python), "dispatch", "--mode", "ll", "-n", str(n), "--tokens", str(sizes[0]),
                   "-w", str(warmup), "-i", str(iters), "-J", out]
        else:
            cmd = [*_bench(python), op, "-n", str(n), "-b", str(sizes[0]), "-e", str(sizes[-1]),
                   "-f", str(factor), "-w", str(warmup), "-i", str(iters), "--no-limit", "-J", out]
        # the working directory off sys.path: each side imports its own install
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=tmp)
        if proc.returncode != 0:
            raise SystemExit(f"ab: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        with open(out) as f:
            rows = json.load(f)["rows"]
    if op == "ll_dispatch":
        return {sizes[0]: float(rows[0]["time_us"])}
    return {int(r["size"]): float(r["time_us"]) for r in rows if int(r["size"]) in sizes}


def _bench(python: str) -> list[str]:
    """The stratacl-bench command of the install ``python`` belongs to."""
    script = os.path.join(os.path.dirname(python), "stratacl-bench")
    return [script] if os.path.exists(script) else [python, "-m", "stratacl.bench._command"]


def _bytes(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1].upper()] if text[-1].upper() in mult else int(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="the A side's python (before)")
    p.add_argument("--b", required=True, help="the B side's python (after)")
    p.add_argument("--nranks", default="8,32")
    p.add_argument("--sizes", default="64K,1M", help="per-rank sizes: the smallest and the largest")
    p.add_argument("--ops", default="all", help=f"comma-separated, or all ({', '.join(OPS)})")
    p.add_argument("--moe-tokens", type=int, default=0, help="add a low-latency dispatch of this many tokens")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("-w", "--warmup", type=int, default=3)
    p.add_argument("-i", "--iters", type=int, default=20)
    p.add_argument("--json", default=None, help="write every run's times here")
    args = p.parse_args(argv)
    ops = OPS if args.ops == "all" else tuple(args.ops.split(","))
    ops += ("ll_dispatch",) if args.moe_tokens else ()
    per_rank = sorted(_bytes(s) for s in args.sizes.split(","))
    times: dict[tuple[str, int, int], dict[str, list[float]]] = {}
    for op in ops:
        for n in (int(v) for v in args.nranks.split(",")):
            for rnd in range(args.rounds):
                order = (("A", args.a), ("B", args.b)) if rnd % 2 == 0 else (("B", args.b), ("A", args.a))
                for side, python in order:
                    sizes = [args.moe_tokens] if op == "ll_dispatch" else _sizes(op, n, per_rank)
                    for size, t in _run(python, op, n, sizes, args.warmup, args.iters).items():
                        times.setdefault((op, n, size), {"A": [], "B": []})[side].append(t)
                print(f"ab: {op} N={n} round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"{'operator':<15} {'N':>3} {'size (nccl-tests)':>17} {'A median us':>12} {'B median us':>12} {'B/A':>6}  "
          f"{'A spread':>17} {'B spread':>17}")
    for (op, n, size), t in sorted(times.items()):
        a, b = statistics.median(t["A"]), statistics.median(t["B"])
        print(f"{op:<15} {n:>3} {size:>17} {a:>12.1f} {b:>12.1f} {b / a:>6.2f}  "
              f"{min(t['A']):>8.1f}-{max(t['A']):<8.1f} {min(t['B']):>8.1f}-{max(t['B']):<8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"a": args.a, "b": args.b, "runs": [{"op": op, "n": n, "size": size, **t}
                                                          for (op, n, size), t in sorted(times.items())]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
