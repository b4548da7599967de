"""What one benchmark rank does, whatever library it drives (StrataCL, mpi4py, gloo).

A ``Backend`` moves the bytes; everything else (sizes, data, timing, checking) is here, so the
three libraries run the identical sweep. Conventions are nccl-tests' (sizes, counts and bus
bandwidth: ``stratacl._sizes``, which estimate-only mode shares). Time is the per-iteration
average of each rank, averaged over ranks (nccl-tests' default); with ``Spec.rounds`` > 1, the
median of that over the rounds. ``sweep_alternating`` runs several backends (StrataCL's numpy
API and its torch backend) on the same ranks, in alternating order.

A backend with a modeled clock (``clock()``: this rank's modeled time in seconds, ``maximum``:
the largest value over ranks) also gets ``model_time_us``: the modeled time per iteration,
from the last rank's clock before the timed loop to the last rank's clock after it. One that
follows modeled time with sleeps (``late()``: calls so far that ended behind schedule) also gets
``late_calls``, summed over ranks, for the timed iterations.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Protocol

import numpy as np

from .._sizes import OPS as OPS
from .._sizes import Shape as Shape
from .._sizes import bus_factor as bus_factor
from .._sizes import shape as shape

REDUCE = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def copy_volume(op: str, n: int, size: int) -> float:
    """Bytes the whole job must at least copy for one call: what the host limit is held to."""
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) * size
    if op == "all_reduce":
        return 2 * (n - 1) * size
    if op == "broadcast":
        return (n - 1) * size
    if op == "sendrecv":
        return n * size
    return 0.0


def input_data(op: str, rank: int, n: int, sh: Shape, dtype: np.dtype, redop: str,
               start: int = 0, stop: int | None = None) -> np.ndarray:
    """Elements [start, stop) of a rank's input: small integers, exact in every dtype and for
    every reduction over up to 127 ranks, computable for any sub-range alone."""
    i = np.arange(start, sh.n_in if stop is None else stop, dtype=np.int64)
    if dtype.kind == "b":
        return ((i + rank) % 3 == 0).astype(dtype)
    if op in ("all_reduce", "reduce_scatter") and redop == "prod":
        return (1 + ((i + rank) % 7 == 0)).astype(dtype) if n <= 8 else np.ones(i.size, dtype)
    return ((i * 3 + rank * 5) % 7).astype(dtype)


def expected(op: str, rank: int, n: int, sh: Shape, dtype: np.dtype, redop: str, root: int) -> np.ndarray:
    """What this rank's output must hold; reductions accumulate peer by peer in rank order,
    so the check needs two buffers, not N."""
    def data(p, start=0, stop=None):
        return input_data(op, p, n, sh, dtype, redop, start, stop)
    if op == "all_gather":
        return np.concatenate([data(p) for p in range(n)])
    if op == "all_to_all":
        c = sh.count
        return np.concatenate([data(p, rank * c, (rank + 1) * c) for p in range(n)])
    if op == "broadcast":
        return data(root)
    if op == "sendrecv":
        return data((rank - 1) % n)
    start, stop = (rank * sh.count, (rank + 1) * sh.count) if op == "reduce_scatter" else (0, sh.n_in)
    acc = data(0, start, stop)
    for p in range(1, n):
        REDUCE[redop](acc, data(p, start, stop), out=acc)
    return acc


FILL_CHUNK = 1 << 20     # elements generated at a time: 32 ranks each holding a 128 MiB temporary exhaust the host


def fill_input(x: np.ndarray, op: str, rank: int, n: int, sh: Shape, dtype: np.dtype, redop: str) -> None:
    flat = x.reshape(-1)
    for start in range(0, sh.n_in, FILL_CHUNK):
        stop = min(sh.n_in, start + FILL_CHUNK)
        flat[start:stop] = input_data(op, rank, n, sh, dtype, redop, start, stop)


def count_wrong(got: np.ndarray, op: str, rank: int, n: int, sh: Shape, dtype: np.dtype, redop: str,
                root: int) -> int:
    """Elements of ``got`` that differ from the expected output; reductions are checked in
    chunks so that the reference never holds more than a chunk per peer."""
    if op not in ("all_reduce", "reduce_scatter"):
        return int(np.count_nonzero(got != expected(op, rank, n, sh, dtype, redop, root)))
    base = rank * sh.count if op == "reduce_scatter" else 0
    wrong = 0
    for start in range(0, got.size, FILL_CHUNK):
        stop = min(got.size, start + FILL_CHUNK)
        acc = input_data(op, 0, n, sh, dtype, redop, base + start, base + stop)
        for p in range(1, n):
            REDUCE[redop](acc, input_data(op, p, n, sh, dtype, redop, base + start, base + stop), out=acc)
        wrong += int(np.count_nonzero(got[start:stop] != acc))
    return wrong


def model_row(op: str, n: int, size: int, time_us: float) -> dict:
    """The modeled columns of a row: time, algbw and busbw under the same conventions."""
    algbw = size / time_us / 1e3 if time_us > 0 else 0.0
    return {"model_time_us": time_us, "model_algbw": algbw, "model_busbw": algbw * bus_factor(op, n)}


class Backend(Protocol):
    rank: int
    size: int
    name: str

    def alloc(self, count: int, dtype: np.dtype) -> np.ndarray: ...
    def call(self, op: str, out: np.ndarray | None, x: np.ndarray, redop: str,
             root: int) -> Callable[[], object]:
        """One sweep point's operation with its arguments bound: the loops then pay one call
        per iteration, as a C benchmark's do (the dispatch on ``op`` cost 15-20 us per barrier
        at N = 32, 16 ranks to a core)."""
    def barrier(self) -> None: ...
    def mean(self, value: float) -> float: ...
    def total(self, value: int) -> int: ...


@dataclasses.dataclass
class Spec:
    op: str
    sizes: list[int]
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    warmup: int = 2
    iters: int = 10
    check: int = 1
    warmup_seconds: float = 0.0     # then keep warming up (10 calls at a time) until this much wall time passed
    rounds: int = 1                 # timed rounds of ``iters`` calls per size; a row's time is their median


def sweep(backend: Backend, spec: Spec, progress=None) -> list[dict]:
    """Run the sweep on this rank; every rank gets the same rows back (times averaged over ranks)."""
    return sweep_alternating([backend], spec, progress=progress)[0]


def sweep_alternating(backends: list[Backend], spec: Spec, progress=None) -> list[list[dict]]:
    """The sweep through several backends on the same ranks (the same communicator underneath:
    StrataCL's numpy API and its torch.distributed backend), one list of rows per backend.

    Per size, every backend gets its own buffers, settle and warm-up; then ``spec.rounds``
    rounds each time every backend's ``spec.iters`` iterations, in alternating order (round 0 in the
    given order, round 1 reversed, ...), so that a slow moment of a shared host falls on all of
    them alike. A row's time is the median over rounds of the per-iteration time averaged over
    ranks (with one round: that time, as ``sweep`` always gave). Checks follow the rounds.
    """
    n, me = backends[0].size, backends[0].rank
    dtype = np.dtype(spec.dtype)
    root = spec.root if spec.op == "broadcast" else -1
    redop = spec.redop if spec.op in ("all_reduce", "reduce_scatter") else "none"
    rounds = max(spec.rounds, 1)
    rows: list[list[dict]] = [[] for _ in backends]
    seen = set()
    for size in spec.sizes:
        sh = shape(spec.op, n, size, dtype.itemsize)
        if sh.size in seen:
            continue
        seen.add(sh.size)
        points = []
        for backend in backends:
            x = backend.alloc(sh.n_in, dtype)
            out = backend.alloc(sh.n_out, dtype) if sh.n_out else None
            fill_input(x, spec.op, me, n, sh, dtype, redop)
            points.append((backend, x, out, backend.call(spec.op, out, x, redop, root)))
        for backend, _, _, run in points:
            settle = getattr(backend, "settle", None)       # let the new buffers' registration finish
            if settle is not None:
                settle()
            for _ in range(spec.warmup):
                run()
            if spec.warmup_seconds > 0:
                # the ranks agree on when to stop: the decision is a collective mean of elapsed time
                w0 = time.perf_counter()
                while backend.mean(time.perf_counter() - w0) < spec.warmup_seconds:
                    for _ in range(10):
                        run()
        times: list[list[float]] = [[] for _ in backends]
        marks: list[list[tuple]] = [[] for _ in backends]
        for r in range(rounds):
            order = list(range(len(points))) if r % 2 == 0 else list(reversed(range(len(points))))
            for i in order:
                backend, _, _, run = points[i]
                elapsed, mark = _timed(backend, run, spec.iters)
                times[i].append(backend.mean(elapsed))
                marks[i].append(mark)
        for i, (backend, x, out, run) in enumerate(points):
            wrong = 0
            if spec.check and spec.op != "barrier":
                for _ in range(spec.check):
                    fill_input(x, spec.op, me, n, sh, dtype, redop)
                    if out is not None:
                        out[...] = 0
                    run()
                    got = (x if out is None else out).reshape(-1)
                    wrong += count_wrong(got, spec.op, me, n, sh, dtype, redop, root)
            t = statistics.median(times[i])
            wrong = backend.total(wrong)
            algbw = sh.size / t / 1e9 if t > 0 else 0.0
            row = dict(op=spec.op, size=sh.size, count=sh.count, type=str(dtype), redop=redop, root=root,
                       time_us=t * 1e6, algbw=algbw, busbw=algbw * bus_factor(spec.op, n), wrong=wrong)
            if len(backends) > 1:
                row["api"] = backend.name
            if rounds > 1:
                row["round_times_us"] = [v * 1e6 for v in times[i]]
            m0, m1, l0, l1 = marks[i][-1]
            if m0 is not None:
                mt = (backend.maximum(m1) - backend.maximum(m0)) / max(spec.iters, 1)
                row.update(model_row(spec.op, n, sh.size, mt * 1e6))
            if l0 is not None:
                row["late_calls"] = backend.total(l1 - l0)
            cores = getattr(backend, "core_figures", None)     # a modeled clock: per-core figures of one call
            if cores is not None and m0 is not None:
                row.update(cores(spec.op, sh.n_in * dtype.itemsize, max(root, 0), dtype.itemsize))
            rows[i].append(row)
            if progress is not None and me == 0:
                progress(row)
        del points, x, out
    return rows


def _timed(backend: Backend, run: Callable[[], object], iters: int) -> tuple[float, tuple]:
    """This rank's time per iteration of ``iters`` calls of ``run``, between two barriers, and
    the backend's modeled clock and late-call count around them (None where it has none)."""
    clock = getattr(backend, "clock", None)
    late = getattr(backend, "late", None)       # throttled clock: calls that ended behind schedule so far
    backend.barrier()
    m0 = clock() if clock is not None else None
    l0 = late() if late is not None else None
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    elapsed = (time.perf_counter() - t0) / max(iters, 1)
    m1 = clock() if clock is not None else None
    l1 = late() if late is not None else None
    # ranks that are done wait here: the data check and the next size are work that, on
    # shared cores, would otherwise delay the ranks still in their last iterations (a
    # 1 MiB sendrecv ring at N = 8 whose early ranks went on: a last call of 2.5-8 ms
    # instead of about 0.2 ms)
    backend.barrier()
    return elapsed, (m0, m1, l0, l1)
