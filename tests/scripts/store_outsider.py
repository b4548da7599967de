"""A torch job under stratacl-launch that an outside process tries to join through its store.

    stratacl-launch -n 3 tests/scripts/store_outsider.py      (stdin: a pipe from the test)

Rank 0 prints the job's store address and MASTER_PORT (``@@ {"store": ..., "master_port": ...}``)
then reads one line from stdin: the test connects to the store meanwhile, as an outsider
without the secret, and writes the line when done. Then every rank runs collectives and checks
them exactly (``@@ {"rank": r, "bad": [...]}``).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import stratacl.torch  # noqa: F401,E402
from _report import torch_job_still_works  # noqa: E402

dist.init_process_group("stratacl")
me, n = dist.get_rank(), dist.get_world_size()
if me == 0:
    os.write(1, ("@@ " + json.dumps({"store": os.environ["STRATACL_STORE"],
                                     "master_port": int(os.environ["MASTER_PORT"])}) + "\n").encode())
    sys.stdin.readline()
dist.barrier()
bad = torch_job_still_works(dist, torch)      # the collectives and a new group, after the outsider
os.write(1, ("@@ " + json.dumps({"rank": me, "bad": bad}) + "\n").encode())
dist.destroy_process_group()
raise SystemExit(1 if bad else 0)
