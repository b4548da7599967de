"""async_op=True: every operation returns a Work; results, order and errors are those of the
blocking calls."""
from __future__ import annotations

import numpy as np
import pytest

import stratacl


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
    return (ok, bool((got == want).all()), float(y[0]), busy > 0, sub.size, repr(w1), z.tolist())


@pytest.mark.parametrize("n", [1, 3, 8])
def test_async_operations_complete_in_order_with_exact_bytes(n):
    for me, (ok, gathered, reduced, busy, sub_size, rep, z) in enumerate(stratacl.spawn(overlap, n, timeout=120)):
        assert z == [7, 8, 9]
        assert ok and gathered and busy
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


def test_async_error_is_raised_by_wait_on_every_rank_and_stops_the_queue():
    for errors, done in stratacl.spawn(mismatched, 3, timeout=60):
        assert errors == ["CollectiveMismatch", "CollectiveMismatch"]
        assert done


def test_work_wait_with_timeout_returns_false_while_pending():
    from stratacl.runtime._work import Worker
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
