"""``stratacl.ep.Buffer``: MoE dispatch and combine on a communicator, pull mode, zero copy.

One call, on every rank of the communicator (collectives/_ep.py has the routing and the slices):

    checks and routing          local: the arguments, each token's destinations, this rank's
        |                       routing block written into its HBM (header + records)
    entry (runtime protocol)    descriptor: the dtype (compared natively), the token rows
        |                       (zero copy if in HBM, else staged), and in its extension
        |                       words the routing block's address and segment, T, H, K and
        |                       the mode's parameter; a rank that rejects its arguments tells
        |                       its peers why, as every collective does
    agreement                   hidden size, top-k, max tokens per rank: CollectiveMismatch
        |                       on every rank, before any byte moves
    phase A  headers            every member's counts (tokens per member, per expert)
    phase B  records            the records addressed to this rank
    phase C  rows               token rows pulled straight from the senders' buffers
        |                       (combine: the owners pull the destinations' output rows)
    departure barrier           inputs and routing blocks may be reused
    combine: reduce locally     float32, destinations ascending (HT) or k ascending,
                                weighted (LL); cast to the rows' dtype

Every phase is a remote-slice plan run by the communicator's backend (the cores, or the SDMA
engine on ``path='sdma'``), counted like the collectives' phases. Under a modeled clock every
member times the call from the same traffic matrices (collectives/_ep.py, dispatch_traffic and
combine_traffic; ub/_clock.py, plan_exchange): the fabric's contention, and each member's
transfers per peer cut into units and partitioned over its cores (naive or balanced).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from .._errors import CollectiveMismatch
from .._operators import OPERATORS
from ..collectives import Plan, combine, dtype_code, ep_slices
from ..runtime import Pipeline, pipeline
from ..runtime.pipeline import buffer_size

DTYPES = (np.dtype(np.float16), np.dtype(np.float32))
# extension words of an ep descriptor: the routing block (address, segment va, size, offset,
# epoch), then T, H, K, the mode's parameter (low-latency: max tokens per rank; combine: the
# dispatch call it combines)
E_ADDR, E_VA, E_SIZE, E_OFF, E_EPOCH, E_TOKENS, E_HIDDEN, E_TOPK, E_PARAM, E_WORDS = range(10)
assert E_WORDS <= Pipeline.EXT_WORDS
# where the operator table tells the carriers (across hosts) peers read the routing block
assert all(op.read_block == (0, E_ADDR) for op in OPERATORS if op.family == "ep")


@dataclasses.dataclass(frozen=True)
class Handle:
    """What a dispatch leaves for its combine (pass it back unchanged).

    ``counts[p, d]``: tokens member p sent to member d (high-throughput) or to expert d
    (low-latency); ``tokens_all``: every member's tokens; ``sent``: this rank's tokens as it sent
    them, destination by destination ascending, each destination's in token order
    (high-throughput); ``slots``: [T, K] each (token, k)'s row in its expert's receive
    rows, -1 where no expert (low-latency)."""
    buffer_id: int
    call: int
    mode: str
    tokens: int
    received: int
    counts: np.ndarray
    tokens_all: np.ndarray          # every member's tokens in the dispatch
    topk_idx: np.ndarray
    sent: np.ndarray | None = None
    weights: np.ndarray | None = None
    slots: np.ndarray | None = None
    max_tokens: int = 0


def _check_rows(x: Any, what: str, operation: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{operation}: {what} must be a numpy array, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"{operation}: {what} dtype {x.dtype} is not supported (supported: float16, float32)")
    return x


class Buffer:
    """Expert-parallel dispatch and combine over ``comm`` (DeepEP's names and return order).

    Experts ``[r * E / N, (r + 1) * E / N)`` live on rank r. Collective: every rank of ``comm``
    makes its Buffer with the same ``num_experts``, which must divide by the size.
    Host-blocking; every operation takes ``async_op=True`` (returns a ``Work`` whose
    ``result()`` is the operation's return value) and ``path='mte'|'sdma'``, as the
    collectives do.
    """

    _ids = 0

    def __init__(self, comm, num_experts: int):
        self.comm = comm
        self._pipe = pipeline(comm)      # every call runs through the communicator's pipeline
        n = comm.size
        ok = isinstance(num_experts, (int, np.integer)) and not isinstance(num_experts, bool)
        mine = np.array([int(num_experts) if ok else -1], dtype=np.int64)
        every = np.zeros(n, dtype=np.int64)
        comm.all_gather(every, mine)
        if not ok:
            raise TypeError(f"ep.Buffer: num_experts must be an int, got {type(num_experts).__name__}")
        if (every != every[0]).any():
            raise CollectiveMismatch(f"ep.Buffer: ranks disagree on num_experts ({_by_value(every, comm.members)})")
        if num_experts <= 0 or num_experts % n:
            raise ValueError(f"ep.Buffer: num_experts must be a positive multiple of the communicator's size "
                             f"{n}, got {num_experts}")
        self.num_experts = int(num_experts)
        self.num_local_experts = self.num_experts // n
        Buffer._ids += 1
        self._id = Buffer._ids
        self._calls = 0
        self._block: np.ndarray | None = None        # this rank's routing block (HBM)
        self._ready = np.full((n, 2), -1, dtype=np.int64)      # peers' routing blocks mapped here
        self._last_plan: dict[str, tuple[bytes, Plan]] = {}   # each operation's last row plan
        self._spare: dict[str, np.ndarray] = {}      # scratch kept across calls (_scratch)

    def __repr__(self) -> str:
        return (f"ep.Buffer(rank={self.comm.rank}, size={self.comm.size}, num_experts={self.num_experts})")

    # --- layout ---------------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens to each rank [N], tokens to each expert [E], token t goes to rank r [T, N]
        bool) of this rank's ``topk_idx`` [T, K] (int64, -1: no expert). Local."""
        idx = self._check_idx(topk_idx, "get_dispatch_layout")
        self._header(idx, "get_dispatch_layout")
        r = ep_slices.route(idx, self.comm.size, self.num_experts)
        return r.per_rank, r.per_expert, r.dest

    # --- high throughput ------------------------------------------------------------------
    def dispatch(self, x: np.ndarray, topk_idx: np.ndarray, topk_weights: np.ndarray, *,
                 async_op: bool = False, path: str | None = None):
        """Send each token row of ``x`` [T, H] once to every rank holding one of its experts.

        Returns ``(recv_x, recv_topk_idx, recv_topk_weights, recv_per_expert, handle)``:
        the rows received (HBM, [R, H]), grouped by source rank ascending, each source's in
        its token order; their expert ids local to this rank (global - rank * E / N) where the
        expert is here, else -1; the matching weights, 0 where -1; the tokens each local
        expert received; and the handle ``combine`` needs. Collective."""
        return self._call("dispatch", lambda: self._dispatch("dispatch", x, topk_idx, topk_weights, 0),
                          async_op, path)

    def combine(self, y: np.ndarray, handle: Handle, *, async_op: bool = False, path: str | None = None):
        """Return each token's rows to its owner: ``y`` shaped like the dispatch's ``recv_x``.

        Returns ``(combined_x, combined_topk_weights)``: per own token, the sum of the rows
        the destination ranks returned for it, added in destination-rank order, accumulated
        in float32 from 0 and cast to ``y.dtype``; and its weights summed the same way (the
        weight where the expert exists, 0 where -1). Collective."""
        return self._call("combine", lambda: self._combine("combine", y, handle, None, None), async_op, path)

    # --- low latency ----------------------------------------------------------------------
    def low_latency_dispatch(self, x: np.ndarray, topk_idx: np.ndarray, max_tokens_per_rank: int, *,
                             async_op: bool = False, path: str | None = None):
        """Send each token row to each of its experts: ``(recv_x, recv_count, handle)``.

        ``recv_x`` [E / N, N * max_tokens_per_rank, H] (HBM): for local expert e, the tokens
        that picked it, grouped by source rank ascending, in token order, packed from row 0
        (rows past ``recv_count[e]`` are undefined). More tokens than ``max_tokens_per_rank``
        is a ValueError on that rank (CollectiveMismatch on the others). Collective."""
        return self._call("low_latency_dispatch", lambda: self._dispatch(
            "low_latency_dispatch", x, topk_idx, None, max_tokens_per_rank), async_op, path)

    def low_latency_combine(self, y: np.ndarray, topk_idx: np.ndarray, topk_weights: np.ndarray, handle: Handle,
                            *, async_op: bool = False, path: str | None = None):
        """Per own token, the sum over k in order of ``topk_weights[t, k] * y[e_k][slot]`` for
        the experts it picked, in float32 from 0, cast to ``y.dtype`` (``y`` shaped like the
        low-latency ``recv_x``; ``topk_idx`` the dispatched one). Collective."""
        return self._call("low_latency_combine", lambda: self._combine(
            "low_latency_combine", y, handle, topk_idx, topk_weights), async_op, path)

    # --- the calls ------------------------------------------------------------------------
    def _call(self, operation: str, body: Callable[[], Any], async_op: bool, path: str | None):
        return self._pipe.call(operation, body, async_op, path)

    def _check_idx(self, topk_idx: Any, operation: str, tokens: int | None = None) -> np.ndarray:
        """``topk_idx`` as a C-contiguous array after the checks of its type and shape (the
        values are the routing's: ``_header``)."""
        if not isinstance(topk_idx, np.ndarray) or topk_idx.ndim != 2:
            raise TypeError(f"{operation}: topk_idx must be a 2-D numpy array [tokens, K]")
        if topk_idx.dtype != np.int64:
            raise TypeError(f"{operation}: topk_idx must be int64, got {topk_idx.dtype}")
        t, k = topk_idx.shape
        if tokens is not None and t != tokens:
            raise ValueError(f"{operation}: topk_idx has {t} rows for {tokens} tokens")
        if k > self.num_experts:
            raise ValueError(f"{operation}: top-{k} exceeds the {self.num_experts} experts")
        return np.ascontiguousarray(topk_idx)

    def _header(self, idx: np.ndarray, operation: str) -> np.ndarray:
        """The routing's header (collectives/_ep.py, header), its values checked: each in
        [-1, E), no expert twice in one token."""
        try:
            return ep_slices.header(idx, self.comm.size, self.num_experts)
        except ValueError as e:
            raise ValueError(f"{operation}: {e}") from None

    def _routing_block(self, head: np.ndarray, idx: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This rank's routing block of the call, written into its HBM (grown as needed), and
        each record's token (collectives/_ep.py, write_block)."""
        words = ep_slices.block_words(head, self.comm.size, idx.shape[1])
        if self._block is None or self._block.size < words:
            self._block = None
            self._block = self._pipe.empty((buffer_size(words * 8) // 8,), np.int64)
        return self._block, ep_slices.write_block(self._block, head, idx, weights, self.comm.size)

    def _enter(self, operation: str, dtype_code: int, inp, block, tokens: int, hidden: int, topk: int,
               param: int, error: BaseException | None) -> tuple[int, np.ndarray]:
        """Publish, arrive, agree (see the module docstring); returns the call's parity and
        every member's extension words [n, E_WORDS]."""
        comm, pipe = self.comm, self._pipe
        if error is not None:
            pipe.reject(operation, error)       # raises, after the peers learned why
        ext = np.zeros(E_WORDS, dtype=np.int64)
        if block is not None:
            ext[E_ADDR:E_EPOCH + 1] = pipe.block(block)
        ext[E_TOKENS:E_WORDS] = (tokens, hidden, topk, param)
        parity = pipe.enter(operation, dtype_code, inp, ext)
        every = pipe.extensions(parity)[:, :E_WORDS]
        agree = every[:, E_HIDDEN:E_WORDS]
        if (agree != agree[0]).any():
            for word, what in ((E_HIDDEN, "hidden size"), (E_TOPK, "top-k"), (E_PARAM, _PARAM_NAMES[operation])):
                col = every[:, word]
                if (col != col[0]).any():
                    raise CollectiveMismatch(f"{operation}: ranks disagree on the {what} "
                                             f"({_by_value(col, comm.members)}); no data was moved")
        return parity, every

    def _blocks_ready(self, operation: str, every: np.ndarray) -> None:
        """Every member's routing block mapped here and named in the SCRATCH row of the bases."""
        stale = (self._ready[:, 0] != every[:, E_VA]) | (self._ready[:, 1] != every[:, E_EPOCH])
        stale[self.comm.rank] = False
        for i in np.flatnonzero(stale).tolist():
            va, epoch = int(every[i, E_VA]), int(every[i, E_EPOCH])
            self._pipe.block_ready(operation, i, va, int(every[i, E_SIZE]), int(every[i, E_OFF]), epoch)
            self._ready[i] = va, epoch
        self._pipe.name_scratch(every[:, E_ADDR])

    def _phase(self, operation: str, key: tuple, build, out: np.ndarray) -> None:
        """Run one phase into ``out`` (this rank's OUT) on the call's path, counted; its plan
        compiled once per ``key`` (the communicator's plan cache)."""
        pipe = self._pipe
        pipe.run(operation, pipe.phase(key, lambda: [build()]), out)

    def _rows(self, operation: str, plan: Plan, out: np.ndarray) -> None:
        """Run the row phase into ``out`` (HBM): straight into it, or, staged (registration
        ``staged``), into a communication buffer copied out after, as the collectives do."""
        pipe = self._pipe
        flat = out.reshape(-1)
        target = pipe.output(flat)
        pipe.run(operation, plan, target)
        pipe.output_done(flat, target)

    def _routing(self, mode: str, tokens: np.ndarray, topk: int, row: int, dispatch: int) -> dict:
        """What made a call's traffic, for its trace record (``ub.extrapolate`` draws a routing
        of this shape at another rank count): the mode, every member's tokens, top-k, the
        experts, a row's bytes, and which dispatch of this Buffer (a combine: the one it undoes)."""
        return {"buffer": self._id, "dispatch": int(dispatch), "mode": mode, "tokens": [int(t) for t in tokens],
                "topk": int(topk), "experts": self.num_experts, "row": int(row)}

    def _scratch(self, name: str, shape: tuple, dtype) -> np.ndarray:
        """A scratch array used within one call (the rows a combine pulls, its float32
        accumulator), kept across calls and grown as needed: a new one per call would fault in
        every page again, which at a few hundred rows costs more than the work on them."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        spare = self._spare.get(name)
        if spare is None or spare.size < nbytes:
            spare = self._spare[name] = np.empty(nbytes, dtype=np.uint8)
        return spare[:nbytes].view(dtype).reshape(shape)

    def _reduced(self, rows: np.ndarray, token: np.ndarray, weight: np.ndarray | None, tokens: int,
                 code: int) -> np.ndarray:
        """A combine's result in a new HBM array [tokens, hidden]: per token, the float32 sum from
        0 of its ``rows`` (``token[r]``: row r's token, -1 none), each times ``weight[r]`` if
        given, in row order, cast to the rows' dtype (native: collectives/_kernels.c, combine);
        through a communication buffer when staged."""
        pipe = self._pipe
        out = pipe.empty((tokens, rows.shape[-1]), rows.dtype)
        flat = out.reshape(-1)
        target = pipe.output(flat)
        combine(target.reshape(out.shape), rows.reshape(-1, rows.shape[-1]),
                np.ascontiguousarray(token, dtype=np.int64), weight, code,
                self._scratch("acc", (out.size,), np.float32))
        pipe.output_done(flat, target)
        return out

    def _row_plan(self, operation: str, key: bytes, build) -> Plan:
        """The row phase of this call compiled: the operation's last one when its routing was
        the same (``key``: everything the phase is built from; ``build()`` its slices)."""
        last = self._last_plan.get(operation)
        if last is not None and last[0] == key:
            return last[1]
        plan = self._pipe.compile(build())
        self._last_plan[operation] = (key, plan)
        return plan

    def _dispatch(self, operation: str, x, topk_idx, topk_weights, max_tokens: int):
        comm, pipe = self.comm, self._pipe
        n, me, L = comm.size, comm.rank, self.num_local_experts
        low_latency = operation == "low_latency_dispatch"
        error = inp = block = sent = None
        code = tokens = hidden = topk = 0
        try:
            _check_rows(x, "x", operation)
            if x.ndim != 2:
                raise ValueError(f"{operation}: x must be 2-D [tokens, hidden], got shape {x.shape}")
            tokens, hidden = x.shape
            idx = self._check_idx(topk_idx, operation, tokens)
            topk = idx.shape[1]
            if low_latency:
                if not isinstance(max_tokens, (int, np.integer)) or max_tokens < 0:
                    raise ValueError(f"{operation}: max_tokens_per_rank must be a non-negative int, "
                                     f"got {max_tokens!r}")
                if tokens > max_tokens:
                    raise ValueError(f"{operation}: {tokens} tokens exceed max_tokens_per_rank={max_tokens}")
                weights = np.zeros(idx.shape, dtype=np.float32)
            else:
                weights = _check_weights(topk_weights, idx.shape, operation)
            pipe.check_path(operation)
            code = dtype_code(x.dtype, operation)
            block, sent = self._routing_block(self._header(idx, operation), idx, weights)
            inp = pipe.input(x, operation)
        except Exception as e:
            error = e
        parity, every = self._enter(operation, code, inp, block, tokens, hidden, topk, int(max_tokens), error)
        self._calls += 1
        self._blocks_ready(operation, every)
        head = ep_slices.header_words(n, self.num_experts)
        heads = np.empty((n, head), dtype=np.int64)
        self._phase(operation, ("ep_headers", head), lambda: ep_slices.headers(me, n, head), heads)
        counts, per_expert = heads[:, :n], heads[:, n:]
        words = ep_slices.record_words(topk)
        rec = np.empty(int(counts[:, me].sum()) * words, dtype=np.int64)
        self._phase(operation, ("ep_records", head, words, counts.tobytes()),
                    lambda: ep_slices.records(me, counts, head, words), rec)
        sources = counts[:, me]
        pipe.sources_ready(operation, parity, inp.addr, need=(sources > 0).astype(np.int64))
        row = hidden * x.itemsize
        # under a modeled clock: the call's traffic, and the bytes a staged call copies
        timed = pipe.timed
        if timed:
            rows_in = ep_slices.rows_to_members(per_expert, n) if low_latency else counts
            staging = ep_slices.staging(operation, every[:, E_TOKENS], rows_in.sum(axis=0), row)
        cap = n * max_tokens if low_latency else -1
        tids, got_idx, got_w, got_per_expert, smap = ep_slices.received(me, rec, sources, topk, L, row, cap)
        # the row plan: the operation's last one when the records are the same
        plan = self._row_plan(operation, rec.tobytes() + sources.tobytes() + bytes(str((n, row, cap)), "ascii"),
                              lambda: smap)
        if low_latency:
            recv_x = pipe.empty((L, cap, hidden), x.dtype)
            self._rows(operation, plan, recv_x)
            pipe.finish(operation)
            if timed:
                pipe.tick(operation, parity, ep_slices.dispatch_traffic(counts, per_expert, topk, row, True),
                                    staging, self._routing("ll", every[:, E_TOKENS], topk, row, self._calls))
            handle = Handle(self._id, self._calls, "ll", tokens, int(got_per_expert.sum()), per_expert.copy(),
                            every[:, E_TOKENS].copy(), idx, slots=ep_slices.expert_slots(per_expert, me, idx),
                            max_tokens=int(max_tokens))
            return recv_x, got_per_expert, handle
        recv_x = pipe.empty((tids.size, hidden), x.dtype)
        self._rows(operation, plan, recv_x)
        pipe.finish(operation)
        if timed:
            pipe.tick(operation, parity, ep_slices.dispatch_traffic(counts, per_expert, topk, row, False), staging,
                                self._routing("ht", every[:, E_TOKENS], topk, row, self._calls))
        handle = Handle(self._id, self._calls, "ht", tokens, tids.size, counts.copy(), every[:, E_TOKENS].copy(),
                        idx, sent=sent, weights=weights)
        return recv_x, got_idx, got_w, got_per_expert, handle

    def _combine(self, operation: str, y, handle, topk_idx, topk_weights):
        comm, pipe = self.comm, self._pipe
        n, me, L = comm.size, comm.rank, self.num_local_experts
        low_latency = operation == "low_latency_combine"
        error = inp = None
        code = hidden = call = 0
        try:
            if not isinstance(handle, Handle) or handle.buffer_id != self._id:
                raise TypeError(f"{operation}: handle must be the one this Buffer's dispatch returned")
            if handle.mode != ("ll" if low_latency else "ht"):
                raise ValueError(f"{operation}: the handle is of a {'low-latency' if handle.mode == 'll' else 'high-throughput'} dispatch")
            call = handle.call
            _check_rows(y, "y", operation)
            if low_latency:
                want = (L, n * handle.max_tokens)
                if y.ndim != 3 or y.shape[:2] != want:
                    raise ValueError(f"{operation}: y must be [{want[0]}, {want[1]}, hidden] like the dispatch's "
                                     f"recv_x, got shape {y.shape}")
                idx = self._check_idx(topk_idx, operation, handle.tokens)
                if not np.array_equal(idx, handle.topk_idx):
                    raise ValueError(f"{operation}: topk_idx differs from the one dispatched with this handle")
                weights = _check_weights(topk_weights, idx.shape, operation)
            else:
                if y.ndim != 2 or y.shape[0] != handle.received:
                    raise ValueError(f"{operation}: y must be [{handle.received}, hidden] like the dispatch's "
                                     f"recv_x, got shape {y.shape}")
            hidden = y.shape[-1]
            pipe.check_path(operation)
            code = dtype_code(y.dtype, operation)
            inp = pipe.input(y, operation)
        except Exception as e:
            error = e
        parity, _ = self._enter(operation, code, inp, None, 0, hidden, 0, call, error)
        row = hidden * y.itemsize
        counts = handle.counts
        sent_rows = ep_slices.rows_to_members(counts, n) if low_latency else counts
        timed = pipe.timed
        staging = ep_slices.staging(operation, handle.tokens_all, sent_rows.sum(axis=0), row) if timed else None
        if low_latency:
            valid = idx >= 0
            t_k = np.flatnonzero(valid.reshape(-1))
            e = idx.reshape(-1)[t_k]
            owner = e // L
            got = self._scratch("rows", (idx.size, hidden), y.dtype)
            need = np.zeros(n, dtype=np.int64)
            need[owner] = 1
            pipe.sources_ready(operation, parity, inp.addr, need=need)
            cap = n * handle.max_tokens
            key = idx.tobytes() + handle.slots.tobytes() + bytes(str((n, row, cap)), "ascii")
            plan = self._row_plan(operation, key, lambda: ep_slices.rows(
                me, n, owner, (e - owner * L) * cap + handle.slots.reshape(-1)[t_k], t_k, row))
            pipe.run(operation, plan, got)
            pipe.finish(operation)
            if timed:
                pipe.tick(operation, parity, ep_slices.combine_traffic(sent_rows, row, True), staging,
                                    self._routing("ll", handle.tokens_all, idx.shape[1], row, call))
            token = np.where(valid, np.arange(idx.shape[0])[:, None], -1).reshape(-1)
            return self._reduced(got, token, weights.reshape(-1), idx.shape[0], code)
        mine = counts[me]
        got = self._scratch("rows", (int(mine.sum()), hidden), y.dtype)
        pipe.sources_ready(operation, parity, inp.addr, need=(mine > 0).astype(np.int64))
        self._phase(operation, ("ep_combine", row, counts.tobytes()), lambda: ep_slices.combine_blocks(me, counts, row),
                    got)
        pipe.finish(operation)
        if timed:
            pipe.tick(operation, parity, ep_slices.combine_traffic(counts, row), staging,
                                self._routing("ht", handle.tokens_all, handle.topk_idx.shape[1], row, call))
        # the rows are grouped by destination ascending: each token's sum follows that order
        out = self._reduced(got, handle.sent, None, handle.tokens, code)
        # each weight comes back from its expert's rank alone (0 from the others): summed from 0
        # in destination order, that is 0 + w
        weights = np.where(handle.topk_idx >= 0, np.float32(0) + handle.weights, np.float32(0))
        return out, weights


_PARAM_NAMES = {"dispatch": "mode parameter", "low_latency_dispatch": "max_tokens_per_rank",
                "combine": "dispatch call combined", "low_latency_combine": "dispatch call combined"}


def _check_weights(w: Any, shape: tuple, operation: str) -> np.ndarray:
    if not isinstance(w, np.ndarray) or w.dtype != np.float32 or w.shape != shape:
        got = f"{w.dtype} {w.shape}" if isinstance(w, np.ndarray) else type(w).__name__
        raise TypeError(f"{operation}: topk_weights must be a float32 array of shape {shape}, got {got}")
    return w


def _by_value(col: np.ndarray, members: list[int]) -> str:
    groups: dict[int, list[int]] = {}
    for i, v in enumerate(col.tolist()):
        groups.setdefault(v, []).append(members[i])
    return "; ".join(f"rank(s) {rs}: {v}" for v, rs in groups.items())

