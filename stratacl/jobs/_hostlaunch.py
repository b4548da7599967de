"""One host's launcher in a job over hosts (jobs/_hostjob.py): an MPI process, started by
mpirun, that runs this host's ranks as ``stratacl-launch`` runs a job, and its carrier.

    python -m stratacl.jobs._hostlaunch        (STRATACL_HOSTJOB: the job, from stratacl-launch)
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import time


def report(index: int, code: int) -> None:
    """This launcher's exit code, for stratacl-launch (the last line it writes: _hostjob.py's
    OUTCOME). Under ``--with-ft ulfm`` mpirun exits 0 when launchers die by a signal, so
    stratacl-launch counts a host without this line as failed."""
    from stratacl.jobs._hostjob import OUTCOME
    sys.stdout.flush()
    sys.stderr.write(f"{OUTCOME}{index} {code}\n")
    sys.stderr.flush()


def main() -> int:
    # a crash in MPI after a host was lost shows the Python frames too (Open MPI keeps a
    # handler that is already installed)
    faulthandler.enable()
    from mpi4py import MPI

    from stratacl._config import Config
    from stratacl.jobs._hostjob import HOSTJOB_ENV, HostPart
    from stratacl.jobs._outcome import format_failure
    from stratacl.jobs._supervisor import Job
    job = json.loads(os.environ.pop(HOSTJOB_ENV))
    comm = MPI.COMM_WORLD
    # a host whose launcher died makes MPI calls that involve it raise (MPI_ERR_PROC_FAILED,
    # with mpirun's --with-ft ulfm) rather than abort this launcher: its carrier names the lost
    # host to this host's ranks, and this launcher prints its block
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    ending = comm.Dup()                 # the hosts' last meeting, apart from the carriers' traffic
    part = HostPart(comm.rank, job["host_of"], comm, job["address"])
    target = tuple(job["target"])
    config = Config()
    # the job (its carrier's window over this host's segments) lives until every host is done:
    # another host's carrier may still read them
    run = Job(job["n"], config, target, handle_signals=True, part=part, job_id=job["job"], secret=job["secret"])
    outcome = run.run()
    if not outcome.ok:
        print(format_failure(outcome), file=sys.stderr, flush=True)
    # every host's launcher reports before any leaves: a launcher that exits with an error makes
    # mpirun end the others, which may not have printed their part yet. Bounded: a host whose
    # launcher is gone for good does not hold the others.
    req, end = ending.Ibarrier(), time.monotonic() + 2 * config.grace + 10
    try:
        while not req.Test() and time.monotonic() < end:
            time.sleep(0.01)
    except MPI.Exception:               # a host was lost: nobody to wait for there
        pass
    del run
    report(part.index, outcome.exit_code)
    if outcome.reason == "carrier" and outcome.carrier.startswith("HostLost: "):
        # a host was lost: its carrier thread may be stuck in a read from it, and MPI's finalize
        # would wait for it; nothing is left to tidy in MPI, so leave without it
        os._exit(outcome.exit_code)
    return outcome.exit_code


if __name__ == "__main__":
    # mpi4py finalizes MPI at exit (a barrier exchange a failed job left in flight does not hold
    # it); a non-zero code makes mpirun end the job and say which host's launcher failed first
    sys.exit(main())
