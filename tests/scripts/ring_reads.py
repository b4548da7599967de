"""Each ring collective (run with ``--algo ring``) a few times over emulated hosts, inputs new
at every call, and what this rank's host's carrier read for each call (stats()["bytes_carried"]
between barriers around it, which read nothing). One report per case per rank: the call's ring
steps (collectives/_slices.py, ``ring_<frontend>_step(me, n, *args, s)``), the bytes read a
call, whether every result was exact (tests/test_emulated_hosts.py compares the bytes with what
the steps pull from a left neighbour on the other host)."""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import emit  # noqa: E402

import stratacl  # noqa: E402

comm = stratacl.init()
n, me = comm.size, comm.rank
ranks = np.arange(n)[:, None]


def case(name: str, frontend: str, args: tuple, fill, run, exact) -> None:
    reads, good = [], True
    for t in range(3):
        fill(t)
        comm.barrier()
        before = stratacl.stats()["bytes_carried"]
        run()
        comm.barrier()
        reads.append(stratacl.stats()["bytes_carried"] - before)
        good = good and bool(exact(t))
    emit(case=name, frontend=frontend, args=list(args), reads=reads, exact=good)


x = stratacl.empty((1 << 16,), np.float32)
case("all_reduce", "all_reduce", (1 << 16, 4), lambda t: x.__setitem__(slice(None), np.arange(1 << 16) % 7 + me + t),
     lambda: comm.all_reduce(x), lambda t: (x == (np.arange(1 << 16) % 7 + t) * n + n * (n - 1) / 2).all())
part = stratacl.empty((3000,), np.float32)
whole = stratacl.empty((n * 3000,), np.float32)
case("all_gather", "all_gather", (12000,), lambda t: part.__setitem__(slice(None), np.arange(3000) + me + t),
     lambda: comm.all_gather(whole, part), lambda t: (whole.reshape(n, -1) == np.arange(3000) + ranks + t).all())
big = stratacl.empty((n * 2048,), np.float32)
own = stratacl.empty((2048,), np.float32)
case("reduce_scatter", "reduce_scatter", (n * 2048, 4),
     lambda t: big.__setitem__(slice(None), np.arange(n * 2048) % 5 + me + t), lambda: comm.reduce_scatter(own, big),
     lambda t: (own == (np.arange(me * 2048, (me + 1) * 2048) % 5 + t) * n + n * (n - 1) / 2).all())
stratacl.finalize()
