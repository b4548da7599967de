"""Full-mesh, pull-mode data movement for every collective: one logical step per phase.

Each function runs after the arrival barrier (every rank's input is ready and every
descriptor agrees) and before the departure barrier (nobody returns while a peer may still
read its input). ``peer(i, byte_offset, nbytes)`` gives a uint8 view of member i's input at
its shared virtual address (registration readiness already checked); a rank reads peers'
bytes straight into its own output, and reductions load remote operands into a private
scratch tile (the core's SRAM) and write each output byte once.

Peers are visited starting after the calling rank (r+1, r+2, ...) so that concurrent readers
spread over owners instead of all hitting rank 0 first.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from . import _reduce

TILE_BYTES = 256 * 1024     # reduction tile: fits the host core's L2 with room for operands

PeerBytes = Callable[[int, int, int], np.ndarray]


def chunk_bounds(count: int, n: int, i: int) -> tuple[int, int]:
    """Elements [start, stop) of chunk i when ``count`` elements are split over n ranks."""
    return count * i // n, count * (i + 1) // n


def _order(me: int, n: int):
    return ((me + k) % n for k in range(1, n))


class Counters:
    """Bytes moved by one rank, for stats(): pulled from peers, copied locally, written to output."""

    __slots__ = ("pulled", "local", "written")

    def __init__(self):
        self.pulled = self.local = self.written = 0


def all_gather(me: int, n: int, out: np.ndarray, x: np.ndarray, peer: PeerBytes, c: Counters) -> None:
    nb = x.nbytes
    o = out.view(np.uint8)
    if o[me * nb:(me + 1) * nb].ctypes.data != x.ctypes.data or nb == 0:
        o[me * nb:(me + 1) * nb] = x.view(np.uint8)
        c.local += nb
    for p in _order(me, n):
        o[p * nb:(p + 1) * nb] = peer(p, 0, nb)
        c.pulled += nb
    c.written += n * nb


def all_to_all(me: int, n: int, out: np.ndarray, x: np.ndarray, peer: PeerBytes, c: Counters) -> None:
    nb = x.nbytes // n
    o, xb = out.view(np.uint8), x.view(np.uint8)
    o[me * nb:(me + 1) * nb] = xb[me * nb:(me + 1) * nb]
    c.local += nb
    for p in _order(me, n):
        o[p * nb:(p + 1) * nb] = peer(p, me * nb, nb)
        c.pulled += nb
    c.written += n * nb


def all_to_all_v(me: int, n: int, out: np.ndarray, x: np.ndarray, send: np.ndarray, recv: np.ndarray,
                 peer: PeerBytes, c: Counters) -> None:
    """``send[i, j]``: elements member i sends to member j (packed in rank order in i's input)."""
    item = x.itemsize
    send_displ = np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(send, axis=1)], axis=1)
    recv_displ = np.concatenate([[0], np.cumsum(recv[me])])
    o, xb = out.view(np.uint8), x.view(np.uint8)
    for p in [me, *_order(me, n)]:
        cnt = int(recv[me, p]) * item
        if cnt == 0:
            continue
        dst = int(recv_displ[p]) * item
        src = int(send_displ[p, me]) * item
        if p == me:
            o[dst:dst + cnt] = xb[src:src + cnt]
            c.local += cnt
        else:
            o[dst:dst + cnt] = peer(p, src, cnt)
            c.pulled += cnt
        c.written += cnt


def broadcast(me: int, n: int, root: int, x: np.ndarray, peer: PeerBytes, c: Counters) -> None:
    if me == root or x.nbytes == 0:
        return
    x.view(np.uint8)[:] = peer(root, 0, x.nbytes)
    c.pulled += x.nbytes
    c.written += x.nbytes


def reduce_chunk(me: int, n: int, start: int, stop: int, dst: np.ndarray, local: np.ndarray, code: int,
                 peer: PeerBytes, scratch: np.ndarray, c: Counters) -> None:
    """dst[:] = reduction over members of their input elements [start, stop), in rank order.

    ``local`` is this rank's own input; ``dst`` may alias ``local[start:stop]`` (in-place
    all_reduce): every tile is accumulated in ``scratch`` before its single write to ``dst``.
    """
    dtype = local.dtype
    item = dtype.itemsize
    ufunc = _reduce.ufunc(code)
    tile = max(1, TILE_BYTES // item)
    for t0 in range(start, stop, tile):
        t1 = min(stop, t0 + tile)
        m = t1 - t0
        acc = scratch[:m * item].view(dtype)
        for p in range(n):
            if p == me:
                operand = local[t0:t1]
                c.local += m * item
            else:
                operand = peer(p, t0 * item, m * item).view(dtype)
                c.pulled += m * item
            if p == 0:
                np.copyto(acc, operand)
            else:
                ufunc(acc, operand, out=acc)
        _reduce.finish(code, acc, n)
        dst[t0 - start:t1 - start] = acc
        c.written += m * item


def reduce_scatter(me: int, n: int, out: np.ndarray, x: np.ndarray, code: int, peer: PeerBytes,
                   scratch: np.ndarray, c: Counters) -> None:
    per = out.size
    reduce_chunk(me, n, me * per, (me + 1) * per, out, x, code, peer, scratch, c)


def all_reduce_scatter_phase(me: int, n: int, x: np.ndarray, code: int, peer: PeerBytes,
                             scratch: np.ndarray, c: Counters) -> None:
    """Phase 1 of in-place all_reduce: reduce this rank's own chunk into place."""
    a, b = chunk_bounds(x.size, n, me)
    reduce_chunk(me, n, a, b, x[a:b], x, code, peer, scratch, c)


def all_reduce_gather_phase(me: int, n: int, x: np.ndarray, peer: PeerBytes, c: Counters) -> None:
    """Phase 2: pull every other rank's finished chunk."""
    xb, item = x.view(np.uint8), x.itemsize
    for p in _order(me, n):
        a, b = chunk_bounds(x.size, n, p)
        if b > a:
            xb[a * item:b * item] = peer(p, a * item, (b - a) * item)
            c.pulled += (b - a) * item
            c.written += (b - a) * item
