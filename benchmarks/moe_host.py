"""MoE dispatch and combine on this host: stratacl.ep against what a CPU user writes with mpi4py.

    python benchmarks/moe_host.py --repeat 3 -w 2 -i 5 -J docs/results/moe-host-2026-12-02.json   # docs/notebook/performance-2026-12-02.md's grid
    python benchmarks/moe_host.py --nranks 8 --tokens 128 --hidden 1024 -w 1 -i 3   # a quick look

Per cell (N ranks, tokens per rank, hidden, mode ht|ll) both sides run the same inputs and
the same loop, one after the other (the order alternates between repetitions):

    driver (this process)
      stratacl.spawn(strata_rank, N)                     ep.Buffer: dispatch, combine (clock off)
      mpirun ... python moe_host.py --mpi-rank SPEC OUT  MpiMoe below (stratacl.bench._peers launches
                                                          and ends it, Open MPI over vader)
      <- per rank: the per-iteration times of each call, and digests of the checked call's results
      -> table: median time per call, MPI / stratacl, whether both sides' bytes agreed on every rank

Inputs: x [T, H] float16 (in HBM on the stratacl side), E = 256 experts (a multiple of N), top-8,
``stratacl.ep.routing(T, E, 8, N, skew=0, seed + j)`` with a new routing j each iteration (four
cycled, made before timing: a real MoE layer routes anew every step), weights seeded per rank.
The expert outputs fed to combine are the dispatch's received rows. Before timing, one call of
each operation is checked: the digests of every result array, rank by rank, must be equal on
both sides (``check`` column; the rows past ``recv_count`` of the low-latency layout are
undefined and left out). Each iteration: barrier, time dispatch; barrier, time combine. A call's
time per iteration is the mean over ranks; a cell's time is the median over timed iterations,
then the median over ``--repeat`` runs.

The MPI side keeps its buffers across calls (grown as needed), as stratacl's caching allocator
keeps HBM blocks: after warm-up neither side page-faults on its communication buffers. Cells
whose memory (either side's estimate, ``footprint``) exceeds ``--memory-budget`` (60% of the
host's memory by default) are skipped and listed with the reason.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

EXPERTS, TOPK, ROUTINGS = 256, 8, 4
MODES, OPS = ("ht", "ll"), ("dispatch", "combine")
# per rank: interpreter, numpy, the library or MPI, its shared-memory segments
RANK_BASE = 80 << 20


# --- inputs, the same on both sides ----------------------------------------------------------
def inputs(n: int, rank: int, tokens: int, hidden: int, seed: int):
    """(x [T, H] float16, [(topk_idx, topk_weights)] * ROUTINGS) of ``rank``."""
    from stratacl.ep import routing
    rng = np.random.default_rng([seed, rank])
    x = rng.standard_normal((tokens, hidden), dtype=np.float32).astype(np.float16)
    counts = [tokens if q == rank else 0 for q in range(n)]   # every rank's routing draws from its own stream
    routes = []
    for j in range(ROUTINGS):
        idx = routing(counts, EXPERTS, TOPK, n, 0.0, seed + j)[rank]
        w = np.random.default_rng([seed + j, rank, 1]).random(idx.shape, dtype=np.float32)
        routes.append((idx, w))
    return x, routes


def digest(*arrays) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.reshape(-1).view(np.uint8))
    return h.hexdigest()


def ll_rows(recv_x: np.ndarray, recv_count: np.ndarray) -> list[np.ndarray]:
    return [recv_x[e, :int(c)] for e, c in enumerate(recv_count)]


def results_digest(mode: str, op: str, out) -> str:
    """One digest of a call's results (the defined part of the low-latency layout)."""
    if mode == "ht" and op == "dispatch":
        return digest(*out[:4])
    if mode == "ht":
        return digest(*out)
    if op == "dispatch":
        return digest(*ll_rows(out[0], out[1]), out[1])
    return digest(out)


def time_cell(barrier, calls: dict, ops: tuple, warmup: int, iters: int) -> tuple[dict, dict]:
    """Check once, warm up, time: (digest per op, seconds per timed iteration per op)."""
    check = {}
    d = calls["dispatch"](0)
    check["dispatch"] = results_digest(calls["mode"], "dispatch", d)
    c = calls["combine"](d)
    check["combine"] = results_digest(calls["mode"], "combine", c)
    del d, c
    times = {op: [] for op in ops}
    for it in range(warmup + iters):
        j = (it + 1) % ROUTINGS
        barrier()
        t0 = time.perf_counter()
        d = calls["dispatch"](j)
        t1 = time.perf_counter()
        if "combine" in ops:
            barrier()
            t2 = time.perf_counter()
            c = calls["combine"](d)
            t3 = time.perf_counter()
            del c
        if it >= warmup:
            if "dispatch" in ops:
                times["dispatch"].append(t1 - t0)
            if "combine" in ops:
                times["combine"].append(t3 - t2)
        del d
    barrier()
    return check, times


def cell_calls(api, x, routes: list, cell: dict) -> dict:
    """The calls ``time_cell`` times in ``cell``, on ``api``: an ``ep.Buffer`` or an ``MpiMoe``,
    which have the same four methods."""
    if cell["mode"] == "ht":
        return {"mode": "ht", "dispatch": lambda j: api.dispatch(x, routes[j][0], routes[j][1]),
                "combine": lambda d: api.combine(d[0], d[4])}
    state = {}

    def ll_dispatch(j):
        state["j"] = j
        return api.low_latency_dispatch(x, routes[j][0], cell["tokens"])

    return {"mode": "ll", "dispatch": ll_dispatch,
            "combine": lambda d: api.low_latency_combine(d[0], routes[state["j"]][0], routes[state["j"]][1], d[2])}


# --- the stratacl side ------------------------------------------------------------------------
def strata_rank(comm, cells: list[dict], ops: tuple, warmup: int, iters: int, seed: int) -> list[dict]:
    """Inside every stratacl rank: each cell of this N, checked then timed."""
    import stratacl
    from stratacl import ep
    buf = ep.Buffer(comm, EXPERTS)
    out = []
    for cell in cells:
        x0, routes = inputs(comm.size, comm.rank, cell["tokens"], cell["hidden"], seed)
        x = stratacl.empty(x0.shape, x0.dtype)
        x[...] = x0
        del x0
        calls = cell_calls(buf, x, routes, cell)
        comm.barrier()
        stratacl.ub.wait_registered()
        check, times = time_cell(comm.barrier, calls, ops, warmup, iters)
        out.append({"check": check, "times": times})
        del x, calls
        comm.barrier()
        stratacl.empty_cache()
    return out


# --- the MPI side: what a CPU user writes -----------------------------------------------------
class MpiMoe:
    """DeepEP's four calls over mpi4py: a count exchange (``Alltoall``), rows packed per
    destination with a numpy fancy index, ``Alltoallv`` of the rows and of their routing
    (expert ids and weights), and back. The same semantics and results as ``stratacl.ep``;
    buffers are kept across calls."""

    def __init__(self, comm, MPI, num_experts: int):
        self.comm, self.MPI = comm, MPI
        self.n, self.me = comm.Get_size(), comm.Get_rank()
        self.L = num_experts // self.n
        self._bufs: dict[str, np.ndarray] = {}
        self._types: dict[int, object] = {}

    def _buf(self, name: str, shape: tuple, dtype) -> np.ndarray:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        b = self._bufs.get(name)
        if b is None or b.nbytes < nbytes:
            self._bufs.pop(name, None)
            b = self._bufs[name] = np.empty(max(nbytes, 1), np.uint8)
        return b[:nbytes].view(dtype).reshape(shape)

    def _row(self, nbytes: int):
        t = self._types.get(nbytes)
        if t is None:
            t = self._types[nbytes] = self.MPI.BYTE.Create_contiguous(nbytes).Commit()
        return t

    def _counts(self, send_counts: np.ndarray):
        recv_counts = np.empty(self.n, np.int64)
        self.comm.Alltoall(send_counts, recv_counts)
        return np.cumsum(send_counts) - send_counts, recv_counts, np.cumsum(recv_counts) - recv_counts

    def dispatch(self, x, topk_idx, topk_weights):
        n, L, me = self.n, self.L, self.me
        t, h = x.shape
        k = topk_idx.shape[1]
        valid = topk_idx >= 0
        dest = np.zeros((t, n), dtype=bool)
        dest[np.nonzero(valid)[0], topk_idx[valid] // L] = True
        d_idx, t_idx = np.nonzero(dest.T)                 # per destination, tokens ascending
        send_counts = np.bincount(d_idx, minlength=n).astype(np.int64)
        sdispl, recv_counts, rdispl = self._counts(send_counts)
        received = int(recv_counts.sum())
        send = self._buf("send", (t_idx.size, h), x.dtype)
        np.take(x, t_idx, axis=0, out=send)
        meta = self._buf("meta_send", (t_idx.size, 2 * k), np.int32)
        meta[:, :k] = topk_idx[t_idx]
        meta[:, k:] = topk_weights[t_idx].view(np.int32)
        recv = self._buf("recv", (received, h), x.dtype)
        got = self._buf("meta_recv", (received, 2 * k), np.int32)
        row, word = self._row(h * x.itemsize), self._row(2 * k * 4)
        self.comm.Alltoallv([send, (send_counts, sdispl), row], [recv, (recv_counts, rdispl), row])
        self.comm.Alltoallv([meta, (send_counts, sdispl), word], [got, (recv_counts, rdispl), word])
        got_idx = got[:, :k].astype(np.int64)
        got_w = np.ascontiguousarray(got[:, k:]).view(np.float32)
        local = (got_idx >= me * L) & (got_idx < (me + 1) * L)
        recv_idx = np.where(local, got_idx - me * L, -1)
        recv_w = np.where(local, got_w, np.float32(0))
        per_expert = np.bincount(recv_idx[local], minlength=L).astype(np.int64)
        handle = (t, topk_idx, topk_weights, t_idx, send_counts, sdispl, recv_counts, rdispl)
        return recv, recv_idx, recv_w, per_expert, handle

    def combine(self, y, handle):
        t, topk_idx, topk_weights, t_idx, send_counts, sdispl, recv_counts, rdispl = handle
        h = y.shape[1]
        back = self._buf("send", (t_idx.size, h), y.dtype)
        row = self._row(h * y.itemsize)
        self.comm.Alltoallv([y, (recv_counts, rdispl), row], [back, (send_counts, sdispl), row])
        acc = np.zeros((t, h), dtype=np.float32)
        for d in range(self.n):
            a, b = int(sdispl[d]), int(sdispl[d] + send_counts[d])
            if b > a:
                acc[t_idx[a:b]] += back[a:b].astype(np.float32)
        weights = np.where(topk_idx >= 0, np.float32(0) + topk_weights, np.float32(0))
        return acc.astype(y.dtype), weights

    def low_latency_dispatch(self, x, topk_idx, max_tokens: int):
        n, L = self.n, self.L
        t, h = x.shape
        k = topk_idx.shape[1]
        flat = topk_idx.reshape(-1)
        pairs = np.flatnonzero(flat >= 0)                 # (token, k) with an expert
        dest = flat[pairs] // L
        order = np.argsort(dest, kind="stable")           # per destination, (token, k) ascending
        pairs = pairs[order]
        send_counts = np.bincount(dest, minlength=n).astype(np.int64)
        sdispl, recv_counts, rdispl = self._counts(send_counts)
        received = int(recv_counts.sum())
        send = self._buf("send", (pairs.size, h), x.dtype)
        np.take(x, pairs // k, axis=0, out=send)
        eid = self._buf("eid_send", (pairs.size,), np.int32)
        eid[...] = flat[pairs] % L
        recv = self._buf("recv", (received, h), x.dtype)
        got = self._buf("eid_recv", (received,), np.int32)
        row = self._row(h * x.itemsize)
        self.comm.Alltoallv([send, (send_counts, sdispl), row], [recv, (recv_counts, rdispl), row])
        self.comm.Alltoallv([eid, (send_counts, sdispl), self.MPI.INT32_T],
                            [got, (recv_counts, rdispl), self.MPI.INT32_T])
        # an expert's rows: sources ascending, each source's tokens ascending, packed from row 0
        e = got.astype(np.int64)
        by_expert = np.argsort(e, kind="stable")
        recv_count = np.bincount(e, minlength=L).astype(np.int64)
        slot = np.empty(received, np.int64)
        slot[by_expert] = np.arange(received) - np.repeat(np.cumsum(recv_count) - recv_count, recv_count)
        cap = n * max_tokens
        layout = self._buf("layout", (L, cap, h), x.dtype)
        dst = e * cap + slot
        layout.reshape(L * cap, h)[dst] = recv
        handle = (t, k, cap, pairs, dst, send_counts, sdispl, recv_counts, rdispl)
        return layout, recv_count, handle

    def low_latency_combine(self, y, topk_idx, topk_weights, handle):
        t, k, cap, pairs, dst, send_counts, sdispl, recv_counts, rdispl = handle
        h = y.shape[2]
        back_send = self._buf("recv", (dst.size, h), y.dtype)
        np.take(y.reshape(-1, h), dst, axis=0, out=back_send)
        back = self._buf("send", (pairs.size, h), y.dtype)
        row = self._row(h * y.itemsize)
        self.comm.Alltoallv([back_send, (recv_counts, rdispl), row], [back, (send_counts, sdispl), row])
        pos = np.full(t * k, -1, np.int64)
        pos[pairs] = np.arange(pairs.size)
        pos = pos.reshape(t, k)
        valid = topk_idx >= 0
        acc = np.zeros((t, h), dtype=np.float32)
        for j in range(k):
            m = valid[:, j]
            acc[m] += topk_weights[m, j, None] * back[pos[m, j]].astype(np.float32)
        return acc.astype(y.dtype)


def mpi_main(spec_path: str, out_path: str) -> int:
    """One MPI rank (under mpirun): every cell of the spec; rank 0 writes every rank's results."""
    from stratacl.bench._peer_rank import MpiBackend, die_with_parent
    die_with_parent()
    backend = MpiBackend()
    comm, MPI = backend.comm, backend.MPI
    with open(spec_path) as f:
        spec = json.load(f)
    try:
        moe = MpiMoe(comm, MPI, EXPERTS)
        out = []
        for cell in spec["cells"]:
            x, routes = inputs(comm.Get_size(), comm.Get_rank(), cell["tokens"], cell["hidden"], spec["seed"])
            calls = cell_calls(moe, x, routes, cell)
            check, times = time_cell(comm.Barrier, calls, tuple(spec["ops"]), spec["warmup"], spec["iters"])
            out.append({"check": check, "times": times})
            moe._bufs.clear()
            del x, calls
        every = comm.gather(out, root=0)
        if comm.Get_rank() == 0:
            with open(out_path + ".tmp", "w") as f:
                json.dump({"ranks": every}, f)
            os.replace(out_path + ".tmp", out_path)
        return 0
    except BaseException:
        import traceback
        sys.stderr.write(f"[mpi rank {comm.Get_rank()}] {traceback.format_exc()}")
        sys.stderr.flush()
        comm.Abort(1)
        return 1


# --- the driver -------------------------------------------------------------------------------
def dest_fraction(n: int) -> float:
    """Probability that a token (top-8 of 256, uniform) goes to a given rank."""
    L = EXPERTS // n
    miss = 1.0
    for i in range(TOPK):
        miss *= (EXPERTS - L - i) / (EXPERTS - i)
    return 1.0 - miss


def footprint(n: int, tokens: int, hidden: int, mode: str) -> dict:
    """Estimated peak bytes of the job (all ranks), per side, and the HBM a stratacl rank needs.

    High-throughput: each rank receives ~f * N * T rows (f = dest_fraction) and sends as many;
    low-latency: T * K rows each way. stratacl: x, the received rows, the combine's pulled rows
    (private), its float32 accumulator and output; MPI: x, packed and received rows (the
    combine's reuse them), the low-latency layout's touched rows, accumulator, output."""
    tr = tokens * hidden * 2
    row = hidden * 2
    rows = 1.1 * (dest_fraction(n) * n * tokens if mode == "ht" else tokens * TOPK)
    common = tr + 2 * tr + tr + 2 * tr            # x, accumulator, output, temporaries of the sum
    strata = common + 2 * rows * row
    mpi = common + (2 if mode == "ht" else 3) * rows * row
    hbm = tr * 2 + (rows * row if mode == "ht" else EXPERTS * tokens * row) + (64 << 20)
    return {"stratacl": n * (strata + RANK_BASE), "mpi": n * (mpi + RANK_BASE), "hbm_per_rank": hbm}


def mem_total() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def run_strata(n: int, cells: list[dict], a) -> list[list[dict]]:
    import stratacl
    hbm = max(4 << 30, 1 << math.ceil(math.log2(max(footprint(n, c["tokens"], c["hidden"], c["mode"])["hbm_per_rank"]
                                                    for c in cells))))
    return stratacl.spawn(strata_rank, n, args=(cells, tuple(a.ops), a.warmup, a.iters, a.seed),
                          hbm_size=hbm, timeout=600.0)


def run_mpi(n: int, cells: list[dict], a) -> list[list[dict]] | str:
    from stratacl.bench import _peers
    why = _peers.missing("mpi")
    if why is not None:
        return why
    with tempfile.TemporaryDirectory(prefix="stratacl-moe-") as tmp:
        spec, out = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec, "w") as f:
            json.dump({"cells": cells, "ops": a.ops, "warmup": a.warmup, "iters": a.iters, "seed": a.seed}, f)
        root = ("--allow-run-as-root",) if os.geteuid() == 0 else ()
        with _peers.sm_backing_directory() as sm:
            cmd = [_peers.mpirun(), *root, *_peers.MPIRUN_FLAGS, *sm, "-np", str(n),
                   sys.executable, os.path.abspath(__file__), "--mpi-rank", spec, out]
            o = _peers._run("mpi", [cmd], a.timeout)
        if o.timed_out:
            return f"mpi timed out after {o.seconds:.0f} s; last output: {_peers._last(o.tail)}"
        if o.first_failure is not None or not os.path.exists(out):
            return f"mpi failed (exit codes {o.codes}); last output: {_peers._last(o.tail)}"
        with open(out) as f:
            return json.load(f)["ranks"]


def per_call(ranks: list[list[dict]], i: int, op: str) -> dict:
    """Median over iterations of the mean (and the max) over ranks of cell i's ``op`` times (s)."""
    t = np.array([r[i]["times"][op] for r in ranks])           # [rank, iteration]
    return {"mean": float(np.median(t.mean(axis=0))), "max": float(np.median(t.max(axis=0)))}


def target(mode: str, tokens: int) -> float:
    return 2.0 if (mode == "ll" and tokens == 128) else 1.5


def git_commit() -> str:
    """The commit of the stratacl that runs (its checkout need not be this script's)."""
    import stratacl
    here = os.path.dirname(os.path.abspath(stratacl.__file__))
    try:
        rev = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v]


def _names(allowed: tuple):
    def parse(s: str) -> list[str]:
        out = [v for v in s.split(",") if v]
        bad = [v for v in out if v not in allowed]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}, got {s!r}")
        return out
    return parse


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nranks", type=_ints, default=[8, 32], help="comma separated (default 8,32)")
    ap.add_argument("--tokens", type=_ints, default=[128, 512, 4096], help="tokens per rank (default 128,512,4096)")
    ap.add_argument("--hidden", type=_ints, default=[1024, 7168], help="default 1024,7168")
    ap.add_argument("--modes", type=_names(MODES), default=list(MODES), help="ht, ll or both (default)")
    ap.add_argument("--ops", type=_names(OPS), default=list(OPS),
                    help="timed calls: dispatch, combine or both (default); combine needs a dispatch, untimed")
    ap.add_argument("-w", "--warmup", type=int, default=2, help="untimed iterations per cell, after the check")
    ap.add_argument("-i", "--iters", type=int, default=10, help="timed iterations per cell")
    ap.add_argument("--repeat", type=int, default=1, help="runs of both sides; the order alternates")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory-budget", type=float, default=0.6 * mem_total() / 2**30,
                    help="GiB; skip cells whose estimated footprint (either side's) exceeds it "
                         "(default: 60%% of the host's memory, the rest for everything else that runs)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per MPI job")
    ap.add_argument("-J", "--json", default=None)
    ap.add_argument("--mpi-rank", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.mpi_rank:
        return mpi_main(*a.mpi_rank)
    from stratacl.bench._command import host_facts

    budget = a.memory_budget * 2**30
    cells, skipped = [], []
    for n in a.nranks:
        if EXPERTS % n:
            ap.error(f"--nranks: {EXPERTS} experts do not divide over {n} ranks")
        for tokens in a.tokens:
            for hidden in a.hidden:
                for mode in a.modes:
                    cell = {"n": n, "tokens": tokens, "hidden": hidden, "mode": mode}
                    fp = footprint(n, tokens, hidden, mode)
                    need = max(fp["stratacl"], fp["mpi"])
                    if need > budget:
                        skipped.append({**cell, "reason": f"needs ~{need / 2**30:.1f} GiB (stratacl "
                                        f"{fp['stratacl'] / 2**30:.1f}, MPI {fp['mpi'] / 2**30:.1f}), budget "
                                        f"{budget / 2**30:.1f} GiB"})
                    else:
                        cells.append(cell)
    header = {"date": datetime.date.today().isoformat(), "commit": git_commit(), "host": host_facts(),
              "command": " ".join(["python", "benchmarks/moe_host.py", *(argv if argv is not None else sys.argv[1:])]),
              "experts": EXPERTS, "topk": TOPK, "dtype": "float16", "skew": 0.0, "seed": a.seed,
              "routings": ROUTINGS, "warmup": a.warmup, "iters": a.iters, "repeat": a.repeat,
              "ops": a.ops, "memory_budget_gib": budget / 2**30, "load": []}
    for s in skipped:
        print(f"# skipped N={s['n']} T={s['tokens']} H={s['hidden']} {s['mode']}: {s['reason']}", file=sys.stderr)
    runs: dict[tuple, dict] = {}
    for n in a.nranks:
        mine = [c for c in cells if c["n"] == n]
        if not mine:
            continue
        for rep in range(a.repeat):
            order = ("stratacl", "mpi") if rep % 2 == 0 else ("mpi", "stratacl")
            got = {}
            for side in order:
                print(f"moe_host: N={n} run {rep + 1}/{a.repeat}: {side} ({len(mine)} cells)", file=sys.stderr,
                      flush=True)
                t0 = time.monotonic()
                got[side] = run_strata(n, mine, a) if side == "stratacl" else run_mpi(n, mine, a)
                header["load"].append({"n": n, "run": rep, "side": side, "seconds": round(time.monotonic() - t0, 1),
                                       "loadavg_after": os.getloadavg()[0]})
            for i, cell in enumerate(mine):
                r = runs.setdefault((n, cell["tokens"], cell["hidden"], cell["mode"]), {"cell": cell, "runs": []})
                one = {"stratacl": {op: per_call(got["stratacl"], i, op) for op in a.ops}}
                if isinstance(got["mpi"], str):
                    one["mpi"] = got["mpi"]
                else:
                    one["mpi"] = {op: per_call(got["mpi"], i, op) for op in a.ops}
                    one["wrong_ranks"] = {op: [rank for rank in range(n)
                                               if got["stratacl"][rank][i]["check"][op] != got["mpi"][rank][i]["check"][op]]
                                          for op in OPS}
                r["runs"].append(one)
    rows = []
    for (n, tokens, hidden, mode), r in runs.items():
        for op in a.ops:
            ours = [u["stratacl"][op]["mean"] for u in r["runs"]]
            peer = [u["mpi"][op]["mean"] for u in r["runs"] if isinstance(u["mpi"], dict)]
            row = {"n": n, "tokens": tokens, "hidden": hidden, "mode": mode, "op": op,
                   "stratacl_ms": 1e3 * statistics.median(ours), "runs_stratacl_ms": [1e3 * v for v in ours],
                   "runs_stratacl_max_ms": [1e3 * u["stratacl"][op]["max"] for u in r["runs"]]}
            if peer:
                row.update(mpi_ms=1e3 * statistics.median(peer), runs_mpi_ms=[1e3 * v for v in peer],
                           runs_mpi_max_ms=[1e3 * u["mpi"][op]["max"] for u in r["runs"] if isinstance(u["mpi"], dict)])
                row["speedup"] = row["mpi_ms"] / row["stratacl_ms"]
                row["target"] = target(mode, tokens)
                row["holds"] = row["speedup"] >= row["target"]
                wrong = sorted({w for u in r["runs"] if "wrong_ranks" in u for w in u["wrong_ranks"][op]})
                row["wrong_ranks"] = wrong
            else:
                row["mpi"] = next(u["mpi"] for u in r["runs"] if isinstance(u["mpi"], str))
            rows.append(row)
    print(f"# stratacl.ep vs mpi4py (Open MPI, vader): E={EXPERTS}, top-{TOPK}, float16, skew 0, clock off, "
          f"HBM inputs; warmup {a.warmup}, iters {a.iters}, repeat {a.repeat}; commit {header['commit']}")
    print("# time per call: median over iterations of the mean over ranks, median over runs; "
          "speedup = MPI time / stratacl time")
    print("| N | tokens | hidden | mode | op | stratacl (ms) | MPI (ms) | speedup | target | holds | check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "mpi_ms" not in row:
            print(f"| {row['n']} | {row['tokens']} | {row['hidden']} | {row['mode']} | {row['op']} | "
                  f"{row['stratacl_ms']:.2f} | - | - | - | - | MPI not run: {row['mpi']} |")
            continue
        check = "equal" if not row["wrong_ranks"] else f"differs on ranks {row['wrong_ranks']}"
        print(f"| {row['n']} | {row['tokens']} | {row['hidden']} | {row['mode']} | {row['op']} | "
              f"{row['stratacl_ms']:.2f} | {row['mpi_ms']:.2f} | {row['speedup']:.2f} | {row['target']:.1f} | "
              f"{'yes' if row['holds'] else 'no'} | {check} |")
    for s in skipped:
        print(f"| {s['n']} | {s['tokens']} | {s['hidden']} | {s['mode']} | both | - | - | - | - | - | "
              f"skipped: {s['reason']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"header": header, "rows": rows, "skipped": skipped}, f, indent=1)
    return 1 if any(row.get("wrong_ranks") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
