"""stratacl.ep: dispatch and combine, exact bytes on every rank against a plain-Python reference.

Every rank builds every rank's inputs from a seed (``_inputs``), so each checks its own
results against ``_Reference``, which follows the documented semantics token by token with
Python loops, independent of the library's vectorised routing. Cases cover N in {1, 2, 3, 8,
32}, high-throughput and low-latency, float16 and float32, ranks with no tokens, every token
on one expert, -1 entries, staged and zero-copy inputs, naive and balanced partitioning, and
the mte and sdma paths.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import stratacl
from helpers import place
from stratacl import ep
from stratacl.collectives import _ep

pytestmark = pytest.mark.timeout(240)


def _inputs(case: dict, n: int, rank: int):
    """(x [T, H], topk_idx [T, K], topk_weights [T, K]) of ``rank`` in ``case``."""
    rng = np.random.default_rng([case["seed"], rank])
    base, step, mod = case["tokens"]            # T = (base + step * rank) % mod
    t = (base + step * rank) % mod
    h, k, e, dt = case["hidden"], case["topk"], case["experts"], np.dtype(case["dtype"])
    x = rng.standard_normal((t, h)).astype(dt)
    if case.get("one_expert") is not None:
        idx = np.full((t, k), -1, dtype=np.int64)
        idx[:, 0] = case["one_expert"]
    else:
        idx = np.array([rng.permutation(e)[:k] for _ in range(t)], dtype=np.int64).reshape(t, k)
        idx[rng.random((t, k)) < case.get("drop", 0.0)] = -1
    w = rng.random((t, k)).astype(np.float32)
    return x, idx, w


class _Reference:
    """The documented semantics, token by token."""

    def __init__(self, case: dict, n: int):
        self.n, self.local = n, case["experts"] // n
        self.inp = [_inputs(case, n, r) for r in range(n)]

    def owner(self, e: int) -> int:
        return e // self.local

    def dispatch(self, r: int):
        rows, ridx, rw, src = [], [], [], []
        for p, (x, idx, w) in enumerate(self.inp):
            for t in range(x.shape[0]):
                if any(e >= 0 and self.owner(e) == r for e in idx[t]):
                    rows.append(x[t])
                    ridx.append([e - r * self.local if e >= 0 and self.owner(e) == r else -1 for e in idx[t]])
                    rw.append([w[t, k] if ridx[-1][k] >= 0 else np.float32(0) for k in range(idx.shape[1])])
                    src.append((p, t))
        x0, idx0, _ = self.inp[0]
        h, k = x0.shape[1], idx0.shape[1]
        recv_x = np.array(rows, dtype=x0.dtype).reshape(len(rows), h)
        recv_idx = np.array(ridx, dtype=np.int64).reshape(len(rows), k)
        recv_w = np.array(rw, dtype=np.float32).reshape(len(rows), k)
        per_expert = np.array([(recv_idx == e).sum() for e in range(self.local)], dtype=np.int64)
        return recv_x, recv_idx, recv_w, per_expert, src

    def combine(self, me: int, ys: list[np.ndarray]):
        srcs = [self.dispatch(d)[4] for d in range(self.n)]
        x, idx, w = self.inp[me]
        out = np.zeros((x.shape[0], ys[0].shape[1]), dtype=np.float32)
        for t in range(x.shape[0]):
            for d in range(self.n):
                if (me, t) in srcs[d]:
                    out[t] += ys[d][srcs[d].index((me, t))].astype(np.float32)
        cw = np.where(idx >= 0, np.float32(0) + w, np.float32(0)).astype(np.float32)
        return out.astype(ys[0].dtype), cw

    def ll_lists(self, r: int):
        """Per local expert of rank r: the (source, token) pairs, in receive order."""
        lists = [[] for _ in range(self.local)]
        for p, (x, idx, _) in enumerate(self.inp):
            for t in range(x.shape[0]):
                for e in idx[t]:
                    if e >= 0 and self.owner(e) == r:
                        lists[e - r * self.local].append((p, t))
        return lists

    def ll_dispatch(self, r: int):
        lists = self.ll_lists(r)
        return [[self.inp[p][0][t] for p, t in lst] for lst in lists], [len(lst) for lst in lists]

    def ll_combine(self, me: int, ys: list[np.ndarray]):
        x, idx, w = self.inp[me]
        lists = [self.ll_lists(d) for d in range(self.n)]
        out = np.zeros((x.shape[0], ys[0].shape[2]), dtype=np.float32)
        for t in range(x.shape[0]):
            for k in range(idx.shape[1]):
                e = int(idx[t, k])
                if e >= 0:
                    d = self.owner(e)
                    slot = lists[d][e - d * self.local].index((me, t))
                    out[t] += w[t, k] * ys[d][e - d * self.local][slot].astype(np.float32)
        return out.astype(ys[0].dtype)


def _expert_outputs(case: dict, rank: int, shape: tuple, dtype) -> np.ndarray:
    rng = np.random.default_rng([case["seed"], 1000 + rank])
    return rng.standard_normal(shape).astype(dtype)


def _same(name: str, got: np.ndarray, want: np.ndarray, bad: list[str]) -> None:
    want = np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
        bad.append(f"{name}: got {got.dtype} {got.shape}, want {want.dtype} {want.shape}, bytes differ")


def _run_case(comm, case: dict) -> list[str]:
    """Both modes of ``case`` on this rank, every output checked; the list of what differed."""
    n, me = comm.size, comm.rank
    ref = _Reference(case, n)
    buf = ep.Buffer(comm, case["experts"])
    x, idx, w = ref.inp[me]
    bad: list[str] = []
    hbm = case.get("hbm", True)
    path = case.get("path")
    per_rank, per_expert, in_rank = buf.get_dispatch_layout(idx)
    _same("layout per rank", per_rank, [sum(any(e >= 0 and ref.owner(e) == d for e in row) for row in idx)
                                        for d in range(n)], bad)
    _same("layout per expert", per_expert, [(idx == e).sum() for e in range(case["experts"])], bad)
    _same("layout in rank", in_rank, np.array([[any(e >= 0 and ref.owner(e) == d for e in row) for d in range(n)]
                                               for row in idx], dtype=bool).reshape(len(idx), n), bad)
    for rep in range(case.get("repeat", 1)):
        recv_x, recv_idx, recv_w, recv_per_expert, handle = buf.dispatch(
            place(x, hbm), place(idx, hbm), place(w, hbm), path=path)
        want_x, want_idx, want_w, want_pe, _ = ref.dispatch(me)
        _same("dispatch recv_x", recv_x, want_x, bad)
        _same("dispatch recv_topk_idx", recv_idx, want_idx, bad)
        _same("dispatch recv_topk_weights", recv_w, want_w, bad)
        _same("dispatch recv_per_expert", recv_per_expert, want_pe, bad)
        ys = [_expert_outputs(case, d, ref.dispatch(d)[0].shape, x.dtype) for d in range(n)]
        got, got_w = buf.combine(place(ys[me], hbm), handle, path=path)
        want, want_cw = ref.combine(me, ys)
        _same("combine x", got, want, bad)
        _same("combine topk_weights", got_w, want_cw, bad)
        cap = case["max_tokens"]
        rx, count, llh = buf.low_latency_dispatch(place(x, hbm), place(idx, hbm), cap, path=path)
        rows, want_count = ref.ll_dispatch(me)
        _same("ll recv_count", count, np.array(want_count, dtype=np.int64), bad)
        if rx.shape != (case["experts"] // n, n * cap, x.shape[1]):
            bad.append(f"ll recv_x shape {rx.shape}")
        for e, lst in enumerate(rows):
            _same(f"ll recv_x[{e}]", rx[e, :len(lst)], np.array(lst, dtype=x.dtype).reshape(len(lst), x.shape[1]), bad)
        lys = [_expert_outputs(case, 100 + d, rx.shape, x.dtype) for d in range(n)]
        lc = buf.low_latency_combine(place(lys[me], hbm), idx, w, llh, path=path)
        _same("ll combine", lc, ref.ll_combine(me, lys), bad)
        for name, a in (("recv_x", recv_x), ("combined", got), ("ll recv_x", rx), ("ll combined", lc)):
            if a.size and stratacl.runtime._world._RUNTIME.own_segment(a.__array_interface__["data"][0],
                                                                       a.nbytes) is None:
                bad.append(f"{name} is not in this rank's HBM")
    return bad


BASE = dict(seed=1, tokens=(5, 3, 1000), hidden=24, topk=3, experts=0, dtype=np.float32, max_tokens=32)


def _case(n: int, **kw) -> dict:
    c = dict(BASE, experts=2 * n if n > 1 else 4, **kw)
    c["topk"] = min(c["topk"], c["experts"])
    return c


def _each(comm, cases):
    return [(i, bad) for i, c in enumerate(cases) for bad in [_run_case(comm, c)] if bad]


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_dispatch_and_combine_exact_bytes(n):
    cases = [
        _case(n),
        _case(n, dtype=np.float16, hidden=7, drop=0.3, seed=2),
        _case(n, tokens=(0, 9, 18), seed=3, hbm=False, repeat=2),
        _case(n, one_expert=n // 2 * 2 if n > 1 else 1, seed=4, dtype=np.float16),
        _case(n, path="sdma", seed=5, drop=0.2),
    ]
    assert stratacl.spawn(_each, n, args=(cases,), timeout=120) == [[] for _ in range(n)]


@pytest.mark.slow
def test_dispatch_and_combine_exact_bytes_at_32():
    n = 32
    cases = [_case(n, tokens=(0, 1, 5), topk=4, seed=6),
             _case(n, tokens=(3, 0, 1000), topk=2, dtype=np.float16, hidden=5, drop=0.25, seed=7, hbm=False)]
    assert stratacl.spawn(_each, n, args=(cases,), timeout=200) == [[] for _ in range(n)]


def test_naive_partitioning_and_jit_registration_give_the_same_bytes():
    cases = [_case(4, path="sdma", seed=8), _case(4, seed=9)]
    for settings in (dict(partition="naive"), dict(registration="jit"), dict(registration="staged")):
        assert stratacl.spawn(_each, 4, args=(cases,), timeout=120, **settings) == [[]] * 4, settings


def _errors(comm, which: str):
    """Rank 1 (or every rank) passes bad arguments in ``which``; returns (exception type, message)
    per call tried, then whether a following good dispatch still gives exact bytes."""
    n, me = comm.size, comm.rank
    case = _case(n, seed=11)
    ref = _Reference(case, n)
    x, idx, w = ref.inp[me]
    seen = []

    def attempt(fn):
        try:
            fn()
            seen.append(("ok", ""))
        except Exception as e:          # noqa: BLE001 - the test reports what each rank raised
            seen.append((type(e).__name__, str(e)))

    if which == "experts":
        attempt(lambda: ep.Buffer(comm, 3 * n + 1))                      # not a multiple of N
        attempt(lambda: ep.Buffer(comm, 2 * n if me else 4 * n))         # disagreement
        attempt(lambda: ep.Buffer(comm, "8" if me == 1 else 2 * n))      # a wrong type on rank 1
        return seen, True
    buf = ep.Buffer(comm, case["experts"])
    bad_idx = idx.copy()
    if me == 1:
        bad_idx[0, 0] = case["experts"]
    if which == "index":
        attempt(lambda: buf.dispatch(x, bad_idx, w))
        attempt(lambda: buf.low_latency_dispatch(x, bad_idx, 64))
    elif which == "hidden":
        attempt(lambda: buf.dispatch(x[:, :5] if me == 1 else x, idx, w))
    elif which == "max_tokens":
        attempt(lambda: buf.low_latency_dispatch(x, idx, x.shape[0] - 1 if me == 1 else 64))
    elif which == "dtype":
        attempt(lambda: buf.dispatch(x.astype(np.float16) if me == 1 else x, idx, w))
        attempt(lambda: buf.dispatch(x.astype(np.int32) if me == 1 else x, idx, w))
    elif which == "twice":
        twice = idx.copy()
        if me == 1 and twice.shape[1] > 1:
            twice[0, 1] = twice[0, 0]
        attempt(lambda: buf.dispatch(x, twice, w))
    elif which in ("handle", "rows"):
        *_, handle = buf.dispatch(x, idx, w)
        y = _expert_outputs(case, me, ref.dispatch(me)[0].shape, x.dtype)
        if which == "handle":
            attempt(lambda: buf.combine(y, None if me == 1 else handle))
        else:
            attempt(lambda: buf.combine(y[:-1] if me == 1 else y, handle))
    recv_x, *_ = buf.dispatch(x, idx, w)
    return seen, recv_x.tobytes() == ref.dispatch(me)[0].tobytes()


@pytest.mark.parametrize("which, at_fault, others", [
    ("index", ("ValueError", "expert index 8 is outside [-1, 8)"), ("CollectiveMismatch", "rank 1 rejected")),
    ("max_tokens", ("ValueError", "exceed max_tokens_per_rank"), ("CollectiveMismatch", "rank 1 rejected")),
    ("twice", ("ValueError", "picks the same expert twice"), ("CollectiveMismatch", "rank 1 rejected")),
    ("handle", ("TypeError", "handle must be the one"), ("CollectiveMismatch", "rank 1 rejected")),
    ("rows", ("ValueError", "y must be [25, hidden] like the dispatch's recv_x, got shape (24, 24)"),
     ("CollectiveMismatch", "rank 1 rejected")),
])
def test_bad_arguments_raise_on_the_rank_at_fault_and_mismatch_on_its_peers(which, at_fault, others):
    for rank, (seen, still_exact) in enumerate(stratacl.spawn(_errors, 4, args=(which,), timeout=60)):
        assert still_exact, rank
        for kind, message in seen:
            want = at_fault if rank == 1 else others
            assert kind == want[0] and want[1] in message, (rank, kind, message)
            if rank != 1:
                assert at_fault[1] in message      # the peers learn why


@pytest.mark.parametrize("which, label", [("hidden", "hidden size"), ("dtype", "dtype")])
def test_disagreements_raise_collective_mismatch_everywhere(which, label):
    for rank, (seen, still_exact) in enumerate(stratacl.spawn(_errors, 3, args=(which,), timeout=60)):
        assert still_exact, rank
        kind, message = seen[0]
        assert kind == "CollectiveMismatch" and label in message and "no data was moved" in message, (rank, message)
        if which == "dtype":
            assert seen[1] == (("TypeError", "dispatch: x dtype int32 is not supported (supported: float16, float32)")
                               if rank == 1 else ("CollectiveMismatch", seen[1][1])), seen[1]


def test_num_experts_is_checked_on_every_rank():
    for rank, (seen, _) in enumerate(stratacl.spawn(_errors, 3, args=("experts",), timeout=60)):
        assert seen[0] == ("ValueError", "ep.Buffer: num_experts must be a positive multiple of the "
                           "communicator's size 3, got 10"), seen[0]
        assert seen[1][0] == "CollectiveMismatch" and "disagree on num_experts" in seen[1][1]
        assert seen[2][0] == ("TypeError" if rank == 1 else "CollectiveMismatch"), seen[2]


# --- the bench, the model -----------------------------------------------------------------------
def _bench(*args: str, timeout: float = 200) -> subprocess.CompletedProcess:
    exe = shutil.which("stratacl-bench")
    cmd = [exe] if exe else [sys.executable, "-c", "import sys; from stratacl.bench._command import main; sys.exit(main())"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("op, mode", [("dispatch", "ht"), ("combine", "ht"), ("dispatch", "ll"), ("combine", "ll")])
def test_bench_rows_count_bytes_as_deepep_does(op, mode, tmp_path):
    out = tmp_path / "moe.json"
    n, tokens, hidden, topk, experts = 4, (16, 40), 64, 3, 8
    run = _bench(op, "-n", str(n), "--tokens", ",".join(map(str, tokens)), "--hidden", str(hidden), "--topk",
                 str(topk), "--experts", str(experts), "--mode", mode, "--skew", "0.5", "-w", "1", "-i", "2",
                 "--clock", "virtual", "-J", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    for row, t in zip(rows, tokens):
        routes = ep.routing(t, experts, topk, n, 0.5, 0)
        local = experts // n
        if mode == "ht":       # a row per token and destination rank
            received = sum(int(((r[:, :, None] // local) == np.arange(n)).any(axis=1).sum()) for r in routes)
        else:                  # a row per token and expert
            received = sum(int((r >= 0).sum()) for r in routes)
        assert row["count"] == received // n and row["size"] == int(received / n * hidden * 2), row
        assert row["wrong"] == 0 and row["busbw"] == pytest.approx(row["size"] / row["time_us"] / 1e3)
        assert {"mode", "tokens", "hidden", "topk", "experts", "skew", "model_time_us", "model_busbw",
                "core_gap"} <= set(row) and row["model_time_us"] > 0 and row["tokens"] == t


def _modeled(comm, case: dict):
    """This rank's modeled clock (us) before a dispatch, after it, and after its combine."""
    ref = _Reference(case, comm.size)
    buf = ep.Buffer(comm, case["experts"])
    x, idx, w = ref.inp[comm.rank]
    comm.barrier()
    t0 = comm.clock()
    recv_x, *_, handle = buf.dispatch(place(x, True), place(idx, True), place(w, True))
    t1 = comm.clock()
    buf.combine(recv_x, handle)
    return t0 * 1e6, t1 * 1e6, comm.clock() * 1e6


def test_virtual_clock_times_dispatch_and_combine_from_their_traffic():
    from stratacl.runtime.pipeline import EAGER_BYTES
    from stratacl.ub._clock import FabricModel, model_exchange
    n, row = 4, 1024 * 4
    case = _case(n, tokens=(300, 0, 1000), hidden=1024, seed=12)
    t0, t1, t2 = np.array(stratacl.spawn(_modeled, n, args=(case,), timeout=120, clock="virtual")).T
    routes = [_inputs(case, n, r)[1] for r in range(n)]
    model = FabricModel("cm384", "roa", eager_bytes=EAGER_BYTES)
    dispatch, received, _ = _ep.traffic("dispatch", "ht", routes, case["experts"], row)
    combine, _, _ = _ep.traffic("combine", "ht", routes, case["experts"], row)
    assert received.sum() > 0
    # every member times each call from the same traffic and every member's entering clock
    assert np.allclose(t1, model_exchange(model, range(n), dispatch, t0), rtol=0, atol=1e-6)
    assert np.allclose(t2, model_exchange(model, range(n), combine, t1), rtol=0, atol=1e-6)


def _modeled_ll(comm, case: dict):
    """As ``_modeled``, for a low-latency dispatch and its combine (max tokens: the largest T)."""
    ref = _Reference(case, comm.size)
    buf = ep.Buffer(comm, case["experts"])
    x, idx, w = ref.inp[comm.rank]
    cap = max(len(t[0]) for t in ref.inp)
    comm.barrier()
    t0 = comm.clock()
    recv_x, _, handle = buf.low_latency_dispatch(place(x, True), place(idx, True), cap)
    t1 = comm.clock()
    buf.low_latency_combine(recv_x, place(idx, True), place(w, True), handle)
    return t0 * 1e6, t1 * 1e6, comm.clock() * 1e6


@pytest.mark.parametrize("registration", ["roa", "staged"])
def test_virtual_clock_times_low_latency_calls_row_by_row_as_the_estimate_does(registration):
    """A low-latency dispatch and combine under the virtual clock: the modeled times are the
    estimate path's (the same row-granular traffic and, staged, the row-by-row copies), and
    they are not what the same traffic costs as one bulk phase."""
    from stratacl.runtime.pipeline import EAGER_BYTES
    from stratacl.ub._clock import FabricModel, model_exchange
    n, row = 4, 1024 * 4
    case = _case(n, tokens=(300, 0, 1000), hidden=1024, seed=12)
    t0, t1, t2 = np.array(stratacl.spawn(_modeled_ll, n, args=(case,), timeout=120, clock="virtual",
                                         registration=registration)).T
    routes = [_inputs(case, n, r)[1] for r in range(n)]
    model = FabricModel("cm384", registration, eager_bytes=EAGER_BYTES)
    dispatch, received, st_d = _ep.traffic("dispatch", "ll", routes, case["experts"], row)
    combine, _, st_c = _ep.traffic("combine", "ll", routes, case["experts"], row)
    assert received.sum() > 0
    assert np.allclose(t1, model_exchange(model, range(n), dispatch, t0, None, st_d), rtol=0, atol=1e-6)
    assert np.allclose(t2, model_exchange(model, range(n), combine, t1, None, st_c), rtol=0, atol=1e-6)
    # as bulk (the kinds without their row size, the copies without theirs) the call is faster
    bulk = [(b, k % _ep.KIND_CODES) for b, k in dispatch]
    assert np.all(model_exchange(model, range(n), bulk, t0, None, st_d[:2]) - t0 < t1 - t0)
    if registration == "staged":       # the copies row by row cost more than one bulk copy each
        assert len(st_d) == 4 and np.all(model_exchange(model, range(n), dispatch, t0, None, st_d[:2]) - t0 < t1 - t0)


@pytest.mark.slow
def test_low_latency_rows_pay_their_latency_and_setup_high_throughput_streams_do_not():
    """The mechanism behind Table 2's HT/LL columns: the same bytes cost more as rows, each its
    own transfer (latency + cores.transfer_us each) than as a bulk stream, and more still with
    a larger per-transfer setup; the bulk phase does not depend on the setup at all."""
    import copy

    from stratacl.runtime.pipeline import EAGER_BYTES
    from stratacl.ub import _topology
    from stratacl.ub._clock import FabricModel, advance

    def model(transfer_us):
        d = copy.deepcopy(_topology._CM384)
        d["cores"]["transfer_us"] = transfer_us
        return FabricModel(_topology.from_dict(d), eager_bytes=EAGER_BYTES)

    # two dies of one NPU, each pulling 256 rows of 14 KiB from the other: the cores, not the
    # die-to-die link, bound the rows
    row = 7168 * 2
    b = np.array([[0, 256 * row], [256 * row, 0]], dtype=np.int64)

    def time(m, kind):
        return float(advance(m.plan_exchange((0, 1), [(b, kind)]), np.zeros(2)).max())
    bulk = time(model(0.5), _ep.T_LOAD)
    rows = time(model(0.5), _ep.rows_kind(_ep.T_LOAD, row))
    assert rows > 1.15 * bulk
    assert time(model(1.0), _ep.rows_kind(_ep.T_LOAD, row)) > rows
    assert time(model(1.0), _ep.T_LOAD) == bulk
    # Table 2's LL columns then fall below its HT columns, by more where the naive policy
    # leaves some cores two peers' rows (core-bound) than where LPT spreads them
    common = dict(nranks=32, tokens=256, hidden=7168, topk=8, experts=256)
    for op in ("dispatch", "combine"):
        for reg, part in (("staged", "naive"), ("roa", "naive"), ("roa", "balanced")):
            ht = ep.estimate(op, mode="ht", registration=reg, partition=part, **common)
            ll = ep.estimate(op, mode="ll", registration=reg, partition=part, **common)
            assert ll.busbw < (0.9 if part == "naive" else 1.0) * ht.busbw, (op, reg, part, ll.busbw, ht.busbw)


def test_a_negative_row_setup_is_refused_naming_the_field():
    import copy

    from stratacl._errors import ConfigError
    from stratacl.ub import _topology
    d = copy.deepcopy(_topology._CM384)
    d["cores"]["transfer_us"] = -0.1
    with pytest.raises(ConfigError, match="cores.'transfer_us'"):
        _topology.from_dict(d)
    assert "0.5 us to set up each row" in _topology.load("cm384").describe()


def test_routing_skew_shows_as_a_core_gap_for_naive_partitioning_not_balanced():
    common = dict(nranks=32, tokens=512, hidden=7168, topk=8, experts=256, skew=0.8, seed=3)
    for op in ("dispatch", "combine"):
        naive = ep.estimate(op, partition="naive", **common)
        balanced = ep.estimate(op, partition="balanced", **common)
        # the worst rank's gap: most of a core's time idle under naive pinning, within 5% under
        # LPT (the paper's Fig. 16 bound)
        assert naive.core_gap > 0.5 and balanced.core_gap < 0.05, (op, naive.core_gap, balanced.core_gap)
        assert balanced.time_us < naive.time_us


@pytest.mark.parametrize("experts, topk", [(8, 4), (32, 8), (256, 8)])
@pytest.mark.parametrize("imbalance", [1.05, 1.2, 1.8])
def test_a_shared_skew_gives_the_expert_loads_the_imbalance_asked_for(experts, topk, imbalance):
    """ep.skew_for's exponent, drawn with one popularity order on every rank (shared=True),
    gives expert loads over many tokens whose max / mean is the imbalance asked for (the draw's
    own noise aside); per-rank orders at the same exponent balance out over the ranks."""
    skew = ep.skew_for(imbalance, experts, topk)
    tokens = 400_000 // experts * experts // 8
    shared = ep.routing(tokens, experts, topk, 8, skew, 11, shared=True)
    load = np.bincount(np.concatenate(shared).ravel(), minlength=experts)
    noise = 4 * np.sqrt(load.mean()) / load.mean()          # four standard deviations of one expert's count
    assert abs(load.max() / load.mean() - imbalance) < 0.02 + noise, (load.max() / load.mean(), imbalance)
    # every rank the same hot experts: each rank's own loads are as uneven as the whole batch's
    hot = int(np.argmax(load))
    assert all(np.bincount(r.ravel(), minlength=experts).argmax() == hot for r in shared) or imbalance < 1.5
    if imbalance >= 1.5:        # below, a noise this size can hide the difference: no draw needed
        apart = ep.routing(tokens, experts, topk, 8, skew, 11)
        spread = np.bincount(np.concatenate(apart).ravel(), minlength=experts)
        assert spread.max() / spread.mean() < load.max() / load.mean()
    assert ep.skew_for(1.0, experts, topk) == 0.0
    assert ep.skew_for(imbalance, experts, topk) < ep.skew_for(imbalance + 0.1, experts, topk)


def test_skew_for_refuses_what_no_draw_can_give():
    with pytest.raises(ValueError, match="at least 1"):
        ep.skew_for(0.9, 16, 4)
    with pytest.raises(ValueError, match="picks every expert"):
        ep.skew_for(1.5, 4, 4)
    with pytest.raises(ValueError, match="cannot reach"):
        ep.skew_for(2.5, 8, 4)                 # top-4 of 8: an expert's load is at most 2x the mean
    # without shared, the draws are the ones routing made before shared existed
    assert [r.tolist() for r in ep.routing(5, 16, 4, 2, 0.7, 3)] == \
        [r.tolist() for r in ep.routing(5, 16, 4, 2, 0.7, 3, shared=False)]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_combine_kernel_rounds_as_numpy_does_step_by_step(dtype, weighted):
    """_kernels.combine (vectorised where the CPU has AVX2 and F16C, with a scalar tail) against
    numpy's float32 w * x then acc + that, row by row, and the cast back: the same bits, for
    hidden sizes on and off the 8-lane width, with infinities, NaN, signed zeros and values
    that overflow float16."""
    from stratacl.collectives import _kernels, _reduce
    rng = np.random.default_rng(7)
    for hidden in (1, 7, 8, 13, 1024):
        tokens, nrows = 9, 60
        scale = rng.choice([1e-6, 1.0, 300.0, 6e4], (nrows, 1))
        with np.errstate(over="ignore"):
            rows = (rng.standard_normal((nrows, hidden)) * scale).astype(np.float32).astype(dtype)
        rows.reshape(-1)[rng.integers(0, rows.size, 5)] = [np.inf, -np.inf, np.nan, 0.0, -0.0]
        token = rng.integers(-1, tokens, nrows).astype(np.int64)
        weight = (rng.random(nrows) * 3).astype(np.float32) if weighted else None
        acc = np.zeros((tokens, hidden), np.float32)
        with np.errstate(all="ignore"):
            for r in range(nrows):
                if token[r] >= 0:
                    x = rows[r].astype(np.float32)
                    acc[token[r]] = acc[token[r]] + (weight[r] * x if weighted else x)
            want = acc.astype(dtype)
        got = np.full((tokens, hidden), 1, dtype)
        acc = np.full(tokens * hidden + 3, np.nan, np.float32)        # scratch: its old contents must not matter
        _kernels.combine(got, rows, token, weight, _reduce.DTYPES[np.dtype(dtype)], acc)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan), hidden
        assert got[~nan].tobytes() == want[~nan].tobytes(), hidden
