"""benchmarks/e2e_sensitivity.py: the end-to-end rows' sensitivity by replaying kept traces.

The replays stand in for new runs, so each way it varies the model must equal a run made with
that model: a parameter through the topology file the traces are retargeted to, and the compute
efficiency through the kernels' recorded times."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch_helpers import launch

from benchmarks import e2e_sensitivity as sens
from benchmarks.paper_size import train_metrics
from stratacl import ub

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DLRM = ("--steps", "2", "--batch", "8", "--rows", "64", "--tables-per-rank", "1", "--pooling", "1",
        "--miss-rate", "0.25", "--no-check")      # misses on the step: the host tier shows in it


def test_a_variant_scales_every_parameter_it_names_and_nothing_else():
    base = sens.paper._topology._CM384
    d = sens._variant(sens.ASSUMED["UB registration split (export, import, reserve VA, map)"], 2.0)
    for key in ("export_us", "import_us", "reserve_va_us", "map_us"):
        assert d["registration"][key] == 2 * base["registration"][key]
    assert d["registration"]["map_us_per_gib"] == base["registration"]["map_us_per_gib"]
    assert {k: v for k, v in d.items() if k != "registration"} == {k: v for k, v in base.items() if k != "registration"}
    # counts stay at least 1: half of one polling core is one
    assert sens._variant([("sdma", "poll_cores")], 0.5)["sdma"]["poll_cores"] == 1


def test_scaling_kernels_touches_compute_events_only():
    traces = [{"events": [{"e": "compute", "us": 8.0, "cores": 4}, {"e": "clock"}, {"e": "call", "us": 3.0}]}]
    out = sens._scale_kernels(traces, 2.0)
    assert out[0]["events"] == [{"e": "compute", "us": 4.0, "cores": 4}, {"e": "clock"}, {"e": "call", "us": 3.0}]
    assert traces[0]["events"][0]["us"] == 8.0                  # the kept traces are not changed


@pytest.mark.timeout(300)
def test_replays_under_a_variant_equal_runs_made_with_it(tmp_path):
    # a DLRM step with the cache's misses, recorded under cm384, replayed (1) under a topology file
    # with the host tier's latency doubled and (2) with the compute efficiency halved through the
    # kernels' times; each equals a run recorded with that topology file
    cm384 = sens.paper._topology._CM384
    variants = {"host": sens._variant([("tiers", "host", "latency_us")], 2.0),
                "efficiency": sens._variant([("compute", "efficiency")], 0.5)}
    steps = {}
    for name, topo in [("cm384", cm384)] + list(variants.items()):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(topo))
        run = launch("-n", "3", "--clock", "virtual", "--timeout", "90", "--topology", str(path),
                     "--registration", "staged", "--trace", str(tmp_path / name), str(EXAMPLES / "dlrm.py"), *DLRM,
                     timeout=200)
        assert run.returncode == 0, run.explain()
        steps[name] = train_metrics(ub.replay(ub.load_traces(str(tmp_path / name))))["modeled_step_us"]
    kept = ub.load_traces(str(tmp_path / "cm384"))
    host = train_metrics(ub.replay(sens._retarget(kept, str(tmp_path / "host.json"))))["modeled_step_us"]
    slow = train_metrics(ub.replay(sens._retarget(sens._scale_kernels(kept, 0.5), str(tmp_path / "efficiency.json")))
                         )["modeled_step_us"]
    assert host == pytest.approx(steps["host"], rel=1e-9) and host != pytest.approx(steps["cm384"], rel=1e-6)
    assert slow == pytest.approx(steps["efficiency"], rel=1e-9) and slow > steps["cm384"]


def test_the_serving_rows_judge_a_given_sweep_as_the_report_judges_the_recorded_one():
    # e2e_sensitivity --workload serve hands its sweep and tables to the report's own rows: with
    # the recorded ones they are the report's rows, and judge keeps Fig. 11a's and 11b's
    paper = sens.paper
    with open(Path(paper.RESULTS) / paper.SERVE_DEPLOYED) as f:
        sweep = json.load(f)
    with open(Path(paper.RESULTS) / paper.SERVE_DEPLOYED_TABLES) as f:
        tables = json.load(f)["tables"]
    rows = {r["claim"]: (r["here"], r["holds"]) for r in paper._serving_deployed()}
    judged = sens.judge((sweep, tables), 192, "serve")
    assert sorted(judged) == ["fig11a.strata_over_hccl.deployed", "fig11a.strata_over_zerocopy.deployed",
                              "fig11a.zerocopy_over_hccl.deployed", "fig11b.p99_tpot_lower.deployed",
                              "fig11b.p99_ttft_lower.deployed"]
    assert all(judged[c] == rows[c] for c in judged)
    # the replays keep StrataCL's, HCCL-zerocopy's and HCCL's tables only: no fabric-free bound
    kept = {c: tables[c] for c in sens.SERVE_CONFIGS}
    alone = json.loads(json.dumps(sweep))
    alone["readings"]["sustained_rate"] = {c: alone["readings"]["sustained_rate"][c] for c in sens.SERVE_CONFIGS}
    alone["rows"] = [r for r in alone["rows"] if r["config"] in sens.SERVE_CONFIGS]
    assert sens.judge((alone, kept), 192, "serve") == judged
    # another sweep is judged, not the recorded one: StrataCL's rate doubled doubles its row
    faster = json.loads(json.dumps(sweep))
    faster["readings"]["sustained_rate"]["auto"] *= 2
    assert sens.judge((faster, tables), 192, "serve")["fig11a.strata_over_hccl.deployed"][0] == \
        pytest.approx(2 * rows["fig11a.strata_over_hccl.deployed"][0])


def test_a_parameter_whose_name_holds_commas_is_one_parameter(capsys):
    with pytest.raises(SystemExit):
        sens.main(["--keep", "/nonexistent", "--parameters", "compute efficiency,no such parameter"])
    assert "unknown ['no such parameter']" in capsys.readouterr().err
    # the registration split's name, commas and all, is one parameter: it passes the check and
    # the run goes on to find no kept traces
    with pytest.raises(SystemExit, match="pkl"):
        sens.main(["--keep", "/nonexistent", "--parameters", "UB registration split (export, import, reserve VA, map)"])
