"""The die's HBM as a shared resource: what communication takes of it, and what a kernel is left.

    a timed plan (FabricModel.plan / plan_exchange: every data step carries the bytes each
    member reads and writes in its own HBM: pulled bytes written, its input read by peers,
    local and staging copies read and written) + the members' entering clocks
        |
        v   use(plan, clocks, me): member ``me``'s communication traffic in its HBM as a step
            function of modeled time (bytes/us), each step's bytes spread over that step
        |
        v   ub/_compute.run_job: a kernel beside the call draws at most the capacity minus
            what communication draws at that moment ("comm first", as with cores)

A kernel's demand is its HBM bytes over its time alone; it progresses at the fraction of its
demand it is left (ub/_compute.run_job). The other direction, a kernel already running when a
call starts, leaves the call ``capacity - demand`` (FabricModel.with_hbm): the fabric model then
caps every member's HBM resource there, and the call's local copies and pulls slow down.

Why this matters (paper section 2.2, Fig. 3b): a staged call copies (1 + N) x M more bytes
through the HBM than a zero-copy one, at the HBM's own rate, so a kernel running beside it is
left less while the copies run; zero copy moves only what the fabric delivers (at most its
port's rate in and out).
"""
from __future__ import annotations

import numpy as np


def use(plan: list, clocks, me: int) -> tuple[np.ndarray, np.ndarray]:
    """Member ``me``'s HBM traffic while it runs ``plan`` entered at ``clocks`` (one per member):
    (times, bytes/us from each time on), a step function like ub._compute.occupied's."""
    from ._clock import advance
    t = np.asarray(clocks, dtype=np.float64).copy()
    begin, end, nbytes = [], [], []
    for step in plan:
        kind = step[0]
        if kind == "ring":
            dur, lat, hbm = step[1], step[2], step[4]
            st, fin = t, t + dur[0]
            for s in range(dur.shape[0]):
                if s > 0:          # as advance: after its own step and i-1's, one flag latency later
                    st = np.maximum(fin, np.roll(fin, 1)) + lat
                    fin = st + dur[s]
                begin.append(st[me]), end.append(fin[me]), nbytes.append(hbm[s, me])
            t = fin
            continue
        t_next = advance([step], t)
        if kind == "add":
            begin.append(t[me]), end.append(t[me] + step[1][me]), nbytes.append(step[3][me])
        elif kind == "shift":
            start = max(t[me], np.roll(t, 1)[me]) + step[2][me]     # after i-1's send flag (advance)
            begin.append(start), end.append(start + step[1][me]), nbytes.append(step[5][me])
        t = t_next
    return steps(np.array(begin), np.array(end), np.array(nbytes, dtype=np.float64))


def steps(begin: np.ndarray, end: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The step function of intervals each moving ``nbytes`` evenly over [begin, end)."""
    keep = (end > begin) & (nbytes > 0)
    b, e = begin[keep], end[keep]
    r = nbytes[keep] / (e - b)
    return _sum(np.concatenate([b, e]), np.concatenate([r, -r]))


def combine(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The sum of several traffic step functions (several operations in flight)."""
    if not parts:
        return np.zeros(0), np.zeros(0)
    return _sum(np.concatenate([p[0] for p in parts]), np.concatenate([np.diff(np.r_[0.0, p[1]]) for p in parts]))


def _sum(t: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # at equal times the decreases go first, so back-to-back steps never add up for an instant
    o = np.lexsort((d, t))
    return t[o], np.maximum(np.cumsum(d[o]), 0.0)


def at(times: np.ndarray, rate: np.ndarray, t: float) -> float:
    """The step function's value at ``t`` (0 before its first step)."""
    i = np.searchsorted(times, t, side="right") - 1
    return float(rate[i]) if times.size and i >= 0 else 0.0
