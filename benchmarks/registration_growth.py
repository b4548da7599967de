"""What it costs to make a new chunk of an expandable segment usable by every peer: registration
on remap (roa, in the background), at first use (jit), and re-registering the whole grown
segment instead of the chunk. A benchmark, not a test: it prints a markdown table (progress on
stderr). docs/registration.md (part C) has a recorded run and how to read it.

    python benchmarks/registration_growth.py                  # N = 8 and 32, 3 repetitions (~3 min)
    python benchmarks/registration_growth.py --ranks 8 --repeat 1 --iters 8     # smoke run
    python benchmarks/registration_growth.py --wait-quiet 600  # each job on a quiet host (as recorded)

Every rank, with the expandable allocator (2 MiB chunks), first holds a segment of ``--base``
bytes that every peer has mapped and read, then grows it ``--iters`` times by one chunk::

    x = stratacl.empty(chunk)        # the pool's tail is full: exactly one new chunk is mapped,
                                     # a registration of its own (roa announces it to every peer)
    gap                              # sleep --gap ms (the device computing; nothing registers here)
    barrier
    all_gather(out, x[:64 KiB])      # first use of every peer's new chunk: timed, counters read

Before that loop (roa), the ranks grow one at a time (rank k % N by one chunk; the others sleep
until their registration thread has mapped it), as part B of benchmarks/registration.py does
for segments. Per mode, from ``stratacl.stats()["registration"]`` and the registration unit:

- roa, background: from the owner publishing the chunk to the peer's registration thread having
  mapped it (per-peer latency records, CLOCK_MONOTONIC), the maximum over peers per chunk:
  "usable everywhere"; one growth at a time (latency), and all ranks at once in the loop (N-1
  chunks arrive together at every peer).
- roa, critical path: ``ready_wait_ns`` at first use (checks that found a chunk not mapped yet).
- jit, critical path: ``registration_in_operator_ns``: the first use maps the N-1 new chunks.
- whole segment: what a scheme that registers the grown segment again, rather than the new
  chunk, would put on the critical path: each rank unmaps and maps again its right neighbour's
  whole segment (one mmap per physically contiguous run, offsets from the chunk table), and
  touches its pages, which the new mapping makes fault in again (page-table work that grows
  with the segment, as the paper's page-table updates do); times N-1 peers. Measured after the
  growth loop (it holds the interpreter, which would delay the registration thread), for one
  peer per rank, 5 times, at the grown segment's size, against touching the same pages
  through the intact mapping.

The fabric model's price of one jit mapping (the four steps of topology ``registration``, per GiB x
size, topology cm384) is printed beside it for a chunk and for the whole segment.

Other work on the host distorts the latencies (a busy host delays every wake-up): as in
benchmarks/registration.py, each job's progress line says how much of the host others took,
and ``--wait-quiet S`` waits for a quiet host and reruns a job others disturbed.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import stratacl
from stratacl._config import parse_size
from stratacl.runtime.pipeline import EAGER_BYTES
from stratacl.ub._clock import FabricModel

from registration import FRESH_BYTES, _Host, broadcast_rank   # benchmarks/registration.py

GATHER = 64 * 1024
WHOLE_REPEAT = 5                                  # whole-segment re-registrations per rank


def grow_rank(comm, base: int, iters: int, gap_ms: float, timeout: float = 120.0) -> dict:
    from stratacl.runtime import runtime
    rt = runtime()
    reg, chunk = rt.reg, rt.allocator.chunk
    assert chunk == FRESH_BYTES, "part B's allocations must be one chunk each"
    n, me = comm.size, comm.rank
    seg = stratacl.empty((base,), np.uint8)       # the pool's first block: its tail ends on a chunk
    seg[::4096] = me
    addrs = np.zeros(n, np.int64)
    comm.all_gather(addrs, np.array([seg.ctypes.data], np.int64))
    comm.all_gather(np.empty(n * GATHER, np.uint8), seg[:GATHER])   # jit: the first use maps it
    for p in range(n):                            # every peer's segment mapped and read here
        v = stratacl.ub.view(int(addrs[p]), (base,), np.uint8)
        int(v[::4096].sum())
    comm.barrier()
    right = (me + 1) % n
    out = np.empty(n * GATHER, np.uint8)
    keep, rows = [], []
    # 1. one growth at a time (roa), as part B of benchmarks/registration.py: rank k % N grows by
    #    one chunk (its allocation of FRESH_BYTES, one chunk), the others sleep until their
    #    registration thread has mapped it; nothing else is in flight
    single = broadcast_rank(comm, iters, timeout, keep) if reg.mode == "roa" and n > 1 else []
    # 2. every rank grows at once, then uses its new chunk in an all_gather after a gap
    comm.barrier()
    reg.latencies.clear()
    for it in range(iters):
        m0 = stratacl.memory_stats()["num_device_alloc"]
        t0 = time.perf_counter_ns()
        x = stratacl.empty((chunk,), np.uint8)
        t_alloc = time.perf_counter_ns() - t0
        if stratacl.memory_stats()["num_device_alloc"] - m0 != 1:
            raise AssertionError(f"rank {me}: growth {it} did not map exactly one chunk")
        x[::4096] = me
        keep.append(x)
        allocated = time.perf_counter_ns()
        time.sleep(gap_ms / 1e3)
        comm.barrier()
        c0 = stratacl.stats()["registration"]
        interval = time.perf_counter_ns() - allocated
        comm.all_gather(out, x[:GATHER])
        c1 = stratacl.stats()["registration"]
        if not np.array_equal(out[::GATHER], np.arange(n, dtype=np.uint8)):
            raise AssertionError(f"rank {me}: wrong bytes in growth {it}")
        rows.append(dict(alloc_ns=t_alloc, interval_ns=interval, jit_ns=c1["registration_in_operator_ns"] - c0["registration_in_operator_ns"],
                         jit_maps=c1["registrations_in_operator"] - c0["registrations_in_operator"],
                         late_ns=c1["ready_wait_ns"] - c0["ready_wait_ns"], lates=c1["ready_waits"] - c0["ready_waits"]))
    comm.barrier()
    lat = [(o, r, m) for o, r, m in reg.latencies]
    # apart from the growth loop: touching pages holds the interpreter, which would delay this
    # rank's registration thread and so the roa figures
    size = base + (iters + iters // n + (1 if right < iters % n else 0)) * chunk if single else base + iters * chunk
    whole = [_whole_segment(rt, right, int(addrs[right]), size) for _ in range(WHOLE_REPEAT)] if n > 1 else []
    comm.barrier()
    return dict(rows=rows, latencies=lat, single=single, whole=whole)


def _whole_segment(rt, owner: int, va: int, size: int) -> dict:
    """Re-register ``owner``'s segment [va, va + size) here as one registration: unmap it, map
    it again run by run, and touch its pages (they fault in again); against touching them
    through the mapping as it was."""
    reg, window, fd = rt.reg, rt.window, rt.reg.hbm_fds[owner]
    g = reg.chunk
    table = reg._tables[owner]
    slot0 = reg._table_slot(owner, va)
    offsets = [int(table[slot0 + k]) - 1 for k in range(size // g)]
    view = window.view(va, size)
    t0 = time.perf_counter_ns()
    int(view[::4096].sum())                       # warm: the mapping as it is
    warm = time.perf_counter_ns() - t0
    t0 = time.perf_counter_ns()
    with reg.cond:                                # the same mappings, made again
        window.unmap(va, size)
        j = 0
        while j < len(offsets):
            e = j + 1
            while e < len(offsets) and offsets[e] == offsets[e - 1] + g:
                e += 1
            window.map(va + j * g, (e - j) * g, fd, offsets[j])
            j = e
    remap = time.perf_counter_ns() - t0
    t0 = time.perf_counter_ns()
    int(view[::4096].sum())
    refault = time.perf_counter_ns() - t0
    return dict(remap_ns=remap, refault_ns=refault, warm_touch_ns=warm, segment_bytes=size)


def _median(v) -> float:
    return float(np.median(v)) if len(v) else float("nan")


def summarise(ranks: list[dict], n: int) -> dict:
    rows = [r for rank in ranks for r in rank["rows"]]
    a = {k: np.array([r[k] for r in rows], dtype=np.float64) for k in rows[0]}
    out = dict(alloc_us=_median(a["alloc_ns"]) / 1e3, interval_ms=_median(a["interval_ns"]) / 1e6,
               jit_us=_median(a["jit_ns"]) / 1e3,
               jit_maps=float(np.mean(a["jit_maps"])), late_mean_us=float(np.mean(a["late_ns"])) / 1e3,
               late_frac=float(np.mean(a["lates"] > 0)))
    if n > 1:
        w = {k: np.array([r[k] for rank in ranks for r in rank["whole"]], dtype=np.float64) for k in ranks[0]["whole"][0]}
        per_peer = w["remap_ns"] + w["refault_ns"] - w["warm_touch_ns"]
        out.update(whole_us=_median(per_peer) * (n - 1) / 1e3, whole_remap_us=_median(w["remap_ns"]) / 1e3,
                   whole_refault_us=_median(w["refault_ns"] - w["warm_touch_ns"]) / 1e3,
                   segment_mib=_median(w["segment_bytes"]) / 2**20)
        for key, field in (("single", "single"), ("burst", "latencies")):
            # roa: the k-th record of owner o on every peer is o's k-th chunk (rings are FIFO)
            bcast = []
            for owner in range(n):
                seqs = [[rec for rec in r[field] if rec[0] == owner] for p, r in enumerate(ranks) if p != owner]
                for j in range(min(len(s) for s in seqs)):
                    bcast.append(max(s[j][2] for s in seqs))
            out[f"{key}_us"] = _median(bcast) / 1e3
            out[f"{key}_p90_us"] = float(np.percentile(bcast, 90)) / 1e3 if bcast else float("nan")
    return out


def _num(v: float) -> str:
    if v != v:
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="8,32")
    ap.add_argument("--base", default="32M", help="the segment every rank holds before growing (default 32M)")
    ap.add_argument("--iters", type=int, default=20, help="growths per rank (default 20)")
    ap.add_argument("--gap", type=float, default=5.0, help="ms between a growth and its first use (default 5)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--wait-quiet", type=float, default=0.0,
                    help="wait up to S seconds for a quiet host before each job, rerun disturbed jobs")
    args = ap.parse_args()
    host = _Host(args.wait_quiet)
    base = parse_size(args.base)
    model = FabricModel("cm384", "jit", eager_bytes=EAGER_BYTES)
    chunk = 2 * 1024 * 1024
    results = {}
    t_all = time.perf_counter()
    for n in (int(v) for v in args.ranks.split(",")):
        for mode in ("roa", "jit"):
            reps = []
            for rep in range(args.repeat):
                ranks = host.run(f"N={n} {mode} rep {rep}", lambda: stratacl.spawn(
                    grow_rank, n, args=(base, args.iters, args.gap), registration=mode, allocator="expandable",
                    chunk_size=chunk, hbm_size="1G", timeout=600))
                reps.append(summarise(ranks, n))
            results[n, mode] = reps

    def cell(n, mode, key):
        v = np.array([r[key] for r in results[n, mode]], dtype=np.float64)
        med = _num(float(np.median(v)))
        return med if len(v) == 1 else f"{med} [{_num(float(v.min()))}-{_num(float(v.max()))}]"

    print(f"#### C. Growth by one {chunk >> 20} MiB chunk: until every peer can use it, and on the first "
          f"use's critical path (us; median [range over {args.repeat} repetitions])\n")
    print("| N | roa, one growth at a time: chunk mapped on every peer (median / p90) | roa, all ranks at once: "
          "the same | allocation to first use (ms) | roa: critical path, mean per call | roa: calls with a late "
          "chunk (%) | jit: critical path per call | jit: maps per call | whole segment re-registered: per call "
          "(remap + refault, x N-1) | of which one peer's remap / refault | segment (MiB) | model cm384: jit "
          "chunk / whole segment, per call |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in sorted({k[0] for k in results}):
        seg = float(np.median([r["segment_mib"] for r in results[n, "roa"]])) * 2**20
        modeled = f"{_num(float(model.registration_us(n - 1, chunk)))} / {_num(float(model.registration_us(n - 1, seg)))}"
        lates = np.array([r["late_frac"] for r in results[n, "roa"]]) * 100
        print(f"| {n} | {cell(n, 'roa', 'single_us')} / {cell(n, 'roa', 'single_p90_us')} | "
              f"{cell(n, 'roa', 'burst_us')} / {cell(n, 'roa', 'burst_p90_us')} | {cell(n, 'roa', 'interval_ms')} | "
              f"{cell(n, 'roa', 'late_mean_us')} | {_num(float(np.median(lates)))} | {cell(n, 'jit', 'jit_us')} | "
              f"{cell(n, 'jit', 'jit_maps')} | {cell(n, 'roa', 'whole_us')} | "
              f"{cell(n, 'roa', 'whole_remap_us')} / {cell(n, 'roa', 'whole_refault_us')} | {seg / 2**20:.0f} | "
              f"{modeled} |")
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s; {host.summary()}", file=sys.stderr)


if __name__ == "__main__":
    main()
