"""Core partitioning: which of a rank's communication cores moves which transfer unit, in what order.

    slice map (one phase of one rank)  + tier of every slice's peer
        |  cut: each slice -> units of at most S_t bytes (tier t of its peer; ``Tier.unit_bytes``)
        v
    units (slice index, byte offset inside the slice, bytes, peer, tier, modeled cost
           tau = alpha_t + s / beta_t, the paper's section 6.2 estimate)
        |  naive     peer p -> a fixed core group (peers in slice order, groups of C/P cores, or
        |            peer k -> core k mod C when there are more peers than cores); a peer's
        |            units are dealt round-robin inside its group. The paper's baseline.
        |  balanced  LPT list scheduling (paper 6.2, Appendix B-C): units in decreasing cost,
        |            each to the least-loaded core; a core's k-th unit is its issue stripe k,
        |            and at most H_t cores may target one peer of tier t in one stripe
        |            (``Tier.fan_out_cap``), so a unit that would break the cap waits for the
        |            core's next stripe. O(U log U + U log C), heap of cores (loop in C).
        v
    Policy: core[u], slot[u] (position in the core's ordered task list), stripe[u]

Unit size S_t (topology data, default: what the tier moves in 20 us, rounded to 64 KiB; cm384:
die-to-die 4 MiB, intra-node 3.25 MiB, inter-node 2.875 MiB). Appendix C trades policy-generation
time (number of units) against residual imbalance (LPT leaves at most about one unit's cost
between cores): 20 us units keep the residual under 0.1% of a 32-rank 128 MiB all_gather's
~30 ms per core while that call has ~1300 units per rank. Fan-out cap H_t default: the cores
whose issue rate fills one pair's bandwidth, ceil(beta_t / core rate) (more cores on one peer
only add contention); a cap below C / (peers) is raised to it so the cap never idles a core.

Policies are cached by their inputs (the same shape gives the same policy: regular collectives
reuse it, Appendix C); ``generation_us`` is the host wall time of computing it, reported beside
the operator's modeled time. That time is paid on every new shape, so the balanced scheduling loop
is native (``_lpt.c``): ordering and caps are numpy here, the heap-and-scan loop runs in C, step for
step as the Python loop it replaced (heapq's order on (load, core, stripe, slot), the same bounded
scan), so policies are identical. A 32-rank 128 MiB all_gather's policy (~1300 units, 24 cores)
takes ~0.1 ms, ~0.35% of the call (the loop in Python took ~1.3 ms, 4.3%).

The hierarchical MoE variant (Appendix D) plugs in by handing ``partition`` windows instead of
slices: a window is any (peer, bytes) range, so expert windows aggregated into peer windows are
just coarser slices.
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from . import _lpt

PARTITIONS = ("naive", "balanced")
UNIT_ALIGN = 64 * 1024
UNITS_PER_CORE = 16      # a phase is cut into at least this many units per core ...
MIN_UNIT = 4096          # ... unless units would get smaller than this
MAX_UNITS = 4096         # units grow beyond S_t when a phase would have more (policy-generation budget)
_CACHE_LIMIT = 512


@dataclasses.dataclass(frozen=True)
class Units:
    """Transfer units of one phase of one rank, structure of arrays."""
    slice: np.ndarray       # index of the slice the unit belongs to
    offset: np.ndarray      # byte offset inside the slice
    nbytes: np.ndarray
    peer: np.ndarray
    tier: np.ndarray        # tier index (ub._sharing.BandwidthSharing order)
    cost: np.ndarray        # tau = alpha_t + s / beta_t, us

    def __len__(self) -> int:
        return int(self.nbytes.size)


@dataclasses.dataclass(frozen=True)
class Policy:
    """Per-core ordered task lists: unit u runs on core[u] as its slot[u]-th task (stripe[u])."""
    partition: str
    cores: int
    core: np.ndarray
    slot: np.ndarray
    stripe: np.ndarray
    generation_us: float     # host wall time of computing this policy (0 when it came from the cache)

    def load(self, units: Units) -> np.ndarray:
        """Predicted load of every core (sum of its units' modeled costs), us."""
        return np.bincount(self.core, weights=units.cost, minlength=self.cores)

    def lists(self) -> list[np.ndarray]:
        """Unit indices of every core's task list, in order."""
        order = np.lexsort((self.slot, self.core))
        bounds = np.searchsorted(self.core[order], np.arange(self.cores + 1))
        return [order[bounds[c]:bounds[c + 1]] for c in range(self.cores)]


def cut(peer: np.ndarray, nbytes: np.ndarray, tier: np.ndarray, unit_bytes: np.ndarray, alpha: np.ndarray,
        beta: np.ndarray, cores: int = 1) -> Units:
    """Cut slices (peer, nbytes, tier of each) into units of at most ``unit_bytes[tier]``, and
    of at most total / (UNITS_PER_CORE x cores) bytes, so that a smaller phase still gives every
    core units to balance, but never below MIN_UNIT (``cores`` = 0: no such floor, for cores
    that only post descriptors). ``alpha``/``beta`` (us, bytes/us) per tier give each unit's cost."""
    peer, nbytes, tier = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (peer, nbytes, tier))
    alpha = np.asarray(alpha, dtype=np.float64)
    total = int(nbytes.sum())
    fine = -(-total // (UNITS_PER_CORE * cores)) if cores > 0 else max(total, 1)
    size = np.minimum(np.asarray(unit_bytes, dtype=np.int64), max(MIN_UNIT, fine))[tier]
    size = np.maximum(size, -(-total // MAX_UNITS))
    k = np.maximum(-(-nbytes // size), (nbytes > 0).astype(np.int64))
    sl = np.repeat(np.arange(peer.size), k)
    first = np.repeat(np.cumsum(k) - k, k)
    j = np.arange(sl.size) - first
    off = j * size[sl]
    nb = np.minimum(size[sl], nbytes[sl] - off)
    t = tier[sl]
    return Units(sl, off, nb, peer[sl], t, np.asarray(alpha)[t] + nb / np.asarray(beta)[t])


def naive(units: Units, cores: int) -> Policy:
    """Each peer pinned to a fixed core group; a peer's units dealt round-robin inside it."""
    peers = list(dict.fromkeys(units.peer.tolist()))          # first-seen (slice) order
    p_index = {p: i for i, p in enumerate(peers)}
    pi = np.array([p_index[p] for p in units.peer.tolist()], dtype=np.int64)
    P = max(len(peers), 1)
    if P >= cores:
        width = np.ones(P, dtype=np.int64)
        lo_p = np.arange(P) % cores
    else:
        lo_p = np.arange(P) * cores // P
        width = np.diff(np.r_[lo_p, cores])
    # position of each unit among its peer's units
    order = np.argsort(pi, kind="stable")
    first = np.searchsorted(pi[order], np.arange(P))
    rank = np.empty(pi.size, dtype=np.int64)
    rank[order] = np.arange(pi.size) - first[pi[order]]
    core = lo_p[pi] + rank % width[pi]
    slot = _slots(core, pi, rank, cores)
    return Policy("naive", cores, core, slot, slot.copy(), 0.0)


def _slots(core, pi, rank, cores):
    # a core runs its peers in peer order, each peer's units in order
    order = np.lexsort((rank, pi, core))
    slot = np.empty(core.size, dtype=np.int64)
    start = np.searchsorted(core[order], np.arange(cores))
    slot[order] = np.arange(core.size) - start[core[order]]
    return slot


def balanced(units: Units, cores: int, caps: np.ndarray) -> Policy:
    """LPT list scheduling with the per-stripe fan-out cap ``caps[tier]`` (see module docstring).
    Raises ValueError when ``cores`` < 1."""
    if cores < 1:
        raise ValueError(f"balanced partition: cores must be >= 1, got {cores}")
    U = len(units)
    # runs of one peer, by offset: a unit's rank inside its peer (`within`), and peers as dense
    # indices 0..P-1 (the native loop's fan-out table is keyed by them)
    o = np.lexsort((units.offset, units.peer))
    grp = units.peer[o]
    first = np.empty(U, dtype=bool)
    first[:1] = True
    np.not_equal(grp[1:], grp[:-1], out=first[1:])
    run = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    peer_index = np.empty(U, dtype=np.int64)
    peer_index[o] = run
    within = np.empty(U, dtype=np.int64)
    within[o] = np.arange(U) - starts[run]
    npeers = max(starts.size, 1)
    cap = np.maximum(np.asarray(caps, dtype=np.int64)[units.tier], -(-cores // npeers))
    # decreasing cost; equal costs interleave peers (each peer's first unit, then second, ...)
    order = np.lexsort((units.peer, within, -units.cost))
    core = np.empty(U, dtype=np.int64)
    slot = np.empty(U, dtype=np.int64)
    stripe = np.empty(U, dtype=np.int64)
    # the scheduling loop is native (_lpt.c): the same steps as heapq over (load, core, stripe,
    # slot) tuples and the scan of the pending list, ~30x faster than the Python loop it replaced
    _lpt.lpt(np.ascontiguousarray(order, dtype=np.int64), np.ascontiguousarray(units.cost, dtype=np.float64),
             peer_index, np.ascontiguousarray(cap, dtype=np.int64), int(cores), core, slot, stripe)
    return Policy("balanced", cores, core, slot, stripe, 0.0)


class Partitioner:
    """Computes and caches policies (one per phase shape)."""

    def __init__(self, partition: str = "balanced"):
        if partition not in PARTITIONS:
            raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
        self.partition = partition
        self._cache: dict = {}
        self.last_generation_us = 0.0
        self.total_us = 0.0          # all generation time so far (cache hits add nothing)
        self.generated = 0           # policies computed (not from the cache)

    def policy(self, units: Units, cores: int, caps: np.ndarray, key=None) -> Policy:
        """The policy for ``units`` on ``cores`` cores; ``key``: a hashable shape identity for
        the cache (None: not cached). Records ``last_generation_us`` (0 on a cache hit)."""
        if key is not None:
            got = self._cache.get(key)
            if got is not None:
                self.last_generation_us = 0.0
                return got
        t0 = time.perf_counter()
        p = naive(units, cores) if self.partition == "naive" else balanced(units, cores, caps)
        gen = (time.perf_counter() - t0) * 1e6
        p = dataclasses.replace(p, generation_us=gen)
        self.last_generation_us = gen
        self.total_us += gen
        self.generated += 1
        if key is not None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = p
        return p


def default_unit_bytes(bandwidth_bytes_per_us: float, unit_us: float) -> int:
    """S_t default: what the tier moves in ``unit_us``, rounded to 64 KiB (at least 64 KiB)."""
    return max(UNIT_ALIGN, int(round(bandwidth_bytes_per_us * unit_us / UNIT_ALIGN)) * UNIT_ALIGN)


def default_fan_out_cap(bandwidth_bytes_per_us: float, core_rate: float | None, cores: int) -> int:
    """H_t default: ceil(beta_t / core issue rate); no issue-rate limit: no cap (all cores)."""
    if not core_rate:
        return cores
    return max(1, math.ceil(bandwidth_bytes_per_us / core_rate - 1e-9))
