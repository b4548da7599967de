"""A few cells of the fault matrix (benchmarks/faults.py, which docs/reliability.md records whole):
one of each fault, in different phases, at N = 4. A cell holds when every survivor raises
PeerFailure or CommTimeout naming the failed rank (or the daemon) and the operation within the
bound, the launcher exits non-zero naming the root cause, every survivor's HBM array made
before the phase has the checksum it had, and no shm name, semaphore or process of the job is
left. Then the in-call cells (a rank killing itself partway through a 64 MiB all_gather, a
dispatch and an async all_reduce, timed from its own progress), and a rank hung in finalize,
which the launcher names after its peers finished.

The bounds on detection are deadlines, not measurements (those are the fault matrix's, in
docs/reliability.md): a death must be reported before the communication timeout could have
fired (and as PeerFailure, which only the liveness check raises), a hang within the timeout
plus generous slack."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow      # the fault matrix: the jobs tier (docs/testing.md)

FAULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "faults.py"
CELLS = "raise:all_gather,kill:dispatch,hang:barrier,daemon:all_reduce,launcher:split,kill:registration"
DEATH_TIMEOUT = 20.0        # faults.py's --timeout for a death cell (DEFAULT_TIMEOUT): a death must not need it
HANG_SLACK = 30.0           # seconds past a hang cell's timeout (3 s) for every survivor to raise


IN_CALL = "kill-in-call:all_gather,kill-in-call:dispatch,kill-in-call:async,stop-in-call:async,hang:finalize"


def _run(tmp_path, cells: str) -> tuple[list[dict], subprocess.CompletedProcess]:
    out = tmp_path / "rows.json"
    run = subprocess.run([sys.executable, str(FAULTS), "--ranks", "4", "--cells", cells, "--json", str(out),
                          "--death-bound", str(DEATH_TIMEOUT), "--hang-slack", str(HANG_SLACK)],
                         capture_output=True, text=True, timeout=220)
    rows = json.loads(out.read_text())
    assert [(r["fault"], r["phase"]) for r in rows] == [tuple(c.split(":")) for c in cells.split(",")]
    return rows, run


def _found_by_timeout(row: dict) -> bool:
    """A hang is found by a survivor's timeout (CommTimeout). Survivors wait with the same
    timeout but do not start at the same instant: on a loaded host one times out and ends first,
    and a peer still waiting learns it as that rank's failure (PeerFailure), which the cell's
    "held" accepts only as a failure because of the hung rank (faults.py, names_peer)."""
    return "CommTimeout" in row["classes"] and set(row["classes"]) <= {"CommTimeout", "PeerFailure"}


@pytest.mark.timeout(240)
def test_one_cell_of_each_fault_holds(tmp_path):
    rows, run = _run(tmp_path, CELLS)
    for r in rows:
        assert r["held"], (r, run.stdout[-3000:], run.stderr[-3000:])
    assert run.returncode == 0
    hang = next(r for r in rows if r["fault"] == "hang")
    assert _found_by_timeout(hang) and hang["operations"] == ["barrier"]
    kill = next(r for r in rows if r["fault"] == "kill" and r["phase"] == "dispatch")
    assert kill["classes"] == ["PeerFailure"] and kill["detect_s"] < DEATH_TIMEOUT


@pytest.mark.timeout(240)
def test_faults_inside_a_call_and_a_hang_in_finalize_hold(tmp_path):
    rows, run = _run(tmp_path, IN_CALL)
    for r in rows:
        assert r["held"], (r, run.stdout[-3000:], run.stderr[-3000:])
    assert run.returncode == 0
    for r in rows[:4]:
        # the victim failed inside its call (not after it finished), each survivor named it
        # and the call, and the array each survivor made before the call kept its checksum
        assert r["raised"] == r["survivors"] == 3 and r["intact"] is True, r
        # the call's name, or the next call's (barrier) from survivors that completed the call
        # (a dispatch past its routing needs nothing more of the victim)
        call = "all_reduce" if r["phase"] == "async" else r["phase"]
        completed = any("completed the call" in note for note in r["notes"])
        assert r["operations"] and set(r["operations"]) <= ({call, "barrier"} if completed else {call}), r
        assert any("failed with its call" in note and "had finished" not in note for note in r["notes"]), r
    for r in rows[:3]:
        assert r["classes"] == ["PeerFailure"] and r["detect_s"] < DEATH_TIMEOUT, r
    assert _found_by_timeout(rows[3]), rows[3]
    # nothing waits on a rank hung in finalize: the launcher names it, long before the deadline
    final = rows[4]
    assert final["raised"] == 0 and final["root_cause"] and final["exit"] not in (0, 124), final
    assert final["ended_s"] < 3.0 + HANG_SLACK, final
