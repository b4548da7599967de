"""stratacl.fabric: a user's slice map run as an operator, through the library's backend.

Exact bytes at N in {1, 2, 3, 8, 32} for loads, stores and reductions over several phases; a
one-shot all_reduce written as a slice map equal bit for bit to the built-in all_reduce; the
errors refused on every rank before any byte moves; async_op, path and the modeled clock.
"""
from __future__ import annotations

import numpy as np
import pytest

import stratacl
from helpers import attempt, rank_data, ranks
from stratacl import fabric


def one_shot(comm, count, dtype, path):
    """Every rank reduces every peer's x into its out, in rank order: a one-shot all_reduce."""
    n, me = comm.size, comm.rank
    x = stratacl.empty((count,), dtype)
    x[...] = rank_data(me, count, dtype, "one-shot")
    out = stratacl.zeros((count,), dtype)
    smap = fabric.SliceMap()
    for p in range(n):
        smap.reduce(p, x.nbytes)
    fabric.run(comm, smap, x, out, name="one_shot_all_reduce", path=path)
    ref = x.copy()
    comm.all_reduce(ref)
    return out.tobytes() == ref.tobytes(), stratacl.stats()["calls"].get("one_shot_all_reduce")


def one_shots(comm, cases):
    """``one_shot`` for each (count, dtype) of ``cases`` in one job; the call count is the job's."""
    return [one_shot(comm, count, dtype, None)[0] for count, dtype in cases], \
        stratacl.stats()["calls"].get("one_shot_all_reduce")


@pytest.mark.parametrize("n", ranks(1, 2, 3, 8, 32, slow_from=3))
def test_a_one_shot_all_reduce_equals_the_built_in_bit_for_bit(n):
    cases = [(count, dtype) for dtype in (np.float32, np.int64)
             for count in ((1, 1000, 70001) if n < 32 else (1, 5000))]
    got = stratacl.spawn(one_shots, n, args=(cases,), timeout=180)
    for rank, (exact, calls) in enumerate(got):
        assert calls == len(cases), rank
        assert exact == [True] * len(cases), (rank, [c for c, ok in zip(cases, exact) if not ok])


def test_the_sdma_path_gives_the_same_bytes():
    assert stratacl.spawn(one_shot, 3, args=(4099, np.float32, "sdma"), timeout=60) == [(True, 1)] * 3


def phases(comm, count):
    """Phase 0: every rank stores its src into its right neighbour's dst block 0; after the
    barrier, phase 1: it loads its left neighbour's src into dst block 1. Then a second
    operator loads block 0 of the left neighbour's dst (what its own left neighbour stored)."""
    n, me = comm.size, comm.rank
    src = stratacl.empty((count,), np.int32)
    src[...] = np.arange(count) + 1000 * me
    dst = stratacl.zeros((3 * count,), np.int32)
    nb = src.nbytes
    smap = fabric.SliceMap().store((me + 1) % n, nb, 0, 0).barrier().load((me - 1) % n, nb, 0, nb)
    fabric.run(comm, smap, src, dst)
    dst2 = stratacl.zeros((3 * count,), np.int32)
    fabric.run(comm, fabric.SliceMap().load((me - 1) % n, nb, 0, 0), dst, dst2)
    return dst[:count].tolist(), dst[count:2 * count].tolist(), dst[2 * count:].tolist(), dst2[:count].tolist()


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_loads_and_stores_over_phases_give_exact_bytes(n):
    count = 257
    for me, (stored, loaded, untouched, again) in enumerate(stratacl.spawn(phases, n, args=(count,), timeout=60)):
        left, left2 = (me - 1) % n, (me - 2) % n
        assert stored == [v + 1000 * left for v in range(count)]
        assert loaded == [v + 1000 * left for v in range(count)]
        assert untouched == [0] * count
        assert again == [v + 1000 * left2 for v in range(count)]


def rejected(comm, case):
    n, me = comm.size, comm.rank
    src = stratacl.empty((16,), np.float32)
    dst = stratacl.zeros((16,), np.float32)
    smap = fabric.SliceMap().load((me + 1) % n, 64)
    if case == "peer" and me == 1:
        smap = fabric.SliceMap().load(n, 4)
    if case == "bounds" and me == 1:
        smap = fabric.SliceMap().load(0, 64, src_offset=4)
    if case == "sizes" and me == 1:
        src = stratacl.empty((15,), np.float32)      # rank 0 reads 64 bytes of it
    if case == "phases" and me == 1:
        smap.barrier()
    got = attempt(lambda: fabric.run(comm, smap, src, dst))
    untouched = bool((dst == 0).all())
    comm.barrier()             # the communicator is still usable
    return got, untouched


@pytest.mark.parametrize("case, words", [
    ("peer", "peer 3 is not a rank"),
    ("bounds", "reaches byte 68 of rank 0's src, which has 64 bytes"),
    ("sizes", "rank 0 reaches byte 64 of rank 1's src, which has 60 bytes"),
    ("phases", "element count"),
])
def test_bad_slice_maps_are_refused_on_every_rank_before_any_byte_moves(case, words):
    # a rank's own bad slices (checked locally, or against its peers' sizes once published):
    # it raises, its peers raise CollectiveMismatch naming it; phases that differ between
    # ranks: every rank raises CollectiveMismatch
    at_fault = {"peer": 1, "bounds": 1, "sizes": 0}.get(case)
    for me, ((kind, message), untouched) in enumerate(stratacl.spawn(rejected, 3, args=(case,), timeout=60)):
        assert untouched, me
        if me == at_fault:
            assert (kind, words in message) == ("ValueError", True), (me, kind, message)
        elif at_fault is not None:
            assert kind == "CollectiveMismatch" and f"rank {at_fault}" in message, (me, kind, message)
        else:
            assert (kind, words in message) == ("CollectiveMismatch", True), (me, kind, message)


def test_names_of_built_in_operators_are_refused():
    with pytest.raises(ValueError, match="taken by a built-in operator"):
        fabric.run(None, fabric.SliceMap(), np.zeros(1), np.zeros(1), name="all_reduce")


def timed(comm, count):
    x = stratacl.empty((count,), np.float32)
    x[...] = comm.rank
    out = stratacl.zeros((count,), np.float32)
    smap = fabric.SliceMap()
    for p in range(comm.size):
        smap.reduce(p, x.nbytes)
    t0 = comm.clock()
    work = fabric.run(comm, smap, x, out, async_op=True)
    work.wait()
    t1 = comm.clock()
    ref = x.copy()
    comm.all_reduce(ref)
    t2 = comm.clock()
    return t1 - t0, t2 - t1, float(out[0]), float(ref[0])


def test_async_and_modeled_time_beside_the_built_in():
    got = stratacl.spawn(timed, 8, args=(1 << 18,), clock="virtual", timeout=120)
    for one_shot_s, mesh_s, a, b in got:
        assert a == b == sum(range(8))
        # the one-shot reads N-1 whole buffers where the mesh all_reduce reads 2(N-1)/N of one
        # (reduce-scatter, then gather): at N = 8 the one-shot moves 4x the bytes
        assert one_shot_s > mesh_s > 0
    assert len({round(t[0], 12) for t in got}) == 1      # every member times the call alike
