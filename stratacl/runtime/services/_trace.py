"""A rank's calls in modeled time, recorded for ``stratacl.ub.replay`` to time again without ranks.

With ``--trace DIR`` (and a modeled clock) every rank keeps, in program order, what its
modeled clock was made of, and writes it to ``DIR/rank<r>.json`` at ``finalize()``:

    event                                       recorded by (runtime/)
    {"e": "call", ...a call's model inputs}     pipeline/_modeling.py tick / tick_exchange: a blocking
                                                call run on the program's thread
    {"e": "issue", "id", "async", "calls"}      pipeline/_work.py: an operation run later on a worker
                                                (async_op=True, queued behind one, or a front
                                                end's stand-in); its calls join "calls" when
                                                they run, on whichever thread
    {"e": "compute", "us", "cores"[, "hbm"]     pipeline/_modeling.py charge_compute ("hbm": the kernel's
        [, "flops"]}                            HBM bytes, when it counted them; "flops": a
                                                kernel charged by charge_kernel, whose "us" is
                                                Topology.kernel_us(flops, hbm))
    {"e": "wait", "id"}                         pipeline/_modeling.py join_work: the program joins an issue
                                                (a blocking issue of one call joined at once is
                                                recorded as that "call": inline or queued behind
                                                another operation, one shape)
    {"e": "p2p", "op"}                          pipeline/_modeling.py ended: a send/recv (not replayable yet)
    {"e": "clock"}                              pipeline/_modeling.py now: the program read its clock
                                                (``comm.clock()``); the replay gives the value it
                                                read there (``Replay.clocks``)

A call's model inputs are what ``ub._clock.FabricModel`` needs to time it again: the
communicator (``comm``: the offset of its barrier counter, the same on every member; its
``members``' world ranks; ``k``: the call's number on it at this rank), and either
``op, algo, nbytes, root, itemsize`` (``FabricModel.plan``) or the traffic ``phases`` and
``staging`` (``plan_exchange``), the data ``path``, and ``extra``: the jit mappings each
member paid in it. ``gap_s``: wall seconds from the physical allocation of this rank's input
(the HBM under it: its segment, or its latest chunk) to the call, the paper's
allocation-to-communication gap (None: an input outside HBM). Entering times are not recorded: the replay derives them, as the ranks
did, from program order and the other members' calls.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any

import numpy as np


class Trace:
    """One rank's recorded events (see the module docstring); written by ``write``."""

    def __init__(self, rank: int, world: int, settings: dict[str, Any]):
        self.rank, self.world, self.settings = rank, world, settings
        self.events: list[dict] = []
        self._ids = 0
        self._lock = threading.Lock()

    def issue(self, work, async_op: bool) -> None:
        """An operation whose calls run later (``work``: its runtime Work), issued now."""
        with self._lock:
            self._ids += 1
            event = {"e": "issue", "id": self._ids, "async": bool(async_op), "calls": []}
        work._traced = event
        self.events.append(event)

    def call(self, work, record: dict) -> None:
        """A call's model inputs: into ``work``'s issue, or (``work`` None) as a blocking call."""
        event = getattr(work, "_traced", None) if work is not None else None
        if event is not None:
            event["calls"].append(record)
        else:
            self.events.append({"e": "call", **record})

    def compute(self, duration_us: float, cores: int, hbm_bytes: float = 0.0, flops: float | None = None) -> None:
        ev = {"e": "compute", "us": float(duration_us), "cores": int(cores)}
        if hbm_bytes:
            ev["hbm"] = float(hbm_bytes)
        if flops is not None:
            ev["flops"] = float(flops)
        self.events.append(ev)

    def wait(self, work) -> None:
        event = getattr(work, "_traced", None)
        if event is None:
            return
        with self._lock:
            if (not event["async"] and len(event["calls"]) == 1 and self.events and self.events[-1] is event
                    and event["id"] == self._ids):
                # a blocking operation queued behind an unfinished one (stratacl.torch queues it
                # when its group's worker is busy, runs it inline when idle: host timing) and
                # waited for at once is the plain call it is inline; the replay times both
                # alike, and one shape lets recordings of the same program be extrapolated
                self.events[-1] = {"e": "call", **event["calls"][0]}
                self._ids -= 1
                return
        self.events.append({"e": "wait", "id": event["id"]})

    def p2p(self, op: str) -> None:
        self.events.append({"e": "p2p", "op": op})

    def clock(self) -> None:
        self.events.append({"e": "clock"})

    def write(self, directory: str, end_us: float) -> str:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"rank{self.rank}.json")
        data = {"format": "stratacl-trace-1", "rank": self.rank, "world": self.world, "settings": self.settings,
                "end_us": end_us, "events": self.events}
        with open(path, "w") as f:
            json.dump(data, f, default=_plain)
        return path


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"trace: cannot write {type(value).__name__}")
