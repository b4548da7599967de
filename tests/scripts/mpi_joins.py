"""An mpi4py-style program that joins a StrataCL job: started by mpirun, it calls
``stratacl.init()`` (which reads Open MPI's OMPI_COMM_WORLD_* variables) and runs collectives,
each checked exactly on every rank; MPI itself is used beside it for a cross-check.

    mpirun -n 4 python tests/scripts/mpi_joins.py

Each rank prints ``@@ {"rank": r, "mpi_rank": r, "size": n, "bad": [...]}``; exit 1 if anything differs.
"""
import json
import os

import numpy as np
from mpi4py import MPI

import stratacl


def main() -> None:
    mpi = MPI.COMM_WORLD
    comm = stratacl.init()
    me, n = comm.rank, comm.size
    bad = []

    def same(name, got, want):
        if not np.array_equal(got, want):
            bad.append(f"{name}: {np.asarray(got).ravel()[:8].tolist()} != {np.asarray(want).ravel()[:8].tolist()}")

    if (me, n) != (mpi.Get_rank(), mpi.Get_size()):
        bad.append(f"rank {me} of {n}, but MPI says {mpi.Get_rank()} of {mpi.Get_size()}")
    x = stratacl.empty((1024,), dtype=np.float32)
    x[:] = np.arange(1024, dtype=np.float32) + me
    comm.all_reduce(x)
    same("all_reduce", x, np.arange(1024, dtype=np.float32) * n + n * (n - 1) // 2)
    out = stratacl.empty((n, 100), dtype=np.int64)
    y = stratacl.empty((100,), dtype=np.int64)
    y[:] = np.arange(100) * 10 + me
    comm.all_gather(out, y)
    same("all_gather", out, np.stack([np.arange(100) * 10 + r for r in range(n)]))
    b = stratacl.zeros((64,), dtype=np.float64)
    if me == n - 1:
        b[:] = np.linspace(0, 1, 64)
    comm.broadcast(b, root=n - 1)
    same("broadcast", b, np.linspace(0, 1, 64))
    # MPI agrees: its own reduction of what StrataCL gathered
    total = mpi.allreduce(int(out.sum()), op=MPI.SUM)
    same("MPI cross-check", total, n * int(out.sum()))
    comm.barrier()
    os.write(1, ("@@ " + json.dumps({"rank": me, "mpi_rank": mpi.Get_rank(), "size": n, "bad": bad}) + "\n").encode())   # one write: ranks share the pipe
    stratacl.finalize()
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
