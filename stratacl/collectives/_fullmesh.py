"""Full-mesh, pull-mode data movement for every collective: one logical step per phase.

Each function runs after the arrival barrier (every rank's input is ready and every
descriptor agrees) and before the departure barrier (nobody returns while a peer may still
read its input). ``src`` holds every member's input address (registration readiness already
checked), the calling rank's own included: at shared virtual addresses a peer's buffer is just
another address. A phase builds one table of transfers and hands it to the native kernels,
which run with the GIL released:

    all_gather / all_to_all(_v) / gather phase   rows (dst, src, bytes) -> copy_many
    reduce_scatter / reduce phase                 reduce_into: load every member's operand in
                                                  rank order, accumulate in a private tile
                                                  (the core's SRAM), write each byte once

Rows start with the peer after the calling rank (r+1, r+2, ...) so concurrent readers spread
over owners instead of all hitting rank 0 first.
"""
from __future__ import annotations

import numpy as np

from ..runtime._native import data_address as _addr
from . import _kernels


def chunk_bounds(count: int, n: int, i: int) -> tuple[int, int]:
    """Elements [start, stop) of chunk i when ``count`` elements are split over n ranks."""
    return count * i // n, count * (i + 1) // n


def _order(me: int, n: int) -> np.ndarray:
    return (me + np.arange(n)) % n


class Counters:
    """Bytes moved by one rank, for stats(): pulled from peers, copied locally, written to output."""

    __slots__ = ("pulled", "local", "written")

    def __init__(self):
        self.pulled = self.local = self.written = 0

    def add(self, me: int, members: np.ndarray, nbytes: np.ndarray) -> None:
        own = int(nbytes[members == me].sum())
        total = int(nbytes.sum())
        self.local += own
        self.pulled += total - own
        self.written += total


def _copy(me: int, dst: np.ndarray, src: np.ndarray, nbytes: np.ndarray, members: np.ndarray,
          c: Counters) -> None:
    table = np.empty((len(dst), 3), dtype=np.int64)
    table[:, 0], table[:, 1], table[:, 2] = dst, src, nbytes
    _kernels.copy_many(table)
    c.add(me, members, nbytes)


def all_gather(me: int, n: int, out: np.ndarray, x: np.ndarray, src: np.ndarray, c: Counters) -> None:
    nb = x.nbytes
    if nb == 0:
        return
    copied = _kernels.copy_blocks(_addr(out), nb, src, 0, nb, me + 1)
    own = nb if copied == n * nb else 0          # in place: this rank's block was already there
    c.local += own
    c.pulled += copied - own
    c.written += n * nb


def all_to_all(me: int, n: int, out: np.ndarray, x: np.ndarray, src: np.ndarray, c: Counters) -> None:
    nb = x.nbytes // n
    if nb == 0:
        return
    _kernels.copy_blocks(_addr(out), nb, src, me * nb, nb, me + 1)
    c.local += nb
    c.pulled += (n - 1) * nb
    c.written += n * nb


def all_to_all_v(me: int, n: int, out: np.ndarray, x: np.ndarray, send: np.ndarray, recv: np.ndarray,
                 src: np.ndarray, c: Counters) -> None:
    """``send[i, j]``: elements member i sends to member j (packed in rank order in i's input)."""
    item = x.itemsize
    p = _order(me, n)
    send_displ = np.cumsum(send, axis=1) - send           # exclusive prefix sums, per sender
    recv_displ = np.cumsum(recv[me]) - recv[me]
    nbytes = recv[me, p] * item
    _copy(me, _addr(out) + recv_displ[p] * item, src[p] + send_displ[p, me] * item, nbytes, p, c)


def broadcast(me: int, n: int, root: int, x: np.ndarray, src: np.ndarray, c: Counters) -> None:
    if me == root or x.nbytes == 0:
        return
    _kernels.copy(_addr(x), int(src[root]), x.nbytes)
    c.pulled += x.nbytes
    c.written += x.nbytes


def reduce_chunk(me: int, n: int, start: int, stop: int, dst: int, dtype_code: int, itemsize: int,
                 op_code: int, src: np.ndarray, c: Counters) -> None:
    """Elements [start, stop) of every member's input, reduced in rank order into address ``dst``
    (which may alias this rank's own input: each tile is read before it is written)."""
    m = stop - start
    if m <= 0:
        return
    _kernels.reduce_into(dst, src + start * itemsize if start else src, m, dtype_code, op_code, float(n))
    c.local += m * itemsize
    c.pulled += (n - 1) * m * itemsize
    c.written += m * itemsize


def reduce_scatter(me: int, n: int, out: np.ndarray, dtype_code: int, op_code: int, src: np.ndarray,
                   c: Counters) -> None:
    per = out.size
    reduce_chunk(me, n, me * per, (me + 1) * per, _addr(out), dtype_code, out.itemsize, op_code, src, c)


def all_reduce_whole(me: int, n: int, scratch: np.ndarray, count: int, dtype_code: int, itemsize: int,
                     op_code: int, src: np.ndarray, c: Counters) -> None:
    """Small all_reduce, phase 1 of 1: every rank reduces all of it into private scratch."""
    reduce_chunk(me, n, 0, count, _addr(scratch), dtype_code, itemsize, op_code, src, c)
    c.written -= count * itemsize          # scratch is not the output; the copy-out counts


def all_reduce_scatter_phase(me: int, n: int, x: np.ndarray, dtype_code: int, op_code: int,
                             src: np.ndarray, c: Counters) -> None:
    """Phase 1 of in-place all_reduce: reduce this rank's own chunk into place."""
    a, b = chunk_bounds(x.size, n, me)
    reduce_chunk(me, n, a, b, _addr(x) + a * x.itemsize, dtype_code, x.itemsize, op_code, src, c)


def all_reduce_gather_phase(me: int, n: int, x: np.ndarray, src: np.ndarray, c: Counters) -> None:
    """Phase 2: pull every other rank's finished chunk."""
    copied = _kernels.copy_chunks(_addr(x), src, x.size, x.itemsize, me)
    c.pulled += copied
    c.written += copied
