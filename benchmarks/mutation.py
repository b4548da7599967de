"""Mutation score of the pure planning modules: runs mutmut 3 and prints the score per module.

    python benchmarks/mutation.py                 # fresh run (removes mutants/), 2 workers
    python benchmarks/mutation.py --report-only   # the table of the last run, from mutants/*.meta
    python benchmarks/mutation.py --json out.json # also write the numbers and every survivor
    python benchmarks/mutation.py --resume        # keep mutants/; run again only the mutants of the
                                                  # selection with no verdict, a survivor or a timeout

What is mutated is configured once, in pyproject.toml ``[tool.mutmut]`` (the files, the fast unit
tests they run against). This script picks which functions of those files count: whole modules
for slice maps, schedules, the partitioner, ``_sizes`` and ``_config``; only the validation of
``ub/_topology.py`` (``from_dict``, ``load``) and only the routing checks of expert parallelism
(``ep/_buffer.py``'s argument checks, ``collectives/_ep.py``'s ``route``). Every mutant of those
is run; a mutant counts as killed when a test fails (or it times out), as survived otherwise,
including when no selected test calls its function. A mutant mutmut did not run (a run over a
selection of names, or an interrupted run) has no verdict: it is left out of the score and
counted as not run, so a module none of whose mutants ran shows no score rather than 0%.

Run it from the repository with the package installed in place (``pip install -e ".[test]"``):
mutmut copies ``stratacl/`` from this tree, and the tests import that copy, so the compiled
extensions must sit in the tree beside the sources; a non-editable install puts them elsewhere,
and the script says so before starting mutmut. Not part of CI: a fresh run takes 10-20 minutes
on two cores.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# module -> the mutant-name patterns (mutmut 3: "<module>.x_<function>__mutmut_<k>",
# methods "<module>.xǁ<Class>ǁ<method>__mutmut_<k>") that count for it
MODULES: dict[str, list[str]] = {
    "collectives/_slices.py": ["stratacl.collectives._slices.*"],
    "collectives/_schedule.py": ["stratacl.collectives._schedule.*"],
    "collectives/_partition.py": ["stratacl.collectives._partition.*"],
    "_sizes.py": ["stratacl._sizes.*"],
    "_config.py": ["stratacl._config.*"],
    "ub/_topology.py (validation)": ["stratacl.ub._topology.x_from_dict__mutmut_*",
                                     "stratacl.ub._topology.x_load__mutmut_*"],
    "ep routing checks": ["stratacl.ep._buffer.x__check_rows__mutmut_*",
                          "stratacl.ep._buffer.x__check_weights__mutmut_*",
                          "stratacl.ep._buffer.xǁBufferǁ_check_idx__mutmut_*",
                          "stratacl.ep._buffer.xǁBufferǁ_header__mutmut_*",
                          "stratacl.collectives._ep.x_route__mutmut_*"],
}

KILLED = {"killed", "timeout", "caught by type check", "segfault"}
NOT_RUN = "not checked"      # mutmut's status of a mutant it generated but did not run


def _statuses() -> dict[str, str]:
    from mutmut.stats import status_by_exit_code
    out = {}
    for meta in (ROOT / "mutants").rglob("*.meta"):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            out[name] = status_by_exit_code[code]
    return out


def _module_of(name: str) -> str | None:
    for module, patterns in MODULES.items():
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return module
    return None


def report(statuses: dict[str, str]) -> dict:
    rows = {m: {"total": 0, "killed": 0, "timeout": 0, "survived": [], "not_run": 0} for m in MODULES}
    for name, status in sorted(statuses.items()):
        module = _module_of(name)
        if module is None:
            continue
        row = rows[module]
        if status == NOT_RUN:
            row["not_run"] += 1
            continue
        row["total"] += 1
        if status in KILLED:
            row["killed"] += 1
            row["timeout"] += status == "timeout"
        else:
            row["survived"].append(f"{name} ({status})")
    total = sum(r["total"] for r in rows.values())
    killed = sum(r["killed"] for r in rows.values())
    return {"modules": rows, "total": total, "killed": killed,
            "score": killed / total if total else None,
            "not_run": sum(r["not_run"] for r in rows.values())}


def show(result: dict, survivors: bool) -> None:
    print(f"{'module':32} {'mutants':>8} {'killed':>7} {'(timeout)':>9} {'survived':>9} {'score':>7}")
    for module, r in result["modules"].items():
        # a module none of whose mutants ran (a run over a selection) has no score, not 0%
        score = f"{r['killed'] / r['total']:7.1%}" if r["total"] else f"{'-':>7}"
        print(f"{module:32} {r['total']:8d} {r['killed']:7d} {r['timeout']:9d} {len(r['survived']):9d} {score}")
    t, k = result["total"], result["killed"]
    to = sum(r["timeout"] for r in result["modules"].values())
    overall = f"{result['score']:7.1%}" if t else f"{'-':>7}"
    print(f"{'overall':32} {t:8d} {k:7d} {to:9d} {t - k:9d} {overall}")
    if result["not_run"]:
        left = ", ".join(f"{m} {r['not_run']}" for m, r in result["modules"].items() if r["not_run"])
        print(f"not run (no verdict, left out of the counts above): {left}")
    if survivors:
        for module, r in result["modules"].items():
            for s in r["survived"]:
                print(f"  survivor  {module}: {s}")


def _tree_imports() -> str | None:
    """Why ``stratacl`` does not import from the repository's tree (as it will from mutmut's copy
    of it), or None when it does."""
    probe = subprocess.run([sys.executable, "-c", "import stratacl"], cwd=ROOT, capture_output=True, text=True)
    if probe.returncode == 0:
        return None
    lines = probe.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit {probe.returncode}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="mutmut's parallel children (default 2)")
    ap.add_argument("--report-only", action="store_true", help="only print the last run's table")
    ap.add_argument("--resume", action="store_true",
                    help="keep mutants/ and run only selected mutants not yet killed (no verdict, survived, timed out, "
                         "ended by a signal); the kills stand if tests were only added since")
    ap.add_argument("--survivors", action="store_true", help="list every surviving mutant")
    ap.add_argument("--json", help="write the numbers and the survivors to this file")
    ap.add_argument("names", nargs="*", help="run only these mutant names (patterns allowed); default: all")
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    if not args.report_only:
        # checked before mutants/ is removed: a refused run keeps the last run's results
        why = _tree_imports()
        if why is not None:
            print(f"mutation.py: stratacl does not import from {ROOT} ({why}). mutmut copies stratacl/ "
                  f"from there, compiled extensions included: install the package in place "
                  f"(pip install -e \".[test]\") or build them there (python setup.py build_ext --inplace)",
                  file=sys.stderr)
            return 2
        if args.resume:
            # a timeout or a worker killed by a signal may be the host (load, the OOM killer): run it again
            names = [n for n, st in _statuses().items() if _module_of(n) and st not in ("killed", "caught by type check")]
            if not names:
                print("nothing to resume")
        else:
            if not args.names:
                shutil.rmtree(ROOT / "mutants", ignore_errors=True)
            names = args.names or [p for ps in MODULES.values() for p in ps]
        if names:
            cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.workers), *names]
            (ROOT / "mutants").mkdir(exist_ok=True)
            with open(ROOT / "mutants" / "run.log", "a") as log:     # mutmut's progress, kept for reading
                done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                print(f"mutmut run failed (exit {done.returncode}), see mutants/run.log", file=sys.stderr)
                return done.returncode
    result = report(_statuses())
    show(result, args.survivors)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
