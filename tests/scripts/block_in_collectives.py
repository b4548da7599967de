"""Every rank says 'ready <pid> <job id>' once, then stays inside collectives until it is ended."""
import os
import sys

import numpy as np

import stratacl

comm = stratacl.init()
x = stratacl.zeros((1024,), np.float32)
comm.barrier()
sys.stdout.write(f"ready {os.getpid()} {os.environ['STRATACL_JOB_ID']}\n")
sys.stdout.flush()
while True:
    comm.all_reduce(x)
