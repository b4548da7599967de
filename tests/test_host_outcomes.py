"""How stratacl-launch learns how a job over hosts ended (stratacl/jobs/_hostjob.py): mpirun's
stderr relayed less each host launcher's outcome line, the job's exit code from both, and what
of the user's MPI settings an mpirun of carriers keeps. Pure functions; the jobs that use them
are in tests/test_emulated_hosts.py."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stratacl.jobs._hostjob import OUTCOME, job_exit_code
from stratacl.runtime.hosts import mpirun_env

RELAY = """
import os, sys, threading
from stratacl.jobs._hostjob import _relay_stderr
r, w = os.pipe()
outcomes = {}
t = threading.Thread(target=_relay_stderr, args=(r, outcomes, threading.Event()))
t.start()
for chunk in CHUNKS:
    os.write(w, chunk)
os.close(w)
t.join()
print(sorted(outcomes.items()))
"""


def _relay(chunks: list[bytes]) -> tuple[str, bytes]:
    run = subprocess.run([sys.executable, "-c", RELAY.replace("CHUNKS", repr(chunks))], capture_output=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.decode().strip(), run.stderr


def test_outcome_lines_are_kept_back_whole_and_everything_else_passes_in_order():
    mark = OUTCOME.encode()
    outcomes, err = _relay([b"hello\n" + mark[:5], mark[5:] + b"0 ", b"0\npartial", b" line\n" + mark + b"x y\n",
                            b"\0" + mark + b"1 3\n", b"trailing " + mark + b"2 0\n", b"end"])
    # split anywhere, after Open MPI's NUL, but never inside another line or unparsable
    assert outcomes == "[(0, 0), (1, 3)]"
    assert err == b"hello\npartial line\n" + mark + b"x y\ntrailing " + mark + b"2 0\nend"


def test_a_line_that_only_starts_like_an_outcome_is_passed_on_at_the_end():
    assert _relay([b"strat"]) == ("[]", b"strat")


def test_once_mpirun_ended_the_relay_stops_when_the_pipe_is_quiet_though_a_writer_holds_it():
    # a process mpirun left behind keeps the pipe's write end: no end of file comes
    import threading

    from stratacl.jobs._hostjob import _relay_stderr
    r, w = os.pipe()
    ended, outcomes = threading.Event(), {}
    relay = threading.Thread(target=_relay_stderr, args=(r, outcomes, ended), daemon=True)
    relay.start()
    os.write(w, OUTCOME.encode() + b"0 0\n")
    ended.set()
    relay.join(timeout=10)
    try:
        assert not relay.is_alive() and outcomes == {0: 0}
    finally:
        os.close(w)
        os.close(r)


@pytest.mark.parametrize("mpirun, outcomes, code", [
    (0, {0: 0, 1: 0}, 0),
    (0, {0: 0, 1: 3}, 3),             # a launcher's own failure, mpirun quiet about it
    (0, {0: 0}, 1),                   # host 1 died by a signal: mpirun under ulfm says 0
    (0, {}, 1),
    (5, {0: 0, 1: 0}, 5),             # mpirun's own failure stands
])
def test_the_job_exit_code_counts_a_host_that_did_not_report_as_failed(mpirun, outcomes, code, capsys):
    assert job_exit_code(mpirun, outcomes, 2) == code
    missing = [g for g in range(2) if g not in outcomes]
    err = capsys.readouterr().err
    if mpirun == 0 and missing:
        assert err == (f"stratacl-launch: the launcher of host(s) {', '.join(map(str, missing))} ended without "
                       f"reporting how (killed by a signal, or crashed): the job failed\n")
    else:
        assert err == ""


def test_an_mpirun_of_carriers_keeps_the_users_way_to_the_hosts_and_drops_the_job_it_runs_in():
    env = {"PATH": os.environ["PATH"], "OMPI_COMM_WORLD_RANK": "3", "PMIX_RANK": "3", "PRTE_MCA_ess_base_jobid": "9",
           "OMPI_MCA_pml": "ucx", "PRTE_MCA_plm_ssh_agent": "rsh", "PRTE_MCA_plm_ssh_args": "-p 2222",
           "OMPI_MCA_btl_tcp_if_include": "eth1", "PRTE_MCA_oob_tcp_if_exclude": "docker0",
           "STRATACL_TIMEOUT": "9", "PYTHONPATH": "x"}
    kept, flags = mpirun_env(env)
    assert sorted(kept) == ["OMPI_MCA_btl_tcp_if_include", "PATH", "PRTE_MCA_oob_tcp_if_exclude",
                            "PRTE_MCA_plm_ssh_agent", "PRTE_MCA_plm_ssh_args", "PYTHONPATH", "STRATACL_TIMEOUT"]
    assert flags == ["-x", "PYTHONPATH", "-x", "STRATACL_TIMEOUT"]
