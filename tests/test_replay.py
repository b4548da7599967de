"""Traces (``--trace DIR``) and their replay through the fabric model (``stratacl.ub.replay``).

A job run under ``--clock virtual`` records its calls; replaying the traces without ranks must
give every rank the modeled clock it had, and traces extrapolated from smaller runs of an SPMD
program (sub-communicators, shards that shrink as 1 / N, MoE calls with their routing drawn
anew) must give what a real run at the larger size gives.
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


def reads_its_clock(comm) -> list[float]:
    """``spmd_step``'s calls with the program reading its clock between them, as a serving loop
    times its iterations."""
    n = comm.size
    x = stratacl.zeros((4096,), np.float32)
    a = stratacl.zeros((n * 256,), np.float32)
    b = stratacl.empty_like(a)
    reads = [comm.clock() * 1e6]
    for _ in range(2):
        work = comm.all_reduce(x, async_op=True)
        comm.charge_compute(30.0 + 2.0 * n)
        reads.append(comm.clock() * 1e6)
        comm.all_to_all(b, a)
        work.wait()
        reads.append(comm.clock() * 1e6)
    return reads


def with_split(comm) -> float:
    half = comm.split(comm.rank % 2, comm.rank)
    x = stratacl.zeros((2048,), np.float32)
    work = half.all_reduce(x, async_op=True)
    comm.charge_compute(12.0)
    work.wait()
    comm.all_reduce(x)
    return comm.clock() * 1e6


def groups_and_shards(comm) -> float:
    """Tensor-parallel pairs (blocks of 2), FSDP-like strided groups whose all_gather shard
    shrinks as 1 / N, a kernel that grows with N: each number needs the a + bN + c/N fit."""
    n = comm.size
    tp = comm.split(comm.rank // 2, comm.rank)
    fsdp = comm.split(comm.rank % 2, comm.rank)
    shard = stratacl.zeros((3072 // n,), np.float32)
    full = stratacl.empty((fsdp.size * shard.size,), np.float32)
    x = stratacl.zeros((512,), np.float32)
    for _ in range(2):
        work = fsdp.all_gather(full, shard, async_op=True)
        comm.charge_compute(20.0 + 0.5 * n)
        work.wait()
        tp.all_reduce(x)
        comm.charge_compute(4.0, cores=12)
    comm.barrier()
    return comm.clock() * 1e6


def moe_step(comm) -> float:
    """Dispatch and combine (one async, overlapping a kernel) with ``ep.routing``'s draw j for
    the program's j-th dispatch: what ``ub.extrapolate`` draws anew with seed 0."""
    from stratacl import ep

    n, tokens, hidden = comm.size, 6, 32
    buf = ep.Buffer(comm, 2 * n)
    x = stratacl.zeros((tokens, hidden), np.float32)
    w = np.full((tokens, 3), 1 / 3, np.float32)
    for j in range(2):
        idx = ep.routing(tokens, 2 * n, 3, n, 0.0, j)[comm.rank]
        recv, _, _, per_expert, handle = buf.dispatch(x, idx, w)
        comm.charge_compute(1.0 + 0.25 * int(per_expert.sum()))      # the experts' rows: data-dependent
        work = buf.combine(recv, handle, async_op=True)
        comm.charge_compute(3.0)
        work.wait()
    comm.barrier()
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


def test_the_replay_gives_back_what_each_clock_read_returned(tmp_path):
    traces, reads = _record(tmp_path, reads_its_clock, 3)
    np.testing.assert_allclose(np.array(ub.replay(traces).clocks), np.array(reads), rtol=1e-12)
    # the reads keep their place through extrapolation: at 5 ranks, what a real 5-rank run read
    t2, _ = _record(tmp_path, reads_its_clock, 2)
    _, real = _record(tmp_path, reads_its_clock, 5)
    guess = ub.replay(ub.extrapolate(t2, traces, 5)).clocks
    assert len(guess) == 5 and all(len(g) == 5 for g in guess)
    np.testing.assert_allclose(np.array(guess), np.array(real), rtol=1e-9)


def overlapped_and_blocking(comm) -> list:
    """An asynchronous all_reduce beside a kernel, a blocking all_gather, a blocking one with
    ``path=`` of its own: under ``path=auto`` the first moves on SDMA, the others as asked."""
    x = stratacl.empty((4096,), np.float32)
    x[:] = comm.rank + 1
    work = comm.all_reduce(x, async_op=True)
    comm.charge_compute(20.0)
    work.wait()
    y = stratacl.empty((256,), np.int32)
    y[:] = comm.rank
    g = stratacl.empty((comm.size * 256,), np.int32)
    comm.all_gather(g, y)
    h = stratacl.empty_like(g)
    comm.all_gather(h, y, path="sdma")
    return [float(x[0]), g[::256].tolist(), h[::256].tolist()]


def test_path_auto_offloads_the_overlapped_calls_to_sdma(tmp_path):
    out = tmp_path / "auto"
    got = stratacl.spawn(overlapped_and_blocking, 3, clock="virtual", trace=str(out), path="auto", timeout=90)
    assert got == [[6.0, [0, 1, 2], [0, 1, 2]]] * 3
    for t in ub.load_traces(str(out)):
        assert t["settings"]["path"] == "mte"
        calls = [c for e in t["events"] for c in ([e] if e["e"] == "call" else e.get("calls", []))
                 if c["op"] != "barrier"]
        assert [(c["op"], c["path"]) for c in calls] == [("all_reduce", "sdma"), ("all_gather", "mte"),
                                                          ("all_gather", "sdma")], calls


@pytest.mark.slow
def test_sub_communicators_replay_with_their_members(tmp_path):
    traces, _ = _record(tmp_path, with_split, 4)
    r = ub.replay(traces)
    np.testing.assert_allclose(r.end_us, r.recorded_us, rtol=1e-12)
    # and extrapolate: the halves are groups of N / 2 ranks 2 apart at every N
    guess = ub.replay(ub.extrapolate(traces, _record(tmp_path, with_split, 6)[0], 8))
    real = ub.replay(_record(tmp_path, with_split, 8)[0])
    np.testing.assert_allclose(guess.end_us, real.recorded_us, rtol=1e-9)


@pytest.mark.slow
def test_groups_and_shrinking_shards_extrapolate_from_three_runs(tmp_path):
    t2, t4, t6 = (_record(tmp_path, groups_and_shards, n)[0] for n in (2, 4, 6))
    real = ub.replay(_record(tmp_path, groups_and_shards, 8)[0])
    np.testing.assert_allclose(ub.replay(ub.extrapolate(t2, t4, t6, 8)).end_us, real.recorded_us, rtol=1e-9)
    # two recordings fit a + bN only: the 1 / N shard is then wrong at 8
    two = ub.replay(ub.extrapolate(t4, t6, 8)).end_us
    assert not np.allclose(two, real.recorded_us, rtol=1e-6)


@pytest.mark.slow
def test_moe_calls_extrapolate_with_their_routing_drawn_anew(tmp_path):
    t2, t3 = (_record(tmp_path, moe_step, n)[0] for n in (2, 3))
    real, _ = _record(tmp_path, moe_step, 4)
    assert all("routing" in c for e in real[0]["events"] for c in ([e] if e["e"] == "call" else e.get("calls", []))
               if c.get("op", "").endswith(("dispatch", "combine")))
    with pytest.raises(ub.ReplayError, match="pass routing=stratacl.ep.routing"):
        ub.extrapolate(t2, t3, 4)        # the fabric package holds no routing generator of its own
    guess = ub.extrapolate(t2, t3, 4, routing=stratacl.ep.routing)
    # the draw is the program's own: the same traffic matrices as the real run, call by call
    for e, f in zip(guess[1]["events"], real[1]["events"]):
        for c, d in zip([e] if e["e"] == "call" else e.get("calls", []), [f] if f["e"] == "call" else f.get("calls", [])):
            if "phases" in d:
                assert [np.asarray(b).tolist() for b, _ in c["phases"]] == [np.asarray(b).tolist() for b, _ in d["phases"]]
    # the experts' kernels depend on the rows each rank got: at 4 ranks every rank keeps the
    # deviation rank r mod 3 had at N = 3, so only the mean of those kernels carries over
    r = ub.replay(guess)
    assert r.time_us == pytest.approx(ub.replay(real).time_us, rel=0.05)
    # at a size no run had, every call of the program is timed once, on all 64 ranks
    calls = [c for e in guess[0]["events"] for c in ([e] if e["e"] == "call" else e.get("calls", []))]
    assert ub.replay(ub.extrapolate(t2, t3, 64, routing=stratacl.ep.routing)).calls == len(calls)


def fetches_and_exchanges(comm) -> float:
    """Each rank fetches 2N rows from its host memory into an HBM cache (a call with itself
    alone), then an all_to_all: the fetch's bytes are numbers like any other."""
    n = comm.size
    cache = stratacl.empty((4 * n, 16), np.float32)
    host = np.ones((64, 16), np.float32)
    a = stratacl.zeros((n * 64,), np.float32)
    for _ in range(2):
        comm.host_rows(cache, host, np.arange(2 * n), np.arange(2 * n))
        comm.all_to_all(stratacl.empty_like(a), a)
    comm.barrier()
    return comm.clock() * 1e6


@pytest.mark.slow
def test_calls_of_a_rank_with_itself_extrapolate(tmp_path):
    t2, t3 = (_record(tmp_path, fetches_and_exchanges, n)[0] for n in (2, 3))
    real = ub.replay(_record(tmp_path, fetches_and_exchanges, 5)[0])
    np.testing.assert_allclose(ub.replay(ub.extrapolate(t2, t3, 5)).end_us, real.recorded_us, rtol=1e-9)


def rank_dependent(comm) -> None:
    x = stratacl.zeros((64,), np.float32)
    comm.all_reduce(x)
    if comm.rank == 0:
        comm.charge_compute(1.0)


def with_all_to_all_v(comm) -> None:
    n = comm.size
    x = stratacl.zeros((n,), np.float32)
    comm.all_to_all_v(stratacl.empty_like(x), x, [1] * n, [1] * n)


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


@pytest.mark.slow
def test_what_does_not_extrapolate_says_why(tmp_path):
    a, b = (_record(tmp_path, rank_dependent, n)[0] for n in (2, 3))
    with pytest.raises(stratacl.ub.ReplayError, match=r"not SPMD in shape .*; first at event 2: the end \(after 2 "
                       r"events\) against compute$"):
        ub.extrapolate(a, b, 8)
    a, b = (_record(tmp_path, with_all_to_all_v, n)[0] for n in (2, 3))
    with pytest.raises(stratacl.ub.ReplayError, match="no routing behind them"):
        ub.extrapolate(a, b, 8)
    with pytest.raises(stratacl.ub.ReplayError, match="increasing rank counts"):
        ub.extrapolate(b, a, 8)
    with pytest.raises(stratacl.ub.ReplayError, match="two or three recordings"):
        ub.extrapolate(a, 8)


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


def test_a_blocking_operation_queued_behind_another_is_recorded_as_the_call_it_is_inline():
    """stratacl.torch queues a blocking operation behind an unfinished asynchronous one and runs
    it inline otherwise (host timing): both are recorded as one "call", so recordings of one
    program have one shape; an asynchronous issue, or a blocking one not joined at once, stays."""
    import types

    from stratacl.runtime.services import Trace

    def work():
        return types.SimpleNamespace()

    call = {"op": "all_to_all", "comm": 0, "k": 3}
    t = Trace(0, 2, {})
    first, queued, later = work(), work(), work()
    t.issue(first, True)
    t.call(first, {"op": "all_reduce"})
    t.issue(queued, False)
    t.call(queued, call)
    t.wait(queued)
    t.compute(1.0, 24)
    t.wait(first)
    t.issue(later, True)
    t.call(later, {"op": "all_reduce"})
    t.wait(later)
    assert t.events == [{"e": "issue", "id": 1, "async": True, "calls": [{"op": "all_reduce"}]},
                        {"e": "call", **call}, {"e": "compute", "us": 1.0, "cores": 24}, {"e": "wait", "id": 1},
                        {"e": "issue", "id": 2, "async": True, "calls": [{"op": "all_reduce"}]}, {"e": "wait", "id": 2}]
    kept = Trace(0, 2, {})
    late = work()
    kept.issue(late, False)
    kept.call(late, call)
    kept.compute(1.0, 24)
    kept.wait(late)
    assert kept.events == [{"e": "issue", "id": 1, "async": False, "calls": [call]},
                           {"e": "compute", "us": 1.0, "cores": 24}, {"e": "wait", "id": 1}]


def _paper_layout_traces(n: int) -> list[dict]:
    """Every rank's calls of a training step in the paper's layout at ``n`` ranks (TP 4, FSDP
    N/4, EP N/8, 8 replicas of each expert), as ``--trace`` writes them: a TP all_reduce, an
    FSDP all_gather whose shard shrinks as 1 / N, an EP all_gather, the experts' all_reduce
    over their replicas."""
    def call(op, members, nbytes):
        return {"e": "call", "comm": f"{op}{members[:2]}", "members": members, "k": 0, "path": "mte", "extra": None,
                "gap_s": 0.0, "op": op, "algo": "mesh", "nbytes": nbytes, "root": None, "itemsize": 4}
    ep = n // 8
    out = []
    for r in range(n):
        events = [call("all_reduce", list(range(r // 4 * 4, r // 4 * 4 + 4)), 4096),
                  call("all_gather", list(range(r % 4, n, 4)), 4 * (65536 // n) * (n // 4)),
                  call("all_gather", list(range(r // ep * ep, (r // ep + 1) * ep)), 64 * ep),
                  call("all_reduce", list(range(r % ep, n, ep)), 8192)]
        out.append({"format": 1, "rank": r, "world": n, "settings": {}, "end_us": None, "events": events})
    return out


def test_the_papers_training_groups_extrapolate_to_512_dies():
    """TP blocks of 4 stay 4; FSDP groups (N/4 ranks 4 apart), EP blocks (N/8 ranks) and the
    experts' replica groups (8 ranks N/8 apart) grow with N: from 16, 32, 64 ranks to the
    paper's 512 dies (FSDP 128, TP 4, EP 64), every rank's groups as that layout makes them."""
    got = ub.extrapolate(*(_paper_layout_traces(n) for n in (16, 32, 64)), 512)
    want = _paper_layout_traces(512)
    assert len(got) == 512
    for g, w in zip(got, want):
        assert [(e["op"], e["members"]) for e in g["events"]] == [(e["op"], e["members"]) for e in w["events"]]
        assert [e["nbytes"] for e in g["events"]] == [e["nbytes"] for e in w["events"]]
    assert [len(e["members"]) for e in got[0]["events"]] == [4, 128, 64, 8]
