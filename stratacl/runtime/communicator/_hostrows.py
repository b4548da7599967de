"""Rows between a rank's host memory (CPU DRAM) and its HBM: an embedding cache's misses.

On CloudMatrix384 the CPUs sit on the UB plane beside the NPUs, so a die reads and writes its
host's DRAM over UB like a peer's HBM, on the same cores (MTE) or SDMA engine. Here host
memory is any array outside HBM (the rank process's own memory) and one call moves whole rows:

    host_rows(cache, host, fetch_rows, fetch_slots, store_slots, store_rows)
        |  arguments checked on this rank (not collective: no peer takes part)
        v
    write-back   host[store_rows[k]]  <- cache[store_slots[k]]       (evicted dirty rows)
    fetch        cache[fetch_slots[k]] <- host[fetch_rows[k]]        (misses)
        one slice per row, executed like every other phase (runtime/pipeline/_execute.py): on the
        cores (mte) or as descriptors on the rank's SDMA engine (sdma). --registration staged:
        the rows pass through a communication buffer in HBM (cache -> buffer -> host, host ->
        buffer -> cache), as a buffer-centric library copies them; roa, jit, pool: zero copy
        |
        v
    modeled clock: ub._clock.FabricModel.plan_exchange of one member and two phases, a
        HOST_STORE then a HOST_LOAD of the bytes each moves (staged: plus the copies into and
        out of the buffer), timed on the topology's ``host`` tier through this rank's cores
        or SDMA engine like any phase; recorded in the trace as a call of a one-member
        communicator of its own (``key``), so ub.replay times it again

Approximation, stated: the rows of one call are timed as one transfer per direction (the
access latency paid once, as a gather kernel keeping many requests in flight would; on the
SDMA path, descriptors of up to ``sdma.max_descriptor_bytes`` as if the engine took a
scatter-gather list) while the bytes really move row by row. jit registration of the host
region is not modeled (it is registered once, like a pool).
"""
from __future__ import annotations

import numpy as np

from ..._errors import ConfigError
from ...collectives import IN, OUT, SCRATCH, schedules, slices
from ...sdma import PATHS, paths_of
from .. import _native
from ..memory import hbm_base
from ..pipeline import Executor, Modeling, Pipeline, RankServices, Work, Worker, buffer_size

OP = "host_rows"


class HostRows:
    """A rank's channel to its host memory: its own executor (buffer table IN = host, OUT =
    cache, SCRATCH = the staged path's buffer), its modeled timeline and the staging buffer."""

    def __init__(self, rt: RankServices):
        self._rt = rt
        self._exec = Executor(rt, [rt.rank], 0, None)
        self._modeling = Modeling(rt, [rt.rank], 0)
        # a communicator key no real communicator has (theirs are slot offsets, >= 0)
        self._modeling.key = -1 - rt.rank
        self._staging = None
        self._worker: Worker | None = None
        self._default_path, self._overlap_path = paths_of(rt.config.path)
        self._path = self._default_path
        self._pipe = Pipeline(self, rt, self._exec, self._modeling)     # no peers: no agreement stages

    def _start_worker(self) -> Worker:
        """The thread that runs this rank's host transfers once one is asynchronous (in call
        order, as a communicator's worker runs its operations)."""
        self._worker = Worker(f"stratacl-host-{self._rt.rank}")
        self._rt.workers.append(self._worker)
        return self._worker

    def move(self, cache: np.ndarray, host: np.ndarray, fetch_rows, fetch_slots, store_slots, store_rows,
             path: str | None, async_op: bool) -> Work | None:
        """Check the arguments here, on the caller's thread, then move the rows: at once, or
        (``async_op``, or once a transfer was asynchronous) on the worker, returning its Work."""
        rt = self._rt
        if path is not None and path not in PATHS:
            raise ValueError(f"{OP}: path must be one of {', '.join(PATHS)}, got {path!r}")
        width = self._check_tables(cache, host)
        fr, fs = _indices(fetch_rows, "fetch_rows", host.shape[0]), _indices(fetch_slots, "fetch_slots", cache.shape[0])
        ss, sr = _indices(store_slots, "store_slots", cache.shape[0]), _indices(store_rows, "store_rows", host.shape[0])
        if fr.size != fs.size or ss.size != sr.size:
            raise ValueError(f"{OP}: rank {rt.rank}: fetch_rows and fetch_slots ({fr.size}, {fs.size}) and "
                             f"store_slots and store_rows ({ss.size}, {sr.size}) must pair up one to one")
        for name, a in (("fetch_slots", fs), ("store_rows", sr)):
            if np.unique(a).size != a.size:
                raise ValueError(f"{OP}: rank {rt.rank}: {name} names a row twice; each destination once")
        if rt.topology.host is None and rt.clock is not None:
            raise ConfigError(f"{OP}: topology {rt.topology.name} has no 'host' tier to time host memory "
                              "transfers on; name one (ub/_topology.py) or run with --clock off")
        checked = (cache, host, fr, fs, ss, sr, width)
        return self._pipe.call(OP, lambda: self.host_rows(*checked), async_op, path)

    def host_rows(self, cache: np.ndarray, host: np.ndarray, fr: np.ndarray, fs: np.ndarray, ss: np.ndarray,
                  sr: np.ndarray, width: int) -> None:
        """The checked rows' moves on ``self._path`` (set for this call) and their modeled time."""
        rt, pipe = self._rt, self._pipe
        staged = rt.config.registration == "staged"
        pipe.set_bases(IN, 0, _native.data_address(host))
        pipe.set_bases(OUT, 0, _native.data_address(cache))
        if staged and max(fr.size, sr.size):
            pipe.set_bases(SCRATCH, 0, _native.data_address(self._buffer(max(fr.size, sr.size) * width)))
        nstore, nfetch = sr.size * width, fr.size * width
        # write-backs first: a slot evicted by this call may be refilled by it
        if ss.size:
            self._rows(OUT, ss * width, IN, sr * width, width, staged)
        if fr.size:
            self._rows(IN, fr * width, OUT, fs * width, width, staged)
        if pipe.timed:
            phases = [(np.array([[nstore]], dtype=np.int64), schedules.HOST_STORE),
                      (np.array([[nfetch]], dtype=np.int64), schedules.HOST_LOAD)]
            staging = (np.array([nstore], dtype=np.int64), np.array([nfetch], dtype=np.int64))
            pipe.tick_host(OP, phases, staging)

    def _check_tables(self, cache: np.ndarray, host: np.ndarray) -> int:
        """Bytes per row, once the cache is a C-contiguous array in this rank's HBM and the host
        table one outside it, of the same dtype and row shape."""
        rt = self._rt
        for what, a in (("cache", cache), ("host table", host)):
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{OP}: the {what} must be a numpy array, got {type(a).__name__}")
            if a.ndim < 1 or not a.flags.c_contiguous:
                raise ValueError(f"{OP}: the {what} must be a C-contiguous array of rows, got shape {a.shape}")
            if not a.flags.writeable:
                raise ValueError(f"{OP}: the {what} array is read-only")
        if cache.dtype != host.dtype or cache.shape[1:] != host.shape[1:]:
            raise ValueError(f"{OP}: cache rows {cache.dtype}{list(cache.shape[1:])} and host rows "
                             f"{host.dtype}{list(host.shape[1:])} differ; they must be the same dtype and shape")
        if cache.size and not _in_hbm(rt, cache):
            raise ValueError(f"{OP}: rank {rt.rank}: the cache is not in this rank's HBM; allocate it with "
                             "stratacl.empty (or stratacl.torch.empty)")
        if host.size and _in_hbm(rt, host):
            raise ValueError(f"{OP}: rank {rt.rank}: the host table is in HBM; host memory is any array "
                             "outside it (e.g. numpy.empty)")
        return cache.itemsize * int(np.prod(cache.shape[1:], dtype=np.int64))

    def _buffer(self, nbytes: int) -> np.ndarray:
        """The staged path's communication buffer, grown to the largest size used and kept."""
        if self._staging is None or self._staging.nbytes < nbytes:
            self._staging = self._rt.empty((buffer_size(nbytes),), np.uint8)
        return self._staging

    def _rows(self, src: int, src_off: np.ndarray, dst: int, dst_off: np.ndarray, width: int, staged: bool) -> None:
        """Rows src -> dst, through the communication buffer (SCRATCH) when staged."""
        if staged:
            through = np.arange(src_off.size) * width
            self._run(src, src_off, SCRATCH, through, width)
            self._run(SCRATCH, through, dst, dst_off, width)
        else:
            self._run(src, src_off, dst, dst_off, width)

    def _run(self, src_buf: int, src: np.ndarray, dst_buf: int, dst: np.ndarray, width: int) -> None:
        smap = slices.make(0, np.zeros(src.size, dtype=np.int64), src_buf, src, dst_buf, dst, width, slices.LOAD)
        self._pipe.execute(OP, self._pipe.compile(smap))


def _in_hbm(rt, a: np.ndarray) -> bool:
    return hbm_base(a) is not None or rt.own_segment(_native.data_address(a), a.nbytes) is not None


def _indices(value, name: str, limit: int) -> np.ndarray:
    """Row indices as int64, each in [0, limit)."""
    a = np.asarray(() if value is None else value)
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{OP}: {name} must be a 1-D array of integers, got {a.dtype} of shape {a.shape}")
    a = a.astype(np.int64, copy=False)
    bad = (a < 0) | (a >= limit)
    if bad.any():
        raise IndexError(f"{OP}: {name}[{int(np.argmax(bad))}] = {int(a[bad][0])} is outside 0..{limit - 1}")
    return a
