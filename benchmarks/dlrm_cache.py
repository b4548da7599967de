"""DLRM's iteration time against embedding cache size (the paper's Fig. 12b axis), per configuration.

    python benchmarks/dlrm_cache.py [--ranks 8] [--steps 3] [--configs staged,roa,balanced,sdma,pool]
        [--cache-rows 0,8192,4096,2048] [--json FILE] [--plot FILE.png] -- [examples/dlrm.py arguments]

Runs examples/dlrm.py under ``--clock virtual`` once per (configuration, cache size), with the
configurations' launcher switches from benchmarks/e2e.py, and keeps the last step's modeled
time (slowest rank) and the hit rates the program reports: over every step (the cold first
one included; with ``fetched`` and ``written_back``) and over the last step alone, the one
timed. ``--cache-rows 0`` is the run with every row in HBM. Rows: {"workload": "dlrm", "config",
"ranks", "cache_rows", "rows", "hit_rate", "fetched", "written_back", "last_step_hit_rate",
"modeled_step_us", "extra"}.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

from e2e import CONFIGS, _last_step, _launch

_CACHE = re.compile(r"hit rate ([\d.]+) \((\d+) of (\d+) lookups\); (\d+) rows fetched from host memory, "
                    r"(\d+) written back")
_LAST = re.compile(r"last step only: hit rate ([\d.]+) ")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--configs", default="staged,roa,balanced,sdma,pool")
    p.add_argument("--cache-rows", default="0,8192,4096,2048")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    a = p.parse_args(argv)
    rows_per_table = int(extra[extra.index("--rows") + 1]) if "--rows" in extra else 512
    rows = []
    for c in (int(x) for x in a.cache_rows.split(",")):
        for config in a.configs.split(","):
            out = _launch("examples/dlrm.py", a.ranks, config, ["--steps", str(a.steps), "--no-check"],
                          [*extra, "--cache-rows", str(c)])
            row = {"workload": "dlrm", "config": config, "ranks": a.ranks, "cache_rows": c, "rows": rows_per_table,
                   "hit_rate": None, "fetched": 0, "written_back": 0, "last_step_hit_rate": None, **_last_step(out),
                   "extra": " ".join(extra)}
            m, last = _CACHE.search(out), _LAST.search(out)
            if m:
                row.update(hit_rate=float(m.group(1)), fetched=int(m.group(4)), written_back=int(m.group(5)))
            if last:
                row.update(last_step_hit_rate=float(last.group(1)))
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": "python benchmarks/dlrm_cache.py " + " ".join(sys.argv[1:]), "rows": rows}, f,
                      indent=1)
    if a.plot:
        _plot(rows, a.plot)
    return 0


def _plot(rows: list[dict], path: str) -> None:
    """Modeled step time against cache rows per table, one line per configuration; the run with
    every row in HBM drawn as a dashed level per configuration."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, config in enumerate(CONFIGS):
        pts = sorted((r["cache_rows"], r["modeled_step_us"]) for r in rows if r["config"] == config and r["cache_rows"])
        if not pts:
            continue
        line = ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=config)[0]
        base = [r["modeled_step_us"] for r in rows if r["config"] == config and not r["cache_rows"]]
        if base:
            ax.axhline(base[0], color=line.get_color(), linestyle="--", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("HBM cache rows per table (dashed: every row in HBM)")
    ax.set_ylabel("modeled iteration time (us)")
    ax.set_title(f"DLRM, N = {rows[0]['ranks']}, {rows[0]['rows']} rows per table (examples/dlrm.py)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
