"""The traces of a job at a larger model dimension, made from recordings at smaller ones.

    recordings of one SPMD program at one rank count and x1 < x2 [< x3] of one model
    dimension (hidden size, FFN width, ...; ``--trace DIR`` at each, runtime/services/_trace.py)
        |   every rank's events have one shape, the same at every x (``_extrapolate``'s shape
        |   check), and each event the same fields: lists of the same lengths, the same
        |   strings, the same communicators and members; anything else is refused, naming the
        |   rank, the event and the field
        v
    numbers: every number of every event of rank r (a call's bytes, a traffic matrix's
        entries, staging bytes, jit mapping costs, an MoE call's row size, a kernel's FLOPs,
        HBM bytes, and its microseconds when no FLOPs were recorded) that differs between the
        recordings is fitted exactly through rank r's values, a polynomial in x of degree 1
        (two recordings) or 2 (three), and evaluated at the target x; an integer in every
        recording is rounded to one; nothing goes below 0
    kernels charged with FLOPs (``comm.charge_kernel``): "us" is the roofline of the fitted
        FLOPs and bytes on the traces' topology (``Topology.kernel_us``), as the rank would have
        charged it
    algorithms: a call recorded under ``--algo auto`` (the trace header's ``algo``) chooses
        again at its fitted size (``ub._clock.choose_algo``, as ``Modeling.algo_for`` does);
        under mesh or ring the recorded choice stays
        v
    every rank's events at the target x, for ``ub.replay`` (or ``ub.extrapolate``, in N)

What is assumed: every number is a polynomial of degree <= len(recordings) - 1 in the
dimension (a matmul's FLOPs grow as hidden^2, its bytes and an activation's all_to_all as
hidden), and the program's events keep their shape as it grows. Refused, with the reason:
recordings of different shapes, rank counts or settings; an MoE call whose routing changes with
the dimension: its tokens, experts or top-k, or where the tokens go (the rows each member sends,
the last phase's bytes over the row size, and the headers and records must be the same in every
recording, only the row size may grow), as with a gate that routes by the activations, whose
traffic and experts' kernels are then new draws, not polynomials;
under auto, a call with jit mappings whose algorithm the fit changes (its mappings follow the
algorithm); a call whose jit mappings are paid in some recordings and not in others (a miss is
an event, not a polynomial); recordings under auto made before traces recorded ``algo``, when
their choices differ.

``moe="fit"``, for a dimension that is the tokens themselves (a batch, a replica's tokens): an
MoE call's tokens and traffic change with it by construction, and they are fitted like any
other number (each member's tokens, every entry of every phase, the staged bytes), as are the
experts' kernels. That is the expected value of a routing whose draws extend as the tokens grow
(``stratacl.ep.routing`` draws token t's experts the same whatever follows it, so a larger
recording's routing is a smaller one's plus new tokens): exact in expectation, with the draw's
noise carried along, so it is checked against a real run rather than assumed (the examples'
gates route by the activations and change at every size; record with ``--routing seeded``).
The experts, the top-k, the row size and the call's mode must still be the same.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from .._errors import ReplayError
from ._clock import choose_algo
from ._extrapolate import _check_shape
from ._tracereplay import FORMAT, fabric_model

# fields that name things rather than measure them: the same in every recording, or refused
_NAMES = frozenset({"e", "op", "comm", "members", "k", "id", "async", "root", "itemsize", "cores", "path", "buffer",
                    "dispatch", "mode", "topk", "experts", "tokens"})


def extrapolate_dimension(recordings: list[list[dict]], values: list[float], value: float,
                          moe: str = "same") -> list[dict]:
    """The traces of the program at ``value`` of one model dimension, from ``recordings``
    (``ub.load_traces`` of each) of the same SPMD program at the same rank count and at the two
    or three increasing ``values`` of that dimension. Every number that changes is fitted
    through the recordings (linear with two, quadratic with three), kernels charged with FLOPs
    are timed again by the roofline, ``--algo auto`` chooses again. Feed the result to
    ``ub.replay``. ``moe``: "same" (an MoE call's routing must not change) or "fit" (its tokens
    and traffic are fitted too: for a dimension that is the tokens). See the module docstring
    for what is assumed and refused. Local; no ranks."""
    if moe not in ("same", "fit"):
        raise ReplayError(f"extrapolate_dimension: moe is 'same' or 'fit', got {moe!r}")
    recs, xs = list(recordings), list(values)
    if len(recs) not in (2, 3) or len(xs) != len(recs):
        raise ReplayError(f"extrapolate_dimension: two or three recordings and as many values, got {len(recs)} "
                          f"recording(s) and {len(xs)} value(s)")
    if any(a >= b for a, b in zip(xs, xs[1:])):
        raise ReplayError(f"extrapolate_dimension: the values must increase, got {xs}")
    worlds = [len(r) and r[0]["world"] for r in recs]
    if not worlds[0] or any(w != worlds[0] or len(r) != w for w, r in zip(worlds, recs)):
        raise ReplayError(f"extrapolate_dimension: the recordings must hold every rank of one rank count, got "
                          f"{[len(r) for r in recs]} traces of worlds {worlds}")
    settings = recs[-1][0]["settings"]
    for r, x in zip(recs, xs):
        for t in r:
            got = t["settings"]
            diff = [f"{k} {got.get(k)!r} against {settings.get(k)!r}" for k in sorted(set(settings) | set(got))
                    if settings.get(k) != got.get(k)]
            if diff:
                raise ReplayError(f"extrapolate_dimension: rank {t['rank']} at x={x} ran with other settings than "
                                  f"rank 0 at x={xs[-1]}: {', '.join(diff)}")
    labels = [f"x={x}" for x in xs]
    _check_shape(recs, labels, "extrapolate_dimension", "the dimension")
    return _Fit(recs, xs, value, settings, moe == "fit").traces()


class _Fit:
    """Every rank's events at ``value``, walked field by field through the recordings."""

    def __init__(self, recs: list, xs: list, value: float, settings: dict, fit_moe: bool = False):
        self.recs, self.xs, self.value, self.settings = recs, xs, value, settings
        self.names = _NAMES - {"tokens"} if fit_moe else _NAMES
        self.model = fabric_model(settings)
        self.topology = self.model.topology
        # Lagrange: the value at x of the polynomial through (xs[i], y[i]) is sum(w[i] y[i])
        fx = [Fraction(v) for v in xs]
        at = Fraction(value)
        self.w = []
        for i, xi in enumerate(fx):
            w = Fraction(1)
            for j, xj in enumerate(fx):
                if j != i:
                    w *= (at - xj) / (xi - xj)
            self.w.append(float(w))

    # --- numbers and structure ------------------------------------------------------------
    def refuse(self, where: str, what: str, seen: list) -> ReplayError:
        at = ", ".join(f"{v!r} at {x}" for v, x in zip(seen, self.xs))
        return ReplayError(f"extrapolate_dimension: {where}: {what} ({at}); the program's events must keep their "
                           f"shape as the dimension grows")

    def number(self, ys: list, where: str):
        if all(y == ys[-1] for y in ys):
            return ys[-1]
        v = max(0.0, sum(w * float(y) for w, y in zip(self.w, ys)))
        return int(round(v)) if all(isinstance(y, int) for y in ys) else v

    def walk(self, items: list, where: str, key: str | None = None):
        """``items``: one field in every recording (the last is the template), fitted."""
        last = items[-1]
        if isinstance(last, dict):
            if any(not isinstance(it, dict) or it.keys() != last.keys() for it in items):
                raise self.refuse(where, "the fields differ", [sorted(it) if isinstance(it, dict) else it
                                                                for it in items])
            return {k: self.walk([it[k] for it in items], f"{where}.{k}", k) for k in last}
        if isinstance(last, (list, tuple)):
            if any(not isinstance(it, (list, tuple)) or len(it) != len(last) for it in items):
                raise self.refuse(where, "the lengths differ", [len(it) if isinstance(it, (list, tuple)) else it
                                                                 for it in items])
            return [self.walk([it[i] for it in items], f"{where}[{i}]", key) for i in range(len(last))]
        numeric = [isinstance(it, (int, float)) and not isinstance(it, bool) for it in items]
        if all(numeric) and key not in self.names:
            return self.number(items, where)
        if any(it != last or type(it) is not type(last) for it in items):
            raise self.refuse(where, "it changes with the dimension", items)
        return last

    # --- events ---------------------------------------------------------------------------
    def call(self, calls: list[dict], where: str) -> dict:
        """One call, as every recording has it, at the target."""
        calls = [{k: v for k, v in c.items() if k != "gap_s"} for c in calls]
        if any(c.get("extra") is not None for c in calls):        # no jit mapping: none paid
            for c in calls:
                if c.get("extra") is None:
                    c["extra"] = [0.0] * len(c["members"])
            # a mapping's cost grows with the buffer, but whether one is paid at all is an event:
            # a caching allocator reuses a block at one size and takes a new one at another
            paid = [[x > 0 for x in c["extra"]] for c in calls]
            if any(p != paid[0] for p in paid):
                raise self.refuse(f"{where}.extra", "jit mappings are paid in some recordings only (a buffer the "
                                  "program reuses at one size is new at another), so their costs are not a "
                                  "polynomial; members paying", [sum(p) for p in paid])
        algos = [c.pop("algo", None) for c in calls]
        out = self.walk(calls, where)
        if "routing" in out and self.names is _NAMES:
            self.same_routing(calls, where)
        if algos[-1] is None:
            return out
        auto = self.settings.get("algo")
        if auto == "auto":
            out["algo"] = choose_algo(self.model, out["op"], out["members"], out["nbytes"], 0, out["itemsize"])
            if out.get("extra") is not None and any(a != out["algo"] for a in algos):
                raise self.refuse(f"{where}.algo", f"--algo auto chooses {out['algo']} at {self.value} and the call "
                                  f"made jit mappings, which follow the algorithm", algos)
        elif auto is None and any(a != algos[-1] for a in algos):
            raise self.refuse(f"{where}.algo", "the algorithm changes with the dimension and the traces do not say "
                              "whether --algo auto chose it (record them again)", algos)
        else:
            out["algo"] = self.walk(algos, f"{where}.algo", "op")
        return out

    def same_routing(self, calls: list[dict], where: str) -> None:
        """Refuse an MoE call whose routing differs between the recordings: its rows (the last
        phase's bytes over the row size) and its other phases (headers, records) must be the
        same, only the row size may change (collectives._ep.traffic)."""
        def rows(c):
            payload, row = np.asarray(c["phases"][-1][0], dtype=np.int64), int(c["routing"]["row"])
            if row <= 0 or np.any(payload % row):
                raise self.refuse(f"{where}.phases", f"the last phase is not rows of {row} bytes", [row])
            return payload // row, [np.asarray(b, dtype=np.int64) for b, _ in c["phases"][:-1]]
        got = [rows(c) for c in calls]
        for r, other in got:
            if not np.array_equal(r, got[-1][0]) or any(not np.array_equal(a, b) for a, b in zip(other, got[-1][1])):
                raise self.refuse(f"{where}.phases", "the MoE routing changes with the dimension, as a gate that "
                                  "routes by the activations does, so its traffic is not a polynomial in it (record "
                                  "with a routing that does not depend on the dimension); rows sent in all",
                                  [int(g[0].sum()) for g in got])

    def compute(self, events: list[dict], where: str) -> dict:
        flops = ["flops" in e for e in events]
        if any(f != flops[-1] for f in flops):
            raise self.refuse(where, "charged with FLOPs (comm.charge_kernel) in some recordings only", flops)
        if any("hbm" in e for e in events):
            events = [{"hbm": 0.0, **e} for e in events]
        if not flops[-1]:
            return self.walk(events, where)
        out = self.walk([{k: v for k, v in e.items() if k != "us"} for e in events], where)
        out["us"] = self.topology.kernel_us(out["flops"], out.get("hbm", 0.0))
        return out

    def traces(self) -> list[dict]:
        out = []
        for rank in range(len(self.recs[-1])):
            events = []
            for i, e in enumerate(self.recs[-1][rank]["events"]):
                seen = [r[rank]["events"][i] for r in self.recs]
                where = f"rank {rank}'s event {i} ({e['e']}{' ' + e['op'] if 'op' in e else ''})"
                if e["e"] == "call":
                    events.append(self.call(seen, where))
                elif e["e"] == "issue":
                    issue = self.walk([{k: v for k, v in s.items() if k != "calls"} for s in seen], where)
                    issue["calls"] = [self.call([s["calls"][j] for s in seen], f"{where}, call {j}")
                                      for j in range(len(e["calls"]))]
                    events.append(issue)
                elif e["e"] == "compute":
                    events.append(self.compute(seen, where))
                else:
                    events.append(self.walk(seen, where))
            out.append({"format": FORMAT, "rank": rank, "world": len(self.recs[-1]), "settings": self.settings,
                        "end_us": None, "events": events})
        return out
