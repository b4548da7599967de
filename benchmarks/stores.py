"""How this host copies: ordinary stores (memcpy) against streaming (non-temporal) stores, by
working-set size and number of cores. A benchmark, not a test: it prints a markdown table.

    python benchmarks/stores.py                        # 64 KiB .. 1 GiB, 1 and all cores (~30 s)
    python benchmarks/stores.py --footprints 1M,64M --workers 2

The collectives' kernels (collectives/_kernels.c) write a phase with streaming stores once the
phase's writes, over all members of the communicator, reach the last-level cache
(``_kernels.stream_footprint()``); this table is the evidence for that rule on a given host.
Each worker process copies its share of the footprint (half source, half destination) over
and over for ``--seconds``, with both ways in turn; the aggregate is bytes copied by all
workers over the longest worker's time (stratacl.bench._hostlimit, as the host limit of
stratacl-bench measures it).
"""
from __future__ import annotations

import argparse
import os

from stratacl._config import parse_size
from stratacl.bench._hostlimit import copy_bandwidth_by_stores
from stratacl.collectives import _kernels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--footprints", default="64K,256K,1M,4M,16M,32M,64M,256M,1G",
                    help="total working sets (source + destination), comma separated")
    ap.add_argument("--workers", default=f"1,{os.cpu_count() or 1}", help="worker counts, comma separated")
    ap.add_argument("--seconds", type=float, default=0.25, help="copying time per way and footprint")
    a = ap.parse_args()
    footprints = [parse_size(f) for f in a.footprints.split(",")]
    workers = sorted({int(w) for w in a.workers.split(",")})
    print(f"streaming from a phase write footprint of {_kernels.stream_footprint() / 2**20:g} MiB "
          f"(last-level cache)\n")
    print("| workers | footprint | ordinary stores (GB/s) | streaming stores (GB/s) | streaming / ordinary |")
    print("|---|---|---|---|---|")
    for w in workers:
        for fp, (plain, stream) in zip(footprints, copy_bandwidth_by_stores(footprints, w, a.seconds)):
            print(f"| {w} | {fp / 2**20:g} MiB | {plain:.1f} | {stream:.1f} | {stream / plain:.2f} |")


if __name__ == "__main__":
    main()
