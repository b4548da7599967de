"""Per-core profiler: probes into a per-rank trace buffer, decoded into per-core timelines.

    probes                                   trace buffer (one per rank)          decoded
    ------                                   ---------------------------          -------
    Profiler.begin(core, stage, t_us)  --->  rows (core, stage id, begin, end)  -> per-core
    Profiler.end(core, stage, t_us)          numpy structured array, grows by      timelines,
    automatic: profile_call(model, ...)      doubling; no allocation per probe     summary(),
      walks a call's plan on the model's     once it is large enough               Chrome trace
      clocks and records the backend's own                                         JSON (Perfetto)
      stages on every core of every rank:
        sync         barriers, flag waits (every communication core waits)
        data         a core moving units (MTE path)
        descriptor   a core building + posting SDMA descriptors, ringing the doorbell
        poll         a core polling the SDMA tail flag
        engine       the SDMA engine moving descriptors (its own track)
        compute      compute charged to cores (``_compute.py``)

``write_chrome_trace`` emits the trace-event format ("X" complete events, ``pid`` = rank,
``tid`` = core, thread names "core 7" / "sdma engine"), which Perfetto and chrome://tracing open.
``summary`` gives per-core completion times, the fastest-to-slowest gap and time in sync vs data.
Times are modeled microseconds (the same the virtual clock and estimate report).
"""
from __future__ import annotations

import json
import os

import numpy as np

STAGES = ("sync", "data", "descriptor", "poll", "engine", "compute", "user")
ENGINE = -1                # the core id of the SDMA engine's track
_ROW = np.dtype([("core", np.int32), ("stage", np.int16), ("begin", np.float64), ("end", np.float64)])


class Profiler:
    """One rank's trace buffer. ``begin``/``end`` are the developer's markers (any stage name:
    unknown names are added), ``record`` adds a finished interval."""

    def __init__(self, rank: int = 0, capacity: int = 1024):
        self.rank = rank
        self._rows = np.empty(capacity, dtype=_ROW)
        self._n = 0
        self._open: dict = {}
        self.stages = list(STAGES)

    def _reserve(self, k: int) -> None:
        """Room for ``k`` more rows: the buffer doubles (once, to the size doubling reaches)."""
        size = self._rows.size
        while self._n + k > size:
            size = 2 * size or 1
        if size != self._rows.size:
            rows = np.empty(size, dtype=_ROW)
            rows[:self._n] = self._rows[:self._n]
            self._rows = rows

    def _stage(self, name: str) -> int:
        try:
            return self.stages.index(name)
        except ValueError:
            self.stages.append(name)
            return len(self.stages) - 1

    def record(self, core: int, stage: str, begin: float, end: float) -> None:
        if end < begin:
            raise ValueError(f"profiler: stage {stage!r} on core {core} ends ({end}) before it begins ({begin})")
        self._reserve(1)
        self._rows[self._n] = (core, self._stage(stage), begin, end)
        self._n += 1

    def record_many(self, core, stage: str, begin, end) -> None:
        core, begin, end = np.asarray(core), np.asarray(begin, float), np.asarray(end, float)
        if begin.ndim == 0 and end.ndim == 0 and core.ndim <= 1:
            # one interval on several cores (a wait, a core's stage): no per-row arrays to build,
            # which is most of an estimate's time at large sizes (many staged rounds)
            if not end >= begin:                  # NaN compares false: dropped, as below
                return
            k = core.size
            self._reserve(k)
            rows = self._rows[self._n:self._n + k]
            rows["core"], rows["stage"], rows["begin"], rows["end"] = core, self._stage(stage), begin, end
            self._n += k
            return
        if not core.shape == begin.shape == end.shape:
            core, begin, end = np.broadcast_arrays(core, begin, end)
        keep = ~(np.isnan(begin) | np.isnan(end)) & (end >= begin)
        k = int(keep.sum())
        self._reserve(k)
        rows = self._rows[self._n:self._n + k]
        rows["core"], rows["stage"] = core[keep], self._stage(stage)
        rows["begin"], rows["end"] = begin[keep], end[keep]
        self._n += k

    def _append(self, core: np.ndarray, stage: np.ndarray, begin: np.ndarray, end: np.ndarray) -> None:
        """Rows already broadcast, ``stage`` as ids; dropped as ``record_many`` drops them."""
        keep = ~(np.isnan(begin) | np.isnan(end)) & (end >= begin)
        k = int(keep.sum())
        self._reserve(k)
        rows = self._rows[self._n:self._n + k]
        rows["core"], rows["stage"] = core[keep], stage[keep]
        rows["begin"], rows["end"] = begin[keep], end[keep]
        self._n += k

    def absorb(self, other: "Profiler") -> None:
        """Append another profiler's rows (the automatic probes of one call) to this one."""
        r = other.rows
        for i, name in enumerate(other.stages):
            sel = r["stage"] == i
            if sel.any():
                self.record_many(r["core"][sel], name, r["begin"][sel], r["end"][sel])

    def begin(self, core: int, stage: str, t_us: float) -> None:
        self._open[(core, stage)] = t_us

    def end(self, core: int, stage: str, t_us: float) -> None:
        try:
            t0 = self._open.pop((core, stage))
        except KeyError:
            raise ValueError(f"profiler: end of stage {stage!r} on core {core} without a begin") from None
        self.record(core, stage, t0, t_us)

    @property
    def rows(self) -> np.ndarray:
        return self._rows[:self._n]

    def timelines(self) -> dict[int, list[tuple[str, float, float]]]:
        """Decoded: core -> [(stage, begin, end), ...] in time order."""
        out: dict = {}
        r = self.rows
        for i in np.lexsort((r["begin"], r["core"])):
            out.setdefault(int(r["core"][i]), []).append((self.stages[r["stage"][i]], float(r["begin"][i]),
                                                          float(r["end"][i])))
        return out

    def summary(self) -> dict:
        """Per-core completion (end of its last data or descriptor stage), gap, sync vs data time."""
        r = self.rows
        work = np.isin(r["stage"], [self.stages.index(s) for s in ("data", "descriptor")]) & (r["core"] >= 0)
        # each core's latest end, from 0.0 (fmax: a NaN end never wins, as with max(best, nan))
        cores, at = np.unique(r["core"][work], return_inverse=True)
        latest = np.zeros(cores.size)
        np.fmax.at(latest, at, r["end"][work])
        done = dict(zip(cores.tolist(), latest.tolist()))
        ends = latest
        dur = r["end"] - r["begin"]
        per_stage = {s: float(dur[(r["stage"] == i) & (r["core"] >= 0)].sum()) for i, s in enumerate(self.stages)}
        busy = {s: v for s, v in per_stage.items() if s in ("data", "descriptor", "poll")}
        return {"rank": self.rank, "cores": len(done),
                "completion_us": {int(k): v for k, v in sorted(done.items())},
                "fastest_us": float(ends.min()) if ends.size else 0.0,
                "slowest_us": float(ends.max()) if ends.size else 0.0,
                "gap": float((ends.max() - ends.min()) / ends.max()) if ends.size and ends.max() > 0 else 0.0,
                "stage_us": per_stage, "sync_us": per_stage.get("sync", 0.0), "data_us": per_stage.get("data", 0.0),
                "core_busy_us": float(sum(busy.values()))}


def chrome_trace(profilers: list[Profiler]) -> dict:
    """The trace-event JSON object of several ranks' profilers (one process per rank)."""
    events = []
    for p in profilers:
        events.append({"name": "process_name", "ph": "M", "pid": p.rank, "tid": 0, "args": {"name": f"rank {p.rank}"}})
        cores = sorted(set(p.rows["core"].tolist()))
        for c in cores:
            tid = c if c >= 0 else 10_000
            events.append({"name": "thread_name", "ph": "M", "pid": p.rank, "tid": tid,
                           "args": {"name": "sdma engine" if c == ENGINE else f"core {c}"}})
        for c, st, b, e in p.rows.tolist():
            events.append({"name": p.stages[st], "cat": p.stages[st], "ph": "X", "pid": p.rank,
                           "tid": c if c >= 0 else 10_000, "ts": b, "dur": e - b})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_chrome_trace(path: str, profilers: list[Profiler]) -> str:
    """Write the Chrome/Perfetto trace (and ``<path>.summary.json``); returns the trace path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(chrome_trace(profilers), f)
    with open(path + ".summary.json", "w") as f:
        json.dump([p.summary() for p in profilers], f, indent=1)
    return path


def profile_call(model, op: str, algo: str, members, nbytes: int, root: int = 0, itemsize: int = 1,
                 clocks_in=None, ranks=None) -> list[Profiler]:
    """Automatic probes of one call: the plan the model times (``FabricModel.plan``), walked on
    the members' clocks, every core's stages recorded. ``ranks``: member indices to profile
    (default all). Same arithmetic as ``model_call``, so the timelines end where it says."""
    from ._clock import choose_algo
    members = tuple(int(r) for r in np.asarray(members).reshape(-1))
    if algo == "auto":
        algo = choose_algo(model, op, members, nbytes, root, itemsize)
    return profile_plan(model, model.plan(op, algo, members, int(nbytes), root, itemsize), members, clocks_in, ranks)


def profile_plan(model, plan: list, members, clocks_in=None, ranks=None) -> list[Profiler]:
    """``profile_call`` for any timed plan of ``model`` (``FabricModel.plan``, ``plan_exchange``)."""
    from ._clock import advance
    members = tuple(int(r) for r in np.asarray(members).reshape(-1))
    n = len(members)
    t = np.zeros(n) if clocks_in is None else np.asarray(clocks_in, dtype=np.float64).copy()
    want = list(range(n)) if ranks is None else list(ranks)
    profs = {i: Profiler(members[i]) for i in want}
    cores = np.arange(model.comm_cores)
    for step in plan:
        kind = step[0]
        if kind == "ring":
            dur, lat, runs = step[1], step[2], step[3]
            end = t + dur[0]
            starts = [t.copy()]
            for s in range(1, dur.shape[0]):
                st = np.maximum(end, np.roll(end, 1)) + lat
                starts.append(st)
                end = st + dur[s]
            who = cores if model.path == "mte" else cores[:model.topology.sdma.poll_cores]
            _record_ring(profs, want, np.array(starts), dur, runs, who)
            t = end
            continue
        t_next = advance([step], t)
        for i in want:
            if kind == "add":
                if step[2][i] is not None:
                    _record_run(profs[i], step[2][i][0], t[i])
            elif kind == "shift":
                if step[4][i] is not None:
                    _record_run(profs[i], step[4][i][0], t[i])
            else:        # barrier, rootwait: the kernel's cores wait (SDMA: only its polling cores)
                who = cores if model.path == "mte" else cores[:model.topology.sdma.poll_cores]
                profs[i].record_many(who, "sync", t[i], t_next[i])
        t = t_next
    return [profs[i] for i in want]


def _run_rows(run) -> list[tuple]:
    """What ``_record_run`` records for ``run`` entered at t0, as segments (stage, cores,
    begin offsets, end offsets, whether the begin is t0 itself), each broadcast as it does."""
    from ..sdma import SdmaRun
    if isinstance(run, SdmaRun):
        c = np.arange(run.build_end.size)
        parts = [("descriptor", c, None, run.doorbell_end), ("poll", c, run.doorbell_end, run.poll_end),
                 ("engine", np.full(run.desc_end.size, ENGINE), run.desc_start, run.desc_end)]
    else:
        parts = [("data", np.arange(run.core_end.size), run.core_start, run.core_end)]
    out = []
    for stage, core, b, e in parts:
        core, bb, ee = np.broadcast_arrays(np.asarray(core), np.asarray(0.0 if b is None else b, float),
                                           np.asarray(e, float))
        out.append((stage, core.ravel(), bb.ravel(), ee.ravel(), b is None))
    return out


def _record_ring(profs: dict, want: list, starts: np.ndarray, dur: np.ndarray, runs, who: np.ndarray) -> None:
    """A ring step's probes on each profiled member, in the order the step-by-step walk made
    them (step s: the wait for step s-1's flag on ``who``, then step s's core run), built for all
    steps of a member at once: a 32-rank staged ring at 1 GiB has thousands of steps. ``starts``
    [S, n]: each step's start. Every begin and end is the walk's own sum (t0 + offset; a wait
    from the end of the step before, start + duration, to the step's start), so the rows are
    bit for bit the walk's."""
    steps = starts.shape[0]
    # row templates: block 0 is the wait on ``who``; then one block per distinct run in the step
    names = ["sync"]
    core, stage, boff, eoff, exact = [who], [np.zeros(who.size, np.int16)], [np.zeros(who.size)], \
        [np.zeros(who.size)], [np.zeros(who.size, bool)]
    block_of_run = np.full(len(runs.runs), -1)
    used = np.unique(runs.index)
    for r in used.tolist():
        run = runs.runs[r]
        if run is None:
            continue
        block_of_run[r] = len(core)
        segs = _run_rows(run[0])
        for name, c, b, e, ex in segs:
            if name not in names:
                names.append(name)
        core.append(np.concatenate([c for _, c, _, _, _ in segs]))
        stage.append(np.concatenate([np.full(c.size, names.index(name), np.int16) for name, c, _, _, _ in segs]))
        boff.append(np.concatenate([b for _, _, b, _, _ in segs]))
        eoff.append(np.concatenate([e for _, _, _, e, _ in segs]))
        exact.append(np.concatenate([np.full(c.size, ex) for _, c, _, _, ex in segs]))
    block_len = np.array([c.size for c in core])
    block_off = np.cumsum(block_len) - block_len
    core, stage, boff, eoff, exact = (np.concatenate(x) for x in (core, stage, boff, eoff, exact))
    for i in want:
        prof = profs[i]
        ids = np.array([prof._stage(name) for name in names], np.int16)
        # blocks in walk order: step s's wait (from step 1 on), then its run (when it has one)
        bt = np.stack([np.r_[-1, np.zeros(steps - 1, np.int64)], block_of_run[runs.index[:, i]]], axis=1).ravel()
        bs = np.repeat(np.arange(steps), 2)
        keep = bt >= 0
        bt, bs = bt[keep], bs[keep]
        blen = block_len[bt]
        total = int(blen.sum())
        row = np.repeat(block_off[bt] - (np.cumsum(blen) - blen), blen) + np.arange(total)
        s = np.repeat(bs, blen)
        t0 = starts[s, i]
        begin = np.where(exact[row], t0, t0 + boff[row])
        end = t0 + eoff[row]
        wait = row < who.size                                 # rows of block 0
        sw = s[wait]
        begin[wait] = starts[sw - 1, i] + dur[sw - 1, i]
        end[wait] = starts[sw, i]
        prof._append(core[row], ids[stage[row]], begin, end)


def _record_run(prof: Profiler, run, t0: float) -> None:
    from ..sdma import SdmaRun
    if isinstance(run, SdmaRun):
        c = np.arange(run.build_end.size)
        prof.record_many(c, "descriptor", t0, t0 + run.doorbell_end)
        prof.record_many(c, "poll", t0 + run.doorbell_end, t0 + run.poll_end)
        prof.record_many(np.full(run.desc_end.size, ENGINE), "engine", t0 + run.desc_start, t0 + run.desc_end)
    else:
        c = np.arange(run.core_end.size)
        prof.record_many(c, "data", t0 + run.core_start, t0 + run.core_end)


def call_cores(model, op: str, algo: str, members, nbytes: int, root: int = 0, itemsize: int = 1) -> dict:
    """Per-core figures of one call entered at 0: ``core_gap`` (slowest minus fastest core
    completion over the slowest, worst member), ``core_busy_us`` (summed occupation of a
    member's cores, mean over members)."""
    return profiles_cores(profile_call(model, op, algo, members, nbytes, root, itemsize))


def profiles_cores(profs: list[Profiler]) -> dict:
    """``call_cores``'s figures from the members' profiles of one call entered at 0."""
    sums = [p.summary() for p in profs]
    return {"core_gap": max((s["gap"] for s in sums), default=0.0),
            "core_busy_us": float(np.mean([s["core_busy_us"] for s in sums])) if sums else 0.0}
