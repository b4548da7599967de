"""Registration costs in modeled time (ub/_registration_cost.py): a UB registration's four steps
(paper Fig. 4b) add up to the points read off Fig. 5a, the RDMA baseline of Fig. 4a is computed
from its own parameters, and registration-on-allocation's background path pays the metadata
broadcast of its path (section 7). Pure functions: no ranks."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from stratacl._errors import ConfigError
from stratacl.runtime.pipeline import EAGER_BYTES
from stratacl.ub import _registration_cost as RC
from stratacl.ub import _topology as T
from stratacl.ub._clock import FabricModel

from benchmarks import paper

MIB, GIB = 1 << 20, 1 << 30
PAYLOADS = (2 * MIB, 128 * MIB, GIB)        # Fig. 4a / 4b


@pytest.fixture(scope="module")
def cm():
    return T.load("cm384").contention


def test_the_four_steps_add_up_to_one_registration(cm):
    steps = RC.ub_steps_us(cm, PAYLOADS)
    assert tuple(steps) == RC.STEPS
    total = sum(steps.values())
    np.testing.assert_allclose(total, RC.ub_registration_us(cm, PAYLOADS), rtol=1e-12)
    # only the map step grows with the payload (Fig. 4b: page-table updates scale with the size)
    for k in ("export", "import", "reserve_va"):
        assert np.ptp(steps[k]) == 0 and steps[k][0] > 0
    assert np.all(np.diff(steps["map"]) > 0)


def test_the_registration_meets_fig5a_s_points(cm):
    """Fig. 5a, per-rank jit registration of an N-rank group (one registration per peer):
    about 0.1 ms at N = 2 with 2 MiB buffers, about 100 ms at N = 128 with 1 GiB ones."""
    model = FabricModel("cm384", "jit", eager_bytes=EAGER_BYTES)
    assert float(model.registration_us(1, 2 * MIB)) / 1e3 == pytest.approx(0.1, rel=0.1)
    assert float(model.registration_us(127, GIB)) / 1e3 == pytest.approx(100.0, rel=0.1)
    # jit pays all four steps per peer read
    assert float(model.registration_us(31, 128 * MIB)) == pytest.approx(31 * float(sum(
        v for v in RC.ub_steps_us(cm, 128 * MIB).values())))


def test_fig4b_s_shape_export_and_import_when_small_the_map_when_large(cm):
    steps = RC.ub_steps_us(cm, PAYLOADS)
    total = RC.ub_registration_us(cm, PAYLOADS)
    share = {k: v / total for k, v in steps.items()}
    assert share["export"][0] + share["import"][0] > share["map"][0]      # 2 MiB: handles dominate
    assert share["map"][-1] > 0.5                                         # 1 GiB: the map dominates
    assert np.all(np.diff(share["map"]) > 0)


def test_fig4a_rdma_costs_more_at_every_payload_and_about_9x_on_average(cm):
    ub, rdma = RC.ub_registration_us(cm, PAYLOADS), RC.rdma_registration_us(cm, PAYLOADS)
    assert np.all(rdma > ub)
    assert 9.0 / 1.5 <= float(np.mean(rdma / ub)) <= 9.0 * 1.5
    # both fit Fig. 4a's axis, 10 us .. 10 ms
    assert 10 <= ub.min() and rdma.max() <= 10_000


def test_the_metadata_relay_is_slower_than_the_direct_path(cm):
    direct, relay = RC.metadata_us(cm, "direct"), RC.metadata_us(cm, "relay")
    assert relay > direct > 0
    assert (direct, relay) == (7.5, 60.0)          # section 7: 7-8 us against 60 us
    with pytest.raises(ValueError, match="direct, relay"):
        RC.metadata_us(cm, "pigeon")


def test_background_registration_is_export_broadcast_then_each_peer_s_steps(cm):
    steps = {k: float(v) for k, v in RC.ub_steps_us(cm, 2 * MIB).items()}
    peer = steps["import"] + steps["reserve_va"] + steps["map"]
    for path in RC.PATHS:
        one = RC.background_us(cm, 2 * MIB, path)
        assert one == pytest.approx(steps["export"] + RC.metadata_us(cm, path) + peer)
        # owners announcing at once: each peer maps them one after the other (page-table lock)
        assert RC.background_us(cm, 2 * MIB, path, owners=31) == pytest.approx(one + 30 * peer)
    gap = RC.background_us(cm, GIB, "relay", 127) - RC.background_us(cm, GIB, "direct", 127)
    assert gap == pytest.approx(cm.metadata_relay_us - cm.metadata_direct_us)
    with pytest.raises(ValueError):
        RC.background_us(cm, 2 * MIB, "direct", owners=0)


def test_background_registration_stays_below_the_gaps_that_hide_it(cm):
    # section 5: tens of ms between a remap and its first use; Fig. 15a: >= 2.6 s after allocation
    assert RC.background_us(cm, 2 * MIB, "relay", owners=191) / 1e3 < 20.0
    assert RC.background_us(cm, GIB, "relay", owners=127) / 1e6 < 2.6


def test_a_topology_without_the_split_keeps_one_fixed_cost_and_no_rdma():
    flat = T.load("flat").contention
    assert flat.registration_fixed_us == flat.map_us == 100.0
    assert RC.rdma_registration_us(flat, GIB) is None
    assert RC.metadata_us(flat, "relay") == 0.0
    rows = {r["claim"]: r for r in paper.registration(T.load("flat"), True)}
    assert rows["fig4a.ub_over_rdma_registration"]["basis"] == "not modeled"


@pytest.mark.parametrize("key", ["export_us", "import_us", "reserve_va_us", "metadata_direct_us",
                                 "metadata_relay_us", "rdma_us"])
def test_from_dict_checks_the_registration_fields(key):
    d = copy.deepcopy(T._CM384)
    d["registration"][key] = -1.0
    with pytest.raises(ConfigError, match=rf"registration\.'{key}' must be >= 0"):
        T.from_dict(d)


def test_rdma_fields_go_together():
    d = copy.deepcopy(T._CM384)
    d["registration"]["rdma_us_per_gib"] = None
    with pytest.raises(ConfigError, match="go together"):
        T.from_dict(d)


def test_the_report_computes_its_registration_rows_from_the_model(cm):
    rows = {r["claim"]: r for r in paper.registration(T.load("cm384"), True)}
    ratio = RC.rdma_registration_us(cm, PAYLOADS) / RC.ub_registration_us(cm, PAYLOADS)
    assert rows["fig4a.ub_over_rdma_registration"]["here"] == pytest.approx(float(np.mean(ratio)))
    assert rows["fig4a.ub_over_rdma_registration"]["basis"] == "model"
    assert rows["sec7.metadata_relay_us"]["here"] > rows["sec7.metadata_direct_us"]["here"]
    assert rows["fig4b.map_share_grows"]["holds"] and rows["fig4b.map_share_grows"]["kind"] == "trend"
    # a parameter doubled moves its rows: the report reads the model, nothing is typed in
    for path, claim in ((("registration", "rdma_us_per_gib"), "fig4a.ub_over_rdma_registration"),
                        (("registration", "metadata_direct_us"), "sec7.metadata_direct_us"),
                        (("registration", "import_us"), "sec5.remap_hidden_ms")):
        moved = {r["claim"]: r for r in paper.registration(paper._scaled(path, 2.0), True)}
        assert moved[claim]["here"] > rows[claim]["here"], claim


def test_every_registration_parameter_is_listed_with_a_source():
    listed = {p[1][-1]: p[2] for p in paper.PARAMETERS if p[1][0] == "registration"}
    assert set(listed) == set(T._CM384["registration"])
    for key, source in listed.items():
        assert source.startswith(("read off", "assumed")), (key, source)
