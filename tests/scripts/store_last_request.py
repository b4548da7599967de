"""Rank 0 ends its program as soon as its own last store request is answered, while the other
ranks' last requests are still to come: they must be served (rank 0's store lingers until the
other ranks have left).

    stratacl-launch -n 3 tests/scripts/store_last_request.py

Every rank sets its key, then waits for every rank's; rank 0 returns from its wait when the last
key is set and ends at once, while ranks 1 and 2 sleep 0.5 s first, then wait and read. Each
prints ``@@ {"rank": r, "got": ...}``.
"""
import json
import os
import time

import torch.distributed as dist

import stratacl.torch  # noqa: F401  (registers the backend and the job's store)

dist.init_process_group("stratacl")
rank, n = dist.get_rank(), dist.get_world_size()
store = dist.distributed_c10d._get_default_store()
store.set(f"done/{rank}", str(rank))
keys = [f"done/{r}" for r in range(n)]
if rank != 0:
    time.sleep(0.5)            # rank 0 has ended its program by now
store.wait(keys)
got = [store.get(k).decode() for k in keys]
os.write(1, ("@@ " + json.dumps({"rank": rank, "got": got}) + "\n").encode())
