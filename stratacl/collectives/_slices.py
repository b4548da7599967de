"""Remote slices: what an operator frontend produces and the one backend executes.

A collective call on one rank is a list of phases (a barrier separates two phases); a phase is
a ``Slices``: arrays, one entry per remote-slice transfer ``<peer, src, dst, bytes, op, flag>``

    peer      the member whose memory the slice touches (== me for a local copy)
    src_buf   which buffer src is an offset into:  IN (the input), OUT, SCRATCH
    src       byte offset in src_buf, of the peer for LOAD / LOAD_ACC, of this rank for STORE
    dst_buf   which buffer dst is an offset into
    dst       byte offset in dst_buf, of this rank for LOAD / LOAD_ACC, of the peer for STORE
    nbytes    bytes of the slice
    op        LOAD (pull), STORE (push), LOAD_ACC (load, then accumulate on write into dst)
    flag      -1, or the flag id the slice raises when it completes (a dependency signal)

    frontend (per operator, below)  ->  [Slices, ...] per rank
        |                                   |
        |   partitioner (_partition.py) cuts slices into transfer units, assigns them to cores
        v                                   v
    data path: _backend.py compiles       modeled executor: ub/_cores.py, sdma/
        each phase once and executes it       exact per-core timelines of the same units
        on the cores or the SDMA engine

Reductions. All LOAD_ACC slices of a phase that write the same destination range form one
reduction group, reduced in the order the frontend lists them (mesh: rank order,
((x_0 op x_1) op x_2) ...; ring steps: the left neighbour's partial, then the own chunk), tile
by tile into the destination: the accumulate-on-write step. Cores working on different ranges
of the destination never touch the same bytes, so they take no lock.

Adding an operator means writing one frontend: a function returning the phases' slice maps.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ._kernels import BUF_IN, BUF_OUT, BUF_SCRATCH

LOAD, STORE, LOAD_ACC = 0, 1, 2
IN, OUT, SCRATCH = BUF_IN, BUF_OUT, BUF_SCRATCH    # rows of the member buffer table (_kernels.h)


@dataclasses.dataclass(frozen=True)
class Slices:
    """One phase of one rank: structure-of-arrays of remote-slice transfers."""
    me: int
    peer: np.ndarray
    src_buf: np.ndarray
    src: np.ndarray
    dst_buf: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    op: np.ndarray
    flag: np.ndarray

    def __len__(self) -> int:
        return int(self.peer.size)

    @property
    def total(self) -> int:
        return int(self.nbytes.sum())

    def per_peer(self, n: int) -> np.ndarray:
        """Bytes this rank moves to or from each member (index = member)."""
        return np.bincount(self.peer, weights=self.nbytes, minlength=n).astype(np.int64)


def make(me: int, peer, src_buf, src, dst_buf, dst, nbytes, op, flag=-1) -> Slices:
    """A slice map from array-likes (scalars broadcast); zero-byte slices are dropped."""
    peer = np.asarray(peer, dtype=np.int64).reshape(-1)
    shape = peer.shape
    arr = [np.broadcast_to(np.asarray(a, dtype=np.int64), shape).copy() for a in
           (src_buf, src, dst_buf, dst, nbytes, op, flag)]
    keep = arr[4] > 0
    return Slices(int(me), peer[keep], *(a[keep] for a in arr))


def concat(*maps: Slices) -> Slices:
    f = [fld.name for fld in dataclasses.fields(Slices) if fld.name != "me"]
    return Slices(maps[0].me, *(np.concatenate([getattr(m, k) for m in maps]) for k in f))


def _order(me: int, n: int) -> np.ndarray:
    # peers after me first (me+1, me+2, ...): concurrent readers spread over owners
    return (me + 1 + np.arange(n)) % n


def chunk_edges(count: int, n: int, itemsize: int) -> np.ndarray:
    """Byte offsets of chunk c = elements [count*c//n, count*(c+1)//n) (the data path's chunks)."""
    return (count * np.arange(n + 1, dtype=np.int64) // n) * itemsize


# --- frontends: one per operator --------------------------------------------------------------
def all_gather(me: int, n: int, nbytes: int) -> list[Slices]:
    """out[p*M:(p+1)*M] = x_p for every member p (M = ``nbytes``); own block copied locally."""
    p = _order(me, n)
    return [make(me, p, IN, 0, OUT, p * nbytes, nbytes, LOAD)]


def reduce_scatter(me: int, n: int, count: int, itemsize: int) -> list[Slices]:
    """out = reduction over p of chunk ``me`` of x_p (``count`` elements of input)."""
    e = chunk_edges(count, n, itemsize)
    return [make(me, np.arange(n), IN, e[me], OUT, 0, e[me + 1] - e[me], LOAD_ACC)]


def all_reduce(me: int, n: int, count: int, itemsize: int, small: int = 0) -> list[Slices]:
    """In place on IN. Large: phase 1 reduces chunk ``me`` of every x_p into place, phase 2
    pulls every other chunk from its owner. Small (<= ``small`` bytes or fewer elements than
    members): phase 1 reduces the whole buffer into SCRATCH, phase 2 copies it back locally.
    The runtime's small calls take its eager frontends instead, so it passes ``small=0``."""
    nb = count * itemsize
    if nb <= small or count < n:
        return [make(me, np.arange(n), IN, 0, SCRATCH, 0, nb, LOAD_ACC),
                make(me, me, SCRATCH, 0, IN, 0, nb, LOAD)]
    e = chunk_edges(count, n, itemsize)
    p = _order(me, n)
    p = p[p != me]
    return [make(me, np.arange(n), IN, e[me], IN, e[me], e[me + 1] - e[me], LOAD_ACC),
            make(me, p, IN, e[p], IN, e[p], e[p + 1] - e[p], LOAD)]


def all_reduce_eager(me: int, n: int, nbytes: int) -> list[Slices]:
    """Small all_reduce from eager copies (IN: every member's private copy of its input, taken
    before the arrival barrier): every member reduces the whole buffer into its OUT."""
    return [make(me, np.arange(n), IN, 0, OUT, 0, nbytes, LOAD_ACC)]


def all_reduce_eager_chunks(me: int, n: int, count: int, itemsize: int) -> list[Slices]:
    """Small all_reduce from eager copies, each member reducing one chunk (IN: every member's
    eager slot, its input copy in the first ``nb`` bytes, room for its reduced chunk in the
    next ``nb``): phase 1 reduces chunk ``me`` of every copy into the own slot's second half,
    phase 2 gathers every reduced chunk into OUT. Each member reads 2 x nb bytes instead of
    n x nb, for one more barrier; chunks are reduced in rank order, as in all_reduce_eager."""
    nb = count * itemsize
    e = chunk_edges(count, n, itemsize)
    p = _order(me, n)
    return [make(me, np.arange(n), IN, e[me], IN, nb + e[me], e[me + 1] - e[me], LOAD_ACC),
            make(me, p, IN, nb + e[p], OUT, e[p], e[p + 1] - e[p], LOAD)]


def all_to_all(me: int, n: int, nbytes: int) -> list[Slices]:
    """Equal splits of an ``nbytes`` input: out block p = block ``me`` of x_p."""
    b = nbytes // n
    p = _order(me, n)
    return [make(me, p, IN, me * b, OUT, p * b, b, LOAD)]


def all_to_all_v(me: int, n: int, send: np.ndarray, recv: np.ndarray, itemsize: int) -> list[Slices]:
    """``send[i, j]``: elements member i sends to j, packed in rank order in i's input; member
    ``me`` receives ``recv[me, p]`` elements from p, packed in rank order in its output."""
    send, recv = np.asarray(send, dtype=np.int64), np.asarray(recv, dtype=np.int64)
    p = _order(me, n)
    send_displ = np.cumsum(send, axis=1) - send
    recv_displ = np.cumsum(recv[me]) - recv[me]
    return [make(me, p, IN, send_displ[p, me] * itemsize, OUT, recv_displ[p] * itemsize,
                 recv[me, p] * itemsize, LOAD)]


def broadcast(me: int, n: int, nbytes: int, root: int = 0) -> list[Slices]:
    """Every member other than ``root`` pulls the root's buffer into its own (in place)."""
    if me == root:
        return [make(me, [], IN, 0, IN, 0, 0, LOAD)]
    return [make(me, root, IN, 0, IN, 0, nbytes, LOAD)]


def gather(me: int, n: int, nbytes: int, root: int) -> list[Slices]:
    """At ``root``: out[p*M:(p+1)*M] = x_p for every member p (M = ``nbytes``; its own block
    copied locally). The other members pull nothing."""
    p = _order(me, n) if me == root else np.zeros(0, dtype=np.int64)
    return [make(me, p, IN, 0, OUT, p * nbytes, nbytes, LOAD)]


def reduce(me: int, n: int, nbytes: int, root: int) -> list[Slices]:
    """At ``root``: out = the reduction of every member's x, in rank order (as all_reduce's).
    The other members pull nothing."""
    p = np.arange(n) if me == root else np.zeros(0, dtype=np.int64)
    return [make(me, p, IN, 0, OUT, 0, nbytes, LOAD_ACC)]


def scatter(me: int, n: int, nbytes: int, root: int) -> list[Slices]:
    """out = block ``me`` of the root's x (M = ``nbytes`` per member)."""
    return [make(me, root, IN, me * nbytes, OUT, 0, nbytes, LOAD)]


def recv(me: int, src: int, nbytes: int) -> list[Slices]:
    """Point-to-point receive: pull ``nbytes`` of member ``src``'s send buffer (IN) into this
    rank's receive buffer (OUT)."""
    return [make(me, src, IN, 0, OUT, 0, nbytes, LOAD)]


def ring_all_gather_step(me: int, n: int, nbytes: int, s: int) -> list[Slices]:
    """Ring all_gather step s: pull chunk (me - s - 1) mod n from member me-1 (step 0: its
    input; later: its output) and raise step flag s. Step 0 also copies the own block."""
    c = (me - s - 1) % n
    left = (me - 1) % n
    pull = make(me, left, IN if s == 0 else OUT, 0 if s == 0 else c * nbytes, OUT, c * nbytes, nbytes, LOAD, s)
    if s == 0:
        return [concat(pull, make(me, me, IN, 0, OUT, me * nbytes, nbytes, LOAD))]
    return [pull]


def _ring_reduce_step(me: int, n: int, e: np.ndarray, s: int, final_buf: int, final_off: int) -> Slices:
    c = (me - s - 2) % n
    left = (me - 1) % n
    dst_buf, dst = (final_buf, final_off) if s == n - 2 else (SCRATCH, e[c])
    a = make(me, left, IN if s == 0 else SCRATCH, e[c], dst_buf, dst, e[c + 1] - e[c], LOAD_ACC, s)
    b = make(me, me, IN, e[c], dst_buf, dst, e[c + 1] - e[c], LOAD_ACC, s)
    return concat(a, b)


def ring_reduce_scatter_step(me: int, n: int, count: int, itemsize: int, s: int) -> list[Slices]:
    """Ring reduce_scatter step s: accumulate chunk (me - s - 2) mod n of member me-1 (step 0:
    its input; later: its partial in SCRATCH) with this rank's own input chunk, into SCRATCH
    (the last step: into OUT). Chunk c is thus folded over members c+1, c+2, ..., c."""
    return [_ring_reduce_step(me, n, chunk_edges(count, n, itemsize), s, OUT, 0)]


def ring_all_reduce_step(me: int, n: int, count: int, itemsize: int, s: int) -> list[Slices]:
    """Ring all_reduce step s of 2(n-1), in place on IN: steps 0..n-2 are the reduce_scatter
    steps (the last one writes chunk ``me`` of IN); steps n-1.. are the all_gather steps on the
    finished chunks, pulling chunk (me - t - 1) mod n from member me-1's IN (t = s - n + 1)."""
    e = chunk_edges(count, n, itemsize)
    if s < n - 1:
        return [_ring_reduce_step(me, n, e, s, IN, e[me])]
    c = (me - (s - n + 1) - 1) % n
    return [make(me, (me - 1) % n, IN, e[c], IN, e[c], e[c + 1] - e[c], LOAD, s)]

