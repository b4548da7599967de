"""Rank BAD (argv[1]) raises ValueError('boom'); every other rank is then inside an all_gather."""
import sys

import numpy as np

import stratacl
from _report import emit, failure_record

bad = int(sys.argv[1])
comm = stratacl.init()
x = stratacl.empty((16,), np.float32)
x[:] = comm.rank
out = stratacl.empty((16 * comm.size,), np.float32)
comm.all_gather(out, x)               # a healthy collective first
if comm.rank == bad:
    raise ValueError("boom")
try:
    comm.all_gather(out, x)
except stratacl.PeerFailure as e:
    emit(**failure_record(e))
    raise
emit(kind="completed")
