"""Exact bytes on every rank: every operator x dtype x size, at N in {1, 2, 3, 8, 32}.

Every rank computes what every peer contributes (``helpers.rank_data`` is reproducible), so
each rank checks its own output byte for byte. Reductions are checked against numpy applied
in rank order (``functools.reduce(ufunc, [x_0, ..., x_{N-1}])``), the documented order of the
full mesh; under ``--algo ring`` chunk c is folded in ring order c+1, c+2, ..., c.
Inputs alternate between HBM arrays (zero copy) and plain numpy arrays (staged path).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

import stratacl
from helpers import DTYPES, place, rank_data, ranks

REDUCE = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, "avg": np.add}
# at 32 ranks: none, fewer elements than ranks, and an uneven split (1 and 1000 run at 8 and below)
SIZES = {1: [0, 1, 7, 1000, 65537, 300001], 2: [0, 1, 7, 1000, 65537, 300001],
         3: [0, 1, 7, 1000, 65537, 300001], 8: [0, 1, 7, 1000, 3001, 65537], 32: [0, 7, 20001]}


def _ref_reduce(op: str, parts: list[np.ndarray], n: int) -> np.ndarray:
    acc = functools.reduce(REDUCE[op], parts)
    if op == "avg":
        acc = acc / acc.dtype.type(n)
    return acc


def _ring_order(c: int, n: int) -> list[int]:
    """The order a ring reduces chunk c in: c+1, c+2, ..., c (mod n)."""
    return [(c + 1 + k) % n for k in range(n)]


def _ref_all_reduce(op: str, parts: list[np.ndarray], n: int, ring: bool) -> np.ndarray:
    if not ring or n == 1:
        return _ref_reduce(op, parts, n)
    count = parts[0].size
    edges = [count * c // n for c in range(n + 1)]
    return np.concatenate([_ref_reduce(op, [parts[p][edges[c]:edges[c + 1]] for p in _ring_order(c, n)], n)
                           for c in range(n)])


def _a2av_count(i: int, j: int, count: int) -> int:
    return (i * 7 + j * 3 + count) % 4 * (count // 4 + 1) if count else 0


def _same(name: str, got: np.ndarray, want: np.ndarray, bad: list[str]) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
        where = np.nonzero(got.view(np.uint8) != want.view(np.uint8))[0][:3] if got.nbytes == want.nbytes else "shape"
        bad.append(f"{name}: bytes differ (first differing bytes {where})")


def matrix(comm, sizes: list[int], dtypes=None) -> tuple[list[str], int]:
    """Run every case; return (failures, number of cases checked) for this rank."""
    n, me = comm.size, comm.rank
    ring = stratacl.config.algo == "ring"
    bad: list[str] = []
    cases = 0
    for di, dt in enumerate(dtypes or DTYPES):
        dt = np.dtype(dt)
        for si, count in enumerate(sizes):
            hbm = (di + si) % 2 == 0
            tag = f"{dt}/{count}"
            # all_gather
            x = place(rank_data(me, count, dt, "ag" + tag), hbm)
            out = place(np.zeros(n * count, dt), not hbm)
            comm.all_gather(out, x)
            _same(f"all_gather {tag}", out, np.concatenate([rank_data(p, count, dt, "ag" + tag)
                                                            for p in range(n)]), bad)
            cases += 1
            # all_reduce and reduce_scatter, every op the dtype supports
            for op in REDUCE:
                if op == "avg" and dt.kind != "f":
                    continue
                parts = [rank_data(p, count, dt, f"ar{op}{tag}", op) for p in range(n)]
                x = place(parts[me], hbm)
                comm.all_reduce(x, op=op)
                _same(f"all_reduce {op} {tag}", x, _ref_all_reduce(op, parts, n, ring), bad)
                x = place(rank_data(me, n * count, dt, f"rs{op}{tag}", op), hbm)
                out = place(np.zeros(count, dt), not hbm)
                comm.reduce_scatter(out, x, op=op)
                mine = [rank_data(p, n * count, dt, f"rs{op}{tag}", op, me * count, (me + 1) * count)
                        for p in range(n)]
                order = _ring_order(me, n) if ring else range(n)
                _same(f"reduce_scatter {op} {tag}", out, _ref_reduce(op, [mine[p] for p in order], n), bad)
                cases += 2
            # all_to_all
            x = place(rank_data(me, n * count, dt, "a2a" + tag), hbm)
            out = place(np.zeros(n * count, dt), not hbm)
            comm.all_to_all(out, x)
            want = np.concatenate([rank_data(p, n * count, dt, "a2a" + tag, None, me * count, (me + 1) * count)
                                   for p in range(n)])
            _same(f"all_to_all {tag}", out, want, bad)
            cases += 1
            # all_to_all_v
            send = [_a2av_count(me, j, count) for j in range(n)]
            recv = [_a2av_count(j, me, count) for j in range(n)]
            x = place(rank_data(me, sum(send), dt, "a2av" + tag), hbm)
            out = place(np.zeros(sum(recv) + 3, dt), not hbm)
            comm.all_to_all_v(out, x, send, recv)
            pieces = []
            for j in range(n):
                sj = [_a2av_count(j, k, count) for k in range(n)]
                lo = sum(sj[:me])
                pieces.append(rank_data(j, sum(sj), dt, "a2av" + tag, None, lo, lo + sj[me]))
            want = np.concatenate(pieces + [np.zeros(3, dt)])
            _same(f"all_to_all_v {tag}", out, want, bad)
            cases += 1
            # broadcast from several roots
            for root in sorted({0, n - 1, n // 2}):
                data = rank_data(root, count, dt, f"bc{root}{tag}")
                x = place(data if me == root else np.zeros(count, dt), hbm)
                comm.broadcast(x, root=root)
                _same(f"broadcast root {root} {tag}", x, data, bad)
                cases += 1
            # send/recv around a ring (even ranks send first, odd ranks receive first)
            if n > 1:
                nxt, prv = (me + 1) % n, (me - 1) % n
                x = place(rank_data(me, count, dt, "p2p" + tag), hbm)
                got = place(np.zeros(count, dt), not hbm)
                if me % 2 == 0:
                    comm.send(x, nxt)
                    comm.recv(got, prv)
                else:
                    comm.recv(got, prv)
                    comm.send(x, nxt)
                _same(f"send/recv {tag}", got, rank_data(prv, count, dt, "p2p" + tag), bad)
                got2 = place(np.zeros(count, dt), hbm)
                comm.sendrecv(x, nxt, got2, prv)          # everyone at once: no ordering needed
                _same(f"sendrecv {tag}", got2, rank_data(prv, count, dt, "p2p" + tag), bad)
                cases += 2
            comm.barrier()
    return bad, cases


def _expected_cases(n: int, sizes: list[int], dtypes=None) -> int:
    total = 0
    for dt in dtypes or DTYPES:
        ops = 5 if np.dtype(dt).kind == "f" else 4
        roots = len({0, n - 1, n // 2})
        total += len(sizes) * (1 + 2 * ops + 1 + 1 + roots + (2 if n > 1 else 0))
    return total


@pytest.mark.parametrize("n", ranks(1, 2, 3, 8, 32, slow_from=8))
def test_every_operator_dtype_and_size(n):
    results = stratacl.spawn(matrix, n, args=(SIZES[n],), hbm_size="1G", timeout=120)
    assert len(results) == n
    for rank, (bad, cases) in enumerate(results):
        assert bad == [], f"rank {rank}: {bad[:5]}"
        assert cases == _expected_cases(n, SIZES[n])


@pytest.mark.parametrize("settings", [
    dict(registration="jit"), dict(registration="pool", hbm_size="512M"), dict(registration="staged"),
    dict(metadata_path="relay"), dict(topology="flat"), dict(algo="ring"), dict(clock="virtual"),
    dict(algo="ring", clock="virtual", registration="jit"), dict(algo="auto", clock="throttled", dilation=1.0),
    dict(path="sdma"), dict(path="sdma", partition="naive", clock="virtual"), dict(partition="naive", clock="virtual"),
    dict(path="sdma", algo="ring")],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 8])
def test_matrix_under_every_mode_clock_and_algorithm(n, settings):
    # a mode changes how bytes move and are reduced, not what a dtype is: none, fewer elements
    # than ranks, an uneven split past the eager size; a logical, a half and a wide dtype
    # (test_every_operator_dtype_and_size runs every dtype and size in the default mode)
    sizes = [0, 7, 65537]
    dtypes = [np.bool_, np.float16, np.float64]
    kwargs = dict(hbm_size="1G", timeout=120)
    kwargs.update(settings)
    results = stratacl.spawn(matrix, n, args=(sizes, dtypes), **kwargs)
    for rank, (bad, cases) in enumerate(results):
        assert bad == [], f"rank {rank}: {bad[:5]}"
        assert cases == _expected_cases(n, sizes, dtypes)


def subgroups(comm):
    """split by parity, then run collectives inside each half and across the world again."""
    me = comm.rank
    half = comm.split(me % 2, key=-me)          # reverse order inside each group
    members = [r for r in range(comm.size) if r % 2 == me % 2][::-1]
    x = stratacl.empty((5,), np.int64)
    x[:] = me
    out = np.zeros(5 * half.size, np.int64)
    half.all_gather(out, x)
    none = comm.split(None if me == 0 else 1)
    y = stratacl.empty((3,), np.float64)
    y[:] = me + 1
    comm.all_reduce(y, op="max")
    return half.rank, half.size, out.reshape(half.size, 5)[:, 0].tolist(), members, none is None, y.tolist()


@pytest.mark.parametrize("n", [1, 3, 8])
def test_split_follows_mpi_semantics(n):
    for me, (hrank, hsize, gathered, members, got_none, y) in enumerate(stratacl.spawn(subgroups, n)):
        assert gathered == members
        assert hsize == len(members) and hrank == members.index(me)
        assert got_none == (me == 0)
        assert y == [float(n)] * 3


def _vals(rank: int, it: int, count: int, offset: int = 0) -> np.ndarray:
    return ((rank * 1009 + (np.arange(count) + offset) * 7 + it * 13) % 251).astype(np.float64)


def overlapping(comm, block: int):
    """Outputs that overlap the inputs, in HBM (zero copy), three calls each (the first checks,
    the others reuse them): every rank's bytes must be exactly those of disjoint buffers."""
    n, me = comm.size, comm.rank
    buf = stratacl.empty((3 * n * block,), np.float64)
    whole, bad = n * block, []

    def check(case, got, want):
        if got.tobytes() != want.tobytes():
            bad.append(f"{case}: {int(np.sum(got != want))} of {want.size} elements wrong")

    for it in range(3):
        x = buf[:whole]                                       # all_to_all in place
        x[:] = _vals(me, it, whole)
        comm.all_to_all(x, x)
        check("all_to_all in place", x, np.concatenate([_vals(p, it, whole)[me * block:(me + 1) * block]
                                                         for p in range(n)]))
        x, out = buf[block:block + whole], buf[:whole]        # all_to_all, output shifted a block
        x[:] = _vals(me, it, whole)
        comm.all_to_all(out, x)
        check("all_to_all overlapping", out, np.concatenate([_vals(p, it, whole)[me * block:(me + 1) * block]
                                                              for p in range(n)]))
        x = buf[:whole]                                       # all_to_all_v in place, equal counts
        x[:] = _vals(me, it, whole)
        comm.all_to_all_v(x, x, [block] * n, [block] * n)
        check("all_to_all_v in place", x, np.concatenate([_vals(p, it, whole)[me * block:(me + 1) * block]
                                                           for p in range(n)]))
        if n > 1:
            x = buf[:block]                                   # sendrecv in place (MPI_Sendrecv_replace)
            x[:] = _vals(me, it, block)
            comm.sendrecv(x, (me + 1) % n, x, (me - 1) % n)
            check("sendrecv in place", x, _vals((me - 1) % n, it, block))
            x, out = buf[1:block + 1], buf[:block]            # sendrecv, output shifted an element
            x[:] = _vals(me, it, block)
            comm.sendrecv(x, (me + 1) % n, out, (me - 1) % n)
            check("sendrecv overlapping", out, _vals((me - 1) % n, it, block))
        x = buf[:whole]                                       # reduce_scatter into the own chunk
        x[:] = _vals(me, it, whole)
        out = x[me * block:(me + 1) * block]
        comm.reduce_scatter(out, x)
        check("reduce_scatter into its own chunk", out,
              functools.reduce(np.add, [_vals(p, it, whole)[me * block:(me + 1) * block] for p in range(n)]))
        x[:] = _vals(me, it, whole)                           # ... into the first chunk
        out = x[:block]
        comm.reduce_scatter(out, x)
        check("reduce_scatter into chunk 0", out,
              functools.reduce(np.add, [_vals(p, it, whole)[me * block:(me + 1) * block] for p in range(n)]))
        out = buf[:whole]                                     # all_gather in place (MPI_IN_PLACE)
        out[me * block:(me + 1) * block] = _vals(me, it, block)
        comm.all_gather(out, out[me * block:(me + 1) * block])
        check("all_gather in place", out, np.concatenate([_vals(p, it, block) for p in range(n)]))
        out[:block] = _vals(me, it, block)                    # ... from chunk 0 on every rank
        comm.all_gather(out, out[:block])
        check("all_gather from chunk 0", out, np.concatenate([_vals(p, it, block) for p in range(n)]))
    comm.barrier()
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{}, dict(algo="ring"), dict(path="sdma")],
                         ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "default")
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_outputs_overlapping_inputs_give_exact_bytes(n, settings):
    blocks = (100, 20000)                       # below and above the eager size (16 KiB), in one job
    for rank, bad in enumerate(stratacl.spawn(_overlapping_blocks, n, args=(blocks,), timeout=120, **settings)):
        assert bad == [[], []], f"rank {rank}: {dict(zip(blocks, bad))}"


def _overlapping_blocks(comm, blocks):
    return [overlapping(comm, block) for block in blocks]


def in_place_staging(comm, block: int):
    """bytes_staged around each in-place form (all_gather from the rank's own chunk of ``out``,
    reduce_scatter into the rank's own chunk of ``x``) and around an overlap that is not one
    (all_gather from chunk 0), with whether each gave the exact bytes."""
    n, me = comm.size, comm.rank
    buf = stratacl.empty((n * block,), np.float64)
    own = slice(me * block, (me + 1) * block)
    got = {}

    def staged(case, call, result, want):
        before = stratacl.stats()["bytes_staged"]
        call()
        got[case] = (stratacl.stats()["bytes_staged"] - before, result().tobytes() == want.tobytes())

    buf[own] = _vals(me, 0, block)
    staged("all_gather in place", lambda: comm.all_gather(buf, buf[own]), lambda: buf,
           np.concatenate([_vals(p, 0, block) for p in range(n)]))
    buf[:] = _vals(me, 1, n * block)
    staged("reduce_scatter in place", lambda: comm.reduce_scatter(buf[own], buf), lambda: buf[own],
           functools.reduce(np.add, [_vals(p, 1, n * block)[own] for p in range(n)]))
    buf[:block] = _vals(me, 2, block)
    staged("all_gather from chunk 0", lambda: comm.all_gather(buf, buf[:block]), lambda: buf,
           np.concatenate([_vals(p, 2, block) for p in range(n)]))
    return got


def test_in_place_forms_stay_zero_copy():
    """docs/reference.md, "Buffers": the in-place forms that need no copy stay zero copy (bytes_staged unchanged);
    an overlap that is not such a form is staged, on the ranks where the chunks differ."""
    block = 20000                                   # 160 KB a chunk: above the eager size
    for rank, got in enumerate(stratacl.spawn(in_place_staging, 3, args=(block,), timeout=60)):
        assert got == {"all_gather in place": (0, True), "reduce_scatter in place": (0, True),
                       "all_gather from chunk 0": (0 if rank == 0 else block * 8, True)}, (rank, got)
