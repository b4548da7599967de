"""Every rank reports its identity and checks one all_gather: the launcher-basics script.

Run as a script or with ``-m rank_info``; extra arguments are echoed back so the test can check
that the rank's sys.argv is exactly what was given.
"""
import os
import sys

import numpy as np

import stratacl
from _report import emit

comm = stratacl.init()
x = stratacl.empty((8,), np.int64)
x[:] = comm.rank * 100 + np.arange(8)
out = stratacl.empty((8 * comm.size,), np.int64)
comm.all_gather(out, x)
expected = (np.arange(comm.size)[:, None] * 100 + np.arange(8)).reshape(-1)
emit(kind="info", comm_rank=comm.rank, comm_size=comm.size,
     env={k: os.environ.get(k) for k in ("STRATACL_RANK", "STRATACL_WORLD_SIZE", "RANK", "WORLD_SIZE",
                                          "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                          "STRATACL_JOB_ID")},
     argv=sys.argv[1:], gather_ok=bool(np.array_equal(out, expected)),
     session=os.getsid(0), group=os.getpgid(0), stdin_is_terminal=os.isatty(0))
# one write per line (print() writes the newline separately when output is unbuffered), so lines
# of ranks sharing the launcher's stdout do not run into each other
sys.stdout.write(f"stdout line from rank {comm.rank}\n")
sys.stdout.flush()
sys.stderr.write(f"stderr line from rank {comm.rank}\n")
sys.stderr.flush()
