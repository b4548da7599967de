"""The backend every operator runs on: compiled phases of remote slices.

    frontend (collectives._slices)      [Slices, ...]  one per phase, in this rank's terms
        |  compile()                    once per call shape (Plans caches them per communicator)
        v
    Plan                                the phase as a native table (rank, buffer, offset) +
        |                               its byte counts; no addresses yet
        |  + bases (3, n)               every member's buffers of this call: IN, OUT, SCRATCH
        v
    MTE: _kernels.run_plan(table, bases, ...)   the cores move the bytes: one native call per phase
                                        (or inside the mesh machine or a point-to-point call,
                                        runtime/_native.c, through the same executor)
    SDMA (runtime/pipeline/_execute.py)          the copies go to the SDMA engine, reductions stay on
                                        the cores (run_plan on the plan's reduction table)

Table rows are ``(kind, src_rank, src_buf, src_off, dst_rank, dst_buf, dst_off, nbytes)``:
COPY rows are one LOAD or STORE slice each (COPY_SHARED when every member of the phase reads
the same sources: broadcast, the mesh all_gather); a reduction group (every LOAD_ACC slice of
a phase writing the same destination range) is a GROUP row naming the destination and the number of
sources, followed by one SRC row per source, in the order the frontend listed them: that is
the reduction order (mesh frontends list members in rank order; ring steps: left, then own).
The native executor validates a table before it touches memory.

The modeled side (ub/_cores.py, sdma/_offload.py) times the same slice maps' transfer units
per core; the host executes a phase on the calling thread in table order.
"""
from __future__ import annotations

import array
import dataclasses
from typing import Callable, Sequence

import numpy as np

from . import _kernels
from ._slices import LOAD, LOAD_ACC, SCRATCH, STORE, Slices

# a compiled plan's row kinds and width, and the byte counters' words: _kernels.h defines them
COPY, GROUP, SRC, COPY_SHARED = _kernels.K_COPY, _kernels.K_GROUP, _kernels.K_SRC, _kernels.K_COPY_SHARED
PLAN_COLUMNS = _kernels.PLAN_COLUMNS
CACHE_LIMIT = 256


@dataclasses.dataclass(frozen=True)
class Plan:
    """One phase of one rank, compiled."""
    smap: Slices
    table: np.ndarray          # every row, for the cores
    reductions: np.ndarray     # the GROUP/SRC rows alone (the SDMA path's share of the cores)
    copies: Slices           # the copy slices alone (the SDMA path's share of the engine)
    local: int                 # bytes read from this rank's own buffers
    remote: int                # bytes read from (or written to) peers
    written: int               # bytes written to IN or OUT (not to SCRATCH)
    has_copies: bool


def _subset(smap: Slices, keep: np.ndarray) -> Slices:
    f = [fld.name for fld in dataclasses.fields(Slices) if fld.name != "me"]
    return Slices(smap.me, *(getattr(smap, k)[keep] for k in f))


def compile(smap: Slices, itemsize: int = 1, shared: bool = False) -> Plan:
    """The native table of one phase. Reduction groups must cover whole ``itemsize`` elements.
    ``shared``: every member reads the same sources (broadcast, all_gather), so their copies
    are COPY_SHARED rows, for which the kernels keep the sources in cache (_kernels.c)."""
    if not shared and (smap.op == LOAD).all():
        return _compile_loads(smap)
    return _compile_any(smap, itemsize, shared)


def _compile_any(smap: Slices, itemsize: int, shared: bool) -> Plan:
    me = smap.me
    store = smap.op == STORE
    src_rank = np.where(store, me, smap.peer)
    dst_rank = np.where(store, smap.peer, me)
    copy = smap.op != LOAD_ACC
    kind = COPY_SHARED if shared else COPY
    rows = [np.stack([np.full(int(copy.sum()), kind), src_rank[copy], smap.src_buf[copy], smap.src[copy],
                      dst_rank[copy], smap.dst_buf[copy], smap.dst[copy], smap.nbytes[copy]], axis=1)]
    groups: dict[tuple[int, int, int], list[int]] = {}
    for i in np.nonzero(~copy)[0].tolist():
        groups.setdefault((int(smap.dst_buf[i]), int(smap.dst[i]), int(smap.nbytes[i])), []).append(i)
    red = []
    written = int(smap.nbytes[copy & (smap.dst_buf != SCRATCH)].sum())
    for (dbuf, dst, nb), members in groups.items():
        if nb % itemsize:
            raise ValueError(f"backend: a reduction slice of {nb} bytes is not whole {itemsize}-byte elements")
        red.append([GROUP, len(members), 0, 0, me, dbuf, dst, nb])
        red.extend([SRC, int(smap.peer[i]), int(smap.src_buf[i]), int(smap.src[i]), me, dbuf, dst, nb]
                   for i in members)
        written += nb if dbuf != SCRATCH else 0
    reductions = np.array(red, dtype=np.int64).reshape(-1, PLAN_COLUMNS)
    own = smap.peer == me
    return Plan(smap, np.ascontiguousarray(np.concatenate(rows + [reductions]), dtype=np.int64), reductions,
                _subset(smap, copy), int(smap.nbytes[own].sum()), int(smap.nbytes[~own].sum()), written,
                bool(copy.any()))


def _compile_loads(smap: Slices) -> Plan:
    """compile() of a phase of plain LOAD slices (no reduction, none shared): the same table,
    built column by column."""
    table = np.empty((len(smap.peer), PLAN_COLUMNS), dtype=np.int64)
    table[:, 0] = COPY
    table[:, 1], table[:, 2], table[:, 3] = smap.peer, smap.src_buf, smap.src
    table[:, 4], table[:, 5], table[:, 6], table[:, 7] = smap.me, smap.dst_buf, smap.dst, smap.nbytes
    own = smap.peer == smap.me
    total = int(smap.nbytes.sum())
    local = int(smap.nbytes[own].sum())
    written = total - int(smap.nbytes[smap.dst_buf == SCRATCH].sum())
    return Plan(smap, table, np.empty((0, PLAN_COLUMNS), dtype=np.int64), smap, local, total - local, written,
                bool(table.size))


def addresses(smap: Slices, bases: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Absolute (src, dst) address of every slice; ``bases[buf, rank]`` as run_plan reads them."""
    me = smap.me
    store = smap.op == STORE
    src_rank = np.where(store, me, smap.peer)
    dst_rank = np.where(store, smap.peer, me)
    return bases[smap.src_buf, src_rank] + smap.src, bases[smap.dst_buf, dst_rank] + smap.dst


def int64_word(buffer: str, index: int, doc: str, writable: bool = True) -> property:
    """A property over word ``index`` of the ``array('q')`` attribute ``buffer``: a count that
    native code updates in place, read (and, if ``writable``, written) by Python like an
    attribute."""
    def get(self) -> int:
        return getattr(self, buffer)[index]

    def put(self, value: int) -> None:
        getattr(self, buffer)[index] = value
    return property(get, put if writable else None, doc=doc)


class Counters:
    """Bytes moved by one rank, for stats(): copied locally, pulled from peers, written to
    output. Kept in three int64 words, ``words``, which the native replays add to in place
    (collectives/_kernels.h, CTR_*)."""

    __slots__ = ("words",)

    def __init__(self):
        self.words = array.array("q", bytes(8 * _kernels.COUNTERS))

    local = int64_word("words", _kernels.CTR_LOCAL, "Bytes copied from this rank's own buffers.")
    pulled = int64_word("words", _kernels.CTR_PULLED, "Bytes read from peers' buffers.")
    written = int64_word("words", _kernels.CTR_WRITTEN, "Bytes written to outputs.")


class Plans:
    """A communicator's compiled phases, by call shape (``key``); bounded, cleared when full."""

    def __init__(self, limit: int = CACHE_LIMIT):
        self._cache: dict = {}
        self._limit = limit

    def get(self, key: tuple, build: Callable[[], Sequence[Slices]], itemsize: int = 1,
            shared: bool = False) -> tuple[Plan, ...]:
        got = self._cache.get(key)
        if got is None:
            if len(self._cache) >= self._limit:
                self._cache.clear()
            got = self._cache[key] = tuple(compile(m, itemsize, shared) for m in build())
        return got


def execute(smap: Slices, bases: np.ndarray, dtype=None, redop: str = "sum", divisor: float | None = None,
            shared: bool = False) -> int:
    """Compile and run one phase on the cores (tests, experiments; communicators cache their
    plans). ``bases[buf, rank]``: the (3, n) int64 base addresses of every member's IN, OUT and
    SCRATCH; avg divides by ``divisor`` (default: each group's size); ``shared`` as compile's.
    Returns the bytes moved.
    The caller guarantees every address is mapped and the sources are ready."""
    from ._reduce import dtype_code, reduce_code
    dt = np.dtype(dtype) if dtype is not None else None
    plan = compile(smap, dt.itemsize if dt is not None else 1, shared)
    if plan.reductions.size and dt is None:
        raise ValueError("execute: load-accumulate slices need a dtype")
    tcode = dtype_code(dt, "execute") if dt is not None else 0
    ocode = reduce_code(redop, dt, "execute") if dt is not None else 0
    kind, sources = _kernels.COL_KIND, _kernels.COL_SRC_RANK       # a GROUP row: its sources' count
    groups = plan.reductions[plan.reductions[:, kind] == GROUP]
    if divisor is None and groups.size and (groups[:, sources] != groups[0, sources]).any():
        raise ValueError("execute: reduction groups of different sizes need an explicit divisor")
    div = float(divisor if divisor is not None else (groups[0, sources] if groups.size else 1))
    skipped = _kernels.run_plan(plan.table, np.ascontiguousarray(bases, dtype=np.int64), tcode, ocode, div)
    return plan.local + plan.remote - skipped
