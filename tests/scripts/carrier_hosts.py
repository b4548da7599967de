"""K carriers under mpirun (one per emulated host, 2 job ranks each): other hosts' HBM bytes
read into mirrors under passive-target locks, all hosts reading at once, fresh after the owners
rewrite them, and refused reads that leave the others unharmed. One report per host
(tests/test_carrier.py)."""
from __future__ import annotations

import mmap
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import emit  # noqa: E402

from stratacl.runtime.hosts._carrier import Carrier  # noqa: E402

HBM = 1 << 20
comm = MPI.COMM_WORLD
host, hosts = comm.rank, comm.size
host_of = [r // 2 for r in range(2 * hosts)]
mine = [r for r in range(2 * hosts) if host_of[r] == host]
others = [r for r in range(2 * hosts) if host_of[r] != host]


def pattern(r: int, salt: int) -> np.ndarray:
    return ((np.arange(HBM, dtype=np.int64) * (r + 3) + salt) % 251).astype(np.uint8)


segments = {r: mmap.mmap(-1, HBM) for r in mine}
mirrors = {r: mmap.mmap(-1, HBM) for r in others}
for r in mine:
    np.frombuffer(segments[r], np.uint8)[:] = pattern(r, 0)
carrier = Carrier(comm, HBM, host_of, segments, mirrors)
seen: dict[str, object] = {}
comm.Barrier()

wants = [(r, 4096 * r + 17, 70000) for r in others] + [(others[0], 5, 0)]


def mirrors_hold(salt: int) -> bool:
    good = True
    for r in others:
        m = np.frombuffer(mirrors[r], np.uint8)
        lo, hi = 4096 * r + 17, 4096 * r + 17 + 70000
        expect = pattern(r, salt)[lo:hi]
        # outside the wanted range the mirror keeps what it held (zeros: never read)
        good &= bool((m[lo:hi] == expect).all()) and not m[:lo].any() and not m[hi:].any()
    return good


seen["moved_first"] = carrier.read(wants) == 70000 * len(others)
comm.Barrier()
seen["first"] = mirrors_hold(0)

for r in mine:                                      # the owners write again; a barrier; read again
    np.frombuffer(segments[r], np.uint8)[:] = pattern(r, 7)
comm.Barrier()
carrier.read(wants)
seen["fresh"] = mirrors_hold(7)

bad = [(mine[0], 0, 10), (others[0], HBM - 5, 10)] if host == 0 else []
try:
    carrier.read(bad + wants)
    seen["refused"] = None
except ValueError as e:
    seen["refused"] = str(e)
seen["after"] = comm.allgather(b"ok") == [b"ok"] * hosts and mirrors_hold(7)
seen["moved"] = carrier.moved
carrier.close()
emit(rank=host, **seen)
