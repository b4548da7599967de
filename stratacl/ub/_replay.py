"""Replay of recorded traces through the fabric model: a job's modeled time without ranks.

    traces (``--trace DIR``: runtime/_trace.py, one per rank, program order)
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
from ._clock import FabricModel, run_plan
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


class _Rank:
    def __init__(self, trace: dict):
        self.rank = trace["rank"]
        self.events = trace["events"]
        self.at = 0                      # next event
        self.now = 0.0                   # the program's clock
        self.reads: list[float] = []     # its value at each comm.clock() read
        self.free: dict[int, float] = {}     # communicator -> end of its previous call here
        self.done_k: dict[int, int] = {}     # communicator -> number of its last timed call here
        self.issues: dict[int, dict] = {}    # issue id -> its state
        self.open: list[dict] = []           # issues with calls not yet timed, in issue order
        self.in_flight: list[dict] = []      # asynchronous issues, for compute


def replay(traces: list[dict]) -> Replay:
    """Time the traces' calls again, as the ranks did (see the module docstring)."""
    if not traces:
        raise ReplayError("replay: no traces")
    base = fabric_model(traces[0]["settings"])
    models = {base.path: base}

    def model_for(path: str) -> FabricModel:
        if path not in models:
            models[path] = base.with_path(path)
        return models[path]

    ranks = [_Rank(t) for t in traces]
    calls: dict[tuple[int, int], _Call] = {}
    timed = 0

    def call_of(record: dict) -> _Call:
        key = (record["comm"], record["k"])
        c = calls.get(key)
        if c is None:
            c = calls[key] = _Call(record)
        return c

    def ready(r: _Rank, record: dict) -> bool:
        """Whether this rank's previous call on the communicator has been timed."""
        return r.done_k.get(record["comm"], 0) == record["k"] - 1

    def enter(r: _Rank, record: dict, issued: float) -> _Call:
        c = call_of(record)
        c.entering[r.rank] = max(issued, r.free.get(record["comm"], 0.0))
        return c

    def time_call(c: _Call) -> None:
        rec = c.record
        model = model_for(rec["path"])
        if "phases" in rec:
            staging = None if rec["staging"] is None else tuple(np.asarray(a, dtype=np.int64) for a in rec["staging"])
            plan = model.plan_exchange(c.members, [(np.asarray(b, dtype=np.int64), int(k)) for b, k in rec["phases"]],
                                       staging)
        else:
            plan = model.plan(rec["op"], rec["algo"], c.members, rec["nbytes"], rec["root"], rec["itemsize"])
        clocks = np.array([c.entering[m] for m in c.members], dtype=np.float64)
        if rec.get("extra") is not None:
            clocks = clocks + np.asarray(rec["extra"], dtype=np.float64)
        c.ends = run_plan(plan, clocks)
        c.occupancy = (model, plan, list(c.members), clocks)
        for i, m in enumerate(c.members):
            rm = ranks[m]
            rm.free[rec["comm"]] = float(c.ends[i])
            rm.done_k[rec["comm"]] = rec["k"]

    def advance_issues(r: _Rank) -> bool:
        moved = False
        for issue in list(r.open):
            while issue["next"] < len(issue["calls"]):
                rec = issue["calls"][issue["next"]]
                c = calls.get((rec["comm"], rec["k"]))
                if c is not None and r.rank in c.entering:
                    if c.ends is None:
                        break
                    i = c.members.index(r.rank)
                    issue["start"] = c.entering[r.rank] if issue["start"] is None else issue["start"]
                    issue["end"] = float(c.ends[i])
                    issue["occupancy"].append((*c.occupancy, i))
                    issue["next"] += 1
                    moved = True
                    continue
                if not ready(r, rec):
                    break
                enter(r, rec, issue["issued"])
                moved = True
            if issue["next"] == len(issue["calls"]):
                r.open.remove(issue)
        return moved

    def advance_program(r: _Rank) -> bool:
        moved = False
        while r.at < len(r.events):
            ev = r.events[r.at]
            kind = ev["e"]
            if kind == "call":
                c = calls.get((ev["comm"], ev["k"]))
                if c is None or r.rank not in c.entering:
                    if not ready(r, ev):
                        return moved
                    c = enter(r, ev, r.now)
                    moved = True
                if c.ends is None:
                    return moved
                r.now = float(c.ends[c.members.index(r.rank)])
            elif kind == "issue":
                issue = {"id": ev["id"], "calls": ev["calls"], "next": 0, "issued": r.now, "start": None, "end": None,
                         "occupancy": []}
                r.issues[ev["id"]] = issue
                r.open.append(issue)
                if ev["async"]:
                    r.in_flight.append(issue)
                advance_issues(r)
            elif kind == "wait":
                issue = r.issues[ev["id"]]
                if issue["next"] < len(issue["calls"]):
                    return moved
                if issue["end"] is not None:
                    r.now = max(r.now, issue["end"])
            elif kind == "compute":
                if any(i["next"] < len(i["calls"]) for i in r.in_flight):
                    return moved
                t0 = r.now
                keep = [i for i in r.in_flight if i["end"] is not None and i["end"] > t0]
                r.in_flight = keep
                job = ComputeJob(ev["cores"], ev["us"], t0, ev.get("hbm", 0.0))
                r.now = kernel_end(job, base.cores, [o for i in keep for o in i["occupancy"]], base.fabric.hbm)
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

    while True:
        moved = False
        for r in ranks:
            moved |= advance_issues(r)
            moved |= advance_program(r)
        for c in calls.values():
            if c.ends is None and len(c.entering) == len(c.members):
                time_call(c)
                timed += 1
                moved = True
        if all(r.at == len(r.events) and not r.open for r in ranks):
            break
        if not moved:
            stuck = [(r.rank, r.events[r.at] if r.at < len(r.events) else "open issues") for r in ranks
                     if r.at < len(r.events) or r.open]
            raise ReplayError(f"replay: the traces do not complete; ranks stuck at {stuck[:4]}")
    recorded = [t.get("end_us") for t in traces]
    return Replay(np.array([r.now for r in ranks]), None if None in recorded else np.array(recorded, dtype=np.float64),
                  timed, [np.array(r.reads) for r in ranks])
