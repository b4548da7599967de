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
    hbm_bytes: float = 0.0      # what the kernel reads and writes in HBM over its run (0: none counted)

    @property
    def hbm_demand(self) -> float:
        """Bytes/us the kernel draws from the HBM when it runs alone."""
        return self.hbm_bytes / self.duration_us if self.duration_us > 0 else 0.0


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


def run_job(job: ComputeJob, total_cores: int, times: np.ndarray, busy: np.ndarray,
            hbm: tuple[np.ndarray, np.ndarray] | None = None, capacity: float = np.inf) -> tuple[float, int]:
    """End of ``job`` given the busy-core step function; also the fewest cores it had. A job
    with no work ends where it starts, whatever holds the cores.

    ``hbm``: communication's HBM traffic on the die (``ub._hbmshare.use``), ``capacity`` the HBM's
    bandwidth (bytes/us). The job draws ``job.hbm_demand`` alone; beside the traffic it is left
    ``capacity - traffic`` ("comm first"), and runs at the smaller of its cores' and its HBM's
    fraction."""
    work = job.cores * job.duration_us
    if work <= 0:
        return job.start_us, job.cores
    demand = job.hbm_demand if hbm is not None else 0.0
    htimes, hrate = hbm if demand > 0 else (np.zeros(0), np.zeros(0))
    t, fewest = job.start_us, job.cores
    edges = np.r_[np.unique(np.r_[times[times > t], htimes[htimes > t]]), np.inf]
    for edge in edges:
        now = busy[np.searchsorted(times, t, side="right") - 1] if times.size and t >= times[0] else 0
        cores = int(max(0, min(job.cores, total_cores - now)))
        fewest = min(fewest, cores)
        rate = cores
        if demand > 0:       # the cores it would keep busy, at the share of its demand the HBM leaves it
            i = np.searchsorted(htimes, t, side="right") - 1
            traffic = float(hrate[i]) if htimes.size and i >= 0 else 0.0
            left = max(0.0, capacity - traffic)
            if left < demand:
                rate = min(cores, job.cores * left / demand)
        if rate > 0 and work <= rate * (edge - t):
            return t + work / rate, fewest
        work -= rate * (edge - t) if np.isfinite(edge) else 0
        t = edge
    return t, fewest


def kernel_end(job: ComputeJob, total_cores: int, occupancy: list, capacity: float) -> float:
    """When ``job`` ends beside the operations in flight, given as what their cores and HBM
    did: ``occupancy`` lists (model, timed plan, members, entering clocks, this member), as
    the runtime keeps them for ``charge_compute`` and a trace replay rebuilds them."""
    from . import _hbmshare as _hbm
    from ._profile import profile_plan
    cores = [occupied(profile_plan(m, plan, members, clocks_in=clocks, ranks=[me])[0], m.path)
             for m, plan, members, clocks, me in occupancy]
    times, busy = combine(cores)
    traffic = _hbm.combine([_hbm.use(plan, clocks, me) for _, plan, _, clocks, me in occupancy]) \
        if job.hbm_bytes > 0 else None
    if not times.size and (traffic is None or not traffic[0].size):
        return job.start_us + job.duration_us
    return run_job(job, total_cores, times, busy, traffic, capacity)[0]


def overlap(model, op: str, algo: str, members, nbytes: int, job: ComputeJob, rank: int = 0, root: int = 0,
            itemsize: int = 1, compute_first: bool = False) -> Overlap:
    """A collective and a compute job started together on member ``rank``'s cores and HBM (see
    the module doc). Comm first: the job is left the cores and the HBM bandwidth the collective
    does not use at each moment. Compute first: the job keeps its cores and its HBM demand, and
    every member's call runs on the cores and the HBM bandwidth left (every member runs the
    job, as the ranks of a data-parallel step do)."""
    from . import _hbmshare as _hbm
    from ._clock import FabricModel, model_call
    m = model
    hbm = model.fabric.hbm
    if compute_first:
        free = max(1, min(model.comm_cores, model.cores - job.cores))
        m = FabricModel(model.topology, model.registration, model.staged_buffer, model.cores, free,
                        model.partition, model.path, model.completion, eager_bytes=model.eager_bytes)
        if job.hbm_demand > 0:
            if job.hbm_demand >= hbm:
                raise ValueError(f"overlap: a job drawing {job.hbm_demand / 1e3:g} GB/s holds the whole HBM "
                                 f"({hbm / 1e3:g} GB/s) and leaves a call started beside it none")
            m = m.with_hbm((hbm - job.hbm_demand) / 1e3)
    members = tuple(int(r) for r in np.asarray(members).reshape(-1))
    n = len(members)
    if algo == "auto":
        from ._clock import choose_algo
        algo = choose_algo(m, op, members, nbytes, root, itemsize)
    plan = m.plan(op, algo, members, int(nbytes), root, itemsize)
    comm = float(model_call(m, op, algo, members, nbytes, np.zeros(n), root=root, itemsize=itemsize).max())
    if compute_first:
        fewest = min(job.cores, model.cores)
        end = job.start_us + job.duration_us * job.cores / fewest
    else:
        from ._profile import profile_plan
        times, busy = occupied(profile_plan(m, plan, members, ranks=[rank])[0], m.path)
        end, fewest = run_job(job, m.cores, times, busy, _hbm.use(plan, np.zeros(n), rank), hbm)
    return Overlap(comm, end, (end - job.start_us) / job.duration_us - 1, fewest)
