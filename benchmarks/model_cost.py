"""What the fabric model costs to evaluate on this host. A benchmark, not a test: it prints a
markdown table. The unit tests check what the model computes (tests/test_model.py); how long
it takes depends on the host's load, so it is measured here, where a slow run is a number to
read, not a failure.

    python benchmarks/model_cost.py               # 5 repetitions of each case
    python benchmarks/model_cost.py --repeat 1

Cases:
  phase 32      one full-mesh phase of 32 ranks on cm384, 1 GiB per transfer (992 transfers),
                ``ub._sharing.BandwidthSharing.phase``: the model's inner step
  estimate 256  ``stratacl.estimate("all_gather", 256, 256 GiB, algo="auto")``: both algorithms
                at 256 ranks, what estimate-only mode does for the paper's largest sizes
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

GIB = 1 << 30


def _phase_32():
    from stratacl.ub import _topology
    from stratacl.ub._sharing import LOAD, BandwidthSharing
    f = BandwidthSharing(_topology.load("cm384"))
    r, o = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    off = r != o
    return lambda: f.phase(r[off], o[off], GIB, LOAD)


def _estimate_256():
    import stratacl
    return lambda: stratacl.estimate("all_gather", 256, 256 * GIB, algo="auto")


CASES = {"phase 32": _phase_32, "estimate 256": _estimate_256}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs of each case (default 5)")
    a = ap.parse_args(argv)
    print("| case | runs | best (ms) | median (ms) |")
    print("|---|---|---|---|")
    for name, make in CASES.items():
        fn = make()
        times = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        print(f"| {name} | {a.repeat} | {min(times):.2f} | {statistics.median(times):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
