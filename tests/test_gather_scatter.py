"""gather and scatter (to and from a root): exact bytes on every rank at N in {1, 2, 3, 8, 32},
every root, HBM and plain inputs, in place, under a modeled clock, and their argument errors.

Both are rows of the operator table (stratacl/_operators.py) with a slice map
(collectives/_slices.py) and a front end on the call pipeline (runtime/communicator/_comm.py, _rooted).
"""
from __future__ import annotations

import numpy as np
import pytest

import stratacl
from helpers import attempt, place, rank_data, ranks

SIZES = {1: [0, 5, 70000], 2: [0, 5, 70000], 3: [1, 1000, 70001], 8: [3, 1000, 20001], 32: [1, 300, 4001]}
DTYPES = (np.float32, np.int64, np.uint8, np.float16)


def rooted(comm, sizes, dtypes):
    n, me = comm.size, comm.rank
    bad = []
    for count in sizes:
        for dt in dtypes:
            for root in sorted({0, n - 1, n // 2}):
                for k, in_hbm in enumerate((True, False)):
                    tag = f"g{count}/{root}/{k}"
                    x = place(rank_data(me, count, dt, tag), in_hbm)
                    out = place(np.zeros(n * count, dt), in_hbm) if me == root else None
                    comm.gather(out, x, root=root)
                    if me == root:
                        want = np.concatenate([rank_data(r, count, dt, tag) for r in range(n)])
                        if out.tobytes() != want.tobytes():
                            bad.append(("gather", count, str(np.dtype(dt)), root, in_hbm))
                    tag = f"s{count}/{root}/{k}"
                    whole = place(rank_data(root, n * count, dt, tag), in_hbm) if me == root else None
                    got = place(np.zeros(count, dt), in_hbm)
                    comm.scatter(got, whole, root=root)
                    want = rank_data(root, n * count, dt, tag)[me * count:(me + 1) * count]
                    if got.tobytes() != want.tobytes():
                        bad.append(("scatter", count, str(np.dtype(dt)), root, in_hbm))
    return bad


@pytest.mark.parametrize("n", ranks(1, 2, 3, 8, 32))
def test_gather_and_scatter_give_exact_bytes(n):
    results = stratacl.spawn(rooted, n, args=(SIZES[n], DTYPES if n < 32 else DTYPES[:2]), hbm_size="512M",
                             timeout=240)
    assert results == [[] for _ in range(n)]


def in_place(comm, count):
    n, me, root = comm.size, comm.rank, comm.size - 1
    out = stratacl.empty((n * count,), np.int32)
    out[...] = -1
    x = out[me * count:(me + 1) * count] if me == root else stratacl.empty((count,), np.int32)
    x[...] = np.arange(count) + 1000 * me
    comm.gather(out if me == root else None, x, root=root)
    gathered = out.copy() if me == root else None
    whole = stratacl.empty((n * count,), np.int32)
    whole[...] = np.arange(n * count) * 3
    mine = whole[me * count:(me + 1) * count] if me == root else stratacl.empty((count,), np.int32)
    comm.scatter(mine, whole if me == root else None, root=root)
    return gathered, mine.copy(), stratacl.stats()["bytes_staged"]


def test_in_place_forms_are_exact_and_zero_copy():
    n, count = 3, 1000
    for me, (gathered, mine, staged) in enumerate(stratacl.spawn(in_place, n, args=(count,), timeout=60)):
        if me == n - 1:
            assert gathered.tolist() == [v + 1000 * r for r in range(n) for v in range(count)]
        assert mine.tolist() == [3 * (me * count + v) for v in range(count)]
        assert staged == 0


def timed(comm, nbytes):
    x = stratacl.empty((nbytes // 4,), np.float32)
    out = stratacl.empty((comm.size * x.size,), np.float32) if comm.rank == 0 else None
    t0 = comm.clock()
    comm.gather(out, x, root=0)
    t1 = comm.clock()
    comm.scatter(x, out, root=0)
    t2 = comm.clock()
    return t1 - t0, t2 - t1


def test_modeled_time_grows_with_the_bytes_the_root_moves():
    # the root pulls N-1 blocks (gather), every rank one block from the root (scatter): both are
    # timed from their traffic; ranks of one call leave at the same modeled time (the barrier)
    small = stratacl.spawn(timed, 8, args=(4096,), clock="virtual", timeout=60)
    large = stratacl.spawn(timed, 8, args=(4 << 20,), clock="virtual", timeout=60)
    for times in (small, large):
        assert all(g > 0 and s > 0 for g, s in times)
    # 1024x the bytes: the root's pull of 7 x 4 MiB dwarfs a 4 KiB call's latency
    assert large[0][0] > 20 * small[0][0]
    assert large[0][1] > 20 * small[0][1]


def bad_calls(comm, case):
    n, me = comm.size, comm.rank
    x = stratacl.empty((10,), np.float32)
    out = stratacl.empty((n * 10,), np.float32)
    if case == "root":
        got = attempt(lambda: comm.gather(out, x, root=n))
    elif case == "short" and me == 0:
        got = attempt(lambda: comm.gather(stratacl.empty((n * 10 - 1,), np.float32), x, root=0))
    elif case == "dtype" and me == 1:
        got = attempt(lambda: comm.scatter(stratacl.empty((10,), np.float64), out, root=0))
    else:
        got = attempt(lambda: comm.gather(out, x, root=0) if case != "dtype" else comm.scatter(x, out, root=0))
    comm.barrier()          # the communicator is still usable after a rejected call
    return got


@pytest.mark.parametrize("case, at_fault, kind, words", [
    ("root", None, "ValueError", "root 3 is not a rank"),
    ("short", 0, "ValueError", "expected 3 x 10 = 30"),
    ("dtype", None, "CollectiveMismatch", "dtype"),      # rank 1's block: agreement catches it
])
def test_bad_arguments_raise_on_every_rank(case, at_fault, kind, words):
    got = stratacl.spawn(bad_calls, 3, args=(case,), timeout=60)
    for me, (name, message) in enumerate(got):
        if at_fault is None or me == at_fault:
            assert (name, words in message) == (kind, True), (me, name, message)
        else:
            assert name == "CollectiveMismatch" and f"rank {at_fault}" in message, (me, name, message)
