"""A few cells of the fault matrix (benchmarks/faults.py, which docs/reliability.md records whole):
one of each fault, in different phases, at N = 4. A cell holds when every survivor raises
PeerFailure or CommTimeout naming the failed rank (or the daemon) and the operation within the
bound, the launcher exits non-zero naming the root cause, and no shm name, semaphore or
process of the job is left.

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

FAULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "faults.py"
CELLS = "raise:all_gather,kill:dispatch,hang:barrier,daemon:all_reduce,launcher:split,kill:registration"
DEATH_TIMEOUT = 20.0        # faults.py's --timeout for a death cell (DEFAULT_TIMEOUT): a death must not need it
HANG_SLACK = 30.0           # seconds past a hang cell's timeout (3 s) for every survivor to raise


@pytest.mark.timeout(240)
def test_one_cell_of_each_fault_holds(tmp_path):
    out = tmp_path / "rows.json"
    run = subprocess.run([sys.executable, str(FAULTS), "--ranks", "4", "--cells", CELLS, "--json", str(out),
                          "--death-bound", str(DEATH_TIMEOUT), "--hang-slack", str(HANG_SLACK)],
                         capture_output=True, text=True, timeout=220)
    rows = json.loads(out.read_text())
    assert [(r["fault"], r["phase"]) for r in rows] == [tuple(c.split(":")) for c in CELLS.split(",")]
    for r in rows:
        assert r["held"], (r, run.stdout[-3000:], run.stderr[-3000:])
    assert run.returncode == 0
    hang = next(r for r in rows if r["fault"] == "hang")
    assert hang["classes"] == ["CommTimeout"] and hang["operations"] == ["barrier"]
    kill = next(r for r in rows if r["fault"] == "kill" and r["phase"] == "dispatch")
    assert kill["classes"] == ["PeerFailure"] and kill["detect_s"] < DEATH_TIMEOUT
