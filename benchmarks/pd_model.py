"""The paper's serving deployment as a discrete-event model driven by step tables the emulator
made (benchmarks/serve_deployed.py): 4 prefill instances of 32 dies and 4 decode instances of
16 dies (192 dies), a Poisson stream of Splitwise-length requests, MTP, the KV cache moving over
the fabric, each decode die's batch capped by what fits its HBM.

    requests  arrive (Poisson, seeded); request i is dealt to prefill die i mod 128 and decode
              die i mod 64 (round robin; an instance is 32 or 16 consecutive dies)
    prefill   an instance steps all its dies together when any has a waiting request: each die
              takes waiting requests in order up to BUDGET tokens (at least one; none is split);
              the step takes the prefill table's time at the busiest die's tokens; the first
              token comes out at its end
    KV        then moves to the decode die: the fabric model's send/recv time between the two
              dies (ub._clock.model_send_recv) for deploy.kv_bytes(input) bytes
    decode    an instance steps all its dies together when any has a running request; at a
              step's start each die admits arrived requests in order up to its cap; the step
              takes the decode table's time at the largest batch of its dies; each request gains
              one token and, with probability deploy.MTP_ACCEPT (seeded), a second

A prefill instance never waits for a decode instance (the flow is one way), so the prefill
instances are simulated first and the decode instances after, each on its own. Everything in
it is written down in docs/end-to-end.md, "Serving as the paper deploys it", before its runs.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import serving_deployment as deploy        # noqa: E402

PREFILL_INSTANCES, PREFILL_DIES = 4, 32
DECODE_INSTANCES, DECODE_DIES = 4, 16
BUDGET = 16384                  # prompt tokens a die a prefill step (SGLang's default --max-prefill-tokens)
DURATION_S, WARM_S = 300.0, 30.0     # arrivals over this long; the metrics over requests after WARM_S
MIN_REQUESTS = 2000


def curve(points: list[tuple[float, float]]):
    """x -> y, linear between the points and along the first two or the last two outside them."""
    xs = np.array([p[0] for p in points], dtype=np.float64)
    ys = np.array([p[1] for p in points], dtype=np.float64)
    order = np.argsort(xs)
    xs, ys = xs[order], ys[order]

    def at(x):
        x = np.asarray(x, dtype=np.float64)
        inside = np.interp(x, xs, ys)
        lo = ys[0] + (x - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0])
        hi = ys[-1] + (x - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return np.maximum(0.0, np.where(x < xs[0], lo, np.where(x > xs[-1], hi, inside)))
    return at


def kv_time(config: str, topology: str = "cm384"):
    """(prefill die, decode die, bytes) -> us: the fabric model's send/recv between the two dies
    (global ranks: the prefill dies 0-127, the decode dies 128-191), linear in the bytes on an
    idle fabric, so timed at two sizes per pair and interpolated."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from e2e import CONFIGS, NOCOMM, _nocomm_topology
    from stratacl.runtime.pipeline import EAGER_BYTES
    from stratacl.ub._clock import FabricModel, model_send_recv

    flags = CONFIGS["roa" if config == NOCOMM else config]
    setting = {k: flags[flags.index(f"--{k}") + 1] for k in ("registration", "partition", "path")}
    if config == NOCOMM:
        import tempfile
        topology = _nocomm_topology(tempfile.mkdtemp(prefix="stratacl-pd-"))
    # a blocking call's path under auto (the transfer is waited for before the request decodes)
    model = FabricModel(topology, setting["registration"], partition=setting["partition"],
                        path="mte" if setting["path"] == "auto" else setting["path"], eager_bytes=EAGER_BYTES)
    cache: dict = {}

    def us(p: int, d: int, nbytes: float) -> float:
        key = (p, d)
        if key not in cache:
            a, b = (model_send_recv(model, p, PREFILL_INSTANCES * PREFILL_DIES + d, size, 0.0, 0.0)[1]
                    for size in (1 << 20, 1 << 24))
            cache[key] = (a, (b - a) / ((1 << 24) - (1 << 20)))
        a, slope = cache[key]
        return a + slope * (nbytes - (1 << 20))
    return us


def stream(rate: float, seed: int, duration: float = DURATION_S) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrival times (s), input and output lengths: Poisson at ``rate`` over ``duration`` (at
    least MIN_REQUESTS requests), the lengths from the trace's fitted distributions."""
    rng = np.random.default_rng([seed, 0])
    count = max(MIN_REQUESTS, int(rng.poisson(rate * duration)))
    arrival = np.cumsum(rng.exponential(1.0 / rate, count))
    ins, outs = deploy.splitwise_lengths(np.random.default_rng([seed, 1]), count)
    return arrival, ins, outs


def prefill(arrival: np.ndarray, ins: np.ndarray, step_us) -> np.ndarray:
    """Each request's first token (s): the end of its prefill step."""
    dies = PREFILL_INSTANCES * PREFILL_DIES
    first = np.zeros(arrival.size)
    for inst in range(PREFILL_INSTANCES):
        queues = [list(np.flatnonzero(np.arange(arrival.size) % dies == inst * PREFILL_DIES + d))
                  for d in range(PREFILL_DIES)]
        heads = [0] * PREFILL_DIES
        t = 0.0
        while any(h < len(q) for h, q in zip(heads, queues)):
            ready = [h < len(q) and arrival[q[h]] <= t for h, q in zip(heads, queues)]
            if not any(ready):
                t = min(arrival[q[h]] for h, q in zip(heads, queues) if h < len(q))
                continue
            taken, most = [], 0
            for d, q in enumerate(queues):
                tokens = 0
                while heads[d] < len(q) and arrival[q[heads[d]]] <= t and (
                        tokens == 0 or tokens + ins[q[heads[d]]] <= BUDGET):
                    tokens += ins[q[heads[d]]]
                    taken.append(q[heads[d]])
                    heads[d] += 1
                most = max(most, tokens)
            t += float(step_us(most)) * 1e-6
            first[taken] = t
    return first


def decode(ready: np.ndarray, outs: np.ndarray, cap: int, step_us, seed: int) -> tuple[np.ndarray, int]:
    """Each request's finish (s), its KV cache on its decode die at ``ready``; and the largest
    batch a die reached. A request with one output token is done at its prefill."""
    dies = DECODE_INSTANCES * DECODE_DIES
    finish = np.where(outs <= 1, ready, np.nan)
    largest = 0
    for inst in range(DECODE_INSTANCES):
        rng = np.random.default_rng([seed, 2, inst])
        mine = [np.flatnonzero((np.arange(ready.size) % dies == inst * DECODE_DIES + d) & (outs > 1))
                for d in range(DECODE_DIES)]
        queues = [q[np.argsort(ready[q], kind="stable")] for q in mine]
        heads = [0] * DECODE_DIES
        running = [np.zeros(0, dtype=np.int64) for _ in range(DECODE_DIES)]
        left = outs.astype(np.int64) - 1          # the first token came from prefill
        t = 0.0
        while any(h < len(q) for h, q in zip(heads, queues)) or any(r.size for r in running):
            for d, q in enumerate(queues):
                room = cap - running[d].size
                h = heads[d]
                while room > 0 and h < len(q) and ready[q[h]] <= t:
                    h += 1
                    room -= 1
                if h > heads[d]:
                    running[d] = np.concatenate([running[d], q[heads[d]:h]])
                    heads[d] = h
            batch = max(r.size for r in running)
            if batch == 0:
                t = min(ready[q[h]] for h, q in zip(heads, queues) if h < len(q))
                continue
            largest = max(largest, batch)
            t += float(step_us(batch)) * 1e-6
            for d in range(DECODE_DIES):
                r = running[d]
                if r.size:
                    left[r] -= 1 + (rng.random(r.size) < deploy.MTP_ACCEPT)
                    done = left[r] <= 0
                    finish[r[done]] = t
                    running[d] = r[~done]
    return finish, largest


def simulate(rate: float, tables: dict, cap: int, kv_us, seed: int = 1, duration: float = DURATION_S,
             warm: float = WARM_S) -> dict:
    """One configuration at one rate: the paper's metrics over the requests arriving after ``warm``."""
    arrival, ins, outs = stream(rate, seed, duration)
    prefill_us = curve([(c * tables["prompt"], r["us"]) for r in tables["prefill"] for c in [r["count"]]])
    decode_us = curve([(r["count"], r["us"]) for r in tables["decode"]])
    first = prefill(arrival, ins, prefill_us)
    dies_p, dies_d = PREFILL_INSTANCES * PREFILL_DIES, DECODE_INSTANCES * DECODE_DIES
    i = np.arange(arrival.size)
    ready = first + np.array([kv_us(p, d, deploy.kv_bytes(x)) for p, d, x in zip(i % dies_p, i % dies_d, ins)]) * 1e-6
    finish, largest = decode(ready, outs, cap, decode_us, seed)
    m = arrival >= warm
    ttft = first[m] - arrival[m]
    multi = m & (outs > 1)
    tpot = (finish[multi] - first[multi]) / (outs[multi] - 1)
    return {"rate": rate, "requests": int(m.sum()), "normalized_latency_us": float(np.mean((finish[m] - arrival[m])
                                                                                       / outs[m]) * 1e6),
            "p99_ttft_us": float(np.percentile(ttft, 99) * 1e6), "p99_tpot_us": float(np.percentile(tpot, 99) * 1e6),
            "throughput": float(outs.sum() / (np.nanmax(finish) - arrival[0])), "largest_batch": largest,
            "batch_cap": cap, "mean_input": float(ins[m].mean()), "mean_output": float(outs[m].mean())}


# --- the sweep and its readings (the rules of docs/end-to-end.md) ---------------------------------
AXIS = (5.0, 10.0, 15.0, 20.0, 25.0, 30.0)     # Fig. 11a's axis, req/s at 192 dies
GROWTH, MAX_RATE = 1.25, 3000.0
TARGET = 2.0           # sustained: normalized latency at most TARGET x HCCL's at the lowest rate
FIG11B_RATE = 15.0


def caps(path: str) -> dict:
    """The decode batch cap a die per configuration, from fragmentation.py --model v4flash's rows."""
    with open(path) as f:
        rows = json.load(f)

    def largest(allocator):
        return next(r["max_batch"] for r in rows if r["allocator"] == allocator)
    roa = largest("expandable (roa)")
    return {"staged": largest("expandable, staged buffers (staged)"), "pool": largest("caching (pool)"), None: roa}


def sustained(points: list[tuple[float, float]], target: float) -> float | None:
    """The highest rate whose normalized latency is at most ``target``, the crossing interpolated
    linearly between swept rates; None when even the lowest is over it; inf when none is."""
    points = sorted(points)
    if points[0][1] > target:
        return None
    for (r0, y0), (r1, y1) in zip(points, points[1:]):
        if y1 > target:
            return r0 + (target - y0) * (r1 - r0) / (y1 - y0)
    return float("inf")


def sweep(tables: dict, cap: dict, configs: list[str], seed: int = 1, log=print, topology: str = "cm384") -> dict:
    kv = {c: kv_time(c, topology) for c in configs}
    settings = {"prompt": tables["settings"]["prompt"]}

    def run(config, rate):
        t = dict(tables["tables"][config], **settings)
        got = simulate(rate, t, cap.get(config, cap[None]), kv[config], seed)
        log(f"{config:<10}{rate:>9.1f} req/s  normalized latency {got['normalized_latency_us'] / 1e3:9.2f} ms  "
            f"P99 TTFT {got['p99_ttft_us'] / 1e6:9.3f} s  P99 TPOT {got['p99_tpot_us'] / 1e3:8.2f} ms  "
            f"{got['throughput']:10.0f} tokens/s  batch {got['largest_batch']}/{got['batch_cap']}")
        return dict(got, config=config)

    rows = [run("staged", AXIS[0])]
    threshold = TARGET * rows[0]["normalized_latency_us"]
    rate, k = AXIS[0], 0
    while rate <= MAX_RATE:
        here = [r for r in rows if r["rate"] == rate] + [run(c, rate) for c in configs
                                                         if not any(r["rate"] == rate and r["config"] == c
                                                                    for r in rows)]
        rows += [r for r in here if r not in rows]
        if all(r["normalized_latency_us"] > 3 * threshold for r in here):
            break
        k += 1
        rate = AXIS[k] if k < len(AXIS) else rate * GROWTH
    reach = {c: sustained([(r["rate"], r["normalized_latency_us"]) for r in rows if r["config"] == c], threshold)
             for c in configs}
    readings = {"threshold_us": threshold, "sustained_rate": reach}
    high = reach.get("staged")
    if high and np.isfinite(high):
        readings["high_load_rate"] = high
        readings["high_load"] = [run(c, high) for c in configs]
    return {"rows": rows, "readings": readings}


def main_sweep(a, command: str) -> None:
    with open(a.tables) as f:
        tables = json.load(f)
    cap = caps(a.caps)
    configs = [c for c in a.configs.split(",") if c in tables["tables"]
               and all(isinstance(tables["tables"][c].get(k), list) for k in ("prefill", "decode"))]
    got = sweep(tables, cap, configs)
    got.update(command=command, tables=a.tables, caps={str(k): v for k, v in cap.items()},
               settings={"prefill_instances": PREFILL_INSTANCES, "prefill_dies": PREFILL_DIES,
                         "decode_instances": DECODE_INSTANCES, "decode_dies": DECODE_DIES, "budget": BUDGET,
                         "duration_s": DURATION_S, "warm_s": WARM_S, "axis": AXIS, "growth": GROWTH,
                         "target": TARGET, "fig11b_rate": FIG11B_RATE, "mtp_accept": deploy.MTP_ACCEPT})
    r = got["readings"]
    print("sustained rate (normalized latency <= %.2f ms): " % (r["threshold_us"] / 1e3)
          + ", ".join(f"{c} {v:.1f}" if v is not None else f"{c} -" for c, v in r["sustained_rate"].items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(got, f, indent=1)
