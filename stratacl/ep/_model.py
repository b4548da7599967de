"""``stratacl.ep.estimate``: the modeled time of one dispatch or combine, without ranks or payload.

    routing (ep.routing: seeded, uniform or skewed)  ->  every rank's counts, per member and
    per expert (collectives._ep.route)  ->  the call's traffic matrices (dispatch_traffic,
    combine_traffic)  ->  ub._clock.model_exchange on ranks 0..N-1, every clock at 0

The same traffic and timed plan as a call under the virtual clock (ep/_buffer.py), so where
both fit they report the same modeled time. Bus bandwidth is counted as DeepEP's tests count
it: the bytes a rank receives in dispatch (a row per token and rank in high-throughput mode,
per token and expert in low-latency mode), or sends back in combine (the same rows), over
the call's time; the mean over ranks.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..collectives import ep_slices
from ..runtime.pipeline import EAGER_BYTES
from ..ub import ModeledCost, cached_model, model_exchange, profile_plan, profiles_cores
from ._routing import routing

OPS = ("dispatch", "combine")
MODES = ("ht", "ll")


@dataclasses.dataclass(frozen=True)
class MoeEstimate(ModeledCost):
    """Modeled cost of one MoE call. Times in microseconds, bandwidth in GB/s (1e9 bytes/s)."""
    op: str
    mode: str
    nranks: int
    tokens: int
    hidden: int
    topk: int
    experts: int
    skew: float
    dtype: str
    registration: str
    partition: str
    path: str
    topology: str
    times_us: np.ndarray       # per rank: when it returns, the call entered at 0
    time_us: float             # the last rank's
    bytes_per_rank: float      # mean bytes a rank receives (dispatch) or sends back (combine)
    busbw: float
    core_gap: float            # (slowest - fastest core completion) / slowest, worst rank
    core_busy_us: float        # summed occupation of a rank's cores, mean over ranks


def estimate(op: str, nranks: int, tokens: int, hidden: int, topk: int, experts: int, mode: str = "ht",
             skew: float = 0.0, seed: int = 0, dtype: str = "float16", topology: str = "cm384",
             registration: str = "roa", partition: str = "balanced", path: str = "mte") -> MoeEstimate:
    """Modeled time of one ``op`` (dispatch | combine, ``mode`` ht | ll) on ranks 0..nranks-1
    of ``topology``, each rank routing ``tokens`` tokens of ``hidden`` elements of ``dtype`` to
    its ``topk`` of ``experts`` experts (``ep.routing(..., skew, seed)``). ``registration``:
    roa, pool, jit (every buffer fresh: each rank maps every peer it reads) or staged (the
    input copied into a communication buffer and the output out of one, as CANN EP); ``partition``: naive or balanced;
    ``path``: mte or sdma. Pure computation: no ranks, no payload."""
    if op not in OPS:
        raise ValueError(f"ep.estimate: op must be one of {', '.join(OPS)}, got {op!r}")
    if mode not in MODES:
        raise ValueError(f"ep.estimate: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if nranks < 1 or experts % nranks:
        raise ValueError(f"ep.estimate: experts ({experts}) must be a multiple of nranks ({nranks})")
    row = int(hidden) * np.dtype(dtype).itemsize
    model = cached_model(topology, registration, partition=partition, path=path, eager_bytes=EAGER_BYTES)
    routes = routing(tokens, experts, topk, nranks, skew, seed)
    phases, received, staging = ep_slices.traffic(op, mode, routes, experts, row)
    members = tuple(range(nranks))
    extra = None
    if registration == "jit":
        reads = np.zeros((nranks, nranks), dtype=bool)
        for b, _ in phases:
            reads |= b > 0
        np.fill_diagonal(reads, False)
        extra = model.registration_us(reads.sum(axis=1), np.maximum(received * row, row))
    times = model_exchange(model, members, phases, np.zeros(nranks), extra, staging)
    t = float(times.max())
    moved = float(received.mean()) * row
    cores = profiles_cores(profile_plan(model, model.plan_exchange(members, phases, staging), members))
    return MoeEstimate(op, mode, nranks, int(tokens), int(hidden), int(topk), int(experts), float(skew),
                       str(np.dtype(dtype)), registration, model.partition, model.path, model.topology.name,
                       times, t, moved, moved / t / 1e3 if t > 0 else 0.0, cores["core_gap"], cores["core_busy_us"])
