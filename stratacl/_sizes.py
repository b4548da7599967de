"""nccl-tests' size conventions: what a collective's size means, its count, its bus bandwidth.

One table, used by estimate-only mode (``stratacl.estimate``) and by ``stratacl-bench``, so an
estimate row and a measured row of the same size describe the same call:

    op              size (B) means                count column      bus bandwidth factor
    all_gather      whole output, N x per-rank    per-rank elements (N-1)/N
    reduce_scatter  whole input, N x per-rank     per-rank elements (N-1)/N
    all_to_all      whole buffer, N x per-peer    per-peer elements (N-1)/N
    all_reduce      the buffer                    elements          2(N-1)/N
    broadcast       the buffer                    elements          1
    sendrecv        the message                   elements          1
    barrier         -                             0                 -

algbw = size / time, busbw = algbw x factor, GB = 1e9.
"""
from __future__ import annotations

import dataclasses

OPS = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "broadcast", "sendrecv", "barrier")


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n if n > 1 else 0.0
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n if n > 1 else 0.0
    if op in ("broadcast", "sendrecv"):
        return 1.0
    return 0.0


@dataclasses.dataclass(frozen=True)
class Shape:
    """Element counts of one call (a sweep point) for one rank."""
    size: int        # bytes, nccl-tests meaning (see module docstring)
    count: int       # the count column
    n_in: int        # elements of the input buffer
    n_out: int       # elements of the output buffer (0: in place)


def shape(op: str, n: int, size: int, itemsize: int) -> Shape:
    """The counts of ``op`` on ``n`` ranks at nccl-tests size ``size``, rounded down to whole
    elements of ``itemsize`` bytes (and, where the op has per-rank chunks, to whole chunks)."""
    if op == "barrier":
        return Shape(0, 0, 0, 0)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        per = max(size // (n * itemsize), 0)
        total = per * n
        if op == "all_gather":
            return Shape(total * itemsize, per, per, total)
        if op == "reduce_scatter":
            return Shape(total * itemsize, per, total, per)
        return Shape(total * itemsize, per, total, total)
    count = size // itemsize
    if op == "sendrecv":
        return Shape(count * itemsize, count, count, count)
    return Shape(count * itemsize, count, count, 0)
