"""A rank's logical NPU cores in the model: exact per-core timelines of one phase (MTE path).

    units of the phase (collectives._partition.cut) + a policy (core, slot of every unit)
    + the reader's fabric share S (bytes/us: what the fabric model gives this rank's transfers
      of the phase together, ub._sharing) + one core's issue rate r (topology ``cores.issue_gbps``)
        |
        v   event simulation: every active core runs its task list in order; a unit of tier t
            costs alpha_t (its access latency, paid first) + s / b(t), where
                b(t) = min(r, S / k(t)),  k(t) = cores still working
            the active cores share the rank's fabric share equally and none exceeds its own
            issue rate; b changes only when a core finishes its list, so the simulation has
            at most C epochs, each vectorised over all units. A core double-buffers through
            its unified buffer: it issues unit j+1's loads while unit j's bytes stream, so
            only its first unit exposes alpha_t (later units' latencies are hidden)
        v
    CoreRun: start and end of every unit, end and busy time of every core

Why this combination. The fabric model (``_sharing.py``) says how much bandwidth this rank's
transfers get against everybody else's (ports, uplinks, fan-in); the cores decide how much of it
is used: a core cannot issue faster than r, so with few cores, or when cores of a naive policy
sit idle while others still have work, the rank gets less than its share. With cores enough
(C * r above S) and a balanced policy, the phase ends within a few unit latencies of the fabric's
time, which is why the issue-4 comparisons still hold. Local copies (staging, own blocks) are
units of the local tier (alpha 0, S = the HBM copy rate): they too are issued by cores, but r
does not bound them (r is the rate of a core's remote requests, calibrated on the UB port; a
local copy never crosses the fabric), so the HBM does (``issue_rate`` per unit: inf for them).

Deterministic: numpy, fixed order; the same inputs give bit-identical timelines.
"""
from __future__ import annotations

import dataclasses

import numpy as np

_EPS = 1e-12


@dataclasses.dataclass(frozen=True)
class CoreRun:
    """Per-unit and per-core times of one phase, in us from the phase's start."""
    unit_start: np.ndarray
    unit_end: np.ndarray
    core_start: np.ndarray     # nan for a core without units
    core_end: np.ndarray       # nan for a core without units
    busy: np.ndarray           # us each core is occupied (0 without units)

    @property
    def end(self) -> float:
        e = self.core_end[~np.isnan(self.core_end)]
        return float(e.max()) if e.size else 0.0

    def gap(self) -> float:
        """(slowest - fastest core completion) / slowest, over cores that had work."""
        e = self.core_end[~np.isnan(self.core_end)]
        return float((e.max() - e.min()) / e.max()) if e.size and e.max() > 0 else 0.0


def run_mte(nbytes: np.ndarray, alpha: np.ndarray, core: np.ndarray, slot: np.ndarray, cores: int,
            share: float, issue_rate: float | None) -> CoreRun:
    """Exact timelines of cores executing units (``nbytes``, ``alpha`` per unit) in the order of
    ``slot`` on ``core``, sharing ``share`` bytes/us, each capped at ``issue_rate`` (None: no cap;
    an array: each unit's own cap, inf for none)."""
    U = nbytes.size
    ustart, uend = np.full(U, np.nan), np.full(U, np.nan)
    cstart, cend = np.full(cores, np.nan), np.full(cores, np.nan)
    if U == 0:
        return CoreRun(ustart, uend, cstart, cend, np.zeros(cores))
    order = np.lexsort((slot, core))
    c = core[order]
    gstart = np.searchsorted(c, np.arange(cores))
    ra = alpha[order].astype(np.float64)         # remaining exposed latency of each unit
    first = np.zeros(U, dtype=bool)
    first[gstart[gstart < U]] = True
    ra[~first] = 0.0                             # hidden behind the previous unit's bytes
    rb = nbytes[order].astype(np.float64)        # remaining bytes of each unit
    # each unit's issue-rate cap, in task order (None: no cap)
    if issue_rate is None or np.ndim(issue_rate) == 0:
        cap = float(issue_rate) if issue_rate else None
    else:
        cap = np.asarray(issue_rate, dtype=np.float64)[order]
    started = np.zeros(U, dtype=bool)
    has = np.bincount(c, minlength=cores) > 0
    active = has.copy()
    t = 0.0
    us, ue = np.full(U, np.nan), np.full(U, np.nan)
    while active.any():
        k = int(active.sum())
        b = share / k if share > 0 else np.inf
        if cap is not None:
            b = np.minimum(b, cap)
        cost = ra + rb / b
        cum = np.cumsum(cost)
        base = np.r_[0.0, cum][gstart[c]]          # cumulative before each core's first unit
        cum_in = cum - base                          # per-core running cost at this rate
        total = np.zeros(cores)
        np.maximum.at(total, c, cum_in)
        dt = float(total[active].min())
        # units that start / end within this epoch
        begin = cum_in - cost
        new = ~started & (begin <= dt * (1 + _EPS)) & (cost > 0) & active[c]
        us[new] = t + begin[new]
        started |= new
        done = (cum_in <= dt * (1 + _EPS)) & (ue != ue) & active[c] & started
        ue[done] = t + cum_in[done]
        ra[done], rb[done] = 0.0, 0.0
        # the unit in progress on every core still working: consume latency first, then bytes
        prog = active[c] & ~done & started & (begin < dt)
        e = dt - begin[prog]
        lat = np.minimum(e, ra[prog])
        ra[prog] -= lat
        rb[prog] = np.maximum(rb[prog] - (e - lat) * (b[prog] if np.ndim(b) else b), 0.0)
        t += dt
        fin = active & (total <= dt * (1 + _EPS))
        cend[fin] = t
        active &= ~fin
    ustart[order], uend[order] = us, ue
    cstart[has] = ustart[order[gstart[has]]]
    busy = np.where(has, cend - np.nan_to_num(cstart), 0.0)
    return CoreRun(ustart, uend, cstart, cend, busy)
