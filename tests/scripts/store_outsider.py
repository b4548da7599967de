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

import torch
import torch.distributed as dist

import stratacl.torch  # noqa: F401

dist.init_process_group("stratacl")
me, n = dist.get_rank(), dist.get_world_size()
if me == 0:
    os.write(1, ("@@ " + json.dumps({"store": os.environ["STRATACL_STORE"],
                                     "master_port": int(os.environ["MASTER_PORT"])}) + "\n").encode())
    sys.stdin.readline()
dist.barrier()
bad = []
x = torch.arange(100, dtype=torch.float64) * (me + 1)
dist.all_reduce(x)
if not torch.equal(x, torch.arange(100, dtype=torch.float64) * (n * (n + 1) // 2)):
    bad.append(f"all_reduce: {x[:4].tolist()}")
g = dist.new_group(list(range(n)))          # agreed through the store, after the outsider
y = torch.tensor([float(me)])
dist.all_reduce(y, group=g)
if y.item() != n * (n - 1) / 2:
    bad.append(f"new_group all_reduce: {y.item()}")
os.write(1, ("@@ " + json.dumps({"rank": me, "bad": bad}) + "\n").encode())
dist.destroy_process_group()
raise SystemExit(1 if bad else 0)
