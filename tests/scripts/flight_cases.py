"""A job that goes wrong in the way CASE (argv[1]) says, for the flight recorder to explain.

    mismatch      rank 2 calls broadcast where the others call all_reduce
    absent        rank 1 blocks (without using the CPU) before an all_gather the others wait in
    elsewhere     rank 1 waits in a barrier of its half of a split while the others wait in an
                  all_gather on the world (rank 3, its partner, is among them)
    p2p           rank 0 waits in a recv from rank 3, which blocks (without using the CPU); ranks
                  1 and 2 exchange with a sendrecv and finish
"""
import sys
import threading

import numpy as np

import stratacl
from _report import emit

case = sys.argv[1]
comm = stratacl.init()
emit(kind="started")
x = stratacl.empty((1024,), np.float32)
x[:] = comm.rank
comm.all_reduce(x)
half = comm.split(color=comm.rank % 2, key=comm.rank)
if case == "mismatch" and comm.rank == 2:
    comm.broadcast(x, root=0)
elif case == "mismatch":
    comm.all_reduce(x)
elif case == "absent" and comm.rank == 1:
    threading.Event().wait()
elif case == "elsewhere" and comm.rank == 1:
    half.barrier()
elif case == "p2p" and comm.rank == 0:
    comm.recv(x, 3)
elif case == "p2p" and comm.rank == 3:
    threading.Event().wait()
elif case == "p2p":
    comm.sendrecv(x, 3 - comm.rank, stratacl.empty_like(x), 3 - comm.rank)
else:
    comm.all_gather(stratacl.empty((comm.size * 1024,), np.float32), x)
emit(kind="completed")
