"""Exact unit tests of the pure planning modules: slice maps, schedules, the partitioner, the
nccl-tests sizes, the settings, topology validation and the expert-routing checks.

They start no rank and run in a second. Every expected value is worked out by hand from the
definition written in the module's docstring (chunk c = elements [count*c//n, count*(c+1)//n),
peers after me first, ...), never computed by the code under test. benchmarks/mutation.py runs
mutmut against them (docs/testing.md, "Mutation testing").
"""
from __future__ import annotations

import json
import types

import numpy as np
import pytest

from stratacl import _config, _sizes
from stratacl._errors import ConfigError
from stratacl.collectives import _ep
from stratacl.collectives import _partition as P
from stratacl.collectives import _schedule as S
from stratacl.collectives import _slices as SL
from stratacl.ep import _buffer as EB
from stratacl.ub import _topology as T

IN, OUT, SCR = SL.IN, SL.OUT, SL.SCRATCH
LD, ST, ACC = SL.LOAD, SL.STORE, SL.LOAD_ACC


# --- slice maps --------------------------------------------------------------------------------
def rows(smap: SL.Slices) -> list[tuple]:
    """(peer, src_buf, src, dst_buf, dst, nbytes, op, flag) of every slice, in order."""
    cols = (smap.peer, smap.src_buf, smap.src, smap.dst_buf, smap.dst, smap.nbytes, smap.op, smap.flag)
    for c in cols:
        assert c.dtype == np.int64 and c.shape == (len(smap),)
    return [tuple(int(v) for v in r) for r in zip(*cols)]


def test_buffer_and_op_codes_are_distinct():
    assert len({IN, OUT, SCR}) == 3
    assert (LD, ST, ACC) == (0, 1, 2)


def test_make_broadcasts_scalars_and_drops_empty_slices():
    m = SL.make(2, [0, 1, 3], IN, [0, 8, 16], OUT, 0, [4, 0, 4], LD)
    assert m.me == 2 and len(m) == 2 and m.total == 8
    assert rows(m) == [(0, IN, 0, OUT, 0, 4, LD, -1), (3, IN, 16, OUT, 0, 4, LD, -1)]
    one = SL.make(1, 3, SCR, 5, IN, 6, 7, ACC, 9)
    assert rows(one) == [(3, SCR, 5, IN, 6, 7, ACC, 9)]
    assert len(SL.make(0, [1, 2], IN, 0, OUT, 0, 0, LD)) == 0


def test_make_copies_its_inputs():
    src = np.array([0, 8])
    m = SL.make(0, [1, 2], IN, src, OUT, 0, 8, LD)
    src[0] = 99
    assert m.src.tolist() == [0, 8]
    m.flag[0] = 5                      # broadcast views would make this write-protected or shared
    assert m.flag.tolist() == [5, -1]


def test_per_peer_and_concat():
    m = SL.make(1, [0, 3, 3], IN, 0, OUT, 0, [4, 5, 6], LD)
    pp = m.per_peer(5)
    assert pp.dtype == np.int64 and pp.tolist() == [4, 0, 0, 11, 0]
    c = SL.concat(m, SL.make(7, [2], OUT, 1, SCR, 2, 3, ACC, 4))
    assert c.me == 1
    assert rows(c) == [(0, IN, 0, OUT, 0, 4, LD, -1), (3, IN, 0, OUT, 0, 5, LD, -1), (3, IN, 0, OUT, 0, 6, LD, -1),
                       (2, OUT, 1, SCR, 2, 3, ACC, 4)]


def test_chunk_edges():
    # elements 10*c//4 = 0, 2, 5, 7, 10, times 4 bytes
    assert SL.chunk_edges(10, 4, 4).tolist() == [0, 8, 20, 28, 40]
    assert SL.chunk_edges(3, 3, 2).tolist() == [0, 2, 4, 6]


def test_all_gather_pulls_every_block_peers_after_me_first():
    (m,) = SL.all_gather(1, 3, 8)
    assert m.me == 1
    assert rows(m) == [(2, IN, 0, OUT, 16, 8, LD, -1), (0, IN, 0, OUT, 0, 8, LD, -1), (1, IN, 0, OUT, 8, 8, LD, -1)]
    (m,) = SL.all_gather(3, 4, 2)
    assert [r[0] for r in rows(m)] == [0, 1, 2, 3]


def test_reduce_scatter_reduces_chunk_me_of_every_member_in_rank_order():
    (m,) = SL.reduce_scatter(1, 3, 10, 4)      # edges 0, 12, 24, 40
    assert rows(m) == [(p, IN, 12, OUT, 0, 12, ACC, -1) for p in (0, 1, 2)]
    (m,) = SL.reduce_scatter(2, 3, 10, 4)
    assert rows(m) == [(p, IN, 24, OUT, 0, 16, ACC, -1) for p in (0, 1, 2)]


def test_all_reduce_large_two_phases():
    a, b = SL.all_reduce(2, 3, 10, 4)          # edges 0, 12, 24, 40
    assert rows(a) == [(p, IN, 24, IN, 24, 16, ACC, -1) for p in (0, 1, 2)]
    assert rows(b) == [(0, IN, 0, IN, 0, 12, LD, -1), (1, IN, 12, IN, 12, 12, LD, -1)]
    a, b = SL.all_reduce(1, 4, 4, 2)           # count == n: still chunked, edges 0, 2, 4, 6, 8
    assert rows(a) == [(p, IN, 2, IN, 2, 2, ACC, -1) for p in range(4)]
    assert rows(b) == [(2, IN, 4, IN, 4, 2, LD, -1), (3, IN, 6, IN, 6, 2, LD, -1), (0, IN, 0, IN, 0, 2, LD, -1)]


def test_all_reduce_small_goes_through_scratch():
    a, b = SL.all_reduce(0, 4, 3, 4)           # fewer elements than members
    assert rows(a) == [(p, IN, 0, SCR, 0, 12, ACC, -1) for p in range(4)]
    assert rows(b) == [(0, SCR, 0, IN, 0, 12, LD, -1)]
    a, b = SL.all_reduce(1, 2, 8, 4, small=32)  # 32 bytes <= small
    assert rows(a) == [(p, IN, 0, SCR, 0, 32, ACC, -1) for p in range(2)]
    assert rows(b) == [(1, SCR, 0, IN, 0, 32, LD, -1)]
    a, b = SL.all_reduce(1, 2, 8, 4, small=31)  # one byte over: chunked
    assert rows(a) == [(p, IN, 16, IN, 16, 16, ACC, -1) for p in range(2)]
    assert rows(b) == [(0, IN, 0, IN, 0, 16, LD, -1)]


def test_all_reduce_eager_forms():
    (m,) = SL.all_reduce_eager(1, 3, 40)
    assert rows(m) == [(p, IN, 0, OUT, 0, 40, ACC, -1) for p in range(3)]
    a, b = SL.all_reduce_eager_chunks(1, 3, 10, 4)   # nb = 40, edges 0, 12, 24, 40
    assert rows(a) == [(p, IN, 12, IN, 52, 12, ACC, -1) for p in range(3)]
    assert rows(b) == [(2, IN, 64, OUT, 24, 16, LD, -1), (0, IN, 40, OUT, 0, 12, LD, -1),
                       (1, IN, 52, OUT, 12, 12, LD, -1)]


def test_all_to_all_equal_blocks():
    (m,) = SL.all_to_all(1, 4, 42)            # blocks of 42 // 4 = 10 bytes
    assert rows(m) == [(2, IN, 10, OUT, 20, 10, LD, -1), (3, IN, 10, OUT, 30, 10, LD, -1),
                       (0, IN, 10, OUT, 0, 10, LD, -1), (1, IN, 10, OUT, 10, 10, LD, -1)]


def test_all_to_all_v_follows_the_counts():
    send = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    recv = send.T.copy()
    (m,) = SL.all_to_all_v(1, 3, send, recv, 2)
    # from p: send_displ[p, 1] = [1, 4, 7][p]... in rank-order packing: p=2 -> 7, p=0 -> 1, p=1 -> 4
    assert rows(m) == [(2, IN, 14, OUT, 14, 16, LD, -1), (0, IN, 2, OUT, 0, 4, LD, -1), (1, IN, 8, OUT, 4, 10, LD, -1)]
    send = [[0, 3], [2, 0]]
    (m,) = SL.all_to_all_v(0, 2, send, [[0, 2], [3, 0]], 4)
    assert rows(m) == [(1, IN, 0, OUT, 0, 8, LD, -1)]


def test_gather_pulls_every_block_to_the_root_only():
    # at the root (1 of 3): peers after it first, block p at p x M of its output, its own copied too
    (m,) = SL.gather(1, 3, 8, root=1)
    assert m.me == 1
    assert rows(m) == [(2, IN, 0, OUT, 16, 8, LD, -1), (0, IN, 0, OUT, 0, 8, LD, -1), (1, IN, 0, OUT, 8, 8, LD, -1)]
    (m,) = SL.gather(0, 3, 8, root=1)
    assert m.me == 0 and rows(m) == []                      # not the root: pulls nothing
    (m,) = SL.gather(0, 2, 5, root=0)
    assert rows(m) == [(1, IN, 0, OUT, 5, 5, LD, -1), (0, IN, 0, OUT, 0, 5, LD, -1)]


def test_reduce_accumulates_every_member_in_rank_order_at_the_root_only():
    (m,) = SL.reduce(2, 3, 12, root=2)
    assert m.me == 2
    assert rows(m) == [(p, IN, 0, OUT, 0, 12, ACC, -1) for p in (0, 1, 2)]   # rank order, as all_reduce's sum
    (m,) = SL.reduce(0, 3, 12, root=0)                      # not peers-after-me: 0, 1, 2 still
    assert rows(m) == [(p, IN, 0, OUT, 0, 12, ACC, -1) for p in (0, 1, 2)]
    (m,) = SL.reduce(1, 3, 12, root=2)
    assert m.me == 1 and rows(m) == []
    (m,) = SL.reduce(0, 1, 4, root=0)
    assert rows(m) == [(0, IN, 0, OUT, 0, 4, ACC, -1)]


def test_scatter_pulls_block_me_of_the_roots_input():
    for me in range(3):
        (m,) = SL.scatter(me, 3, 8, root=2)
        assert m.me == me and rows(m) == [(2, IN, 8 * me, OUT, 0, 8, LD, -1)]
    (m,) = SL.scatter(1, 2, 0, root=0)
    assert rows(m) == []                                    # an empty block: no slice


def test_broadcast_recv():
    assert SL.broadcast(1, 4, 16, root=1)[0].me == 1 and len(SL.broadcast(1, 4, 16, root=1)[0]) == 0
    assert rows(SL.broadcast(2, 4, 16, root=1)[0]) == [(1, IN, 0, IN, 0, 16, LD, -1)]
    assert len(SL.broadcast(0, 4, 16)[0]) == 0
    assert rows(SL.broadcast(3, 4, 16)[0]) == [(0, IN, 0, IN, 0, 16, LD, -1)]
    assert rows(SL.recv(2, 0, 24)[0]) == [(0, IN, 0, OUT, 0, 24, LD, -1)]


def test_ring_all_gather_steps():
    (m,) = SL.ring_all_gather_step(1, 4, 8, 0)
    assert rows(m) == [(0, IN, 0, OUT, 0, 8, LD, 0), (1, IN, 0, OUT, 8, 8, LD, -1)]
    (m,) = SL.ring_all_gather_step(1, 4, 8, 2)
    assert rows(m) == [(0, OUT, 16, OUT, 16, 8, LD, 2)]
    (m,) = SL.ring_all_gather_step(0, 4, 8, 1)
    assert rows(m) == [(3, OUT, 16, OUT, 16, 8, LD, 1)]


def test_ring_reduce_scatter_steps():
    (m,) = SL.ring_reduce_scatter_step(1, 3, 10, 4, 0)     # edges 0, 12, 24, 40; chunk 2
    assert rows(m) == [(0, IN, 24, SCR, 24, 16, ACC, 0), (1, IN, 24, SCR, 24, 16, ACC, 0)]
    (m,) = SL.ring_reduce_scatter_step(1, 3, 10, 4, 1)     # last step: chunk 1, into OUT
    assert rows(m) == [(0, SCR, 12, OUT, 0, 12, ACC, 1), (1, IN, 12, OUT, 0, 12, ACC, 1)]
    (m,) = SL.ring_reduce_scatter_step(0, 4, 8, 1, 1)      # chunk (0-1-2)%4 = 1 from member 3
    assert rows(m) == [(3, SCR, 2, SCR, 2, 2, ACC, 1), (0, IN, 2, SCR, 2, 2, ACC, 1)]


def test_ring_all_reduce_steps():
    steps = [SL.ring_all_reduce_step(1, 3, 10, 4, s)[0] for s in range(4)]
    assert rows(steps[0]) == [(0, IN, 24, SCR, 24, 16, ACC, 0), (1, IN, 24, SCR, 24, 16, ACC, 0)]
    assert rows(steps[1]) == [(0, SCR, 12, IN, 12, 12, ACC, 1), (1, IN, 12, IN, 12, 12, ACC, 1)]
    assert rows(steps[2]) == [(0, IN, 0, IN, 0, 12, LD, 2)]
    assert rows(steps[3]) == [(0, IN, 24, IN, 24, 16, LD, 3)]


# --- schedules -----------------------------------------------------------------------------------
def norm(step):
    """A schedule step as comparable plain data."""
    name = type(step).__name__
    if name == "Mesh":
        assert all(a.dtype == np.int64 for a in (step.reader, step.owner, step.nbytes, step.kind))
        return ("Mesh", [tuple(int(v) for v in r) for r in zip(step.reader, step.owner, step.nbytes, step.kind)])
    if name == "Ring":
        assert step.nbytes.dtype == np.int64 and step.nbytes.shape == (step.kind.size, step.nbytes.shape[1])
        return ("Ring", step.nbytes.tolist(), step.kind.tolist(), None if step.local is None else step.local.tolist())
    if name == "Local":
        return ("Local", step.nbytes.tolist())
    if name == "RootWait":
        return ("RootWait", step.root)
    if name == "Shift":
        return ("Shift", step.nbytes)
    assert name == "Barrier"
    return ("Barrier",)


B = ("Barrier",)
LOAD_, RED_, COPY_ = S.LOAD, S.LOAD_REDUCE, S.LOCAL_COPY


def sched(*a, **k):
    k.setdefault("eager_bytes", 0)
    return [norm(s) for s in S.schedule(*a, **k)]


def pairs(n, nb_of, kind, own):
    """Mesh rows in the documented order: readers ascending, owners ascending, then the own copies."""
    out = [(r, o, nb_of(r, o), kind) for r in range(n) for o in range(n) if r != o]
    if own:
        out += [(i, i, nb_of(i, i), COPY_) for i in range(n)]
    return [x for x in out if x[2] > 0]


def test_transfer_kind_codes():
    assert (S.LOAD, S.LOAD_REDUCE, S.LOCAL_COPY, S.HOST_LOAD, S.HOST_STORE) == (0, 1, 2, 3, 4)


def test_chunk_bytes_and_ring_chunks():
    assert S.chunk_bytes(10, 4, 4).tolist() == [8, 12, 8, 12]
    assert S.ring_all_gather_chunk(0, 0, 4) == 3 and S.ring_all_gather_chunk(2, 1, 4) == 0
    assert S.ring_reduce_scatter_chunk(0, 0, 4) == 2 and S.ring_reduce_scatter_chunk(3, 1, 4) == 0


def test_schedule_refuses_unknown_names():
    with pytest.raises(ValueError) as e:
        S.schedule("gather", "mesh", 2, 8, eager_bytes=0)
    assert str(e.value) == ("unknown operator 'gather' (known: barrier, all_gather, all_reduce, "
                            "reduce_scatter, all_to_all, broadcast, sendrecv)")
    with pytest.raises(ValueError) as e:
        S.schedule("all_gather", "tree", 2, 8, eager_bytes=0)
    assert str(e.value) == "unknown algorithm 'tree' (known: mesh, ring)"


def test_barrier_and_sendrecv():
    assert sched("barrier", "ring", 4, 64) == [B]
    assert sched("sendrecv", "mesh", 3, 8) == [("Shift", 8)]
    assert sched("sendrecv", "mesh", 1, 8) == [("Local", [8])]


def test_all_gather_schedules():
    assert sched("all_gather", "ring", 3, 8) == [B, ("Ring", [[8, 8, 8], [8, 8, 8]], [LOAD_, LOAD_], [8, 8, 8]), B]
    full = pairs(3, lambda r, o: 8, LOAD_, True)
    assert sched("all_gather", "mesh", 3, 8) == [B, ("Mesh", full), B]
    assert sched("all_gather", "mesh", 3, 8, eager_bytes=8) == [("Local", [8, 8, 8]), B, ("Mesh", full)]
    assert sched("all_gather", "mesh", 3, 8, eager_bytes=7) == [B, ("Mesh", full), B]
    # one member: no ring, its own copy only
    assert sched("all_gather", "ring", 1, 8) == [B, ("Mesh", [(0, 0, 8, COPY_)]), B]


def test_reduce_scatter_schedules():
    per = [12, 12, 16]                                   # chunk_bytes(10, 3, 4)
    assert sched("reduce_scatter", "mesh", 3, 40, itemsize=4) == [B, ("Mesh", pairs(3, lambda r, o: per[r], RED_, True)), B]
    # step s, member i: chunk (i - s - 2) mod 3
    assert sched("reduce_scatter", "ring", 3, 40, itemsize=4) == [
        B, ("Ring", [[12, 16, 12], [12, 12, 16]], [RED_, RED_], None), B]
    # itemsize 0 counts as 1: chunks of 40 bytes over 3 members
    per1 = [13, 13, 14]
    assert sched("reduce_scatter", "mesh", 3, 40, itemsize=0) == [B, ("Mesh", pairs(3, lambda r, o: per1[r], RED_, True)), B]
    assert sched("reduce_scatter", "mesh", 3, 40) == sched("reduce_scatter", "mesh", 3, 40, itemsize=1)


def test_all_reduce_schedules():
    per = [12, 12, 16]
    assert sched("all_reduce", "ring", 3, 40, itemsize=4) == [
        B, ("Ring", [[12, 16, 12], [12, 12, 16]], [RED_, RED_], None), B,
        ("Ring", [[16, 12, 12], [12, 16, 12]], [LOAD_, LOAD_], None), B]
    assert sched("all_reduce", "mesh", 3, 40, itemsize=4) == [
        B, ("Mesh", pairs(3, lambda r, o: per[r], RED_, True)), B,
        ("Mesh", pairs(3, lambda r, o: per[o], LOAD_, False)), B]
    whole = pairs(3, lambda r, o: 40, RED_, True)
    assert sched("all_reduce", "mesh", 3, 40, itemsize=4, eager_bytes=40) == [("Local", [40, 40, 40]), B, ("Mesh", whole)]
    assert sched("all_reduce", "mesh", 3, 40, itemsize=4, eager_bytes=39)[0] == B
    # fewer elements than members: the whole buffer, then a local copy back
    assert sched("all_reduce", "mesh", 3, 8, itemsize=4) == [
        B, ("Mesh", pairs(3, lambda r, o: 8, RED_, True)), B, ("Local", [8, 8, 8])]
    # exactly one element per member: chunked
    assert sched("all_reduce", "mesh", 3, 12, itemsize=4) == [
        B, ("Mesh", pairs(3, lambda r, o: 4, RED_, True)), B, ("Mesh", pairs(3, lambda r, o: 4, LOAD_, False)), B]


def test_all_to_all_and_broadcast_schedules():
    assert sched("all_to_all", "ring", 3, 40) == [B, ("Mesh", pairs(3, lambda r, o: 13, LOAD_, True)), B]
    assert sched("all_to_all", "mesh", 3, 2) == [B, ("Mesh", []), B]
    assert sched("broadcast", "mesh", 3, 8, root=1) == [B, ("Mesh", [(0, 1, 8, LOAD_), (2, 1, 8, LOAD_)]), ("RootWait", 1)]
    assert sched("broadcast", "mesh", 2, 8) == [B, ("Mesh", [(1, 0, 8, LOAD_)]), ("RootWait", 0)]
    assert sched("broadcast", "mesh", 3, 0, root=2) == [B, ("RootWait", 2)]
    assert sched("broadcast", "mesh", 1, 8) == [B, ("RootWait", 0)]
    m = S.schedule("broadcast", "mesh", 3, 8, eager_bytes=0)[1]
    assert all(a.dtype == np.int64 for a in (m.reader, m.nbytes))


def test_exchange():
    steps = [norm(s) for s in S.exchange([(np.array([[5, 0], [3, 7]]), S.LOAD)])]
    assert steps == [B, ("Mesh", [(0, 0, 5, COPY_), (1, 0, 3, LOAD_), (1, 1, 7, COPY_)]), B]
    steps = [norm(s) for s in S.exchange([([[0, 2], [4, 1]], S.LOAD_REDUCE), ([[6]], S.HOST_LOAD), ([[9]], S.HOST_STORE)])]
    assert steps == [B, ("Mesh", [(0, 1, 2, RED_), (1, 0, 4, RED_), (1, 1, 1, COPY_)]),
                     ("Mesh", [(0, 0, 6, S.HOST_LOAD)]), ("Mesh", [(0, 0, 9, S.HOST_STORE)]), B]
    assert [norm(s) for s in S.exchange([])] == [B, B]


def test_exchange_barrier_phase_is_a_barrier_between_the_phases_around_it():
    # a user's slice map in three phases (stratacl.fabric): the middle one is a barrier, and its
    # matrix is not read; the phase after it is still timed
    steps = [norm(s) for s in S.exchange([([[0, 2], [4, 0]], S.LOAD), (None, S.BARRIER_PHASE),
                                          ([[0, 8], [0, 0]], S.LOAD_REDUCE)])]
    assert steps == [B, ("Mesh", [(0, 1, 2, LOAD_), (1, 0, 4, LOAD_)]), B, ("Mesh", [(0, 1, 8, RED_)]), B]


def test_peers_read():
    def pr(*a, **k):
        out = S.peers_read(*a, **k)
        assert out.dtype == np.int64
        return out.tolist()
    assert pr("all_gather", "mesh", 1) == [0]
    assert pr("barrier", "mesh", 3) == [0, 0, 0]
    assert pr("sendrecv", "mesh", 3) == [1, 1, 1]
    assert pr("all_reduce", "ring", 3) == [1, 1, 1]
    assert pr("all_to_all", "ring", 3) == [2, 2, 2]
    assert pr("broadcast", "ring", 4, root=2) == [1, 1, 0, 1]
    assert pr("broadcast", "mesh", 3) == [0, 1, 1]
    assert pr("reduce_scatter", "mesh", 4) == [3, 3, 3, 3]


def test_staging_bytes():
    def sb(*a, **k):
        cin, cout = S.staging_bytes(*a, **k)
        return cin.tolist(), cout.tolist()
    assert sb("all_gather", 4, 10) == ([10] * 4, [40] * 4)
    assert sb("reduce_scatter", 4, 10) == ([10] * 4, [2] * 4)
    assert sb("broadcast", 3, 10, root=1) == ([0, 10, 0], [10, 0, 10])
    assert sb("broadcast", 3, 10) == ([10, 0, 0], [0, 10, 10])
    assert sb("barrier", 2, 10) == ([0, 0], [0, 0])
    assert sb("all_reduce", 2, 10) == ([10, 10], [10, 10])
    assert sb("all_to_all", 2, 10) == ([10, 10], [10, 10])


def test_staged_rounds():
    assert S.staged_rounds("barrier", 4, 64, 1) == [64]
    assert S.staged_rounds("all_gather", 4, 0, 1) == [0]
    assert S.staged_rounds("all_gather", 4, 10, None) == [10]
    assert S.staged_rounds("all_gather", 4, 10, 40) == [10]           # output 40 fits
    assert S.staged_rounds("all_gather", 4, 10, 39) == [5, 5]
    # grain = 4 members x 1 byte; 10 units in ceil(43 / 20) = 3 rounds of 4, 4, 2; 3 ragged bytes ride last
    assert S.staged_rounds("reduce_scatter", 4, 43, 20) == [16, 16, 11]
    assert S.staged_rounds("all_to_all", 2, 12, 5, itemsize=2) == [4, 4, 4]
    # grain 4 bytes: 25 units in 4 rounds of 7, 7, 7, 4
    assert S.staged_rounds("all_reduce", 2, 100, 30, itemsize=4) == [28, 28, 28, 16]
    # smaller than one grain: a single round of what there is
    assert S.staged_rounds("reduce_scatter", 4, 3, 1) == [3]


# --- partitioner ---------------------------------------------------------------------------------
def units_rows(u: P.Units) -> list[tuple]:
    return list(zip(u.slice.tolist(), u.offset.tolist(), u.nbytes.tolist(), u.peer.tolist(), u.tier.tolist(),
                    u.cost.tolist()))


def test_cut_into_units_of_the_tier_size():
    u = P.cut([5, 6], [10000, 0], [0, 1], [4096, 8192], [1.0, 2.0], [100.0, 50.0], cores=0)
    assert len(u) == 3
    assert units_rows(u) == [(0, 0, 4096, 5, 0, 1 + 40.96), (0, 4096, 4096, 5, 0, 1 + 40.96),
                             (0, 8192, 1808, 5, 0, 1 + 18.08)]
    u = P.cut([1, 2], [100, 200], [1, 0], [4096, 4096], [1.0, 3.0], [10.0, 20.0])
    assert units_rows(u) == [(0, 0, 100, 1, 1, 3 + 5.0), (1, 0, 200, 2, 0, 1 + 20.0)]


def test_cut_gives_every_core_units_but_not_below_min_unit():
    # 1e6 bytes, 2 cores: units of ceil(1e6 / (16 x 2)) = 31250 bytes (below the tier's 64 KiB)
    u = P.cut([3], [1_000_000], [0], [65536], [0.0], [1.0], cores=2)
    assert len(u) == 32 and set(u.nbytes.tolist()) == {31250}
    assert u.offset.tolist() == [31250 * j for j in range(32)]
    # no core floor: the tier's 64 KiB, 15 full units and a 16960-byte tail
    u = P.cut([3], [1_000_000], [0], [65536], [0.0], [1.0], cores=0)
    assert u.nbytes.tolist() == [65536] * 15 + [16960]
    # 8192 bytes on one core: ceil(8192 / 16) = 512 is below MIN_UNIT (4096)
    u = P.cut([3], [8192], [0], [65536], [0.0], [1.0], cores=1)
    assert u.nbytes.tolist() == [4096, 4096]
    assert (P.UNITS_PER_CORE, P.MIN_UNIT, P.MAX_UNITS, P.UNIT_ALIGN) == (16, 4096, 4096, 65536)


def test_cut_caps_the_number_of_units():
    total = 4096 * 8192
    u = P.cut([0], [total], [0], [4096], [0.0], [1.0], cores=0)
    assert len(u) == 4096 and set(u.nbytes.tolist()) == {8192}


def test_naive_pins_peers_to_core_groups():
    u = P.cut([7, 3], [3 * 4096, 2 * 4096], [0, 0], [4096], [0.0], [1.0], cores=0)
    assert u.peer.tolist() == [7, 7, 7, 3, 3]
    pol = P.naive(u, 4)      # peer 7 -> cores 0-1, peer 3 -> cores 2-3
    assert (pol.partition, pol.cores, pol.generation_us) == ("naive", 4, 0.0)
    assert pol.core.tolist() == [0, 1, 0, 2, 3]
    assert pol.slot.tolist() == [0, 0, 1, 0, 0] and pol.stripe.tolist() == [0, 0, 1, 0, 0]
    assert [x.tolist() for x in pol.lists()] == [[0, 2], [1], [3], [4]]
    assert pol.load(u).tolist() == [8192.0, 4096.0, 4096.0, 4096.0]
    # more peers than cores: peer k -> core k mod C, a core runs its peers in first-seen order
    u = P.cut([0, 1, 2], [2 * 4096, 4096, 4096], [0, 0, 0], [4096], [0.0], [1.0], cores=0)
    pol = P.naive(u, 2)
    assert u.peer.tolist() == [0, 0, 1, 2]
    assert pol.core.tolist() == [0, 0, 1, 0] and pol.slot.tolist() == [0, 1, 0, 2]


def test_naive_groups_when_peers_divide_unevenly():
    u = P.cut([4, 5, 6], [4096] * 3, [0, 0, 0], [4096], [0.0], [1.0], cores=0)
    pol = P.naive(u, 5)      # groups start at 0*5//3, 1*5//3, 2*5//3 = 0, 1, 3
    assert pol.core.tolist() == [0, 1, 3]
    u = P.cut([4, 4, 4, 6], [4096] * 4, [0] * 4, [4096], [0.0], [1.0], cores=0)
    pol = P.naive(u, 5)      # peer 4 -> cores 0, 1 (5 * 1 // 2 = 2 starts peer 6), peer 6 -> cores 2..4
    assert pol.core.tolist() == [0, 1, 0, 2] and pol.slot.tolist() == [0, 0, 1, 0]


def test_balanced_is_lpt():
    cost = np.array([10.0, 7.0, 4.0, 2.0, 1.0])
    u = P.Units(np.arange(5), np.zeros(5, dtype=np.int64), np.ones(5, dtype=np.int64), np.arange(5),
                np.zeros(5, dtype=np.int64), cost)
    pol = P.balanced(u, 2, np.array([8]))
    assert (pol.partition, pol.cores, pol.generation_us) == ("balanced", 2, 0.0)
    # 10 -> core 0, 7 -> 1, 4 -> 1 (7 < 10), 2 -> 0 (10 < 11), 1 -> 1 (11 < 12)
    assert pol.core.tolist() == [0, 1, 1, 0, 1]
    assert pol.slot.tolist() == [0, 0, 1, 1, 2] and pol.stripe.tolist() == [0, 0, 1, 1, 2]
    assert pol.load(u).tolist() == [12.0, 12.0]
    with pytest.raises(ValueError) as e:
        P.balanced(u, 0, np.array([8]))
    assert str(e.value) == "balanced partition: cores must be >= 1, got 0"


def test_partitioner_caches_by_key():
    with pytest.raises(ValueError) as e:
        P.Partitioner("greedy")
    assert str(e.value) == "partition must be one of naive, balanced, got 'greedy'"
    u = P.cut([1, 2], [8192, 4096], [0, 0], [4096], [0.0], [1.0], cores=0)
    part = P.Partitioner()
    assert part.partition == "balanced" and part.generated == 0 and part.total_us == 0.0
    a = part.policy(u, 2, np.array([8]), key="k")
    assert a.partition == "balanced" and a.generation_us > 0 and part.last_generation_us == a.generation_us
    assert part.total_us == a.generation_us and part.generated == 1
    assert part.policy(u, 2, np.array([8]), key="k") is a
    assert part.last_generation_us == 0.0 and part.generated == 1 and part.total_us == a.generation_us
    b = part.policy(u, 2, np.array([8]))            # no key: computed again, not cached
    assert b is not a and part.generated == 2 and part.total_us == a.generation_us + b.generation_us
    assert part.policy(u, 2, np.array([8])) is not b and part.generated == 3
    naive = P.Partitioner("naive")
    assert naive.policy(u, 2, np.array([8])).partition == "naive"


def test_partitioner_cache_is_bounded():
    u = P.cut([1], [4096], [0], [4096], [0.0], [1.0], cores=0)
    part = P.Partitioner("naive")
    for k in range(512):
        part.policy(u, 1, np.array([1]), key=k)
    assert part.generated == 512
    part.policy(u, 1, np.array([1]), key=0)
    assert part.generated == 512                       # all 512 still cached
    part.policy(u, 1, np.array([1]), key=512)          # the 513th clears the cache
    part.policy(u, 1, np.array([1]), key=0)
    assert part.generated == 514


def test_default_unit_bytes_and_fan_out_cap():
    # GB/s = 1e3 bytes/us: 20 us of each cm384 tier, rounded to 64 KiB
    assert P.default_unit_bytes(210e3, 20.0) == 4 * 1024**2
    assert P.default_unit_bytes(170e3, 20.0) == 52 * 65536
    assert P.default_unit_bytes(150e3, 20.0) == 46 * 65536
    assert P.default_unit_bytes(1.0, 1.0) == 65536
    assert P.default_unit_bytes(65536 * 1.5, 1.0) == 2 * 65536     # round half to even: 1.5 -> 2
    assert P.default_fan_out_cap(170e3, None, 24) == 24
    assert P.default_fan_out_cap(170e3, 0.0, 24) == 24
    assert P.default_fan_out_cap(170e3, 0.95 * 196e3 / 24, 24) == 22
    assert P.default_fan_out_cap(1.1, 0.1, 24) == 11     # 11.000000000000002: a float error, not 12
    assert P.default_fan_out_cap(100.0, 30.0, 24) == 4
    assert P.default_fan_out_cap(1e-12, 1.0, 24) == 1


# --- nccl-tests sizes ----------------------------------------------------------------------------
def test_bus_factor():
    assert _sizes.bus_factor("all_reduce", 4) == 1.5
    assert _sizes.bus_factor("all_reduce", 2) == 1.0
    assert _sizes.bus_factor("all_reduce", 1) == 0.0
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert _sizes.bus_factor(op, 4) == 0.75
        assert _sizes.bus_factor(op, 1) == 0.0
    for op in ("broadcast", "sendrecv"):
        assert _sizes.bus_factor(op, 4) == 1.0
        assert _sizes.bus_factor(op, 1) == 1.0
    assert _sizes.bus_factor("barrier", 4) == 0.0
    assert _sizes.bus_factor("gather", 4) == 0.0


def test_shapes():
    Sh = _sizes.Shape
    assert _sizes.shape("barrier", 4, 1000, 4) == Sh(0, 0, 0, 0)
    # 1000 B over 4 ranks of float32: 62 elements per rank, 248 in all
    assert _sizes.shape("all_gather", 4, 1000, 4) == Sh(992, 62, 62, 248)
    assert _sizes.shape("reduce_scatter", 4, 1000, 4) == Sh(992, 62, 248, 62)
    assert _sizes.shape("all_to_all", 4, 1000, 4) == Sh(992, 62, 248, 248)
    assert _sizes.shape("all_to_all", 4, 0, 4) == Sh(0, 0, 0, 0)
    assert _sizes.shape("all_gather", 4, -16, 4) == Sh(0, 0, 0, 0)
    assert _sizes.shape("sendrecv", 4, 1001, 4) == Sh(1000, 250, 250, 250)
    assert _sizes.shape("all_reduce", 4, 1001, 4) == Sh(1000, 250, 250, 0)
    assert _sizes.shape("broadcast", 2, 7, 2) == Sh(6, 3, 3, 0)
    assert _sizes.OPS == ("barrier", "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "broadcast",
                          "sendrecv")


# --- settings ------------------------------------------------------------------------------------
def raises_config(fn, *a) -> str:
    with pytest.raises(ConfigError) as e:
        fn(*a)
    return str(e.value)


def test_parse_size():
    assert _config.parse_size(12345) == 12345
    assert _config.parse_size("4096") == 4096
    assert _config.parse_size("64K") == 64 * 1024
    assert _config.parse_size("64kb") == 64 * 1024
    assert _config.parse_size("512MiB") == 512 * 1024**2
    assert _config.parse_size(" 4 G ") == 4 * 1024**3
    assert _config.parse_size("2t") == 2 * 1024**4
    assert _config.parse_size("1.5K") == 1536
    assert _config.parse_size("7b") == 7
    msg = "not a size: {!r} (examples: 4096, 64K, 512M, 4G)"
    for bad in ("4X", "G", "-1K", "4 K B x", "K4"):
        assert raises_config(_config.parse_size, bad) == msg.format(bad)


def test_parse_chunk_size():
    assert _config.parse_chunk_size("8K") == 8192
    assert _config.parse_chunk_size(4096) == 4096
    for bad in ("0", "6K", -4096, "100"):
        assert raises_config(_config.parse_chunk_size, bad) == f"expected a positive multiple of 4K (4096 bytes), got {bad!r}"


def test_scalar_parsers():
    parse = _config._choice("mesh", "ring")
    assert parse.__name__ == "mesh|ring"
    assert parse(" RING ") == "ring"
    assert raises_config(parse, "tree") == "expected one of mesh, ring, got 'tree'"
    for text in (True, "1", "true", " Yes ", "ON"):
        assert _config._bool(text) is True
    for text in (False, "0", "false", "no", "Off", "", " "):
        assert _config._bool(text) is False
    assert raises_config(_config._bool, "maybe") == "expected a boolean (1/0, true/false), got 'maybe'"
    assert _config._float("2.5") == 2.5 and _config._float(3) == 3.0
    assert raises_config(_config._float, "x") == "expected a number, got 'x'"
    assert _config._int("0x10") == 16 and _config._int("17") == 17 and _config._int(5) == 5
    assert raises_config(_config._int, "1.5") == "expected an integer, got '1.5'"
    with pytest.raises(ConfigError) as e:
        _config._int("x")
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_setting_names_and_types():
    by = {s.name: s for s in _config.SETTINGS}
    assert by["hbm_size"].env == "STRATACL_HBM_SIZE"
    types_ = {n: by[n].type_name for n in ("hbm_size", "chunk_size", "timeout", "cores", "tag_output", "topology",
                                          "registration", "va_base")}
    assert types_ == {"hbm_size": "size", "chunk_size": "size", "timeout": "float", "cores": "int",
                      "tag_output": "bool", "topology": "str", "registration": "roa|jit|pool|staged", "va_base": "int"}
    assert _config.Setting("x", lambda v: v, 0, None, "").type_name == "<lambda>"
    assert _config.Setting("x", object(), 0, None, "").type_name == "str"


def test_config_defaults_environment_and_overrides(monkeypatch):
    c = _config.Config(environ={})
    assert (c.topology, c.hbm_size, c.timeout, c.registration, c.algo, c.cores, c.comm_cores) == (
        "cm384", 4 * 1024**3, 120.0, "roa", "mesh", 48, 24)
    assert (c.chunk_size, c.tag_output, c.debug, c.va_base, c.pool_size) == (2 * 1024**2, False, "off", 0x1000_0000_0000, 0)
    c = _config.Config(environ={"STRATACL_TIMEOUT": "7", "STRATACL_ALGO": "Ring", "OTHER": "x"}, cores="0x8")
    assert (c.timeout, c.algo, c.cores) == (7.0, "ring", 8)
    with pytest.raises(ConfigError) as e:
        _config.Config(environ={"STRATACL_TIMEOUT": "soon"})
    assert str(e.value) == "STRATACL_TIMEOUT='soon': expected a number, got 'soon'"
    assert e.value.__cause__ is None and e.value.__suppress_context__
    monkeypatch.setenv("STRATACL_COMM_CORES", "5")
    assert _config.Config().comm_cores == 5


def test_config_is_typo_proof():
    c = _config.Config(environ={})
    c.algo = "RING"
    assert c.algo == "ring"
    with pytest.raises(ConfigError) as e:
        c.algo = "tree"
    assert str(e.value) == "algo='tree': expected one of mesh, ring, auto, got 'tree'"
    known = ", ".join(s.name for s in _config.SETTINGS)
    with pytest.raises(AttributeError) as e:
        c.timeot
    assert str(e.value) == f"unknown setting 'timeot'; did you mean 'timeout'? (known: {known})"
    with pytest.raises(ConfigError) as e:
        c.zzzzzz = 1
    assert str(e.value) == f"unknown setting 'zzzzzz' (known: {known})"
    with pytest.raises(ConfigError):
        _config.Config(environ={}, timeot=3)


def test_config_as_env_and_repr():
    c = _config.Config(environ={}, tag_output=True, timeout=2.5)
    env = c.as_env()
    assert list(env) == [s.env for s in _config.SETTINGS]
    assert env["STRATACL_TAG_OUTPUT"] == "1" and env["STRATACL_TIMEOUT"] == "2.5"
    assert env["STRATACL_HBM_SIZE"] == str(4 * 1024**3) and env["STRATACL_VA_BASE"] == str(0x1000_0000_0000)
    c.tag_output = False
    assert c.as_env()["STRATACL_TAG_OUTPUT"] == "0"
    assert _config.Config(environ=c.as_env()).as_env() == c.as_env()
    assert repr(c).startswith("Config(topology='cm384', hbm_size=4294967296, timeout=2.5, registration='roa', ")
    assert repr(c).endswith(", va_base=17592186044416)")


def test_check_environment(monkeypatch):
    ok = {s.env: "1" for s in _config.SETTINGS}
    # the job's own variables: the launcher's, the job store's (set by stratacl/jobs/_supervisor.py) and the test hooks
    ok.update({k: "1" for k in ("STRATACL_JOB_ID", "STRATACL_RANK", "STRATACL_WORLD_SIZE", "STRATACL_BOOT",
                                "STRATACL_LAUNCHER_PID", "STRATACL_NPROCS", "STRATACL_JOB_SECRET", "STRATACL_STORE",
                                "STRATACL_TEST_HOST_MEMORY", "STRATACL_TEST_JOB_TAG", "PATH")})
    _config.check_environment(ok)
    for key, msg in (("STRATACL_TIMEOT", "unknown environment variable STRATACL_TIMEOT; did you mean STRATACL_TIMEOUT?"),
                     ("STRATACL_HBMSIZE", "unknown environment variable STRATACL_HBMSIZE; did you mean STRATACL_HBM_SIZE?"),
                     ("STRATACL_DEX", "unknown environment variable STRATACL_DEX"),
                     ("STRATACL_", "unknown environment variable STRATACL_; did you mean STRATACL_TOPOLOGY?")):
        assert raises_config(_config.check_environment, {key: "1"}) == msg
    monkeypatch.setenv("STRATACL_ZZZ", "1")
    assert raises_config(_config.check_environment) == "unknown environment variable STRATACL_ZZZ"


def test_settings_table_rows():
    lines = _config.settings_table().split("\n")
    assert lines[:2] == ["| setting | launcher flag | environment variable | type | default | effect |",
                         "|---|---|---|---|---|---|"]
    assert len(lines) == 2 + len(_config.SETTINGS)
    row = {ln.split(" | ")[0][3:-1]: ln for ln in lines[2:]}
    assert row["hbm_size"].startswith("| `hbm_size` | `--hbm-size` | `STRATACL_HBM_SIZE` | size | `4G` | Capacity ")
    assert row["chunk_size"].startswith("| `chunk_size` | `--chunk-size` | `STRATACL_CHUNK_SIZE` | size | `2M` |")
    assert row["pool_size"].startswith("| `pool_size` | `--pool-size` | `STRATACL_POOL_SIZE` | size | `0` |")
    assert row["va_base"].startswith("| `va_base` | - | `STRATACL_VA_BASE` | int | `0x100000000000` |")
    assert row["timeout"].startswith("| `timeout` | `--timeout` | `STRATACL_TIMEOUT` | float | `120.0` |")
    assert row["tag_output"].endswith("| bool | `False` | Prefix every line a rank prints with `[rank]`. |")


# --- topology validation -------------------------------------------------------------------------
def good_topology() -> dict:
    return {"name": "t", "levels": [{"name": "die", "size": 1, "tier": "hbm"}, {"name": "box", "size": 4, "tier": "link"}],
            "tiers": {"hbm": {"latency_us": 0, "bandwidth_gbps": 1000},
                      "link": {"latency_us": 1.5, "bandwidth_gbps": 100.0}},
            "beyond": "link"}


def topo_error(data: dict, source: str | None = None) -> str:
    with pytest.raises(ConfigError) as e:
        T.from_dict(data) if source is None else T.from_dict(data, source)
    return str(e.value)


def test_from_dict_defaults():
    t = T.from_dict(good_topology())
    assert t.name == "t" and t.beyond == "link" and t.host is None
    assert t.levels == [T.Level("die", 1, "hbm", None), T.Level("box", 4, "link", None)]
    assert t.tiers == {"hbm": T.Tier("hbm", 0.0, 1000.0, False, None, None),
                       "link": T.Tier("link", 1.5, 100.0, False, None, None)}
    assert isinstance(t.tiers["hbm"].latency_us, float) and isinstance(t.tiers["hbm"].bandwidth_gbps, float)
    assert t.contention == T.Contention(None, 1.0, 0.0, 100.0, 690.0)
    assert t.cores == T.Cores(48, 24, None)
    assert t.sdma == T.Sdma(0.5, 1 << 20, 1.0, 0.1, 1, 2.0)
    assert t.compute == T.Compute(None, 1.0)


def test_from_dict_reads_every_optional_field():
    d = good_topology()
    d["tiers"]["link"].update(dedicated=True, unit_bytes=1, fan_out_cap=1)
    d["tiers"]["hbm"].update(unit_bytes=None, fan_out_cap=None, dedicated=None)
    d["levels"][1]["uplink_gbps"] = 50
    d.update(host="hbm", port={"gbps": 20, "fan_in_efficiency": 0.5}, sync={"flag_us": 0.25},
             registration={"map_us": 0, "map_us_per_gib": 3},
             cores={"count": 8, "comm": 8, "issue_gbps": 2}, compute={"peak_tflops": 10, "efficiency": 0.75},
             sdma={"descriptor_us": 0, "max_descriptor_bytes": 1, "efficiency": 0.5, "doorbell_us": 0, "poll_cores": 0,
                   "notify_us": 0})
    t = T.from_dict(d)
    assert t.tiers["link"] == T.Tier("link", 1.5, 100.0, True, 1, 1)
    assert t.tiers["hbm"] == T.Tier("hbm", 0.0, 1000.0, False, None, None)
    assert t.levels[1] == T.Level("box", 4, "link", 50.0) and t.host == "hbm"
    assert t.contention == T.Contention(20.0, 0.5, 0.25, 0.0, 3.0)
    assert t.cores == T.Cores(8, 8, 2.0)
    assert t.sdma == T.Sdma(0.0, 1, 0.5, 0.0, 0, 0.0)
    assert t.compute == T.Compute(10.0, 0.75)
    d.update(port=None, sync=None)
    assert T.from_dict(d).contention == T.Contention(None, 1.0, 0.0, 0.0, 3.0)


def _with(path: str, value):
    d = good_topology()
    obj = d
    keys = path.split("/")
    for k in keys[:-1]:
        obj = obj[int(k)] if isinstance(obj, list) else obj.setdefault(k, {})
    if value is KeyError:
        del obj[keys[-1]]
    else:
        obj[keys[-1]] = value
    return d


TOPOLOGY_ERRORS = [
    ("name", KeyError, "missing field 'name'"),
    ("name", 5, "field 'name' must be str, got 5"),
    ("tiers", [1], "field 'tiers' must be dict, got [1]"),
    ("tiers/link", 5, "missing field tiers.link.'latency_us'"),
    ("tiers/link/latency_us", True, "field tiers.link.'latency_us' must be float, got True"),
    ("tiers/link/latency_us", "1", "field tiers.link.'latency_us' must be float, got '1'"),
    ("tiers/link/bandwidth_gbps", KeyError, "missing field tiers.link.'bandwidth_gbps'"),
    ("tiers/link/latency_us", -0.1, "tiers.link needs latency_us >= 0 and bandwidth_gbps > 0"),
    ("tiers/link/bandwidth_gbps", 0, "tiers.link needs latency_us >= 0 and bandwidth_gbps > 0"),
    ("tiers/link/unit_bytes", 0, "tiers.link needs unit_bytes >= 1 and fan_out_cap >= 1"),
    ("tiers/link/fan_out_cap", 0, "tiers.link needs unit_bytes >= 1 and fan_out_cap >= 1"),
    ("tiers/link/unit_bytes", 1.0, "field tiers.link.'unit_bytes' must be int, got 1.0"),
    ("tiers/link/dedicated", 1, "field tiers.link.'dedicated' must be bool, got 1"),
    ("levels", {}, "field 'levels' must be list, got {}"),
    ("levels", [], "field 'levels' must not be empty"),
    ("levels/1/name", KeyError, "missing field levels[1].'name'"),
    ("levels/1/size", True, "field levels[1].'size' must be int, got True"),
    ("levels/1/size", 0, "field levels[1].'size' must be >= 1, got 0"),
    ("levels/0/tier", "zz", "field levels[0].'tier' names unknown tier 'zz'"),
    ("levels/1/tier", KeyError, "missing field levels[1].'tier'"),
    ("levels/1/uplink_gbps", 0, "field levels[1].'uplink_gbps' must be > 0 (or null), got 0.0"),
    ("beyond", KeyError, "missing field 'beyond'"),
    ("beyond", "zz", "field 'beyond' names unknown tier 'zz'"),
    ("host", "zz", "field 'host' names unknown tier 'zz'"),
    ("port", 3, "field 'port' must be an object, got 3"),
    ("port/gbps", 0, "field port.'gbps' must be > 0 (or null), got 0.0"),
    ("port/fan_in_efficiency", 0, "field port.'fan_in_efficiency' must be in (0, 1], got 0.0"),
    ("port/fan_in_efficiency", 1.01, "field port.'fan_in_efficiency' must be in (0, 1], got 1.01"),
    ("sync/flag_us", -1, "field sync.'flag_us' must be >= 0, got -1.0"),
    ("registration/map_us", -1, "field registration.'map_us' must be >= 0, got -1.0"),
    ("registration/map_us_per_gib", -2, "field registration.'map_us_per_gib' must be >= 0, got -2.0"),
    ("registration", "x", "field 'registration' must be an object, got 'x'"),
    ("cores/comm", 0, "fields cores.'comm' and cores.'count' need 1 <= comm <= count, got 0, 48"),
    ("cores/comm", 49, "fields cores.'comm' and cores.'count' need 1 <= comm <= count, got 49, 48"),
    ("cores/count", 23, "fields cores.'comm' and cores.'count' need 1 <= comm <= count, got 24, 23"),
    ("cores/issue_gbps", 0, "field cores.'issue_gbps' must be > 0 (or null), got 0.0"),
    ("sdma/channels", 2, "field sdma.'channels' is gone: the engine is one pipelined stream at the rank's fabric "
                         "share; slow it with sdma.'efficiency' instead"),
    ("sdma/efficiency", 0, "field sdma.'efficiency' must be in (0, 1], got 0.0"),
    ("sdma/efficiency", 1.5, "field sdma.'efficiency' must be in (0, 1], got 1.5"),
    ("sdma/descriptor_us", -0.5, "field sdma.'descriptor_us' must be >= 0, got -0.5"),
    ("sdma/max_descriptor_bytes", 0, "field sdma.'max_descriptor_bytes' must be >= 1, got 0"),
    ("sdma/doorbell_us", -1, "field sdma.'doorbell_us' must be >= 0, got -1.0"),
    ("sdma/poll_cores", -1, "field sdma.'poll_cores' must be >= 0, got -1"),
    ("sdma/notify_us", -1, "field sdma.'notify_us' must be >= 0, got -1.0"),
    ("sdma/poll_cores", 1.0, "field sdma.'poll_cores' must be int, got 1.0"),
    ("compute/peak_tflops", 0, "field compute.'peak_tflops' must be > 0 (or null), got 0.0"),
    ("compute/efficiency", 0, "field compute.'efficiency' must be in (0, 1], got 0.0"),
    ("compute/efficiency", 2, "field compute.'efficiency' must be in (0, 1], got 2.0"),
    ("compute", [], "field 'compute' must be an object, got []"),
    # every optional field's type error names it
    ("tiers/link/fan_out_cap", 1.0, "field tiers.link.'fan_out_cap' must be int, got 1.0"),
    ("levels/1/uplink_gbps", "x", "field levels[1].'uplink_gbps' must be float, got 'x'"),
    ("host", 3, "field 'host' must be str, got 3"),
    ("port/gbps", "x", "field port.'gbps' must be float, got 'x'"),
    ("port/fan_in_efficiency", "x", "field port.'fan_in_efficiency' must be float, got 'x'"),
    ("sync/flag_us", "x", "field sync.'flag_us' must be float, got 'x'"),
    ("registration/map_us_per_gib", "x", "field registration.'map_us_per_gib' must be float, got 'x'"),
    ("cores/count", 2.0, "field cores.'count' must be int, got 2.0"),
    ("cores/comm", 2.0, "field cores.'comm' must be int, got 2.0"),
    ("cores/issue_gbps", "x", "field cores.'issue_gbps' must be float, got 'x'"),
    ("sdma/efficiency", "x", "field sdma.'efficiency' must be float, got 'x'"),
    ("sdma/notify_us", "x", "field sdma.'notify_us' must be float, got 'x'"),
    ("compute/peak_tflops", "x", "field compute.'peak_tflops' must be float, got 'x'"),
    ("compute/efficiency", "x", "field compute.'efficiency' must be float, got 'x'"),
    ("cores/transfer_us", "x", "field cores.'transfer_us' must be float, got 'x'"),
    ("cores/transfer_us", -1, "field cores.'transfer_us' must be >= 0, got -1.0"),
    # every registration step names its section
    *((f"registration/{key}", -1, f"field registration.'{key}' must be >= 0, got -1.0")
      for key in ("export_us", "import_us", "reserve_va_us", "rdma_us", "rdma_us_per_gib", "metadata_direct_us",
                  "metadata_relay_us")),
    ("registration/rdma_us", 5, "fields registration.'rdma_us' and registration.'rdma_us_per_gib' go together "
                                "(both set, or both null), got 5.0, None"),
    ("registration/rdma_us_per_gib", 2, "fields registration.'rdma_us' and registration.'rdma_us_per_gib' go "
                                        "together (both set, or both null), got None, 2.0"),
    # numbers past the bounds (MAX_NUMBER = 1e12, MAX_INT = 2**40, MAX_RANKS = 2**31), either sign
    ("tiers/link/bandwidth_gbps", 1.5e12,
     "field tiers.link.'bandwidth_gbps' must be a finite number of at most 1e+12, got 1500000000000.0"),
    ("tiers/link/latency_us", -1.5e12,
     "field tiers.link.'latency_us' must be a finite number of at most 1e+12, got -1500000000000.0"),
    ("tiers/link/bandwidth_gbps", float("inf"),
     "field tiers.link.'bandwidth_gbps' must be a finite number of at most 1e+12, got inf"),
    ("tiers/link/unit_bytes", 2**40 + 1,
     "field tiers.link.'unit_bytes' must be at most 1099511627776 (2**40), got 1099511627777"),
    ("levels/1/size", -2**40 - 1, "field levels[1].'size' must be at most 1099511627776 (2**40), got -1099511627777"),
    ("levels/1/size", 2**31 + 1,
     "fields levels[*].'size' multiply to 2147483649 ranks per outermost unit; at most 2147483648 (2**31)"),
]


@pytest.mark.parametrize("path,value,msg", TOPOLOGY_ERRORS, ids=[f"{p}={v!r}" for p, v, _ in TOPOLOGY_ERRORS])
def test_from_dict_names_the_field(path, value, msg):
    assert topo_error(_with(path, value)) == "topology: " + msg
    assert topo_error(_with(path, value), source="file x.json") == "file x.json: " + msg


def test_from_dict_boundaries_are_accepted():
    for path, value in (("tiers/link/latency_us", 0), ("tiers/link/bandwidth_gbps", 1e-9), ("levels/1/size", 1),
                        ("cores/comm", 48), ("cores/comm", 1), ("port/fan_in_efficiency", 1e-9),
                        ("sdma/efficiency", 1e-9), ("compute/efficiency", 1e-9), ("levels/1/uplink_gbps", 1e-9),
                        ("port/gbps", 1e-9), ("cores/issue_gbps", 1e-9), ("compute/peak_tflops", 1e-9),
                        ("sync/flag_us", 0), ("registration/map_us", 0), ("sdma/descriptor_us", 0),
                        ("sdma/max_descriptor_bytes", 1), ("sdma/poll_cores", 0),
                        # the largest number, integer and rank count a topology may hold
                        ("tiers/link/bandwidth_gbps", 1e12), ("tiers/link/unit_bytes", 2**40), ("levels/1/size", 2**31)):
        T.from_dict(_with(path, value))


def test_load(tmp_path):
    cm = T.load("cm384")
    assert cm.name == "cm384" and cm.contention.fan_in_efficiency == T.FAN_IN_EFFICIENCY and cm.host == "host"
    assert cm.cores == T.Cores(48, 24, T.CORE_ISSUE_GBPS, 0.5) and cm.sdma.efficiency == T.SDMA_EFFICIENCY
    flat = T.load("flat")
    assert flat.name == "flat" and flat.beyond == "fabric" and [lv.name for lv in flat.levels] == ["rank"]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(good_topology()))
    assert T.load(str(p)).tiers["link"].latency_us == 1.5
    bad = _with("beyond", "zz")
    p.write_text(json.dumps(bad))
    assert raises_config(T.load, str(p)) == f"topology file {p}: field 'beyond' names unknown tier 'zz'"
    p.write_text("{not json")
    msg = raises_config(T.load, str(p))
    assert msg.startswith(f"topology file {p}: not valid JSON (Expecting property name") and msg.endswith(")")
    p.write_bytes(b'{"name": "\xff"}')
    assert raises_config(T.load, str(p)) == (f"topology file {p}: not UTF-8 text (byte 0xff at offset 10); "
                                             f"a topology is a JSON file")
    p.write_text("[1, 2]")
    assert raises_config(T.load, str(p)) == (f"topology file {p}: must hold a JSON object (with name, levels, tiers, "
                                             f"beyond), got list")
    assert raises_config(T.load, str(tmp_path)) == f"topology file {tmp_path}: cannot read it (Is a directory)"
    missing = str(tmp_path / "none.json")
    assert raises_config(T.load, missing) == f"topology {missing!r}: not a built-in (cm384, flat) and no such file"
    assert raises_config(T.load, "CM384") == "topology 'CM384': not a built-in (cm384, flat) and no such file"


# --- expert routing checks -----------------------------------------------------------------------
def check_idx(idx, experts=8, tokens=None, operation="dispatch"):
    return EB.Buffer._check_idx(types.SimpleNamespace(num_experts=experts), idx, operation, tokens)


def refused(kind, fn, *a, **k) -> str:
    with pytest.raises(kind) as e:
        fn(*a, **k)
    assert type(e.value) is kind
    return str(e.value)


def test_topk_idx_checks():
    idx = np.array([[0, 7], [1, -1], [2, 3]], dtype=np.int64)
    assert check_idx(idx) is idx
    assert check_idx(idx, tokens=3) is idx
    f = np.asfortranarray(idx)
    got = check_idx(f)
    assert got.flags.c_contiguous and got.tolist() == idx.tolist()
    assert check_idx(np.zeros((2, 8), dtype=np.int64)).shape == (2, 8)      # K == E is allowed
    m = "dispatch: topk_idx must be a 2-D numpy array [tokens, K]"
    assert refused(TypeError, check_idx, idx.tolist()) == m
    assert refused(TypeError, check_idx, idx.reshape(-1)) == m
    assert refused(TypeError, check_idx, idx.reshape(3, 2, 1)) == m
    assert refused(TypeError, check_idx, idx.astype(np.int32), operation="combine") == "combine: topk_idx must be int64, got int32"
    assert refused(ValueError, check_idx, idx, tokens=4) == "dispatch: topk_idx has 3 rows for 4 tokens"
    assert refused(ValueError, check_idx, np.zeros((2, 9), dtype=np.int64)) == "dispatch: top-9 exceeds the 8 experts"


def test_row_and_weight_checks():
    for dt in (np.float16, np.float32):
        x = np.zeros((2, 4), dtype=dt)
        assert EB._check_rows(x, "x", "dispatch") is x
    assert refused(TypeError, EB._check_rows, [[1.0]], "y", "combine") == "combine: y must be a numpy array, got list"
    assert refused(TypeError, EB._check_rows, np.zeros(2, dtype=np.int64), "x", "dispatch") == (
        "dispatch: x dtype int64 is not supported (supported: float16, float32)")
    w = np.zeros((2, 3), dtype=np.float32)
    assert EB._check_weights(w, (2, 3), "dispatch") is w
    m = "dispatch: topk_weights must be a float32 array of shape (2, 3), got "
    assert refused(TypeError, EB._check_weights, w.astype(np.float64), (2, 3), "dispatch") == m + "float64 (2, 3)"
    assert refused(TypeError, EB._check_weights, w, (3, 2), "dispatch") == (
        "dispatch: topk_weights must be a float32 array of shape (3, 2), got float32 (2, 3)")
    assert refused(TypeError, EB._check_weights, None, (2, 3), "dispatch") == m + "NoneType"
    assert refused(TypeError, EB._check_weights, [[0.0] * 3] * 2, (2, 3), "dispatch") == m + "list"


def test_routing_header_and_route():
    buf = types.SimpleNamespace(comm=types.SimpleNamespace(size=2), num_experts=4)
    idx = np.array([[0, 3], [2, -1], [1, 0]], dtype=np.int64)     # experts 0, 1 on member 0; 2, 3 on 1
    head = EB.Buffer._header(buf, idx, "dispatch")
    assert head.dtype == np.int64 and head.tolist() == [2, 2, 2, 1, 1, 1]
    assert refused(ValueError, EB.Buffer._header, buf, np.array([[4, 0]], dtype=np.int64), "dispatch") == (
        "dispatch: expert index 4 is outside [-1, 4)")
    msg = refused(ValueError, EB.Buffer._header, buf, np.array([[1, 1]], dtype=np.int64), "low_latency_dispatch")
    assert msg == "low_latency_dispatch: token 0 picks the same expert twice"
    r = _ep.route(idx, 2, 4)
    assert r.dest.dtype == bool and r.dest.tolist() == [[True, True], [False, True], [True, False]]
    assert r.per_rank.dtype == np.int64 and r.per_rank.tolist() == [2, 2]
    assert r.per_expert.dtype == np.int64 and r.per_expert.tolist() == [2, 1, 1, 1]
    r = _ep.route(np.full((2, 1), -1, dtype=np.int64), 2, 4)
    assert r.dest.tolist() == [[False, False], [False, False]] and r.per_expert.tolist() == [0, 0, 0, 0]


def test_partitioner_reports_generation_time_in_microseconds(monkeypatch):
    u = P.cut([1], [4096], [0], [4096], [0.0], [1.0], cores=0)
    ticks = iter([10.0, 10.25, 20.0, 20.5])
    part = P.Partitioner("naive")
    monkeypatch.setattr(P.time, "perf_counter", lambda: next(ticks))
    a = part.policy(u, 1, np.array([1]), key="a")
    b = part.policy(u, 1, np.array([1]))
    monkeypatch.undo()
    assert a.generation_us == 250000.0 and b.generation_us == 500000.0
    assert part.last_generation_us == 500000.0 and part.total_us == 750000.0


# --- edges found by mutation testing (docs/testing.md, "Mutation testing") ------------------------
def test_make_flattens_and_converts_every_column_to_int64():
    i32 = lambda v: np.array(v, dtype=np.int32)     # noqa: E731
    m = SL.make(0, i32([[1, 2]]), i32(IN), i32([8, 16]), OUT, i32(0), i32([1, 2]), LD, i32(3))
    assert rows(m) == [(1, IN, 8, OUT, 0, 1, LD, 3), (2, IN, 16, OUT, 0, 2, LD, 3)]   # a 1-byte slice is kept


def test_all_reduce_one_element_on_one_member_is_chunked_by_default():
    a, b = SL.all_reduce(0, 1, 1, 1)
    assert rows(a) == [(0, IN, 0, IN, 0, 1, ACC, -1)] and len(b) == 0


def test_all_to_all_v_byte_counts_do_not_overflow_int32_counts():
    big = np.array([[2**30]], dtype=np.int32)
    (m,) = SL.all_to_all_v(0, 1, big, big, 4)
    assert rows(m) == [(0, IN, 0, OUT, 0, 2**32, LD, -1)]


def test_ring_steps_of_member_zero_and_of_a_later_chunk():
    (m,) = SL.ring_all_gather_step(2, 4, 8, 0)     # own input, chunk 1, read from offset 0
    assert rows(m) == [(1, IN, 0, OUT, 8, 8, LD, 0), (2, IN, 0, OUT, 16, 8, LD, -1)]
    (m,) = SL.ring_all_reduce_step(0, 3, 10, 4, 3)   # gather t = 1: chunk (0-1-1)%3 = 1 from member 2
    assert rows(m) == [(2, IN, 12, IN, 12, 12, LD, 3)]


def test_schedule_arrays_are_int64():
    steps = S.exchange([(np.array([[1, 2], [3, 4]], dtype=np.int32), S.LOAD)])
    assert steps[1].nbytes.dtype == np.int64 and steps[1].nbytes.tolist() == [1, 2, 3, 4]
    cin, cout = S.staging_bytes("all_gather", 4, np.int32(2**30))
    assert cin.dtype == cout.dtype == np.int64 and cout.tolist() == [2**32] * 4
    for a in S.staging_bytes("barrier", 2, 10):
        assert a.dtype == np.int64
    assert S.peers_read("all_gather", "mesh", np.int32(3)).dtype == np.int64


def test_peers_read_at_two_members_and_sendrecv_alone():
    assert S.peers_read("all_gather", "mesh", 2).tolist() == [1, 1]
    assert S.peers_read("sendrecv", "mesh", 1).tolist() == [0]


def test_staged_rounds_split_all_to_all_on_member_blocks_and_are_ints():
    assert S.staged_rounds("all_to_all", 4, 12, 8) == [8, 4]          # grain 4 bytes, 3 units in 2 rounds
    for r in (S.staged_rounds("reduce_scatter", 4, 43, 20), S.staged_rounds("all_reduce", 2, 100, 30, itemsize=4)):
        assert all(type(x) is int for x in r)


def test_naive_policy_shapes():
    empty = P.cut([], [], [], [4096], [0.0], [1.0], cores=0)
    pol = P.naive(empty, 4)
    assert pol.core.tolist() == [] and pol.slot.tolist() == [] and pol.load(empty).tolist() == [0.0] * 4
    one = P.cut([9], [3 * 4096], [0], [4096], [0.0], [1.0], cores=0)
    pol = P.naive(one, 4)                     # one peer takes every core
    assert pol.core.tolist() == [0, 1, 2] and pol.slot.dtype == np.int64 and pol.core.dtype == np.int64
    assert pol.load(one).tolist() == [4096.0, 4096.0, 4096.0, 0.0]


def test_naive_deals_each_peers_units_in_order():
    # peer 5 has 1 unit, peer 8 has 3: groups of 3 cores, peer 8's j-th unit on core 3 + j
    u = P.cut([5, 8], [4096, 3 * 4096], [0, 0], [4096], [0.0], [1.0], cores=0)
    pol = P.naive(u, 6)
    assert pol.core.tolist() == [0, 3, 4, 5] and pol.slot.tolist() == [0, 0, 0, 0]
    # many interleaved slices of 3 peers on 9 cores: the j-th unit of peer p on core 3p + j % 3, slot j // 3
    peers = [0, 1, 2] * 100
    u = P.cut(peers, [4096] * 300, [0] * 300, [4096], [0.0], [1.0], cores=0)
    pol = P.naive(u, 9)
    j = np.arange(300) // 3
    assert pol.core.tolist() == (3 * np.array(peers) + j % 3).tolist()
    assert pol.slot.tolist() == (j // 3).tolist()


def test_schedule_edges():
    # sendrecv and the ring at two members; a 1-byte block is a transfer
    assert sched("sendrecv", "mesh", 2, 8) == [("Shift", 8)]
    assert sched("all_gather", "ring", 2, 8) == [B, ("Ring", [[8, 8]], [LOAD_], [8, 8]), B]
    assert sched("all_to_all", "mesh", 2, 2) == [B, ("Mesh", pairs(2, lambda r, o: 1, LOAD_, True)), B]
    # a ragged tail of bytes (42 = 10 float32 + 2) is not an element: chunks of 10 elements
    per = [12, 12, 16]
    assert sched("reduce_scatter", "ring", 3, 42, itemsize=4) == [
        B, ("Ring", [[12, 16, 12], [12, 12, 16]], [RED_, RED_], None), B]
    assert sched("all_reduce", "mesh", 3, 42, itemsize=4)[1] == ("Mesh", pairs(3, lambda r, o: per[r], RED_, True))


def test_bus_factor_at_two_ranks():
    assert _sizes.bus_factor("all_gather", 2) == 0.5
    assert _sizes.bus_factor("all_reduce", 3) == 4 / 3


def test_balanced_converts_costs_and_caps():
    cost = np.array([10.0, 7.0, 4.0, 2.0, 1.0])
    args = (np.arange(5), np.zeros(5, dtype=np.int64), np.ones(5, dtype=np.int64), np.arange(5), np.zeros(5, dtype=np.int64))
    pol = P.balanced(P.Units(*args, cost.astype(np.float32)), 2, np.array([8], dtype=np.int32))
    assert pol.core.tolist() == [0, 1, 1, 0, 1] and pol.slot.tolist() == [0, 0, 1, 1, 2]


def test_cut_flattens_its_columns_and_takes_float_unit_sizes():
    u = P.cut([[1, 2]], [[4096, 4096]], [[0, 0]], [4096.0], [0.0], [1.0], cores=0)
    assert units_rows(u) == [(0, 0, 4096, 1, 0, 4096.0), (1, 0, 4096, 2, 0, 4096.0)]
    assert u.nbytes.dtype == np.int64 and u.offset.dtype == np.int64


def test_cut_assumes_one_core_by_default():
    # one core: units of ceil(1e6 / 16) = 62500 bytes (two cores would give 31250)
    u = P.cut([3], [1_000_000], [0], [65536], [0.0], [1.0])
    assert u.nbytes.tolist() == [62500] * 16


def test_partitioner_starts_with_no_generation_time():
    part = P.Partitioner("naive")
    assert part.last_generation_us == 0.0 and type(part.last_generation_us) is float


# --- the full-mesh barrier's flag latencies (ub/_clock.py FlagMesh) ------------------------------

@pytest.mark.parametrize("topology", ["cm384", "flat", "nvl72-like.json"])
def test_the_barrier_waits_for_every_flag_at_its_tiers_latency(topology):
    """t_i after the barrier = max over j of (t_j + flag latency j -> i), t_i for j = i: worked
    pair by pair from BandwidthSharing.flag_us, for member sets in and out of order, with tied clocks."""
    from stratacl.ub._clock import FlagMesh
    from stratacl.ub._sharing import BandwidthSharing
    from pathlib import Path
    if topology.endswith(".json"):
        topology = str(Path(__file__).resolve().parent.parent / "examples" / "topologies" / topology)
    f = BandwidthSharing(T.load(topology))
    pairs: dict = {}

    def flag_us(signaller, waiter) -> float:
        # the trials draw from 200 ranks: a pair's latency is asked again and again (pure: one call)
        key = (int(signaller), int(waiter))
        if key not in pairs:
            pairs[key] = float(f.flag_us(signaller, waiter))
        return pairs[key]

    rng = np.random.default_rng(7)
    for trial in range(60):
        n = int(rng.integers(1, 90))
        m = rng.choice(200, n, replace=False)
        if trial % 2:
            m = np.sort(m)
        t = rng.random(n) * 20 if trial % 3 else np.round(rng.random(n) * 2)
        want = [max(t[j] + (0.0 if j == i else flag_us(m[j], m[i])) for j in range(n)) for i in range(n)]
        mesh = FlagMesh.of(f, m)
        assert mesh.after(t).tolist() == want
        assert mesh.matrix()[0].tolist() == [0.0 if j == 0 else flag_us(m[j], m[0]) for j in range(n)]


# --- bounded settings (stratacl._config._at_least) ----------------------------------------------
def test_positive_and_nonnegative_settings_refuse_their_boundary_exactly():
    pos, nonneg = _config._positive(_config._float), _config._nonnegative(_config._int)
    assert pos("0.5") == 0.5 and pos(3) == 3.0
    assert nonneg("0") == 0 and nonneg("0x10") == 16
    for bad, text in ((pos, "0"), (pos, "-1"), (pos, "nan")):
        with pytest.raises(ConfigError) as e:
            bad(text)
        assert str(e.value) == f"expected a number > 0, got {text!r}"
    for text in ("-1", -3):
        with pytest.raises(ConfigError) as e:
            nonneg(text)
        assert str(e.value) == f"expected a number >= 0, got {text!r}"
    with pytest.raises(ConfigError) as e:
        _config._at_least(_config._float, 2.5, strict=False)("2")
    assert str(e.value) == "expected a number >= 2.5, got '2'"
    assert _config._at_least(_config._float, 2.5, strict=False)("2.5") == 2.5
    # the bound keeps the parser's name, which the settings table shows as the type
    assert pos.__name__ == "_float" and nonneg.__name__ == "_int"
    timeout = next(s for s in _config.SETTINGS if s.name == "timeout")
    cores = next(s for s in _config.SETTINGS if s.name == "cores")
    hbm = next(s for s in _config.SETTINGS if s.name == "hbm_size")
    assert (timeout.type_name, cores.type_name, hbm.type_name) == ("float", "int", "size")
