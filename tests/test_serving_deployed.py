"""Serving as the paper deploys it (docs/end-to-end.md, "Serving as the paper deploys it"): the
deployment's numbers (examples/serving_deployment.py), the example's options that run them
(examples/moe_serving.py: --mtp, --skew, --attention v4, --step-table), the step tables' path
to the paper's size (benchmarks/serve_deployed.py), the decode batch caps' mechanism
(benchmarks/fragmentation.py --model v4flash) and the deployment's model (benchmarks/pd_model.py).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import stratacl
from launch_helpers import launch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
from benchmarks import fragmentation, pd_model, serve_deployed  # noqa: E402
from examples import serving_deployment as deploy  # noqa: E402


# --- the numbers ---------------------------------------------------------------------------------
def test_lengths_match_the_splitwise_trace_s_statistics():
    ins, outs = deploy.splitwise_lengths(np.random.default_rng(0), 400_000)
    assert ins.min() >= 1 and outs.min() >= 1
    # inputs: a lognormal's least-squares fit (+3.6%, -2.6%, -0.9% of the trace's 1155, 1020, 4142)
    for got, want, tol in ((ins.mean(), 1155, 0.05), (np.median(ins), 1020, 0.04), (np.percentile(ins, 99), 4142, 0.02)):
        assert abs(got / want - 1) < tol, (got, want)
    # outputs: the beta matches all three (rounding up adds half a token to the mean)
    for got, want in ((outs.mean(), 211), (np.median(outs), 129), (np.percentile(outs, 99), 601)):
        assert abs(got / want - 1) < 0.01, (got, want)
    assert 7.5 < np.median(ins) / np.median(outs) < 8.3          # the paper's ~8:1


def test_the_skew_puts_twice_the_mean_on_the_hottest_expert_only_with_a_shared_order():
    s = deploy.zipf_exponent(256)
    q = np.arange(1, 257)
    assert 256 / np.sum(q ** -s) == pytest.approx(2.0, rel=1e-9)

    def load(shared):
        idx = stratacl.ep.routing(2048, 256, 6, 16, s, seed=3, shared=shared)
        counts = np.bincount(np.concatenate(idx).ravel(), minlength=256)
        return counts.max() / counts.mean()
    assert 1.8 < load(True) < 2.3            # EPLB's example: 2.13 and 2.05
    assert load(False) < 1.5                 # one order a rank: the sum over 16 sources flattens
    # every rank draws its own tokens; the order is the seed's alone
    a = stratacl.ep.routing([5, 7], 64, 6, 2, s, seed=9, shared=True)
    b = stratacl.ep.routing([5, 9], 64, 6, 2, s, seed=9, shared=True)
    assert np.array_equal(a[0], b[0]) and not np.array_equal(a[0], a[1][:5])


def test_weights_kv_and_attention_follow_the_model_s_dimensions():
    assert deploy.weights_a_die(16) == pytest.approx(24.829e9, rel=1e-3)
    assert deploy.weights_a_die(32) == pytest.approx(15.971e9, rel=1e-3)
    assert deploy.kv_bytes(0) == 43 * 128 * 584 and deploy.kv_bytes(1000) - deploy.kv_bytes(0) == 3850 * 1000
    assert deploy.expert_ffn(4096) == 3072 and deploy.dense_units() == pytest.approx(8.20, abs=0.01)
    one, two = deploy.v4_attention([(1259, 1)]), deploy.v4_attention([(1259, 2)])
    # a request's entries are read once a step: a second new token adds its FLOPs, barely its bytes
    assert two[0] > 1.9 * one[0] and two[1] < 1.01 * one[1]
    # past the window and the indexer's top-k, a token's work grows only with the 128:1 and indexer entries
    assert deploy.v4_attention([(100_000, 1)])[0] < 10 * deploy.v4_attention([(1000, 1)])[0]


def test_the_staged_path_s_buffers_take_hbm_the_zero_copy_paths_do_not():
    from collections import Counter

    from stratacl.runtime.pipeline import buffer_size

    zero, staged = (fragmentation.serving_v4_trace(64, 2, 1, staged=s) for s in (False, True))
    sizes = [Counter(op[2] for op in t.ops if op[0] == "a") for t in (zero, staged)]
    ll = 16 * 16 * 64 * 4096 * 2          # [16 experts, 16 ranks x 64 tokens a rank, 4096] x 2 B
    # the same trace but for the input and output buffers the staged path keeps, never freed
    assert sizes[1] - sizes[0] == Counter({buffer_size(ll): 2}) and not sizes[0] - sizes[1]
    assert len(staged.ops) == len(zero.ops) + 2


# --- the deployment's model ------------------------------------------------------------------------
def test_curves_are_linear_between_and_along_the_end_points_outside():
    f = pd_model.curve([(4, 40.0), (1, 10.0), (2, 20.0)])
    assert f(1.5) == pytest.approx(15.0) and f(8) == pytest.approx(80.0) and f(0.5) == pytest.approx(5.0)
    assert float(pd_model.curve([(1, 10.0), (2, 30.0)])(0)) == 0.0     # never below 0


def test_sustained_rate_is_the_crossing_of_the_target():
    pts = [(5, 1.0), (10, 1.5), (15, 3.0)]
    assert pd_model.sustained(pts, 2.0) == pytest.approx(10 + 5 * 0.5 / 1.5)
    assert pd_model.sustained(pts, 0.5) is None and pd_model.sustained(pts, 5.0) == float("inf")


def _tables(scale_decode: float = 1.0, scale_prefill: float = 1.0) -> dict:
    return {"prompt": 1155, "prefill": [{"count": c, "us": scale_prefill * (50_000 + 100_000 * c)} for c in (1, 14)],
            "decode": [{"count": b, "us": scale_decode * (20_000 + 30 * b)} for b in (1, 2048)]}


def test_the_deployment_is_slower_on_slower_steps_and_a_small_cap_binds():
    def kv(p, d, nbytes):
        return 50.0

    def simulate(tables, cap):
        return pd_model.simulate(40.0, tables, cap, kv, duration=40.0, warm=5.0)
    base = simulate(_tables(), 2000)
    assert base == simulate(_tables(), 2000)           # seeded
    assert base["requests"] > 0 and 1100 < base["mean_input"] < 1300 and 180 < base["mean_output"] < 240
    slow = simulate(_tables(scale_decode=1.5), 2000)
    assert slow["normalized_latency_us"] > base["normalized_latency_us"] and slow["p99_tpot_us"] > base["p99_tpot_us"]
    assert simulate(_tables(scale_prefill=1.5), 2000)["p99_ttft_us"] > base["p99_ttft_us"]
    capped = simulate(_tables(), 2)
    assert capped["largest_batch"] == 2 < base["largest_batch"]
    assert capped["normalized_latency_us"] > base["normalized_latency_us"]


def test_the_kv_cache_moves_between_nodes_for_the_fabric_s_time():
    us = pd_model.kv_time("roa")
    small, large = us(0, 0, deploy.kv_bytes(100)), us(0, 0, deploy.kv_bytes(4000))
    assert 0 < small < large
    # 15 MB more at the inter-node tier's 150 GB/s (or slower beyond a rack): at least 0.1 ms more
    assert large - small > 0.9 * (deploy.kv_bytes(4000) - deploy.kv_bytes(100)) / 150e3


# --- the example's options, run for real -------------------------------------------------------------
SMALL = ("--layers", "2", "--hidden", "64", "--ffn", "32", "--experts-per-rank", "2", "--topk", "4", "--vocab", "128",
         "--mean-input", "16", "--ratio", "2", "--warmup", "2", "--requests", "8", "--rate", "20000")


def _serve(*extra):
    run = launch("-n", "4", "--clock", "virtual", "--timeout", "90", str(EXAMPLES / "moe_serving.py"), *SMALL, *extra,
                 timeout=170)
    assert run.returncode == 0, run.explain()
    lines = run.stdout.splitlines()
    assert lines[2] == "exact against the job computed in one process, on every rank: yes", run.explain()
    m = re.search(r"(\d+) iterations \((\d+) prefill, (\d+) decode\)", lines[1])
    return int(m.group(3)), lines


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mtp_skew_and_v4_attention_are_exact_on_every_rank_and_mtp_needs_fewer_decode_steps():
    plain, _ = _serve("--routing", "seeded", "--skew", "0.3", "--attention", "v4")
    mtp, lines = _serve("--routing", "seeded", "--skew", "0.3", "--attention", "v4", "--mtp", "--vocab-charged", "129280")
    # the same requests (output mean 7.1 tokens): a kept draft makes a step yield two
    assert "output mean 7.1" in lines[1] and mtp < plain


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_step_tables_are_exact_and_extrapolate_in_hidden_to_a_real_run(tmp_path):
    """As serve_deployed.py records them (V4 Flash's options, MTP, skew, layer clocks), at 2 ranks:
    every rank exact, and the fit from hidden 32, 64, 128 equals a real run at 256 at every read."""
    from stratacl import ub

    got = {}
    for h in (32, 64, 128, 256):
        d = tmp_path / f"h{h}"
        args = serve_deployed.model_args(h, "decode")
        args[args.index("--experts-per-rank") + 1] = "4"
        args[args.index("--prompt") + 1], args[args.index("--context") + 1] = "24", "40"
        run = launch("-n", "2", "--clock", "virtual", "--trace", str(d), "--timeout", "120",
                     str(EXAMPLES / "moe_serving.py"), "--step-table", "prefill=1,2;decode=1,3",
                     "--timeline", str(d / "timeline.json"), "--vocab", "128", *args, timeout=240)
        assert run.returncode == 0, run.explain()
        lines = run.stdout.splitlines()
        assert lines[1] == "exact against the job computed in one process, on every rank: yes", run.explain()
        assert [x.split(":")[0] for x in lines[2:]] == ["prefill 1 a rank", "prefill 2 a rank", "decode 1 a rank",
                                                      "decode 3 a rank"], run.explain()
        got[h] = (ub.load_traces(str(d)), serve_deployed.json.loads((d / "timeline.json").read_text()))
    fitted = ub.replay(ub.extrapolate_dimension([got[h][0] for h in (32, 64, 128)], [32, 64, 128], 256))
    real = ub.replay(got[256][0])
    assert [x for c in fitted.clocks for x in c] == pytest.approx([x for c in real.clocks for x in c], rel=1e-9)
    steps = serve_deployed.step_times(real, got[256][1])
    assert [(s["kind"], s["count"]) for s in steps] == [("prefill", 1), ("prefill", 2), ("decode", 1), ("decode", 3)]
    assert all(s["period_us"] > 0 and s["us"] == pytest.approx(s["recorded_us"] + 40 * s["period_us"]) for s in steps)
    assert steps[1]["recorded_us"] > steps[0]["recorded_us"] and steps[3]["recorded_us"] > steps[2]["recorded_us"]
