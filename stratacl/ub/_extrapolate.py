"""The traces of a larger job, made from recordings of the same SPMD program at smaller rank counts.

    recordings at N1 < N2 [< N3] (``--trace DIR``, runtime/services/_trace.py)
        |   every rank's events have one shape, the same at every N (rank 0's events are the
        |   template; anything else is refused)
        v
    numbers: each number of an event (a call's bytes, a kernel's microseconds, a jit mapping's
        cost, an MoE call's tokens, experts and row size) is read on every rank; the mean over
        the ranks is fitted exactly through the recordings, a + b N with two, a + b N + c / N
        with three (an all_to_all's blocks grow with N, an FSDP shard shrinks as 1 / N, a
        tensor-parallel all_reduce stays), and rank r at N keeps the deviation from that mean
        that rank r mod N_last had in the largest recording (a data-dependent kernel, such as
        an expert's, keeps the spread it had)
    groups: a call's members tile the world in blocks of ``size`` members ``stride`` apart
        (tensor-parallel blocks: stride 1; FSDP groups: stride TP; the world), and each of
        size and stride is constant or proportional to N across the recordings
    MoE calls (stratacl.ep, recorded with their routing's shape): a routing is drawn anew at
        N with ``ep.routing`` (every token its top-k of the experts, uniform or Zipf-skewed,
        seeded: the j-th dispatch of the program with seed ``seed + j``) and its traffic is
        built by the code that times ep's calls (``collectives._ep.traffic``); a combine takes
        the routing of the dispatch it undoes
        v
    every rank's events at N, for ``ub.replay``

What is assumed is weak scaling of one step: each rank's work keeps its shape as ranks are
added. A rank's calls with itself alone (``host_rows``) fit their bytes as numbers. Refused,
with the reason: recordings of different shapes, groups that do not tile the world in that
way, calls among several ranks timed from traffic matrices with no routing behind them
(all_to_all_v), point-to-point calls.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .._errors import ReplayError
from ..collectives import ep_slices
from ._tracereplay import FORMAT


def extrapolate(*args, seed: int = 0, skew: float = 0.0, routing: Callable | None = None) -> list[dict]:
    """``extrapolate(t1, t2, [t3,] nranks)``: the traces of an ``nranks``-rank job from traces
    of the same SPMD program recorded at two or three smaller rank counts (``ub.load_traces``
    of each), in increasing order. MoE calls (stratacl.ep) need ``routing``, the generator
    their routings are drawn anew with (``stratacl.ep.routing``: ``routing(tokens, experts,
    topk, nranks, skew, seed)``), with ``seed`` and ``skew``. See the module docstring for what
    is fitted and what is assumed."""
    if len(args) not in (3, 4) or not isinstance(args[-1], (int, np.integer)):
        raise ReplayError("extrapolate(t1, t2, [t3,] nranks): two or three recordings, then the rank count")
    recs, nranks = list(args[:-1]), int(args[-1])
    ns = [r[0]["world"] if r else 0 for r in recs]
    if any(a >= b for a, b in zip(ns, ns[1:])) or ns[0] < 1 or nranks < 2:
        raise ReplayError(f"extrapolate: needs recordings at increasing rank counts and nranks >= 2, got {ns} "
                          f"and {nranks}")
    _check_shape(recs, [f"N={n}" for n in ns], "extrapolate", "N")
    return _Extrapolation(recs, ns, nranks, seed, skew, routing).traces()


def _kinds(events: list[dict]) -> list:
    return [(e["e"], e.get("op"), len(e.get("calls", ()))) for e in events]


def _name(kinds: list, i: int) -> str:
    if i >= len(kinds):
        return f"the end (after {len(kinds)} events)"
    e, op, calls = kinds[i]
    return f"{e} {op}" if op else f"{e} of {calls} call(s)" if e == "issue" else e


def _check_shape(recs: list, labels: list[str], who: str, across: str) -> None:
    """Refuse recordings (``labels``: what each was recorded at, e.g. "N=4") whose ranks did not
    all make rank 0's events of the last one, in kind and order (``across``: what the
    recordings vary), or that hold point-to-point calls."""
    shape = _kinds(recs[-1][0]["events"])
    for rec, label in zip(recs, labels):
        for t in rec:
            got = _kinds(t["events"])
            if got != shape:
                i = next((j for j, (x, y) in enumerate(zip(got, shape)) if x != y), min(len(got), len(shape)))
                raise ReplayError(f"{who}: rank {t['rank']} at {label} made other events than rank 0 at "
                                  f"{labels[-1]}: the program is not SPMD in shape (its events differ by rank or by "
                                  f"{across}); first at event {i}: {_name(got, i)} against {_name(shape, i)}")
            for e in t["events"]:
                if e["e"] == "p2p":
                    raise ReplayError(f"{who}: rank {t['rank']} made a point-to-point call ({e['op']}); only "
                                      f"collectives extrapolate")


def _calls(event: dict) -> list[dict]:
    return [event] if event["e"] == "call" else event.get("calls", [])


class _Extrapolation:
    def __init__(self, recs: list, ns: list[int], nranks: int, seed: int, skew: float, routing: Callable | None):
        self.recs, self.ns, self.n, self.seed, self.skew, self.routing = recs, ns, nranks, seed, skew, routing
        self.template = recs[-1][0]["events"]
        if len(ns) == 2:
            basis = [[1.0, float(m)] for m in ns]
            self.at = np.array([1.0, float(nranks)])
        else:
            basis = [[1.0, float(m), 1.0 / m] for m in ns]
            self.at = np.array([1.0, float(nranks), 1.0 / nranks])
        self.basis = np.array(basis)
        self.groups: dict = {}          # template comm -> (size, stride) at N
        self.routings: dict = {}        # (buffer, dispatch, block, offset) -> (topk_idx per member, experts)
        self.dispatches: dict = {}      # (buffer, dispatch) -> j, in template order

    # --- numbers ------------------------------------------------------------------------------
    def number(self, per_rank: list[np.ndarray]) -> np.ndarray:
        """Every rank's value at N from each recording's per-rank values (see the docstring)."""
        means = np.array([float(np.mean(v)) for v in per_rank])
        if np.all(means == means[0]):
            mean = means[0]
        else:
            mean = float(np.linalg.solve(self.basis, means) @ self.at)
        last = np.asarray(per_rank[-1], dtype=np.float64)
        dev = last - last.mean()
        return mean + dev[np.arange(self.n) % last.size]

    def per_rank(self, i: int, j: int, read) -> list[np.ndarray]:
        """``read(record, rank)`` of call j of event i, on every rank of every recording."""
        return [np.array([read(_calls(t["events"][i])[j], t["rank"]) for t in rec], dtype=np.float64)
                for rec in self.recs]

    # --- groups -------------------------------------------------------------------------------
    def group(self, i: int, j: int) -> tuple[int, int]:
        """(size, stride) at N of the communicator of call j of event i."""
        comm = _calls(self.template[i])[j]["comm"]
        if comm in self.groups:
            return self.groups[comm]
        pats = []
        for rec, n in zip(self.recs, self.ns):
            m0 = _calls(rec[0]["events"][i])[j]["members"]
            s, d = len(m0), (m0[1] - m0[0] if len(m0) > 1 else None)      # one member: any stride
            for t in rec:
                r = t["rank"]
                if _calls(t["events"][i])[j]["members"] != (_tile(r, s, d) if d else [r]):
                    raise ReplayError(f"extrapolate: event {i}: at N={n} the members of rank {r}'s "
                                      f"{_calls(t['events'][i])[j]['op']} do not tile the world as blocks of {s} "
                                      f"ranks {d} apart")
            pats.append((s, d))
        out = []
        for what, got in (("size", [(p[0], n) for p, n in zip(pats, self.ns)]),
                          ("stride", [(p[1], n) for p, n in zip(pats, self.ns) if p[1] is not None] or [(1, 1)])):
            vals = [v for v, _ in got]
            if all(v == vals[0] for v in vals):
                out.append(vals[0])
            elif all(v * got[0][1] == vals[0] * n for v, n in got):
                out.append(vals[0] * self.n // got[0][1])
            else:
                raise ReplayError(f"extrapolate: event {i}: the group's {what} is {vals} at N={self.ns}: neither "
                                  f"constant nor proportional to N")
        s, d = out
        if s < 1 or d < 1 or self.n % (s * d):
            raise ReplayError(f"extrapolate: event {i}: groups of {s} ranks {d} apart do not tile {self.n} ranks")
        self.groups[comm] = (s, d)
        return s, d

    # --- calls --------------------------------------------------------------------------------
    def call(self, i: int, j: int, rank: int, cache: dict) -> dict:
        """Call j of event i as rank ``rank`` at N makes it (``cache``: per (i, j), shared
        between the members of one group)."""
        rec = _calls(self.template[i])[j]
        s, d = self.group(i, j)
        block, offset = rank // (s * d), rank % d
        key = (i, j, block, offset)
        if key in cache:
            return cache[key]
        members = _tile(rank, s, d)
        out = {k: v for k, v in rec.items() if k not in ("gap_s", "routing", "members", "comm", "extra")}
        out.update(comm=f"{rec['comm']}:{block}:{offset}", members=members, extra=None)
        if "phases" in rec and "routing" in rec:
            out.update(self.exchange(i, j, rec, members, block, offset))
        elif "phases" in rec and s == 1:
            out.update(self.own(i, j, rec, rank))
        elif "phases" in rec:
            raise ReplayError(f"extrapolate: event {i}: {rec['op']} is timed from traffic matrices with no "
                              f"routing behind them; only MoE calls (stratacl.ep) are drawn anew")
        else:
            for t in (r[0] for r in self.recs):
                r0 = _calls(t["events"][i])[j]
                if (r0["op"], r0["algo"], r0["root"], r0["itemsize"]) != (rec["op"], rec["algo"], rec["root"],
                                                                          rec["itemsize"]):
                    raise ReplayError(f"extrapolate: event {i}: the recordings call {r0['op']} and {rec['op']}")
            nbytes = self.number(self.per_rank(i, j, lambda c, r: c["nbytes"]))[members]
            item = rec["itemsize"]
            out["nbytes"] = int(round(max(0.0, float(nbytes.mean())) / item)) * item
        if any(_calls(t["events"][i])[j].get("extra") is not None for rec_ in self.recs for t in rec_):
            def paid(c, r):
                return 0.0 if c.get("extra") is None else c["extra"][c["members"].index(r)]
            out["extra"] = np.maximum(0.0, self.number(self.per_rank(i, j, paid))[members]).tolist()
        cache[key] = out
        return out

    def exchange(self, i: int, j: int, rec: dict, members: list[int], block: int, offset: int) -> dict:
        """An MoE call's phases and staging at N, from a routing drawn anew."""
        route = rec["routing"]
        op = "dispatch" if rec["op"].endswith("dispatch") else "combine"
        which = (route["buffer"], route["dispatch"])
        if which not in self.dispatches:
            if op != "dispatch":
                raise ReplayError(f"extrapolate: event {i}: a {rec['op']} whose dispatch the traces do not hold")
            self.dispatches[which] = len(self.dispatches)
        key = (*which, block, offset)
        if key not in self.routings:
            def field(name):
                return self.per_rank(i, j, lambda c, r: c["routing"][name][c["members"].index(r)]
                                     if name == "tokens" else c["routing"][name])
            tokens = np.maximum(0, np.rint(self.number(field("tokens"))[members])).astype(np.int64)
            experts = int(round(float(self.number(field("experts"))[0])))
            if experts < len(members) or experts % len(members):
                raise ReplayError(f"extrapolate: event {i}: {experts} experts at N={self.n} do not spread evenly "
                                  f"over {len(members)} members")
            if self.routing is None:
                raise ReplayError(f"extrapolate: event {i}: an MoE call ({rec['op']}) is drawn anew at N={self.n}: "
                                  f"pass routing=stratacl.ep.routing (or a generator of your own)")
            idx = self.routing(tokens, experts, int(route["topk"]), len(members), self.skew,
                          self.seed + self.dispatches[which])
            self.routings[key] = (idx, experts)
        idx, experts = self.routings[key]
        row = int(round(float(self.number(self.per_rank(i, j, lambda c, r: c["routing"]["row"]))[0])))
        phases, _, staging = ep_slices.traffic(op, route["mode"], idx, experts, row)
        return {"phases": phases, "staging": None if rec.get("staging") is None else list(staging)}

    def own(self, i: int, j: int, rec: dict, rank: int) -> dict:
        """A rank's call with itself alone (``host_rows``: its HBM and its host memory): each
        phase's one entry and the staged bytes are numbers like any other."""
        if any(len(_calls(t["events"][i])[j]["phases"]) != len(rec["phases"]) for r in self.recs for t in r):
            raise ReplayError(f"extrapolate: event {i}: {rec['op']} has different phases in the recordings")

        def entry(read):
            return max(0, int(round(float(self.number(self.per_rank(i, j, read))[rank]))))
        phases = [(np.array([[entry(lambda c, r, p=p: c["phases"][p][0][0][0])]], dtype=np.int64), kind)
                  for p, (_, kind) in enumerate(rec["phases"])]
        staging = None if rec.get("staging") is None else [
            np.array([entry(lambda c, r, a=a: c["staging"][a][0])], dtype=np.int64) for a in range(2)]
        return {"phases": phases, "staging": staging}

    def traces(self) -> list[dict]:
        settings = self.recs[-1][0]["settings"]
        out = []
        caches: dict = {}
        for rank in range(self.n):
            events = []
            for i, e in enumerate(self.template):
                kind = e["e"]
                if kind == "call":
                    events.append({"e": "call", **self.call(i, 0, rank, caches.setdefault((i, 0), {}))})
                elif kind == "issue":
                    events.append(dict(e, calls=[self.call(i, j, rank, caches.setdefault((i, j), {}))
                                                 for j in range(len(e["calls"]))]))
                elif kind == "compute":
                    if i not in caches:
                        caches[i] = self.number([np.array([t["events"][i]["us"] for t in rec]) for rec in self.recs])
                    events.append(dict(e, us=max(0.0, float(caches[i][rank]))))
                else:
                    events.append(dict(e))
            out.append({"format": FORMAT, "rank": rank, "world": self.n, "settings": settings, "end_us": None,
                        "events": events})
        return out


def _tile(rank: int, size: int, stride: int) -> list[int]:
    """The members of ``rank``'s group when groups of ``size`` ranks ``stride`` apart tile the world."""
    base = rank // (size * stride) * size * stride + rank % stride
    return [base + k * stride for k in range(size)]
