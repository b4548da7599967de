"""Rank VICTIM (argv[1]) SIGKILLs itself between all_gathers; the others are inside the next one."""
import os
import signal
import sys

import numpy as np

import stratacl
from _report import emit, failure_record

victim = int(sys.argv[1])
comm = stratacl.init()
n = 1 << 14
x = stratacl.empty((n,), np.float32)
x[:] = comm.rank
out = stratacl.empty((n * comm.size,), np.float32)
for _ in range(3):
    comm.all_gather(out, x)
assert (out.reshape(comm.size, n) == np.arange(comm.size, dtype=np.float32)[:, None]).all()
if comm.rank == victim:
    emit(kind="dying")
    os.kill(os.getpid(), signal.SIGKILL)
try:
    comm.all_gather(out, x)
except stratacl.PeerFailure as e:
    emit(**failure_record(e))
    raise
emit(kind="completed")
