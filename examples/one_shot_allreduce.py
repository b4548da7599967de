"""Your own operator on the fabric: a one-shot all_reduce written as a slice map.

    stratacl-launch -n 32 --clock virtual examples/one_shot_allreduce.py --bytes 65536,1048576

Every rank loads every peer's buffer and reduces it into its output, in rank order: one phase,
no intermediate barrier (``stratacl.fabric``, public API only). The library's own all_reduce
(full mesh: reduce-scatter, barrier, all-gather) runs beside it on the same buffers. Rank 0
prints, per size, both modeled times (``--clock virtual``; blank without a modeled clock) and
whether the one-shot's bytes equal the built-in's on every rank; the exit code says so too.
"""
import argparse
import sys

import numpy as np

import stratacl
from stratacl import fabric

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--bytes", default="65536,1048576", help="comma-separated buffer sizes")
p.add_argument("--path", default=None, help="mte, sdma or auto (default: the setting)")
args = p.parse_args()

comm = stratacl.init()
n, me = comm.size, comm.rank
modeled = stratacl.config.clock != "off"


def slowest(value: float) -> float:
    v = np.array([value], dtype=np.float64)
    comm.all_reduce(v, op="max")
    return float(v[0])


def modeled_us(call) -> float:
    """Modeled time of ``call`` from the last rank in to the last rank out, in microseconds."""
    comm.barrier()
    start = slowest(comm.clock()) if modeled else 0.0
    call()
    return (slowest(comm.clock()) - start) * 1e6 if modeled else float("nan")


rows, exact = [], True
for nbytes in (int(b) for b in args.bytes.split(",")):
    count = nbytes // 4
    x = stratacl.empty((count,), np.float32)
    x[...] = (np.arange(count, dtype=np.float32) % 97) * 0.25 + me
    out = stratacl.empty((count,), np.float32)
    smap = fabric.SliceMap()
    for peer in range(n):               # rank order: the built-in mesh's reduction order
        smap.reduce(peer, x.nbytes)
    one_shot = modeled_us(lambda: fabric.run(comm, smap, x, out, name="one_shot_all_reduce", path=args.path))
    ref = x.copy()
    mesh = modeled_us(lambda: comm.all_reduce(ref, path=args.path))
    same = np.array([out.tobytes() == ref.tobytes()], dtype=np.int64)
    comm.all_reduce(same, op="min")
    exact &= bool(same[0])
    rows.append((nbytes, one_shot, mesh, bool(same[0])))

if me == 0:
    print(f"one-shot all_reduce (stratacl.fabric) against the built-in, N = {n}, clock {stratacl.config.clock}")
    print(f"{'bytes':>10} {'one-shot us':>12} {'built-in us':>12} {'ratio':>7}  exact on every rank")
    for nbytes, a, b, same in rows:
        print(f"{nbytes:>10} {a:>12.1f} {b:>12.1f} {a / b if modeled else float('nan'):>7.2f}  {same}")
stratacl.finalize()
sys.exit(0 if exact else 1)
