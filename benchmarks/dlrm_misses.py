"""Embedding-cache misses a die at the paper's scale, derived from the access law and the cache.

    python benchmarks/dlrm_misses.py [--zipf 1.05] [--cache-gib 5,10,15,20,25] [--cost staged,roa]

The paper's DLRM (section 9, Fig. 12b): a 7 TiB table over 128 dies (56 GiB a die), a cache of
5-25 GiB a die, batch 1024, one index per sparse feature. A host run cannot hold 117M rows a die,
and misses do not scale with the rank count the way bytes do, so the miss count a die is derived
here from the law (Zipf, P(k-th most popular row) ~ 1/k^A) and the cache's fraction f of the die's
rows, for the steady state (the independent-reference model): a cache holding the f x R most
popular rows misses m(f) = 1 - H_A(f R) / H_A(R) of its lookups, H_A the generalised harmonic
number. LRU misses at least that often, so m(f) is the fewest misses any cache of that size sees.
``--cost``: what those rows cost a die in modeled time, a step's misses fetched and as many
dirty rows written back (LRU's steady state: every miss evicts a row the step before updated),
in one ``comm.host_rows`` call on one rank under each registration (the model's host tier,
exactly as examples/dlrm.py's cache pays them), with nothing beside it.

The settings and their sources are in docs/end-to-end.md ("Recsys against the cache at the
paper's scale").
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

GIB = 1 << 30
TABLE_BYTES = 7 * (1 << 40)          # 7 TiB (paper section 9)
DIES = 128                           # paper section 9
ROW_BYTES = 128 * 4                  # embedding dimension 128 (MLPerf's DLRM), float32
BATCH = 1024                         # paper section 9, per die
CACHE_GIB = (5, 10, 15, 20, 25)      # Fig. 12b's axis
_EXACT = 100_000                     # terms summed exactly before the Euler-Maclaurin tail


def harmonic(n: float, a: float) -> float:
    """H_a(n) = sum_{k=1}^{n} k^-a for real n >= 1 (n rounded down), exact for n <= 100,000,
    else an exact head and an Euler-Maclaurin tail (error far below 1e-12 relative)."""
    n = int(n)
    if n < 1:
        return 0.0
    k = np.arange(1, min(n, _EXACT) + 1, dtype=np.float64)
    head = float(np.sum(k[::-1] ** -a))              # small terms first
    if n <= _EXACT:
        return head
    m = float(_EXACT)

    def integral(x: float) -> float:
        return math.log(x) if a == 1 else x ** (1 - a) / (1 - a)

    # sum_{k=m+1}^{n} f(k) with f(x) = x^-a: int_m^n f + (f(n) - f(m)) / 2 + (f'(n) - f'(m)) / 12
    return head + (integral(n) - integral(m)) + (n ** -a - m ** -a) / 2 + (-a * n ** (-a - 1) + a * m ** (-a - 1)) / 12


def miss_fraction(cache_fraction: float, rows: int, a: float) -> float:
    """Steady-state misses a lookup of a cache holding the ``cache_fraction`` most popular of
    ``rows`` rows under Zipf ``a`` (0 <= fraction <= 1)."""
    if not 0 <= cache_fraction <= 1:
        raise ValueError(f"miss_fraction: cache_fraction must be in [0, 1], got {cache_fraction}")
    return 1.0 - harmonic(cache_fraction * rows, a) / harmonic(rows, a)


def per_die(cache_gib: float, a: float, dies: int = DIES, batch: int = BATCH) -> dict:
    """One cache size's numbers for a die: its rows, the cache's fraction, misses a lookup and a step."""
    rows = TABLE_BYTES // dies // ROW_BYTES
    f = cache_gib * GIB / (TABLE_BYTES / dies)
    m = miss_fraction(f, rows, a)
    lookups = dies * batch          # one table a die, one index a sample, every die's samples
    return {"cache_gib": cache_gib, "rows_per_die": rows, "cache_fraction": f, "miss_fraction": m,
            "lookups_per_step": lookups, "misses_per_step": m * lookups}


def _host_rows_us(comm, nrows: int) -> float:
    """One rank: ``nrows`` rows of 512 B fetched into a full cache, as many written back."""
    import stratacl

    cache = stratacl.empty((nrows, ROW_BYTES // 4), np.float32)
    host = np.zeros((2 * nrows, ROW_BYTES // 4), np.float32)
    slots = np.arange(nrows)
    comm.host_rows(cache, host, np.arange(nrows), slots)              # the cache filled, untimed
    t0 = comm.clock()
    comm.host_rows(cache, host, np.arange(nrows, 2 * nrows), slots, slots, np.arange(nrows))
    return (comm.clock() - t0) * 1e6


def miss_cost_us(nrows: int, registration: str) -> float:
    """The modeled time of a step's misses and write-backs on one die (a one-rank job)."""
    import stratacl

    return stratacl.spawn(_host_rows_us, 1, args=(nrows,), clock="virtual", registration=registration,
                          hbm_size=1 << 30)[0]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--cache-gib", default=",".join(map(str, CACHE_GIB)))
    p.add_argument("--cost", default="", help="registrations to time the misses under (e.g. staged,roa)")
    p.add_argument("--json", default=None)
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    rows = [per_die(float(c), a.zipf) for c in a.cache_gib.split(",")]
    for r in rows:
        for reg in filter(None, a.cost.split(",")):
            r[f"host_rows_us_{reg}"] = miss_cost_us(int(round(r["misses_per_step"])), reg)
    for r in rows:
        print(f"cache {r['cache_gib']:g} GiB: f = {r['cache_fraction']:.3f} of {r['rows_per_die']:,} rows, "
              f"misses {r['miss_fraction']:.4f} a lookup, {r['misses_per_step']:,.0f} rows a step"
              + "".join(f", {k[13:]} {v:.1f} us" for k, v in r.items() if k.startswith("host_rows_us_")))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"command": " ".join(["python benchmarks/dlrm_misses.py", *argv]), "zipf": a.zipf,
                       "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
