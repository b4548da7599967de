"""End-to-end workloads under the paper's configurations, at host scale and at the paper's scale.

    python benchmarks/e2e.py [--workloads dlrm,train,serve] [--configs all] [--ranks 8] [--scale 128[,512]]
                             [--scale-from 4,8] [--steps 3] [--json FILE] [-- workload arguments]
    python benchmarks/e2e.py --workloads serve --ranks none --scale 16,32 --rates 0 -- --per-rank ...
    python benchmarks/e2e.py --workloads serve --rates 5000,20000,80000 --plot FILE.png
    python benchmarks/e2e.py --gaps [--workloads dlrm] [--ranks 8] [--json FILE]

For every workload (a program under examples/: dlrm, train, serve) and configuration (one launcher switch each,
as the paper's baselines and ablation, CONFIGS below) it runs the program under
``stratacl-launch -n RANKS --clock virtual`` and takes the modeled time of its last step (the
first steps pay one-time costs: jit registration of the buffers, the plans' first use). With
``--scale N[,N...]`` it also records the program with ``--trace`` at the two or three rank counts of
``--scale-from``, once with one step and once with two, extrapolates each set to each N
(``stratacl.ub.extrapolate``: every number of an SPMD step follows a + b x ranks, or
a + b x ranks + c / ranks from three recordings; groups keep their tiling; MoE routings are
drawn anew at N) and replays them through the fabric model (``stratacl.ub.replay``): the step
at N ranks is the difference. Serving has no steps: it extrapolates only under ``--per-rank``
(every rank the same requests' lengths, so its iterations have one shape at every N), is
recorded once per rank count with its ``--timeline``, and its metrics at N come from the
replay's clocks at the reads the timeline names (``serving_metrics``). No ranks run at N.
Rows (``--json``): {"workload", "config", "ranks", "scale", "modeled_step_us", "throughput",
"p99_ttft_us", "p99_tpot_us", "batch"}, null where a field does not apply; "scale" is "host"
(a real run) or "replay" (extrapolated). Serving rows also carry "normalized_latency_us".
``--gaps``: the distribution of
every call's allocation-to-communication gap in one run (StrataCL's configuration).
``--configs nocomm`` runs a workload with the fabric free (``_nocomm_topology``; the die's HBM
kept): its compute and the HBM traffic of its calls, which bounds what any communication
library can gain in it.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the paper's baselines and ablation (section 9, Fig. 13a), each one launcher switch away from
# the previous: HCCL copies through its buffers; +JIT registers user buffers at first use;
# RoA registers on allocation (naive core partitioning, cores move the bytes); +Part. balances
# the cores (LPT); +SDMA hands the copies to the engine (StrataCL). HCCL-zerocopy: everything
# pre-registered in one pool, on the non-expandable allocator, operators as RoA's.
CONFIGS = {
    "staged": ["--registration", "staged", "--partition", "naive", "--path", "mte"],
    "jit": ["--registration", "jit", "--partition", "naive", "--path", "mte"],
    "roa": ["--registration", "roa", "--partition", "naive", "--path", "mte"],
    "balanced": ["--registration", "roa", "--partition", "balanced", "--path", "mte"],
    "sdma": ["--registration", "roa", "--partition", "balanced", "--path", "sdma"],
    # StrataCL's path policy: the cores (MTE, the default path) for calls the program waits
    # on, SDMA for the asynchronous ones that overlap its compute (paper §6.3)
    "auto": ["--registration", "roa", "--partition", "balanced", "--path", "auto"],
    "pool": ["--registration", "pool", "--partition", "naive", "--path", "mte"],
}
# Not a baseline: the workload with the fabric free (cm384 with every fabric tier, port, core
# issue rate and SDMA cost made free; compute and the die's HBM as cm384's, so a call still
# reads and writes its bytes there): its compute plus the least any library's calls can take.
# Its speed over a configuration's bounds what a communication library could gain (Amdahl).
NOCOMM = "nocomm"


def _nocomm_topology(directory: str) -> str:
    """cm384 with the fabric free (HBM kept), as a topology file in ``directory``."""
    import copy

    from stratacl.ub import _topology

    free = 1e9                       # GB/s: no transfer of these workloads takes a measurable time
    t = copy.deepcopy(_topology._CM384)
    t["name"] = "cm384-nocomm"
    for level in t["levels"]:
        if "uplink_gbps" in level:
            level["uplink_gbps"] = free
    hbm = t["levels"][0]["tier"]     # the die's own memory: a kernel's roofline reads it (Topology.kernel_us)
    for name, tier in t["tiers"].items():
        if name != hbm:
            tier["latency_us"], tier["bandwidth_gbps"] = 0.0, free
    t["port"]["gbps"], t["cores"]["issue_gbps"] = free, free
    t["sdma"].update(descriptor_us=0.0, doorbell_us=0.0, notify_us=0.0)
    t["registration"].update(export_us=0.0, import_us=0.0, reserve_va_us=0.0, map_us=0.0, map_us_per_gib=0.0,
                             metadata_direct_us=0.0, metadata_relay_us=0.0)
    path = os.path.join(directory, "cm384-nocomm.json")
    with open(path, "w") as f:
        json.dump(t, f)
    return path

_STEP = re.compile(r"^step (\d+): loss [\d.]+\s+modeled ([\d.]+) us \(slowest rank\)$", re.M)
_SERVING = re.compile(r"^throughput ([\d.]+) tokens/s   normalized latency ([\d.]+) us/token   "
                      r"P99 TTFT ([\d.]+) us   P99 TPOT ([\d.]+) us   \(modeled\)$", re.M)


def _last_step(stdout: str) -> dict:
    steps = _STEP.findall(stdout)
    if not steps:
        raise SystemExit(f"e2e: no step lines in the output:\n{stdout[-2000:]}")
    return {"modeled_step_us": float(steps[-1][1])}


def _serving(stdout: str) -> dict:
    m = _SERVING.search(stdout)
    if m is None:
        raise SystemExit(f"e2e: no metrics line in the output:\n{stdout[-2000:]}")
    return {"throughput": float(m.group(1)), "p99_ttft_us": float(m.group(3)), "p99_tpot_us": float(m.group(4)),
            "normalized_latency_us": float(m.group(2))}


# workload -> (program, its arguments for sweeps, what its output gives, what "batch" is (argument,
# default), samples per rank and step for a throughput, or None)
WORKLOADS = {
    "dlrm": ("examples/dlrm.py", ["--no-check"], _last_step, ("--batch", 16), True),
    "train": ("examples/train_step.py", [], _last_step, ("--tokens", 16), False),
    "serve": ("examples/moe_serving.py", [], _serving, ("--max-batch", 16), False),
}


def _launch(program: str, n: int, config: str, steps: list[str], extra: list[str], trace: str | None = None) -> str:
    with tempfile.TemporaryDirectory(prefix="stratacl-e2e-") as tmp:
        # a traced run's topology file must outlive the run: its replay loads it by path
        where = os.path.dirname(os.path.abspath(trace)) if trace else tmp
        switches = CONFIGS["roa"] + ["--topology", _nocomm_topology(where)] if config == NOCOMM else CONFIGS[config]
        cmd = [sys.executable, "-m", "stratacl_launcher", "-n", str(n), "--clock", "virtual", "--timeout", "300",
               *switches, *(["--trace", trace] if trace else []), os.path.join(ROOT, program), *steps, *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"e2e: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def _row(workload: str, config: str, ranks: int, scale: str, found: dict, extra: list[str]) -> dict:
    flag, default = WORKLOADS[workload][3]
    batch = int(extra[extra.index(flag) + 1]) if flag in extra else default
    row = {"workload": workload, "config": config, "ranks": ranks, "scale": scale, "modeled_step_us": None,
           "throughput": None, "p99_ttft_us": None, "p99_tpot_us": None, "batch": batch, **found}
    if WORKLOADS[workload][4] and row["modeled_step_us"]:      # samples per second, every rank's batch
        row["throughput"] = ranks * batch / (row["modeled_step_us"] * 1e-6)
    return row


def _at_scale(workload: str, config: str, ns: list[int], sizes: tuple[int, ...], extra: list[str]) -> list[dict]:
    from stratacl import ep, ub

    program = WORKLOADS[workload][0]
    times = {n: [] for n in ns}
    with tempfile.TemporaryDirectory(prefix="stratacl-e2e-") as tmp:
        for steps in (1, 2):
            recorded = []
            for size in sizes:
                d = os.path.join(tmp, f"{steps}-{size}")
                _launch(program, size, config, ["--steps", str(steps)], extra, trace=d)
                recorded.append(ub.load_traces(d))
            for n in ns:
                times[n].append(ub.replay(ub.extrapolate(*recorded, n, routing=ep.routing)).time_us)
    return [{"modeled_step_us": times[n][1] - times[n][0]} for n in ns]


def _serve_at_scale(config: str, ns: list[int], sizes: tuple[int, ...], extra: list[str]) -> list[dict]:
    """Serving at each of ``ns`` ranks: the program recorded at ``sizes`` with ``--per-rank`` (every rank
    the same requests' lengths, so its iterations have one shape at every N), extrapolated and
    replayed; the metrics from the replay's clocks at the reads its timeline names."""
    from stratacl import ep, ub

    if "--per-rank" not in extra:
        raise ub.ReplayError("a request stream extrapolates only under --per-rank (pass it after --): otherwise its "
                             "iterations depend on N")
    with tempfile.TemporaryDirectory(prefix="stratacl-e2e-") as tmp:
        recorded = []
        for size in sizes:
            d = os.path.join(tmp, str(size))
            _launch(WORKLOADS["serve"][0], size, config, ["--timeline", os.path.join(d, "timeline.json")], extra,
                    trace=d)
            recorded.append(ub.load_traces(d))
        with open(os.path.join(d, "timeline.json")) as f:
            timeline = json.load(f)
        # replayed while the directory lives: a nocomm run's topology file is in it
        return [serving_metrics(ub.replay(ub.extrapolate(*recorded, n, routing=ep.routing)), timeline, n)
                for n in ns]


def serving_metrics(replay, timeline: dict, n: int) -> dict:
    """examples/moe_serving.py's metrics at ``n`` ranks from a replay of its traces (``clocks``:
    the agreed time at a read is the latest rank's) and its ``--timeline`` (recorded at any N
    under ``--per-rank``, where rank 0's requests stand for every rank's; or at ``n``)."""
    import numpy as np

    agreed = np.max(np.array(replay.clocks), axis=0) * 1e-6
    mine = np.arange(len(timeline["out_len"])) % timeline["ranks"] == 0
    if timeline["ranks"] == n:
        mine[:] = True
    elif not timeline["per_rank"]:
        raise ValueError(f"a timeline recorded at N={timeline['ranks']} without --per-rank gives no metrics at N={n}")
    copies = 1 if timeline["ranks"] == n else n

    def per_request(key):
        return np.tile(np.asarray(timeline[key])[mine], copies)
    origin = 0.0 if timeline["origin_read"] is None else agreed[timeline["origin_read"]]
    first, finish = agreed[per_request("first_read")], agreed[per_request("finish_read")]
    arrival, out_len = origin + per_request("stream_s"), per_request("out_len")
    multi = out_len > 1
    tpot = (finish[multi] - first[multi]) / (out_len[multi] - 1)
    return {"throughput": float(out_len.sum() / (finish.max() - origin)),
            "p99_ttft_us": float(np.percentile(first - arrival, 99) * 1e6),
            "p99_tpot_us": float(np.percentile(tpot, 99) * 1e6) if tpot.size else 0.0,
            "normalized_latency_us": float(np.mean((finish - arrival) / out_len) * 1e6)}


def _gaps(workload: str, n: int, steps: int, extra: list[str]) -> list[float]:
    """Every call's allocation-to-communication gap (wall seconds, runtime/services/_trace.py) in a run
    of ``workload`` at ``n`` ranks, registration on allocation."""
    from stratacl import ub

    with tempfile.TemporaryDirectory(prefix="stratacl-e2e-") as tmp:
        _launch(WORKLOADS[workload][0], n, "sdma", ["--steps", str(steps)] if workload != "serve" else [], extra,
                trace=tmp)
        traces = ub.load_traces(tmp)
    gaps = []
    for t in traces:
        for e in t["events"]:
            for c in ([e] if e["e"] == "call" else e.get("calls", [])):
                if c.get("gap_s") is not None:
                    gaps.append(c["gap_s"])
    return gaps


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="dlrm")
    p.add_argument("--configs", default="all", help=f"comma-separated, or all ({', '.join(CONFIGS)}); also {NOCOMM}: "
                                                     "the fabric free, the workload's compute and its calls' HBM traffic")
    p.add_argument("--ranks", default="8", help="comma-separated rank counts run on the host (none: only --scale)")
    p.add_argument("--scale", default="", help="also replay at these rank counts, comma-separated (each from the "
                                                "same recordings)")
    p.add_argument("--scale-from", default="4,8", help="the two or three rank counts recorded for --scale (three: "
                                                        "numbers may also shrink as 1 / ranks, as FSDP shards do)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--rates", default="", help="serve: comma-separated request rates (req/s of modeled time), one "
                                               "run each; rows carry 'rate'")
    p.add_argument("--plot", default=None, help="serve with --rates: draw normalized latency against rate here (PNG)")
    p.add_argument("--gaps", action="store_true",
                   help="instead: the allocation-to-communication gap of every call (paper Fig. 15a)")
    a = p.parse_args(argv)
    if a.gaps:
        import numpy as np
        print(f"{'workload':<10}{'ranks':>6}{'calls':>7}   allocation -> call, wall s: min / p10 / p50 / p90 / max")
        found = {}
        for workload in a.workloads.split(","):
            for n in (int(x) for x in a.ranks.split(",")):
                g = np.array(_gaps(workload, n, a.steps, WORKLOADS[workload][1] + extra))
                q = np.percentile(g, [0, 10, 50, 90, 100])
                print(f"{workload:<10}{n:>6}{g.size:>7}   " + " / ".join(f"{v:.3f}" for v in q))
                found[f"{workload}-{n}"] = g.tolist()
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"command": " ".join(["python", "benchmarks/e2e.py", *sys.argv[1:]]), "gaps_s": found}, f)
        return 0
    from stratacl import ub

    configs = list(CONFIGS) if a.configs == "all" else a.configs.split(",")
    sizes = tuple(int(x) for x in a.scale_from.split(","))
    scales = [int(x) for x in a.scale.split(",")] if a.scale not in ("", "0") else []
    rows = []
    print(f"{'workload':<10}{'config':<10}{'ranks':>6}  {'scale':<7}{'modeled step (us)':>18}{'throughput (/s)':>17}"
          f"{'P99 TTFT (us)':>15}{'P99 TPOT (us)':>15}")
    for workload in a.workloads.split(","):
        program, fixed, parse = WORKLOADS[workload][:3]
        args = fixed + extra
        steps = ["--steps", str(a.steps)] if parse is _last_step else []
        for config in configs:
            found = []
            rates = [float(r) for r in a.rates.split(",")] if a.rates and workload == "serve" else [None]
            for n in ([] if a.ranks == "none" else [int(x) for x in a.ranks.split(",")]):
                for rate in rates:
                    more = ["--rate", f"{rate:g}"] if rate is not None else []
                    row = _row(workload, config, n, "host", parse(_launch(program, n, config, steps, args + more)),
                               args)
                    if rate is not None:
                        row["rate"] = rate
                    found.append(row)
            for rate in (rates if scales else []):
                more = ["--rate", f"{rate:g}"] if rate is not None else []
                at_scale = _serve_at_scale if workload == "serve" else functools.partial(_at_scale, workload)
                try:
                    got = at_scale(config, scales, sizes, args + more)
                except ub.ReplayError as e:
                    print(f"{workload:<10}{config:<10}{a.scale:>6}  replay: not extrapolated: {e}", flush=True)
                    continue
                for n, one in zip(scales, got):
                    found.append(_row(workload, config, n, "replay", one, args))
                    if rate is not None:
                        found[-1]["rate"] = rate
            for r in found:
                cells = [f"{r[k]:.2f}" if isinstance(r[k], float) and k != "throughput" else
                         f"{r[k]:.4g}" if r[k] is not None else "-"
                         for k in ("modeled_step_us", "throughput", "p99_ttft_us", "p99_tpot_us")]
                print(f"{r['workload']:<10}{r['config']:<10}{r['ranks']:>6}  {r['scale']:<7}{cells[0]:>18}{cells[1]:>17}"
                      f"{cells[2]:>15}{cells[3]:>15}", flush=True)
            rows += found
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(["python", "benchmarks/e2e.py", *sys.argv[1:]]), "rows": rows}, f,
                      indent=1)
    if a.plot:
        _plot(rows, a.plot)
    return 0


def _plot(rows: list[dict], path: str) -> None:
    """Serving: normalized latency against request rate, one line per configuration (the
    paper's Fig. 11a axes)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for config in CONFIGS:
        pts = sorted((r["rate"], r["normalized_latency_us"]) for r in rows
                     if r["workload"] == "serve" and r["config"] == config and "rate" in r)
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=config)
    ax.set_xlabel("request rate (req/s, modeled)")
    ax.set_ylabel("normalized latency (us per generated token)")
    ax.set_title(f"MoE serving, N = {rows[0]['ranks']} (examples/moe_serving.py)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
