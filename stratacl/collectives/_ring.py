"""Ring algorithms (``--algo ring``): N-1 steps per phase, each member pulling from its left
neighbour i-1 only, with a flag between steps. The step structure is the one
``collectives._schedule`` times (see its docstring); here it moves the real bytes.

    all_gather      step s: member i pulls chunk c = (i - s - 1) mod N from i-1 (step 0: i-1's
                    input; later: i-1's output, where i-1 put it in step s-1) into its output;
                    its own block is copied locally in step 0
    reduce_scatter  step s: c = (i - s - 2) mod N; i load-reduces i-1's partial of chunk c (step
                    0: i-1's input chunk) with its own input chunk c into its partial buffer; in
                    the last step c = i and the result goes to the output
    all_reduce      the reduce-scatter above in place (partials in a scratch buffer, the last
                    step writes chunk i of the buffer), a barrier, then the all_gather above
                    in place on the buffer's chunks

Reduction order: chunk c is folded left over members c+1, c+2, ..., c (mod N), the order the
ring visits them, so floating-point results differ from the mesh's rank order in rounding (as
any ring implementation's do); avg sums in that order and divides once at the end.

``flags`` is the communicator's step synchronisation: ``wait(s)`` returns once i-1 has finished
its step s-1, ``post(s)`` tells i+1 that step s is done. Buffers are addresses: peers' at
the shadow addresses their descriptors name, readiness already checked.
"""
from __future__ import annotations

import array
from typing import Protocol

from . import _kernels
from ._fullmesh import Counters, chunk_bounds
from ._reduce import REDUCE_OPS


class StepFlags(Protocol):
    def wait(self, s: int) -> None: ...
    def post(self, s: int) -> None: ...


_SUM = REDUCE_OPS["sum"]
_AVG = REDUCE_OPS["avg"]


def all_gather(me: int, n: int, out: int, x: int, nb: int, left_x: int, left_out: int, flags: StepFlags,
               c: Counters) -> None:
    """``out`` receives every member's ``nb``-byte input, rank-major."""
    if out + me * nb != x:
        _kernels.copy(out + me * nb, x, nb)
        c.local += nb
    for s in range(n - 1):
        if s:
            flags.wait(s)
        ch = (me - s - 1) % n
        _kernels.copy(out + ch * nb, left_x if s == 0 else left_out + ch * nb, nb)
        flags.post(s)
    c.pulled += (n - 1) * nb
    c.written += n * nb


def _reduce_steps(me: int, n: int, bounds, itemsize: int, own: int, left_own: int, part: int, left_part: int,
                  final: int, dtype: int, op: int, flags: StepFlags, c: Counters, first_step: int = 0) -> None:
    """The N-1 reduce-scatter steps; chunk c lives at byte offset bounds(c)[0] * itemsize of
    ``own``/``part`` (and of the left neighbour's), chunk ``me`` ends at ``final``."""
    step_op = _SUM if op == _AVG else op
    for s in range(n - 1):
        if s:
            flags.wait(first_step + s)
        ch = (me - s - 2) % n
        a, b = bounds(ch)
        off = a * itemsize
        prev = left_own + off if s == 0 else left_part + off
        last = s == n - 2
        dst = final if last else part + off
        if b > a:
            _kernels.reduce_into(dst, array.array("q", (prev, own + off)), b - a, dtype, op if last else step_op, float(n))
        c.pulled += (b - a) * itemsize
        c.local += (b - a) * itemsize
        flags.post(first_step + s)
    a, b = bounds(me)
    c.written += (b - a) * itemsize


def reduce_scatter(me: int, n: int, out: int, x: int, per: int, itemsize: int, left_x: int, part: int,
                   left_part: int, dtype: int, op: int, flags: StepFlags, c: Counters) -> None:
    """``out`` (``per`` elements) receives chunk ``me`` of the reduction of every member's ``x``."""
    if n == 1:
        if per:
            _kernels.reduce_into(out, array.array("q", (x,)), per, dtype, op, 1.0)
        c.local += per * itemsize
        c.written += per * itemsize
        return
    _reduce_steps(me, n, lambda ch: (ch * per, (ch + 1) * per), itemsize, x, left_x, part, left_part, out, dtype,
                  op, flags, c)


def all_reduce(me: int, n: int, x: int, count: int, itemsize: int, left_x: int, part: int, left_part: int,
               dtype: int, op: int, flags: StepFlags, barrier, c: Counters) -> None:
    """In place on ``x`` (``count`` elements): ring reduce-scatter, barrier, ring all_gather."""
    if n == 1:
        if count:
            _kernels.reduce_into(x, array.array("q", (x,)), count, dtype, op, 1.0)
        return
    bounds = lambda ch: chunk_bounds(count, n, ch)     # noqa: E731
    a, _ = bounds(me)
    _reduce_steps(me, n, bounds, itemsize, x, left_x, part, left_part, x + a * itemsize, dtype, op, flags, c)
    barrier()
    for s in range(n - 1):
        if s:
            flags.wait(n - 1 + s)
        ch = (me - s - 1) % n
        a, b = bounds(ch)
        _kernels.copy(x + a * itemsize, left_x + a * itemsize, (b - a) * itemsize)
        c.pulled += (b - a) * itemsize
        c.written += (b - a) * itemsize
        flags.post(n - 1 + s)
