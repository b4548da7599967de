"""How the end-to-end rows move when an assumed parameter moves: the recorded traces replayed
under cm384 with one parameter x0.5 and x2, no new runs.

    python benchmarks/e2e_sensitivity.py --keep DIR [--workload dlrm] [--scale 128]
                                         [--parameters all|NAME,...] [--json FILE]
    python benchmarks/e2e_sensitivity.py --keep DIR --workload train --iteration 200 --scale 512
                                         [--parameters ...] [--factors 0.5,2] [--no-base]
    python benchmarks/e2e_sensitivity.py --keep DIR --workload serve [--caps FILE] [--parameters ...]

``DIR`` holds the traces ``benchmarks/paper_size.py --keep DIR`` pickled (dlrm: per configuration
and cache size, every recorded rank count's traces at the target batch; train: per configuration
and iteration, ``--tokens --iterations --keep``, extrapolated with the kept experts' skew and
judged by ``paper._training_deployed``; serve: per configuration and table kind, the traces
``benchmarks/serve_deployed.py tables --keep DIR`` pickled at the instances' sizes, replayed into
step tables, the deployment swept over request rates (``pd_model.sweep``, the KV transfers timed
under the same variant) and judged by ``paper._serving_deployed``; ``--scale`` does not apply).
``--factors`` and ``--no-base`` split a long sweep over processes. For each variant of the
model (cm384 as it is, then each parameter of ASSUMED x0.5 and x2, ``paper.scaled_dict``) every
configuration's traces are extrapolated to ``--scale`` dies and replayed with the variant's
topology, and the report's own function for the workload's rows (``paper._dlrm_deployed``)
judges the steps it gives: which rows change whether they hold, and how far each moves.

What a replay can vary: every fabric, core, SDMA and registration parameter (the replay times
each call from the topology the traces name, here the variant's file); ``compute.efficiency``
too, since a trace keeps each kernel's time alone, the roofline over peak x efficiency and HBM x
efficiency, which scales exactly as 1 / efficiency (``_scale_kernels``). What it cannot: the
workload's own settings (the access law's exponent, the batch), which change what the program
does and need new recordings; the table says so.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import shlex
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:             # run as a file: its siblings import as they do in the package
    sys.path.insert(0, HERE)

import paper                          # noqa: E402
from dlrm_misses import per_die       # noqa: E402
from paper_size import train_metrics  # noqa: E402

CONFIGS = ("staged", "pool", "auto")
ZIPF = 1.05                           # the access law the recordings' misses come from (docs/end-to-end.md)
# the assumed parameters the end-to-end rows can depend on (paper.PARAMETERS' names and paths);
# "registration split" moves the four UB steps together, "RDMA pair" both RDMA numbers
ASSUMED = {
    "compute efficiency": [("compute", "efficiency")],
    "SDMA polling cores": [("sdma", "poll_cores")],
    "core setup of one row-granular transfer (us)": [("cores", "transfer_us")],
    "UB registration split (export, import, reserve VA, map)": [("registration", "export_us"),
                                                                ("registration", "import_us"),
                                                                ("registration", "reserve_va_us"),
                                                                ("registration", "map_us")],
    "RDMA registration pair (fixed, per GiB)": [("registration", "rdma_us"), ("registration", "rdma_us_per_gib")],
    "SDMA doorbell (us)": [("sdma", "doorbell_us")],
    "SDMA notify (us)": [("sdma", "notify_us")],
    "host tier latency (us)": [("tiers", "host", "latency_us")],
}
NOT_REPLAYED = {  # per workload: its own settings, which change what the program does
    "dlrm": {"the access law's exponent (Zipf 1.05)": "changes the misses a step: new recordings",
             "the batch a die (1024)": "changes the program's arrays: new recordings"},
    "train": {"the tokens a replica (16,384)": "changes the program's arrays: new recordings",
              "the routing skew's law over iterations": "changes the experts' loads: new recordings"},
    "serve": {"the lengths the tables are recorded at (prompts of 1,155 tokens, decode context 1,260: the "
              "Splitwise trace's means)": "changes the program's arrays: new recordings",
              "the experts' skew": "changes the experts' loads: new recordings",
              "the fabric-free bound (nocomm) and the ladder's jit, roa, balanced, sdma": "not kept: the rows "
              "judged are StrataCL's, HCCL-zerocopy's and HCCL's"},
}
SERVE_CONFIGS = ("staged", "pool", "auto")


def _variant(paths: list[tuple], factor: float) -> dict:
    d = copy.deepcopy(paper._topology._CM384)
    for path in paths:
        d = paper.scaled_dict(path, factor, d)
    return d


def _scale_kernels(traces: list[dict], factor: float) -> list[dict]:
    """The traces with every kernel's time alone divided by ``factor`` (compute.efficiency x factor)."""
    out = []
    for t in traces:
        t = dict(t)
        t["events"] = [dict(e, us=e["us"] / factor) if e.get("e") == "compute" else e for e in t["events"]]
        out.append(t)
    return out


def _retarget(traces: list[dict], topology: str) -> list[dict]:
    return [dict(t, settings=dict(t["settings"], topology=topology)) for t in traces]


def steps(kept: dict, scale: int, topology: str, kernel_factor: float = 1.0) -> dict:
    """Each kept (config, cache or iteration) set's step at ``scale`` dies, replayed under ``topology``."""
    from stratacl import ep, ub

    from paper_size import skewed_routing
    out = {}
    for key, k in kept.items():
        routing = skewed_routing(k["imbalance"]) if k.get("imbalance", 1.0) != 1.0 else ep.routing
        traces = ub.extrapolate(*k["traces"], scale, routing=routing)
        if kernel_factor != 1.0:
            traces = _scale_kernels(traces, kernel_factor)
        out[key] = train_metrics(ub.replay(_retarget(traces, topology)))["modeled_step_us"]
    return out


def load(keep: str) -> dict:
    """{(config, cache_gib): pickle} from paper_size.py --keep's files ``<config>-cache_gib<G>.pkl``."""
    if not os.path.isdir(keep):
        raise SystemExit(f"e2e_sensitivity: no directory {keep} (it holds the kept .pkl traces: paper_size.py --keep)")
    kept = {}
    for name in sorted(os.listdir(keep)):
        stem, ext = os.path.splitext(name)
        if ext != ".pkl" or "-cache_gib" not in stem:
            continue
        config, gib = stem.split("-cache_gib")
        if config in CONFIGS:
            with open(os.path.join(keep, name), "rb") as f:
                kept[(config, float(gib))] = pickle.load(f)
    if not kept:
        raise SystemExit(f"e2e_sensitivity: no <config>-cache_gib<G>.pkl in {keep} (paper_size.py --keep)")
    return kept


def load_train(keep: str, iteration: int) -> dict:
    """{(config, iteration): pickle} from paper_size.py --tokens --iterations --keep's files."""
    kept = {}
    for config in CONFIGS:
        path = os.path.join(keep, f"{config}-i{iteration}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as f:
                kept[(config, iteration)] = pickle.load(f)
    if len(kept) != len(CONFIGS):
        raise SystemExit(f"e2e_sensitivity: {', '.join(CONFIGS)}-i{iteration}.pkl needed in {keep}")
    return kept


def load_serve(keep: str) -> dict:
    """{(config, kind): pickle} from serve_deployed.py tables --keep's files ``<config>-<kind>.pkl``."""
    kept = {}
    for config in SERVE_CONFIGS:
        for kind in ("prefill", "decode"):
            path = os.path.join(keep, f"{config}-{kind}.pkl")
            if not os.path.exists(path):
                raise SystemExit(f"e2e_sensitivity: {path} needed (serve_deployed.py tables --keep)")
            with open(path, "rb") as f:
                kept[(config, kind)] = pickle.load(f)
    return kept


def serve_steps(kept: dict, topology: str, kernel_factor: float, caps: str) -> tuple[dict, dict]:
    """The kept step traces replayed under ``topology`` into step tables, the deployment swept
    over rates with them: (the sweep, the tables), as paper._serving_deployed reads them."""
    from stratacl import ub

    import pd_model
    from serve_deployed import PROMPT, step_times
    tables = {"settings": {"prompt": PROMPT}, "tables": {}}
    for (config, kind), k in kept.items():
        traces = _scale_kernels(k["traces"], kernel_factor) if kernel_factor != 1.0 else k["traces"]
        tables["tables"].setdefault(config, {})[kind] = step_times(ub.replay(_retarget(traces, topology)),
                                                                   k["timeline"])
    cap = pd_model.caps(caps)
    sweep = pd_model.sweep(tables, cap, list(SERVE_CONFIGS), log=lambda *_: None, topology=topology)
    sweep.update(caps={str(c): v for c, v in cap.items()}, settings={"fig11b_rate": pd_model.FIG11B_RATE})
    return sweep, tables["tables"]


def judge(found: dict, scale: int, workload: str = "dlrm") -> dict:
    """The report's rows from these steps: {claim: (here, holds)}."""
    if workload == "serve":          # found: (the sweep, the tables)
        rows = paper._serving_deployed(*found)
        return {r["claim"]: (r["here"], r["holds"]) for r in rows if r["claim"].startswith(("fig11a", "fig11b"))}
    if workload == "train":          # the recorded rows' dimensions, this replay's steps
        recorded = paper._rows_of(paper.TRAIN_DEPLOYED)
        rows = [dict(paper._pick(recorded, config=c, ranks=scale, iteration=it), modeled_step_us=us)
                for (c, it), us in found.items()]
        return {r["claim"]: (r["here"], r["holds"]) for r in paper._training_deployed(rows)}
    rows = [{"config": c, "ranks": scale, "cache_gib": g, "modeled_step_us": us,
             "miss_rate": per_die(g, ZIPF)["miss_fraction"]} for (c, g), us in found.items()]
    return {r["claim"]: (r["here"], r["holds"]) for r in paper._dlrm_deployed(rows)}


def _parameters(spec: str) -> list[str]:
    """--parameters' names: "all", "none", one whole name (names hold commas: "UB registration
    split (export, import, ...)"), or several separated by ";" (or by "," when none has one)."""
    if spec in ("all", "none"):
        return list(ASSUMED) if spec == "all" else []
    if spec in ASSUMED:
        return [spec]
    return spec.split(";" if ";" in spec else ",")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", required=True)
    p.add_argument("--workload", choices=("dlrm", "train", "serve"), default="dlrm")
    p.add_argument("--caps", default=os.path.join(paper.RESULTS, paper.SERVE_DEPLOYED_CAPS),
                   help="serve: benchmarks/fragmentation.py --model v4flash's JSON")
    p.add_argument("--iteration", type=int, default=200, help="train: the kept iteration")
    p.add_argument("--factors", default="0.5,2", help="each parameter's factors")
    p.add_argument("--no-base", action="store_true", help="skip cm384 as it is")
    p.add_argument("--scale", type=int, default=128)
    p.add_argument("--parameters", default="all")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    names = _parameters(a.parameters)
    unknown = [n for n in names if n not in ASSUMED]
    if unknown:
        p.error(f"--parameters: unknown {unknown}; the assumed parameters are {list(ASSUMED)}")
    if a.workload == "train":
        kept = load_train(a.keep, a.iteration)
    elif a.workload == "serve":
        kept = load_serve(a.keep)
    else:
        kept = load(a.keep)
    command = shlex.join(["python", "benchmarks/e2e_sensitivity.py", *(sys.argv[1:] if argv is None else argv)])
    dies = 192 if a.workload == "serve" else a.scale           # serve: the deployment's 4 x 32 + 4 x 16 dies
    out = {"command": command, "scale": dies, "not_replayed": NOT_REPLAYED[a.workload], "rows": []}
    with tempfile.TemporaryDirectory(prefix="stratacl-sensitivity-") as tmp:
        def run(name, factor, topo, kernel_factor=1.0):
            path = os.path.join(tmp, f"topology-{len(out['rows'])}.json")
            with open(path, "w") as f:
                json.dump(topo, f)
            if a.workload == "serve":
                found = serve_steps(kept, path, kernel_factor, a.caps)
                measured = {"sustained_rate": found[0]["readings"]["sustained_rate"]}
            else:
                found = steps(kept, a.scale, path, kernel_factor)
                measured = {"steps_us": {f"{c}@{g:g}": us for (c, g), us in found.items()}}
            claims = judge(found, a.scale, a.workload)
            out["rows"].append({"parameter": name, "factor": factor, **measured,
                                "claims": {k: {"here": h, "holds": bool(ok)} for k, (h, ok) in claims.items()}})
            print(f"{name} x{factor:g}: " + ", ".join(f"{k.split('.')[1]} {h:.3f} ({'holds' if ok else 'no'})"
                                                    for k, (h, ok) in claims.items()), flush=True)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(out, f, indent=1)
        if not a.no_base:
            run("cm384", 1.0, paper._topology._CM384)
        for name in names:
            for factor in (float(x) for x in a.factors.split(",")):
                paths = ASSUMED[name]
                kernels = factor if paths == [("compute", "efficiency")] else 1.0
                # efficiency is in the traces' kernel times, not read again by the replay
                run(name, factor, paper._topology._CM384 if kernels != 1.0 else _variant(paths, factor), kernels)
    if a.no_base:
        return 0
    base = out["rows"][0]["claims"]
    print("\n| parameter | x | " + " | ".join(k.split(".", 1)[1] for k in base) + " |")
    print("|---|---|" + "---|" * len(base))
    for r in out["rows"]:
        cells = [f"{v['here']:.3f}" + ("" if v["holds"] == base[k]["holds"] else " (flips)")
                 for k, v in r["claims"].items()]
        print(f"| {r['parameter']} | {r['factor']:g} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
