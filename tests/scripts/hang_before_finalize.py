"""Rank STUCK (argv[1]) hangs after the job's last barrier, before finalize; the others finish."""
import sys
import threading

import stratacl
from _report import emit

stuck = int(sys.argv[1])
comm = stratacl.init()
comm.barrier()
emit(kind="started")
if comm.rank == stuck:
    threading.Event().wait()          # blocks forever without using the CPU; nothing waits on it
stratacl.finalize()
emit(kind="completed")
