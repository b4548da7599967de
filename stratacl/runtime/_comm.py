"""Communicator: argument checks, descriptors, synchronisation, and the call into collectives.

One collective call, end to end:

    check arguments locally  --error-->  publish a descriptor flagged 'rejected', arrive, raise
          |
    input in own HBM? yes: zero copy        no: staged into a communication buffer (counted)
          |
    publish descriptor {op, dtype, count, root, reduce op, input address and segment, epoch}
          |
    arrival barrier  -> every rank reads every descriptor; any disagreement raises
          |              CollectiveMismatch on every rank, before any byte moves
    full-mesh pull (collectives._fullmesh), peers' inputs read at their shared addresses
          |
    departure barrier -> inputs may be reused once this returns

Descriptors are double-buffered by call parity: a rank can only overwrite the slot of call k
after the arrival barrier of call k+1, which every peer reaches only once it has read call
k's descriptors.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .._errors import CollectiveMismatch
from ..collectives import _fullmesh, _reduce
from . import _native
from ._control import DESC_FIXED, P2P_DESC, Layout
from ._sync import SLICE, SPIN_POLLS, WAKE_ALL, seq_reached, wait_until

if TYPE_CHECKING:
    from ._world import Runtime

log = logging.getLogger("stratacl")

OPS = {"barrier": 1, "all_gather": 2, "all_reduce": 3, "reduce_scatter": 4, "all_to_all": 5,
       "all_to_all_v": 6, "broadcast": 7, "split": 8}
OP_NAMES = {v: k for k, v in OPS.items()}

# descriptor fields
(F_OP, F_DTYPE, F_COUNT, F_ROOT, F_REDOP, F_FLAGS, F_ADDR, F_NBYTES, F_SEG_VA, F_SEG_SIZE, F_SEG_OFF,
 F_EPOCH, F_AUX0, F_AUX1, F_AUX2, F_CALL) = range(DESC_FIXED)
FLAG_REJECTED = 1
SMALL_ALL_REDUCE = 16 * 1024   # bytes up to which all_reduce reads everything once instead of two phases

_COMPARED = ((F_DTYPE, "dtype"), (F_COUNT, "element count"), (F_ROOT, "root"), (F_REDOP, "reduce op"))


def _value_name(field: int, v: int) -> str:
    if field == F_OP:
        return OP_NAMES.get(v, f"op#{v}")
    if field == F_DTYPE:
        dt = _reduce.DTYPE_BY_CODE.get(v)
        return str(dt) if dt is not None else "-"
    if field == F_REDOP:
        return _reduce.REDUCE_NAMES.get(v, "-")
    return str(v)


class _Input:
    """A contiguous byte range peers may read: the caller's HBM array or a staged copy."""

    __slots__ = ("flat", "addr", "seg")

    def __init__(self, flat: np.ndarray, seg):
        self.flat, self.seg = flat, seg
        self.addr = flat.ctypes.data if flat.size else 0


class Communicator:
    """A group of ranks that run collectives together (MPI semantics for ``split``).

    Every collective method is a *collective operation*: all ranks of the communicator must
    call it in the same order with agreeing arguments, and it is host-blocking.
    """

    def __init__(self, rt: "Runtime", members: Sequence[int], slots: Sequence[int]):
        self._rt = rt
        self.members = list(members)
        self.size = len(self.members)
        self.rank = self.members.index(rt.rank)
        lay: Layout = rt.ctl.layout
        self._lay = lay
        base = rt.ctl.base
        self._slot_offs = [lay.slot(m, s) for m, s in zip(self.members, slots)]
        me = self._slot_offs[self.rank]
        self._counter_addr = base + self._slot_offs[0] + Layout.SLOT_COUNTER
        self._gen_addr = base + self._slot_offs[0] + Layout.SLOT_GEN
        self._arrival_addr = base + me + Layout.SLOT_ARRIVAL
        self._arrival_idx = np.array([(o + Layout.SLOT_ARRIVAL) // 4 for o in self._slot_offs])
        self._desc_off = [me + lay.slot_desc(p) for p in (0, 1)]
        self._desc_idx = [np.array([[(o + lay.slot_desc(p)) // 8 + f for f in range(DESC_FIXED)]
                                    for o in self._slot_offs]) for p in (0, 1)]
        self._ext_idx = [np.array([[(o + lay.slot_desc(p)) // 8 + DESC_FIXED + f for f in range(2 * self.size)]
                                   for o in self._slot_offs]) for p in (0, 1)]
        self._desc_addrs = [np.array([base + o + lay.slot_desc(p) for o in self._slot_offs], dtype=np.int64)
                            for p in (0, 1)]
        self._syncs = 0
        self._calls = 0
        self._sent = [0] * self.size
        self._received = [0] * self.size
        self._staging = None
        self._scratch = np.empty(SMALL_ALL_REDUCE, dtype=np.uint8)
        self.counters = _fullmesh.Counters()
        self._ready = np.full((self.size, 2), -1, dtype=np.int64)   # last (seg_va, epoch) checked per member

    @property
    def topology(self):
        return self._rt.topology

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}, members={self.members})"

    # --- synchronisation --------------------------------------------------------------------
    def _sync(self, operation: str) -> None:
        """Counter barrier: arrive, then a yielding spin and futex sleeps, all in native code."""
        self._syncs += 1
        k = self._syncs
        target = k * self.size
        if _native.arrive(self._counter_addr, self._gen_addr, self._arrival_addr, k & 0xFFFFFFFF, target):
            return
        if _native.wait_counter(self._counter_addr, target, self._gen_addr, SPIN_POLLS, SLICE):
            return
        u32 = self._rt.ctl.u32

        def missing():
            arr = u32[self._arrival_idx]
            return [self.members[i] for i in range(self.size) if not seq_reached(int(arr[i]), k)]

        counter = self._counter_addr
        wait_until(lambda: _native.load_u64(counter) >= target, self._gen_addr, self._rt.health, operation,
                   self._rt.config.timeout, missing, f"{self.size} ranks to arrive")

    def _begin(self, operation: str, fields: dict[int, int], error: BaseException | None = None,
               ext: np.ndarray | None = None) -> np.ndarray:
        """Publish this rank's descriptor, arrive, and return every member's descriptor."""
        self._calls += 1
        parity = self._calls & 1
        i64 = self._rt.ctl.i64
        off = self._desc_off[parity] // 8
        desc = i64[off:off + DESC_FIXED]
        desc[:] = 0
        desc[F_OP] = OPS[operation]
        for f, v in fields.items():
            desc[f] = v
        desc[F_CALL] = self._calls
        if error is not None:
            desc[F_FLAGS] = FLAG_REJECTED
        if ext is not None:
            i64[off + DESC_FIXED:off + DESC_FIXED + ext.size] = ext
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s call %d: %s", operation, self._calls, desc.tolist())
        self._sync(operation)
        if error is not None:
            raise error
        if _native.check_descriptors(self._desc_addrs[parity], F_FLAGS + 1) >= 0 or desc[F_FLAGS]:
            self._validate(operation, i64[self._desc_idx[parity]])   # builds the message, raises
        return i64[self._desc_idx[parity]] if self._want_descs.get(operation, True) else None

    def _validate(self, operation: str, descs: np.ndarray) -> None:
        # one vectorised comparison on the fast path; the message is built only on a mismatch
        if not (descs[:, F_OP:F_FLAGS + 1] != descs[0, F_OP:F_FLAGS + 1]).any() and not descs[0, F_FLAGS]:
            return
        rejected = np.nonzero(descs[:, F_FLAGS] & FLAG_REJECTED)[0]
        if rejected.size:
            who = [self.members[i] for i in rejected]
            raise CollectiveMismatch(
                f"{operation}: rank(s) {who} rejected their arguments (see the error raised there); "
                f"no data was moved")
        for field, label in ((F_OP, "operation"), *_COMPARED):
            col = descs[:, field]
            if (col != col[0]).any():
                groups: dict[int, list[int]] = {}
                for i, v in enumerate(col.tolist()):
                    groups.setdefault(v, []).append(self.members[i])
                seen = "; ".join(f"rank(s) {rs}: {_value_name(field, v)}" for v, rs in groups.items())
                raise CollectiveMismatch(
                    f"{operation}: ranks disagree on the {label} of call #{self._calls} on this "
                    f"communicator ({seen}); no data was moved")

    _want_descs = {"barrier": False}

    # --- buffers ----------------------------------------------------------------------------
    def _as_input(self, x: np.ndarray, operation: str) -> _Input:
        """Zero copy when ``x`` is contiguous and in this rank's HBM; otherwise stage it."""
        flat = _flat(x, operation, "input")
        if flat.size == 0:
            return _Input(flat, None)
        seg = self._rt.own_segment(flat.ctypes.data, flat.nbytes) if flat.flags.c_contiguous else None
        if seg is not None:
            return _Input(flat, seg)
        buf = self._staging_buffer(flat.nbytes)[:flat.nbytes].view(flat.dtype)
        np.copyto(buf, flat.reshape(-1))
        self._rt.stats["bytes_staged"] += flat.nbytes
        self._rt.stats["staged_calls"] += 1
        return _Input(buf, self._rt.own_segment(buf.ctypes.data, buf.nbytes))

    def _staging_buffer(self, nbytes: int) -> np.ndarray:
        if self._staging is None or self._staging.nbytes < nbytes:
            self._staging = None
            size = 1 << max(12, (nbytes - 1).bit_length())
            self._staging = self._rt.empty((size,), np.uint8)
        return self._staging

    def _input_fields(self, inp: _Input) -> dict[int, int]:
        seg = inp.seg
        if seg is None:
            return {F_ADDR: inp.addr, F_NBYTES: inp.flat.nbytes}
        return {F_ADDR: inp.addr, F_NBYTES: inp.flat.nbytes, F_SEG_VA: seg.va, F_SEG_SIZE: seg.size,
                F_SEG_OFF: seg.hbm_offset, F_EPOCH: seg.epoch}

    def _sources(self, descs: np.ndarray, operation: str, local: _Input, need=None) -> np.ndarray:
        """Every member's input address (this rank's own: ``local``), after the purely local
        readiness check of each peer buffer this rank will read (``need[i]``; default: all)."""
        src = descs[:, F_ADDR].copy()
        src[self.rank] = local.addr if local is not None else 0
        # a (segment, epoch) checked once stays valid: a released segment cannot appear in a
        # descriptor again, and a new one has a new epoch
        check = (descs[:, F_EPOCH] != self._ready[:, 1]) | (descs[:, F_SEG_VA] != self._ready[:, 0])
        check &= descs[:, F_NBYTES] != 0
        check[self.rank] = False
        if need is not None:
            check &= need
        if check.any():
            reg, members = self._rt.reg, self.members
            for i in np.nonzero(check)[0].tolist():
                d = descs[i]
                reg.ensure_ready(members[i], int(d[F_SEG_VA]), int(d[F_SEG_SIZE]), int(d[F_SEG_OFF]),
                                 int(d[F_EPOCH]), operation)
                self._ready[i, 0], self._ready[i, 1] = d[F_SEG_VA], d[F_EPOCH]
        return src

    def _finish(self, operation: str, departure: bool = True) -> None:
        """Departure barrier (unless nobody can still be reading this rank's input), then stats."""
        if departure:
            self._sync(operation)
        s = self._rt.stats
        s["calls"][operation] = s["calls"].get(operation, 0) + 1
        c = self.counters
        s["bytes_pulled"] += c.pulled
        s["bytes_local"] += c.local
        s["output_bytes_written"] += c.written
        c.pulled = c.local = c.written = 0

    # --- collectives ------------------------------------------------------------------------
    def barrier(self) -> None:
        """Block until every rank of the communicator has called barrier. Collective."""
        self._begin("barrier", {})
        s = self._rt.stats
        s["calls"]["barrier"] = s["calls"].get("barrier", 0) + 1

    def all_gather(self, out: np.ndarray, x: np.ndarray) -> None:
        """``out`` (size * x.size elements) receives every rank's ``x``, rank-major. Collective."""
        op = "all_gather"
        try:
            code = _reduce.dtype_code(x.dtype, op)
            o = _flat(out, op, "output", writable=True)
            _expect(o.size == self.size * x.size, lambda: f"{op}: output has {o.size} elements, expected "
                    f"{self.size} x {x.size} = {self.size * x.size}")
            _expect(o.dtype == x.dtype, lambda: f"{op}: output dtype {o.dtype} differs from input dtype {x.dtype}",
                    TypeError)
            inp = self._as_input(x, op)
        except Exception as e:
            self._begin(op, {}, error=e)
        descs = self._begin(op, {F_DTYPE: code, F_COUNT: x.size, **self._input_fields(inp)})
        with _Output(o) as ob:
            _fullmesh.all_gather(self.rank, self.size, ob, inp.flat, self._sources(descs, op, inp), self.counters)
        self._finish(op)

    def all_to_all(self, out: np.ndarray, x: np.ndarray) -> None:
        """Equal splits: chunk j of rank i's ``x`` lands in chunk i of rank j's ``out``. Collective."""
        op = "all_to_all"
        try:
            code = _reduce.dtype_code(x.dtype, op)
            o = _flat(out, op, "output", writable=True)
            _expect(x.size % self.size == 0, lambda: f"{op}: input has {x.size} elements, not divisible by "
                    f"{self.size} ranks")
            _expect(o.size == x.size, lambda: f"{op}: output has {o.size} elements, expected {x.size}")
            _expect(o.dtype == x.dtype, lambda: f"{op}: output dtype {o.dtype} differs from input dtype {x.dtype}",
                    TypeError)
            inp = self._as_input(x, op)
        except Exception as e:
            self._begin(op, {}, error=e)
        descs = self._begin(op, {F_DTYPE: code, F_COUNT: x.size, **self._input_fields(inp)})
        with _Output(o) as ob:
            _fullmesh.all_to_all(self.rank, self.size, ob, inp.flat, self._sources(descs, op, inp), self.counters)
        self._finish(op)

    def all_to_all_v(self, out: np.ndarray, x: np.ndarray, send_counts: Sequence[int],
                     recv_counts: Sequence[int]) -> None:
        """Variable splits, packed in rank order: ``send_counts[j]`` elements of ``x`` go to rank j,
        ``recv_counts[j]`` elements from rank j land in ``out``. Collective."""
        op = "all_to_all_v"
        n = self.size
        try:
            code = _reduce.dtype_code(x.dtype, op)
            o = _flat(out, op, "output", writable=True)
            sc = np.asarray(send_counts, dtype=np.int64).reshape(-1)
            rc = np.asarray(recv_counts, dtype=np.int64).reshape(-1)
            _expect(sc.size == n and rc.size == n, lambda: f"{op}: send_counts and recv_counts need {n} entries, "
                    f"got {sc.size} and {rc.size}")
            _expect((sc >= 0).all() and (rc >= 0).all(), lambda: f"{op}: counts must not be negative")
            _expect(int(sc.sum()) <= x.size, lambda: f"{op}: send_counts add up to {int(sc.sum())} elements but the "
                    f"input has {x.size}")
            _expect(int(rc.sum()) <= o.size, lambda: f"{op}: recv_counts add up to {int(rc.sum())} elements but the "
                    f"output has {o.size}")
            _expect(o.dtype == x.dtype, lambda: f"{op}: output dtype {o.dtype} differs from input dtype {x.dtype}",
                    TypeError)
            inp = self._as_input(x, op)
        except Exception as e:
            self._begin(op, {}, error=e)
        descs = self._begin(op, {F_DTYPE: code, **self._input_fields(inp)}, ext=np.concatenate([sc, rc]))
        ext = self._rt.ctl.i64[self._ext_idx[self._calls & 1]]
        send, recv = ext[:, :n], ext[:, n:]
        bad = np.argwhere(recv != send.T)
        if bad.size:
            i, j = (int(v) for v in bad[0])
            raise CollectiveMismatch(
                f"{op}: rank {self.members[i]} expects {int(recv[i, j])} elements from rank {self.members[j]}, "
                f"which sends it {int(send[j, i])}; no data was moved")
        with _Output(o) as ob:
            _fullmesh.all_to_all_v(self.rank, n, ob, inp.flat, send, recv,
                                   self._sources(descs, op, inp, need=recv[self.rank] > 0), self.counters)
        self._finish(op)

    def broadcast(self, x: np.ndarray, root: int = 0) -> None:
        """Every rank's ``x`` receives the root's ``x``. Collective."""
        op = "broadcast"
        try:
            code = _reduce.dtype_code(x.dtype, op)
            _expect(isinstance(root, (int, np.integer)) and 0 <= root < self.size,
                    lambda: f"{op}: root {root!r} is not a rank of this communicator (size {self.size})")
            xf = _flat(x, op, "buffer", writable=True)
            inp = self._as_input(x, op) if self.rank == root else _Input(xf, None)
        except Exception as e:
            self._begin(op, {}, error=e)
        descs = self._begin(op, {F_DTYPE: code, F_COUNT: x.size, F_ROOT: root, **self._input_fields(inp)})
        with _Output(xf) as ob:
            need = np.arange(self.size) == root
            _fullmesh.broadcast(self.rank, self.size, root, ob, self._sources(descs, op, None, need), self.counters)
        self._finish(op)

    def reduce_scatter(self, out: np.ndarray, x: np.ndarray, op: str = "sum") -> None:
        """``out`` receives chunk ``rank`` of the element-wise reduction of every rank's ``x``. Collective."""
        name = "reduce_scatter"
        try:
            code = _reduce.dtype_code(x.dtype, name)
            rcode = _reduce.reduce_code(op, x.dtype, name)
            o = _flat(out, name, "output", writable=True)
            _expect(x.size == self.size * o.size, lambda: f"{name}: input has {x.size} elements, expected "
                    f"{self.size} x {o.size} = {self.size * o.size}")
            _expect(o.dtype == x.dtype, lambda: f"{name}: output dtype {o.dtype} differs from input dtype {x.dtype}",
                    TypeError)
            inp = self._as_input(x, name)
        except Exception as e:
            self._begin(name, {}, error=e)
        descs = self._begin(name, {F_DTYPE: code, F_COUNT: o.size, F_REDOP: rcode, **self._input_fields(inp)})
        with _Output(o) as ob:
            _fullmesh.reduce_scatter(self.rank, self.size, ob, code, rcode, self._sources(descs, name, inp),
                                     self.counters)
        self._finish(name)

    def all_reduce(self, x: np.ndarray, op: str = "sum") -> None:
        """In place: every rank's ``x`` becomes the element-wise reduction of all ranks' ``x``.

        Collective. Up to SMALL_ALL_REDUCE bytes: every rank reduces the whole buffer from all
        inputs (two barriers); above: reduce own chunk in place, then gather the others (three).
        """
        name = "all_reduce"
        try:
            code = _reduce.dtype_code(x.dtype, name)
            rcode = _reduce.reduce_code(op, x.dtype, name)
            xf = _flat(x, name, "buffer", writable=True)
            inp = self._as_input(x, name)
        except Exception as e:
            self._begin(name, {}, error=e)
        descs = self._begin(name, {F_DTYPE: code, F_COUNT: x.size, F_REDOP: rcode, **self._input_fields(inp)})
        src = self._sources(descs, name, inp)
        flat, n = inp.flat, self.size
        if flat.nbytes <= SMALL_ALL_REDUCE or flat.size < n:
            # small: each rank reduces the whole buffer privately, then writes its own copy;
            # after the second barrier nobody reads this rank's input any more
            scratch = self._scratch[:flat.nbytes]
            _fullmesh.all_reduce_whole(self.rank, n, scratch, flat.size, code, flat.itemsize, rcode, src,
                                       self.counters)
            self._sync(name)
            flat.view(np.uint8)[:] = scratch
            self.counters.written += flat.nbytes
            self._finish(name, departure=False)
        else:
            # large: reduce-scatter in place, then all-gather the finished chunks
            _fullmesh.all_reduce_scatter_phase(self.rank, n, flat, code, rcode, src, self.counters)
            self._sync(name)
            _fullmesh.all_reduce_gather_phase(self.rank, n, flat, src, self.counters)
            self._finish(name)
        if inp.flat.ctypes.data != xf.ctypes.data or not xf.flags.c_contiguous:
            _copy_back(x, inp.flat)
            self._rt.stats["bytes_staged"] += x.nbytes

    # --- point to point ---------------------------------------------------------------------
    def _p2p_addr(self, owner_idx: int, which: int, peer_idx: int) -> int:
        """which: 0 send_seq, 1 recv_done, 2 recv_status (u32 words)."""
        off = (Layout.SLOT_SEND_SEQ, self._lay.slot_recv_done(), self._lay.slot_recv_status())[which]
        return self._rt.ctl.base + self._slot_offs[owner_idx] + off + 4 * peer_idx

    def _p2p_desc_off(self, owner_idx: int, peer_idx: int) -> int:
        return (self._slot_offs[owner_idx] + self._lay.slot_p2p_desc()) // 8 + peer_idx * P2P_DESC

    def send(self, x: np.ndarray, dst: int) -> None:
        """Blocking send: returns once rank ``dst`` has pulled ``x`` with a matching ``recv``."""
        self._complete_send(self._post_send(x, dst))

    def sendrecv(self, x: np.ndarray, dst: int, out: np.ndarray, src: int) -> None:
        """Send ``x`` to ``dst`` while receiving into ``out`` from ``src`` (MPI_Sendrecv).

        Both halves proceed at once, so a ring of sendrecv calls cannot deadlock.
        """
        posted = self._post_send(x, dst)
        try:
            self.recv(out, src)
        except BaseException:
            try:
                self._complete_send(posted)
            except Exception:   # the receive's error is the one to report
                pass
            raise
        self._complete_send(posted)

    def _post_send(self, x: np.ndarray, dst: int) -> tuple:
        """Publish ``x`` for rank ``dst`` to pull; returns what ``_complete_send`` waits on."""
        _expect(isinstance(dst, (int, np.integer)) and 0 <= dst < self.size and dst != self.rank,
                lambda: f"send: destination {dst!r} is not another rank of this communicator (size {self.size})")
        error = None
        try:
            code = _reduce.dtype_code(x.dtype, "send")
            inp = self._as_input(x, "send")
        except Exception as e:
            error, code, inp = e, 0, None
        self._sent[dst] += 1
        seq = self._sent[dst] & 0xFFFFFFFF
        desc = np.zeros(P2P_DESC, dtype=np.int64)
        desc[F_OP], desc[F_DTYPE], desc[F_CALL] = 100, code, seq
        if inp is not None:
            desc[F_COUNT] = x.size
            for f, v in self._input_fields(inp).items():
                desc[f] = v
        if error is not None:
            desc[F_FLAGS] = FLAG_REJECTED
        i64 = self._rt.ctl.i64
        off = self._p2p_desc_off(self.rank, dst)
        i64[off:off + P2P_DESC] = desc
        flag = self._p2p_addr(self.rank, 0, dst)
        _native.store_u32(flag, seq)
        _native.futex_wake(flag, WAKE_ALL)
        return dst, seq, error, inp, x

    def _complete_send(self, posted: tuple) -> None:
        dst, seq, error, inp, x = posted
        done = self._p2p_addr(dst, 1, self.rank)
        if not _native.wait_seq_u32(done, seq, SPIN_POLLS, SLICE):
            wait_until(lambda: seq_reached(_native.load_u32(done), seq), done, self._rt.health, f"send to {dst}",
                       self._rt.config.timeout, lambda: [self.members[dst]],
                       f"rank {self.members[dst]} to receive")
        if error is not None:
            raise error
        status = _native.load_u32(self._p2p_addr(dst, 2, self.rank))
        if status:
            raise CollectiveMismatch(f"send: rank {self.members[dst]} posted a recv that does not match this "
                                     f"send ({x.size} x {x.dtype}); no data was moved")
        s = self._rt.stats
        s["calls"]["send"] = s["calls"].get("send", 0) + 1

    def recv(self, x: np.ndarray, src: int) -> None:
        """Blocking receive into ``x`` from rank ``src``; sizes and dtypes must match the send."""
        op = "recv"
        _expect(isinstance(src, (int, np.integer)) and 0 <= src < self.size and src != self.rank,
                lambda: f"recv: source {src!r} is not another rank of this communicator (size {self.size})")
        self._received[src] += 1
        seq = self._received[src] & 0xFFFFFFFF
        flag = self._p2p_addr(src, 0, self.rank)
        if not _native.wait_seq_u32(flag, seq, SPIN_POLLS, SLICE):
            wait_until(lambda: seq_reached(_native.load_u32(flag), seq), flag, self._rt.health, f"recv from {src}",
                       self._rt.config.timeout, lambda: [self.members[src]], f"rank {self.members[src]} to send")
        off = self._p2p_desc_off(src, self.rank)
        d = self._rt.ctl.i64[off:off + P2P_DESC].copy()
        status, error = 0, None
        try:
            code = _reduce.dtype_code(x.dtype, "recv")
            xf = _flat(x, "recv", "buffer", writable=True)
            if d[F_FLAGS] & FLAG_REJECTED:
                error = CollectiveMismatch(f"recv: rank {self.members[src]} rejected its send arguments; "
                                           f"no data was moved")
            elif d[F_DTYPE] != code or d[F_COUNT] != x.size:
                status = 1
                error = CollectiveMismatch(
                    f"recv: rank {self.members[src]} sends {int(d[F_COUNT])} x "
                    f"{_value_name(F_DTYPE, int(d[F_DTYPE]))}, this rank expects {x.size} x {x.dtype}; "
                    f"no data was moved")
            elif x.nbytes:
                self._rt.reg.ensure_ready(self.members[src], int(d[F_SEG_VA]), int(d[F_SEG_SIZE]),
                                          int(d[F_SEG_OFF]), int(d[F_EPOCH]), op)
                with _Output(xf) as ob:
                    ob.view(np.uint8)[:] = self._rt.window.view(int(d[F_ADDR]), x.nbytes)
                s = self._rt.stats
                s["bytes_pulled"] += x.nbytes
                s["output_bytes_written"] += x.nbytes
        except Exception as e:
            status, error = 1, e
        _native.store_u32(self._p2p_addr(self.rank, 2, src), status)
        done = self._p2p_addr(self.rank, 1, src)
        _native.store_u32(done, seq)
        _native.futex_wake(done, WAKE_ALL)
        if error is not None:
            raise error
        s = self._rt.stats
        s["calls"]["recv"] = s["calls"].get("recv", 0) + 1

    # --- sub-communicators ------------------------------------------------------------------
    def split(self, color: int | None, key: int = 0) -> "Communicator | None":
        """MPI_Comm_split: ranks with the same ``color`` form a communicator, ordered by
        (``key``, rank here). ``color=None`` (or negative) takes part but gets None. Collective."""
        op = "split"
        try:
            _expect(color is None or isinstance(color, (int, np.integer)), lambda: f"{op}: color must be an int or None")
            _expect(isinstance(key, (int, np.integer)), lambda: f"{op}: key must be an int")
        except Exception as e:
            self._begin(op, {}, error=e)
        color = -1 if color is None or color < 0 else int(color)
        slot = self._rt.reserve_slot() if color >= 0 else -1
        descs = self._begin(op, {F_AUX0: color, F_AUX1: int(key), F_AUX2: slot})
        s = self._rt.stats
        s["calls"]["split"] = s["calls"].get("split", 0) + 1
        if color < 0:
            return None
        mine = [(int(descs[i, F_AUX1]), i) for i in range(self.size) if int(descs[i, F_AUX0]) == color]
        mine.sort()
        return Communicator(self._rt, [self.members[i] for _, i in mine], [int(descs[i, F_AUX2]) for _, i in mine])


def _expect(cond: bool, message, kind: type = ValueError) -> None:
    """Raise ``kind(message)`` unless ``cond``; ``message`` may be a callable, built only on failure."""
    if not cond:
        raise kind(message() if callable(message) else message)


def _flat(a: np.ndarray, operation: str, what: str, writable: bool = False) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{operation}: the {what} must be a numpy array, got {type(a).__name__}")
    if writable and not a.flags.writeable:
        raise ValueError(f"{operation}: the {what} array is read-only")
    return a.reshape(-1) if a.flags.c_contiguous else a


class _Output:
    """A contiguous 1-D target for an output; non-contiguous outputs go through a copy."""

    def __init__(self, a: np.ndarray):
        self.a = a

    def __enter__(self) -> np.ndarray:
        if self.a.ndim == 1 and self.a.flags.c_contiguous:
            self.tmp = None
            return self.a
        self.tmp = np.ascontiguousarray(self.a).reshape(-1)
        return self.tmp

    def __exit__(self, *exc) -> None:
        if self.tmp is not None and exc[0] is None:
            self.a[...] = self.tmp.reshape(self.a.shape)


def _copy_back(x: np.ndarray, flat: np.ndarray) -> None:
    x[...] = flat.reshape(x.shape)
