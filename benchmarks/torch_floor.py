"""The floor of torch.distributed's own layer on this host: what a ``dist.<op>`` call costs when
the backend behind it does nothing, against the same call through the numpy API, in the same
ranks (docs/notebook/performance-2026-12-02.md, "torch.distributed", "Why the torch layer costs what it costs").

    python benchmarks/torch_floor.py -n 8
    python benchmarks/torch_floor.py -n 32 --sizes 64K --iters 30

Every rank runs, on the same HBM tensors (``stratacl.torch.empty``), blocks of ``--iters``
calls of these sides, in an order that rotates from round to round:

    numpy        the communicator's call (the numpy API)
    numpy+noop   the same call, then the same-shape ``dist.<op>`` on a group whose backend is
                 "noop" (benchmarks/_torch_noop.py: a C++ ``c10d::Backend`` that returns a
                 completed Work and touches nothing)
    numpy+fake   the same with torch's own "fake" backend (torch.testing._internal.distributed.
                 fake_pg; in torch 2.13 it copies input to output for all_gather,
                 reduce_scatter and all_to_all, so it is above the floor there)
    torch        ``dist.<op>`` on backend "stratacl" (what the bench's --api torch measures)
    numpy+direct the numpy call, then the "noop" backend's own method called from Python
                 (``backend.allreduce([x]).wait()``, ...): torch's ``dist.*`` Python and its
                 dispatcher skipped, the pybind call into the C++ backend kept
    numpy+spin   the numpy call, then ``--spin`` us of this thread's CPU spent in a loop (a control:
                 what that much CPU per call and rank, from any source, costs in wall time)
    noop         the "noop" call alone (no communication: its ratio is not a floor; its CPU is
                 torch's layer's, to set against numpy+noop's extra CPU)

So (numpy+noop) / numpy is the smallest torch / numpy ratio any backend could reach through
torch.distributed here: the communication a backend must do at least, plus torch's layer with
nothing behind it. Per side: wall time per call and this thread's CPU per call
(``time.thread_time``), each the mean over ranks, and on the numpy+ sides the CPU spent after
the numpy call (in the torch call or the spin); the ratio is taken per round against that
round's numpy block and the median over rounds is reported (the median wall and CPU too).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import stratacl
from stratacl._config import parse_size

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SIDES = ("numpy", "numpy+noop", "numpy+fake", "torch", "noop", "numpy+spin", "numpy+direct")


def rank(comm, ops, sizes, iters, rounds, warmup, spin_s):
    import torch
    import torch.distributed as dist

    import stratacl.torch as st
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
    from stratacl._sizes import shape
    from stratacl.torch import _tensors
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _torch_noop
    _torch_noop.register()
    torch.set_num_threads(1)
    dist.init_process_group("stratacl")
    groups = {"noop": dist.new_group(backend="noop"), "fake": dist.new_group(backend="fake")}
    n = comm.size
    load = [os.getloadavg()[0]]
    results = []
    for op in ops:
        for size in sizes:
            sh = shape(op, n, size, 4)
            x = st.empty(sh.n_in)
            x.fill_(1.0)
            out = st.empty(sh.n_out or sh.n_in)
            xa, oa = _tensors.array(x), _tensors.array(out)
            numpy_call = {"all_reduce": lambda: comm.all_reduce(xa, "sum"),
                          "all_gather": lambda: comm.all_gather(oa, xa),
                          "reduce_scatter": lambda: comm.reduce_scatter(oa, xa, "sum"),
                          "all_to_all": lambda: comm.all_to_all(oa, xa)}[op]

            def torch_call(g):
                return {"all_reduce": lambda: dist.all_reduce(x, group=g),
                        "all_gather": lambda: dist.all_gather_single(out, x, group=g),
                        "reduce_scatter": lambda: dist.reduce_scatter_single(out, x, group=g),
                        "all_to_all": lambda: dist.all_to_all_single(out, x, group=g)}[op]
            noop_call, fake_call = torch_call(groups["noop"]), torch_call(groups["fake"])
            be = groups["noop"]._get_backend(torch.device("cpu"))
            direct_call = {"all_reduce": lambda: be.allreduce([x]).wait(),
                           "all_gather": lambda: be._allgather_base(out, x).wait(),
                           "reduce_scatter": lambda: be._reduce_scatter_base(out, x).wait(),
                           "all_to_all": lambda: be.alltoall_base(out, x, [], []).wait()}[op]

            inner = [0.0]

            def both(t):
                def f():
                    numpy_call()
                    p0 = time.thread_time()
                    t()
                    inner[0] += time.thread_time() - p0
                return f

            def spin():
                end = time.thread_time() + spin_s
                while time.thread_time() < end:
                    pass
            calls = {"numpy": numpy_call, "numpy+noop": both(noop_call), "numpy+fake": both(fake_call),
                     "torch": torch_call(None), "noop": noop_call, "numpy+spin": both(spin),
                     "numpy+direct": both(direct_call)}

            def block(f):
                comm.barrier()
                inner[0] = 0.0
                t0, p0 = time.perf_counter(), time.thread_time()
                for _ in range(iters):
                    f()
                wall, cpu = (time.perf_counter() - t0) / iters, (time.thread_time() - p0) / iters
                comm.barrier()
                return wall, cpu, inner[0] / iters

            for _ in range(warmup):
                for s in SIDES:
                    block(calls[s])
            got = np.zeros((rounds, len(SIDES), 3))
            for r in range(rounds):
                order = SIDES[r % len(SIDES):] + SIDES[:r % len(SIDES)]
                for s in order:
                    got[r, SIDES.index(s)] = block(calls[s])
            comm.all_reduce(got, "sum")
            results.append((op, sh.size, (got / n).tolist()))
            x = out = xa = oa = calls = None      # the HBM blocks go before the next size
    load.append(os.getloadavg()[0])
    dist.destroy_process_group()
    return (results, load) if comm.rank == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nranks", type=int, default=8)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--sizes", default="64K,1M", help="the bench's size column (nccl-tests)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--spin", type=float, default=5.0, help="us of CPU per call on side numpy+spin")
    a = ap.parse_args()
    import _torch_noop
    _torch_noop.load()                   # build the extension once, before the ranks load it
    ops = a.ops.split(",")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    load0 = os.getloadavg()[0]
    results, load = stratacl.spawn(rank, a.nranks, args=(ops, sizes, a.iters, a.rounds, a.warmup,
                                                                     a.spin * 1e-6))[0]
    us = 1e6
    print(f"N = {a.nranks}, {a.rounds} rounds of {a.iters} calls, load average (1 min) "
          f"{load0:.1f} before, {load[0]:.1f} -> {load[1]:.1f} in the ranks")
    print("| op | size | side | wall (us) | CPU per rank (us) | of which after the numpy call | wall / numpy | "
          "CPU / numpy |")
    print("|---|---|---|---|---|---|---|---|")
    for op, size, got in results:
        g = np.array(got)                # rounds x sides x (wall, cpu)
        for i, s in enumerate(SIDES):
            rw = statistics.median(g[:, i, 0] / g[:, 0, 0])
            rc = statistics.median(g[:, i, 1] / g[:, 0, 1])
            after = f"{statistics.median(g[:, i, 2]) * us:.1f}" if s.startswith("numpy+") else "-"
            print(f"| {op} | {size // 1024} KiB | {s} | {statistics.median(g[:, i, 0]) * us:.0f} | "
                  f"{statistics.median(g[:, i, 1]) * us:.1f} | {after} | {rw:.2f} | {rc:.2f} |")


if __name__ == "__main__":
    main()
