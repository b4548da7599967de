"""Which calls of the paper-layout training step (TP 4, FSDP N/4, EP N/8, hidden 7168) sit on
its critical path in each configuration, and what partitioning and SDMA do to each: the kept
traces replayed with one kind of call made free, or with another partitioning or data path.

    python benchmarks/paper_size.py --workload train --configs roa,auto --keep KEEP     # the traces (~25 min)
    python benchmarks/train_breakdown.py --keep KEEP --configs roa,balanced,auto --ranks 64 \
        --json docs/results/train-breakdown-64.json                                             # ~4 min
    python benchmarks/train_breakdown.py --keep KEEP --configs roa,auto --ranks 512 \
        --free "expert all_reduce" --short --json docs/results/train-breakdown-512.json          # ~20 min

``KEEP/<config>.pkl`` holds a configuration's traces fitted to hidden 7168 at the recorded rank
counts (paper_size.py's ``--keep``). ``--ranks`` is one of those counts, or any larger N: the
traces are then extrapolated to N (``ub.extrapolate``), as paper_size.py does for 128 and 512.
``balanced`` and ``sdma``, when not kept, are made from roa's traces (their settings differ
only in partition and path, which the traces carry; auto made this way from roa's traces
replays to auto's own recorded step to the microsecond). The step is the second one, the
slowest rank's, as paper_size.py's ``train_metrics`` reads it.

Every call is given a kind from its operation and its group: FSDP all_gather / reduce_scatter
(N/4 ranks, 4 apart), TP all_reduce / all_gather (4 consecutive ranks), EP dispatch / combine
(stratacl.ep, the EP group), the experts' gradient all_reduce (the 8 replicas, N/8 apart), and
"other" (the job's set-up and check, outside the step). Per configuration and kind the table has:

    calls      the kind's calls in the step at the slowest rank
    call ms    their durations summed (each call's mean over its members of entering to end):
               what the fabric model charges, hidden behind compute or not
    blocked    what the slowest rank's program spent blocked in them (a blocking call from its
               issue to its end; an asynchronous one from the program's wait to the call's end);
               "compute (rest)" is the step less every blocked time: the kernels, slowed by the
               asynchronous calls that hold cores and HBM beside them
    if free    how the step moves with the kind's calls replaced by barriers over the same members
               (synchronisation kept; no bytes, no cores or HBM held); --free limits the kinds

Then whole-step counterfactuals (--short: fewer): roa's traces with the balanced partition, with
auto's path policy (asynchronous calls on SDMA), with SDMA for one asynchronous kind only or for
all but one; auto's traces with naive partition or every call on MTE. Replays are
``ub.replay``'s; per-call durations and the instrumented clocks are read off its replayer
(``ub._tracereplay._Replayer``, read only). No model parameter or library setting is changed:
only which calls the traces hold and the settings the configurations differ in (partition, path).
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time

import numpy as np

TP = 4
REPLICAS = 8
KINDS = ["FSDP all_gather", "FSDP reduce_scatter", "TP all_reduce", "TP all_gather", "EP dispatch", "EP combine",
         "expert all_reduce", "expert FSDP all_gather", "expert FSDP reduce_scatter", "other"]


def kinds_of(traces: list[dict]) -> dict:
    """(comm, k) -> the call's kind, for every call of the traces."""
    n = traces[0]["world"]
    ep_comms = {e["comm"] for t in traces for e in _records(t) if e["op"] in ("dispatch", "combine")}
    out = {}
    for t in traces:
        for rec in _records(t):
            key = (rec["comm"], rec["k"])
            if key in out:
                continue
            op, m = rec["op"], rec["members"]
            stride = m[1] - m[0] if len(m) > 1 else 0
            if op in ("dispatch", "combine"):
                kind = f"EP {op}"
            elif rec["comm"] in ep_comms:
                kind = "other"
            elif op in ("all_gather", "reduce_scatter") and len(m) == n // TP and stride == TP:
                kind = f"FSDP {op}"
            elif op == "all_reduce" and len(m) == REPLICAS and stride == n // REPLICAS:
                kind = "expert all_reduce"
            elif op in ("all_gather", "reduce_scatter") and len(m) == REPLICAS and stride == n // REPLICAS:
                kind = f"expert FSDP {op}"
            elif op in ("all_reduce", "all_gather") and len(m) == TP and stride == 1:
                kind = f"TP {op}"
            else:
                kind = "other"
            out[key] = kind
    return out


def _records(trace: dict):
    for e in trace["events"]:
        if e["e"] == "call":
            yield e
        elif e["e"] == "issue":
            yield from e["calls"]


def _step_of(trace: dict) -> dict:
    """(comm, k) -> the step (0, 1, ...) of this rank's program the call was issued in (-1: outside
    the steps; the program reads its clock at every step's start and end)."""
    out, clocks = {}, 0
    for e in trace["events"]:
        if e["e"] == "clock":
            clocks += 1
        for rec in (e["calls"] if e["e"] == "issue" else [e] if e["e"] == "call" else []):
            out[(rec["comm"], rec["k"])] = clocks // 2 if clocks % 2 else -1
    return out


def free(traces: list[dict], kinds: dict, which: set) -> list[dict]:
    """The traces with every call of a kind in ``which`` made a barrier over the same members."""
    def made_free(rec):
        if kinds[(rec["comm"], rec["k"])] not in which:
            return rec
        r = {k: v for k, v in rec.items() if k not in ("phases", "staging", "routing")}
        r.update(op="barrier", algo="mesh", nbytes=0, root=0, itemsize=1)
        return r
    return _map_records(traces, made_free)


def on_path(traces: list[dict], kinds: dict, which: set, path: str) -> list[dict]:
    """The traces with every call of a kind in ``which`` on data path ``path`` (mte | sdma)."""
    return _map_records(traces, lambda rec: {**rec, "path": path} if kinds[(rec["comm"], rec["k"])] in which
                        else rec)


def async_on_sdma(traces: list[dict]) -> list[dict]:
    """The path policy of ``--path auto`` applied to traces: asynchronous issues' calls on SDMA,
    the calls the program waits on at once on MTE."""
    out = []
    for t in traces:
        events = []
        for e in t["events"]:
            if e["e"] == "issue":
                path = "sdma" if e["async"] else "mte"
                e = {**e, "calls": [{**r, "path": path} for r in e["calls"]]}
            elif e["e"] == "call":
                e = {**e, "path": "mte"}
            events.append(e)
        out.append({**t, "events": events})
    return out


def with_partition(traces: list[dict], partition: str) -> list[dict]:
    return [{**t, "settings": {**t["settings"], "partition": partition}} for t in traces]


def _map_records(traces: list[dict], f) -> list[dict]:
    out = []
    for t in traces:
        events = []
        for e in t["events"]:
            if e["e"] == "call":
                e = {"e": "call", **f({k: v for k, v in e.items() if k != "e"})}
            elif e["e"] == "issue":
                e = {**e, "calls": [f(r) for r in e["calls"]]}
            events.append(e)
        out.append({**t, "events": events})
    return out


def step_us(traces: list[dict]) -> float:
    """The second step of the slowest rank, as paper_size.py's train_metrics reads it."""
    from stratacl import ub
    rep = ub.replay(traces)
    clocks = np.array(rep.clocks)
    return float(np.max(clocks[:, -1] - clocks[:, -2]))


def breakdown(traces: list[dict], kinds: dict) -> dict:
    """One replay of ``traces`` with a clock read around every blocking call and wait of the
    timed step: the step, the slowest rank, and per kind its calls' durations and what the
    slowest rank spent blocked in them."""
    from stratacl.ub._tracereplay import _Replayer

    timed = len([e for e in traces[0]["events"] if e["e"] == "clock"]) - 2    # the last step's first read
    tags, inst = [], []
    for t in traces:
        issue_kind = {}
        events, tag, clocks = [], [], 0
        for e in t["events"]:
            inside = clocks == timed + 1
            kind = None
            if e["e"] == "issue":
                issue_kind[e["id"]] = [kinds[(r["comm"], r["k"])] for r in e["calls"]]
            elif inside and e["e"] == "call":
                kind = kinds[(e["comm"], e["k"])]
            elif inside and e["e"] == "wait":
                ks = issue_kind.get(e["id"], [])
                kind = ks[0] if ks else None
            if kind is not None:
                events.append({"e": "clock"})
                tag.append(("pre", kind))
            events.append(e)
            if e["e"] == "clock":
                clocks += 1
                tag.append(("step", None))
            if kind is not None:
                events.append({"e": "clock"})
                tag.append(("post", kind))
        inst.append({**t, "events": events})
        tags.append(tag)
    job = _Replayer(inst)
    job.run()
    steps, blocked = [], []
    for r, tag in zip(job.ranks, tags):
        reads = np.array(r.reads)
        at = [i for i, (w, _) in enumerate(tag) if w == "step"]
        steps.append(reads[at[-1]] - reads[at[-2]])
        b = dict.fromkeys(KINDS, 0.0)
        for i, (w, kind) in enumerate(tag):
            if w == "pre":
                b[kind] += reads[i + 1] - reads[i]
        blocked.append(b)
    slowest = int(np.argmax(steps))
    step_of = {}
    for t in traces:
        step_of.update(_step_of(t))
    last = max(step_of.values())
    per = {k: {"calls": 0, "call_us": 0.0, "blocked_us": blocked[slowest][k]} for k in KINDS}
    for key, c in job.calls.items():
        if step_of[key] != last or slowest not in c.members:
            continue
        ent = np.array([c.entering[m] for m in c.members])
        per[kinds[key]]["calls"] += 1
        per[kinds[key]]["call_us"] += float(np.mean(c.ends - ent))
    return {"step_us": float(steps[slowest]), "slowest_rank": slowest, "kinds": per}


# configurations that differ from a recorded one only in settings the traces carry: made from
# its traces (auto made this way from roa's replays as auto's own recording does; see main)
DERIVED = {"balanced": ("roa", lambda t, kinds: with_partition(t, "balanced")),
           "sdma": ("roa", lambda t, kinds: on_path(with_partition(t, "balanced"), kinds, set(KINDS), "sdma"))}


def traces_at(keep: str, config: str, n: int, iteration: int | None = None) -> list[dict]:
    """``config``'s traces at ``n`` ranks: kept by paper_size.py --keep (``iteration``: its
    deployed training, ``--tokens --iterations``, kept per iteration with the experts' skew),
    extrapolated in N when ``n`` was not recorded (with the kept skew); or, for a configuration
    of DERIVED not kept, made from the one it differs from."""
    from stratacl import ep, ub
    path = os.path.join(keep, f"{config}.pkl" if iteration is None else f"{config}-i{iteration}.pkl")
    if not os.path.exists(path) and config in DERIVED:
        source, make = DERIVED[config]
        traces = traces_at(keep, source, n, iteration)
        return make(traces, kinds_of(traces))
    with open(path, "rb") as f:
        kept = pickle.load(f)
    if n in kept["ranks"]:
        return kept["traces"][kept["ranks"].index(n)]
    routing = ep.routing
    if kept.get("imbalance", 1.0) != 1.0:
        from paper_size import skewed_routing       # run as a file: its siblings import directly
        routing = skewed_routing(kept["imbalance"])
    return ub.extrapolate(*kept["traces"], n, routing=routing)


def show(out: dict, tables_only: bool = False) -> None:
    """Print a breakdown (``main``'s ``--json``): the table per kind, then the counterfactuals."""
    configs = list(out["configs"])
    if not tables_only:
        for c, got in out["configs"].items():
            print(f"{c} at N={out['ranks']}: step {got['step_us'] / 1e3:.2f} ms (slowest rank {got['slowest_rank']}), "
                  f"every call free {got['step_all_free_us'] / 1e3:.2f} ms")
    print()
    print(f"{'kind':<22}" + "".join(f"{c + ': calls':>17}{'call ms':>9}{'blocked':>9}{'if free':>9}" for c in configs))
    for k in KINDS:
        cells = []
        for c in configs:
            g = out["configs"][c]["kinds"][k]
            if not g["calls"] and not g["blocked_us"]:
                cells.append(f"{'-':>17}{'':>9}{'':>9}{'':>9}")
                continue
            moved = (f"{(g['step_if_free_us'] - out['configs'][c]['step_us']) / 1e3:>+9.2f}"
                     if "step_if_free_us" in g else f"{'':>9}")
            cells.append(f"{g['calls']:>17}{g['call_us'] / 1e3:>9.2f}{g['blocked_us'] / 1e3:>9.2f}{moved}")
        print(f"{k:<22}" + "".join(cells))
    rest = {c: out["configs"][c]["step_us"] - sum(g["blocked_us"] for g in out["configs"][c]["kinds"].values())
            for c in configs}
    print(f"{'compute (rest)':<22}" + "".join(f"{'':>17}{'':>9}{rest[c] / 1e3:>9.2f}{'':>9}" for c in configs))
    print(f"{'step':<22}" + "".join(f"{'':>17}{'':>9}{out['configs'][c]['step_us'] / 1e3:>9.2f}{'':>9}"
                                    for c in configs))
    print()

    if not tables_only:
        for r in out["counterfactuals"]:
            print(f"  {r['name']:<92}{r['step_us'] / 1e3:>8.2f} ms")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", help="paper_size.py --keep's directory")
    p.add_argument("--show", default=None, help="print a breakdown saved by --json, replaying nothing")
    p.add_argument("--configs", default="roa,auto")
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--iteration", type=int, default=None, help="the deployed training's traces at this iteration "
                                                                "(paper_size.py --tokens --iterations --keep)")
    p.add_argument("--free", default=None, help="the kinds made free one at a time (comma-separated; "
                                                 "default: every kind in the step)")
    p.add_argument("--short", action="store_true", help="fewer whole-step counterfactuals (replays at 512 ranks "
                                                        "take minutes each)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.show:
        with open(a.show) as f:
            show(json.load(f))
        return 0
    if not a.keep:
        p.error("--keep (or --show) is required")
    only = set(a.free.split(",")) if a.free else set(KINDS)
    configs = a.configs.split(",")
    t0 = time.time()
    out = {"command": " ".join(["python", "benchmarks/train_breakdown.py", *(sys.argv[1:] if argv is None else argv)]),
           "ranks": a.ranks, "configs": {}, "counterfactuals": []}
    base = {}
    for config in configs:
        traces = traces_at(a.keep, config, a.ranks, a.iteration)
        kinds = kinds_of(traces)
        base[config] = (traces, kinds)
        got = breakdown(traces, kinds)
        present = [k for k in KINDS if got["kinds"][k]["calls"] or got["kinds"][k]["blocked_us"]]
        for k in [k for k in present if k in only]:
            got["kinds"][k]["step_if_free_us"] = step_us(free(traces, kinds, {k}))
        comm = {k for k in KINDS if k != "other"}
        got["step_all_free_us"] = step_us(free(traces, kinds, comm))
        out["configs"][config] = got
        print(f"{config} at N={a.ranks}: step {got['step_us'] / 1e3:.2f} ms (slowest rank {got['slowest_rank']}), "
              f"every call free {got['step_all_free_us'] / 1e3:.2f} ms  [{time.time() - t0:.0f} s]", flush=True)
    show(out, tables_only=True)
    # the configurations' differences, one at a time, on one config's traces
    def row(name, traces):
        name = f"{whose}'s traces, {name}"
        s = step_us(traces)
        out["counterfactuals"].append({"name": name, "step_us": s})
        print(f"  {name:<92}{s / 1e3:>8.2f} ms  [{time.time() - t0:.0f} s]", flush=True)

    if "roa" in base:
        traces, kinds = base["roa"]
        whose = "roa"
        print("roa's traces (registration on allocation, naive partition, MTE) replayed with:")
        if not a.short:
            row("nothing changed", traces)
        bal = with_partition(traces, "balanced")
        row("partition balanced (= balanced)", bal)
        row("partition balanced, asynchronous calls on SDMA (= auto's policy)", async_on_sdma(bal))
        if not a.short:
            row("partition balanced, every call on SDMA (= sdma)", on_path(bal, kinds, set(KINDS), "sdma"))
        for k in ("FSDP all_gather", "FSDP reduce_scatter", "expert all_reduce"):
            if not a.short:
                row(f"partition balanced, only {k} on SDMA", on_path(bal, kinds, {k}, "sdma"))
            if k == "expert all_reduce" or not a.short:
                row(f"partition balanced, all asynchronous calls but {k} on SDMA",
                    on_path(async_on_sdma(bal), kinds, {k}, "mte"))
        if not a.short:
            row("naive partition, all asynchronous calls but expert all_reduce on SDMA",
                on_path(async_on_sdma(traces), kinds, {"expert all_reduce"}, "mte"))
    if "auto" in base and not a.short:
        traces, kinds = base["auto"]
        whose = "auto"
        print("auto's traces (balanced partition, SDMA for the asynchronous calls) replayed with:")
        row("nothing changed", traces)
        row("partition naive", with_partition(traces, "naive"))
        row("every call on MTE (= balanced)", on_path(traces, kinds, set(KINDS), "mte"))
    out["wall_s"] = time.time() - t0
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
