"""``stratacl-bench``: sweep one operator over sizes on N ranks, nccl-tests style.

    stratacl-bench all_gather -n 32 -b 4K -e 64M -f 4 -w 2 -i 10 -c 1 --dtype float32
                   [--op sum] [--root 0] [--registration roa|jit|pool|staged] [--buffers hbm|plain]
                   [--algo mesh|ring|auto] [--clock off|virtual|throttled] [--dilation D]
                   [--topology cm384|flat|FILE] [--vs mpi,gloo] [--no-limit] [-J out.json]
                   [--api numpy|torch] [--rounds R] [--peers-first]
    stratacl-bench all_gather -n 256 -b 64K -e 256G --estimate [--algo auto] [--registration staged]
                   [--cores N] [--comm-cores N] [--partition naive|balanced] [--path mte|sdma] [--profile DIR]
    stratacl-bench dispatch|combine -n 32 --tokens 4096 --hidden 7168 --topk 8 --experts 256 --mode ht|ll
                   [--skew S] ...      MoE expert parallelism: see bench/_moe.py

Prints a header (the run and the host), one row per size and the average bus bandwidth;
``-J`` writes the same as JSON. Progress goes to stderr. Exits 1 if any check found wrong data.

Modeled time. With ``--clock virtual`` (or ``throttled``) the ranks also read their modeled clocks
(``comm.clock()``) around the timed iterations, and every row gains ``model_time_us``,
``model_algbw`` and ``model_busbw`` beside the wall figures. With ``--estimate`` no rank is
started: each row comes from the fabric model alone (``stratacl.estimate``), for sizes and rank
counts beyond the host's memory; its wall fields ``time_us``, ``algbw``, ``busbw`` and its
``wrong`` are null (nothing ran, nothing was checked) and ``model_algo`` says which algorithm
was timed (what ``auto`` picked). Rows of a run without a modeled clock carry the model fields
as null.

torch. With ``--api torch`` the ranks run the sweep through ``torch.distributed`` with backend
"stratacl" (bench/_torchapi.py: ``dist.all_reduce``, ``all_gather_single``, ``reduce_scatter_single``,
``all_to_all_single``, ...), and the same sweep through the numpy API on the same communicator,
alternating, so the table's rows are torch's and a second table gives the torch layer's cost
(torch time / numpy time, same ranks, same rounds); ``--vs gloo`` compares gloo through the same
torch calls. ``--rounds R`` times every size R times (alternating the order where two APIs run,
peers too) and keeps the median; rows then carry ``round_times_us``. ``--peers-first`` runs the
peers before StrataCL (alternate it across repeated runs). The header records the host's load
average before and after.

Fabric-native backend. ``--cores``, ``--comm-cores``, ``--partition`` and ``--path`` set the
model's cores, their partitioning and who moves the bytes (settings of the same names, so a
data-moving run's virtual clock uses them too); estimate rows gain ``core_gap`` (slowest minus
fastest core completion over the slowest, worst rank), ``core_busy_us`` (summed occupation of a
rank's cores) and ``policy_us`` (host time of one rank's partition policy); ``--profile DIR``
writes each size's per-core Chrome trace (Perfetto) there. Data-moving rows carry these as null
until the ranks report them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from .._config import parse_size
from . import _cases, _moe
from ._numpyapi import StrataBackend
from ._hostfacts import host_facts

COLUMNS = ("size", "count", "type", "redop", "root", "time_us", "algbw", "busbw", "wrong")
MODEL_COLUMNS = ("model_time_us", "model_algbw", "model_busbw")
CORE_COLUMNS = ("core_gap", "core_busy_us")


def _sizes(lo: int, hi: int, factor: float, step: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(int(s))
        s = s + step if step else s * factor
        if factor <= 1 and not step:
            break
    return out


def _progress(row: dict) -> None:
    print(f"stratacl-bench: {row['op']} {row['size']} B done ({row['time_us']:.1f} us)", file=sys.stderr, flush=True)


def rank_main(comm, spec: _cases.Spec, buffers: str, modeled: bool = False):
    """Inside every rank: run the sweep; rank 0's rows are the job's."""
    rows = _cases.sweep(StrataBackend(comm, buffers, modeled), spec, progress=_progress)
    return rows if comm.rank == 0 else None


def estimate_rows(op: str, nranks: int, sizes: list[int], dtype: str, root: int, algo: str, topology: str,
                  registration: str, cores: int | None = None, comm_cores: int | None = None,
                  partition: str = "balanced", path: str = "mte", profile: str | None = None) -> list[dict]:
    """One row per size from the fabric model alone (``stratacl.estimate``); no rank runs."""
    from .._estimate import estimate
    rows, seen = [], set()
    redop_root = ("sum" if op in ("all_reduce", "reduce_scatter") else "none", root if op == "broadcast" else -1)
    for size in sizes:
        e = estimate(op, nranks, size, algo=algo, topology=topology, registration=registration,
                     root=max(redop_root[1], 0), dtype=dtype, cores=cores, comm_cores=comm_cores,
                     partition=partition, path=path, profile=profile or None)
        if e.size in seen:
            continue
        seen.add(e.size)
        row = dict(op=op, size=e.size, count=e.count, type=e.dtype, redop=redop_root[0], root=redop_root[1],
                   time_us=None, algbw=None, busbw=None, wrong=None)
        row.update(_cases.model_row(op, nranks, e.size, e.time_us))
        row["model_algo"] = e.algo
        row.update(core_gap=e.core_gap, core_busy_us=e.core_busy_us, policy_us=e.policy_us)
        rows.append(row)
    return rows


def footprint(op: str, n: int, size: int, itemsize: int) -> int:
    """Bytes all ranks touch for one sweep point (inputs and outputs)."""
    sh = _cases.shape(op, n, size, itemsize)
    return n * (sh.n_in + sh.n_out) * itemsize


def _num(v, width: int, prec: int) -> str:
    return f"{'-':>{width}}" if v is None else f"{v:>{width}.{prec}f}"


def format_table(header: dict, rows: list[dict], peers: dict[str, list[dict] | str] | None = None) -> str:
    n = header["ranks"]
    estimated = header.get("clock") == "estimate"
    api = f" through torch.distributed.{header['torch_call']}" if header.get("api") == "torch" else ""
    lines = [f"# stratacl-bench {header['op']}{api}: {n} ranks, dtype {header['dtype']}, redop {header['redop']}, "
             f"root {header['root']}" + ("" if estimated else
                                         f", warmup {header['warmup']}, iters {header['iters']}, check {header['check']}"),
             f"# registration {header['registration']}, algo {header.get('algo', 'mesh')}, "
             f"clock {header.get('clock', 'off')}, buffers {header['buffers']}, topology {header['topology']}",
             f"# host {header['host']['host']}: {header['host']['cores']} cores ({header['host']['cpu']}), "
             f"{header['host']['memory_gib']} GiB; python {header['host']['python']}, numpy {header['host']['numpy']}",
             "#"]
    if header.get("load_before") and header.get("load_after"):
        lines.insert(3, "# host load average (1/5/15 min): before " + "/".join(f"{v:.1f}" for v in header["load_before"])
                     + ", after " + "/".join(f"{v:.1f}" for v in header["load_after"]))
    if estimated:
        lines.insert(3, "# estimate only: modeled time from the fabric model; no rank ran, no data was checked")
    limit = any("limit_busbw" in r for r in rows)
    model = any(r.get("model_time_us") is not None for r in rows)
    head = f"#{'size':>11} {'count':>11} {'type':>8} {'redop':>6} {'root':>5}"
    unit = f"#{'(B)':>11} {'(elements)':>11} {'':>8} {'':>6} {'':>5}"
    if not estimated:
        head += f" {'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>6}"
        unit += f" {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>6}"
    if model:
        head += f" {'model time':>11} {'m.algbw':>8} {'m.busbw':>8}" + (f" {'algo':>5}" if estimated else "")
        unit += f" {'(us)':>11} {'(GB/s)':>8} {'(GB/s)':>8}" + (f" {'':>5}" if estimated else "")
    cores = any(r.get("core_gap") is not None for r in rows)
    if cores:
        head += f" {'core gap':>8} {'core busy':>10}"
        unit += f" {'':>8} {'(us)':>10}"
    if limit:
        head += f" {'limit':>8} {'%limit':>6}"
        unit += f" {'(GB/s)':>8} {'':>6}"
    lines += [head, unit]
    for r in rows:
        ln = f" {r['size']:>11} {r['count']:>11} {r['type']:>8} {r['redop']:>6} {r['root']:>5}"
        if not estimated:
            ln += (f" {_num(r['time_us'], 10, 1)} {_num(r['algbw'], 8, 3)} {_num(r['busbw'], 8, 3)} "
                   f"{'-' if r['wrong'] is None else r['wrong']:>6}")
        if model:
            ln += (f" {_num(r.get('model_time_us'), 11, 1)} {_num(r.get('model_algbw'), 8, 3)} "
                   f"{_num(r.get('model_busbw'), 8, 3)}" + (f" {r.get('model_algo', ''):>5}" if estimated else ""))
        if cores:
            ln += f" {_num(r.get('core_gap'), 8, 3)} {_num(r.get('core_busy_us'), 10, 0)}"
        if limit:
            ln += f" {r['limit_busbw']:>8.3f} {100 * r['limit_fraction']:>5.0f}%"
        lines.append(ln)
    data = [r for r in rows if r["size"]]
    if not estimated:
        avg = sum(r["busbw"] for r in data) / len(data) if data else 0.0
        lines.append(f"# Out of bounds values : {sum(1 for r in rows if r['wrong'])} "
                     f"{'FAILED' if any(r['wrong'] for r in rows) else 'OK'}")
        lines.append(f"# Avg bus bandwidth    : {avg:.4f} GB/s")
    if model:
        got = [r["model_busbw"] for r in data if r.get("model_busbw") is not None]
        lines.append(f"# Avg modeled bus bandwidth : {sum(got) / len(got) if got else 0.0:.4f} GB/s")
    if header.get("clock") == "throttled":
        d = header.get("dilation") or 1.0
        calls = header["iters"] * n
        for r in rows:
            if r.get("model_time_us"):
                track = r["time_us"] / (r["model_time_us"] * d)
                late = r.get("late_calls") or 0
                lines.append(f"# throttled {r['size']:>11} B: wall / (modeled x {d:g}) = {track:.3f}; "
                             f"{late} of {calls} rank-calls ended behind schedule"
                             + ("; the host could not keep up: raise --dilation" if track > 1.1 else ""))
    numpy_rows = header.get("numpy_rows")
    if numpy_rows:
        by_size = {p["size"]: p for p in numpy_rows}
        lines.append("#")
        lines.append("# torch layer (same ranks, same communicator, alternating rounds): ratio = torch / numpy API; "
                     "time ratio - 1 is what the layer costs")
        lines.append(f"#{'size':>11} {'numpy time':>10} {'torch time':>10} {'time ratio':>10} "
                     f"{'numpy busbw':>11} {'torch busbw':>11} {'numpy #wrong':>12}")
        for r in rows:
            p = by_size.get(r["size"])
            if p is None:
                continue
            tr = r["time_us"] / p["time_us"] if p["time_us"] else float("nan")
            lines.append(f" {r['size']:>11} {p['time_us']:>10.1f} {r['time_us']:>10.1f} {tr:>10.2f} "
                         f"{p['busbw']:>11.3f} {r['busbw']:>11.3f} {p['wrong']:>12}")
    for peer, prow in (peers or {}).items():
        lines.append("#")
        if isinstance(prow, str):
            lines.append(f"# peer {peer}: not run ({prow})")
            continue
        lines.append(f"# versus {peer} (same sweep, same host, same run): ratio = stratacl / {peer}; "
                     f"busbw ratio > 1 and time ratio < 1 mean stratacl is faster")
        lines.append(f"#{'size':>11} {'time':>10} {peer + ' time':>12} {'time ratio':>10} "
                     f"{'busbw':>8} {peer + ' busbw':>12} {'busbw ratio':>11} {peer + ' #wrong':>12}")
        by_size = {p["size"]: p for p in prow}
        for r in rows:
            p = by_size.get(r["size"])
            if p is None:
                continue
            tr = r["time_us"] / p["time_us"] if p["time_us"] else float("nan")
            br = r["busbw"] / p["busbw"] if p["busbw"] else float("nan")
            lines.append(f" {r['size']:>11} {r['time_us']:>10.1f} {p['time_us']:>12.1f} {tr:>10.2f} "
                         f"{r['busbw']:>8.3f} {p['busbw']:>12.3f} {br:>11.2f} {p['wrong']:>12}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stratacl-bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("operator", choices=_cases.OPS)
    p.add_argument("-n", "--nranks", type=int, default=8, help="ranks (default 8)")
    p.add_argument("-b", "--minbytes", default="32M", help="smallest size (default 32M)")
    p.add_argument("-e", "--maxbytes", default="32M", help="largest size (default 32M)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, help="multiply the size by this (default 2)")
    p.add_argument("-s", "--stepbytes", default="0", help="add this to the size instead of multiplying")
    p.add_argument("-w", "--warmup", type=int, default=2, help="warmup iterations per size (default 2)")
    p.add_argument("--warmup-seconds", type=float, default=0.0,
                   help="after -w, keep warming up until this much wall time has passed (default 0); the peers too")
    p.add_argument("-i", "--iters", type=int, default=10, help="timed iterations per size (default 10)")
    p.add_argument("-c", "--check", type=int, default=1, help="checked iterations per size (default 1; 0 = none)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--op", default="sum", choices=sorted(_cases.REDUCE), help="reduce op (default sum)")
    p.add_argument("--root", type=int, default=0, help="broadcast root (default 0)")
    p.add_argument("--registration", default=None, choices=("roa", "jit", "pool", "staged"))
    p.add_argument("--algo", default=None, choices=("mesh", "ring", "auto"),
                   help="algorithm of all_gather, reduce_scatter, all_reduce (default mesh)")
    p.add_argument("--clock", default=None, choices=("off", "virtual", "throttled"),
                   help="modeled clock of the ranks; virtual/throttled add the model columns (default off)")
    p.add_argument("--dilation", default=None, type=float, help="with --clock throttled: wall s per modeled s")
    p.add_argument("--estimate", action="store_true",
                   help="start no rank: every row from the fabric model alone (sizes beyond host memory)")
    p.add_argument("--cores", type=int, default=None, help="logical NPU cores per rank (default 48)")
    p.add_argument("--comm-cores", type=int, default=None, help="cores a communication kernel uses (default 24)")
    p.add_argument("--partition", default=None, choices=("naive", "balanced"),
                   help="core partitioning of transfer units (default balanced)")
    p.add_argument("--path", default=None, choices=("mte", "sdma"), help="cores move the bytes, or the SDMA engine")
    p.add_argument("--profile", default=None, help="directory for per-core Chrome traces (Perfetto)")
    p.add_argument("--buffers", default="hbm", choices=("hbm", "plain"),
                   help="hbm: arrays from stratacl.empty (zero copy); plain: numpy arrays (staged)")
    p.add_argument("--topology", default=None)
    p.add_argument("--hbm-size", default=None, help="per-rank HBM (default: enough for the sweep, at least 1G)")
    p.add_argument("--vs", default="", help="comma-separated peers to run the same sweep with: mpi, gloo")
    p.add_argument("--peers-first", action="store_true",
                   help="run the --vs peers before StrataCL's sweep, not after (alternate it across repeats)")
    p.add_argument("--no-limit", action="store_true", help="skip measuring the host copy limit")
    p.add_argument("-J", "--json", default=None, help="also write the results as JSON to this file")
    p.add_argument("--api", default="numpy", choices=("numpy", "torch"),
                   help="numpy: the communicator's calls; torch: torch.distributed with backend stratacl, "
                        "and the numpy API alternating with it (default numpy)")
    p.add_argument("--rounds", type=int, default=1,
                   help="timed rounds per size, alternating APIs; a row's time is their median (default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    import stratacl

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in _moe.OPS:           # MoE dispatch / combine: their own options
        return _moe.main(args)
    parser = _parser()
    a = parser.parse_args(argv)
    sizes = [0] if a.operator == "barrier" else _sizes(parse_size(a.minbytes), parse_size(a.maxbytes),
                                                       a.stepfactor, parse_size(a.stepbytes))
    command = "stratacl-bench " + " ".join(argv if argv is not None else sys.argv[1:])
    if a.estimate:
        if a.vs:
            parser.error("--vs runs peers on the host: it needs a data-moving run, not --estimate")
        if a.api != "numpy":
            parser.error("--api torch moves data through torch.distributed: it needs a data-moving run, not --estimate")
        return _main_estimate(a, sizes, command)
    spec = _cases.Spec(a.operator, sizes, a.dtype, a.op, a.root, a.warmup, a.iters, a.check, a.warmup_seconds,
                       a.rounds)
    itemsize = np.dtype(a.dtype).itemsize
    # --api torch: the torch sweep's buffers and the numpy sweep's, side by side
    need = max((footprint(a.operator, a.nranks, s, itemsize) // a.nranks for s in sizes), default=0) * (
        2 if a.api == "torch" else 1)
    settings = {"hbm_size": a.hbm_size or max(parse_size("1G"), 1 << (3 * need).bit_length())}
    if a.registration:
        settings["registration"] = a.registration
    if a.topology:
        settings["topology"] = a.topology
    for name in ("algo", "clock", "dilation", "cores", "comm_cores", "partition", "path", "profile"):
        # only when asked: the ranks' defaults otherwise
        if getattr(a, name) is not None:
            settings[name] = getattr(a, name)
    config = stratacl.Config(**settings)
    modeled = config.clock != "off"
    header = dict(op=a.operator, ranks=a.nranks, dtype=a.dtype,
                  redop=a.op if a.operator in ("all_reduce", "reduce_scatter") else "none",
                  root=a.root if a.operator == "broadcast" else -1, warmup=a.warmup, iters=a.iters, check=a.check,
                  warmup_seconds=a.warmup_seconds,
                  registration=config.registration, algo=config.algo, clock=config.clock,
                  **({"dilation": config.dilation} if config.clock == "throttled" else {}),
                  buffers=a.buffers, topology=config.topology, host=host_facts(),
                  command=command, started=time.strftime("%Y-%m-%dT%H:%M:%S"), api=a.api, rounds=a.rounds,
                  load_before=os.getloadavg())
    peers: dict = {}
    if a.peers_first:
        _run_peers(a.vs, a.nranks, spec, peers)
    print(f"stratacl-bench: {a.operator} on {a.nranks} ranks, {len(sizes)} size(s)", file=sys.stderr, flush=True)
    numpy_rows = None
    if a.api == "torch":
        from . import _torchapi
        try:
            import torch
        except ImportError:
            print("stratacl-bench: --api torch needs torch: pip install torch (a CPU build is enough); "
                  "see docs/performance.md, 'Peers'", file=sys.stderr)
            return 2
        header.update(torch=torch.__version__, torch_call=_torchapi.torch_call(a.operator))
        rows, numpy_rows = stratacl.spawn(_torchapi.rank_main, a.nranks, args=(spec, a.buffers), **settings)[0]
    else:
        rows = stratacl.spawn(rank_main, a.nranks, args=(spec, a.buffers, modeled), **settings)[0]
    for r in rows:
        for k in MODEL_COLUMNS + CORE_COLUMNS:
            r.setdefault(k, None)
    if modeled and rows and all(r["model_time_us"] is None for r in rows):
        print(f"stratacl-bench: --clock {config.clock}: the ranks reported no modeled time "
              f"(this runtime has no comm.clock()); the model columns are null", file=sys.stderr, flush=True)
    if not a.no_limit and a.operator != "barrier":
        print("stratacl-bench: measuring the host copy limit", file=sys.stderr, flush=True)
        from ._hostlimit import copy_bandwidth
        bw = copy_bandwidth([footprint(a.operator, a.nranks, r["size"], itemsize) for r in rows])
        for r, b in zip(rows, bw):
            vol = _cases.copy_volume(a.operator, a.nranks, r["size"])
            r["limit_copy_gbps"] = b
            r["limit_busbw"] = (r["size"] * _cases.bus_factor(a.operator, a.nranks) * b / vol) if vol else 0.0
            r["limit_fraction"] = r["busbw"] / r["limit_busbw"] if r["limit_busbw"] else 0.0
    if not a.peers_first:
        _run_peers(a.vs, a.nranks, spec, peers)
    header["load_after"] = os.getloadavg()
    print(format_table(dict(header, numpy_rows=numpy_rows), rows, peers))
    if a.json:
        doc = {"header": header, "rows": rows}
        if numpy_rows is not None:
            doc["numpy_rows"] = numpy_rows
        if peers:
            doc["peers"] = peers
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    wrong = any(r["wrong"] for r in rows + (numpy_rows or [])) or any(
        not isinstance(p, str) and any(r["wrong"] for r in p) for p in peers.values())
    return 1 if wrong else 0


def _run_peers(names: str, nranks: int, spec: _cases.Spec, peers: dict) -> None:
    for peer in [p.strip() for p in names.split(",") if p.strip()]:
        from ._peers import run_peer
        print(f"stratacl-bench: running the same sweep with {peer}", file=sys.stderr, flush=True)
        peers[peer] = run_peer(peer, nranks, spec)


def _main_estimate(a, sizes: list[int], command: str) -> int:
    algo, topology, registration = a.algo or "mesh", a.topology or "cm384", a.registration or "roa"
    header = dict(op=a.operator, ranks=a.nranks, dtype=a.dtype,
                  redop=a.op if a.operator in ("all_reduce", "reduce_scatter") else "none",
                  root=a.root if a.operator == "broadcast" else -1, warmup=0, iters=0, check=0,
                  registration=registration, algo=algo, clock="estimate", buffers="none", topology=topology,
                  host=host_facts(), command=command, started=time.strftime("%Y-%m-%dT%H:%M:%S"))
    header.update(cores=a.cores or 48, comm_cores=a.comm_cores or 24, partition=a.partition or "balanced",
                  path=a.path or "mte")
    rows = estimate_rows(a.operator, a.nranks, sizes, a.dtype, a.root, algo, topology, registration,
                         a.cores, a.comm_cores, a.partition or "balanced", a.path or "mte", a.profile)
    print(format_table(header, rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"header": header, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
