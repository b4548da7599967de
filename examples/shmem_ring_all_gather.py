"""A ring all-gather written with NVSHMEM-style one-sided calls, exact against the built-in one.

    stratacl-launch -n 8 --clock virtual examples/shmem_ring_all_gather.py [--count 16384]

Every rank owns chunk ``me`` of a symmetric output. In step s it forwards the chunk it got last
(its own at first) to its right neighbour with one ``put_signal``: the data, then a signal word
set to s; its left neighbour's chunk for the next step has arrived when ``wait_until`` sees the
word reach s. After N - 1 steps every rank holds every chunk; the output is compared bit for bit
with ``comm.all_gather`` (the library's full mesh), and rank 0 prints both modeled times (the
slowest rank's, from a barrier to the end of the call).
"""
import argparse
import sys

import numpy as np

import stratacl
from stratacl import shmem

parser = argparse.ArgumentParser()
parser.add_argument("--count", type=int, default=16384, help="float32 elements per rank (default 64 KiB)")
count = parser.parse_args().count

comm = stratacl.init()
n, me = comm.size, comm.rank
right, left = (me + 1) % n, (me - 1) % n
modeled = stratacl.config.clock != "off"

mine = (np.arange(count, dtype=np.float32) * 0.5 + me * 1000.25)
out = shmem.zeros((n, count), np.float32)           # symmetric: chunk p of every rank's output
arrived = shmem.signal_pad(1)[0:1]                  # the step my left neighbour has completed


def ring() -> None:
    out[me] = mine
    for step in range(1, n):
        chunk = (me - step + 1) % n                  # what I forward in this step
        shmem.put_signal(out[chunk], out[chunk], arrived, step, shmem.SIGNAL_SET, right)
        shmem.wait_until(arrived, shmem.CMP_GE, step)
    shmem.barrier_all()                              # nobody starts the next call while a peer still reads


def slowest(value: float) -> float:
    v = np.array([value])
    comm.all_reduce(v, op="max")
    return float(v[0])


def timed(call) -> float:
    comm.barrier()
    t0 = comm.clock() if modeled else 0.0
    call()
    t1 = comm.clock() if modeled else 0.0
    return slowest(t1) - slowest(t0) if modeled else 0.0


x = stratacl.empty(count, np.float32)
x[:] = mine
ref = stratacl.empty((n, count), np.float32)
comm.all_gather(ref.reshape(-1), x)                  # warm-up
t_mesh = timed(lambda: comm.all_gather(ref.reshape(-1), x))
t_ring = timed(ring)
ok = np.array([out.tobytes() == ref.tobytes()])
comm.all_reduce(ok, op="min")
if me == 0:
    print(f"shmem ring all-gather: {n} ranks, {count * 4 >> 10} KiB per rank (float32), topology "
          f"{comm.topology.name}, clock {stratacl.config.clock}")
    for name, t in (("comm.all_gather (full mesh)", t_mesh), ("put_signal ring", t_ring)):
        print(f"{name:<28} " + (f"modeled {t * 1e6:9.2f} us" if modeled else "modeled       -"))
    print(f"exact against comm.all_gather on every rank: {'yes' if ok[0] else 'NO'}")
stratacl.finalize()
sys.exit(0 if ok[0] else 1)
