"""Randomized soak: thousands of seeded random calls, every result checked byte for byte.

    python benchmarks/soak.py -n 8 --calls 10000 --seed 1          # a long run (docs/reliability.md)
    python benchmarks/soak.py -n 4 --calls 300 --seed 5 --jobs 3    # a short one (what CI runs)

A run is ``--jobs`` jobs (``stratacl.spawn``), each under one of SETTINGS (registration mode,
algorithm, allocator, clock), the calls split evenly between them. Inside a job every rank
draws the same program from the job's seed::

    shared rng (seed, job) --> step k: which communicator (world, parity halves, a random
         |                     split), operator, dtype, size, reduce op, root, buffer places
         |                     (HBM, plain, strided), path (mte | sdma), async batch or not
         |                     --> issue on every member, wait, check
         +--> churn between steps: allocate and fill arrays, check and free them, empty_cache
    data: a hash of (seed, step, tag, world rank, element index), so every rank computes what
          every peer contributed, and any slice of it, without communicating

Expected results are numpy's: reductions in communicator-rank order in the array's dtype, as
the library documents (collectives/_reduce.py), with the ring's order per chunk under
``--algo ring``. Under ``--algo auto`` (which picks per call), float data for sum, avg and
prod are values whose results are exact in any order, so the check stays byte-exact. MoE
dispatch and combine (high-throughput and low-latency) are checked against the semantics in
ep/_buffer.py. Output bytes a call must not touch (an all_to_all_v's tail, a low-latency
receive buffer's unused rows excepted) are checked too, as are the bytes of every array the
churn holds, before it is freed.

At the half and at the end of each job every rank drops what it holds, empties the cache and
records its HBM segments (``memory_stats()``) and its USS outside HBM (psutil); the end must
not exceed the half by more than a little (communication buffers grow to the largest size
used). After each job, nothing of it may be left in /dev/shm nor as a process. The run
prints a table per job and a total: calls, bytes checked, wrong bytes (0 or the run fails),
the seed; ``--json`` writes it.
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import sys
import time
import zlib

import numpy as np
import psutil

import stratacl
from stratacl import ep
from stratacl.jobs._processes import collect, wait_gone

DTYPES = [np.dtype(t) for t in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16,
                                np.float32, np.float64, np.uint16, np.uint32, np.uint64)]
REDUCE = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, "avg": np.add}
# the settings a job runs under, taken in turn (job j: SETTINGS[(seed + j) % len])
SETTINGS = (
    dict(registration="roa", algo="mesh"),
    dict(registration="jit", algo="ring"),
    dict(registration="pool", algo="mesh", pool_size="512M"),
    dict(registration="staged", algo="auto"),
    dict(registration="roa", algo="auto", allocator="caching"),
    dict(registration="roa", algo="ring", clock="virtual"),
)
# operator: weight in the draw
OPS = {"all_reduce": 6, "all_gather": 4, "reduce_scatter": 4, "all_to_all": 3, "all_to_all_v": 3, "broadcast": 3,
       "sendrecv": 2, "send_recv": 2, "barrier": 1, "ep": 2, "ep_ll": 2}
WORK_BYTES = 4 << 20        # at most this many bytes of peers' data computed per rank per call
WORK_ELEMENTS = 8 << 20     # ... and elements over all ranks at once (the hash takes 8 bytes each)
SEGMENT_SLACK = 4           # communication buffers may still grow after the half
USS_SLACK = 48 << 20


# --- data every rank can compute for every rank ---------------------------------------------
def _hash(key: str, start: int, stop: int) -> np.ndarray:
    seed = np.uint64(zlib.crc32(key.encode()) | (zlib.adler32(key.encode()) << 32))
    h = (np.arange(start, stop, dtype=np.uint64) + seed) * np.uint64(0x9E3779B97F4A7C15)
    h ^= h >> np.uint64(31)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(29)
    return h


def values(key: str, wrank: int, count: int, dt: np.dtype, kind: str = "", start: int = 0,
           stop: int | None = None) -> np.ndarray:
    """Elements [start, stop) of the ``count`` values world rank ``wrank`` contributes to ``key``.

    ``kind``: the reduce op they feed (prod keeps floats near 1), with ``exact`` prefixed for
    floats whose sums and products are exact in any order (``--algo auto``)."""
    stop = count if stop is None else stop
    h = _hash(f"{key}/{wrank}/{count}/{dt.str}", start, stop)
    if dt.kind == "b":
        return (h & np.uint64(1)).astype(dt)
    if dt.kind in "iu":
        return h.astype(dt)
    if kind in ("exactsum", "exactavg"):
        return ((h % np.uint64(9)).astype(np.float64) - 4.0).astype(dt)
    if kind == "exactprod":
        # +-1, and +-2 or +-0.5 from the first 8 ranks only: no partial product leaves float16's range
        mag = np.where(h & np.uint64(2), 2.0, 0.5) if wrank < 8 else 1.0
        mag = np.where(h & np.uint64(4), mag, 1.0)
        return (np.where(h & np.uint64(1), -1.0, 1.0) * mag).astype(dt)
    if kind.endswith("prod"):
        return (1.0 + ((h % np.uint64(256)).astype(np.float64) - 128.0) / 1024.0).astype(dt)
    return ((h % np.uint64(65536)).astype(np.float64) / 8192.0 - 4.0).astype(dt)


def reduce_in_order(op: str, parts: list[np.ndarray], n: int) -> np.ndarray:
    acc = functools.reduce(REDUCE[op], parts)
    return acc / acc.dtype.type(n) if op == "avg" else acc


def ring_order(c: int, n: int) -> list[int]:
    """The order a ring folds chunk c: c+1, c+2, ..., c (mod n)."""
    return [(c + 1 + k) % n for k in range(n)]


# --- one rank's soak ------------------------------------------------------------------------
class Soak:
    """One rank's run of a job's program (see the module docstring)."""

    def __init__(self, world, seed: int, job: int, settings: dict):
        self.world, self.seed = world, seed
        self.n, self.me = world.size, world.rank
        self.work_elements = WORK_ELEMENTS // max(8, self.n)
        self.rng = np.random.default_rng([seed, job])       # the same stream on every rank
        self.key = f"{seed}/{job}"
        self.ring = settings.get("algo") == "ring"
        self.exact = settings.get("algo") == "auto"
        self.bytes_checked = self.wrong_bytes = 0
        self.failures: list[str] = []
        self.ops: dict[str, int] = {}
        self.held: list[tuple[np.ndarray, str]] = []
        self.kept: dict[tuple, np.ndarray] = {}       # buffers reused across calls (prepared replays)
        self.memory: list[dict] = []
        self.groups = self._split()
        self.buffers = {}
        for g, (comm, experts) in enumerate(self.groups):
            if comm is not None:
                self.buffers[g] = ep.Buffer(comm, experts * comm.size)

    # checks
    def same(self, what: str, got: np.ndarray, want: np.ndarray) -> None:
        want = np.ascontiguousarray(want)
        got_b = np.ascontiguousarray(got).view(np.uint8).reshape(-1)
        want_b = want.view(np.uint8).reshape(-1)
        self.bytes_checked += want_b.size
        if got.dtype != want.dtype or got.shape != want.shape:
            self.wrong_bytes += want_b.size
            self._fail(f"{what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}")
            return
        bad = int(np.count_nonzero(got_b != want_b))
        if bad:
            self.wrong_bytes += bad
            first = int(np.flatnonzero(got_b != want_b)[0])
            self._fail(f"{what}: {bad} of {want_b.size} bytes wrong, first at byte {first}")

    def _fail(self, text: str) -> None:
        if len(self.failures) < 20:
            self.failures.append(f"rank {self.me}: {text}")

    # buffers
    def place(self, a: np.ndarray, where: str) -> np.ndarray:
        """``a`` in this rank's HBM, as a plain array, or as a strided view of a plain one."""
        if where == "hbm":
            h = stratacl.empty(a.shape, a.dtype)
            h[...] = a
            return h
        if where == "strided" and a.ndim == 1:
            wide = np.zeros(2 * a.size, a.dtype)
            wide[::2] = a
            return wide[::2]
        return a.copy()

    def _split(self) -> list:
        """The communicators calls run on: world; two halves by parity, in reverse rank order;
        a random split (colors 0-2, some ranks None). Each with its experts per rank."""
        n, me, rng = self.n, self.me, self.rng
        groups = [(self.world, int(rng.integers(1, 4)))]
        half = self.world.split(me % 2, key=-me)
        self._check_members("parity split", half, sorted([r for r in range(n) if r % 2 == me % 2], key=lambda r: -r))
        groups.append((half, int(rng.integers(1, 4))))
        colors = rng.integers(-1, 3, size=n)
        keys = rng.integers(0, 4, size=n)
        mine = None if colors[me] < 0 else int(colors[me])
        sub = self.world.split(mine, key=int(keys[me]))
        if mine is None:
            self.same("split None", np.array([sub is None]), np.array([True]))
        else:
            self._check_members("random split", sub, sorted([r for r in range(n) if colors[r] == mine],
                                                            key=lambda r: (keys[r], r)))
        groups.append((sub, int(rng.integers(1, 4))))
        return groups

    def _check_members(self, what: str, comm, want: list[int]) -> None:
        self.same(f"{what} members", np.array(comm.members, np.int64), np.array(want, np.int64))

    # the program
    def run(self, calls: int) -> dict:
        t0 = time.monotonic()
        names, weights = list(OPS), np.array(list(OPS.values()), float)
        step = 0
        while step < calls:
            self.churn(step)
            if not self.memory and step >= calls // 2:
                self.settle("half")
            batch = int(self.rng.integers(2, 5)) if self.rng.random() < 0.15 else 0
            g = int(self.rng.integers(len(self.groups)))
            comm = self.groups[g][0]
            if batch:
                # asynchronous: issue a few, maybe a blocking world call meanwhile, wait in any order
                todo = [self.draw(names[int(self.rng.choice(len(names), p=weights / weights.sum()))], g, step + i,
                                  async_op=True) for i in range(batch)]
                between = self.draw("all_reduce", 0, step + batch) if self.rng.random() < 0.3 else None
                order = self.rng.permutation(batch)
                if comm is not None:
                    works = [(issue(), check) for issue, check in todo]
                    if between is not None:
                        between[1](between[0]())
                    for i in order:
                        work, check = works[i]
                        check(_outcome(work))
                elif between is not None:
                    between[1](between[0]())
                step += batch + (between is not None)
                continue
            name = names[int(self.rng.choice(len(names), p=weights / weights.sum()))]
            issue, check = self.draw(name, g, step)
            if comm is not None:
                check(_outcome(issue()))
            step += 1
        self.settle("end")
        seg = [m["segments"] for m in self.memory]
        uss = [m["uss"] for m in self.memory]
        if seg[1] > seg[0] + SEGMENT_SLACK or uss[1] > uss[0] + USS_SLACK:
            self._fail(f"memory grew from the half to the end: segments {seg}, USS outside HBM {uss}")
        return dict(calls=step, ops=self.ops, bytes_checked=self.bytes_checked, wrong_bytes=self.wrong_bytes,
                    failures=self.failures, memory=self.memory, seconds=time.monotonic() - t0,
                    leaked=bool(seg[1] > seg[0] + SEGMENT_SLACK or uss[1] > uss[0] + USS_SLACK))

    def count(self, what: str) -> None:
        self.ops[what] = self.ops.get(what, 0) + 1

    def draw(self, name: str, g: int, step: int, async_op: bool = False):
        """Draw one call of ``name`` on group ``g`` (the same draws on every rank); return
        (issue, check): ``issue()`` makes the call (a Work if asynchronous), ``check(result)``
        checks its outcome. On a rank outside the group both do nothing."""
        rng = self.rng
        comm = self.groups[g][0]
        p = dict(
            dt=DTYPES[int(rng.integers(len(DTYPES)))],
            sizes=rng.random(3),
            where=[("hbm", "plain", "strided")[i] for i in rng.choice(3, size=3, p=[0.6, 0.3, 0.1])],
            path=(None, "mte", "sdma")[int(rng.integers(3))],
            reuse=not async_op and rng.random() < 0.3,
            op=list(REDUCE)[int(rng.integers(5))],
            root=int(rng.integers(self.n)), shift=int(rng.integers(1, max(2, self.n))),
            pairs=rng.permutation(self.n), first=rng.random(self.n) < 0.5,
            counts=rng.integers(0, 4, size=(self.n, self.n)), zero=rng.random(),
            tokens=rng.integers(0, 48, size=self.n), hidden=int(rng.integers(1, 200)), topk=int(rng.integers(1, 5)),
            drop=float(rng.random() * 0.4), half=rng.random() < 0.5,
        )
        if p["reuse"]:      # a few recurring shapes, so that calls repeat on the same arrays
            p["dt"] = DTYPES[(7, 5, 6)[int(p["sizes"][2] * 3)]]
        kw = dict(async_op=async_op, path=p["path"])
        if comm is None:
            return (lambda: None), (lambda r: None)
        self.count(name)
        key = f"{self.key}/{step}"
        return getattr(self, "_" + name)(comm, g, key, p, kw)

    def count_for(self, p: dict, unit: int, itemsize: int) -> int:
        """An element count, log-uniform from 0 (often) to what keeps a call's work under
        WORK_BYTES when ``unit`` values of that count are computed (0 one time in ten)."""
        if p["zero"] < 0.08:
            return 0
        most = max(1, min(WORK_BYTES // itemsize, self.work_elements) // max(unit, 1))
        if p["reuse"]:
            fixed = [c for c in (1, 7, 1000, 16384, 100000) if c <= most]
            return fixed[int(p["sizes"][0] * len(fixed))]
        return int(most ** p["sizes"][0])

    def _buffer(self, tag: tuple, a: np.ndarray, where: str, reuse: bool) -> np.ndarray:
        """``a``'s values in a buffer placed at ``where``: a kept one when reused (the same
        array object as an earlier call's, which the library replays), else a new one."""
        if reuse:
            k = (tag, a.shape, a.dtype.str, where)
            buf = self.kept.get(k)
            if buf is None:
                if len(self.kept) >= 24:
                    self.kept.clear()
                buf = self.kept[k] = self.place(a, where)
            else:
                buf[...] = a
            return buf
        return self.place(a, where)

    def _kind(self, op: str | None, dt: np.dtype) -> str:
        if op is None:
            return ""
        return ("exact" + op) if self.exact and dt.kind == "f" else op

    # --- the operators --------------------------------------------------------------------
    def _all_reduce(self, comm, g, key, p, kw):
        dt, op, n = p["dt"], p["op"], comm.size
        if op == "avg" and dt.kind != "f":
            op = "sum"
        count = self.count_for(p, n, dt.itemsize)
        kind = self._kind(op, dt)
        parts = [values(key, m, count, dt, kind) for m in comm.members]
        x = self._buffer(("ar", g), parts[comm.rank], p["where"][0], p["reuse"])
        if len(x) and p["sizes"][1] < 0.2 and p["where"][0] == "hbm" and count % 4 == 0 and not p["reuse"]:
            x = x.reshape(4, count // 4)           # any shape: reduced as its flat elements

        def check(_):
            if self.ring and n > 1:
                edges = [count * c // n for c in range(n + 1)]
                want = np.concatenate([reduce_in_order(op, [parts[q][edges[c]:edges[c + 1]] for q in ring_order(c, n)],
                                                       n) for c in range(n)])
            else:
                want = reduce_in_order(op, parts, n)
            self.same(f"all_reduce {op} {dt} x{count} n{n}", x.reshape(-1), want)
        return (lambda: comm.all_reduce(x, op=op, **kw)), check

    def _all_gather(self, comm, g, key, p, kw):
        dt, n, me = p["dt"], comm.size, comm.rank
        count = self.count_for(p, n, dt.itemsize)
        parts = [values(key, m, count, dt) for m in comm.members]
        in_place = p["sizes"][1] < 0.15 and p["where"][1] == "hbm"
        out = self._buffer(("agout", g), np.zeros(n * count, dt), p["where"][1], p["reuse"] and not in_place)
        if in_place:
            out[me * count:(me + 1) * count] = parts[me]
            x = out[me * count:(me + 1) * count]
        else:
            x = self._buffer(("ag", g), parts[me], p["where"][0], p["reuse"])
        return (lambda: comm.all_gather(out, x, **kw)), (
            lambda _: self.same(f"all_gather {dt} x{count} n{n}", out, np.concatenate(parts)))

    def _reduce_scatter(self, comm, g, key, p, kw):
        dt, op, n, me = p["dt"], p["op"], comm.size, comm.rank
        if op == "avg" and dt.kind != "f":
            op = "max"
        count = self.count_for(p, n, dt.itemsize)
        kind = self._kind(op, dt)
        mine = values(key, comm.members[me], n * count, dt, kind)
        x = self._buffer(("rsin", g), mine, p["where"][0], p["reuse"])
        in_place = p["sizes"][1] < 0.15 and p["where"][0] == "hbm" and not p["reuse"]
        out = x[me * count:(me + 1) * count] if in_place else self._buffer(
            ("rsout", g), np.zeros(count, dt), p["where"][1], p["reuse"])

        def check(_):
            chunks = [values(key, m, n * count, dt, kind, me * count, (me + 1) * count) for m in comm.members]
            order = ring_order(me, n) if self.ring and n > 1 else range(n)
            self.same(f"reduce_scatter {op} {dt} x{count} n{n}", out, reduce_in_order(op, [chunks[q] for q in order], n))
        return (lambda: comm.reduce_scatter(out, x, op=op, **kw)), check

    def _all_to_all(self, comm, g, key, p, kw):
        dt, n, me = p["dt"], comm.size, comm.rank
        count = self.count_for(p, n, dt.itemsize)
        x = self._buffer(("a2a", g), values(key, comm.members[me], n * count, dt), p["where"][0], p["reuse"])
        in_place = p["sizes"][1] < 0.15 and not p["reuse"]
        out = x if in_place else self._buffer(("a2aout", g), np.zeros(n * count, dt), p["where"][1], p["reuse"])

        def check(_):
            want = np.concatenate([values(key, m, n * count, dt, "", me * count, (me + 1) * count)
                                   for m in comm.members])
            self.same(f"all_to_all {dt} x{count} n{n}{' in place' if in_place else ''}", out, want)
        return (lambda: comm.all_to_all(out, x, **kw)), check

    def _all_to_all_v(self, comm, g, key, p, kw):
        dt, n, me = p["dt"], comm.size, comm.rank
        unit = max(1, self.count_for(p, n * 4, dt.itemsize))
        c = p["counts"][:n, :n] * unit          # c[i, j]: elements comm rank i sends to j
        sizes = [int(c[i].sum()) for i in range(n)]
        x = self._buffer(("a2av", g), values(key, comm.members[me], sizes[me], dt), p["where"][0], False)
        tail = 3
        fill = values(key + "/tail", comm.members[me], int(c[:, me].sum()) + tail, dt)
        out = self._buffer(("a2avout", g), fill, p["where"][1], False)

        def check(_):
            pieces = [values(key, m, sizes[i], dt, "", int(c[i, :me].sum()), int(c[i, :me + 1].sum()))
                      for i, m in enumerate(comm.members)]
            self.same(f"all_to_all_v {dt} unit {unit} n{n}", out, np.concatenate(pieces + [fill[-tail:]]))
        return (lambda: comm.all_to_all_v(out, x, c[me].tolist(), c[:, me].tolist(), **kw)), check

    def _broadcast(self, comm, g, key, p, kw):
        dt, n, me = p["dt"], comm.size, comm.rank
        root = p["root"] % n
        count = self.count_for(p, 1, dt.itemsize)
        data = values(key, comm.members[root], count, dt)
        start = data if me == root else values(key + "/junk", comm.members[me], count, dt)
        x = self._buffer(("bc", g, me == root), start, p["where"][0], p["reuse"])
        return (lambda: comm.broadcast(x, root=root, **kw)), (
            lambda _: self.same(f"broadcast root {root} {dt} x{count} n{n}", x, data))

    def _sendrecv(self, comm, g, key, p, kw):
        dt, n, me = p["dt"], comm.size, comm.rank
        if n < 2:
            return self._barrier(comm, g, key, p, kw)
        s = p["shift"] % n or 1
        dst, src = (me + s) % n, (me - s) % n
        count = self.count_for(p, 2, dt.itemsize)
        x = self._buffer(("sr", g), values(key, comm.members[me], count, dt), p["where"][0], p["reuse"])
        in_place = p["sizes"][1] < 0.15 and not p["reuse"]
        out = x if in_place else self._buffer(("srout", g), np.zeros(count, dt), p["where"][1], p["reuse"])
        return (lambda: comm.sendrecv(x, dst, out, src, **kw)), (
            lambda _: self.same(f"sendrecv shift {s} {dt} x{count} n{n}", out, values(key, comm.members[src], count, dt)))

    def _send_recv(self, comm, g, key, p, kw):
        """Pairs of comm ranks (in a drawn order) exchange both ways, one of each pair
        sending first; an odd one out only takes part in nothing."""
        dt, n, me = p["dt"], comm.size, comm.rank
        order = [int(v) for v in p["pairs"] if v < n]
        pos = order.index(me)
        if pos // 2 * 2 + 1 >= n:
            return (lambda: None), (lambda _: None)
        other = order[pos ^ 1]
        count = self.count_for(p, 2, dt.itemsize)
        x = self._buffer(("s", g), values(key, comm.members[me], count, dt), p["where"][0], p["reuse"])
        got = self._buffer(("r", g), np.zeros(count, dt), p["where"][1], p["reuse"])
        first = bool(p["first"][min(me, other)]) == (me < other)

        def issue():
            if kw["async_op"]:
                a = comm.send(x, other, **kw) if first else comm.recv(got, other, **kw)
                b = comm.recv(got, other, **kw) if first else comm.send(x, other, **kw)
                a.wait()
                return b
            if first:
                comm.send(x, other, path=kw["path"])
                comm.recv(got, other, path=kw["path"])
            else:
                comm.recv(got, other, path=kw["path"])
                comm.send(x, other, path=kw["path"])
            return None
        return issue, (lambda _: self.same(f"send/recv {dt} x{count}", got, values(key, comm.members[other], count, dt)))

    def _barrier(self, comm, g, key, p, kw):
        return (lambda: comm.barrier(**kw)), (lambda _: None)

    # --- MoE --------------------------------------------------------------------------------
    def _routing(self, key: str, wrank: int, tokens: int, hidden: int, topk: int, experts: int, drop: float, dt):
        rng = np.random.default_rng([zlib.crc32(key.encode()), wrank])
        x = values(key + "/x", wrank, tokens * hidden, dt).reshape(tokens, hidden)
        idx = np.array([rng.permutation(experts)[:topk] for _ in range(tokens)], np.int64).reshape(tokens, topk)
        idx[rng.random((tokens, topk)) < drop] = -1
        w = rng.random((tokens, topk)).astype(np.float32)
        return x, idx, w

    def _moe(self, comm, g, key, p):
        n = comm.size
        experts = self.buffers[g].num_experts
        dt = np.dtype(np.float16 if p["half"] else np.float32)
        hidden, topk = p["hidden"], min(p["topk"], experts)
        inputs = [self._routing(key, m, int(p["tokens"][m]), hidden, topk, experts, p["drop"], dt)
                  for m in comm.members]
        return inputs, experts // n, dt, hidden

    def _ep(self, comm, g, key, p, kw):
        """High-throughput dispatch, the experts' outputs (rows + destination + 1), combine."""
        buf, n, me = self.buffers[g], comm.size, comm.rank
        inputs, local, dt, hidden = self._moe(comm, g, key, p)
        x, idx, w = inputs[me]
        hbm = p["where"][0] == "hbm"

        def issue():
            return buf.dispatch(self.place(x, "hbm" if hbm else "plain"), idx, w, **kw)

        def check(r):
            recv_x, recv_idx, recv_w, per_expert, handle = r
            rows, ridx, rw = [], [], []
            for q, (xq, iq, wq) in enumerate(inputs):
                here = (iq >= 0) & (iq // local == me)
                take = here.any(axis=1)
                rows.append(xq[take])
                ridx.append(np.where(here, iq - me * local, -1)[take])
                rw.append(np.where(here, wq, np.float32(0))[take])
            want_idx = np.concatenate(ridx).reshape(-1, idx.shape[1])
            self.same("dispatch recv_x", recv_x, np.concatenate(rows).reshape(-1, hidden))
            self.same("dispatch recv_topk_idx", recv_idx, want_idx)
            self.same("dispatch recv_topk_weights", recv_w, np.concatenate(rw).reshape(-1, idx.shape[1]))
            self.same("dispatch recv_per_expert", per_expert,
                      np.array([(want_idx == e).sum() for e in range(local)], np.int64))
            y = self.place(recv_x + dt.type(me + 1), "hbm" if p["where"][1] == "hbm" else "plain")
            combined, cw = _outcome(buf.combine(y, handle, **kw))
            acc = np.zeros((x.shape[0], hidden), np.float32)
            for d in range(n):               # destinations ascending, float32 from 0
                to_d = ((idx >= 0) & (idx // local == d)).any(axis=1)
                acc[to_d] = acc[to_d] + (x[to_d] + dt.type(d + 1)).astype(np.float32)
            self.same("combine x", combined, acc.astype(dt))
            self.same("combine weights", cw, np.where(idx >= 0, np.float32(0) + w, np.float32(0)))
        return issue, check

    def _ep_ll(self, comm, g, key, p, kw):
        """Low-latency dispatch and combine (weighted, k ascending)."""
        buf, n, me = self.buffers[g], comm.size, comm.rank
        inputs, local, dt, hidden = self._moe(comm, g, key, p)
        x, idx, w = inputs[me]
        cap = int(max(q[0].shape[0] for q in inputs)) + int(p["topk"])
        hbm = p["where"][0] == "hbm"

        def issue():
            return buf.low_latency_dispatch(self.place(x, "hbm" if hbm else "plain"), idx, cap, **kw)

        def lists(d):
            """Per local expert of member d: the (member, token) pairs, in receive order."""
            out = [[] for _ in range(local)]
            for q, (_, iq, _) in enumerate(inputs):
                for t, row in enumerate(iq.tolist()):
                    for e in row:
                        if e >= 0 and e // local == d:
                            out[e - d * local].append((q, t))
            return out

        def check(r):
            recv_x, recv_count, handle = r
            mine = lists(me)
            self.same("ll recv_count", recv_count, np.array([len(v) for v in mine], np.int64))
            self.same("ll recv_x shape", np.array(recv_x.shape), np.array([local, n * cap, hidden]))
            if recv_x.shape != (local, n * cap, hidden):
                return
            for e, v in enumerate(mine):
                want = np.array([inputs[q][0][t] for q, t in v], dt).reshape(len(v), hidden)
                self.same(f"ll recv_x[{e}]", recv_x[e, :len(v)], want)
            with np.errstate(all="ignore"):          # rows past a count are undefined
                y = self.place(recv_x + dt.type(me + 1), "hbm" if p["where"][1] == "hbm" else "plain")
            got = _outcome(buf.low_latency_combine(y, idx, w, handle, **kw))
            # expert d's output row of token t is the token's row + d + 1: a row pulled from a
            # wrong slot shows in the sum
            acc = np.zeros((x.shape[0], hidden), np.float32)
            for k in range(idx.shape[1]):          # k ascending, float32 from 0, product then sum
                e = idx[:, k]
                on = e >= 0
                row = (x + (np.where(on, e // local, 0) + 1).astype(dt)[:, None]).astype(np.float32)
                acc[on] = acc[on] + w[on, k][:, None] * row[on]
            self.same("ll combine", got, acc.astype(dt))
        return issue, check

    # --- churn and memory -------------------------------------------------------------------
    def churn(self, step: int) -> None:
        """Allocate, check and free arrays, and sometimes empty the cache, between calls."""
        rng = self.rng
        for _ in range(int(rng.integers(0, 3))):
            dt = DTYPES[int(rng.integers(len(DTYPES)))]
            count = (int((2 << 20) ** rng.random()) if rng.random() < 0.05 else int(rng.integers(0, 4096))) // dt.itemsize
            tag = f"{self.key}/held/{step}/{len(self.held)}"
            a = stratacl.empty((count,), dt)
            a[:] = values(tag, self.me, count, dt)
            self.held.append((a, tag))
        while len(self.held) > 16 or (self.held and rng.random() < 0.3):
            a, tag = self.held.pop(int(rng.integers(len(self.held))))
            self.same("held array", a, values(tag, self.me, a.size, a.dtype))
        if rng.random() < 0.03:
            stratacl.empty_cache()

    def settle(self, when: str) -> None:
        for a, tag in self.held:
            self.same("held array", a, values(tag, self.me, a.size, a.dtype))
        self.held.clear()
        self.kept.clear()
        gc.collect()
        self.world.barrier()
        stratacl.empty_cache()
        s = stratacl.memory_stats()
        self.memory.append(dict(when=when, segments=s["segment.all.current"], mappings=s["mapping.all.current"],
                                reserved=s["reserved_bytes.all.current"], uss=uss_outside_hbm()))


def _outcome(r):
    """What a call returned: a Work's result (asynchronous), else the value itself."""
    return r.result() if hasattr(r, "result") and hasattr(r, "is_completed") else r


def uss_outside_hbm() -> int:
    """This process's unique set size, less its HBM mappings (shared-memory segments)."""
    total = 0
    for m in psutil.Process().memory_maps(grouped=False):
        if "stratacl-" in m.path or m.path.startswith("/dev/shm") or m.path.startswith("/memfd:"):
            continue
        total += m.private_clean + m.private_dirty
    return total


def soak_rank(comm, seed: int, job: int, calls: int, settings: dict) -> dict:
    """What one rank runs (``stratacl.spawn``): the job's program, then its report."""
    return Soak(comm, seed, job, settings).run(calls)


# --- the driver -----------------------------------------------------------------------------
def _shm_names() -> set[str]:
    """The names the soak's own jobs may leave: under the test suite its jobs' ids start with the
    test's tag (runtime/memory/_names.py), so another job's names on the host are not counted."""
    prefix = "stratacl-" + os.environ.get("STRATACL_TEST_JOB_TAG", "")
    return {n for n in os.listdir("/dev/shm") if n.startswith((prefix, "sem." + prefix))}


def run(nranks: int, calls: int, seed: int, jobs: int, timeout: float = 120.0, hbm_size: str = "1G",
        out=sys.stdout) -> dict:
    """The soak (see the module docstring); returns the totals and each job's record."""
    records = []
    per_job = [calls // jobs + (j < calls % jobs) for j in range(jobs)]
    print(f"soak: {nranks} ranks, {calls} calls in {jobs} jobs, seed {seed}", file=out)
    print("| job | settings | calls | calls per rank | bytes checked | wrong bytes | segments half/end | "
          "USS outside HBM half/end (MiB) | leftovers | seconds |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|", file=out)
    for j in range(jobs):
        settings = dict(SETTINGS[(seed + j) % len(SETTINGS)])
        before = _shm_names()
        t0 = time.monotonic()
        reports = stratacl.spawn(soak_rank, nranks, args=(seed, j, per_job[j], settings), timeout=timeout,
                                 hbm_size=hbm_size, **settings)
        seconds = time.monotonic() - t0
        alive = wait_gone(collect(children_of=psutil.Process()), 10)
        leftovers = sorted(_shm_names() - before) + [f"pid {p.pid}" for p in alive]
        rec = dict(job=j, settings=settings, calls=reports[0]["calls"],
                   rank_calls=sum(sum(r["ops"].values()) for r in reports),
                   bytes_checked=sum(r["bytes_checked"] for r in reports),
                   wrong_bytes=sum(r["wrong_bytes"] for r in reports),
                   failures=[f for r in reports for f in r["failures"]][:20],
                   ops=[r["ops"] for r in reports], memory=[r["memory"] for r in reports],
                   leaked=any(r["leaked"] for r in reports),
                   leftovers=leftovers, seconds=seconds)
        records.append(rec)
        seg = "/".join(str(max(m[i]["segments"] for m in rec["memory"])) for i in range(2))
        uss = "/".join(f"{max(m[i]['uss'] for m in rec['memory']) / 2**20:.0f}" for i in range(2))
        text = ",".join(f"{k}={v}" for k, v in settings.items())
        print(f"| {j} | {text} | {rec['calls']} | {rec['rank_calls']} | {rec['bytes_checked']} | "
              f"{rec['wrong_bytes']} | {seg} | {uss} | {len(leftovers)} | {seconds:.0f} |", file=out, flush=True)
        for f in rec["failures"][:5]:
            print(f"    {f}", file=out)
    total = dict(ranks=nranks, seed=seed, calls=sum(r["calls"] for r in records),
                 rank_calls=sum(r["rank_calls"] for r in records),
                 bytes_checked=sum(r["bytes_checked"] for r in records),
                 wrong_bytes=sum(r["wrong_bytes"] for r in records),
                 failures=sum(len(r["failures"]) for r in records),
                 memory_grew=sum(r["leaked"] for r in records),
                 leftovers=sum(len(r["leftovers"]) for r in records),
                 seconds=sum(r["seconds"] for r in records), jobs=records)
    total["ok"] = not (total["wrong_bytes"] or total["failures"] or total["memory_grew"] or total["leftovers"])
    print(f"total: {total['calls']} calls ({total['rank_calls']} calls by ranks), {total['bytes_checked']} bytes "
          f"checked, {total['wrong_bytes']} wrong, {total['failures']} failures, memory grew in "
          f"{total['memory_grew']} jobs, {total['leftovers']} leftovers, seed {seed}, {total['seconds']:.0f} s: "
          f"{'OK' if total['ok'] else 'FAILED'}", file=out, flush=True)
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--ranks", type=int, default=8)
    ap.add_argument("--calls", type=int, default=1000, help="calls in all, split between the jobs")
    ap.add_argument("--seed", type=int, default=None, help="default: from the time (printed)")
    ap.add_argument("--jobs", type=int, default=len(SETTINGS), help="jobs, each under the next of SETTINGS")
    ap.add_argument("--timeout", type=float, default=120.0, help="STRATACL_TIMEOUT of each job")
    ap.add_argument("--hbm-size", default="1G")
    ap.add_argument("--json", help="write the totals and each job's record here")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else int(time.time()) % 100000
    total = run(a.ranks, a.calls, seed, a.jobs, a.timeout, a.hbm_size)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(total, f, indent=1, default=str)
    return 0 if total["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
