"""Where the CPU of one torch.distributed call on backend "stratacl" goes, against the same call
through the numpy API, in the same ranks (the "why" of docs/notebook/performance-2026-12-02.md, "torch.distributed").

    python benchmarks/torch_call_cost.py -n 8 --size 64K
    python benchmarks/torch_call_cost.py -n 8 --size 1M --op all_gather

Every rank calls the operation on the same HBM tensors (``stratacl.torch.empty``) in blocks of
``--iters`` calls, torch and numpy alternating, ``--rounds`` blocks each. Per call it reports the
wall time and this thread's CPU time (``time.thread_time``), split three ways by wrapping, on
the torch side: torch's own part (``dist.<op>``'s Python, the C++ dispatch and the Work's
``wait``), the backend's Python (``ProcessGroupStrataCL``'s method, less the communicator call),
and the communicator's call itself, which the numpy side makes directly. Medians over rounds of
the mean over ranks. The wrappers add a little of their own to the backend's share.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import stratacl
from stratacl._config import parse_size

METHODS = {"all_reduce": ("allreduce", "all_reduce"), "all_gather": ("all_gather_single", "all_gather"),
           "reduce_scatter": ("reduce_scatter_single", "reduce_scatter"), "all_to_all": ("all_to_all_single", "all_to_all")}


def rank(comm, op: str, size: int, iters: int, rounds: int):
    import torch
    import torch.distributed as dist

    import stratacl.torch as st
    from stratacl.torch import _process_group as _backend, _tensors
    torch.set_num_threads(1)
    dist.init_process_group("stratacl")
    from stratacl._sizes import shape
    n = comm.size
    sh = shape(op, n, size, 4)           # the bench's (nccl-tests') meaning of the size
    x = st.empty(sh.n_in)
    x.fill_(1.0)
    out = st.empty(sh.n_out or sh.n_in)
    call = {"all_reduce": lambda: dist.all_reduce(x),
            "all_gather": lambda: dist.all_gather_single(out, x),
            "reduce_scatter": lambda: dist.reduce_scatter_single(out, x),
            "all_to_all": lambda: dist.all_to_all_single(out, x)}[op]
    xa, oa = _tensors.array(x), _tensors.array(out)
    numpy_call = {"all_reduce": lambda: comm.all_reduce(xa, "sum"), "all_gather": lambda: comm.all_gather(oa, xa),
                  "reduce_scatter": lambda: comm.reduce_scatter(oa, xa, "sum"),
                  "all_to_all": lambda: comm.all_to_all(oa, xa)}[op]
    method, comm_method = METHODS[op]
    acc = {"method": 0.0, "comm": 0.0}

    class Timed:
        """The group's communicator, timing the one operation's CPU."""
        def __init__(self, c):
            self._c = c

        def __getattr__(self, name):
            f = getattr(self._c, name)
            if name != comm_method:
                return f

            def timed(*a):
                p0 = time.thread_time()
                f(*a)
                acc["comm"] += time.thread_time() - p0
            return timed

    for g in _live_groups(_backend.ProcessGroupStrataCL):     # the world group's backend
        g.comm = Timed(g.comm)
    original = getattr(_backend.ProcessGroupStrataCL, method)

    def wrapped(self, *a, **k):
        p0 = time.thread_time()
        w = original(self, *a, **k)
        acc["method"] += time.thread_time() - p0
        return w
    setattr(_backend.ProcessGroupStrataCL, method, wrapped)

    def block(f):
        comm.barrier()
        acc["method"] = acc["comm"] = 0.0
        t0, p0 = time.perf_counter(), time.thread_time()
        for _ in range(iters):
            f()
        wall, cpu = (time.perf_counter() - t0) / iters, (time.thread_time() - p0) / iters
        comm.barrier()
        return wall, cpu, acc["method"] / iters, acc["comm"] / iters

    for _ in range(3):
        block(call), block(numpy_call)
    got = {"torch": [], "numpy": []}
    for r in range(rounds):
        for side in (("torch", "numpy") if r % 2 == 0 else ("numpy", "torch")):
            got[side].append(block(call if side == "torch" else numpy_call))
    mean = np.array([statistics.median(v[i] for v in got[s]) for s in ("torch", "numpy") for i in range(4)])
    comm.all_reduce(mean, "sum")
    dist.destroy_process_group()
    return (mean / n).tolist() if comm.rank == 0 else None


def _live_groups(cls):
    import gc
    return [o for o in gc.get_objects() if type(o) is cls]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="all_reduce", choices=sorted(METHODS))
    ap.add_argument("-n", "--nranks", type=int, default=8)
    ap.add_argument("--size", default="64K", help="the bench's size column (nccl-tests)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    tw, tc, tm, tcomm, nw, nc, _, ncomm = stratacl.spawn(rank, a.nranks, args=(a.op, parse_size(a.size), a.iters,
                                                                                a.rounds))[0]
    us = 1e6
    print(f"{a.op}, N = {a.nranks}, {a.size}: per call, mean over ranks, median of {a.rounds} rounds of {a.iters}")
    print("| side | wall (us) | CPU (us) | torch's part | backend's Python | communicator call |")
    print("|---|---|---|---|---|---|")
    print(f"| torch | {tw * us:.0f} | {tc * us:.1f} | {(tc - tm) * us:.1f} | {(tm - tcomm) * us:.1f} | {tcomm * us:.1f} |")
    print(f"| numpy | {nw * us:.0f} | {nc * us:.1f} | - | - | {nc * us:.1f} |")


if __name__ == "__main__":
    main()
