"""Each collective a few times over emulated hosts, inputs new at every call, and what this
rank's host's carrier read for each call (stats()["bytes_carried"] between barriers around
it, which read nothing). One report per case per rank: the call's shape, the bytes read a
call, whether every result was exact (tests/test_emulated_hosts.py compares the bytes with
what the call's slice maps pull from the other host)."""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import emit  # noqa: E402

import stratacl  # noqa: E402

comm = stratacl.init()
n, me = comm.size, comm.rank
CALLS = 3
f32 = np.float32


def case(name: str, frontend: str, args: tuple, fill, run, exact) -> None:
    """``frontend``, ``args``: the slice map the call takes (collectives/_slices.py, called as
    frontend(me, n, *args)); fill(t) writes the inputs of call t, run() calls, exact(t) checks."""
    reads, good = [], True
    for t in range(CALLS):
        fill(t)
        comm.barrier()
        before = stratacl.stats()["bytes_carried"]
        run()
        comm.barrier()
        reads.append(stratacl.stats()["bytes_carried"] - before)
        good = good and bool(exact(t))
    emit(case=name, frontend=frontend, args=list(args), reads=reads, exact=good)


def value(p: int, t: int) -> float:          # what rank p's input holds in call t, besides the ramp
    return p + 100 * t


def ramp(count: int) -> np.ndarray:
    return np.arange(count, dtype=f32) % 11


def total(count: int, t: int) -> np.ndarray:
    return ramp(count) * n + sum(value(p, t) for p in range(n))


def all_reduce(count: int, frontend: str, args: tuple) -> None:
    x = stratacl.empty((count,), f32)
    case(f"all_reduce {count * 4} B", frontend, args, lambda t: x.__setitem__(slice(None), ramp(count) + value(me, t)),
         lambda: comm.all_reduce(x), lambda t: (x == total(count, t)).all())


all_reduce(64, "all_reduce_eager", (256,))                           # eager
all_reduce(4096, "all_reduce_eager_chunks", (4096, 4))               # eager, by chunks (n = 8: 128 KiB read)
all_reduce(1 << 16, "all_reduce", (1 << 16, 4))                      # reduce own chunk, gather the others

x = stratacl.empty((3000,), f32)
out = stratacl.empty((n * 3000,), f32)
ranks = np.arange(n)[:, None]
case("all_gather", "all_gather", (12000,), lambda t: x.__setitem__(slice(None), ramp(3000) + value(me, t)),
     lambda: comm.all_gather(out, x), lambda t: (out.reshape(n, -1) == ramp(3000) + value(ranks, t)).all())

big = stratacl.empty((n * 2048,), f32)
own = stratacl.empty((2048,), f32)
case("reduce_scatter", "reduce_scatter", (n * 2048, 4),
     lambda t: big.__setitem__(slice(None), ramp(n * 2048) + value(me, t)), lambda: comm.reduce_scatter(own, big),
     lambda t: (own == total(n * 2048, t).reshape(n, -1)[me]).all())

other = stratacl.empty((n * 2048,), f32)
case("all_to_all", "all_to_all", (n * 2048 * 4,),
     lambda t: big.__setitem__(slice(None), ramp(n * 2048) + value(me, t)), lambda: comm.all_to_all(other, big),
     lambda t: (other.reshape(n, -1) == ramp(n * 2048).reshape(n, -1)[me] + value(ranks, t)).all())

for root in (0, n - 1):
    y = stratacl.empty((5000,), f32)
    case(f"broadcast root {root}", "broadcast", (20000, root),
         lambda t: y.__setitem__(slice(None), ramp(5000) + value(me, t)), lambda root=root: comm.broadcast(y, root),
         lambda t, root=root: (y == ramp(5000) + value(root, t)).all())

root = n - 1
case("gather", "gather", (12000, root), lambda t: x.__setitem__(slice(None), ramp(3000) + value(me, t)),
     lambda: comm.gather(out if me == root else None, x, root),
     lambda t: me != root or (out.reshape(n, -1) == ramp(3000) + value(ranks, t)).all())
whole = stratacl.empty((n * 3000,), f32)
case("scatter", "scatter", (12000, 0), lambda t: whole.__setitem__(slice(None), ramp(n * 3000) + value(me, t)),
     lambda: comm.scatter(x, whole if me == 0 else None, 0),
     lambda t: (x == ramp(n * 3000)[me * 3000:(me + 1) * 3000] + value(0, t)).all())
red = stratacl.empty((3000,), f32)
case("reduce", "reduce", (12000, 0), lambda t: x.__setitem__(slice(None), ramp(3000) + value(me, t)),
     lambda: comm.reduce(red if me == 0 else None, x, "sum", 0), lambda t: me != 0 or (red == total(3000, t)).all())

sends = np.array([[(i + 2 * j) % 5 for j in range(n)] for i in range(n)]) * 100     # some pairs send nothing
at = np.cumsum(sends, axis=1) - sends


def exact_v(t: int) -> bool:
    want = np.concatenate([ramp(n * 2048)[at[p, me]:at[p, me] + sends[p, me]] + value(p, t) for p in range(n)])
    return bool((other[:want.size] == want).all())


case("all_to_all_v", "all_to_all_v", (sends.tolist(), sends.T.tolist(), 4),
     lambda t: big.__setitem__(slice(None), ramp(n * 2048) + value(me, t)),
     lambda: comm.all_to_all_v(other, big, sends[me], sends[:, me]), exact_v)
stratacl.finalize()
