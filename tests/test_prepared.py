"""Prepared calls (runtime/communicator/_prepared.py): a call repeated on the same arrays reuses its checks,
and only while those arrays are what the checks saw."""
from __future__ import annotations

import gc
import time
import weakref

import numpy as np
import pytest

import stratacl
from helpers import ranks

BIG = 100_000          # float32 elements: past the eager size, so peers read the array itself
SMALL = 1000           # float32 elements: copied into the eager slots


def _values(rank: int, it: int, count: int, dtype) -> np.ndarray:
    return ((np.arange(count) * 7 + rank * 13 + it * 5) % 97).astype(dtype)


def repeated_calls(comm):
    """Every operator three times on the same arrays with new contents, HBM and plain."""
    n, me = comm.size, comm.rank
    bad = []
    for where in ("hbm", "plain"):
        make = stratacl.empty if where == "hbm" else np.empty
        for count in (1000, BIG):
            x, y = make((count,), np.float32), make((count,), np.float32)
            gathered = make((n * count,), np.float32)
            a2a_in, a2a_out = make((n * count,), np.float32), make((n * count,), np.float32)
            part = make((count,), np.float32)
            for it in range(3):
                x[:] = _values(me, it, count, np.float32)
                comm.all_reduce(x)
                want = sum(_values(r, it, count, np.float32) for r in range(n))
                if x.tobytes() != want.astype(np.float32).tobytes():
                    bad.append(f"all_reduce {where} {count} iteration {it}")
                x[:] = _values(me, it, count, np.float32)
                comm.all_gather(gathered, x)
                want = np.concatenate([_values(r, it, count, np.float32) for r in range(n)])
                if gathered.tobytes() != want.tobytes():
                    bad.append(f"all_gather {where} {count} iteration {it}")
                a2a_in[:] = _values(me, it, n * count, np.float32)
                comm.all_to_all(a2a_out, a2a_in)
                want = np.concatenate([_values(r, it, n * count, np.float32)[me * count:(me + 1) * count]
                                       for r in range(n)])
                if a2a_out.tobytes() != want.tobytes():
                    bad.append(f"all_to_all {where} {count} iteration {it}")
                comm.reduce_scatter(part, a2a_in)
                want = sum(_values(r, it, n * count, np.float32)[me * count:(me + 1) * count] for r in range(n))
                if part.tobytes() != want.astype(np.float32).tobytes():
                    bad.append(f"reduce_scatter {where} {count} iteration {it}")
                for root in (it % n, 0):
                    x[:] = _values(me, it, count, np.float32)
                    comm.broadcast(x, root=root)
                    if x.tobytes() != _values(root, it, count, np.float32).tobytes():
                        bad.append(f"broadcast {where} {count} root {root} iteration {it}")
                if n > 1:
                    x[:] = _values(me, it, count, np.float32)
                    comm.sendrecv(x, (me + 1) % n, y, (me - 1) % n)
                    if y.tobytes() != _values((me - 1) % n, it, count, np.float32).tobytes():
                        bad.append(f"sendrecv {where} {count} iteration {it}")
    return bad


@pytest.mark.parametrize("n", ranks(1, 3, 8, slow_from=8))
def test_repeated_calls_on_the_same_arrays_see_new_contents(n):
    for rank, bad in enumerate(stratacl.spawn(repeated_calls, n, timeout=120)):
        assert bad == [], f"rank {rank}: {bad}"


def changed_in_place(comm):
    """The same array objects, changed between calls where numpy allows it: dtype, shape,
    writability; a dead array and its successor; no array kept alive."""
    n, me = comm.size, comm.rank
    log = []
    for count in (1000, BIG):
        x = stratacl.empty((count,), np.float32)
        x[:] = me + 1
        comm.all_reduce(x)
        log.append(bool((x == n * (n + 1) / 2).all()))
        # the same bytes read as int32: a remembered float32 check would sum floats
        x.dtype = np.int32
        x[:] = me + 1
        comm.all_reduce(x)
        log.append(x.dtype == np.int32 and bool((x == n * (n + 1) // 2).all()))
        # a new shape on the same object: the element count seen by the peers is still right
        x.shape = (10, count // 10)
        x[...] = me
        comm.broadcast(x, root=n - 1)
        log.append(x.shape == (10, count // 10) and bool((x == n - 1).all()))
        # an output made read-only after a call wrote it in place (a plain array: HBM arrays
        # cannot be made writable again): rejected on this rank (ValueError) and on the
        # others (CollectiveMismatch), then accepted again once writable
        w = np.zeros(count, np.float32)
        comm.broadcast(w, root=n - 1)
        w.flags.writeable = me != 0
        try:
            comm.broadcast(w, root=n - 1)
            log.append("no error")
        except ValueError as e:
            log.append(("ValueError", "read-only" in str(e)))
        except stratacl.CollectiveMismatch as e:
            log.append(("CollectiveMismatch", "rank 0 rejected its arguments: ValueError: " in str(e)
                        and "read-only" in str(e)))
        w.flags.writeable = True
        w[...] = me
        comm.broadcast(w, root=n - 1)
        log.append(bool((w == n - 1).all()))
        # the remembered call holds no reference: the array dies, its HBM goes back
        ref = weakref.ref(x)
        allocated = stratacl.memory_stats()["allocated_bytes.all.current"]
        del x
        gc.collect()
        log.append(ref() is None and stratacl.memory_stats()["allocated_bytes.all.current"] < allocated)
        # a new array, possibly at the dead one's id and address
        z = stratacl.empty((count,), np.float32)
        z[:] = me + 2
        comm.all_reduce(z)
        log.append(bool((z == n * (n + 3) / 2).all()))
    return log


@pytest.mark.parametrize("n", [2, 3])
def test_changes_to_an_array_between_calls_are_seen(n):
    for rank, log in enumerate(stratacl.spawn(changed_in_place, n, timeout=60)):
        rejected = ("ValueError", True) if rank == 0 else ("CollectiveMismatch", True)
        assert log == [True, True, True, rejected, True, True, True] * 2, f"rank {rank}"



def _moved() -> tuple:
    s = stratacl.stats()
    return s["bytes_pulled"], s["bytes_local"], s["output_bytes_written"], dict(s["calls"]), s["bytes_eager"]


def replayed_calls(comm):
    """A prepared mesh call runs in one native call (_native.replay). For each such operator:
    it gives the right bytes, counts the same bytes and calls as the Python path (taken under
    debug logging, which also logs the call), and a disagreement met while replaying raises
    CollectiveMismatch on every rank and leaves the communicator in step."""
    import logging
    n, me = comm.size, comm.rank
    x, y = stratacl.empty((BIG,), np.float32), stratacl.empty((n * BIG,), np.float32)
    part = stratacl.empty((BIG,), np.float32)
    small, gathered = np.empty((SMALL,), np.float32), stratacl.empty((n * SMALL,), np.float32)
    ops = {
        "all_gather": (lambda: comm.all_gather(y, x), lambda it: y,
                       lambda it: np.concatenate([_values(r, it, BIG, np.float32) for r in range(n)])),
        "all_to_all": (lambda: comm.all_to_all(y, x2a), lambda it: y,
                       lambda it: np.concatenate([_values(r, it, n * BIG, np.float32)[me * BIG:(me + 1) * BIG]
                                                  for r in range(n)])),
        "reduce_scatter": (lambda: comm.reduce_scatter(part, x2a), lambda it: part,
                           lambda it: sum(_values(r, it, n * BIG, np.float32)[me * BIG:(me + 1) * BIG]
                                          for r in range(n)).astype(np.float32)),
        "all_reduce": (lambda: comm.all_reduce(x), lambda it: x,
                       lambda it: sum(_values(r, it, BIG, np.float32) for r in range(n)).astype(np.float32)),
        "broadcast": (lambda: comm.broadcast(x, root=n - 1), lambda it: x,
                      lambda it: _values(n - 1, it, BIG, np.float32)),
        "all_gather eager": (lambda: comm.all_gather(gathered, small), lambda it: gathered,
                             lambda it: np.concatenate([_values(r, it, SMALL, np.float32) for r in range(n)])),
        "all_reduce eager": (lambda: comm.all_reduce(small, "sum"), lambda it: small,
                             lambda it: sum(_values(r, it, SMALL, np.float32) for r in range(n)).astype(np.float32)),
    }
    x2a = stratacl.empty((n * BIG,), np.float32)
    log = logging.getLogger("stratacl")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    bad, it = [], 0

    def fill():
        x[:] = _values(me, it, BIG, np.float32)
        x2a[:] = _values(me, it, n * BIG, np.float32)
        small[:] = _values(me, it, SMALL, np.float32)

    for case, (call, result, want) in ops.items():
        name = case.split()[0]
        deltas = []
        for logged in (False, False, True, False):
            it += 1
            fill()
            before = _moved()
            if logged:
                log.addHandler(handler)
                log.setLevel(logging.DEBUG)
            try:
                call()
            finally:
                log.setLevel(logging.WARNING)
                log.removeHandler(handler)
            after = _moved()
            deltas.append((after[0] - before[0], after[1] - before[1], after[2] - before[2],
                           after[3][name] - before[3].get(name, 0), after[4] - before[4]))
            if result(it).tobytes() != want(it).tobytes():
                bad.append(f"{case} call {it} (logged: {logged}): wrong bytes")
        if len(set(deltas[1:])) != 1 or deltas[1][3] != 1:
            bad.append(f"{case}: bytes and calls counted per call differ: {deltas}")
        if not any(m.startswith(f"{name} call") for m in records):
            bad.append(f"{case}: nothing logged under debug logging")
        records.clear()
        try:                          # the last rank disagrees while the others replay
            comm.barrier() if me == n - 1 else call()
            bad.append(f"{case}: a disagreement was not raised")
        except stratacl.CollectiveMismatch as e:
            if "disagree on the operation" not in str(e):
                bad.append(f"{case}: {e}")
        it += 1
        fill()
        call()
        if result(it).tobytes() != want(it).tobytes():
            bad.append(f"{case} after the disagreement: wrong bytes")
    return bad


@pytest.mark.parametrize("n", [2, 5])
def test_replayed_calls_move_count_log_and_fail_like_the_python_path(n):
    for rank, bad in enumerate(stratacl.spawn(replayed_calls, n, timeout=120)):
        assert bad == [], f"rank {rank}: {bad}"


def replayed_sendrecv(comm):
    """A prepared sendrecv runs in one native call (_native.p2p_replay): right bytes, the same
    counts as the Python path (path="sdma" takes it), a late sender, a mismatched send."""
    n, me = comm.size, comm.rank
    right, left = (me + 1) % n, (me - 1) % n
    x, out, short = (stratacl.empty((c,), np.float32) for c in (BIG, BIG, BIG // 2))
    bad, deltas = [], []
    for it, path in enumerate((None, None, "sdma", None), 1):
        x[:] = _values(me, it, BIG, np.float32)
        before = _moved()
        comm.sendrecv(x, right, out, left, path=path)
        after = _moved()
        deltas.append((after[0] - before[0], after[1] - before[1], after[2] - before[2],
                       after[3]["send"] - before[3].get("send", 0), after[3]["recv"] - before[3].get("recv", 0)))
        if out.tobytes() != _values(left, it, BIG, np.float32).tobytes():
            bad.append(f"call {it} (path {path}): wrong bytes")
    if len(set(deltas)) != 1 or deltas[0][3:] != (1, 1):
        bad.append(f"bytes and calls counted per call differ: {deltas}")
    x[:] = _values(me, 5, BIG, np.float32)
    if me == 0:
        time.sleep(0.2)               # past a wait slice: rank 1 goes on waiting in Python
    comm.sendrecv(x, right, out, left)
    if out.tobytes() != _values(left, 5, BIG, np.float32).tobytes():
        bad.append("late sender: wrong bytes")
    try:                              # rank 0 sends rank 1 half of what it expects
        comm.sendrecv(short if me == 0 else x, right, out, left)
        if me in (0, 1):
            bad.append("a mismatched send was not raised")
    except stratacl.CollectiveMismatch as e:
        if me not in (0, 1) or "this rank expects" not in str(e) and "does not match" not in str(e):
            bad.append(f"rank {me}: {e}")
    x[:] = _values(me, 6, BIG, np.float32)
    comm.sendrecv(x, right, out, left)
    if out.tobytes() != _values(left, 6, BIG, np.float32).tobytes():
        bad.append("after the mismatch: wrong bytes")
    return bad


@pytest.mark.parametrize("n", [2, 4])
def test_replayed_sendrecv_moves_counts_and_fails_like_the_python_path(n):
    for rank, bad in enumerate(stratacl.spawn(replayed_sendrecv, n, timeout=120)):
        assert bad == [], f"rank {rank}: {bad}"


def native_methods(comm):
    """The prepared operations are native methods (_replay.c, PreparedMethod): a repeated call
    with positional or the operation's own keyword arguments does not reach the Python
    operation; keywords like path= do, the next calls are on the default path again, and bad
    arguments get Python's TypeError. Returns the Python operations reached per case (seen
    where every one of them starts: its remembered arguments, PreparedCalls.get), and the
    errors."""
    n, me = comm.size, comm.rank
    x, y, part = stratacl.empty((BIG,), np.float32), stratacl.empty((n * BIG,), np.float32), \
        stratacl.empty((BIG,), np.float32)
    z = stratacl.empty((BIG,), np.float32)
    small, gathered = np.zeros((SMALL,), np.float32), np.zeros((n * SMALL,), np.float32)     # eager, plain arrays
    reached: list[str] = []
    prepared = comm._prepared
    python_get = prepared.get

    def spy(key, arrays, check, *args):
        reached.append(key[0] if key else check.__name__.removeprefix("_").removeprefix("check_"))
        return python_get(key, arrays, check, *args)
    calls = {
        "positional": [lambda: comm.all_gather(y, x), lambda: comm.all_to_all(y, y2),
                       lambda: comm.reduce_scatter(part, y2, "sum"), lambda: comm.all_reduce(x, "max"),
                       lambda: comm.broadcast(x, n - 1), lambda: comm.sendrecv(x, (me + 1) % n, z, (me - 1) % n),
                       lambda: comm.all_reduce(small), lambda: comm.all_gather(gathered, small),
                       lambda: comm.reduce(part, x, "sum", n - 1)],
        "keywords": [lambda: comm.all_gather(x=x, out=y), lambda: comm.reduce_scatter(part, y2, op="sum"),
                     lambda: comm.all_reduce(x, op="max"), lambda: comm.broadcast(x, root=n - 1),
                     lambda: comm.sendrecv(x, (me + 1) % n, src=(me - 1) % n, out=z)],
    }
    y2 = stratacl.empty((n * BIG,), np.float32)
    out = {}
    for case, fns in calls.items():
        for f in fns:
            f()                      # prepares (the first call is Python's)
        prepared.get = spy
        try:
            for f in fns:
                f()
            out[case] = list(reached)
            reached.clear()
            comm.broadcast(x, np.int64(n - 1))     # a numpy root: not a key the native method builds
            comm.all_gather(y, x, path="sdma")
            out["numpy root, path="] = list(reached)
            reached.clear()
        finally:
            del prepared.get
    sdma = stratacl.stats()["sdma"]["bytes"]
    comm.all_gather(y, x)             # the default path again, natively
    comm.all_gather(out=y, x=x)       # and through the Python operation
    out["sdma bytes after path="] = stratacl.stats()["sdma"]["bytes"] - sdma
    errors = []
    for bad in (lambda: comm.broadcast(x, root=0, rot=1), lambda: comm.all_reduce(), lambda: comm.broadcast(x, 0, 1)):
        try:
            bad()
        except TypeError as e:
            errors.append(type(e).__name__)
    out["errors"] = errors
    return out


def test_prepared_operations_are_native_methods():
    for rank, out in enumerate(stratacl.spawn(native_methods, 3, timeout=120)):
        assert out["positional"] == [] and out["keywords"] == [], (rank, out)
        assert out["numpy root, path="] == ["broadcast", "all_gather"], (rank, out)
        assert out["sdma bytes after path="] == 0, (rank, out)
        assert out["errors"] == ["TypeError"] * 3, (rank, out)


def same_call_on_two_communicators(comm):
    """The native method remembers the last call it found (_replay.c, same_as_last): the same
    array and root on the world and on a sub-communicator, alternating, must each replay their
    own communicator's call; and a root equal in value but another object is the same call."""
    me = comm.rank
    sub = comm.split(me % 2, me)
    x = stratacl.empty((BIG,), np.float32)
    bad = []
    for it in range(4):
        for c in (comm, sub, comm, sub):
            x[:] = _values(me, it, BIG, np.float32)
            root = int("1") if it % 2 else 1          # a new int object every other round
            c.broadcast(x, root)
            owner = root if c is comm else 2 * root + me % 2      # sub's rank 1, as a world rank
            if x.tobytes() != _values(owner, it, BIG, np.float32).tobytes():
                bad.append(f"{'world' if c is comm else 'sub'} round {it}: rank {owner}'s bytes expected")
    sub.barrier()
    return bad


def test_the_last_call_remembered_is_per_communicator():
    for rank, bad in enumerate(stratacl.spawn(same_call_on_two_communicators, 4, timeout=60)):
        assert bad == [], f"rank {rank}: {bad}"


def after_an_asynchronous_call(comm):
    """Once a communicator has a worker thread (its first async_op call), every call goes
    through it in order: a prepared broadcast right after an asynchronous all_gather must not
    replay natively beside it."""
    n, me = comm.size, comm.rank
    x, y = stratacl.empty((BIG,), np.float32), stratacl.empty((n * BIG,), np.float32)
    z = stratacl.empty((BIG,), np.float32)
    bad = []
    z[:] = me
    comm.broadcast(z, 0)              # prepared before there is a worker
    for it in range(4):
        x[:] = _values(me, it, BIG, np.float32)
        z[:] = _values(me, it + 1, BIG, np.float32)
        work = comm.all_gather(y, x, async_op=True)
        comm.broadcast(z, 0)
        work.wait()
        if y.tobytes() != np.concatenate([_values(r, it, BIG, np.float32) for r in range(n)]).tobytes():
            bad.append(f"all_gather {it}")
        if z.tobytes() != _values(0, it + 1, BIG, np.float32).tobytes():
            bad.append(f"broadcast {it}")
    return bad


def test_no_native_call_beside_the_worker():
    for rank, bad in enumerate(stratacl.spawn(after_an_asynchronous_call, 3, timeout=60)):
        assert bad == [], f"rank {rank}: {bad}"
