"""``stratacl-bench dispatch|combine``: MoE expert-parallel calls on N ranks, nccl-tests style.

    stratacl-bench dispatch -n 8 --tokens 128,512 --hidden 7168 --topk 8 --experts 256 --mode ht
                   [--skew S] [--seed 0] [--dtype float16] [--partition naive|balanced]
                   [--registration roa|jit|pool|staged] [--path mte|sdma] [--clock virtual]
                   [--buffers hbm|plain] [-w 2] [-i 10] [-c 1] [-J out.json]
    stratacl-bench combine -n 32 --tokens 4096 --hidden 7168 --mode ll --estimate

One row per token count. Every rank routes its tokens with ``stratacl.ep.routing`` (seeded;
``--skew`` 0 is uniform, see ep/_routing.py). Bus bandwidth is counted as DeepEP's tests count
it: the bytes a rank receives in dispatch (high-throughput: a row per token and destination
rank; low-latency: per token and expert), or sends back in combine (the same rows), over the
call's time, averaged over ranks. ``size`` is those bytes (mean per rank), ``count`` the rows.
A timed combine combines the rows of one untimed dispatch.

Checks (``-c``): every rank's token rows are a function of (rank, token, column), exactly
representable in float16, so each receiver rebuilds the rows it should get and the sums it
should return without the senders' arrays; ``wrong`` counts differing elements over all ranks.

``--clock virtual`` adds ``model_time_us`` and ``model_busbw`` (the ranks' modeled clocks) and
``core_gap`` (slowest minus fastest core completion over the slowest, worst rank, of the call
as the ranks' model times it). ``--estimate`` starts no rank: rows from ``stratacl.ep.estimate``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

OPS = ("dispatch", "combine")


def token_rows(rank: int, tokens: np.ndarray, hidden: int, dtype) -> np.ndarray:
    """Rows ``tokens`` of rank ``rank``'s input: multiples of 1/8 below 128, exact in float16."""
    t = np.asarray(tokens, dtype=np.int64)[:, None]
    j = np.arange(hidden, dtype=np.int64)[None, :]
    return (((rank * 131 + t * 7 + j) % 1024) / 8.0).astype(dtype)


def _weights(seed: int, rank: int, shape: tuple) -> np.ndarray:
    return np.random.default_rng([seed, 99, rank]).random(shape).astype(np.float32)


def _expected(spec: dict, n: int, me: int, routes: list[np.ndarray]) -> dict:
    """What rank ``me`` must receive and return, rebuilt from the routing and ``token_rows``."""
    E, L, H, dt = spec["experts"], spec["experts"] // n, spec["hidden"], np.dtype(spec["dtype"])
    src, tok = [], []
    per_expert = [[] for _ in range(L)]
    for p, idx in enumerate(routes):
        mine = (idx >= me * L) & (idx < (me + 1) * L)
        hit = np.flatnonzero(mine.any(axis=1))
        src.append(np.full(hit.size, p))
        tok.append(hit)
        for e in range(L):
            per_expert[e].append((p, np.flatnonzero((idx == me * L + e).any(axis=1))))
    out = {"src": np.concatenate(src) if src else np.zeros(0, np.int64),
           "tok": np.concatenate(tok) if tok else np.zeros(0, np.int64), "per_expert": per_expert}
    own = routes[me]
    x = token_rows(me, np.arange(own.shape[0]), H, dt)
    if spec["mode"] == "ht":
        ranks_hit = np.zeros(own.shape[0], dtype=np.int64)
        for d in range(n):
            ranks_hit += ((own >= d * L) & (own < (d + 1) * L)).any(axis=1)
        acc = np.zeros(x.shape, dtype=np.float32)
        for m in range(1, n + 1):         # the same additions, in the same order, as the combine
            sel = ranks_hit >= m
            acc[sel] += x[sel].astype(np.float32)
        out["combined"] = acc.astype(dt)
    else:
        w = _weights(spec["seed"], me, own.shape)
        acc = np.zeros(x.shape, dtype=np.float32)
        for k in range(own.shape[1]):
            sel = own[:, k] >= 0
            acc[sel] += w[sel, k, None] * x[sel].astype(np.float32)
        out["combined"] = acc.astype(dt)
    del E
    return out


def _wrong(spec: dict, n: int, me: int, routes, got) -> int:
    exp = _expected(spec, n, me, routes)
    H, dt = spec["hidden"], np.dtype(spec["dtype"])
    if spec["op"] == "combine":
        return int(np.count_nonzero(got.view(np.uint8) != exp["combined"].view(np.uint8))) if \
            got.shape == exp["combined"].shape else exp["combined"].size
    if spec["mode"] == "ht":
        want = np.concatenate([token_rows(p, exp["tok"][exp["src"] == p], H, dt) for p in range(n)]) \
            if exp["tok"].size else np.zeros((0, H), dt)
        return int(np.count_nonzero(got != want)) if got.shape == want.shape else want.size
    bad = 0
    for e, parts in enumerate(exp["per_expert"]):
        want = np.concatenate([token_rows(p, t, H, dt) for p, t in parts]) if parts else np.zeros((0, H), dt)
        bad += int(np.count_nonzero(got[e, :len(want)] != want))
    return bad


def rank_main(comm, spec: dict) -> list[dict] | None:
    """Inside every rank: one row per token count; rank 0's rows are the job's."""
    import stratacl
    from stratacl import ep
    from stratacl.collectives import ep_slices
    n, me = comm.size, comm.rank
    dt = np.dtype(spec["dtype"])
    H, K, E = spec["hidden"], spec["topk"], spec["experts"]
    buf = ep.Buffer(comm, E)
    modeled = stratacl.config.clock != "off"
    place = (lambda a: _in_hbm(stratacl, a)) if spec["buffers"] == "hbm" else (lambda a: a.copy())
    scalar = np.zeros(1, np.float64)

    def reduce(v: float, op: str) -> float:
        scalar[0] = v
        comm.all_reduce(scalar, op=op)
        return float(scalar[0])

    rows = []
    for T in spec["tokens"]:
        routes = ep.routing(T, E, K, n, spec["skew"], spec["seed"])
        idx = place(routes[me])
        x = place(token_rows(me, np.arange(T), H, dt))
        w = place(_weights(spec["seed"], me, (T, K)))
        low_latency = spec["mode"] == "ll"
        cap = T
        if spec["op"] == "dispatch":
            run = (lambda: buf.low_latency_dispatch(x, idx, cap)) if low_latency else (lambda: buf.dispatch(x, idx, w))
        else:
            first = buf.low_latency_dispatch(x, idx, cap) if low_latency else buf.dispatch(x, idx, w)
            y, handle = first[0], first[-1]
            run = (lambda: buf.low_latency_combine(y, idx, w, handle)) if low_latency else (lambda: buf.combine(y, handle))
        comm.barrier()
        stratacl.ub.wait_registered()
        for _ in range(spec["warmup"]):
            run()
        comm.barrier()
        m0 = comm.clock() if modeled else None
        t0 = time.perf_counter()
        for _ in range(spec["iters"]):
            run()
        elapsed = (time.perf_counter() - t0) / max(spec["iters"], 1)
        m1 = comm.clock() if modeled else None
        comm.barrier()
        wrong = 0
        for _ in range(spec["check"]):
            got = run()
            got = got[0] if isinstance(got, tuple) else got
            wrong += _wrong(spec, n, me, routes, got)
        counts = np.stack([ep_slices.route(r, n, E).per_rank for r in routes])
        per_expert = np.stack([ep_slices.route(r, n, E).per_expert for r in routes])
        sent = ep_slices.rows_to_members(per_expert, n) if low_latency else counts
        rows_in = float(sent.sum(axis=0).mean())
        size = rows_in * H * dt.itemsize
        t = reduce(elapsed, "sum") / n
        row = dict(op=spec["op"], size=int(size), count=int(rows_in), type=str(dt),
                   redop="sum" if spec["op"] == "combine" else "none", root=-1, time_us=t * 1e6,
                   algbw=size / t / 1e9 if t > 0 else 0.0, busbw=size / t / 1e9 if t > 0 else 0.0,
                   wrong=int(reduce(wrong, "sum")), mode=spec["mode"], tokens=T, hidden=H, topk=K, experts=E,
                   skew=spec["skew"], model_time_us=None, model_busbw=None, core_gap=None)
        if modeled:
            mt = (reduce(m1, "max") - reduce(m0, "max")) / max(spec["iters"], 1) * 1e6
            row.update(model_time_us=mt, model_busbw=size / mt / 1e3 if mt > 0 else 0.0,
                       core_gap=_core_gap(comm, spec, routes, dt))
        rows.append(row)
        if me == 0:
            print(f"stratacl-bench: {spec['op']} {spec['mode']} {T} tokens done ({row['time_us']:.1f} us)",
                  file=sys.stderr, flush=True)
    return rows if me == 0 else None


def _in_hbm(stratacl, a: np.ndarray) -> np.ndarray:
    h = stratacl.empty(a.shape, a.dtype)
    h[...] = a
    return h


def _core_gap(comm, spec: dict, routes: list[np.ndarray], dt) -> float:
    """The core gap of one call as the ranks' model times it (the plan of its traffic)."""
    from stratacl.collectives import ep_slices
    from stratacl.ub import profile_plan, profiles_cores
    phases, _, staging = ep_slices.traffic(spec["op"], spec["mode"], routes, spec["experts"],
                                           spec["hidden"] * dt.itemsize)
    from stratacl.runtime import pipeline
    model = pipeline(comm).model
    members = tuple(comm.members)
    return profiles_cores(profile_plan(model, model.plan_exchange(members, phases, staging), members))["core_gap"]


def estimate_rows(spec: dict, nranks: int, topology: str, registration: str, partition: str, path: str) -> list[dict]:
    from stratacl import ep
    rows = []
    for T in spec["tokens"]:
        e = ep.estimate(spec["op"], nranks, T, spec["hidden"], spec["topk"], spec["experts"], mode=spec["mode"],
                        skew=spec["skew"], seed=spec["seed"], dtype=spec["dtype"], topology=topology,
                        registration=registration, partition=partition, path=path)
        rows.append(dict(op=spec["op"], size=int(e.bytes_per_rank), count=int(e.bytes_per_rank // (
            spec["hidden"] * np.dtype(spec["dtype"]).itemsize)), type=e.dtype,
            redop="sum" if spec["op"] == "combine" else "none", root=-1, time_us=None, algbw=None, busbw=None,
            wrong=None, mode=spec["mode"], tokens=T, hidden=spec["hidden"], topk=spec["topk"],
            experts=spec["experts"], skew=spec["skew"], model_time_us=e.time_us, model_busbw=e.busbw,
            core_gap=e.core_gap))
    return rows


def format_table(header: dict, rows: list[dict]) -> str:
    est = header["clock"] == "estimate"
    lines = [f"# stratacl-bench {header['op']} ({header['mode']}): {header['ranks']} ranks, hidden {header['hidden']}, "
             f"top-{header['topk']} of {header['experts']} experts, skew {header['skew']:g}, dtype {header['dtype']}",
             f"# registration {header['registration']}, partition {header['partition']}, path {header['path']}, "
             f"clock {header['clock']}, buffers {header['buffers']}, topology {header['topology']}",
             "# busbw as DeepEP's tests count it: bytes a rank receives (dispatch) or sends back (combine) / time",
             "#"]
    if est:
        lines.insert(3, "# estimate only: modeled time from the fabric model; no rank ran, no data was checked")
    head = f"#{'tokens':>7} {'rows':>8} {'size':>12}"
    if not est:
        head += f" {'time(us)':>10} {'busbw':>8} {'#wrong':>6}"
    model = any(r["model_time_us"] is not None for r in rows)
    if model:
        head += f" {'m.time(us)':>11} {'m.busbw':>8} {'core gap':>8}"
    lines.append(head)
    for r in rows:
        ln = f" {r['tokens']:>7} {r['count']:>8} {r['size']:>12}"
        if not est:
            ln += f" {r['time_us']:>10.1f} {r['busbw']:>8.3f} {r['wrong']:>6}"
        if model:
            ln += f" {r['model_time_us']:>11.1f} {r['model_busbw']:>8.2f} {r['core_gap']:>8.3f}"
        lines.append(ln)
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    return [int(float(v)) for v in text.split(",") if v.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stratacl-bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("operator", choices=OPS)
    p.add_argument("-n", "--nranks", type=int, default=8, help="ranks (default 8)")
    p.add_argument("--tokens", default="128", help="tokens per rank, comma-separated (default 128)")
    p.add_argument("--hidden", type=int, default=7168, help="hidden size (default 7168)")
    p.add_argument("--topk", type=int, default=8, help="experts per token (default 8)")
    p.add_argument("--experts", type=int, default=256, help="experts in all (default 256)")
    p.add_argument("--mode", default="ht", choices=("ht", "ll"), help="high-throughput or low-latency (default ht)")
    p.add_argument("--skew", type=float, default=0.0, help="routing skew (0: uniform; see ep/_routing.py)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    p.add_argument("-w", "--warmup", type=int, default=2)
    p.add_argument("-i", "--iters", type=int, default=10)
    p.add_argument("-c", "--check", type=int, default=1, help="checked calls per row (default 1; 0 = none)")
    p.add_argument("--registration", default=None, choices=("roa", "jit", "pool", "staged"))
    p.add_argument("--partition", default=None, choices=("naive", "balanced"))
    p.add_argument("--path", default=None, choices=("mte", "sdma"))
    p.add_argument("--clock", default=None, choices=("off", "virtual"))
    p.add_argument("--estimate", action="store_true", help="start no rank: rows from stratacl.ep.estimate")
    p.add_argument("--buffers", default="hbm", choices=("hbm", "plain"))
    p.add_argument("--topology", default=None)
    p.add_argument("--hbm-size", default=None)
    p.add_argument("-J", "--json", default=None)
    return p


def main(argv: list[str]) -> int:
    import stratacl
    from stratacl._config import parse_size
    from ._hostfacts import host_facts

    a = parser().parse_args(argv)
    spec = dict(op=a.operator, tokens=_sizes(a.tokens), hidden=a.hidden, topk=a.topk, experts=a.experts, mode=a.mode,
                skew=a.skew, seed=a.seed, dtype=a.dtype, warmup=a.warmup, iters=a.iters, check=a.check,
                buffers=a.buffers)
    header = dict(op=a.operator, ranks=a.nranks, mode=a.mode, hidden=a.hidden, topk=a.topk, experts=a.experts,
                  skew=a.skew, seed=a.seed, dtype=a.dtype, warmup=a.warmup, iters=a.iters, check=a.check,
                  buffers=a.buffers, host=host_facts(), command="stratacl-bench " + " ".join(argv),
                  started=time.strftime("%Y-%m-%dT%H:%M:%S"))
    if a.estimate:
        header.update(registration=a.registration or "roa", partition=a.partition or "balanced",
                      path=a.path or "mte", clock="estimate", topology=a.topology or "cm384", buffers="none")
        rows = estimate_rows(spec, a.nranks, header["topology"], header["registration"], header["partition"],
                             header["path"])
    else:
        row = a.hidden * np.dtype(a.dtype).itemsize
        worst = max(spec["tokens"], default=0) * row
        need = worst * (4 + a.topk * (3 if a.mode == "ll" else 2))
        settings = {"hbm_size": a.hbm_size or max(parse_size("1G"), 1 << need.bit_length())}
        for name in ("registration", "partition", "path", "clock", "topology"):
            if getattr(a, name) is not None:
                settings[name] = getattr(a, name)
        config = stratacl.Config(**settings)
        header.update(registration=config.registration, partition=config.partition, path=config.path,
                      clock=config.clock, topology=config.topology)
        rows = stratacl.spawn(rank_main, a.nranks, args=(spec,), **settings)[0]
    print(format_table(header, rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"header": header, "rows": rows}, f, indent=1)
    return 1 if any(r["wrong"] for r in rows) else 0
