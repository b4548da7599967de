"""A first job: every rank fills an HBM buffer, then all_reduce and all_gather check the result.

    stratacl-launch -n 32 examples/allreduce.py
"""
import sys

import numpy as np

import stratacl

comm = stratacl.init()
n, me = comm.size, comm.rank
count = 1 << 18                                   # 1 MiB of float32 per rank

x = stratacl.empty((count,), np.float32)          # lives in this rank's HBM: zero copy
x[:] = me
comm.all_reduce(x, op="sum")
ok_reduce = bool((x == n * (n - 1) / 2).all())

part = stratacl.empty((1024,), np.int64)
part[:] = me
gathered = stratacl.empty((n * 1024,), np.int64)
comm.all_gather(gathered, part)
ok_gather = bool((gathered == np.repeat(np.arange(n), 1024)).all())

flags = np.array([ok_reduce and ok_gather], dtype=np.bool_)
comm.all_reduce(flags, op="min")                  # everyone agrees on the verdict
s = stratacl.stats()
if me == 0:
    print(f"{n} ranks on topology {comm.topology.name}: all_reduce and all_gather "
          f"{'correct on every rank' if flags[0] else 'WRONG'}; "
          f"rank 0 pulled {s['bytes_pulled']} bytes from peers, staged {s['bytes_staged']}")
stratacl.finalize()
sys.exit(0 if flags[0] else 1)
