"""The fabric model, the algorithms' schedules, the modeled clock and estimate-only mode.

No ranks: everything here is arithmetic on numpy arrays. Expected values are written out from
the model's definitions (alpha + bytes / rate, max-min sharing, max(own, signaller + latency)),
not taken from the model itself. The paper comparisons at the end are regression tests of rows
of docs/paper-reproduction.md (benchmarks/paper.py; docs/model.md says why each comes out as it
does); where the model misses the paper, the test's bound is the model's and its comment says
by how much it misses (e.g. Fig. 3a, 25% where the paper says 30%). How long the model takes
to evaluate is a benchmark (benchmarks/model_cost.py), not a test.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import stratacl
from stratacl.bench import _cases
from stratacl.bench import _command as _cli
from stratacl.collectives import _schedule as S
from stratacl.runtime.pipeline import EAGER_BYTES
from stratacl.ub import _topology
from stratacl.ub._clock import FabricModel, choose_algo, model_call, model_exchange, model_send_recv
from stratacl.ub._sharing import HOST_LOAD, HOST_STORE, LOAD, LOCAL_COPY, BandwidthSharing
from helpers import ranks

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
GB = 1e3                      # bytes per microsecond in one GB/s


def _topo(**extra) -> _topology.Topology:
    """Two nodes of two ranks; a 100 GB/s tier inside a node, 50 GB/s between nodes."""
    data = {"name": "tiny", "levels": [{"name": "rank", "size": 1, "tier": "local"},
                                       {"name": "node", "size": 2, "tier": "near"}],
            "tiers": {"local": {"latency_us": 0.0, "bandwidth_gbps": 1000},
                      "near": {"latency_us": 1.0, "bandwidth_gbps": 100},
                      "far": {"latency_us": 3.0, "bandwidth_gbps": 50}},
            "beyond": "far"}
    data.update(extra)
    return _topology.from_dict(data)


# --- topology data ------------------------------------------------------------------------------
def test_new_topology_fields_are_optional_with_neutral_defaults():
    t = _topo()
    c = t.contention
    assert (c.port_gbps, c.fan_in_efficiency, c.flag_us) == (None, 1.0, 0.0)
    assert all(lv.uplink_gbps is None for lv in t.levels) and not any(x.dedicated for x in t.tiers.values())
    cm = stratacl.ub.load_topology("cm384")
    assert cm.contention.port_gbps == 196.0 and 0 < cm.contention.fan_in_efficiency < 1
    assert cm.tiers["die-to-die"].dedicated and cm.levels[2].uplink_gbps == 3136.0
    text = cm.describe(32)
    assert "dedicated link" in text and "uplink 3136 GB/s" in text and "fan-in efficiency" in text


def test_a_compute_kernel_costs_its_roofline():
    # tiny: HBM (the local tier) 1000 GB/s = 1e6 bytes per us
    t = _topo(compute={"peak_tflops": 100.0, "efficiency": 0.5})
    assert t.kernel_us(0, 5e5) == pytest.approx(5e5 / (1e6 * 0.5))           # memory-bound: 1 us
    assert t.kernel_us(1e9, 10) == pytest.approx(1e9 / (100e6 * 0.5))        # compute-bound: 20 us
    assert t.kernel_us(1e8, 1e7) == pytest.approx(max(1e8 / 50e6, 1e7 / 5e5))  # the larger: 20 us
    assert _topo().kernel_us(1e12, 1e6) == pytest.approx(1.0)                 # no peak: FLOPs are free
    with pytest.raises(ValueError, match="kernel_us"):
        t.kernel_us(-1, 0)
    cm = stratacl.ub.load_topology("cm384")
    assert (cm.compute.peak_tflops, cm.compute.efficiency) == (390.0, 0.5)
    # a 4096^3 BF16 matmul (2 x 4096^3 FLOPs, three 32 MiB operands) on one die: compute-bound
    assert cm.kernel_us(2 * 4096 ** 3, 3 * 2 * 4096 ** 2) == pytest.approx(2 * 4096 ** 3 / (390e6 * 0.5))
    assert "roofline: 390 TFLOPS peak, HBM 1600 GB/s, efficiency 0.5" in cm.describe(32)


@pytest.mark.parametrize("patch, field", [
    ({"port": {"fan_in_efficiency": 1.5}}, r"port\.'fan_in_efficiency'"),
    ({"port": {"fan_in_efficiency": "high"}}, r"port\.'fan_in_efficiency' must be float"),
    ({"port": {"gbps": -1}}, r"port\.'gbps'"),
    ({"port": 7}, r"field 'port' must be an object"),
    ({"sync": {"flag_us": -0.5}}, r"sync\.'flag_us'"),
    ({"registration": {"map_us": "slow"}}, r"registration\.'map_us' must be float"),
    ({"compute": {"peak_tflops": 0}}, r"compute\.'peak_tflops' must be > 0"),
    ({"compute": {"efficiency": 1.5}}, r"compute\.'efficiency' must be in \(0, 1\]"),
    ({"compute": {"efficiency": "most"}}, r"compute\.'efficiency' must be float"),
])
def test_malformed_contention_fields_name_the_field(patch, field):
    with pytest.raises(stratacl.ConfigError, match=field):
        _topo(**patch)


def test_malformed_level_and_tier_fields_name_the_field():
    base = {"name": "x", "levels": [{"name": "r", "size": 1, "tier": "local"},
                                    {"name": "n", "size": 2, "tier": "local", "uplink_gbps": 0}],
            "tiers": {"local": {"latency_us": 0, "bandwidth_gbps": 10}}, "beyond": "local"}
    with pytest.raises(stratacl.ConfigError, match=r"levels\[1\]\.'uplink_gbps' must be > 0"):
        _topology.from_dict(base)
    base["levels"][1]["uplink_gbps"] = None
    base["tiers"]["local"]["dedicated"] = "yes"
    with pytest.raises(stratacl.ConfigError, match=r"tiers\.local\.'dedicated' must be bool"):
        _topology.from_dict(base)


# --- contention ---------------------------------------------------------------------------------
def test_two_readers_of_one_owner_each_get_half_its_port():
    f = BandwidthSharing(_topo())
    m = 10 * MIB
    done = f.phase([0, 1], [1, 0], m, LOAD)          # one flow each way: no sharing
    assert done == pytest.approx([1.0 + m / (100 * GB)] * 2)
    done = f.phase([0, 2], [1, 1], m, LOAD)           # rank 1 serves 0 (near) and 2 (far)
    # no port.gbps: the owner's port time is shared, r/100 + r/50 = 1, so both run at 100/3 GB/s
    assert done == pytest.approx([1.0 + m / (100 / 3 * GB), 3.0 + m / (100 / 3 * GB)])
    f2 = BandwidthSharing(_topology.load("flat"))
    done = f2.phase([1, 2], [0, 0], m, LOAD)          # flat: port = 170 GB/s, shared by two
    assert done == pytest.approx([0.7 + m / (85 * GB)] * 2)


def test_one_reader_from_many_peers_is_bound_by_its_port():
    f = BandwidthSharing(_topology.load("flat"))
    m = 4 * MIB
    done = f.phase([0] * 4, [1, 2, 3, 4], m, LOAD)
    assert done == pytest.approx([0.7 + 4 * m / (170 * GB)] * 4)


def test_fan_in_efficiency_and_dedicated_links_on_cm384():
    f = BandwidthSharing(_topology.load("cm384"))
    e = f.fan_in
    m = 8 * MIB
    # die 0 pulls from its sibling (SIO, not the port) and from one intra-node peer
    done = f.phase([0, 0], [1, 2], m, LOAD)
    assert done == pytest.approx([0.2 + m / (210 * GB), 0.7 + m / (170 * GB)])
    # four intra-node peers: the 196 GB/s port keeps e + (1-e)/4 of its rate, shared four ways
    done = f.phase([0] * 4, [2, 4, 6, 8], m, LOAD)
    rate = 196 * GB * (e + (1 - e) / 4) / 4
    assert done == pytest.approx([0.7 + m / rate] * 4)


def test_uplinks_are_shared_by_the_flows_crossing_them():
    t = _topo(levels=[{"name": "rank", "size": 1, "tier": "local"},
                      {"name": "node", "size": 2, "tier": "near", "uplink_gbps": 60}])
    f = BandwidthSharing(t)
    m = MIB
    # ranks 2 and 3 (node 1) both pull from node 0: node 0's uplink (60) is the bottleneck
    done = f.phase([2, 3], [0, 1], m, LOAD)
    assert done == pytest.approx([3.0 + m / (30 * GB)] * 2)


def test_capacity_freed_by_a_finished_transfer_goes_to_the_rest():
    f = BandwidthSharing(_topology.load("flat"))
    m = MIB
    done = f.phase([0, 0], [1, 2], [m, 2 * m], LOAD)
    # both at 85 until the first finishes at m/85; the second then runs alone at 170
    assert done == pytest.approx([0.7 + m / (85 * GB), 0.7 + m / (85 * GB) + m / (170 * GB)])


def test_local_copies_move_at_half_the_hbm_bandwidth_and_zero_bytes_cost_nothing():
    f = BandwidthSharing(_topology.load("cm384"))
    done = f.phase([3, 5], [3, 5], [16 * MIB, 0], LOCAL_COPY)
    assert done == pytest.approx([16 * MIB / (800 * GB), 0.0])


def test_a_32_rank_full_mesh_phase_models_every_transfer():
    # its cost to evaluate (about 1 ms) is measured by benchmarks/model_cost.py
    topo = _topology.load("cm384")
    f = BandwidthSharing(topo)
    r, o = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    off = r != o
    done = np.asarray(f.phase(r[off], o[off], GIB, LOAD))
    assert done.shape == (992,) and np.isfinite(done).all() and (done > 0).all()
    # each rank pulls 31 GiB in through its own port: no faster than the port's line rate
    assert done.max() >= 31 * GIB / (topo.contention.port_gbps * GB)


def _fill_reference(res, w, cap, tier_cap, active) -> np.ndarray:
    """Progressive filling as numpy states it: every round recomputes the unfrozen weight on
    every resource (ub/_fill.c is this, with the sums kept up to date instead)."""
    x = np.zeros(len(active))
    free = active.copy()
    load = np.zeros(cap.size)
    while free.any():
        rf, wf = res[free], w[free]
        wsum = np.bincount(rf.ravel(), wf.ravel(), minlength=cap.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            level = np.where(wsum > 0, (cap - load) / wsum, np.inf)
        lam = min(level.min(), tier_cap[free].min())
        saturated = level <= lam * (1 + 1e-12)
        stop = (saturated[rf] & (wf > 0)).any(axis=1) | (tier_cap[free] <= lam * (1 + 1e-12))
        idx = np.nonzero(free)[0][stop]
        x[idx] = lam
        load += np.bincount(res[idx].ravel(), (w[idx] * lam).ravel(), minlength=cap.size)
        free[idx] = False
    return x


@pytest.mark.parametrize("seed", range(6))
def test_the_native_fill_gives_the_reference_rates(seed):
    rng = np.random.default_rng(seed)
    f = BandwidthSharing(_topology.load("cm384"))
    n = int(rng.choice([8, 40, 96]))
    flows = int(rng.integers(1, 3 * n))
    reader, owner = rng.integers(0, n, flows), rng.integers(0, n, flows)
    kind = np.where(reader == owner, LOCAL_COPY, LOAD)
    nbytes = rng.choice([0, 4096, 1 << 20, 3 << 20], flows)
    res, w, cap0, is_port, tier_cap, _ = f._route(reader, owner, kind)
    active = nbytes > 0
    cap = f._port_capacity(res, w, active, cap0, is_port)
    got = BandwidthSharing._fill(res, w, cap, tier_cap, active)
    ref = _fill_reference(res, w, cap, tier_cap, active)
    np.testing.assert_allclose(got, ref, rtol=1e-13)
    assert (got > 0).sum() == active.sum()


# --- schedules ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", ranks(2, 3, 8, 32))
def test_ring_all_gather_steps_and_bytes(n):
    m = 3 * MIB
    steps = S.schedule("all_gather", "ring", n, m, eager_bytes=EAGER_BYTES)
    ring = [s for s in steps if isinstance(s, S.Ring)][0]
    assert isinstance(steps[0], S.Barrier) and isinstance(steps[-1], S.Barrier)
    assert ring.nbytes.shape == (n - 1, n)
    assert (ring.nbytes.sum(axis=0) == (n - 1) * m).all()     # each reader pulls (N-1) x per-rank
    assert (ring.local == m).all()                              # and copies its own block
    # chunk bookkeeping: i pulls from i-1 what i-1 got one step earlier; all chunks arrive once
    have = [{i} for i in range(n)]
    for s in range(n - 1):
        got = [S.ring_all_gather_chunk(i, s, n) for i in range(n)]
        for i in range(n):
            assert got[i] in have[(i - 1) % n] and got[i] not in have[i]
        for i in range(n):
            have[i].add(got[i])
    assert all(h == set(range(n)) for h in have)


@pytest.mark.parametrize("n", ranks(2, 3, 8, 32))
def test_ring_reduce_scatter_ends_with_each_members_chunk_fully_reduced(n):
    partial = [{c: {i} for c in range(n)} for i in range(n)]     # contributors per chunk
    for s in range(n - 1):
        new = []
        for i in range(n):
            c = S.ring_reduce_scatter_chunk(i, s, n)
            new.append((i, c, partial[(i - 1) % n][c] | {i}))
        for i, c, who in new:
            partial[i][c] = who
    assert all(partial[i][i] == set(range(n)) for i in range(n))
    steps = S.schedule("reduce_scatter", "ring", n, n * 4096, itemsize=4, eager_bytes=EAGER_BYTES)
    ring = steps[1]
    assert ring.nbytes.shape == (n - 1, n) and (ring.kind == S.LOAD_REDUCE).all()


def test_mesh_byte_totals_and_phases():
    n, m = 8, 4 * MIB
    ag = S.schedule("all_gather", "mesh", n, m, eager_bytes=EAGER_BYTES)
    mesh = ag[1]
    pulled = np.bincount(mesh.reader[mesh.kind == LOAD], mesh.nbytes[mesh.kind == LOAD], n)
    assert [type(s) for s in ag] == [S.Barrier, S.Mesh, S.Barrier] and (pulled == (n - 1) * m).all()
    ar = S.schedule("all_reduce", "mesh", n, m, itemsize=4, eager_bytes=EAGER_BYTES)
    assert [type(s) for s in ar] == [S.Barrier, S.Mesh, S.Barrier, S.Mesh, S.Barrier]
    assert ar[1].nbytes[ar[1].kind == S.LOAD_REDUCE].sum() + ar[3].nbytes.sum() == 2 * (n - 1) * m
    small = S.schedule("all_reduce", "mesh", n, 16 * KIB, itemsize=4, eager_bytes=EAGER_BYTES)
    assert [type(s) for s in small] == [S.Local, S.Barrier, S.Mesh]      # eager: no departure barrier
    tiny = S.schedule("all_gather", "mesh", n, 4 * KIB, eager_bytes=EAGER_BYTES)
    assert [type(s) for s in tiny] == [S.Local, S.Barrier, S.Mesh]
    ring = S.schedule("all_reduce", "ring", n, m, itemsize=4, eager_bytes=EAGER_BYTES)
    assert [type(s) for s in ring] == [S.Barrier, S.Ring, S.Barrier, S.Ring, S.Barrier]
    moved = ring[1].nbytes.sum(axis=0) + ring[3].nbytes.sum(axis=0)
    assert ring[1].nbytes.shape == (n - 1, n) and (moved == 2 * (n - 1) * m // n).all()
    bc = S.schedule("broadcast", "ring", n, m, root=3, eager_bytes=EAGER_BYTES)
    assert bc[1].owner.tolist() == [3] * (n - 1) and bc[2] == S.RootWait(3)   # readers leave, root waits


def test_staged_rounds_fit_the_communication_buffer():
    rounds = S.staged_rounds("all_gather", 32, GIB, 200 * MIB, itemsize=4)
    assert sum(rounds) == GIB and max(rounds) * 32 <= 200 * MIB and len(rounds) == 164
    assert S.staged_rounds("all_gather", 32, MIB, 200 * MIB) == [MIB]
    rs = S.staged_rounds("reduce_scatter", 8, 8 * 300 * MIB + 8 * 4, 200 * MIB, itemsize=4)
    assert sum(rs) == 8 * 300 * MIB + 8 * 4 and all(r % 32 == 0 for r in rs[:-1])


# --- clocks -------------------------------------------------------------------------------------
def test_model_call_is_deterministic_bit_for_bit():
    clocks = np.linspace(0.0, 5.0, 32)
    got = [model_call(FabricModel("cm384", eager_bytes=EAGER_BYTES), op, algo, range(32), 3 * MIB + 4, clocks, np.full(32, 0.25))
           for op, algo in [("all_reduce", "ring"), ("all_reduce", "ring"), ("all_gather", "mesh"),
                            ("all_gather", "mesh")]]
    assert got[0].tobytes() == got[1].tobytes() and got[2].tobytes() == got[3].tobytes()


def test_barrier_waits_for_the_latest_member_plus_latency():
    model = FabricModel(_topo(), eager_bytes=EAGER_BYTES)
    out = model_call(model, "barrier", "mesh", [0, 1, 2, 3], 0, [0.0, 0.0, 10.0, 0.0])
    # rank 2 arrives at 10 and leaves then (every other flag is already there); its flag reaches
    # its node peer 3 after 1 us and ranks 0, 1 (the other node) after 3 us
    assert out.tolist() == [13.0, 13.0, 10.0, 11.0]
    out = model_call(model, "barrier", "mesh", [0, 1, 2, 3], 0, np.zeros(4), extra_us=[0, 0, 0, 4.0])
    assert out.tolist() == [7.0, 7.0, 5.0, 4.0]


def test_broadcast_readers_leave_and_the_root_waits_for_their_done_flags():
    model = FabricModel(_topo(), eager_bytes=EAGER_BYTES)
    m = MIB
    out = model_call(model, "broadcast", "mesh", [0, 1, 2, 3], m, np.zeros(4), root=0)
    # barrier: everyone leaves at 3 (the far flags); rank 1 pulls over near, ranks 2, 3 over far;
    # the root's port is shared: its time splits r/100 + 2 r/50 = 1, i.e. 20 GB/s each
    each = 100 / 5 * GB
    assert out[1:] == pytest.approx([3.0 + 1.0 + m / each, 3.0 + 3.0 + m / each, 3.0 + 3.0 + m / each])
    assert out[0] == pytest.approx(max(out[1] + 1.0, out[2] + 3.0))


def test_ring_clock_follows_the_neighbour_flags():
    model = FabricModel(_topo(), eager_bytes=EAGER_BYTES)
    m = MIB
    out = model_call(model, "all_gather", "ring", [0, 1], m, [0.0, 0.0])
    # barrier (1 us); one step: each pulls m over "near" (1 us + m/100) beside its own copy; barrier
    step = max(1.0 + m / (100 * GB), m / (500 * GB))
    assert out == pytest.approx([1.0 + step + 1.0] * 2)
    three = model_call(model, "all_gather", "ring", [0, 1, 2], m, np.zeros(3))
    # member 2 pulls from 1 (far), member 0 from 2 (far), member 1 from 0 (near)
    assert three.max() > out.max() + m / (50 * GB)


def test_send_recv_pair_and_the_sendrecv_ring_shift():
    model = FabricModel(_topo(), eager_bytes=EAGER_BYTES)
    m = MIB
    t_send, t_recv = model_send_recv(model, 0, 2, m, 5.0, 1.0)
    # flag 0 -> 2 (far, 3 us) at 8; pull over far (3 us + m/50); flag back (3 us)
    assert t_recv == pytest.approx(8.0 + 3.0 + m / (50 * GB)) and t_send == pytest.approx(t_recv + 3.0)
    out = model_call(model, "sendrecv", "mesh", [0, 1], m, [0.0, 0.0])
    pull = 1.0 + m / (100 * GB)
    assert out == pytest.approx([1.0 + pull + 1.0] * 2)


def test_sub_communicators_use_global_placement():
    model = FabricModel("cm384", eager_bytes=EAGER_BYTES)
    a = model_call(model, "all_gather", "mesh", range(8), 4 * MIB, np.zeros(8))
    b = model_call(model, "all_gather", "mesh", range(16, 24), 4 * MIB, np.zeros(8))
    assert a.tobytes() == b.tobytes()
    near = model_call(model, "all_gather", "mesh", [0, 2], 4 * MIB, np.zeros(2)).max()
    far = model_call(model, "all_gather", "mesh", [0, 16], 4 * MIB, np.zeros(2)).max()
    assert far > near


def test_jit_mappings_cost_per_peer_and_staged_copies_cost_time():
    model = FabricModel("cm384", "jit", eager_bytes=EAGER_BYTES)
    c = model.topology.contention
    assert model.registration_us(31, GIB) == pytest.approx(31 * (c.registration_fixed_us + c.map_us_per_gib))
    assert S.peers_read("all_gather", "ring", 32).tolist() == [1] * 32
    assert S.peers_read("all_gather", "mesh", 32).tolist() == [31] * 32
    assert S.peers_read("broadcast", "mesh", 4, root=2).tolist() == [1, 1, 0, 1]
    zc = stratacl.estimate("all_gather", 32, 32 * 64 * MIB, registration="roa").time_us
    assert stratacl.estimate("all_gather", 32, 32 * 64 * MIB, registration="pool").time_us == zc
    assert stratacl.estimate("all_gather", 32, 32 * 64 * MIB, registration="jit").time_us > zc
    assert stratacl.estimate("all_gather", 32, 32 * 64 * MIB, registration="staged").time_us > zc


# --- estimate-only mode -------------------------------------------------------------------------
@pytest.mark.parametrize("op", _cases.OPS)
def test_estimate_follows_nccl_tests_size_conventions(op):
    n = 8
    e = stratacl.estimate(op, n, 1000 * 1000, algo="auto", root=3 if op == "broadcast" else 0)
    sh = _cases.shape(op, n, 1000 * 1000, 4)
    assert (e.size, e.count) == (sh.size, sh.count) and e.times_us.shape == (n,)
    assert e.time_us == e.times_us.max() > 0
    if op != "barrier":
        assert e.algbw == pytest.approx(e.size / e.time_us / 1e3)
        assert e.busbw == pytest.approx(e.algbw * _cases.bus_factor(op, n))
    assert json.loads(json.dumps(e.as_dict()))["op"] == op


@pytest.mark.slow
@pytest.mark.timeout(120)          # a deadline against a hang; the time itself: benchmarks/model_cost.py
def test_estimate_reaches_256_ranks_at_1_gib_per_rank():
    e = stratacl.estimate("all_gather", 256, 256 * GIB, algo="auto")
    assert e.times_us.shape == (256,) and e.algo == "ring" and 100 < e.busbw < 200


def test_estimate_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown operator"):
        stratacl.estimate("gather", 4, 1024)
    with pytest.raises(ValueError, match="algo must be"):
        stratacl.estimate("all_gather", 4, 1024, algo="tree")
    with pytest.raises(ValueError, match="registration must be"):
        stratacl.estimate("all_gather", 4, 1024, registration="rdma")
    with pytest.raises(ValueError, match="root 4"):
        stratacl.estimate("broadcast", 4, 1024, root=4)


# --- the paper's comparisons (regression; docs/paper-reproduction.md) ---------------------------
PER_RANK = [64 * KIB << k for k in range(15)]      # 64 KiB .. 1 GiB


def _ag(n, per, **kw):
    return stratacl.estimate("all_gather", n, n * per, **kw)


def _fig6a():
    mesh = np.array([_ag(32, s, algo="mesh").time_us for s in PER_RANK])
    ring = np.array([_ag(32, s, algo="ring").time_us for s in PER_RANK])
    return mesh, ring


def _crossover(mesh, ring) -> float:
    i = int(np.nonzero(ring < mesh)[0][0])
    r0, r1 = ring[i - 1] / mesh[i - 1], ring[i] / mesh[i]
    return float(PER_RANK[i - 1] * 2 ** ((r0 - 1) / (r0 - r1)))


def test_fig6a_full_mesh_wins_small_payloads_ring_wins_large_ones():
    mesh, ring = _fig6a()
    small = np.array(PER_RANK) < MIB
    assert (mesh[small] / ring[small]).mean() < 0.5             # >= 2x faster on average below 1 MiB
    assert ring[0] / mesh[0] > 3.5                                # paper: up to 4.5x at 64 KiB
    big = np.array(PER_RANK) >= 16 * MIB
    assert (ring[big] < mesh[big]).all()                          # ring ahead above the crossover
    assert MIB < _crossover(mesh, ring) < 64 * MIB
    assert mesh[-1] / ring[-1] == pytest.approx(1.06, abs=0.005)  # the calibration point (section 8.1)


def test_fig6a_crossover_between_8_and_64_mib():
    mesh, ring = _fig6a()
    assert 8 * MIB <= _crossover(mesh, ring) <= 64 * MIB


def _fig3a_gains(algo):
    return [_ag(32, s, algo=algo, registration="roa").busbw / _ag(32, s, algo=algo, registration="staged").busbw - 1
            for s in PER_RANK if s > 8 * MIB]


@pytest.mark.slow
def test_fig3a_zero_copy_beats_staged_above_8_mib_by_about_30_percent_with_the_ring():
    """Paper 2.2: "more than 30%" above 8 MiB; 9.1: "~1.3x on average". The model gives +27..30%
    with the ring above 8 MiB (docs/paper-reproduction.md, row fig3a.zerocopy_gain_above_8m),
    so the bound is 25%, not the paper's 30%: the model misses by a few points because its
    staging copies run at the HBM's copy rate (half its bandwidth: a copy reads and writes) and
    are not pipelined with the transfers. Nothing was fitted to this figure; raise the bound
    only if the model earns it. The full mesh gains too, less."""
    ring = _fig3a_gains("ring")
    assert 0.25 <= min(ring) and 0.25 <= sum(ring) / len(ring) <= 0.40
    assert min(_fig3a_gains("mesh")) > 0.15


@pytest.mark.slow
def test_fig13b_full_mesh_peak_gap_grows_sublinearly_and_stays_within_10_percent():
    gap = [1 - _ag(n, GIB, algo="mesh").busbw / _ag(n, GIB, algo="ring").busbw for n in (32, 64, 128, 256)]
    assert gap == sorted(gap) and gap[-1] < 0.10
    assert gap[3] - gap[2] < gap[1] - gap[0]


@pytest.mark.parametrize("op", ["all_gather", "all_reduce"])
@pytest.mark.parametrize("n", ranks(8, 32))
def test_auto_is_within_5_percent_of_the_better_algorithm(op, n):
    model = FabricModel("cm384", eager_bytes=EAGER_BYTES)
    picks = []
    for s in PER_RANK:
        t = {a: model_call(model, op, a, range(n), s, np.zeros(n), itemsize=4).max() for a in ("mesh", "ring", "auto")}
        assert t["auto"] <= 1.05 * min(t["mesh"], t["ring"])
        picks.append(choose_algo(model, op, range(n), s, itemsize=4))
    assert picks[0] == "mesh" and picks[-1] == "ring"


# --- the benchmark ------------------------------------------------------------------------------
def test_bench_estimate_rows_and_json(tmp_path, capsys):
    out = tmp_path / "e.json"
    rc = _cli.main(["all_gather", "-n", "64", "-b", "2M", "-e", "64G", "-f", "32", "--estimate", "--algo", "auto",
                    "-J", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "estimate only" in text and "Avg modeled bus bandwidth" in text
    doc = json.loads(out.read_text())
    assert doc["header"]["clock"] == "estimate" and doc["header"]["algo"] == "auto"
    rows = doc["rows"]
    assert [r["size"] for r in rows] == [2 * MIB, 64 * MIB, 2 * GIB, 64 * GIB]
    for r in rows:
        assert set(r) == (set(_cli.COLUMNS) | {"op"} | set(_cli.MODEL_COLUMNS) | {"model_algo"}
                          | set(_cli.CORE_COLUMNS) | {"policy_us"})
        assert r["time_us"] is None and r["algbw"] is None and r["busbw"] is None and r["wrong"] is None
        e = stratacl.estimate("all_gather", 64, r["size"], algo="auto")
        assert r["model_time_us"] == e.time_us and r["model_algo"] == e.algo
        assert r["model_busbw"] == pytest.approx(r["model_algbw"] * 63 / 64)
    assert rows[0]["model_algo"] == "mesh" and rows[-1]["model_algo"] == "ring"


def test_bench_estimate_refuses_peers():
    with pytest.raises(SystemExit):
        _cli.main(["all_gather", "--estimate", "--vs", "mpi"])


class _ClockedBackend:
    """Two ranks' worth of a backend whose modeled clock advances 7 us per call."""
    name, rank, size = "fake", 0, 2

    def __init__(self):
        self.t = 0.0

    def alloc(self, count, dtype):
        return np.zeros(count, dtype)

    def call(self, op, out, x, redop, root):
        def run():
            self.t += 7e-6
            if out is not None:
                out[...] = np.concatenate([x, x + 0]) if op == "all_gather" else out
        return run

    def barrier(self):
        self.t += 1e-6

    def clock(self):
        return self.t

    def mean(self, v):
        return v

    def total(self, v):
        return 0

    def maximum(self, v):
        return v


def test_sweep_reports_modeled_time_from_the_clock():
    rows = _cases.sweep(_ClockedBackend(), _cases.Spec("all_gather", [4096], warmup=1, iters=5, check=0))
    assert rows[0]["model_time_us"] == pytest.approx(7.0)
    assert rows[0]["model_algbw"] == pytest.approx(4096 / 7.0 / 1e3)
    assert rows[0]["model_busbw"] == pytest.approx(rows[0]["model_algbw"] / 2)


# --- the host tier (a rank's own host memory) ---------------------------------------------------
def test_the_host_tier_is_optional_and_named_by_field_host():
    assert _topo().host is None and _topology.load("flat").host is None
    cm = _topology.load("cm384")
    assert cm.host == "host" and cm.tiers["host"].bandwidth_gbps == 40.0 and cm.tiers["host"].latency_us == 1.0
    assert "host      tier host: 1 us, 40 GB/s" in cm.describe()
    with pytest.raises(stratacl.ConfigError, match="field 'host' names unknown tier 'dram'"):
        _topo(host="dram")
    with pytest.raises(stratacl.ConfigError, match="field 'host' must be str"):
        _topo(host=3)
    with pytest.raises(stratacl.ConfigError, match="no 'host' tier"):
        BandwidthSharing(_topo()).phase([0], [0], MIB, HOST_LOAD)


def test_host_transfers_cost_the_host_tier_and_share_the_readers_port():
    tiers = {"local": {"latency_us": 0.0, "bandwidth_gbps": 1000}, "near": {"latency_us": 1.0, "bandwidth_gbps": 100},
             "far": {"latency_us": 3.0, "bandwidth_gbps": 50}, "dram": {"latency_us": 2.0, "bandwidth_gbps": 40}}
    f = BandwidthSharing(_topo(tiers=tiers, host="dram", port={"gbps": 60}))
    m = MIB
    # alone: alpha + bytes at the tier's 40 GB/s; a load and a store of one rank run side by side
    assert f.phase([1], [1], m, HOST_LOAD) == pytest.approx([2.0 + m / (40 * GB)])
    assert f.phase([1, 1], [1, 1], m, [HOST_LOAD, HOST_STORE]) == pytest.approx([2.0 + m / (40 * GB)] * 2)
    # a host load and a peer load into rank 0 share its 60 GB/s port in: 30 each
    assert f.phase([0, 0], [0, 1], m, [HOST_LOAD, LOAD]) == pytest.approx([2.0 + m / (30 * GB), 1.0 + m / (30 * GB)])
    # a host store leaves by the port out, so it does not slow a load into the same rank
    assert f.phase([0, 0], [0, 1], m, [HOST_STORE, LOAD]) == pytest.approx([2.0 + m / (40 * GB), 1.0 + m / (60 * GB)])


def test_host_phases_stay_host_transfers_and_staged_adds_the_buffer_copies():
    steps = S.exchange([(np.array([[MIB]]), HOST_LOAD)])
    assert [type(s).__name__ for s in steps] == ["Barrier", "Mesh", "Barrier"] and steps[1].kind.tolist() == [HOST_LOAD]
    phases = [(np.array([[MIB // 4]]), HOST_STORE), (np.array([[MIB]]), HOST_LOAD)]
    staging = (np.array([MIB // 4]), np.array([MIB]))
    t = {reg: model_exchange(FabricModel("cm384", reg, path="mte", eager_bytes=EAGER_BYTES), (5,), phases, [0.0],
                             staging=staging)[0] for reg in ("roa", "staged")}
    # staged: the evicted rows copied into the buffer first, the fetched ones out of it after (HBM / 2)
    assert t["staged"] - t["roa"] == pytest.approx(MIB * 5 / 4 / (800 * GB), rel=1e-6)
    # zero copy: each phase its latency and its bytes at 40 GB/s (6 cores of 7.76 GB/s fill the tier)
    assert t["roa"] == pytest.approx(2 * 1.0 + MIB * 5 / 4 / (40 * GB))
    sdma = model_exchange(FabricModel("cm384", "roa", path="sdma", eager_bytes=EAGER_BYTES), (5,), phases, [0.0],
                          staging=staging)[0]
    # each phase one descriptor: built and rung (0.5 + 0.1 us) before the engine streams it at
    # 0.92 of the share
    assert sdma == pytest.approx(t["roa"] + 2 * (0.5 + 0.1) + MIB * 5 / 4 / (40 * GB) * (1 / 0.92 - 1))
