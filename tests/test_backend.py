"""The fabric-native backend: slice maps, data executor, partitioners, core model, SDMA, profiler."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

import stratacl
from stratacl.bench import _command as _cli
from stratacl.collectives import _backend as B
from stratacl.collectives import _partition as P
from stratacl.collectives import _schedule as S
from stratacl.collectives import _kernels
from stratacl.collectives import _slices as SL
from stratacl.runtime.pipeline import EAGER_BYTES
from stratacl.ub._clock import FabricModel, model_call
from stratacl.ub._compute import ComputeJob, overlap
from stratacl.ub._profile import Profiler, profile_call, write_chrome_trace
from helpers import ranks

MIB = 1 << 20


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# --- slice maps cover exactly what each rank must receive -----------------------------------
def _coverage(maps, out_bytes, buf):
    cov = np.zeros(out_bytes, dtype=np.int64)
    for m in maps:
        for d, b, db in zip(m.dst.tolist(), m.nbytes.tolist(), m.dst_buf.tolist()):
            if db == buf:
                cov[d:d + b] += 1
    return cov


@pytest.mark.parametrize("n", ranks(1, 2, 3, 8, 32))
def test_slice_maps_cover_every_output_byte_once(n):
    M = 4 * 13
    for me in range(n):
        assert (_coverage(SL.all_gather(me, n, M), n * M, SL.OUT) == 1).all()
        assert (_coverage(SL.all_to_all(me, n, n * 8), n * 8, SL.OUT) == 1).all()
        rs = SL.reduce_scatter(me, n, 5 * n, 4)
        assert sorted(rs[0].peer.tolist()) == list(range(n))          # every member's operand once
        assert (rs[0].nbytes == 20).all()
        ar = SL.all_reduce(me, n, 10_000, 4)
        cov = _coverage(ar[1:], 40_000, SL.IN) + _coverage([SL.make(me, 0, 0, 0, 0, 0, 0, 0)], 40_000, SL.IN)
        e = SL.chunk_edges(10_000, n, 4)
        own = np.zeros(40_000, dtype=np.int64)
        own[e[me]:e[me + 1]] = 1
        assert (cov + own == 1).all()                                  # others' chunks pulled, own reduced
        b = SL.broadcast(me, n, 64, root=n - 1)[0]
        assert b.total == (0 if me == n - 1 else 64)


def test_slice_maps_match_the_models_mesh_flows():
    n, M = 8, 3 * MIB
    step = [s for s in S.schedule("all_gather", "mesh", n, M, eager_bytes=EAGER_BYTES) if isinstance(s, S.Mesh)][0]
    for me in range(n):
        sm = SL.all_gather(me, n, M)[0]
        mine = np.bincount(step.owner[step.reader == me], step.nbytes[step.reader == me], minlength=n)
        assert (sm.per_peer(n) == mine).all()


def test_all_to_all_v_slices_follow_the_counts():
    n = 4
    rng = np.random.default_rng(1)
    send = rng.integers(0, 5, (n, n))
    for me in range(n):
        m = SL.all_to_all_v(me, n, send, send.T, 8)[0]
        assert m.total == int(send[:, me].sum()) * 8


# --- the backend's executor: exact bytes in one process --------------------------------------------------
@pytest.fixture(params=["cached", "streaming"])
def stores(request):
    """Run an executor test with ordinary stores and again with every copy of 4 KiB or more
    written by streaming stores (which phases use once their writes overflow the cache), for
    plain phases and for phases whose sources every member reads."""
    every = 0 if request.param == "streaming" else 1 << 62
    old = _kernels.stream_footprint(every), _kernels.shared_stream_footprint(every)
    yield request.param
    _kernels.stream_footprint(old[0])
    _kernels.shared_stream_footprint(old[1])


def _cpus_in(path: str) -> int:
    with open(path) as f:
        parts = [p.split("-") for p in f.read().strip().split(",") if p]
    return sum(int(p[-1]) - int(p[0]) + 1 for p in parts)


def _size_in(path: str) -> int:
    with open(path) as f:
        text = f.read().strip()
    return int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1], 0)


def test_streaming_starts_at_the_cache_these_cores_may_use():
    """Phases stream once their writes pass the last-level cache, counted at most 16 MiB per
    CPU that shares it: a VM can be shown its host's whole L3 (480 MiB for 2 vCPUs)."""
    index3 = "/sys/devices/system/cpu/cpu0/cache/index3"
    if not os.path.exists(f"{index3}/size"):
        pytest.skip("no last-level cache in sysfs on this host")
    llc = _size_in(f"{index3}/size")
    expected = min(llc, _cpus_in(f"{index3}/shared_cpu_list") * (16 << 20))
    assert _kernels.stream_footprint() == expected
    # where the reported cache was not believed, shared sources are kept in the private caches
    index2 = "/sys/devices/system/cpu/cpu0/cache/index2/size"
    if expected < llc and os.path.exists(index2):
        l2 = _size_in(index2) * os.cpu_count()
        assert _kernels.shared_stream_footprint() == min(l2, expected)
    else:
        assert _kernels.shared_stream_footprint() == expected


def test_streaming_copies_are_exact_at_any_alignment():
    rng = np.random.default_rng(3)
    for n in (0, 1, 63, 64, 4095, 4096, 4097, 65536 + 13, 1 << 20):
        for src_off, dst_off in ((0, 0), (3, 0), (0, 17), (5, 63)):
            src = rng.integers(0, 255, n + 128, dtype=np.uint8)
            dst = np.zeros(n + 128, np.uint8)
            for stream in (0, 1):
                dst[:] = 0
                _kernels.copy_many(np.array([[_addr(dst) + dst_off, _addr(src) + src_off, n]], np.int64), stream)
                assert dst[dst_off:dst_off + n].tobytes() == src[src_off:src_off + n].tobytes()
                assert not dst[:dst_off].any() and not dst[dst_off + n:].any()


def test_phases_whose_sources_every_member_reads_are_marked():
    n, M = 4, 4096
    plain = B.compile(SL.all_gather(1, n, M)[0])
    shared = B.compile(SL.all_gather(1, n, M)[0], shared=True)
    assert set(plain.table[:, 0].tolist()) == {B.COPY}
    assert set(shared.table[:, 0].tolist()) == {B.COPY_SHARED}
    assert (shared.table[:, 1:] == plain.table[:, 1:]).all()


def test_plain_load_phases_compile_to_the_same_plan_by_the_short_path():
    """compile() builds phases of plain LOAD slices column by column (the MoE row plans, new at
    every routing); its plan must be the general path's, field for field."""
    rng = np.random.default_rng(3)
    for me, n, s in ((0, 1, 0), (2, 4, 1), (5, 8, 40)):
        peer = rng.integers(0, n, s)
        smap = SL.make(me, peer, SL.IN, rng.integers(0, 1 << 20, s), rng.choice([SL.OUT, SL.SCRATCH], s),
                       rng.integers(0, 1 << 20, s), rng.integers(1, 4096, s), SL.LOAD)
        short, general = B.compile(smap), B._compile_any(smap, 1, False)
        assert short.table.tobytes() == general.table.tobytes()
        assert short.reductions.shape == general.reductions.shape == (0, B.PLAN_COLUMNS)
        assert (short.local, short.remote, short.written, short.has_copies) == \
               (general.local, general.remote, general.written, general.has_copies)
        for name in ("peer", "src_buf", "src", "dst_buf", "dst", "nbytes", "op", "flag"):
            assert np.array_equal(getattr(short.copies, name), getattr(general.copies, name)), name


def test_data_executor_all_gather_and_all_to_all_are_exact(stores):
    n, M = 5, 4096 + 8
    ins = [np.random.default_rng(p).integers(0, 255, M, dtype=np.uint8) for p in range(n)]
    outs = [np.zeros(n * M, dtype=np.uint8) for _ in range(n)]
    bases = np.array([[_addr(ins[p]), _addr(outs[p]), 0] for p in range(n)]).T.copy()
    for shared in (False, True):
        for me in range(n):
            outs[me][:] = 0
            for phase in SL.all_gather(me, n, M):
                B.execute(phase, bases, shared=shared)
            assert (outs[me] == np.concatenate(ins)).all()
    a2a = [np.zeros(M - 8 + 0, dtype=np.uint8) for _ in range(n)]
    ins2 = [np.random.default_rng(10 + p).integers(0, 255, 4095 + 5, dtype=np.uint8)[:4095 // n * n] for p in range(n)]
    bases = np.array([[_addr(ins2[p]), _addr(a2a[p]), 0] for p in range(n)]).T.copy()
    b = ins2[0].size // n
    for me in range(n):
        B.execute(SL.all_to_all(me, n, ins2[0].size)[0], bases)
        assert (a2a[me][:n * b] == np.concatenate([x[me * b:(me + 1) * b] for x in ins2])).all()


@pytest.mark.parametrize("op", ["sum", "max", "avg"])
def test_data_executor_reductions_in_rank_order(op, stores):
    n, count = 6, 2003 * 6
    ins = [np.random.default_rng(p).standard_normal(count).astype(np.float32) for p in range(n)]
    ref = ins[0].copy()
    uf = {"sum": np.add, "max": np.maximum, "avg": np.add}[op]
    for p in range(1, n):
        uf(ref, ins[p], out=ref)
    if op == "avg":
        ref /= np.float32(n)
    outs = [np.zeros(count // n, dtype=np.float32) for _ in range(n)]
    bases = np.array([[_addr(ins[p]), _addr(outs[p]), 0] for p in range(n)]).T.copy()
    for me in range(n):
        B.execute(SL.reduce_scatter(me, n, count, 4)[0], bases, np.float32, op)
        assert outs[me].tobytes() == ref[me * (count // n):(me + 1) * (count // n)].tobytes()


def test_data_executor_in_place_all_reduce_two_phases(stores):
    n, count = 4, 10_000
    bufs = [np.arange(count, dtype=np.int64) * (p + 1) for p in range(n)]
    scratch = [np.zeros(count, dtype=np.int64) for _ in range(n)]
    bases = np.array([[_addr(bufs[p]), 0, _addr(scratch[p])] for p in range(n)]).T.copy()
    maps = [SL.all_reduce(me, n, count, 8) for me in range(n)]
    for phase in range(2):                     # a barrier between phases: every rank finishes phase 1 first
        for me in range(n):
            B.execute(maps[me][phase], bases, np.int64, "sum")
    for me in range(n):
        assert (bufs[me] == np.arange(count) * 10).all()


# --- partitioners ------------------------------------------------------------------------------
def _units(n=32, per=128 * MIB, me=0):
    m = FabricModel("cm384", eager_bytes=EAGER_BYTES)
    f = m.fabric
    peers = np.array([p for p in range(n) if p != me])
    tiers = f.tier_of(np.full(peers.size, me), peers)
    return P.cut(peers, np.full(peers.size, per), tiers, m.unit_bytes, f.latency, np.minimum(m._beta, m.issue_rate), 24), m


@pytest.mark.parametrize("partition", P.PARTITIONS)
def test_every_unit_assigned_once_and_lists_are_orderly(partition):
    units, m = _units()
    pol = P.Partitioner(partition).policy(units, 24, m.fan_out_cap)
    assert pol.core.shape == (len(units),) and ((0 <= pol.core) & (pol.core < 24)).all()
    pairs = set(zip(pol.core.tolist(), pol.slot.tolist()))
    assert len(pairs) == len(units)                       # one unit per (core, slot)
    for lst in pol.lists():
        assert sorted(pol.slot[lst].tolist()) == list(range(lst.size))
    # bytes conserved
    assert units.nbytes.sum() == 31 * 128 * MIB


def test_balanced_respects_the_fan_out_cap_and_beats_naive():
    units, m = _units()
    caps = np.full(m.fan_out_cap.size, 2)
    pol = P.balanced(units, 24, caps)
    fan = {}
    for k, p in zip(pol.stripe.tolist(), units.peer.tolist()):
        fan[(k, p)] = fan.get((k, p), 0) + 1
    assert max(fan.values()) <= 2
    naive = P.naive(units, 24)
    assert pol.load(units).max() <= naive.load(units).max()
    assert pol.load(units).max() / pol.load(units).min() < 1.05


def test_policies_are_deterministic_and_cached():
    units, m = _units()
    a = P.balanced(units, 24, m.fan_out_cap)
    b = P.balanced(units, 24, m.fan_out_cap)
    assert (a.core == b.core).all() and (a.slot == b.slot).all()
    part = P.Partitioner("balanced")
    part.policy(units, 24, m.fan_out_cap, key="k")
    assert part.last_generation_us > 0
    part.policy(units, 24, m.fan_out_cap, key="k")
    assert part.last_generation_us == 0.0


def _balanced_reference(units, cores, caps):
    # P.balanced as it was in pure Python, before its loop moved to C (_lpt.c): the oracle
    import heapq
    U = len(units)
    npeers = max(np.unique(units.peer).size, 1)
    cap = np.maximum(np.asarray(caps, dtype=np.int64)[units.tier], -(-cores // npeers))
    # decreasing cost; equal costs interleave peers (each peer's first unit, then second, ...)
    within = np.zeros(U, dtype=np.int64)
    o = np.lexsort((units.offset, units.peer))
    grp = units.peer[o]
    starts = np.r_[0, np.nonzero(grp[1:] != grp[:-1])[0] + 1]
    firsts = np.repeat(starts, np.diff(np.r_[starts, U]))
    within[o] = np.arange(U) - firsts
    order = np.lexsort((units.peer, within, -units.cost)).tolist()
    cost, peer, capl = units.cost.tolist(), units.peer.tolist(), cap.tolist()
    core = np.empty(U, dtype=np.int64)
    slot = np.empty(U, dtype=np.int64)
    stripe = np.empty(U, dtype=np.int64)
    heap = [(0.0, c, 0, 0) for c in range(cores)]       # (load, core, next stripe, next slot)
    fan: dict = {}                                       # (stripe, peer) -> cores targeting it
    pending = order
    while pending:
        load, c, k, s = heapq.heappop(heap)
        pick = -1
        for i, u in enumerate(pending):
            if fan.get((k, peer[u]), 0) < capl[u]:
                pick = i
                break
            if i > 4 * cores:          # the next eligible unit is far: this stripe is full for c
                break
        if pick < 0:
            heapq.heappush(heap, (load, c, k + 1, s))   # c issues nothing more in stripe k
            continue
        u = pending.pop(pick)
        fan[(k, peer[u])] = fan.get((k, peer[u]), 0) + 1
        core[u], slot[u], stripe[u] = c, s, k
        heapq.heappush(heap, (load + cost[u], c, k + 1, s + 1))
    return P.Policy("balanced", cores, core, slot, stripe, 0.0)


def _random_units(rng):
    U = int(rng.integers(0, 2000 if rng.random() < 0.1 else 400))
    ids = rng.choice(np.arange(-3, 1000), int(rng.integers(1, 65)), replace=False)
    peer = ids[rng.integers(0, ids.size, U)]
    kind = rng.integers(0, 4)
    if kind == 0:                              # few distinct costs: ties everywhere
        cost = rng.choice([1.0, 2.0, 2.5, 7.0], U)
    elif kind == 1:
        cost = np.round(rng.uniform(1, 40, U), 1)
    elif kind == 2:
        cost = rng.uniform(0.1, 100, U)
    else:                                      # one cost: the order is all tie-breaking
        cost = np.full(U, 3.0)
    if U and rng.random() < 0.05:              # non-finite costs follow the same comparisons
        cost[rng.integers(0, U, 3)] = rng.choice([np.inf, -np.inf, np.nan], 3)
    offset = rng.integers(0, 4, U) * 65536 if rng.random() < 0.3 else rng.permutation(U) * 65536
    nbytes = rng.integers(1, 1 << 20, U)
    return P.Units(np.zeros(U, dtype=np.int64), offset, nbytes, peer, rng.integers(0, 4, U), cost)


def _same_policy(units, cores, caps):
    got, want = P.balanced(units, cores, caps), _balanced_reference(units, cores, caps)
    for name in ("core", "slot", "stripe"):
        assert getattr(got, name).tolist() == getattr(want, name).tolist(), (name, len(units), cores, caps)


def test_native_balanced_matches_the_python_reference():
    rng = np.random.default_rng(20261129)
    for _ in range(300):
        units = _random_units(rng)
        caps = rng.integers(0, 9, 4) if rng.random() < 0.8 else np.full(4, 1)
        _same_policy(units, int(rng.integers(1, 49)), caps)
    for n, me in ((2, 0), (3, 2), (8, 5), (32, 0), (32, 17)):
        for per in (1 * MIB, 128 * MIB):
            units, m = _units(n, per, me)
            for cores in (1, 7, 24, 48):
                for caps in (m.fan_out_cap, np.full(m.fan_out_cap.size, 1), np.full(m.fan_out_cap.size, 2)):
                    _same_policy(units, cores, caps)


def test_native_balanced_rejects_bad_input():
    from stratacl.collectives import _lpt
    units, m = _units(8)
    with pytest.raises(ValueError, match="cores"):
        P.balanced(units, 0, m.fan_out_cap)
    U = 5
    good = dict(order=np.arange(U), cost=np.ones(U), peer=np.zeros(U, dtype=np.int64),
                cap=np.ones(U, dtype=np.int64), cores=2)

    def call(**kw):
        a = {**good, **kw}
        out = [np.empty(U, dtype=np.int64) for _ in range(3)] if "out" not in kw else a.pop("out")
        a.pop("out", None)
        _lpt.lpt(a["order"], a["cost"], a["peer"], a["cap"], a["cores"], *out)
        return out

    core, slot, stripe = call()
    assert sorted(zip(core.tolist(), slot.tolist())) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    ro = np.empty(U, dtype=np.int64)
    ro.flags.writeable = False
    # each bad argument is refused by its own check, named in the message
    bad = [(dict(cores=0), r"cores must be >= 1 .*got 0$"), (dict(cores=-3), r"cores must be >= 1 .*got -3$"),
           (dict(cores=10**30), r"cores must be >= 1 \(and fit in memory\)"),
           (dict(order=np.arange(U - 1)), r"cost has 5 elements, expected 4"),
           (dict(cost=np.ones(U + 1)), r"cost has 6 elements, expected 5"),
           (dict(order=np.array([0, 1, 2, 3, 3])), r"permutation of 0\.\.4, got 3 a second time"),
           (dict(order=np.array([0, 1, 2, 3, 5])), r"permutation of 0\.\.4, got 5 at position 4"),
           (dict(peer=np.array([0, 0, 0, 0, U])), r"peer must be dense indices in \[0, 5\), got 5 for unit 4"),
           (dict(peer=np.array([0, -1, 0, 0, 0])), r"peer must be dense indices in \[0, 5\), got -1 for unit 1"),
           (dict(cap=np.zeros(U, dtype=np.int64)), r"cap must be >= 1 .*got 0 for unit 0"),
           (dict(cost=np.ones(U, dtype=np.float32)), r"cost must be float64"),
           (dict(order=np.arange(U, dtype=np.int32)), r"order must be int64"),
           (dict(order=np.repeat(np.arange(U), 2)[::2]), r"order must be a C-contiguous int64 array"),
           (dict(cost=[1.0] * U), r"cost must be a C-contiguous float64 array, got list"),
           (dict(out=[np.empty(U, dtype=np.int64), np.empty(U - 1, dtype=np.int64), np.empty(U, dtype=np.int64)]),
            r"slot has 4 elements, expected 5"),
           (dict(out=[ro, np.empty(U, dtype=np.int64), np.empty(U, dtype=np.int64)]),
            r"core must be a C-contiguous writable int64 array")]
    for kw, words in bad:
        with pytest.raises(ValueError, match="^lpt: .*" + words):
            call(**kw)
    with pytest.raises(TypeError, match=r"takes 8 arguments, got 1"):
        _lpt.lpt(np.arange(U))


# --- the model: Fig. 16, Fig. 6b, SDMA, overlap ----------------------------------------------
def test_naive_has_a_core_tail_balanced_does_not():
    t, gap = {}, {}
    for part in P.PARTITIONS:
        e = stratacl.estimate("all_gather", 32, 32 * 128 * MIB, partition=part)
        t[part], gap[part] = e.time_us, e.core_gap
    assert gap["naive"] > 0.30 and gap["balanced"] < 0.05
    assert t["balanced"] < 0.9 * t["naive"]


def test_few_cores_cannot_fill_the_port():
    bw = {c: stratacl.estimate("all_gather", 32, 32 * 128 * MIB, comm_cores=c).busbw for c in (1, 8, 24, 48)}
    assert bw[1] < bw[8] < bw[24] and bw[24] >= 0.95 * bw[48]
    assert bw[1] == pytest.approx(7.76 * 31 / 32, rel=0.05)       # one core: its issue rate


def test_sdma_is_a_little_slower_and_frees_the_cores():
    mte = stratacl.estimate("all_gather", 32, 32 * 128 * MIB, path="mte")
    sdma = stratacl.estimate("all_gather", 32, 32 * 128 * MIB, path="sdma")
    assert 1.0 < sdma.time_us / mte.time_us < 1.2
    assert sdma.core_busy_us < 0.1 * mte.core_busy_us


def test_sdma_engine_is_one_pipelined_stream_at_its_fraction_of_the_share():
    from stratacl.sdma._offload import run_sdma
    from stratacl.ub._topology import Sdma
    eng = Sdma(descriptor_us=0.5, max_descriptor_bytes=1000, doorbell_us=0.1, efficiency=1.0)
    bell = 0.5 + 0.1
    # a lone descriptor streams at the whole share (100 bytes/us) and exposes its latency once
    one = run_sdma(np.array([400]), np.array([2.0]), np.array([0]), np.array([0]), 4, 100.0, eng)
    assert one.end == pytest.approx(bell + 400 / 100 + 2.0)
    # two queues rung together: the second descriptor's requests follow the first's, its latency
    # overlaps the first's; a unit over max_descriptor_bytes becomes two back-to-back descriptors
    two = run_sdma(np.array([400, 1500]), np.array([2.0, 3.0]), np.array([0, 1]), np.array([0, 0]), 4, 100.0, eng)
    assert two.desc_core.tolist() == [0, 1, 1]
    assert two.desc_end.tolist() == pytest.approx([bell + 4 + 2.0, bell + 14 + 3.0, bell + 19 + 3.0])
    # a queue rung later finds the engine idle: its descriptor starts at its own doorbell
    late = run_sdma(np.array([10, 100, 100]), np.array([1.0] * 3), np.array([0, 1, 1]), np.array([0, 0, 1]), 4,
                    100.0, eng)
    assert late.desc_start.tolist() == pytest.approx([bell, 2 * 0.5 + 0.1, 2 * 0.5 + 0.1 + 1.0])
    # an engine at half efficiency streams at half the share: 50 bytes/us
    half = run_sdma(np.array([400]), np.array([2.0]), np.array([0]), np.array([0]), 4, 100.0,
                    dataclasses.replace(eng, efficiency=0.5))
    assert half.end == pytest.approx(bell + 400 / 50 + 2.0)
    # notify mode: the notify record's delay on top; no core polls
    note = run_sdma(np.array([400]), np.array([2.0]), np.array([0]), np.array([0]), 4, 100.0, eng, "notify")
    assert note.end == pytest.approx(one.end + eng.notify_us) and np.isnan(note.poll_end).all()


def test_a_topology_naming_sdma_channels_is_refused():
    from stratacl._errors import ConfigError
    from stratacl.ub import _topology
    data = dict(_topology._CM384, sdma=dict(_topology._CM384["sdma"], channels=4))
    with pytest.raises(ConfigError, match="sdma.'channels' is gone"):
        _topology.from_dict(data)
    with pytest.raises(ConfigError, match=r"sdma.'efficiency' must be in \(0, 1\]"):
        _topology.from_dict(dict(_topology._CM384, sdma={"efficiency": 1.5}))


def test_compute_overlap_slows_less_with_sdma():
    job = ComputeJob(cores=40, duration_us=30_000.0)
    slow = {p: overlap(FabricModel("cm384", path=p, eager_bytes=EAGER_BYTES), "all_gather", "mesh", range(32), 128 * MIB, job).slowdown
            for p in ("mte", "sdma")}
    assert slow["mte"] > 0.2 and slow["sdma"] < 0.05
    first = overlap(FabricModel("cm384", eager_bytes=EAGER_BYTES), "all_gather", "mesh", range(32), 128 * MIB, ComputeJob(40, 1000.0),
                    compute_first=True)
    assert first.comm_us > stratacl.estimate("all_gather", 32, 32 * 128 * MIB).time_us   # 8 cores left for comm


def test_core_model_is_deterministic():
    a = model_call(FabricModel("cm384", partition="naive", eager_bytes=EAGER_BYTES), "all_gather", "mesh", range(32), 8 * MIB, np.zeros(32))
    b = model_call(FabricModel("cm384", partition="naive", eager_bytes=EAGER_BYTES), "all_gather", "mesh", range(32), 8 * MIB, np.zeros(32))
    assert a.tobytes() == b.tobytes()


# --- profiler -----------------------------------------------------------------------------------
def test_profiler_markers_and_summary():
    p = Profiler(3)
    p.begin(0, "data", 1.0)
    p.end(0, "data", 5.0)
    p.record(1, "data", 0.0, 4.0)
    p.record(1, "my-stage", 4.0, 6.0)
    s = p.summary()
    assert s["completion_us"] == {0: 5.0, 1: 4.0} and s["gap"] == pytest.approx(0.2)
    assert p.timelines()[1][1] == ("my-stage", 4.0, 6.0)
    with pytest.raises(ValueError, match="without a begin"):
        p.end(2, "data", 1.0)


@pytest.mark.parametrize("path", ["mte", "sdma"])
def test_chrome_trace_is_valid_with_one_track_per_core(tmp_path, path):
    m = FabricModel("cm384", path=path, eager_bytes=EAGER_BYTES)
    per = 32 * MIB          # enough units for every core on both paths (a core with nothing to do has no track)
    profs = profile_call(m, "all_gather", "mesh", range(8), per, ranks=[0, 5])
    out = write_chrome_trace(str(tmp_path / "t.json"), profs)
    doc = json.load(open(out))
    ev = doc["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert {pid for pid, _ in names} == {0, 5}
    cores = {tid for (pid, tid), nm in names.items() if pid == 0 and nm.startswith("core ")}
    assert cores == set(range(24))
    stages = {e["name"] for e in ev if e["ph"] == "X"}
    assert "sync" in stages and ({"data"} if path == "mte" else {"descriptor", "engine"}) <= stages
    assert all(e["dur"] >= 0 for e in ev if e["ph"] == "X")
    end = max(e["ts"] + e["dur"] for e in ev if e["ph"] == "X" and e["pid"] == 0)
    t = model_call(m, "all_gather", "mesh", range(8), per, np.zeros(8))
    assert end == pytest.approx(t[0])


# --- bench --------------------------------------------------------------------------------------
def test_bench_estimate_with_backend_flags(tmp_path, capsys):
    js = tmp_path / "r.json"
    rc = _cli.main(["all_gather", "-n", "8", "-b", "1M", "-e", "4M", "--estimate", "--cores", "48", "--comm-cores",
                    "16", "--partition", "naive", "--path", "sdma", "--profile", str(tmp_path / "prof"), "-J", str(js)])
    assert rc == 0
    doc = json.load(open(js))
    assert doc["header"]["partition"] == "naive" and doc["header"]["path"] == "sdma"
    for r in doc["rows"]:
        assert 0 <= r["core_gap"] <= 1 and r["core_busy_us"] > 0
    assert len(list((tmp_path / "prof").glob("trace-*.json"))) == 2 * len(doc["rows"])   # trace + summary
    assert "core gap" in capsys.readouterr().out
