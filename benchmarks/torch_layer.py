"""torch.distributed on StrataCL against gloo, and against StrataCL's own numpy API: the
"torch.distributed" table of docs/notebook/performance-2026-12-02.md (issue 22, point 5).

    python benchmarks/torch_layer.py --json docs/results/torchbench-2026-12-02.json         # N = 8 and 32, 4 ops
    python benchmarks/torch_layer.py --ranks 8 --ops all_reduce --repeat 1          # a slice

For every (N, operator) and repetition it runs

    stratacl-bench OP -n N -b 64K -e 16M -f 4 --api torch --rounds R --vs gloo -J ...

which times, in the same rank processes, the sweep through ``torch.distributed`` (backend
"stratacl") and through the numpy API in alternating rounds, then the same torch calls on
gloo (``--peers-first`` on every other repetition, so gloo goes first half the time). Sizes are
the bench's (nccl-tests') size column. It prints, per cell, the medians over repetitions of:
StrataCL-through-torch busbw, gloo's, their ratio (target >= 5), and torch time / numpy time
(target <= 1.20 at 64 KiB, <= 1.05 from 1 MiB), with the host's load average around each run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def run(op: str, n: int, args, peers_first: bool) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = ["stratacl-bench", op, "-n", str(n), "-b", args.min, "-e", args.max, "-f", "4", "-w", str(args.warmup),
               "-i", str(args.iters), "-c", "1", "--api", "torch", "--rounds", str(args.rounds), "--vs", "gloo",
               "--no-limit", "-J", out] + (["--peers-first"] if peers_first else [])
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=3600)
        with open(out) as f:
            return json.load(f)


def cells(runs: list[dict]) -> list[dict]:
    out = []
    for i, r0 in enumerate(runs[0]["rows"]):
        torch_rows = [r["rows"][i] for r in runs]
        numpy_rows = [r["numpy_rows"][i] for r in runs]
        gloo_rows = [r["peers"]["gloo"][i] for r in runs if isinstance(r.get("peers", {}).get("gloo"), list)]
        cell = dict(size=r0["size"], torch_time_us=statistics.median(t["time_us"] for t in torch_rows),
                    numpy_time_us=statistics.median(p["time_us"] for p in numpy_rows),
                    torch_busbw=statistics.median(t["busbw"] for t in torch_rows),
                    layer_ratio=statistics.median(t["time_us"] / p["time_us"] for t, p in zip(torch_rows, numpy_rows)),
                    layer_ratios=[t["time_us"] / p["time_us"] for t, p in zip(torch_rows, numpy_rows)],
                    wrong=max(t["wrong"] + p["wrong"] for t, p in zip(torch_rows, numpy_rows)))
        if gloo_rows:
            cell.update(gloo_busbw=statistics.median(g["busbw"] for g in gloo_rows),
                        gloo_ratio=statistics.median(t["busbw"] / g["busbw"] for t, g in zip(torch_rows, gloo_rows)),
                        gloo_wrong=max(g["wrong"] for g in gloo_rows))
        out.append(cell)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="8,32")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--repeat", type=int, default=2, help="runs per cell; odd-numbered ones run gloo first")
    ap.add_argument("--rounds", type=int, default=3, help="alternating torch/numpy rounds per size and run")
    ap.add_argument("-w", "--warmup", type=int, default=5)
    ap.add_argument("-i", "--iters", type=int, default=20)
    ap.add_argument("-b", "--min", default="64K")
    ap.add_argument("-e", "--max", default="16M")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    doc = {"args": vars(args), "cells": []}
    print("| N | operator (torch call) | size | busbw via torch (GB/s) | gloo busbw | x gloo (>= 5) | torch / numpy "
          "time (runs) | target | load before -> after | #wrong |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in [int(v) for v in args.ranks.split(",")]:
        for op in args.ops.split(","):
            runs = [run(op, n, args, peers_first=bool(k % 2)) for k in range(args.repeat)]
            loads = [f"{r['header']['load_before'][0]:.0f} -> {r['header']['load_after'][0]:.0f}" for r in runs]
            call = runs[0]["header"]["torch_call"]
            for c in cells(runs):
                target = 1.20 if c["size"] < (1 << 20) else 1.05
                print(f"| {n} | {op} ({call}) | {c['size'] // 1024} KiB | {c['torch_busbw']:.3f} | "
                      f"{c.get('gloo_busbw', float('nan')):.3f} | {c.get('gloo_ratio', float('nan')):.1f} | "
                      f"{c['layer_ratio']:.2f} ({', '.join(f'{v:.2f}' for v in c['layer_ratios'])}) | "
                      f"{target:.2f} | {'; '.join(loads)} | {c['wrong']}/{c.get('gloo_wrong', '-')} |", flush=True)
                doc["cells"].append(dict(c, n=n, op=op, torch_call=call, loads=[(r["header"]["load_before"],
                                                                              r["header"]["load_after"]) for r in runs]))
            doc.setdefault("runs", []).extend({"n": n, "op": op, **r} for r in runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
