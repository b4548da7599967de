"""The flight recorder: the launcher's root-cause block names what each rank was doing.

Every rank records its last collective calls in the control segment (runtime/_flight.py); when
a job fails the launcher reads them and says which ranks are behind the others or in another
operation: a rank in a different collective, a rank that never arrived, a rank waiting on
another communicator.
"""
from __future__ import annotations

import re

import pytest

from launch_helpers import launch, script

pytestmark = pytest.mark.timeout(120)


def _flight_block(run) -> str:
    err = run.stderr
    assert "Flight recorder (each rank's newest collective call):" in err, run.explain()
    return err[err.index("Flight recorder"):]


def test_a_rank_in_a_different_collective_is_named():
    run = launch("-n", "4", "--timeout", "30", "--grace", "1", script("flight_cases.py"), "mismatch", timeout=90)
    assert run.returncode == 1, run.explain()
    block = _flight_block(run)
    assert re.search(r"^  rank 2: broadcast \(call #(\d+) on a communicator of 4, 1024 elements, root 0\): arrived ",
                     block, re.M), block
    call = re.search(r"^  rank 0: all_reduce \(call #(\d+) on a communicator of 4", block, re.M).group(1)
    assert (f"  - rank(s) [2] entered broadcast as call #{call} on the communicator of 4 ranks (world), "
            f"where rank(s) [0, 1, 3] entered all_reduce") in block, block


def test_a_rank_that_never_arrived_is_named_with_what_it_did_last():
    run = launch("-n", "4", "--timeout", "3", "--grace", "1", script("flight_cases.py"), "absent", timeout=90)
    assert run.returncode == 1, run.explain()
    block = _flight_block(run)
    for r in (0, 2, 3):
        assert re.search(rf"^  rank {r}: all_gather \(call #\d+ on a communicator of 4, 1024 elements\): entered ",
                         block, re.M), block
    # its newest call: the split (a collective on the world), completed
    assert re.search(r"^  rank 1: split \(call #\d+ on a communicator of 4, \d+ elements\): (arrived|departed) ",
                     block, re.M), block
    assert re.search(r"^  - rank 1 never entered all_gather, call #\d+ on the communicator of 4 ranks \(world\): "
                     r"its newest call is split #\d+ on this communicator", block, re.M), block


def test_a_rank_waiting_on_another_communicator_is_named_there():
    run = launch("-n", "4", "--timeout", "3", "--grace", "1", script("flight_cases.py"), "elsewhere", timeout=90)
    assert run.returncode == 1, run.explain()
    block = _flight_block(run)
    assert re.search(r"^  rank 1: barrier \(call #1 on a communicator of 2, 0 elements\): entered ", block, re.M), block
    assert re.search(r"^  - rank 1 never entered all_gather, call #\d+ on the communicator of 4 ranks \(world\): "
                     r"its newest call is barrier #1 on another communicator, entered$", block, re.M), block
    # on the half communicator its partner (rank 3, waiting in the world's all_gather) never came
    assert ("  - 1 of the 2 members of the communicator of rank(s) [1] made no call on it: it never entered "
            "barrier, call #1 there") in block, block
