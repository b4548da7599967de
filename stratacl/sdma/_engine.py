"""A rank's SDMA engine, for real: per-core descriptor queues, a doorbell, an engine thread.

    the calling thread stands for the rank's communication cores (``--path sdma``):
        a phase's copy slices --partitioner (units -> each core's ordered task list)-->
        every core appends to its own queue, in task order:
            descriptors (dst, src, nbytes), at most ``max_bytes`` each
            then one notify record: cross-kernel completion, the operation waits on a
            countdown event that the last core's record sets (the AI CPU waiting for an SDMA
            notify)
        doorbell: one notify of the engine's condition variable; the cores are then free
    engine thread: takes the queues' records in order, round-robin over the queues; a run of
        descriptors is one ``copy_many`` call (which releases the GIL for large copies)

Only copies run on the engine: reductions load-accumulate on the cores (MTE), as on the NPU.
The modeled timelines of the same descriptors are ``sdma._offload.run_sdma``, which also models
in-kernel completion (a tail flag that a core polls); the runtime only ever waits on a notify,
so that is all the engine runs.
"""
from __future__ import annotations

import collections
import threading

import numpy as np

from ..collectives import copy_many


class Notify:
    """Countdown over the completion records of one submission."""

    __slots__ = ("_left", "_lock", "event")

    def __init__(self, records: int):
        self._left = records
        self._lock = threading.Lock()
        self.event = threading.Event()
        if records == 0:
            self.event.set()

    def _one(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left == 0:
                self.event.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.event.wait(timeout)


class SdmaEngine:
    """``queues`` descriptor queues (one per communication core) and the engine thread."""

    def __init__(self, queues: int, max_bytes: int, *, name: str = "stratacl-sdma"):
        if queues < 1 or max_bytes < 1:
            raise ValueError(f"SdmaEngine: need queues >= 1 and max_bytes >= 1, got {queues}, {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._queues = [collections.deque() for _ in range(queues)]
        self._bell = threading.Condition()
        self._rung = False
        self._stopping = False
        self.error: BaseException | None = None
        self.counters = dict(descriptors=0, bytes=0, notifies=0, doorbells=0)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def queues(self) -> int:
        return len(self._queues)

    # --- what cores do ------------------------------------------------------------------------
    def post(self, core: int, dst: np.ndarray, src: np.ndarray, nbytes: np.ndarray) -> int:
        """Append copies to core ``core``'s queue, cut into descriptors of at most ``max_bytes``.
        Returns the number of descriptors."""
        dst, src, nbytes = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (dst, src, nbytes))
        keep = nbytes > 0
        dst, src, nbytes = dst[keep], src[keep], nbytes[keep]
        if nbytes.size == 0:
            return 0
        k = -(-nbytes // self.max_bytes)
        row = np.repeat(np.arange(nbytes.size), k)
        off = (np.arange(row.size) - np.repeat(np.cumsum(k) - k, k)) * self.max_bytes
        table = np.empty((row.size, 3), dtype=np.int64)
        table[:, 0] = dst[row] + off
        table[:, 1] = src[row] + off
        table[:, 2] = np.minimum(self.max_bytes, nbytes[row] - off)
        self._queues[core].append(("copy", table))
        return row.size

    def post_notify(self, cores) -> Notify:
        """A notify record at the end of each listed core's queue; the Notify fires when all ran."""
        cores = list(cores)
        note = Notify(len(cores))
        for c in cores:
            self._queues[c].append(("notify", note))
        return note

    def doorbell(self) -> None:
        with self._bell:
            self._rung = True
            self.counters["doorbells"] += 1
            self._bell.notify()

    # --- what the engine does -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._bell:
                while not self._rung and not self._stopping:
                    self._bell.wait()
                if self._stopping and not any(self._queues):
                    return
                self._rung = False
            progressed = True
            while progressed:
                progressed = False
                for q in self._queues:
                    if not q:
                        continue
                    progressed = True
                    record = q.popleft()
                    try:
                        self._execute(record)
                    except BaseException as e:        # reported by whoever waits on the engine
                        self.error = e
                        if record[0] == "notify":
                            record[1]._one()

    def _execute(self, record) -> None:
        kind = record[0]
        c = self.counters
        if kind == "copy":
            table = record[1]
            copy_many(table)
            c["descriptors"] += table.shape[0]
            c["bytes"] += int(table[:, 2].sum())
        else:
            c["notifies"] += 1
            record[1]._one()

    def stop(self, timeout: float | None = None) -> None:
        """Let the queued records run, then end the engine thread."""
        with self._bell:
            self._stopping = True
            self._bell.notify()
        self._thread.join(timeout)
