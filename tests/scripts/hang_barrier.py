"""Rank STUCK (argv[1]) never reaches the barrier every other rank waits in."""
import sys
import threading

import stratacl
from _report import emit

stuck = int(sys.argv[1])
comm = stratacl.init()
emit(kind="started")
if comm.rank == stuck:
    threading.Event().wait()          # blocks forever without using the CPU
comm.barrier()
emit(kind="completed")
