"""The die's HBM as a shared resource of the fabric model (ub/_hbmshare.py, ub/_compute.py).

Communication's reads and writes, the staged path's extra copies and a kernel's own bytes share
the local tier's bandwidth: a kernel beside a call is left what the call does not draw (comm
first), a call started beside a kernel is left what the kernel does not draw (compute first).
The expected values below come from the byte counts of the operators and the HBM's bandwidth,
not from the code under test.
"""
from __future__ import annotations

import numpy as np
import pytest

import stratacl
from stratacl import ub
from stratacl.ub._clock import FabricModel, model_call
from stratacl.ub._compute import ComputeJob, overlap, run_job
from stratacl.ub import _hbmshare as _hbm

pytestmark = pytest.mark.timeout(180)

EAGER = 64 * 1024
HBM = 1600e3                      # cm384: a die's HBM, 1.6 TB/s (paper section 2.1), in bytes/us


def _traffic(plan, n, me=0):
    t, rate = _hbm.use(plan, np.zeros(n), me)
    return float(np.sum(np.diff(t) * rate[:-1])), t, rate


@pytest.mark.parametrize("algo", ["mesh", "ring"])
@pytest.mark.parametrize("n", [2, 3, 8])
def test_a_plan_carries_the_bytes_each_member_reads_and_writes_in_its_hbm(n, algo):
    M = 3 * 65536                  # above the eager threshold: no copy into a mailbox
    # zero copy: a member writes the N - 1 blocks it pulls and copies its own (read + write),
    # and each of its N - 1 readers reads its input once: 2 N M
    zc = FabricModel("cm384", "roa", eager_bytes=EAGER).plan("all_gather", algo, tuple(range(n)), M)
    for me in range(n):
        assert _traffic(zc, n, me)[0] == pytest.approx(2 * n * M, rel=1e-12)
    # staged (one round: the buffer holds the call): + the input copied in (2 M) and the N M
    # output copied out (2 N M), the paper's (1 + N) M bytes of staging, each read and written
    st = FabricModel("cm384", "staged", eager_bytes=EAGER).plan("all_gather", algo, tuple(range(n)), M)
    for me in range(n):
        assert _traffic(st, n, me)[0] == pytest.approx(2 * n * M + 2 * (1 + n) * M, rel=1e-12)


def test_communication_never_draws_more_than_the_hbm():
    for reg in ("roa", "staged"):
        plan = FabricModel("cm384", reg, eager_bytes=EAGER).plan("all_gather", "ring", tuple(range(32)), 8 << 20)
        _, _, rate = _traffic(plan, 32)
        assert rate.max() <= HBM * (1 + 1e-9)


def test_a_kernel_left_less_than_its_demand_runs_at_that_share():
    # traffic of 1000 bytes/us for the first 100 us; a kernel drawing 1200 alone, on a 1600 HBM,
    # is left 600 there: half its demand, so 100 us of it take 200 us
    times, rate = np.array([0.0, 100.0]), np.array([1000.0, 0.0])
    none = (np.zeros(0), np.zeros(0))
    job = ComputeJob(cores=4, duration_us=150.0, hbm_bytes=1200.0 * 150.0)
    end, fewest = run_job(job, 48, *none, hbm=(times, rate), capacity=1600.0)
    # 0..100 us at half speed: 50 us of work; the other 100 us after: ends at 200
    assert end == pytest.approx(200.0, rel=1e-12) and fewest == 4
    # left at least its demand: not slowed
    easy = ComputeJob(cores=4, duration_us=150.0, hbm_bytes=600.0 * 150.0)
    assert run_job(easy, 48, *none, hbm=(times, rate), capacity=1600.0)[0] == pytest.approx(150.0, rel=1e-12)
    # the cores bound it too: 2 of its 4 cores and half its HBM is still half speed, not a quarter
    busy = (np.array([0.0, 100.0]), np.array([46, 0]))
    assert run_job(job, 48, *busy, hbm=(times, rate), capacity=1600.0)[0] == pytest.approx(200.0, rel=1e-12)


def test_a_kernel_is_slowed_only_where_the_call_leaves_it_less_than_its_demand():
    """Fig. 3b's mechanism at the operator level: a kernel on the cores the call leaves free,
    beside a 32-rank all_gather. Zero copy draws what the fabric delivers in and out (under
    half the HBM), staging copies draw all of it."""
    members, M = tuple(range(32)), 8 << 20
    zc = FabricModel("cm384", "roa", eager_bytes=EAGER)
    st = FabricModel("cm384", "staged", eager_bytes=EAGER)
    d = float(model_call(zc, "all_gather", "ring", members, M, np.zeros(32)).max())
    free = zc.cores - zc.comm_cores

    def slowdown(model, demand):
        return overlap(model, "all_gather", "ring", members, M, ComputeJob(free, d, 0.0, demand * d)).slowdown

    _, _, zc_rate = _traffic(zc.plan("all_gather", "ring", members, M), 32)
    assert zc_rate.max() < HBM / 2
    untouched = pytest.approx(0.0, abs=1e-12)
    assert slowdown(zc, HBM / 2) == untouched and slowdown(zc, 0.0) == untouched
    assert slowdown(st, 0.0) == untouched            # on free cores and with no bytes: untouched
    assert slowdown(st, HBM / 2) > 0.05              # the copies leave it nothing while they run
    assert 0 < slowdown(zc, HBM) < slowdown(st, HBM)


def test_a_kernel_holding_the_hbm_slows_a_call_started_beside_it():
    members, M = tuple(range(8)), 8 << 20
    st = FabricModel("cm384", "staged", eager_bytes=EAGER)
    alone = float(model_call(st, "all_gather", "mesh", members, M, np.zeros(8)).max())
    job = ComputeJob(st.cores - st.comm_cores, 1000.0, 0.0, 0.75 * HBM * 1000.0)
    got = overlap(st, "all_gather", "mesh", members, M, job, compute_first=True)
    assert got.comm_us > alone * 1.1                 # its copies get a quarter of the HBM
    assert got.slowdown == 0.0                        # the kernel kept what it had
    with pytest.raises(ValueError, match="holds the whole HBM"):
        overlap(st, "all_gather", "mesh", members, M, ComputeJob(24, 10.0, 0.0, HBM * 10.0), compute_first=True)


def staged_gather_beside_a_kernel(comm, hbm_bytes: float) -> float:
    M = 256 * 1024
    x = stratacl.zeros((M // 4,), np.float32)
    out = stratacl.empty((comm.size * M // 4,), np.float32)
    work = comm.all_gather(out, x, async_op=True)
    comm.charge_compute(40.0, cores=8, hbm_bytes=hbm_bytes)
    end = comm.clock() * 1e6
    work.wait()
    return end


def test_charge_compute_counts_the_kernels_hbm_bytes_and_the_replay_agrees(tmp_path):
    free = stratacl.spawn(staged_gather_beside_a_kernel, 3, args=(0.0,), clock="virtual", registration="staged",
                          timeout=90)
    out = tmp_path / "hbm"
    heavy = stratacl.spawn(staged_gather_beside_a_kernel, 3, args=(HBM * 40.0,), clock="virtual",
                           registration="staged", trace=str(out), timeout=90)
    for a, b in zip(free, heavy):
        assert b > a > 0                              # the staging copies take HBM from the kernel
    r = ub.replay(ub.load_traces(str(out)))
    np.testing.assert_allclose(r.end_us, r.recorded_us, rtol=1e-12)


def too_much(comm) -> None:
    comm.charge_compute(10.0, hbm_bytes=HBM * 10.0 * 1.5)


def test_a_kernel_cannot_draw_more_than_the_hbm():
    with pytest.raises(ValueError, match="more than the die's HBM"):
        stratacl.spawn(too_much, 1, clock="virtual", timeout=60)
