"""Traces (``--trace DIR``) and their replay through the fabric model (``stratacl.ub.replay``).

A job run under ``--clock virtual`` records its calls; replaying the traces without ranks must
give every rank the modeled clock it had, and traces extrapolated from two smaller runs of an
SPMD program must give what a real run at the larger size gives.
"""
from __future__ import annotations

import numpy as np
import pytest

import stratacl
from stratacl import ub

pytestmark = pytest.mark.timeout(180)


def spmd_step(comm, steps: int) -> float:
    """An async all_reduce overlapping a kernel, an all_to_all (a block per peer, so its input
    grows with N), an all_gather and a kernel on 8 cores; what issue 24's workloads are made of."""
    n = comm.size
    x = stratacl.zeros((4096,), np.float32)
    a = stratacl.zeros((n * 256,), np.float32)
    b = stratacl.empty_like(a)
    y = stratacl.zeros((1024,), np.float32)
    g = stratacl.empty((n * 1024,), np.float32)
    for _ in range(steps):
        work = comm.all_reduce(x, async_op=True)
        comm.charge_compute(30.0 + 2.0 * n)
        comm.all_to_all(b, a)
        work.wait()
        comm.all_gather(g, y)
        comm.charge_compute(5.0, cores=8)
    comm.barrier()
    return comm.clock() * 1e6


def with_split(comm) -> float:
    half = comm.split(comm.rank % 2, comm.rank)
    x = stratacl.zeros((2048,), np.float32)
    work = half.all_reduce(x, async_op=True)
    comm.charge_compute(12.0)
    work.wait()
    comm.all_reduce(x)
    return comm.clock() * 1e6


def with_sendrecv(comm) -> None:
    x = stratacl.zeros((64,), np.float32)
    peer = (comm.rank + 1) % comm.size
    comm.sendrecv(x, peer, stratacl.empty_like(x), (comm.rank - 1) % comm.size)


def _record(tmp_path, fn, n, *args):
    out = tmp_path / f"n{n}"
    clocks = stratacl.spawn(fn, n, args=args, clock="virtual", trace=str(out), timeout=90)
    return ub.load_traces(str(out)), clocks


def test_replaying_a_jobs_traces_gives_every_rank_its_modeled_clock(tmp_path):
    traces, clocks = _record(tmp_path, spmd_step, 3, 2)
    r = ub.replay(traces)
    assert r.recorded_us is not None and r.calls > 0
    np.testing.assert_allclose(r.end_us, r.recorded_us, rtol=1e-12)
    # the ranks' clocks when the program returned are where the replay's last call ended, or earlier
    assert all(c <= e * (1 + 1e-12) for c, e in zip(clocks, r.end_us))
    assert r.time_us > 2 * (30.0 + 2.0 * 3)        # the kernels alone take that long


def test_sub_communicators_replay_with_their_members(tmp_path):
    traces, _ = _record(tmp_path, with_split, 4)
    r = ub.replay(traces)
    np.testing.assert_allclose(r.end_us, r.recorded_us, rtol=1e-12)
    with pytest.raises(stratacl.ub.ReplayError, match="sub-communicator"):
        ub.extrapolate(traces, _record(tmp_path, with_split, 6)[0], 8)


def test_traces_extrapolated_from_two_small_runs_match_a_real_larger_run(tmp_path):
    t2, _ = _record(tmp_path, spmd_step, 2, 2)
    t3, _ = _record(tmp_path, spmd_step, 3, 2)
    t5, _ = _record(tmp_path, spmd_step, 5, 2)
    real = ub.replay(t5)
    guess = ub.replay(ub.extrapolate(t2, t3, 5))
    assert guess.recorded_us is None
    assert guess.time_us == pytest.approx(real.recorded_us.max(), rel=1e-9)
    # and a size no run had: the model is consulted, nothing was recorded there
    assert ub.replay(ub.extrapolate(t2, t3, 64)).time_us > real.time_us


def test_what_does_not_replay_says_why(tmp_path):
    traces, _ = _record(tmp_path, with_sendrecv, 2)
    with pytest.raises(stratacl.ub.ReplayError, match="point-to-point"):
        ub.replay(traces)
    with pytest.raises(stratacl.ub.ReplayError, match="no rank.*traces"):
        ub.load_traces(str(tmp_path / "nothing"))
    with pytest.raises(stratacl.ConfigError, match="needs --clock virtual"):
        stratacl.spawn(with_sendrecv, 2, trace=str(tmp_path / "off"), timeout=60)


def gap_program(comm) -> None:
    import time

    x = stratacl.zeros((1 << 16,), np.float32)       # its HBM is mapped here
    time.sleep(0.2)                                   # the program does something else meanwhile
    comm.all_reduce(x)
    comm.all_reduce(x)


def test_every_call_records_its_allocation_to_communication_gap(tmp_path):
    traces, _ = _record(tmp_path, gap_program, 2)
    for t in traces:
        reduces = [e for e in t["events"] if e["e"] == "call" and e["op"] == "all_reduce"]
        assert len(reduces) == 2, t["events"]
        assert 0.2 <= reduces[0]["gap_s"] <= reduces[1]["gap_s"] < 60, reduces
