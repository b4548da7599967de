"""reduce (to a root, MPI_Reduce): exact bytes at the root at N in {1, 2, 3, 8, 32}, every root,
every reduce op, HBM and plain inputs, in place, under a modeled clock, its argument errors, and
torch's ``dist.reduce`` mapped onto it.

The operator is a row of the operator table (stratacl/_operators.py), a slice map
(collectives/_slices.py, ``reduce``) and a front end on the call pipeline (runtime/communicator/_pipelined.py).
"""
from __future__ import annotations

import numpy as np
import pytest

import stratacl
from helpers import attempt, place, rank_data, ranks

SIZES = {1: [0, 5, 70000], 2: [0, 5, 70000], 3: [1, 1000, 70001], 8: [3, 1000, 20001], 32: [1, 300, 4001]}
CASES = [(np.float32, "sum"), (np.float64, "avg"), (np.int64, "prod"), (np.uint8, "max"), (np.float16, "min"),
         (np.int32, "sum")]


def folded(n: int, count: int, dt, op: str, tag: str) -> np.ndarray:
    """The reduction as documented: ((x_0 op x_1) op x_2) ... in rank order, in the dtype."""
    fn = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    acc = rank_data(0, count, dt, tag, op)
    with np.errstate(all="ignore"):
        for r in range(1, n):
            acc = fn(acc, rank_data(r, count, dt, tag, op)).astype(dt)
        if op == "avg":
            acc = (acc / dt(n)).astype(dt)
    return acc


def rooted_reduce(comm, sizes, cases):
    n, me = comm.size, comm.rank
    bad = []
    for count in sizes:
        for dt, op in cases:
            for root in sorted({0, n - 1, n // 2}):
                for in_hbm in (True, False):
                    tag = f"r{count}/{root}/{in_hbm}"
                    x = place(rank_data(me, count, dt, tag, op), in_hbm)
                    before = x.copy()
                    out = place(np.zeros(count, dt), in_hbm) if me == root else None
                    comm.reduce(out, x, op=op, root=root)
                    if me == root and out.tobytes() != folded(n, count, dt, op, tag).tobytes():
                        bad.append(("root", count, str(np.dtype(dt)), op, root, in_hbm))
                    if x.tobytes() != before.tobytes():
                        bad.append(("input changed", count, str(np.dtype(dt)), op, root, in_hbm))
    return bad


@pytest.mark.parametrize("n", ranks(1, 2, 3, 8, 32))
def test_reduce_gives_the_rank_order_fold_at_every_root(n):
    results = stratacl.spawn(rooted_reduce, n, args=(SIZES[n], CASES if n < 32 else CASES[:2]), hbm_size="512M",
                             timeout=240)
    assert results == [[] for _ in range(n)]


def ordered(me: int, count: int) -> np.ndarray:
    # magnitudes 1e-3 to 1e9 apart: float32 sums of these depend on the order they are added in
    return (np.random.default_rng(me).standard_normal(count) * 10.0 ** (3 * (me % 5) - 3)).astype(np.float32)


def same_bits_as_all_reduce(comm, count):
    n, me = comm.size, comm.rank
    x = place(ordered(me, count), True)
    whole = x.copy()
    comm.all_reduce(whole)
    out = stratacl.empty((count,), np.float32) if me == n - 1 else None
    comm.reduce(out, x, root=n - 1)
    return None if out is None else (out.tobytes() == whole.tobytes(), out.tobytes())


def test_the_root_gets_all_reduce_s_bits_in_rank_order():
    n, count = 5, 100003
    forward = ordered(0, count)
    for r in range(1, n):
        forward = forward + ordered(r, count)
    backward = ordered(n - 1, count)
    for r in range(n - 2, -1, -1):
        backward = backward + ordered(r, count)
    assert forward.tobytes() != backward.tobytes()       # the data tells the orders apart
    got = stratacl.spawn(same_bits_as_all_reduce, n, args=(count,), timeout=60)
    assert got[:4] == [None] * 4
    assert got[4] == (True, forward.tobytes())


def in_place(comm, count):
    me, root = comm.rank, 1
    x = stratacl.empty((count,), np.int32)
    x[...] = np.arange(count) + 1000 * me
    comm.reduce(x if me == root else None, x, op="sum", root=root)
    y = (np.arange(count) * (me + 1)).astype(np.int32)       # plain memory, in place
    comm.reduce(y if me == root else None, y, op="max", root=root)
    return x.copy(), y.copy(), stratacl.stats()["calls"].get("reduce", 0)


def test_in_place_is_exact_and_leaves_the_other_ranks_inputs_alone():
    n, count = 4, 5000
    for me, (x, y, calls) in enumerate(stratacl.spawn(in_place, n, args=(count,), timeout=60)):
        if me == 1:
            assert x.tolist() == [n * v + 1000 * sum(range(n)) for v in range(count)]
            assert y.tolist() == [v * n for v in range(count)]
        else:
            assert x.tolist() == [v + 1000 * me for v in range(count)]
            assert y.tolist() == [v * (me + 1) for v in range(count)]
        assert calls == 2


def timed(comm, nbytes):
    x = stratacl.empty((nbytes // 4,), np.float32)
    out = stratacl.empty((x.size,), np.float32) if comm.rank == 0 else None
    t0 = comm.clock()
    comm.reduce(out, x, root=0)
    return comm.clock() - t0


def test_modeled_time_grows_with_the_bytes_the_root_loads():
    small = stratacl.spawn(timed, 8, args=(4096,), clock="virtual", timeout=60)
    large = stratacl.spawn(timed, 8, args=(4 << 20,), clock="virtual", timeout=60)
    assert all(t > 0 for t in small + large)
    # every member leaves with the departure barrier: a flag latency or two apart, not a pull apart
    assert max(large) - min(large) < 2e-6 and max(small) - min(small) < 2e-6
    assert large[0] > 20 * small[0]


def bad_calls(comm, case):
    n, me = comm.size, comm.rank
    x = stratacl.empty((10,), np.float32)
    out = stratacl.empty((10,), np.float32)
    if case == "root":
        got = attempt(lambda: comm.reduce(out, x, root=n))
    elif case == "short" and me == 0:
        got = attempt(lambda: comm.reduce(stratacl.empty((9,), np.float32), x, root=0))
    elif case == "op" and me == 2:
        got = attempt(lambda: comm.reduce(None, x, op="max", root=0))
    elif case == "avg":
        got = attempt(lambda: comm.reduce(stratacl.empty((10,), np.int32), stratacl.empty((10,), np.int32),
                                          op="avg", root=0))
    else:
        got = attempt(lambda: comm.reduce(out if me == 0 else None, x, root=0))
    comm.barrier()          # the communicator is still usable after a rejected call
    return got


@pytest.mark.parametrize("case, at_fault, kind, words", [
    ("root", None, "ValueError", "reduce: root 3 is not a rank"),
    ("short", 0, "ValueError", "reduce: the root's output has 9 elements, expected 10"),
    ("op", None, "CollectiveMismatch", "reduce"),           # rank 2's op differs: agreement catches it
    ("avg", None, "TypeError", "reduce: op 'avg' needs a floating dtype"),
])
def test_bad_arguments_raise_on_every_rank(case, at_fault, kind, words):
    got = stratacl.spawn(bad_calls, 3, args=(case,), timeout=60)
    for me, (name, message) in enumerate(got):
        if at_fault is None or me == at_fault:
            assert (name, words in message) == (kind, True), (me, name, message)
        else:
            assert name == "CollectiveMismatch" and f"rank {at_fault}" in message, (me, name, message)


def torch_reduce(comm, root):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    import stratacl.torch  # noqa: F401  (registers the backend)
    dist.init_process_group("stratacl")
    x = stratacl.torch.zeros(1000, dtype=torch.float32)
    x += torch.arange(1000, dtype=torch.float32) * (comm.rank + 1)
    dist.reduce(x, dst=root, op=dist.ReduceOp.SUM)
    calls = dict(stratacl.stats()["calls"])
    dist.destroy_process_group()
    return x[:4].tolist(), calls.get("reduce", 0), calls.get("all_reduce", 0)


def test_torch_s_dist_reduce_is_the_rooted_reduce():
    pytest.importorskip("torch")
    n, root = 3, 2
    for me, (head, reduces, all_reduces) in enumerate(stratacl.spawn(torch_reduce, n, args=(root,), timeout=120)):
        scale = sum(range(1, n + 1)) if me == root else me + 1
        assert head == [float(v * scale) for v in range(4)], (me, head)
        assert (reduces, all_reduces) == (1, 0), (me, reduces, all_reduces)
