"""Fuzzed bad input (hypothesis): a clear exception of the documented class on the rank at
fault, CollectiveMismatch quoting it on its peers, never a hang, never a corrupted later call.

One job runs every example: rank 0 runs hypothesis, and for each example it draws, hands the
case to every rank over the communicator (a broadcast), every rank makes the call (the rank
at fault with its bad argument, the others with good ones), then a good call of the same
operation and a world all_reduce, checked byte for byte; the outcomes come back to rank 0
(an all_gather), which asserts them. A call that hung would end the job with CommTimeout
(the job's timeout is short), a corrupted channel would end it with a wrong case.

    expected, per kind of bad argument (docs/reference.md, "Errors"):
      the rank's own argument is wrong        TypeError / ValueError there, RegistrationError
                                              for a view of released HBM; CollectiveMismatch
                                              naming that rank on its peers
      ranks disagree (each valid on its own)  CollectiveMismatch on every rank
      accepted forms (non-contiguous, read-only input, overlapping in and out, any shape)
                                              no exception; exact bytes
      point to point with a bad rank number   ValueError on that rank alone (no peer is named)
      after finalize()                        NotInitialized, for every operation

Local properties (allocation, ub.view, settings) run as a second hypothesis test on rank 0.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import stratacl
from helpers import attempt
from stratacl import ep

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.timeout(240)

N = 3
EXAMPLES = 20
CHANNEL = 1 << 16          # bytes of a pickled case or outcome
DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "uint16", "uint32",
          "uint64"]
BAD_DTYPES = ["complex64", "complex128", "object", "U3", "M8[s]", "V4", "longdouble", [("a", "i4"), ("b", "f4")]]
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v", "broadcast"]
ARRAYS = {"all_reduce": ["x"], "all_gather": ["out", "x"], "reduce_scatter": ["out", "x"],
          "all_to_all": ["out", "x"], "all_to_all_v": ["out", "x"], "broadcast": ["x"]}
OUTPUT = {"all_reduce": "x", "all_gather": "out", "reduce_scatter": "out", "all_to_all": "out",
          "all_to_all_v": "out", "broadcast": "x"}
DOCUMENTED = {"TypeError", "ValueError", "CollectiveMismatch", "RegistrationError", "NotInitialized"}

not_arrays = st.one_of(st.none(), st.integers(-3, 3), st.floats(allow_nan=False), st.text(max_size=3),
                       st.lists(st.integers(0, 9), max_size=4), st.binary(max_size=8),
                       st.sampled_from(["memoryview", "tuple", "matrix_like"]))
bad_ranks = st.one_of(st.integers(-2**70, -1), st.integers(N, 2**70), st.floats(allow_nan=True),
                      st.none(), st.text(max_size=2), st.just([0]))
bad_counts = st.one_of(
    st.tuples(st.just("negative"), st.integers(-2**63, -1)),
    st.tuples(st.just("huge"), st.integers(2**20, 2**70)),
    st.tuples(st.just("length"), st.integers(0, 2 * N).filter(lambda k: k != N)),
    st.tuples(st.just("float"), st.floats(0.1, 3.9).filter(lambda f: f != int(f))),
    st.tuples(st.just("text"), st.just("1")),
    st.tuples(st.just("none"), st.none()),
    st.tuples(st.just("sum"), st.just(0)))
bad_ops = st.one_of(st.text(max_size=6).filter(lambda s: s.lower() not in ("sum", "prod", "min", "max", "avg")),
                    st.integers(), st.none(), st.just(["sum"]))


def _kinds(op: str) -> list[str]:
    """What may be wrong with a call of ``op``."""
    if op in COLLECTIVES:
        kinds = ["not_array", "bad_dtype", "freed_view", "noncontig", "readonly_input", "any_shape", "disagree",
                 "read_only"]
        if op != "all_reduce" and op != "broadcast":
            kinds += ["dtype_differs", "overlap"] + (["size"] if op != "all_to_all_v" else [])
        if op in ("all_reduce", "reduce_scatter"):
            kinds += ["reduce_op", "avg_int"]
        if op == "broadcast":
            kinds += ["root"]
        if op == "all_to_all_v":
            kinds += ["counts"]
        return kinds
    return {"send": ["not_array", "bad_dtype", "freed_view", "noncontig", "readonly_input"],
            "recv": ["not_array", "bad_dtype", "freed_view", "read_only", "size", "noncontig"],
            "sendrecv": ["not_array", "bad_dtype", "freed_view", "read_only", "size", "noncontig"],
            "p2p_rank": ["send", "recv", "sendrecv_dst"], "split": ["color", "key"],
            "dispatch": ["x_dtype", "x_shape", "x_type", "idx_dtype", "idx_range", "idx_repeat", "idx_rows",
                         "weights"],
            "combine": ["handle", "y_shape", "y_dtype"],
            "low_latency_dispatch": ["too_many", "max_tokens", "idx_range"]}[op]


# every (operation, kind) pair, each given EXAMPLES examples
PAIRS = [(op, kind) for op in COLLECTIVES + ["send", "recv", "sendrecv", "p2p_rank", "split", "dispatch", "combine",
                                             "low_latency_dispatch"] for kind in _kinds(op)]


@st.composite
def cases(draw, op: str, kind: str) -> dict:
    """One call of ``op`` with ``kind`` wrong: the rank at fault, the count, the dtype, the bad value."""
    case = dict(op=op, kind=kind, fault=draw(st.integers(0, N - 1)), count=draw(st.integers(0, 12)),
                dtype=draw(st.sampled_from(DTYPES)))
    if op in COLLECTIVES:
        if kind == "freed_view":
            case["count"] = max(case["count"], 1)       # a view has at least one element
        case["which"] = draw(st.sampled_from(ARRAYS[op]))
        if kind == "not_array":
            case["value"] = draw(not_arrays)
        elif kind == "bad_dtype":
            case["value"] = draw(st.sampled_from(BAD_DTYPES))
        elif kind == "size":
            case["value"] = draw(st.integers(-3, 3).filter(bool))
        elif kind == "reduce_op":
            case["value"] = draw(bad_ops)
        elif kind == "root":
            case["value"] = draw(bad_ranks)
        elif kind == "counts":
            case["value"] = draw(bad_counts)
            case["which"] = draw(st.sampled_from(["send", "recv"]))
        elif kind == "disagree":
            case["value"] = draw(st.sampled_from(["dtype", "count"] + (["root"] if op == "broadcast" else []) +
                                                 (["reduce_op"] if op in ("all_reduce", "reduce_scatter") else [])))
        elif kind == "any_shape":
            case["value"] = draw(st.sampled_from([(1, -1), (-1, 1), (1, 1, -1)]))
    elif op in ("send", "recv", "sendrecv"):
        # the rank at fault sends to (or receives from) the next rank, which posts the matching
        # good call; sendrecv: both halves with that rank
        if case["kind"] == "freed_view":
            case["count"] = max(case["count"], 1)
        if case["kind"] == "not_array":
            case["value"] = draw(not_arrays)
        elif case["kind"] == "bad_dtype":
            case["value"] = draw(st.sampled_from(BAD_DTYPES))
        elif case["kind"] == "size":
            case["value"] = draw(st.integers(-3, 3).filter(bool))
    elif op == "p2p_rank":
        case["value"] = draw(st.one_of(bad_ranks, st.just("self")))
    elif op == "split":
        case["value"] = draw(st.one_of(st.text(max_size=2), st.floats(), st.just([1]), st.just(b"1")))
    else:
        case["value"] = draw(st.integers(-5, 40))
    return case


# --- what every rank does with a case ---------------------------------------------------------
def _values(count: int, dtype, salt: int) -> np.ndarray:
    dt = np.dtype(dtype)
    v = (np.arange(count, dtype=np.int64) * 7 + salt * 13) % 11
    return (v % 2).astype(dt) if dt.kind == "b" else v.astype(dt)


def _hbm(a: np.ndarray) -> np.ndarray:
    h = stratacl.empty(a.shape, a.dtype)
    h[...] = a
    return h


def _not_array(value, like: np.ndarray):
    if value == "memoryview":
        return memoryview(like.tobytes())
    if value == "tuple":
        return tuple(like.tolist())
    if value == "matrix_like":
        class Fake:
            dtype, size, shape, nbytes = like.dtype, like.size, like.shape, like.nbytes
        return Fake()
    return value


def _freed_view(count: int, dtype) -> np.ndarray:
    """A view, at its shared address, of an HBM array that was then freed and its HBM released."""
    dt = np.dtype(dtype)
    big = stratacl.empty((8 << 20,), np.uint8)        # several chunks: the middle ones are released
    addr = big.__array_interface__["data"][0] + (4 << 20)
    v = stratacl.ub.view(addr, (max(count, 1),), dt)
    del big
    import gc
    gc.collect()
    stratacl.empty_cache()
    return v


def _mutate(case: dict, name: str, good: np.ndarray):
    """The rank at fault's version of array argument ``name``."""
    kind, value = case["kind"], case.get("value")
    if kind == "not_array":
        return _not_array(value, good)
    if kind == "bad_dtype":
        try:
            return np.zeros(good.shape, np.dtype(value) if not isinstance(value, list) else np.dtype(value))
        except TypeError:
            return np.zeros(good.shape, object)
    if kind == "freed_view":
        return _freed_view(good.size, good.dtype)
    return good


class Runner:
    """Every rank's side of the cases (the bad call, then the good ones and their checks)."""

    def __init__(self, comm):
        self.comm = comm
        self.buf = ep.Buffer(comm, 2 * comm.size)

    def run(self, case: dict) -> dict:
        op = case["op"]
        bad_call = getattr(self, "_" + op)(case)
        got = attempt(bad_call) if bad_call is not None else "idle"
        wrong: list[str] = []
        self._good(case, wrong)
        return dict(got=got, wrong=wrong)

    # --- the collectives -----------------------------------------------------------------
    def _collective_args(self, case: dict, count: int, dtype, salt: int = 0) -> dict:
        n, me = self.comm.size, self.comm.rank
        op = case["op"]
        if op == "all_reduce":
            return dict(x=_hbm(_values(count, dtype, me + salt)))
        if op == "broadcast":
            return dict(x=_hbm(_values(count, dtype, me + salt)), root=0)
        if op == "all_gather":
            return dict(out=stratacl.zeros((n * count,), dtype), x=_hbm(_values(count, dtype, me + salt)))
        if op == "reduce_scatter":
            return dict(out=stratacl.zeros((count,), dtype), x=_hbm(_values(n * count, dtype, me + salt)))
        if op == "all_to_all":
            return dict(out=stratacl.zeros((n * count,), dtype), x=_hbm(_values(n * count, dtype, me + salt)))
        counts = [(count + i + me) % 3 for i in range(n)]         # all_to_all_v: c[i][j] = (count + j + i) % 3
        recv = [(count + me + j) % 3 for j in range(n)]
        return dict(out=stratacl.zeros((sum(recv) + 2,), dtype), x=_hbm(_values(sum(counts), dtype, me + salt)),
                    send_counts=counts, recv_counts=recv)

    def _invoke(self, op: str, a: dict, reduce_op="sum"):
        c = self.comm
        if op == "all_reduce":
            return lambda: c.all_reduce(a["x"], reduce_op)
        if op == "reduce_scatter":
            return lambda: c.reduce_scatter(a["out"], a["x"], reduce_op)
        if op == "broadcast":
            return lambda: c.broadcast(a["x"], root=a["root"])
        if op == "all_to_all_v":
            return lambda: c.all_to_all_v(a["out"], a["x"], a["send_counts"], a["recv_counts"])
        return lambda: getattr(c, op)(a["out"], a["x"])

    def _bad_collective(self, case: dict):
        op, kind, value = case["op"], case["kind"], case.get("value")
        me, fault = self.comm.rank, case["fault"]
        dtype = case["dtype"]
        if kind == "avg_int" and np.dtype(dtype).kind == "f":
            dtype = "int32"
        a = self._collective_args(case, case["count"], dtype)
        reduce_op = "sum"
        if me != fault:
            return self._invoke(op, a, reduce_op)
        if kind == "avg_int":
            reduce_op = "avg"
        which = case["which"]
        if kind in ("not_array", "bad_dtype", "freed_view"):
            a[which] = _mutate(case, which, a[which])
        elif kind == "dtype_differs":
            other = "float64" if np.dtype(dtype) != np.float64 else "int8"
            a["out"] = stratacl.zeros(a["out"].shape, other)
        elif kind == "size":
            size = a["out"].size + value
            a["out"] = stratacl.zeros((size if size >= 0 else a["out"].size + 1,), dtype)
        elif kind == "read_only":
            a[OUTPUT[op]].flags.writeable = False
        elif kind == "reduce_op":
            reduce_op = value
        elif kind == "root":
            a["root"] = me if value == "self" else value
        elif kind == "counts":
            a = self._bad_counts(case, a)
        elif kind == "disagree":
            if value == "dtype":
                a = self._collective_args(case, case["count"], "float64" if np.dtype(dtype) != np.float64 else "int64")
            elif value == "count":
                a = self._collective_args(case, case["count"] + 1, dtype)
            elif value == "root":
                a["root"] = 1
            else:
                reduce_op = "max"
        elif kind == "noncontig":
            wide = np.zeros(2 * a[which].size, a[which].dtype)
            wide[::2] = a[which]
            a[which] = wide[::2]
        elif kind == "readonly_input":
            if op not in ("all_reduce", "broadcast"):
                a["x"].flags.writeable = False
        elif kind == "any_shape":
            a[which] = a[which].reshape(value) if a[which].size else a[which].reshape(0, 1)
        elif kind == "overlap":
            a = self._overlapping(op, a, dtype)
        if kind in ("noncontig", "readonly_input", "any_shape", "overlap"):
            call, out = self._invoke(op, a, reduce_op), a[OUTPUT[op]]
            return lambda: (call(), self._expect_result(op, case, out))
        return self._invoke(op, a, reduce_op)

    def _expect_result(self, op: str, case: dict, out: np.ndarray) -> None:
        """An accepted form's output holds the bytes of the plain call's (all_to_all_v: its
        received elements; the tail of an overlapping output is the input's)."""
        want = self._expected(op, case["count"], case["dtype"], 0)
        got = np.asarray(out).reshape(-1)
        if op == "all_to_all_v":
            got, want = got[:want.size - 2], want[:-2]
        if got.tobytes() != want.tobytes():
            raise AssertionError(f"{op} ({case['kind']}): wrong bytes {got.tolist()} != {want.tolist()}")

    def _bad_counts(self, case: dict, a: dict) -> dict:
        what, value = case["value"]
        key = "send_counts" if case["which"] == "send" else "recv_counts"
        counts = list(a[key])
        limit = a["x"].size if key == "send_counts" else a["out"].size
        if what in ("negative", "huge"):
            counts[case["count"] % len(counts)] = value if what == "negative" else max(value, limit + 1)
        elif what == "length":
            counts = (counts * 3)[:value]
        elif what == "float":
            counts[0] = value
        elif what == "text":
            counts[0] = "1"
        elif what == "none":
            counts = None
        else:                      # every count fits, their sum does not
            counts = [limit + 1 - (limit + 1) // 2] * len(counts) if limit else [1] * len(counts)
            if sum(counts) <= limit:
                counts[0] = limit + 1
        a[key] = counts
        return a

    def _overlapping(self, op: str, a: dict, dtype) -> dict:
        """An output that overlaps the input (documented to give the bytes of disjoint buffers)."""
        x = a["x"]
        if op in ("all_to_all", "all_to_all_v"):
            if op == "all_to_all":
                a["out"] = x
            else:
                big = stratacl.zeros((x.size + a["out"].size,), dtype)
                big[:x.size] = x
                a["x"], a["out"] = big[:x.size], big[:a["out"].size]
        elif op == "all_gather":
            a["out"][:x.size] = x
            a["x"] = a["out"][:x.size]                      # chunk 0, not this rank's: staged
        elif op == "reduce_scatter":
            a["out"] = x[:a["out"].size]
        return a

    def _all_reduce(self, case):
        return self._bad_collective(case)

    _all_gather = _reduce_scatter = _all_to_all = _all_to_all_v = _broadcast = _all_reduce

    # --- point to point, split, MoE --------------------------------------------------------
    def _p2p_pair(self, case: dict) -> tuple[int, int]:
        n = self.comm.size
        return case["fault"], (case["fault"] + 1) % n

    def _send(self, case):
        c, me = self.comm, self.comm.rank
        fault, partner = self._p2p_pair(case)
        good = _hbm(_values(case["count"], case["dtype"], 1))
        if me == fault:
            x = good
            if case["kind"] == "noncontig":
                wide = np.zeros(2 * good.size, good.dtype)
                wide[::2] = good
                x = wide[::2]
            elif case["kind"] == "readonly_input":
                x.flags.writeable = False
            else:
                x = _mutate(case, "x", good)
            return lambda: c.send(x, partner)
        if me == partner:
            got = stratacl.zeros((case["count"],), case["dtype"])
            return lambda: (c.recv(got, fault), self._expect_values(got, case["count"], case["dtype"], 1))
        return None

    def _recv(self, case):
        c, me = self.comm, self.comm.rank
        fault, partner = self._p2p_pair(case)
        if me == partner:
            return lambda: c.send(_hbm(_values(case["count"], case["dtype"], 2)), fault)
        if me == fault:
            got = self._bad_receive(case)
            return lambda: (c.recv(got, partner), self._expect_values(got, case["count"], case["dtype"], 2))
        return None

    def _bad_receive(self, case: dict):
        good = stratacl.zeros((case["count"],), case["dtype"])
        kind = case["kind"]
        if kind == "read_only":
            good.flags.writeable = False
        elif kind == "size":
            return stratacl.zeros((max(0, case["count"] + case["value"]),), case["dtype"]) \
                if case["count"] + case["value"] >= 0 else stratacl.zeros((case["count"] + 1,), case["dtype"])
        elif kind == "noncontig":
            return np.zeros(2 * case["count"], case["dtype"])[::2]
        elif kind in ("not_array", "bad_dtype", "freed_view"):
            return _mutate(case, "x", good)
        return good

    def _sendrecv(self, case):
        """The rank at fault sendrecvs with the next rank (both directions), receiving into a
        bad buffer; the next rank sendrecvs good buffers."""
        c, me = self.comm, self.comm.rank
        fault, partner = self._p2p_pair(case)
        if me == fault:
            got = self._bad_receive(case)
            x = _hbm(_values(case["count"], case["dtype"], 3))
            return lambda: (c.sendrecv(x, partner, got, partner),
                            self._expect_values(got, case["count"], case["dtype"], 4))
        if me == partner:
            x = _hbm(_values(case["count"], case["dtype"], 4))
            got = stratacl.zeros((case["count"],), case["dtype"])
            return lambda: (c.sendrecv(x, fault, got, fault), self._expect_values(got, case["count"], case["dtype"], 3))
        return None

    def _p2p_rank(self, case):
        c, me = self.comm, self.comm.rank
        if me != case["fault"]:
            return None
        rank = me if case["value"] == "self" else case["value"]
        x = _hbm(_values(3, "int32", 0))
        if case["kind"] == "send":
            return lambda: c.send(x, rank)
        if case["kind"] == "recv":
            return lambda: c.recv(x, rank)
        return lambda: c.sendrecv(x, rank, x, (me + 1) % c.size)

    def _split(self, case):
        c, me = self.comm, self.comm.rank
        color, key = 0, 0
        if me == case["fault"]:
            color, key = (case["value"], 0) if case["kind"] == "color" else (0, case["value"])
        return lambda: c.split(color, key)

    def _expect_values(self, got, count, dtype, salt) -> None:
        want = _values(count, dtype, salt)
        if got.tobytes() != want.tobytes():
            raise AssertionError(f"received bytes differ: {got!r} != {want!r}")

    def _moe_inputs(self, tokens: int):
        me, experts = self.comm.rank, self.buf.num_experts
        x = _values(tokens * 8, "float32", me).reshape(tokens, 8)
        idx = np.array([[(t + me) % experts, (t + me + 1) % experts] for t in range(tokens)], np.int64).reshape(-1, 2)
        w = np.full((tokens, 2), 0.5, np.float32)
        return x, idx, w

    def _dispatch(self, case):
        me, kind, value = self.comm.rank, case["kind"], case["value"]
        x, idx, w = self._moe_inputs(case["count"])
        if me == case["fault"]:
            if kind == "x_dtype":
                x = x.astype(np.float64 if value % 2 else np.int32)
            elif kind == "x_shape":
                x = x.reshape(-1)
            elif kind == "x_type":
                x = x.tolist()
            elif kind == "idx_dtype":
                idx = idx.astype(np.int32)
            elif kind == "idx_range":
                idx = idx.copy()
                idx = np.vstack([idx, [[self.buf.num_experts + abs(value), -1]]]) if value >= 0 else \
                    np.vstack([idx, [[value - 1 if value - 1 < -1 else -2, 0]]])
                x = np.vstack([x, np.zeros((1, 8), np.float32)])
                w = np.vstack([w, np.zeros((1, 2), np.float32)])
            elif kind == "idx_repeat":
                idx = np.vstack([idx, [[1, 1]]])
                x = np.vstack([x, np.zeros((1, 8), np.float32)])
                w = np.vstack([w, np.zeros((1, 2), np.float32)])
            elif kind == "idx_rows":
                idx = np.vstack([idx, [[0, 1]]])
            else:
                w = w.astype(np.float64) if value % 2 else w[:, :1]
        return lambda: self.buf.dispatch(x, idx, w)

    def _low_latency_dispatch(self, case):
        me, kind, value = self.comm.rank, case["kind"], case["value"]
        tokens = case["count"]
        x, idx, _ = self._moe_inputs(tokens)
        cap = 16
        if me == case["fault"]:
            if kind == "too_many":
                x, idx, _ = self._moe_inputs(cap + 1 + abs(value) % 4)
            elif kind == "max_tokens":
                cap = -1 - abs(value) if value % 2 else float(cap)
            else:
                idx = np.vstack([idx, [[self.buf.num_experts + abs(value), -1]]])
                x = np.vstack([x, np.zeros((1, 8), np.float32)])
        return lambda: self.buf.low_latency_dispatch(x, idx, cap)

    def _combine(self, case):
        me, kind, value = self.comm.rank, case["kind"], case["value"]
        x, idx, w = self._moe_inputs(case["count"])
        recv_x, _, _, _, handle = self.buf.dispatch(x, idx, w)
        y = recv_x
        if me == case["fault"]:
            if kind == "handle":
                handle = None if value % 2 else ("handle", value)
            elif kind == "y_shape":
                y = np.zeros((recv_x.shape[0] + 1 + abs(value) % 3, 8), np.float32)
            else:
                y = recv_x.astype(np.float64)
        return lambda: self.buf.combine(y, handle)

    # --- the good calls that follow ---------------------------------------------------------
    def _good(self, case: dict, wrong: list[str]) -> None:
        c, n, me = self.comm, self.comm.size, self.comm.rank
        op = case["op"]
        try:
            if op in COLLECTIVES:
                self._good_collective(op, case, wrong)
            elif op == "dispatch" or op == "combine" or op == "low_latency_dispatch":
                x, idx, w = self._moe_inputs(5)
                recv_x, _, _, _, handle = self.buf.dispatch(x, idx, w)
                out, _ = self.buf.combine(recv_x, handle)
                # each token goes to the ranks of experts t+me and t+me+1: two rows or one
                dests = [len({int(e) // 2 for e in row}) for row in idx]
                want = np.stack([x[t] * np.float32(dests[t]) for t in range(5)])
                if out.tobytes() != want.astype(np.float32).tobytes():
                    wrong.append(f"{op}: the dispatch and combine that followed gave wrong bytes")
            x = stratacl.empty((7,), np.int64)
            x[:] = np.arange(7) + 100 * me
            c.all_reduce(x)
            want = np.arange(7) * n + 100 * sum(range(n))
            if x.tolist() != want.tolist():
                wrong.append(f"the world all_reduce after {op} gave {x.tolist()}")
        except Exception as e:  # noqa: BLE001 - reported as a corrupted later call
            wrong.append(f"a good call after {op} raised {type(e).__name__}: {e}")

    def _good_collective(self, op: str, case: dict, wrong: list[str]) -> None:
        count, dtype = case["count"] + 1, case["dtype"]
        a = self._collective_args(dict(op=op), count, dtype, salt=5)
        self._invoke(op, a)()
        got = a["out"] if "out" in a else a["x"]
        if got.tobytes() != self._expected(op, count, dtype, 5).tobytes():
            wrong.append(f"{op}: the good call after a bad one gave wrong bytes")

    def _expected(self, op: str, count: int, dtype, salt: int) -> np.ndarray:
        """This rank's output of ``op`` on ``_collective_args(count, dtype, salt)``'s arguments."""
        n, me = self.comm.size, self.comm.rank
        size = n * count if op in ("reduce_scatter", "all_to_all") else count
        parts = [_values(size if op != "all_to_all_v" else 0, dtype, r + salt) for r in range(n)]
        if op == "all_reduce":
            want = parts[0]
            for p in parts[1:]:
                want = want + p
        elif op == "broadcast":
            want = parts[0]
        elif op == "all_gather":
            want = np.concatenate(parts)
        elif op == "reduce_scatter":
            want = parts[0][me * count:(me + 1) * count]
            for p in parts[1:]:
                want = want + p[me * count:(me + 1) * count]
        elif op == "all_to_all":
            want = np.concatenate([p[me * count:(me + 1) * count] for p in parts])
        else:
            pieces = []
            for i in range(n):
                sent = [(count + j + i) % 3 for j in range(n)]
                pieces.append(_values(sum(sent), dtype, i + salt)[sum(sent[:me]):sum(sent[:me + 1])])
            want = np.concatenate(pieces + [np.zeros(2, dtype)])
        return np.asarray(want, dtype=dtype)


def expectation(case: dict, rank: int, n: int):
    """What ``rank`` must see from the bad call: None (success), "idle" (not involved), or
    (class names allowed, text its message must contain)."""
    op, kind, fault = case["op"], case.get("kind"), case["fault"]
    name = {"p2p_rank": None}.get(op, op)
    if op == "p2p_rank":
        return (("ValueError",), f"{'send' if kind != 'recv' else 'recv'}: ") if rank == fault else "idle"
    if op in ("send", "recv", "sendrecv"):
        partner = (fault + 1) % n
        if rank not in (fault, partner):
            return "idle"
        if kind in ("noncontig", "readonly_input"):
            return None
        # the bad argument is the send's input (send) or the receive's buffer (recv, sendrecv);
        # the partner's error comes from its own half of the pair
        half, other = ("send", "recv") if op == "send" else ("recv", "send")
        if kind == "size":
            if rank == partner:
                return ("CollectiveMismatch",), f"send: rank {fault} posted a recv that does not match this send"
            return ("CollectiveMismatch",), f"recv: rank {partner} sends "
        if rank == partner:
            return ("CollectiveMismatch",), f"{other}: rank {fault} "
        if kind == "freed_view":
            return ("RegistrationError",), f"{half}: "
        return ("TypeError", "ValueError"), f"{half}: "
    if kind in ("noncontig", "readonly_input", "any_shape", "overlap"):
        return None
    if kind == "disagree":
        return ("CollectiveMismatch",), f"{name}: "
    if rank != fault:
        return ("CollectiveMismatch",), f"rank {fault}"
    if kind == "freed_view":
        return ("RegistrationError",), f"{name}: "
    if kind == "avg_int":
        return ("TypeError",), f"{name}: "
    if op == "split":
        return ("ValueError",), "split: "
    return ("TypeError", "ValueError"), f"{name}: "


# --- the job ----------------------------------------------------------------------------------
def _share(comm, payload: bytes | None, box: np.ndarray) -> bytes | None:
    """Rank 0's payload (None: stop) on every rank, through a broadcast."""
    if comm.rank == 0:
        data = pickle.dumps(payload)
        assert len(data) <= CHANNEL - 8
        box[:8] = np.frombuffer(np.int64(len(data)).tobytes(), np.uint8)
        box[8:8 + len(data)] = np.frombuffer(data, np.uint8)
    comm.broadcast(box, root=0)
    size = int(box[:8].view(np.int64)[0])
    return pickle.loads(box[8:8 + size].tobytes())


def _gather(comm, outcome, box: np.ndarray, every: np.ndarray) -> list:
    data = pickle.dumps(outcome)[:CHANNEL - 8]
    box[:8] = np.frombuffer(np.int64(len(data)).tobytes(), np.uint8)
    box[8:8 + len(data)] = np.frombuffer(data, np.uint8)
    comm.all_gather(every, box)
    rows = every.reshape(comm.size, CHANNEL)
    return [pickle.loads(r[8:8 + int(r[:8].view(np.int64)[0])].tobytes()) for r in rows]


def _check(case: dict, outcomes: list) -> None:
    n = len(outcomes)
    for rank, o in enumerate(outcomes):
        want, got = expectation(case, rank, n), o["got"]
        assert o["wrong"] == [], (rank, o["wrong"])
        if want == "idle" or want is None:
            assert got == want or (want == "idle" and got is None), (rank, got)
            continue
        kinds, text = want
        assert got is not None and got != "idle", f"rank {rank}: no exception, expected {kinds}"
        assert got[0] in kinds, f"rank {rank}: {got[0]}: {got[1]} (expected {kinds})"
        assert text in got[1], f"rank {rank}: {got[1]!r} does not contain {text!r}"


def fuzz_job(comm, examples: int):
    box = stratacl.zeros((CHANNEL,), np.uint8)
    every = stratacl.zeros((comm.size * CHANNEL,), np.uint8)
    runner = Runner(comm)
    seen = []
    if comm.rank == 0:
        def bad_input_is_a_clear_error_and_corrupts_nothing(case):
            _share(comm, case, box)
            outcomes = _gather(comm, runner.run(case), box, every)
            seen.append((case["op"], case.get("kind")))
            _check(case, outcomes)
        try:
            for op, kind in PAIRS:
                settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                         suppress_health_check=list(HealthCheck))(
                    given(case=cases(op, kind))(bad_input_is_a_clear_error_and_corrupts_nothing))()
        finally:
            _share(comm, None, box)
        local_api_properties()
    else:
        while (case := _share(comm, None, box)) is not None:
            _gather(comm, runner.run(case), box, every)
    comm.barrier()
    return seen, after_finalize(comm, runner)


def local_api_properties() -> None:
    """Allocation, ub.view and settings: rank-local, so hypothesis drives them directly."""
    from stratacl import ConfigError, OutOfMemory, RegistrationError

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(shape=st.one_of(st.integers(-2**70, 2**70), st.lists(st.integers(-2**40, 2**40), max_size=4),
                           st.text(max_size=2), st.none(), st.floats()),
           dtype=st.sampled_from(DTYPES + ["complex64", "object", "V3", None, "nonsense"]))
    def allocation(shape, dtype):
        dims = (shape,) if isinstance(shape, int) else tuple(shape) if isinstance(shape, list) else None
        try:
            a = stratacl.empty(shape, dtype)
        except OutOfMemory as e:
            assert dims is not None and min(dims, default=0) >= 0, (shape, str(e))
            assert "out of HBM allocating" in str(e) and "STRATACL_HBM_SIZE" in str(e), str(e)
        except (ValueError, TypeError) as e:
            if dtype == "nonsense":
                assert "nonsense" in str(e), str(e)                    # numpy's own words
            else:
                assert dims is None or min(dims, default=0) < 0 or dtype == "object", (shape, dtype, str(e))
                assert str(e).startswith("empty: "), str(e)
        else:
            assert dims is not None and a.shape == dims and a.dtype == np.dtype(dtype), (shape, dtype, a.shape)
            assert a.nbytes <= stratacl.memory_stats()["reserved_bytes.all.current"] or a.nbytes == 0
        b = stratacl.empty((5,), np.int64)            # the allocator is still consistent
        b[:] = 7
        assert b.tolist() == [7] * 5

    @settings(max_examples=100, deadline=None, database=None, derandomize=True)
    @given(offset=st.integers(-2**64, 2**64), count=st.integers(-3, 2**70))
    def views(offset, count):
        va = stratacl.config.va_base
        try:
            v = stratacl.ub.view(va + offset, (count,), np.uint8)
        except (RegistrationError, ValueError) as e:
            assert str(e).startswith("ub.view: "), str(e)
            if count < 0:
                assert type(e) is ValueError and "negative dimensions" in str(e), str(e)
        else:
            assert v.shape == (count,) and v.__array_interface__["data"][0] == va + offset

    @settings(max_examples=60, deadline=None, database=None, derandomize=True)
    @given(name=st.sampled_from(["timeout", "hbm_size", "registration", "algo", "chunk_size", "nonsense_name"]),
           value=st.one_of(st.text(max_size=4), st.integers(-5, 5)))
    def config(name, value):
        try:
            c = stratacl.Config(**{name: value})
        except ConfigError as e:
            if name == "nonsense_name":
                assert str(e).startswith("unknown setting 'nonsense_name'"), str(e)
            else:
                assert repr(value) in str(e), str(e)                  # the message quotes the value
        else:
            assert name != "nonsense_name", "an unknown setting was accepted"
            got = getattr(c, name)
            assert getattr(stratacl.Config(**{name: got}), name) == got   # what was kept is accepted again

    allocation()
    views()
    config()


def after_finalize(comm, runner) -> list:
    """finalize(), then every operation: NotInitialized each time, nothing hangs."""
    x = stratacl.zeros((4,), np.float32)
    out = stratacl.zeros((4 * comm.size,), np.float32)
    sub = comm.split(0)
    for _ in range(3):
        comm.all_reduce(x)                    # prepared: the next would replay natively
    comm.sendrecv(x, (comm.rank + 1) % comm.size, out[:4], (comm.rank - 1) % comm.size)
    comm.sendrecv(x, (comm.rank + 1) % comm.size, out[:4], (comm.rank - 1) % comm.size)
    comm.barrier()
    stratacl.finalize()
    peer = (comm.rank + 1) % comm.size
    calls = {
        "all_reduce": lambda: comm.all_reduce(x), "all_reduce async": lambda: comm.all_reduce(x, async_op=True),
        "all_gather": lambda: comm.all_gather(out, x), "reduce_scatter": lambda: comm.reduce_scatter(x[:1], x[:comm.size]),
        "all_to_all": lambda: comm.all_to_all(out, out), "all_to_all_v": lambda: comm.all_to_all_v(
            out, x, [0] * comm.size, [0] * comm.size),
        "broadcast": lambda: comm.broadcast(x), "barrier": comm.barrier, "send": lambda: comm.send(x, peer),
        "recv": lambda: comm.recv(x, peer), "sendrecv": lambda: comm.sendrecv(
            x, (comm.rank + 1) % comm.size, out[:4], (comm.rank - 1) % comm.size),
        "split": lambda: comm.split(0), "sub all_reduce": lambda: sub.all_reduce(x),
        "dispatch": lambda: runner.buf.dispatch(*runner._moe_inputs(2)),
        "empty": lambda: stratacl.empty((4,)), "memory_stats": stratacl.memory_stats, "stats": stratacl.stats,
        "empty_cache": stratacl.empty_cache, "ub.view": lambda: stratacl.ub.view(x.__array_interface__["data"][0], (4,),
                                                                                 np.float32),
    }
    return [(name, attempt(fn)) for name, fn in calls.items()]


@pytest.mark.slow
def test_fuzzed_bad_input_never_hangs_nor_corrupts():
    results = stratacl.spawn(fuzz_job, N, args=(EXAMPLES,), timeout=20, hbm_size="256M")
    seen = results[0][0]
    assert set(seen) == set(PAIRS), sorted(set(PAIRS) - set(seen))
    assert len(seen) >= 4 * len(PAIRS)
    for rank, (_, after) in enumerate(results):
        for name, got in after:
            assert got is not None and got[0] == "NotInitialized", (rank, name, got)
