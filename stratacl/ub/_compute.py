"""Compute charged to a rank's cores in the model, so overlap and core contention show in modeled time.

    ComputeJob(cores=k, duration_us=d, start_us=s): a kernel that needs k of the rank's cores
    for d us when it has them all (k x d core-us of work)
        |
    overlap(model, op, ..., job, rank): the collective's per-core occupation of that rank, from
    the profiler's automatic probes (MTE: every communication core from the call's start to its
    end; SDMA: the descriptor builds, and the polling cores; sync on the SDMA path is done by
    the polling cores, or by the AI CPU with notify completion)
        |   comm first (default): the collective holds its cores; the job runs on
        |       min(k, count - occupied(t)) cores: its progress rate is that / k
        |   compute first: the job holds k cores; the collective gets min(comm, count - k) cores
        v
    Overlap: the collective's time, the job's end, the job's slowdown against running alone
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class ComputeJob:
    cores: int
    duration_us: float
    start_us: float = 0.0


@dataclasses.dataclass(frozen=True)
class Overlap:
    comm_us: float          # the collective's modeled time (the last member's)
    compute_end_us: float   # when the job ends
    slowdown: float         # (job's time with the collective) / (alone) - 1
    cores_free_min: int     # fewest cores the job could use while the collective ran


def occupied(profiler, path: str) -> tuple[np.ndarray, np.ndarray]:
    """Step function of busy communication cores of one rank: (times, count from each time on)."""
    r = profiler.rows
    st = [profiler.stages.index(s) for s in ("data", "descriptor", "poll", "sync") if s in profiler.stages]
    keep = np.isin(r["stage"], st) & (r["core"] >= 0)
    b, e = r["begin"][keep], r["end"][keep]
    if path == "mte" and b.size:       # the kernel is resident on its cores for the whole call
        cores = np.unique(r["core"][keep])
        b, e = np.full(cores.size, b.min()), np.full(cores.size, e.max())
    t = np.concatenate([b, e])
    d = np.concatenate([np.ones(b.size), -np.ones(e.size)])
    o = np.lexsort((d, t))
    return t[o], np.cumsum(d[o])


def combine(steps: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The sum of several busy-core step functions (as ``occupied`` returns them)."""
    if not steps:
        return np.zeros(0), np.zeros(0)
    t = np.concatenate([s[0] for s in steps])
    d = np.concatenate([np.diff(np.r_[0, s[1]]) for s in steps])
    o = np.lexsort((d, t))
    return t[o], np.cumsum(d[o])


def run_job(job: ComputeJob, total_cores: int, times: np.ndarray, busy: np.ndarray) -> tuple[float, int]:
    """End of ``job`` given the busy-core step function; also the fewest cores it had. A job
    with no work ends where it starts, whatever holds the cores."""
    work = job.cores * job.duration_us
    if work <= 0:
        return job.start_us, job.cores
    t, fewest = job.start_us, job.cores
    edges = np.r_[times[times > t], np.inf]
    for edge in edges:
        now = busy[np.searchsorted(times, t, side="right") - 1] if times.size and t >= times[0] else 0
        cores = int(max(0, min(job.cores, total_cores - now)))
        fewest = min(fewest, cores)
        if cores > 0 and work <= cores * (edge - t):
            return t + work / cores, fewest
        work -= cores * (edge - t) if np.isfinite(edge) else 0
        t = edge
    return t, fewest


def overlap(model, op: str, algo: str, members, nbytes: int, job: ComputeJob, rank: int = 0, root: int = 0,
            itemsize: int = 1, compute_first: bool = False) -> Overlap:
    """A collective and a compute job started together on member ``rank``'s cores (see module doc)."""
    from ._clock import FabricModel, model_call
    from ._profile import profile_call
    m = model
    if compute_first:
        free = max(1, min(model.comm_cores, model.cores - job.cores))
        m = FabricModel(model.topology, model.registration, model.staged_buffer, model.cores, free,
                        model.partition, model.path, model.completion, eager_bytes=model.eager_bytes)
    n = len(tuple(members))
    comm = float(model_call(m, op, algo, members, nbytes, np.zeros(n), root=root, itemsize=itemsize).max())
    if compute_first:
        fewest = min(job.cores, model.cores)
        end = job.start_us + job.duration_us * job.cores / fewest
    else:
        prof = profile_call(m, op, algo, members, nbytes, root, itemsize, ranks=[rank])[0]
        times, busy = occupied(prof, m.path)
        end, fewest = run_job(job, m.cores, times, busy)
    return Overlap(comm, end, (end - job.start_us) / job.duration_us - 1, fewest)
