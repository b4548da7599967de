"""Rank VICTIM (argv[1]) dies of a SIGKILL the launcher did not send, after one all_gather; with
argv[2] == "oom" it first bumps the OOM kill count in the fake /proc the launcher reads
(STRATACL_TEST_HOST_MEMORY/vmstat), as the kernel's OOM killer would. The others wait in a barrier."""
import os
import signal
import sys
from pathlib import Path

import numpy as np

import stratacl

victim, oom = int(sys.argv[1]), sys.argv[2:] == ["oom"]
comm = stratacl.init()
x = stratacl.empty((1 << 18,), np.float32)         # 1 MiB of HBM touched per rank
x[:] = comm.rank
out = stratacl.empty((x.size * comm.size,), np.float32)
comm.all_gather(out, x)
if comm.rank == victim:
    if oom:
        vmstat = Path(os.environ["STRATACL_TEST_HOST_MEMORY"], "vmstat")
        count = int(vmstat.read_text().split()[-1])
        vmstat.write_text(f"oom_kill {count + 1}\n")
    os.kill(os.getpid(), signal.SIGKILL)
comm.barrier()
