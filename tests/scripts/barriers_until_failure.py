"""Barriers of the world communicator until one fails (bounded): a job whose ranks span hosts,
whose cross-host path the test breaks while the ranks wait. Rank 0 says when the job is up
(``@@ {"ready": ...}``); every rank reports how its barrier failed, and exits 3.
"""
import json
import os
import time

import stratacl

comm = stratacl.init()
end = time.monotonic() + 60
try:
    # the first barrier too: rank 0 leaves it (and says the job is up) before the ranks of
    # another host have learnt through their carrier that it completed
    comm.barrier()
    if comm.rank == 0:
        os.write(1, ("@@ " + json.dumps({"ready": True}) + "\n").encode())
    while time.monotonic() < end:
        comm.barrier()
except stratacl.StrataError as e:
    os.write(1, ("@@ " + json.dumps({"rank": comm.rank, "error": f"{type(e).__name__}: {e}"}) + "\n").encode())
    raise SystemExit(3)
raise SystemExit(f"rank {comm.rank}: no barrier failed in 60 s")
