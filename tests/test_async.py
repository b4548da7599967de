"""async_op=True: every operation returns a Work; results, order and errors are those of the
blocking calls."""
from __future__ import annotations

import numpy as np
import pytest

import stratacl
from stratacl.runtime.pipeline import EAGER_BYTES


BUSY = float(np.sum(np.sqrt(np.arange(200_000, dtype=np.float64))))     # computed with nothing in flight


def overlap(comm):
    n, me = comm.size, comm.rank
    x = stratacl.empty((100_000,), np.int64)
    x[:] = np.arange(x.size) + me
    out = stratacl.empty((n * x.size,), np.int64)
    y = stratacl.empty((1000,), np.float64)
    y[:] = me
    w1 = comm.all_gather(out, x, async_op=True)
    w2 = comm.all_reduce(y, op="sum", async_op=True)
    busy = float(np.sum(np.sqrt(np.arange(200_000, dtype=np.float64))))     # compute meanwhile
    w3 = comm.barrier(async_op=True)
    assert w3.wait() is True
    ok = w1.is_completed() and w2.is_completed()          # FIFO: done before the barrier finished
    got = out.reshape(n, -1)
    want = np.arange(x.size)[None, :] + np.arange(n)[:, None]
    z = np.zeros(3, np.int64) if me else np.array([7, 8, 9], dtype=np.int64)
    comm.broadcast(z, root=0)                                                 # blocking, after the queue
    sub = comm.split(me % 2)                                                  # returns through the queue
    # the compute beside the calls in flight, and the gather's input, are as they would be alone
    intact = busy == BUSY and bool((x == np.arange(x.size) + me).all())
    return (ok, bool((got == want).all()), float(y[0]), intact, sub.size, repr(w1), z.tolist())


@pytest.mark.parametrize("n", [1, 3, 8])
def test_async_operations_complete_in_order_with_exact_bytes(n):
    for me, (ok, gathered, reduced, intact, sub_size, rep, z) in enumerate(stratacl.spawn(overlap, n, timeout=120)):
        assert z == [7, 8, 9]
        assert ok and gathered and intact
        assert reduced == sum(range(n))
        assert sub_size == len([r for r in range(n) if r % 2 == me % 2])
        assert rep == "Work(all_gather, completed)"


def mismatched(comm):
    x = stratacl.empty((4 + comm.rank,), np.float32)       # disagreeing counts
    out = stratacl.empty((comm.size * x.size,), np.float32)
    work = comm.all_gather(out, x, async_op=True)
    later = comm.barrier(async_op=True)
    errors = []
    for w in (work, later):
        try:
            w.wait()
            errors.append(None)
        except stratacl.CollectiveMismatch as e:
            errors.append(type(e).__name__)
    return errors, work.is_completed()


def test_async_mismatch_is_raised_by_wait_on_every_rank_and_the_queue_goes_on():
    for errors, done in stratacl.spawn(mismatched, 3, timeout=60):
        assert errors == ["CollectiveMismatch", None]
        assert done


def test_a_failure_the_ranks_do_not_share_stops_the_queue():
    from stratacl.runtime.pipeline import Worker, agreed
    w = Worker("test")
    try:
        shared = w.submit("rejected", lambda: (_ for _ in ()).throw(agreed(ValueError("bad argument"))))
        after = w.submit("next", lambda: 1)
        with pytest.raises(ValueError, match="bad argument"):
            shared.wait(10)
        assert after.result() == 1
        lost = w.submit("timed out", lambda: (_ for _ in ()).throw(TimeoutError("peer 3 never came")))
        queued = w.submit("queued", lambda: 2)
        for work in (lost, queued):
            with pytest.raises(TimeoutError, match="peer 3 never came"):
                work.wait(10)
    finally:
        w.stop(10)


def test_work_wait_with_timeout_returns_false_while_pending():
    from stratacl.runtime.pipeline import Worker
    import threading
    gate = threading.Event()
    w = Worker("test")
    try:
        work = w.submit("slow", gate.wait)
        assert work.wait(timeout=0.01) is False and not work.is_completed()
        gate.set()
        assert work.wait(timeout=10) is True and work.is_completed()
    finally:
        gate.set()
        w.stop(10)


PER_RANK, JOB_US, JOB_CORES = 1 << 20, 30.0, 40


def compute_during_all_gather(comm):
    x = stratacl.empty((PER_RANK,), np.uint8)
    x[:] = comm.rank
    out = stratacl.empty((comm.size * PER_RANK,), np.uint8)
    seen = {}
    t0 = comm.clock()
    comm.charge_compute(JOB_US, cores=JOB_CORES)                 # nothing in flight: exactly the job
    seen["alone"] = (comm.clock() - t0) * 1e6
    for path in ("mte", "sdma"):
        comm.barrier()
        t0 = comm.clock()
        work = comm.all_gather(out, x, async_op=True, path=path)
        issued = comm.clock()                                    # issuing does not move the program
        comm.charge_compute(JOB_US, cores=JOB_CORES)
        job_end = comm.clock()
        work.wait()
        seen[path] = ((issued - t0) * 1e6, (job_end - t0) * 1e6, (comm.clock() - t0) * 1e6,
                      bool((out.reshape(comm.size, -1) == np.arange(comm.size)[:, None]).all()))
    return seen


def test_charged_compute_shares_the_cores_with_a_collective_in_flight():
    from stratacl.ub._clock import FabricModel
    from stratacl.ub._compute import ComputeJob, overlap
    n = 4
    for seen in stratacl.spawn(compute_during_all_gather, n, clock="virtual", timeout=120):
        assert seen["alone"] == JOB_US
        ends = {}
        for path in ("mte", "sdma"):
            issued, job_end, after_wait, exact = seen[path]
            want = overlap(FabricModel("cm384", path=path, eager_bytes=EAGER_BYTES), "all_gather", "mesh", range(n), PER_RANK,
                           ComputeJob(JOB_CORES, JOB_US))
            assert exact and issued == 0.0
            assert abs(job_end - want.compute_end_us) <= 1e-9 * want.compute_end_us
            assert abs(after_wait - max(job_end, want.comm_us)) <= 1e-9 * after_wait
            ends[path] = job_end
        assert ends["mte"] > ends["sdma"] >= JOB_US - 1e-9         # the engine leaves the cores to the job


def never_waited(comm):
    from stratacl.runtime._world import IN_FLIGHT_LIMIT
    works = []
    for _ in range(IN_FLIGHT_LIMIT + 100):
        works.append(comm.barrier(async_op=True))
        works[-1]._done.wait(30)                 # completed, never waited for: the clock stays still
    kept = len(comm._rt.in_flight)
    t0 = comm.clock()
    comm.charge_compute(10.0)                    # waits for the operations still kept, then runs
    works[-1].wait()
    return kept, IN_FLIGHT_LIMIT, comm.clock() >= t0 + 10e-6 * (1 - 1e-9)     # clock() is in seconds


def test_operations_never_waited_for_are_not_kept_without_bound():
    for kept, limit, moved in stratacl.spawn(never_waited, 2, clock="virtual", timeout=120):
        assert kept <= limit and moved


def test_a_kernel_with_no_work_takes_no_time_even_with_every_core_busy():
    from stratacl.ub._compute import ComputeJob, run_job
    times, busy = np.array([0.0, 5.0]), np.array([48, 0])          # every core busy until t = 5
    assert run_job(ComputeJob(48, 0.0, 1.0), 48, times, busy) == (1.0, 48)
    end, fewest = run_job(ComputeJob(48, 2.0, 1.0), 48, times, busy)  # with work it waits for them
    assert end == 7.0 and fewest == 0
