"""Each rank prints one JSON line: how it was started (forked from the rank template or spawned),
its parent, and a draw of each random generator. Rank argv[1] (if given) then raises."""
import json
import os
import random
import sys

import numpy as np

import stratacl
import stratacl.jobs

comm = stratacl.init()
print(json.dumps({"rank": comm.rank, "forked_from": stratacl.jobs.forked_from, "ppid": os.getppid(),
                  "launcher": int(os.environ["STRATACL_LAUNCHER_PID"]), "random": random.random(),
                  "numpy": float(np.random.random())}), flush=True)
comm.barrier()
if len(sys.argv) > 1 and comm.rank == int(sys.argv[1]):
    raise ValueError("raised in a forked rank")
stratacl.finalize()
