"""Rank WHO (argv[1]) passes None to all_reduce: it rejects its arguments, its peers raise
CollectiveMismatch quoting it. It raises its own TypeError only once its peers have failed
(its barrier ends when they are gone), so every victim reports before the culprit."""
import sys

import numpy as np

import stratacl

who = int(sys.argv[1])
comm = stratacl.init()
x = stratacl.empty((16,), np.float32)
x[:] = 1
try:
    comm.all_reduce(None if comm.rank == who else x)
except TypeError as e:
    try:
        comm.barrier()
    except stratacl.StrataError:
        pass
    raise e
