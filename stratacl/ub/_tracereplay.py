"""Replay of recorded traces through the fabric model: a job's modeled time without ranks.

    traces (``--trace DIR``: runtime/services/_trace.py, one per rank, program order)
        |   every rank walks its events; a call is timed once every member has reached it
        v
    the timing the ranks did under ``--clock virtual``: ``FabricModel.plan`` or ``plan_exchange``
    run on every member's entering clock (+ the jit mappings recorded), a call entering when
    the program issued it or when its communicator's previous call ended; ``charge_compute``
    sharing the rank's cores with its asynchronous operations in flight (ub/_compute.py)
        v
    Replay: every rank's final clock, what it read at each ``comm.clock()``, and the calls timed

Replaying a job's traces at the rank count they were recorded at gives the modeled times the
ranks had (the same functions on the same inputs). ``extrapolate`` (ub/_extrapolate.py) makes
the traces of a larger job from recordings of an SPMD program at smaller rank counts, for the
paper's scales.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os

import numpy as np

from .._errors import ReplayError
from ._clock import FabricModel, advance
from ._compute import ComputeJob, kernel_end
from ._topology import load as load_topology

FORMAT = "stratacl-trace-1"


@dataclasses.dataclass
class Replay:
    """``end_us``: every rank's modeled clock after its last event; ``recorded_us``: what the
    ranks' own clocks said when the traces were written (None for extrapolated traces);
    ``calls``: collective calls timed; ``clocks``: per rank, in microseconds, what each of its
    ``comm.clock()`` reads would have returned, in program order (a program that times
    itself, such as a serving loop's iterations, gets its times back at any scale)."""
    end_us: np.ndarray
    recorded_us: np.ndarray | None
    calls: int
    clocks: list[np.ndarray] = dataclasses.field(default_factory=list)

    @property
    def time_us(self) -> float:
        """The job's modeled time: the last rank's final clock."""
        return float(self.end_us.max())


def load(directory: str) -> list[dict]:
    """The traces ``--trace DIRECTORY`` wrote, by rank."""
    paths = glob.glob(os.path.join(directory, "rank*.json"))
    if not paths:
        raise ReplayError(f"replay: no rank*.json traces in {directory!r} (run the job with --trace {directory} "
                          f"--clock virtual)")
    traces = []
    for p in paths:
        with open(p) as f:
            traces.append(json.load(f))
    traces.sort(key=lambda t: t["rank"])
    world = traces[0]["world"]
    if [t["rank"] for t in traces] != list(range(world)) or any(t.get("format") != FORMAT for t in traces):
        raise ReplayError(f"replay: {directory!r} holds traces of ranks {[t['rank'] for t in traces]}, expected "
                          f"every rank of {world} in format {FORMAT}")
    return traces


def fabric_model(settings: dict) -> FabricModel:
    """The fabric model the ranks of a job timed its calls with, from its traces' ``settings``."""
    return FabricModel(load_topology(settings["topology"]), settings["registration"], cores=settings["cores"],
                       comm_cores=settings["comm_cores"], partition=settings["partition"], path=settings["path"],
                       eager_bytes=settings["eager_bytes"])


class _Call:
    """One collective call as its members reach it."""

    def __init__(self, record: dict):
        self.record = record
        self.members = tuple(record["members"])
        self.entering: dict[int, float] = {}
        self.ends: np.ndarray | None = None
        self.occupancy = None           # (model, plan, members, clocks) once timed


@dataclasses.dataclass
class _Issue:
    """One operation a rank issued (its communicator calls run later): where they are timed."""
    id: int
    calls: list[dict]
    issued: float                     # the program's clock when it was issued
    next: int = 0                     # its next call not yet timed
    start: float | None = None
    end: float | None = None
    occupancy: list = dataclasses.field(default_factory=list)     # what its calls held, for compute

    @property
    def pending(self) -> bool:
        return self.next < len(self.calls)


class _Rank:
    def __init__(self, trace: dict):
        self.rank = trace["rank"]
        self.events = trace["events"]
        self.at = 0                      # next event
        self.now = 0.0                   # the program's clock
        self.reads: list[float] = []     # its value at each comm.clock() read
        self.free: dict[int, float] = {}     # communicator -> end of its previous call here
        self.done_k: dict[int, int] = {}     # communicator -> number of its last timed call here
        self.issues: dict[int, _Issue] = {}  # issue id -> its state
        self.open: list[_Issue] = []         # issues with calls not yet timed, in issue order
        self.in_flight: list[_Issue] = []    # asynchronous issues, for compute

    def ready(self, record: dict) -> bool:
        """Whether this rank's previous call on the record's communicator has been timed."""
        return self.done_k.get(record["comm"], 0) == record["k"] - 1

    @property
    def finished(self) -> bool:
        return self.at == len(self.events) and not self.open


class _Replayer:
    """Every rank's trace walked in program order; a call is timed once all its members reached it."""

    def __init__(self, traces: list[dict]):
        self.base = fabric_model(traces[0]["settings"])
        self.models = {self.base.path: self.base}
        self.ranks = [_Rank(t) for t in traces]
        self.calls: dict[tuple[int, int], _Call] = {}
        self.timed = 0

    def model_for(self, path: str) -> FabricModel:
        if path not in self.models:
            self.models[path] = self.base.with_path(path)
        return self.models[path]

    def enter(self, r: _Rank, record: dict, issued: float) -> _Call:
        """Rank ``r`` enters the call of ``record`` at ``issued`` or when its communicator's
        previous call ended."""
        key = (record["comm"], record["k"])
        c = self.calls.get(key)
        if c is None:
            c = self.calls[key] = _Call(record)
        c.entering[r.rank] = max(issued, r.free.get(record["comm"], 0.0))
        return c

    def time_call(self, c: _Call) -> None:
        rec = c.record
        model = self.model_for(rec["path"])
        if "phases" in rec:
            staging = None if rec["staging"] is None else tuple(np.asarray(a, dtype=np.int64) for a in rec["staging"])
            plan = model.plan_exchange(c.members, [(np.asarray(b, dtype=np.int64), int(k)) for b, k in rec["phases"]],
                                       staging)
        else:
            plan = model.plan(rec["op"], rec["algo"], c.members, rec["nbytes"], rec["root"], rec["itemsize"])
        clocks = np.array([c.entering[m] for m in c.members], dtype=np.float64)
        if rec.get("extra") is not None:
            clocks = clocks + np.asarray(rec["extra"], dtype=np.float64)
        c.ends = advance(plan, clocks)
        c.occupancy = (model, plan, list(c.members), clocks)
        for i, m in enumerate(c.members):
            rm = self.ranks[m]
            rm.free[rec["comm"]] = float(c.ends[i])
            rm.done_k[rec["comm"]] = rec["k"]
        self.timed += 1

    def advance_issues(self, r: _Rank) -> bool:
        """Enter the issued operations' calls that can be entered; note those timed."""
        moved = False
        for issue in list(r.open):
            while issue.pending:
                rec = issue.calls[issue.next]
                c = self.calls.get((rec["comm"], rec["k"]))
                if c is not None and r.rank in c.entering:
                    if c.ends is None:
                        break
                    i = c.members.index(r.rank)
                    issue.start = c.entering[r.rank] if issue.start is None else issue.start
                    issue.end = float(c.ends[i])
                    issue.occupancy.append((*c.occupancy, i))
                    issue.next += 1
                    moved = True
                    continue
                if not r.ready(rec):
                    break
                self.enter(r, rec, issue.issued)
                moved = True
            if not issue.pending:
                r.open.remove(issue)
        return moved

    def advance_program(self, r: _Rank) -> bool:
        """Walk rank ``r``'s events until one waits for a call not yet timed."""
        moved = False
        while r.at < len(r.events):
            ev = r.events[r.at]
            kind = ev["e"]
            if kind == "call":
                c = self.calls.get((ev["comm"], ev["k"]))
                if c is None or r.rank not in c.entering:
                    if not r.ready(ev):
                        return moved
                    c = self.enter(r, ev, r.now)
                    moved = True
                if c.ends is None:
                    return moved
                r.now = float(c.ends[c.members.index(r.rank)])
            elif kind == "issue":
                issue = r.issues[ev["id"]] = _Issue(ev["id"], ev["calls"], r.now)
                r.open.append(issue)
                if ev["async"]:
                    r.in_flight.append(issue)
                self.advance_issues(r)
            elif kind == "wait":
                issue = r.issues[ev["id"]]
                if issue.pending:
                    return moved
                if issue.end is not None:
                    r.now = max(r.now, issue.end)
            elif kind == "compute":
                if any(i.pending for i in r.in_flight):
                    return moved
                t0 = r.now
                r.in_flight = [i for i in r.in_flight if i.end is not None and i.end > t0]
                job = ComputeJob(ev["cores"], ev["us"], t0, ev.get("hbm", 0.0))
                r.now = kernel_end(job, self.base.cores, [o for i in r.in_flight for o in i.occupancy],
                                   self.base.fabric.hbm)
            elif kind == "clock":
                r.reads.append(r.now)
            elif kind == "p2p":
                raise ReplayError(f"replay: rank {r.rank} made a point-to-point call ({ev['op']}); traces with "
                                  f"send/recv are not replayed yet")
            else:
                raise ReplayError(f"replay: rank {r.rank}: unknown event {kind!r}")
            r.at += 1
            moved = True
        return moved

    def run(self) -> None:
        while True:
            moved = False
            for r in self.ranks:
                moved |= self.advance_issues(r)
                moved |= self.advance_program(r)
            for c in self.calls.values():
                if c.ends is None and len(c.entering) == len(c.members):
                    self.time_call(c)
                    moved = True
            if all(r.finished for r in self.ranks):
                return
            if not moved:
                stuck = [(r.rank, r.events[r.at] if r.at < len(r.events) else "open issues") for r in self.ranks
                         if not r.finished]
                raise ReplayError(f"replay: the traces do not complete; ranks stuck at {stuck[:4]}")


def replay(traces: list[dict]) -> Replay:
    """Time the traces' calls again, as the ranks did (see the module docstring)."""
    if not traces:
        raise ReplayError("replay: no traces")
    job = _Replayer(traces)
    job.run()
    recorded = [t.get("end_us") for t in traces]
    return Replay(np.array([r.now for r in job.ranks]),
                  None if None in recorded else np.array(recorded, dtype=np.float64),
                  job.timed, [np.array(r.reads) for r in job.ranks])
