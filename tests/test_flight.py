"""The flight recorder: the launcher's root-cause block names what each rank was doing.

Every rank records its last calls in the control segment (runtime/services/_flight.py); when a job
fails the launcher reads them and says which ranks are behind the others or in another
operation: a rank in a different collective, a rank that never arrived, a rank waiting on
another communicator, a rank waiting on its peer in a point-to-point call.
"""
from __future__ import annotations

import re

import pytest

from launch_helpers import launch, script

pytestmark = pytest.mark.timeout(120)


def _flight_block(case: str, timeout: str = "3") -> str:
    """The launcher's flight-recorder block for flight_cases.py CASE at N = 4 (the job fails)."""
    run = launch("-n", "4", "--timeout", timeout, "--grace", "1", script("flight_cases.py"), case, timeout=90)
    assert run.returncode == 1, run.explain()
    err = run.stderr
    assert "Flight recorder (each rank's newest call):" in err, run.explain()
    return err[err.index("Flight recorder"):]


def test_a_rank_in_a_different_collective_is_named():
    # the program's third call on the world (all_reduce, split, then this one): numbered as the
    # user counts, from 1 (init()'s own barrier is not one of them)
    run = launch("-n", "4", "--timeout", "30", "--grace", "1", script("flight_cases.py"), "mismatch", timeout=90)
    assert run.returncode == 1, run.explain()
    assert "CollectiveMismatch: broadcast: ranks disagree on the operation of call #3 on this communicator " \
           "(rank(s) [0, 1, 3]: all_reduce; rank(s) [2]: broadcast); no data was moved" in run.stderr, run.explain()
    block = run.stderr[run.stderr.index("Flight recorder"):]
    assert re.search(r"^  rank 2: broadcast \(call #3 on a communicator of 4, 1024 elements, root 0\): arrived ",
                     block, re.M), block
    assert re.search(r"^  rank 0: all_reduce \(call #3 on a communicator of 4", block, re.M), block
    assert ("  - rank(s) [2] entered broadcast as call #3 on the communicator of 4 ranks (world), "
            "where rank(s) [0, 1, 3] entered all_reduce") in block, block


@pytest.mark.slow
def test_a_rank_that_never_arrived_is_named_with_what_it_did_last():
    block = _flight_block("absent")
    for r in (0, 2, 3):
        assert re.search(rf"^  rank {r}: all_gather \(call #\d+ on a communicator of 4, 1024 elements\): entered ",
                         block, re.M), block
    # its newest call: the split (a collective on the world), completed
    assert re.search(r"^  rank 1: split \(call #\d+ on a communicator of 4, \d+ elements\): (arrived|departed) ",
                     block, re.M), block
    assert re.search(r"^  - rank 1 never entered all_gather, call #\d+ on the communicator of 4 ranks \(world\): "
                     r"its newest call is split #\d+ on this communicator", block, re.M), block


@pytest.mark.slow
def test_a_rank_waiting_on_another_communicator_is_named_there():
    block = _flight_block("elsewhere")
    assert re.search(r"^  rank 1: barrier \(call #1 on a communicator of 2 \[1, 3\], 0 elements\): entered ",
                     block, re.M), block
    assert re.search(r"^  - rank 1 never entered all_gather, call #\d+ on the communicator of 4 ranks \(world\): "
                     r"its newest call is barrier #1 on another communicator, entered$", block, re.M), block
    # on the half communicator its partner (rank 3, waiting in the world's all_gather) never came
    assert re.search(r"^  - rank 3 never entered barrier, call #1 on the communicator of 2 ranks \[1, 3\]: "
                     r"its newest call is all_gather #\d+ on another communicator, entered$", block, re.M), block


@pytest.mark.slow
def test_a_rank_waiting_on_its_peer_in_a_recv_is_named_with_what_the_peer_does():
    block = _flight_block("p2p")
    assert re.search(r"^  rank 0: recv from rank 3 #1 \(1024 elements\): entered ", block, re.M), block
    assert re.search(r"^  rank 3: split \(call #\d+ on a communicator of 4, \d+ elements\): (arrived|departed) ",
                     block, re.M), block
    assert re.search(r"^  - rank 0 waits in recv from rank 3 #1: rank 3's newest call is split #\d+, "
                     r"(arrived|departed)$", block, re.M), block


def _recorded(comm, half):
    """This rank's flight entries after point-to-point calls on the world and on ``half``."""
    import numpy as np

    import stratacl
    from stratacl.runtime.services import _flight

    x = stratacl.empty((256,), np.float32)
    y = stratacl.empty_like(x)
    peer = comm.size - 1 - comm.rank
    x[:] = comm.rank
    for _ in range(3):                   # the first through Python, then prepared (native replay)
        comm.sendrecv(x, peer, y, peer)
    if comm.rank == 0:
        comm.send(x, 1)
    elif comm.rank == 1:
        comm.recv(y, 0)
    hp = half.size - 1 - half.rank
    half.sendrecv(x, hp, y, hp)
    rt = comm._rt
    return [(e.op, e.state, e.dst, e.src, e.call, e.recv_call, e.count, e.members)
            for e in _flight.read(rt.ctl, rt.rank) if e.p2p]


def _run_recorded(comm):
    half = comm.split(color=comm.rank % 2, key=comm.rank)
    return _recorded(comm, half)


def test_point_to_point_calls_are_recorded_with_their_peers_as_world_ranks():
    import stratacl

    got = stratacl.spawn(_run_recorded, 4)
    for rank, entries in enumerate(got):
        peer = 3 - rank
        world = tuple(range(4))
        want = [("sendrecv", "departed", peer, peer, i, i, 256, world) for i in (1, 2, 3)]
        if rank == 0:
            want.append(("send", "departed", 1, None, 2 if peer == 1 else 1, 0, 256, world))
        elif rank == 1:
            want.append(("recv", "departed", None, 0, 0, 2 if peer == 0 else 1, 256, world))
        half = (rank % 2, rank % 2 + 2)             # split by parity: world ranks [0, 2] and [1, 3]
        hpeer = half[1] if rank == half[0] else half[0]
        want.append(("sendrecv", "departed", hpeer, hpeer, 1, 1, 256, half))
        assert entries == want, (rank, entries)
