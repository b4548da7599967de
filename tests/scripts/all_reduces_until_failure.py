"""1 MiB all_reduces of the world communicator until one fails (bounded): a job whose ranks span
hosts and keep the carriers reading each other's segments while the test breaks the path
between them. Rank 0 says when the job is up (``@@ {"ready": ...}``); every rank reports how
its call failed, and exits 3.
"""
import json
import os
import time

import numpy as np

import stratacl

comm = stratacl.init()
x = stratacl.empty((1 << 18,), np.float32)
x[:] = 1
comm.all_reduce(x)
if comm.rank == 0:
    os.write(1, ("@@ " + json.dumps({"ready": True}) + "\n").encode())
end = time.monotonic() + 60
try:
    while time.monotonic() < end:
        comm.all_reduce(x)
except stratacl.StrataError as e:
    os.write(1, ("@@ " + json.dumps({"rank": comm.rank, "error": f"{type(e).__name__}: {e}"}) + "\n").encode())
    raise SystemExit(3)
raise SystemExit(f"rank {comm.rank}: no all_reduce failed in 60 s")
