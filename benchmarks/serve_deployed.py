"""Serving as the paper deploys it: DeepSeek V4 Flash, 4 prefill instances (EP 32) and 4 decode
instances (EP 16) on 192 dies, a Poisson stream of Splitwise-length requests, in modeled time.

    python benchmarks/serve_deployed.py tables [--configs staged,auto,pool] [--json FILE] [--keep DIR]
    python benchmarks/serve_deployed.py verify [--config staged] [--json FILE]
    python benchmarks/serve_deployed.py sweep --tables FILE [--caps FILE] [--json FILE]

Two levels (docs/end-to-end.md, "Serving as the paper deploys it", where every setting and rule
is written down with its source):

``tables``: for each configuration (e2e.py's CONFIGS, launched by its ``_launch``), the prefill and
the decode step tables of ``examples/moe_serving.py --step-table`` at the paper's model and
instance sizes. Each table is recorded at the rank counts ``RANKS`` and hidden sizes ``HIDDEN``
(``--trace`` and ``--timeline``), fitted in hidden to 4096 (``ub.extrapolate_dimension``,
quadratic), extrapolated in N to the instance's EP (``ub.extrapolate``, the routing drawn anew with
the same skew over a shared expert order) and replayed; each iteration's time is read off the
replay's clocks (the latest rank's at each read), and taken from the recorded 3 layers to V4
Flash's 43 by adding 40 layer periods (the time between the reads at the tops of layers 1 and 2).

``verify``: the same path to hidden 512 and N = 16 against a real run there (batches up to 256),
and the layer rule against a real 5-layer run.

``sweep``: the deployment as a discrete-event model driven by the tables
(``benchmarks/pd_model.py``): request rates swept, normalized latency, P99 TTFT and P99 TPOT per
configuration, and the readings the rules define (Fig. 11a's throughput, Fig. 11b at 15 req/s).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import serving_deployment as deploy                      # noqa: E402
from e2e import NOCOMM, _launch, _nocomm_topology       # noqa: E402

RANKS = (4, 8)                    # recorded; extrapolated in N to the instances' EP
HIDDEN = (64, 128, 256)           # recorded; fitted to deploy.HIDDEN
LAYERS = 3                        # recorded; V4 Flash's 43 by the layer period
PREFILL = (1, 2, 4, 8, 14)        # prompts of PROMPT tokens a die (14 x 1155 = 16170 <= 16384)
DECODE = (1, 4, 16, 64, 256, 1024, 2048)   # requests a die
PROMPT = 1155                     # the trace's mean input
CONTEXT = 1260                    # a decode request's context: the mean input + half the mean output
EP = {"prefill": 32, "decode": 16}
SKEW = deploy.zipf_exponent(deploy.EXPERTS)


def model_args(hidden: int, kind: str, layers: int = LAYERS) -> list[str]:
    """The example's arguments for one table at ``hidden``: V4 Flash's model scaled to it."""
    return ["--hidden", str(hidden), "--ffn", str(deploy.expert_ffn(hidden)), "--layers", str(layers),
            "--experts-per-rank", str(deploy.EXPERTS // EP[kind]), "--topk", str(deploy.TOPK),
            "--routing", "seeded", "--skew", repr(SKEW), "--mtp", "--attention", "v4",
            "--vocab-charged", str(deploy.VOCAB), "--weight-bytes", str(deploy.WEIGHT_BYTES), "--rows", "float16",
            "--attention-weights", repr(deploy.dense_units()), "--prompt", str(PROMPT), "--context", str(CONTEXT),
            "--layer-clocks"]


def table_spec(kind: str, points) -> str:
    return f"{kind}=" + ",".join(str(c) for c in points)


def record(config: str, n: int, hidden: int, kind: str, points, tmp: str, check: bool = False,
           layers: int = LAYERS) -> tuple[list, dict]:
    """The step table of ``kind`` at ``points`` recorded at ``n`` ranks and ``hidden``: every
    rank's traces and the timeline."""
    from stratacl import ub

    d = os.path.join(tmp, f"{config}-{kind}-{n}-{hidden}-{layers}")
    _launch("examples/moe_serving.py", n, config, ["--step-table", table_spec(kind, points),
                                                   "--timeline", os.path.join(d, "timeline.json")],
            model_args(hidden, kind, layers) + ([] if check else ["--no-check"]), trace=d)
    traces = ub.load_traces(d)
    if config == NOCOMM:     # _launch's topology file is gone with its directory: the same one, kept here
        for t in traces:
            t["settings"]["topology"] = _nocomm_topology(tmp)
    with open(os.path.join(d, "timeline.json")) as f:
        return traces, json.load(f)


def step_times(replay, timeline: dict, layers: int = deploy.LAYERS) -> list[dict]:
    """Each table iteration's time (us) from a replay's clocks: as recorded, its layer period,
    and at ``layers`` layers (the recorded ones plus the period for each one more)."""
    import numpy as np

    agreed = np.max(np.array(replay.clocks), axis=0)
    recorded = len(timeline["layer_reads"][0]) - 1          # the MTP layer's read is the last
    out = []
    for i, (kind, count) in enumerate(timeline["table"]):
        t = agreed[timeline["bounds"][i + 1]] - agreed[timeline["bounds"][i]]
        tops = timeline["layer_reads"][i]
        period = agreed[tops[2]] - agreed[tops[1]]
        out.append({"kind": kind, "count": count, "recorded_us": float(t), "period_us": float(period),
                    "us": float(t + (layers - recorded) * period)})
    return out


def at_size(config: str, kind: str, points, hidden: int, n: int, tmp: str, ranks=RANKS, hiddens=HIDDEN,
            keep: str | None = None) -> list:
    """The table of ``kind`` at ``hidden`` and ``n`` ranks, from the recordings. ``keep``: a
    directory where the extrapolated traces and the timeline are pickled (``<config>-<kind>.pkl``)
    for ``benchmarks/e2e_sensitivity.py --workload serve`` to replay under a varied model."""
    from stratacl import ep, ub

    fitted, timeline = [], None
    for r in ranks:
        got = [record(config, r, h, kind, points, tmp) for h in hiddens]
        timeline = got[0][1]
        fitted.append(ub.extrapolate_dimension([t for t, _ in got], list(hiddens), hidden))
        print(f"  {config} {kind}: recorded N={r} at hidden {list(hiddens)}", flush=True)
    traces = ub.extrapolate(*fitted, n, routing=functools.partial(ep.routing, shared=True), skew=SKEW)
    if keep:
        import pickle
        os.makedirs(keep, exist_ok=True)
        with open(os.path.join(keep, f"{config}-{kind}.pkl"), "wb") as f:
            pickle.dump({"traces": traces, "timeline": timeline}, f)
    return step_times(ub.replay(traces), timeline)


def tables(configs: list[str], out: str | None, command: str, keep: str | None = None) -> dict:
    found = {"command": command, "settings": {"ranks": RANKS, "hidden": HIDDEN, "layers": LAYERS, "prompt": PROMPT,
                                              "context": CONTEXT, "skew": SKEW, "ep": EP,
                                              "args": {k: model_args(deploy.HIDDEN, k) for k in EP}},
             "tables": {}}
    for config in configs:
        with tempfile.TemporaryDirectory(prefix="stratacl-serve-") as tmp:
            got = {}
            for kind, points in (("decode", DECODE), ("prefill", PREFILL)):
                try:
                    got[kind] = at_size(config, kind, points, deploy.HIDDEN, EP[kind], tmp, keep=keep)
                except Exception as e:        # a refusal (ub.ReplayError) is reported, not hidden
                    got[kind] = {"refused": f"{type(e).__name__}: {e}"}
                    print(f"{config} {kind}: not extrapolated: {e}", flush=True)
                    continue
                for row in got[kind]:
                    print(f"{config:<10}{kind:<8}{row['count']:>6} a die: {row['us']:>12.1f} us "
                          f"(3 layers {row['recorded_us']:.1f}, period {row['period_us']:.1f})", flush=True)
            found["tables"][config] = got
        if out:               # after every configuration: a partial run keeps what it finished
            with open(out, "w") as f:
                json.dump(found, f, indent=1)
    return found


def verify(config: str, out: str | None, command: str, hidden: int = 512, n: int = 16,
           points=(1, 4, 16, 64, 256), prefill=(1, 2)) -> list[dict]:
    """The path to ``hidden`` and ``n`` against a real run there; the layer rule against 5 layers."""
    from stratacl import ub

    rows = []
    with tempfile.TemporaryDirectory(prefix="stratacl-serve-verify-") as tmp:
        for kind, pts in (("decode", points), ("prefill", prefill)):
            fit = at_size(config, kind, pts, hidden, n, tmp)
            traces, timeline = record(config, n, hidden, kind, pts, tmp)
            real = step_times(ub.replay(traces), timeline)
            for f, r in zip(fit, real):
                rows.append({"what": f"{kind} {f['count']} a die, hidden {HIDDEN} -> {hidden}, N {RANKS} -> {n}",
                             "fitted_us": f["recorded_us"], "real_us": r["recorded_us"],
                             "relative_error": f["recorded_us"] / r["recorded_us"] - 1})
                print(rows[-1], flush=True)
        # the layer rule: 3 layers + 2 periods against a real run of 5, at the smallest recorded size
        for kind, pts in (("decode", points[:3]), ("prefill", prefill)):
            three, tl3 = record(config, RANKS[0], HIDDEN[0], kind, pts, tmp)
            five, tl5 = record(config, RANKS[0], HIDDEN[0], kind, pts, tmp, layers=5)
            for f, r in zip(step_times(ub.replay(three), tl3, layers=5), step_times(ub.replay(five), tl5, layers=5)):
                rows.append({"what": f"{kind} {f['count']} a die, 3 layers + 2 periods against 5, N {RANKS[0]}, "
                                     f"hidden {HIDDEN[0]}", "fitted_us": f["us"], "real_us": r["recorded_us"],
                             "relative_error": f["us"] / r["recorded_us"] - 1})
                print(rows[-1], flush=True)
    if out:
        with open(out, "w") as f:
            json.dump({"command": command, "config": config, "verify": rows}, f, indent=1)
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("tables", "verify", "sweep"))
    p.add_argument("--configs", default="staged,jit,roa,balanced,sdma,auto,pool,nocomm")
    p.add_argument("--config", default="staged", help="verify: the configuration")
    p.add_argument("--tables", default=None, help="sweep: the tables' JSON")
    p.add_argument("--caps", default=None, help="sweep: benchmarks/fragmentation.py --model v4flash's JSON")
    p.add_argument("--keep", default=None, help="tables: pickle the extrapolated traces here (e2e_sensitivity.py)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    command = " ".join(["python", "benchmarks/serve_deployed.py", *argv])
    if a.what == "tables":
        tables(a.configs.split(","), a.json, command, a.keep)
    elif a.what == "verify":
        verify(a.config, a.json, command)
    else:
        import pd_model
        pd_model.main_sweep(a, command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
