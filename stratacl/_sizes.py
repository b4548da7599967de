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

from ._operators import BY_NAME, names

OPS = names(schedule=True)        # the operators with a schedule (_operators.py)

_BUS = {"2(N-1)/N": lambda n: 2 * (n - 1) / n, "(N-1)/N": lambda n: (n - 1) / n, "1": lambda n: 1.0}


def bus_factor(op: str, n: int) -> float:
    bus = BY_NAME[op].bus
    if bus is None or (n < 2 and bus != "1"):
        return 0.0
    return _BUS[bus](n)


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
    sizes = BY_NAME[op].sizes
    if sizes == ("-", "-"):
        return Shape(0, 0, 0, 0)
    if "per" in sizes or "total" in sizes:
        per = max(size // (n * itemsize), 0)
        counts = {"per": per, "total": per * n}
        return Shape(per * n * itemsize, per, counts[sizes[0]], counts[sizes[1]])
    count = size // itemsize
    counts = {"count": count, "-": 0}
    return Shape(count * itemsize, count, counts[sizes[0]], counts[sizes[1]])
