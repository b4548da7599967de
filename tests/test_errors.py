"""Disagreeing calls raise a clear error on every rank, never hang, never move bytes; the
communicator keeps working afterwards."""
from __future__ import annotations

import time

import numpy as np
import pytest

import stratacl
from helpers import after_peer_gave_up, attempt


def mismatches(comm):
    me, n = comm.rank, comm.size
    x = stratacl.empty((8,), np.float32)
    x[:] = me
    out = stratacl.empty((8 * n,), np.float32)
    out[:] = -1.0
    results = {}
    barriers = stratacl.stats()["calls"].get("barrier", 0)
    # operation: rank 1 calls all_gather, the others all_reduce
    results["op"] = attempt(lambda: comm.all_gather(out, x) if me == 1 else comm.all_reduce(x))
    # a barrier (its own native fast path) against a collective with a buffer
    results["barrier"] = attempt(lambda: comm.barrier() if me == n - 1 else comm.all_reduce(x))
    # dtype
    y = stratacl.empty((8,), np.float64 if me == 0 else np.float32)
    y[:] = 100 + me
    results["dtype"] = attempt(lambda: comm.all_reduce(y))
    # count
    z = stratacl.empty((8 + (me == n - 1),), np.float32)
    z[:] = 200 + me
    results["count"] = attempt(lambda: comm.all_reduce(z))
    # root
    results["root"] = attempt(lambda: comm.broadcast(x, root=0 if me else 1))
    # reduce op
    results["redop"] = attempt(lambda: comm.all_reduce(x, op="max" if me == 0 else "sum"))
    # wrong output size on one rank: ValueError there, CollectiveMismatch elsewhere
    bad = stratacl.empty((8 * n - (me == 0),), np.float32)
    bad[:] = -2.0
    results["outsize"] = attempt(lambda: comm.all_gather(bad, x))
    # avg on an integer dtype: a TypeError everywhere
    i = stratacl.empty((4,), np.int32)
    i[:] = 300 + me
    results["avg_int"] = attempt(lambda: comm.all_reduce(i, op="avg"))
    # all_to_all_v with counts that do not pair up
    send = [1] * n
    recv = [1] * n
    if me == 0:
        recv[n - 1] = 2
    v = stratacl.empty((n,), np.float32)
    v[:] = 400 + me
    o = stratacl.empty((n + 1,), np.float32)
    o[:] = -3.0
    results["a2av"] = attempt(lambda: comm.all_to_all_v(o, v, send, recv))
    # every call above was refused: no input and no output was written, whether the rank
    # rejected its own arguments or a peer did (each array still holds what was put in it)
    results["untouched"] = {name: a.tolist() for name, a in
                            (("x", x), ("out", out), ("y", y), ("z", z), ("bad", bad), ("i", i), ("v", v), ("o", o))}
    # the communicator still works, every operator's synchronisation still in step (barrier
    # numbers, the roots' departure counts)
    comm.all_reduce(x)
    results["after"] = x.tolist()
    later = []
    for root in (0, 1):
        b = stratacl.empty((8,), np.float32)
        b[:] = me
        comm.broadcast(b, root=root)
        later.append(b.tolist() == [float(root)] * 8)
    x[:] = me
    comm.all_gather(out, x)
    later.append(out.tolist() == [float(r) for r in range(n) for _ in range(8)])
    a = stratacl.empty((2 * n,), np.float32)
    a[:] = me
    a2 = stratacl.empty((2 * n,), np.float32)
    comm.all_to_all(a2, a)
    later.append(a2.tolist() == [float(r) for r in range(n) for _ in range(2)])
    comm.barrier()
    results["later"] = later
    results["in_step"] = (comm._protocol.syncs, list(comm._protocol.root_calls))   # the same on every rank
    results["barriers"] = stratacl.stats()["calls"].get("barrier", 0) - barriers   # completed calls only
    return results


@pytest.mark.parametrize("n", [2, 3, 8])
def test_disagreeing_calls_raise_on_every_rank(n):
    total = float(sum(range(n)))
    results = stratacl.spawn(mismatches, n, timeout=30)
    assert all(r["in_step"] == results[0]["in_step"] for r in results), [r["in_step"] for r in results]
    for rank, r in enumerate(results):
        assert r["op"][0] == "CollectiveMismatch" and "operation" in r["op"][1]
        assert "rank(s) [1]: all_gather" in r["op"][1]
        assert r["barrier"][0] == "CollectiveMismatch" and f"rank(s) [{n - 1}]: barrier" in r["barrier"][1]
        assert r["barriers"] == 1, r["barriers"]         # the failed barrier is not counted
        assert r["dtype"][0] == "CollectiveMismatch" and "rank(s) [0]: float64" in r["dtype"][1]
        assert r["count"][0] == "CollectiveMismatch" and "element count" in r["count"][1]
        assert r["root"][0] == "CollectiveMismatch" and "root" in r["root"][1]
        assert r["redop"][0] == "CollectiveMismatch" and "rank(s) [0]: max" in r["redop"][1]
        if rank == 0:
            assert r["outsize"][0] == "ValueError"
            assert f"output has {8 * n - 1} elements, expected {n} x 8" in r["outsize"][1]
        else:
            assert r["outsize"] == ("CollectiveMismatch", f"all_gather: rank 0 rejected its arguments: ValueError: "
                                    f"all_gather: output has {8 * n - 1} elements, expected {n} x 8 = {8 * n}; "
                                    f"no data was moved")
        assert r["avg_int"][0] == "TypeError" and "avg" in r["avg_int"][1]
        assert r["later"] == [True] * 4
        assert r["a2av"][0] == "CollectiveMismatch"
        assert f"rank 0 expects 2 elements from rank {n - 1}" in r["a2av"][1]
        assert r["after"] == [total] * 8
        assert r["untouched"] == {
            "x": [float(rank)] * 8, "out": [-1.0] * 8 * n, "y": [100.0 + rank] * 8,
            "z": [200.0 + rank] * (8 + (rank == n - 1)), "bad": [-2.0] * (8 * n - (rank == 0)),
            "i": [300 + rank] * 4, "v": [400.0 + rank] * n, "o": [-3.0] * (n + 1)}, r["untouched"]


def p2p_mismatch(comm):
    a = stratacl.empty((10,), np.int32)
    if comm.rank == 0:
        first = attempt(lambda: comm.send(a, 1))
    else:
        b = np.empty(11, np.int32)
        first = attempt(lambda: comm.recv(b, 0))
    a[:] = 5
    if comm.rank == 0:
        comm.send(a, 1)
        return first, None
    b = np.zeros(10, np.int32)
    comm.recv(b, 0)
    return first, b.tolist()


def test_send_recv_size_mismatch_raises_on_both_sides():
    (s_err, _), (r_err, got) = stratacl.spawn(p2p_mismatch, 2, timeout=30)
    assert s_err[0] == "CollectiveMismatch" and "does not match" in s_err[1]
    assert r_err[0] == "CollectiveMismatch" and "sends 10 x int32, this rank expects 11 x int32" in r_err[1]
    assert got == [5] * 10


def p2p_slow_paths(comm):
    """The cases the single native point-to-point call hands back to Python."""
    x = stratacl.empty((1000,), np.int64)
    x[:] = np.arange(1000) + 1000 * comm.rank
    got = stratacl.zeros((1000,), np.int64)
    log = []
    # a receive whose sender comes late: the native wait gives up, Python's health-checked wait goes on
    if comm.rank == 0:
        time.sleep(0.3)                   # longer than one native wait (SLICE, 50 ms)
        comm.send(x, 1)
    else:
        comm.recv(got, 0)
        log.append(got.tolist() == list(range(1000)))
    # sendrecv with a bad source: the send half still reaches its receiver, the call raises
    if comm.rank == 0:
        log.append(attempt(lambda: comm.sendrecv(x, 1, got, 0)))
    else:
        got[:] = 0
        comm.recv(got, 0)
        log.append(got.tolist() == list(range(1000)))
    # a receive into a strided view (written through a communication buffer) and a new buffer
    # of the sender's every call (its readiness is checked by Python first)
    for _ in range(3):
        y = stratacl.empty((500,), np.int64)
        y[:] = comm.rank + 7
        other = 1 - comm.rank
        wide = np.zeros(1000, np.int64)
        comm.sendrecv(y, other, wide[::2], other)
        log.append(wide[::2].tolist() == [other + 7] * 500 and not wide[1::2].any())
    return log


def test_point_to_point_paths_the_native_call_hands_back():
    r0, r1 = stratacl.spawn(p2p_slow_paths, 2, timeout=60)
    kind, msg = r0[0]
    assert kind == "ValueError" and "recv: source 0 is not another rank" in msg
    assert r0[1:] == [True] * 3
    assert r1 == [True] * 5


def bad_arguments(comm):
    x = stratacl.empty((4,), np.float32)
    return [
        attempt(lambda: comm.all_reduce(x, op="median")),
        attempt(lambda: comm.all_gather(np.empty(4 * comm.size, np.float64), x)),
        attempt(lambda: comm.broadcast(x, root=comm.size)),
        attempt(lambda: comm.all_reduce(x.astype(np.complex64))),
        attempt(lambda: comm.send(x, comm.rank)),
        attempt(lambda: comm.all_gather([1, 2], x)),
        attempt(lambda: stratacl.empty((-1,), np.float32)),
    ]


def test_bad_arguments_are_clear_errors():
    for r in stratacl.spawn(bad_arguments, 2, timeout=30):
        kinds = [k for k, _ in r]
        assert kinds == ["ValueError", "TypeError", "ValueError", "TypeError", "ValueError", "TypeError",
                         "ValueError"]
        assert "unknown reduce op 'median'" in r[0][1]
        assert "not supported" in r[3][1]


def late_peer(comm, flag):
    """Rank 1 is slow: it comes to the barrier only once rank 0 has given up on it (a file rank 0
    writes then), so the timeout happens whatever the host's load, with no sleep setting the pace."""
    if comm.rank == 0:
        err = attempt(comm.barrier)
        flag.write_text("timed out")
        return err
    after_peer_gave_up(flag)
    comm.barrier()                     # completes with rank 0's earlier arrival
    return None


def test_a_missing_peer_is_a_timeout_naming_it(tmp_path):
    err, _ = stratacl.spawn(late_peer, 2, args=(tmp_path / "rank0-timed-out",), timeout=1.0)
    assert err[0] == "CommTimeout"
    assert "barrier: rank 0 waited 1 s" in err[1] and "still missing: [1]" in err[1]


SUPPORTED = "bool, uint8, int8, int16, int32, int64, float16, float32, float64, uint16, uint32, uint64"


def rejections(comm):
    """Ranks that reject their own arguments raise their own error; each peer's
    CollectiveMismatch quotes it (the reason travels through the control segment)."""
    me, n = comm.rank, comm.size
    x = stratacl.empty((4,), np.float32)
    x[:] = me
    got = {}
    out = stratacl.empty((4 * n - (me == 1),), np.float32)
    got["all_gather"] = attempt(lambda: comm.all_gather(out, x))
    # several ranks reject (the others quote every one), then a prepared call's native path
    y = stratacl.empty((4,), np.float32 if me == 0 else np.complex64)
    got["several"] = attempt(lambda: comm.all_reduce(y, op="max" if me != 1 else "median"))
    z = stratacl.empty((4,), np.float32)
    for _ in range(3):
        comm.all_reduce(z, "sum")               # prepared: the peers' next call is native
    got["prepared"] = attempt(lambda: comm.all_reduce(z, "median" if me == 1 else "sum"))
    got["split"] = attempt(lambda: comm.split("red" if me == 1 else 0))
    # point to point between ranks 0 and 1: a rejected send, then a rejected receive
    if me == 0:
        got["send"] = attempt(lambda: comm.recv(np.empty(4, np.float32), 1))
        ro = np.empty(4, np.float32)
        ro.flags.writeable = False
        got["recv"] = attempt(lambda: comm.recv(ro, 1))
    elif me == 1:
        got["send"] = attempt(lambda: comm.send(np.empty(4, np.complex64), 0))
        got["recv"] = attempt(lambda: comm.send(x, 0))
    # every rank still in step
    x[:] = me
    comm.all_reduce(x)
    got["after"] = x.tolist()
    return got


@pytest.mark.parametrize("n", [2, 3])
def test_a_rejection_s_reason_reaches_the_peers(n):
    results = stratacl.spawn(rejections, n, timeout=60)
    gather = (f"all_gather: output has {4 * n - 1} elements, expected {n} x 4 = {4 * n}")
    complex_ = f"all_reduce: dtype complex64 is not supported (supported: {SUPPORTED})"
    median = "all_reduce: unknown reduce op 'median' (expected one of sum, prod, min, max, avg)"
    for rank, r in enumerate(results):
        assert r["after"] == [float(sum(range(n)))] * 4, rank
        if rank == 1:
            assert r["all_gather"] == ("ValueError", gather)
            assert r["several"] == ("TypeError", complex_)
            assert r["prepared"] == ("ValueError", median)
            assert r["split"] == ("ValueError", "split: color must be an int or None")
            assert r["send"] == ("TypeError", f"send: dtype complex64 is not supported (supported: {SUPPORTED})")
            assert r["recv"] == ("CollectiveMismatch", "send: rank 0 rejected its recv arguments: ValueError: "
                                 "recv: the buffer array is read-only; no data was moved")
            continue
        assert r["all_gather"] == (
            "CollectiveMismatch", f"all_gather: rank 1 rejected its arguments: ValueError: {gather}; no data was moved")
        if rank == 0:
            want = (f"all_reduce: rank 1 rejected its arguments: TypeError: {complex_}; no data was moved"
                    if n == 2 else
                    f"all_reduce: ranks [1, 2] rejected their arguments (rank 1: TypeError: {complex_}; "
                    f"rank 2: TypeError: {complex_}); no data was moved")
            assert r["several"] == ("CollectiveMismatch", want)
        else:
            assert r["several"] == ("TypeError", complex_)
        assert r["prepared"] == (
            "CollectiveMismatch", f"all_reduce: rank 1 rejected its arguments: ValueError: {median}; no data was moved")
        assert r["split"] == ("CollectiveMismatch", "split: rank 1 rejected its arguments: ValueError: split: color "
                                                    "must be an int or None; no data was moved")
        if rank == 0:
            assert r["send"] == ("CollectiveMismatch", "recv: rank 1 rejected its send arguments: TypeError: send: "
                                 f"dtype complex64 is not supported (supported: {SUPPORTED}); no data was moved")
            assert r["recv"] == ("ValueError", "recv: the buffer array is read-only")


def out_of_slots(comm):
    """Rank 1 takes a communicator slot at every split, rank 0 none: rank 1 runs out first."""
    for i in range(200):
        try:
            comm.split(0 if comm.rank == 1 else None)
        except Exception as e:  # noqa: BLE001 - the test inspects whatever was raised
            return i, type(e).__name__, str(e)
    return None


def test_running_out_of_communicator_slots_is_named_on_every_rank():
    from stratacl.runtime.services import COMM_SLOTS
    r0, r1 = stratacl.spawn(out_of_slots, 2, timeout=60)
    own = (f"split: rank 1 has used all {COMM_SLOTS} of its communicator slots (a communicator keeps its "
           f"slot until the job ends); split once and reuse the sub-communicators rather than splitting again")
    assert r1 == (COMM_SLOTS - 1, "TooManyCommunicators", own)
    assert r0 == (COMM_SLOTS - 1, "CollectiveMismatch",
                  f"split: rank 1 rejected its arguments: TooManyCommunicators: {own}; no data was moved")


def test_a_long_reason_is_cut_with_a_marker():
    import os

    from stratacl.runtime.services._control import REASON_BYTES, REASON_CUT, Control
    fd = os.memfd_create("reason")
    try:
        os.ftruncate(fd, Control.size_for(2))
        ctl = Control(fd, 2)
        off = ctl.layout.slot(1, 3) + ctl.layout.slot_reason(1)
        ctl.put_reason(off, ValueError("short"))
        assert ctl.reason(off) == "ValueError: short"
        ctl.put_reason(off, TypeError("é" * 400))        # two bytes each: the cut keeps whole characters
        text = ctl.reason(off)
        assert text.startswith("TypeError: éé") and text.endswith(REASON_CUT.decode())
        assert len(text.encode()) < REASON_BYTES and "\ufffd" not in text
        ctl.put_reason(off, KeyError("k"))
        assert ctl.reason(off) == "KeyError: 'k'"
        ctl.close()
    finally:
        os.close(fd)
