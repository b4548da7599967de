"""Bad input that once crashed, hung, slipped through or raised an undocumented class, one test
each (found by tests/test_fuzz.py): the rank at fault raises the documented class naming the
operation, its peers CollectiveMismatch quoting it, and the next good call is exact."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import stratacl
from helpers import attempt

pytestmark = pytest.mark.timeout(120)


def _good_all_reduce(comm) -> bool:
    x = stratacl.empty((5,), np.int64)
    x[:] = np.arange(5) + 10 * comm.rank
    comm.all_reduce(x)
    return x.tolist() == (np.arange(5) * comm.size + 10 * sum(range(comm.size))).tolist()


def not_arrays(comm):
    me = comm.rank
    x = stratacl.zeros((4,), np.float32)
    out = stratacl.zeros((8,), np.float32)
    got = [
        attempt(lambda: comm.all_reduce(None if me == 0 else x)),
        attempt(lambda: comm.all_gather(out, [1, 2, 3, 4] if me == 0 else x)),
        attempt(lambda: comm.broadcast("buffer" if me == 0 else x)),
        attempt(lambda: comm.reduce_scatter(out[:4], None if me == 0 else out)),
        attempt(lambda: comm.send(None, 1) if me == 0 else comm.recv(x, 0)),
        attempt(lambda: comm.recv(None, 1) if me == 0 else comm.send(x, 0)),
    ]
    return got, _good_all_reduce(comm)


def test_an_argument_that_is_not_an_array_is_a_type_error_not_a_hang():
    (r0, ok0), (r1, ok1) = stratacl.spawn(not_arrays, 2, timeout=20)
    assert ok0 and ok1
    ops = ["all_reduce", "all_gather", "broadcast", "reduce_scatter"]
    for op, got in zip(ops, r0):
        assert got[0] == "TypeError" and got[1].startswith(f"{op}: the ") and "must be a numpy array" in got[1], got
    for op, got in zip(ops, r1):
        assert got[0] == "CollectiveMismatch" and f"{op}: rank 0 rejected its arguments: TypeError" in got[1], got
    assert r0[4] == ("TypeError", "send: the input must be a numpy array, got NoneType")
    assert r1[4][0] == "CollectiveMismatch" and "rank 0 rejected its send arguments: TypeError" in r1[4][1]
    assert r0[5] == ("TypeError", "recv: the buffer must be a numpy array, got NoneType")
    assert r1[5][0] == "CollectiveMismatch" and "rank 0 rejected its recv arguments: TypeError" in r1[5][1]


def bad_counts(comm):
    me, n = comm.rank, comm.size
    x = stratacl.zeros((4,), np.int32)
    out = stratacl.zeros((4,), np.int32)
    good = [1] * n
    got = [
        attempt(lambda: comm.all_to_all_v(out, x, [1.5, 1] if me == 0 else good, good)),    # was cut to 1
        attempt(lambda: comm.all_to_all_v(out, x, good, ["1", "1"] if me == 0 else good)),  # was parsed
        attempt(lambda: comm.all_to_all_v(out, x, [2**64, 1] if me == 0 else good, good)),  # was OverflowError
        # every rank agrees on counts whose int64 sum wraps negative: the size check passed, then
        # the plan pulled 2**62 elements
        attempt(lambda: comm.all_to_all_v(out, x, [2**62] * n, [2**62] * n)),
    ]
    y = stratacl.empty((n,), np.int32)
    y[:] = 100 * me + np.arange(n)
    comm.all_to_all_v(out[:n], y, [1] * n, [1] * n)
    return got, out[:n].tolist() == [100 * j + me for j in range(n)] and _good_all_reduce(comm)


def test_all_to_all_v_counts_are_integers_checked_one_by_one():
    (r0, ok0), (r1, ok1) = stratacl.spawn(bad_counts, 2, timeout=20)
    assert ok0 and ok1
    assert r0[0] == ("TypeError", "all_to_all_v: send_counts must be a sequence of 2 integers, got float64 values")
    assert r0[1] == ("TypeError", "all_to_all_v: recv_counts must be a sequence of 2 integers, got <U1 values")
    assert r0[2][0] == "TypeError" and "too large for 64 bits" in r0[2][1]
    for r in (r0, r1):
        assert r[3] == ("ValueError", f"all_to_all_v: send_counts has a count of {2**62} elements but the input has 4")
    for got in r1[:3]:
        assert got[0] == "CollectiveMismatch" and "all_to_all_v: rank 0 rejected its arguments" in got[1]


def _freed_view(count: int, dtype=np.float32) -> np.ndarray:
    big = stratacl.empty((8 << 20,), np.uint8)         # the middle chunks of it are released below
    v = stratacl.ub.view(big.__array_interface__["data"][0] + (4 << 20), (count,), dtype)
    del big
    gc.collect()
    stratacl.empty_cache()
    return v


def freed_views(comm):
    me = comm.rank
    x = stratacl.zeros((16,), np.float32)
    out = stratacl.zeros((32,), np.float32)
    got = [
        attempt(lambda: comm.all_reduce(_freed_view(16) if me == 0 else x)),                 # eager, in place
        attempt(lambda: comm.all_reduce(_freed_view(100000) if me == 0 else stratacl.zeros((100000,)))),
        attempt(lambda: comm.all_gather(_freed_view(32) if me == 0 else out, x)),
        attempt(lambda: comm.all_gather(out, _freed_view(16) if me == 0 else x)),
        attempt(lambda: comm.all_to_all(out, _freed_view(32)[::-1] if me == 0 else out.copy())),   # staged
        attempt(lambda: comm.broadcast(_freed_view(16) if me == 0 else x, root=1)),
        attempt(lambda: comm.send(_freed_view(16), 1) if me == 0 else comm.recv(x, 0)),
        attempt(lambda: comm.recv(_freed_view(16), 1) if me == 0 else comm.send(x, 0)),
    ]
    return got, _good_all_reduce(comm)


def test_a_view_of_released_hbm_is_a_registration_error_not_a_crash():
    (r0, ok0), (r1, ok1) = stratacl.spawn(freed_views, 2, timeout=20)
    assert ok0 and ok1
    for got in r0:
        assert got[0] == "RegistrationError" and "its HBM was released" in got[1], got
    for got in r1:
        assert got[0] == "CollectiveMismatch" and "rank 0" in got[1] and "RegistrationError" in got[1], got


def after_finalize(comm):
    me, peer = comm.rank, 1 - comm.rank
    x = stratacl.zeros((4,), np.float32)
    out = stratacl.zeros((8,), np.float32)
    for _ in range(3):                      # prepared: native code would replay the next call itself
        comm.all_reduce(x)
        comm.sendrecv(x, peer, out[:4], peer)
        comm.barrier()
    sub = comm.split(0)
    stratacl.finalize()
    calls = [lambda: comm.all_reduce(x), lambda: comm.sendrecv(x, peer, out[:4], peer), comm.barrier,
             lambda: comm.all_gather(out, x, async_op=True), lambda: comm.send(x, peer), lambda: sub.all_reduce(x),
             lambda: comm.split(0), lambda: stratacl.ub.view(x.__array_interface__["data"][0], (4,), np.float32)]
    return [attempt(fn) for fn in calls], me


def test_every_operation_after_finalize_raises_not_initialized():
    for got, rank in stratacl.spawn(after_finalize, 2, timeout=20):
        names = [g[0] if g else None for g in got]
        assert names == ["NotInitialized"] * len(got), (rank, got)
        assert "all_reduce: the communicator is shut down" in got[0][1]
        assert "barrier: the communicator is shut down" in got[2][1]


def failed_splits(comm):
    for i in range(200):
        got = attempt(lambda: comm.split("red" if comm.rank == 1 else 0))
        if got is None or got[0] != ("ValueError" if comm.rank == 1 else "CollectiveMismatch"):
            return i, got
    sub = comm.split(0)
    x = stratacl.empty((3,), np.int64)
    x[:] = comm.rank + 1
    sub.all_reduce(x)
    return x.tolist()


def test_failed_splits_give_back_their_communicator_slots():
    # rank 0 reserved a slot at each split rank 1 rejected, and ran out of them after 127
    assert stratacl.spawn(failed_splits, 2, timeout=30) == [[3, 3, 3]] * 2


def shapes(comm):
    from stratacl import ub
    a = stratacl.empty((4,), np.int64)
    addr = a.__array_interface__["data"][0]
    got = [attempt(lambda: stratacl.empty(float("inf"))),         # was OverflowError
           attempt(lambda: stratacl.empty(2.5)),                  # was an array of 2
           attempt(lambda: stratacl.empty((2**70,), np.uint8)),   # was OverflowError
           attempt(lambda: stratacl.empty((2**40, 2**40), np.uint8)),   # the int64 product wrapped to 0
           attempt(lambda: stratacl.empty((3,), object)),         # pointers in HBM
           attempt(lambda: ub.view(addr, (2**70,), np.uint8)),
           attempt(lambda: ub.view(addr, (-4,), np.uint8))]
    b = stratacl.empty((6,), np.float64)
    b[:] = 1.5
    return got, b.sum()


def test_allocation_shapes_are_checked_as_numpy_checks_them():
    got, total = stratacl.spawn(shapes, 1, timeout=20)[0]
    assert total == 9.0
    assert [g[0] for g in got] == ["TypeError", "TypeError", "OutOfMemory", "OutOfMemory", "TypeError",
                                   "RegistrationError", "ValueError"], got
    assert got[0][1] == "empty: the shape must be an int or a sequence of ints, got inf"
    assert got[4][1] == "empty: HBM arrays hold plain data, not Python objects (dtype object)"
