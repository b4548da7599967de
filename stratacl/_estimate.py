"""Estimate-only mode: a collective's modeled time on N ranks, without ranks or payload.

    estimate(op, nranks, size) --> per-rank input bytes (nccl-tests size conventions)
                               --> ub._clock.model_call on members 0..N-1, every clock at 0
                               --> Estimate: per-rank modeled times, the call's time (the last
                                   rank to finish), algbw = size / time, busbw = algbw x factor

It runs the same schedules and cost model as the data path's virtual clock (with the
runtime's eager threshold, runtime/pipeline/_buffers.py), so where both fit they report the same
modeled time; no bytes are allocated, so 1 GiB per rank on 256 ranks is
as cheap as 1 KiB. ``registration="jit"`` assumes every buffer is fresh, so each rank pays the
mappings of every peer buffer it reads (the paper's dynamic-shape case, section 3.1).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from ._sizes import OPS as SIZED_OPS, bus_factor, shape
from .collectives import schedules
from .runtime.pipeline import EAGER_BYTES
from .ub import (
    FabricModel, ModeledCost, Topology, cached_model, call_cores, choose_algo, model_call, profile_call,
    write_chrome_trace,
)

ALGOS = ("mesh", "ring", "auto")


@dataclasses.dataclass(frozen=True)
class Estimate(ModeledCost):
    """Modeled cost of one call. Times in microseconds, bandwidths in GB/s (1e9 bytes/s)."""
    op: str
    nranks: int
    size: int                 # bytes, nccl-tests meaning (all_gather: the whole output, N x per rank)
    count: int                # elements, nccl-tests count column
    dtype: str
    algo: str                 # the algorithm timed (what auto picked, if auto)
    registration: str
    topology: str
    times_us: np.ndarray      # per rank: when it returns, the call entered at 0
    time_us: float            # the last rank's
    algbw: float
    busbw: float
    cores: int = 48           # logical NPU cores per rank, of which comm_cores communicate
    comm_cores: int = 24
    partition: str = "balanced"
    path: str = "mte"
    core_gap: float = 0.0     # (slowest - fastest core completion) / slowest, worst rank
    core_busy_us: float = 0.0  # summed occupation of a rank's cores, mean over ranks
    policy_us: float = 0.0    # host wall time of generating one rank's policy, mean (0: all cached)


def estimate(op: str, nranks: int, nbytes: int, algo: str = "mesh", topology: str | Topology = "cm384",
             registration: str = "roa", root: int = 0, dtype: str = "float32", cores: int | None = None,
             comm_cores: int | None = None, partition: str = "balanced", path: str = "mte",
             profile: str | None = None) -> Estimate:
    """Modeled time of one ``op`` on ranks 0..nranks-1 of ``topology``, sized like nccl-tests.

    ``nbytes`` is nccl-tests' size: the whole buffer for all_gather, reduce_scatter and all_to_all
    (N x per-rank), the buffer for all_reduce and broadcast, the message for sendrecv; it is
    rounded down to whole elements of ``dtype`` (and per-rank chunks), as stratacl-bench does.
    ``algo``: mesh, ring or auto. ``registration``: roa, pool, jit or staged. ``cores`` /
    ``comm_cores``: logical NPU cores per rank and how many communicate (None: the topology's,
    cm384 48 / 24); ``partition``: naive or balanced; ``path``: mte (cores move the bytes) or
    sdma (cores post descriptors, the engine moves them). ``profile``: a directory to write the
    call's per-core Chrome trace to (``trace-<op>-<size>.json``). Pure computation: no ranks,
    no shared memory; allocates nothing of the payload's size."""
    if op not in SIZED_OPS:
        raise ValueError(f"estimate: unknown operator {op!r} (known: {', '.join(SIZED_OPS)})")
    if algo not in ALGOS:
        raise ValueError(f"estimate: algo must be one of {', '.join(ALGOS)}, got {algo!r}")
    if nranks < 1:
        raise ValueError(f"estimate: nranks must be >= 1, got {nranks}")
    if not 0 <= root < nranks:
        raise ValueError(f"estimate: root {root} is not a rank of {nranks}")
    itemsize = np.dtype(dtype).itemsize
    if isinstance(topology, str):
        model = cached_model(topology, registration, cores, comm_cores, partition, path, eager_bytes=EAGER_BYTES)
    else:
        model = FabricModel(topology, registration, cores=cores, comm_cores=comm_cores, partition=partition, path=path,
                            eager_bytes=EAGER_BYTES)
    sh = shape(op, nranks, int(nbytes), itemsize)
    per_rank = sh.n_in * itemsize
    members = np.arange(nranks)
    chosen = choose_algo(model, op, members, per_rank, root, itemsize) if algo == "auto" else algo
    if op not in schedules.RING_OPS:
        chosen = "mesh"
    extra = None
    if registration == "jit":
        extra = model.registration_us(schedules.peers_read(op, chosen, nranks, root), per_rank)
    gen0, k0 = model.partitioner.total_us, model.partitioner.generated
    times = model_call(model, op, chosen, members, per_rank, np.zeros(nranks), extra, root, itemsize)
    k = model.partitioner.generated - k0
    policy_us = (model.partitioner.total_us - gen0) / k if k else 0.0
    t = float(times.max())
    algbw = sh.size / t / 1e3 if t > 0 else 0.0
    cc = call_cores(model, op, chosen, members, per_rank, root, itemsize)
    if profile:
        profs = profile_call(model, op, chosen, members, per_rank, root, itemsize)
        write_chrome_trace(os.path.join(profile, f"trace-{op}-{sh.size}.json"), profs)
    return Estimate(op, nranks, sh.size, sh.count, str(np.dtype(dtype)), chosen, registration,
                    model.topology.name, times, t, algbw, algbw * bus_factor(op, nranks), model.cores,
                    model.comm_cores, model.partition, model.path, cc["core_gap"], cc["core_busy_us"], policy_us)
