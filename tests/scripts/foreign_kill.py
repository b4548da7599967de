"""A job started by another launcher whose rank 1 is killed (SIGKILL) in the middle of the job:
the survivors, waiting for it in a barrier, must raise PeerFailure naming it.

    python -m torch.distributed.run --standalone --nproc-per-node 3 tests/scripts/foreign_kill.py

With the argument ``exit0`` rank 1 ends with os._exit(0) instead, without finalize(): the same
failure to its peers. With ``stop-launcher`` (under mpirun) it first stops its launcher
(SIGSTOP; the test resumes it), so the survivors learn of the death from the host's daemon
while MPI cannot: they must still exit, not wait in MPI_Finalize for the dead rank.

Every survivor prints ``@@ {"rank": r, "pid": p, "error": "<type>: <message>"}`` and exits 3.

torchrun ends the other workers (SIGTERM, then SIGKILL 30 s later) at its first look at them
after the kill (--monitor-interval), which may come before a loaded host has let the survivors
see rank 1 go. With the argument ``hold`` the survivors ignore SIGTERM, and torchrun (on one
node or over nodes) waits for them to report and exit. Not under mpirun: there a survivor
that has reported does not always exit by itself (an open issue), and the launcher's SIGTERM
is what ends it.
"""
import json
import os
import signal
import sys

import numpy as np

import stratacl


def main() -> None:
    if sys.argv[1:] == ["hold"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    comm = stratacl.init()
    x = stratacl.empty((16,), dtype=np.float32)
    x[:] = 1
    comm.all_reduce(x)             # the job is up and exact before the kill
    if comm.rank == 1:
        if sys.argv[1:] == ["stop-launcher"]:
            os.kill(os.getppid(), signal.SIGSTOP)
        if sys.argv[1:] in (["exit0"], ["stop-launcher"]):
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.barrier()
    except stratacl.StrataError as e:
        os.write(1, ("@@ " + json.dumps({"rank": comm.rank, "pid": os.getpid(), "error": f"{type(e).__name__}: {e}"}) + "\n").encode())   # one write: ranks share the pipe
        raise SystemExit(3)
    raise SystemExit(f"rank {comm.rank}: the barrier completed without rank 1")


if __name__ == "__main__":
    main()
