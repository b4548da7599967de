"""Modeled clocks in the data path: they agree with estimate-only mode, do not depend on the
host, and the throttled clock really slows wall time down."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import stratacl
from stratacl.bench._cases import shape

KIB, MIB = 1024, 1024 * 1024
CASES = [("all_gather", 64 * KIB), ("all_gather", MIB), ("reduce_scatter", 8 * MIB), ("all_reduce", 4 * KIB),
         ("all_reduce", 2 * MIB), ("all_to_all", MIB), ("broadcast", MIB), ("barrier", 0), ("sendrecv", 256 * KIB)]


def _latest(comm, t: float) -> float:
    v = np.array([t])
    comm.all_reduce(v, op="max")
    return float(v[0])


def periods(comm, cases, repeat: int = 3):
    """Modeled seconds per call of each case: from the last rank's clock before the calls to
    the last rank's clock after them, as stratacl-bench measures it."""
    n, me = comm.size, comm.rank
    out = []
    for op, size in cases:
        sh = shape(op, n, size, 4)
        x = stratacl.empty((max(sh.n_in, 1),), np.float32)[:sh.n_in]
        y = stratacl.empty((max(sh.n_out, 1),), np.float32)[:sh.n_out]

        def call():
            if op == "all_gather":
                comm.all_gather(y, x)
            elif op == "reduce_scatter":
                comm.reduce_scatter(y, x)
            elif op == "all_reduce":
                comm.all_reduce(x)
            elif op == "all_to_all":
                comm.all_to_all(y, x)
            elif op == "broadcast":
                comm.broadcast(x, root=0)
            elif op == "sendrecv":
                comm.sendrecv(x, (me + 1) % n, y, (me - 1) % n)
            else:
                comm.barrier()

        call()
        t0 = comm.clock()
        for _ in range(repeat):
            call()
        t1 = comm.clock()
        out.append((_latest(comm, t1) - _latest(comm, t0)) / repeat)
    return out, stratacl.stats()["clock"]


@pytest.mark.parametrize("algo", ["mesh", "ring"])
def test_virtual_clock_gives_the_estimate_on_every_rank(algo):
    n = 8
    results = stratacl.spawn(periods, n, args=(CASES,), clock="virtual", algo=algo, timeout=120)
    for i, (op, size) in enumerate(CASES):
        want = stratacl.estimate(op, n, size, algo=algo).time_us * 1e-6
        for rank, (got, _) in enumerate(results):
            assert got[i] == pytest.approx(want, rel=1e-9), f"{op} {size} B, rank {rank}"


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_modeled_times_do_not_depend_on_host_load():
    cases = [("all_gather", MIB), ("all_reduce", 64 * KIB), ("broadcast", 256 * KIB), ("sendrecv", 64 * KIB)]
    quiet = stratacl.spawn(periods, 4, args=(cases,), clock="virtual", algo="auto", timeout=120)
    burners = [subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 120\n"
                                 "while time.monotonic() < end: pass"]) for _ in range(3)]
    try:
        loaded = stratacl.spawn(periods, 4, args=(cases,), clock="virtual", algo="auto", timeout=120)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    for (q, qstats), (lo, lstats) in zip(quiet, loaded):
        assert q == lo                                  # bit for bit
        assert qstats["now_us"] == lstats["now_us"]
        assert qstats["calls"] == lstats["calls"]


def probe_clock(comm):
    comm.barrier()
    # no try/except: a program meant for either clock reads it and tests for None
    return comm.clock(), stratacl.config.clock


@pytest.mark.timeout(120)
def test_clock_reads_none_when_off_and_seconds_when_modeled():
    assert stratacl.spawn(probe_clock, 2) == [(None, "off")] * 2
    for t, clock in stratacl.spawn(probe_clock, 2, clock="virtual"):
        assert clock == "virtual" and isinstance(t, float) and t > 0.0


def throttled(comm, dilation: float):
    x = stratacl.empty((256 * KIB,), np.float32)
    out = stratacl.empty((comm.size * x.size,), np.float32)
    comm.all_gather(out, x)
    m0, w0 = comm.clock(), time.monotonic()
    for _ in range(5):
        comm.all_gather(out, x)
    return comm.clock() - m0, time.monotonic() - w0


def test_throttled_clock_slows_wall_time_to_the_model():
    dilation = 2000.0
    for modeled, wall in stratacl.spawn(throttled, 4, args=(dilation,), clock="throttled", dilation=dilation,
                                        timeout=120):
        assert modeled > 0
        assert wall >= 0.9 * modeled * dilation         # the ranks slept to follow the model


def test_bench_virtual_rows_equal_estimate_rows(tmp_path):
    common = ["all_reduce", "-n", "4", "-b", "64K", "-e", "4M", "-f", "8", "--algo", "ring"]
    v, e = tmp_path / "v.json", tmp_path / "e.json"
    # this interpreter's console script, whether or not its environment is on PATH
    bench = os.path.join(os.path.dirname(sys.executable), "stratacl-bench")
    subprocess.run([bench, *common, "-w", "1", "-i", "2", "--clock", "virtual", "--no-limit",
                    "-J", str(v)], check=True, capture_output=True, timeout=300)
    subprocess.run([bench, *common, "--estimate", "-J", str(e)], check=True, capture_output=True,
                   timeout=300)
    vr, er = json.loads(v.read_text())["rows"], json.loads(e.read_text())["rows"]
    assert [r["size"] for r in vr] == [r["size"] for r in er]
    for a, b in zip(vr, er):
        assert a["wrong"] == 0 and a["time_us"] > 0
        for key in ("model_time_us", "model_algbw", "model_busbw", "core_gap", "core_busy_us"):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12)


def test_a_user_topology_file_drives_the_model():
    from pathlib import Path
    from stratacl.ub import _topology
    path = str(Path(__file__).resolve().parents[1] / "examples" / "topologies" / "nvl72-like.json")
    topo = _topology.load(path)
    assert topo.tier(0, 71).name == "nvlink" and topo.tier(5, 5).name == "local"
    assert "nvl72-like" in topo.describe(72)
    mine = stratacl.estimate("all_gather", 72, 64 * MIB, topology=path)
    cm384 = stratacl.estimate("all_gather", 72, 64 * MIB, topology="cm384")
    assert mine.busbw > 4 * cm384.busbw                  # 900 GB/s NVLink against 150-210 GB/s UB tiers


def profiled(comm):
    x = stratacl.empty((256 * KIB,), np.float32)
    out = stratacl.empty((comm.size * x.size,), np.float32)
    with comm.probe("my_stage", core=3):
        comm.all_gather(out, x)
        comm.charge_compute(50.0, cores=8)
    comm.all_reduce(x)
    return "clock off" if comm.clock() is None else "clock answered"


def test_profile_dir_gets_a_perfetto_trace_per_rank(tmp_path):
    results = stratacl.spawn(profiled, 4, profile=str(tmp_path), timeout=120)
    assert results == ["clock off"] * 4                 # profiling models time without turning the clock on
    for rank in range(4):
        doc = json.loads((tmp_path / f"rank{rank}.json").read_text())
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        slices = [e for e in events if e.get("ph") == "X"]
        assert slices and all(e["pid"] == rank and e["dur"] >= 0 for e in slices)
        names = {e["name"] for e in slices}
        assert {"sync", "data", "compute", "my_stage"} <= names
        cores = {e["tid"] for e in slices if e["name"] == "data"}
        assert cores == set(range(24))                  # every communication core has a track
        summary = json.loads((tmp_path / f"rank{rank}.json.summary.json").read_text())
        assert summary[0]["rank"] == rank and 0 <= summary[0]["gap"] < 1
