"""Communicator: the public operations, their argument checks, and what each decides. Its
methods live in a few parts: this module (the operators the native mesh machine runs: barrier,
all_gather, all_to_all, broadcast, reduce_scatter, all_reduce; point to point), _pipelined.py
(all_to_all_v, gather, scatter: the call pipeline's stages alone), _program.py (modeled time,
host rows). Every call runs through the communicator's pipeline (runtime/pipeline/_call.py),
which front ends outside the runtime use too. The rest is done by the components it is made
of, each owning its state and given, when made (in this order), the components it uses:

    Modeling       pipeline/_modeling.py   modeled clock: entering time, exit (tick); algorithm choice
    SlotProtocol   pipeline/_protocol.py   slot words, call and barrier counts; publish, barriers,
                                           agreement, a mismatch's message
    Executor       pipeline/_execute.py    the call's buffer table, peers' readiness, compiled phases
                                           run on the call's path (the cores or the SDMA engine)
    Buffers        pipeline/_buffers.py    zero copy or staged, eager slots
    RingSteps      _ringsteps.py           a ring call's entry, steps and scratch buffer
    MeshDriver     _mesh.py                full-mesh records: built, run, replayed, resumed
    PointToPoint   _p2p.py                 every peer's send and receive words; the calls

One collective call, end to end (the data path):

    comm.op(arrays, scalars)   the operation as a native method: a repeated call on the same
        |                      arrays replays its record with no Python (_prepared.py)
    _check_<op>                argument checks, raised on every rank of the call (a rank that
        |                      rejects its own arguments tells its peers why: SlotProtocol.begin);
        |                      input in own HBM? zero copy; else staged (Buffers)
    plan                       the operator's remote-slice phases (collectives._slices),
        |                      compiled once per call shape (collectives._backend, Executor)
    full mesh: MeshDriver      the call's record, run by native code's mesh machine: entry
        |                      barrier and agreement, readiness of peers' buffers, phases on
        |                      the cores (kernels) or the SDMA engine, departure (_native.c)
    ring / variable splits     the same protocol step by step (SlotProtocol, RingSteps)
        |
    completion                 bytes and calls counted natively; the modeled clock ticks
                               (Modeling); an output that was staged is copied out

Native code reads a few names on the communicator itself (_native.NAMES_READ): ``_cx``,
``_arrived``, ``_replayed``, ``_p2p_replayed``, the components' own, bound when it is made, and
``_path``, which each operation's wrapper sets (runtime/pipeline/_work.py). The operations' common case,
a repeated blocking call with positional arguments, no modeled clock and no debug logging, runs
in native code from the method call on (``_native_method``); at N = 32 on two cores every
microsecond of a rank's Python costs about 16 of the call (docs/performance.md).
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

import numpy as np

from ..._errors import TooManyCommunicators
from ...collectives import OUT, SCRATCH, Counters, dtype_code, reduce_code, slices
from .. import _native
from .._native import MESH_BARRIER, MESH_NO_DEPARTURE, MESH_ROOT, MESH_ROOT_READER, T_NATIVE
from ..pipeline import (
    EAGER_BYTES, EAGER_CHUNKS_READ, OPS, Buffers, CallInput, Executor, Modeling, Pipeline, RankServices, SlotProtocol,
    Worker, aliased, as_flat, collective, copy_back, dtype_of, expect,
)
from ..services import F_AUX0, F_AUX1, F_AUX2, SLICE, SPIN_POLLS
from ._mesh import MeshDriver
from ._p2p import PointToPoint
from ._pipelined import PipelinedOperators
from ._prepared import (
    AllGatherArgs, AllReduceArgs, AllToAllArgs, BroadcastArgs, PreparedCalls, ReduceScatterArgs, _native_method,
)
from ._program import ProgramTime
from ._ringsteps import RingSteps

log = logging.getLogger("stratacl")

_native.set_barrier(OPS["barrier"], SPIN_POLLS, SLICE, log.isEnabledFor, logging.DEBUG, getattr(log, "_cache", None))


class Communicator(ProgramTime, PipelinedOperators):
    """A group of ranks that run collectives together (MPI semantics for ``split``).

    Every collective method is a *collective operation*: all ranks of the communicator must
    call it in the same order with agreeing arguments, and it is host-blocking.

    ``rank`` is this rank's index in the communicator, ``size`` the number of members and
    ``members`` their world ranks, in communicator order.
    """

    def __init__(self, rt: RankServices, members: Sequence[int], slots: Sequence[int]):
        """The communicator of world ranks ``members`` (this process's ``rt``, the Runtime of
        runtime/_world.py, among them), each using its communicator slot ``slots[i]``. Made
        by ``init()`` and ``split``, not by users."""
        self._rt = rt
        rt.communicators.add(self)          # shut by finalize()
        self.members = list(members)
        self.size = len(self.members)
        self.rank = self.members.index(rt.rank)
        self._worker: Worker | None = None
        self._call_counts = rt.stats["calls"]
        self._modeling = Modeling(rt, self.members, self.rank)
        self.counters = Counters()    # summed over the rank's communicators by stats()
        rt.byte_counters.append(self.counters)
        self._protocol = SlotProtocol(rt, self.members, self.rank, slots, self.counters.words, self._modeling)
        self._modeling.key = self._protocol.slot_offs[0]
        self._executor = Executor(rt, self.members, self.rank, self._protocol)
        self._buffers = Buffers(rt, self._protocol)
        self._ring = RingSteps(rt, self.members, self.rank, self._protocol, self._executor, self._buffers)
        self._mesh = MeshDriver(rt, self.size, self._protocol, self._executor, self._buffers, self._modeling)
        self._prepared = PreparedCalls()       # checked arguments of repeated calls (_prepared.py)
        self._p2p = PointToPoint(rt, self.members, self.rank, self._protocol, self._executor, self._buffers,
                                 self._modeling, self._prepared)
        self._bases = self._executor.bases      # the call's buffers, which the operators name
        self._pipe = Pipeline(self, rt, self._executor, self._modeling, self._protocol, self._buffers)
        self._cx = self._protocol.cx            # what native code reads (see the module docstring)
        self._arrived = self._protocol.arrived
        self._replayed = self._mesh.resume
        self._p2p_replayed = self._p2p.replayed
        self._default_path = self._executor.default_path
        self._overlap_path = self._executor.overlap_path
        self._path = self._default_path

    def _shut(self) -> None:
        """At ``finalize()``: every later operation raises NotInitialized. A stopped worker
        takes them (runtime/pipeline/_work.py, Worker.submit refuses), and native code, which runs a
        call itself only while the T_NATIVE word is set, hands them to it."""
        if self._worker is None:
            self._worker = Worker("", start=False)
        self._protocol.tally[T_NATIVE] = 0

    def _start_worker(self) -> Worker:
        """The thread that runs this communicator's operations once one is asynchronous."""
        self._worker = Worker(f"stratacl-comm-{self._rt.rank}-{self._protocol.slot_offs[0]:x}")
        self._rt.workers.append(self._worker)
        self._protocol.tally[T_NATIVE] = 0       # calls now go through the worker, in order
        return self._worker

    @property
    def topology(self):
        """The job's topology (``ub.Topology``): the levels and tiers ranks talk over and the
        fabric model's parameters; rank numbers are world ranks (``members``). Local."""
        return self._rt.topology

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}, members={self.members})"

    # --- collectives ------------------------------------------------------------------------
    @collective
    def barrier(self) -> None:
        """Block until every rank of the communicator has called barrier. Collective."""
        self._pipe.tick_schedule("barrier", self._protocol.enter("barrier"), 0)
        calls = self._call_counts          # completed calls, as for every operation
        calls["barrier"] = calls.get("barrier", 0) + 1

    # The common case, a blocking call with no worker, no modeled clock and no debug logging,
    # is native (_replay.c, barrier_call): at N = 32 on two cores each microsecond of a rank's
    # Python is about 16 of the barrier's (performance.md). It calls _barrier for anything else.
    _barrier = barrier
    barrier = _native.barrier_method

    @collective
    def all_gather(self, out: np.ndarray, x: np.ndarray) -> None:
        """``out`` (size * x.size elements) receives every rank's ``x``, rank-major. Collective.

        In place: ``x`` may be this rank's chunk of ``out`` (zero copy); an ``x`` overlapping
        ``out`` otherwise is copied first."""
        op = "all_gather"
        key = (op, id(out), id(x)) if self._path is self._default_path else None
        code, algo, eager, inp, plan, out_addr, target, replay = self._prepared.get(
            key, (out, x), self._check_all_gather, out, x)
        if replay is not None and self._mesh.replay(replay):
            return
        me, n, nb = self.rank, self.size, x.nbytes
        if eager:
            inp = self._buffers.eager_input(as_flat(x, op, "input"))
        self._bases[OUT, me] = out_addr
        if algo == "ring":
            parity = self._ring.enter(op, OUT, target, code, x.size, 0, inp)
            steps = self._executor.phases(("ring_all_gather", nb), lambda: [
                m for s in range(n - 1) for m in slices.ring_all_gather_step(me, n, nb, s)])
            self._ring.run(op, steps, self._path)
            self._protocol.finish(op)
        else:
            parity = self._mesh.call(op, self._path, inp, plan, MESH_NO_DEPARTURE if eager else MESH_BARRIER, code,
                                     x.size)
        if target is not None:
            self._buffers.output_done(out, target)
        self._pipe.tick_schedule(op, parity, x.nbytes, algo, itemsize=x.itemsize)

    _all_gather = all_gather
    all_gather = _native_method(all_gather, "aa")

    def _check_all_gather(self, out: np.ndarray, x: np.ndarray) -> tuple[tuple, bool]:
        """all_gather's argument checks (raising on every rank of the call), and what they decided
        (see _prepared.py): dtype code, algorithm, eager, the input (None: the eager copy, made
        per call), the mesh's plan, the output's address, where it is written (None: in place),
        the call's MeshCall (None: not replayed natively)."""
        op = "all_gather"
        try:
            code = dtype_code(dtype_of(x, op, "input"), op)
            o = as_flat(out, op, "output", writable=True)
            self._buffers.check_mapped(o, op, "output")
            expect(o.size == self.size * x.size, lambda: f"{op}: output has {o.size} elements, expected "
                   f"{self.size} x {x.size} = {self.size * x.size}")
            expect(o.dtype == x.dtype, lambda: f"{op}: output dtype {o.dtype} differs from input dtype {x.dtype}",
                   TypeError)
            algo = self._modeling.algo_for(op, x.nbytes, x.itemsize)
            eager = algo == "mesh" and x.nbytes <= EAGER_BYTES
            if self._path is not self._default_path:
                self._executor.check_path(op, self._path)
            if eager:                      # an eager input is read per call, but checked here
                self._buffers.check_mapped(as_flat(x, op, "input"), op, "input")
            own = o[self.rank * x.size:(self.rank + 1) * x.size]
            inp = None if eager else self._buffers.as_input(x, op, aliased(o, x, (x, own)))
            target = self._buffers.output(o, hbm=algo == "ring")
        except Exception as e:
            self._protocol.begin(op, {}, error=e)
        me, n, nb = self.rank, self.size, x.nbytes
        plan = (self._executor.phase(("all_gather", nb), lambda: slices.all_gather(me, n, nb), shared=True)
                if algo == "mesh" else None)
        out_addr = _native.data_address(target)
        if algo == "mesh" and target is o:
            held = None if eager else inp.in_place_of(x)
            if eager:
                replay = self._mesh.record(op, self._path, None, plan, MESH_NO_DEPARTURE, code, x.size,
                                           out_addr=out_addr, eager=x)
                return AllGatherArgs(code, algo, eager, None, plan, out_addr, None, replay), True
            if held is not None:
                replay = self._mesh.record(op, self._path, held, plan, MESH_BARRIER, code, x.size, out_addr=out_addr)
                return AllGatherArgs(code, algo, eager, held, plan, out_addr, None, replay), True
        return AllGatherArgs(code, algo, eager, inp, plan, out_addr, target, None), False

    @collective
    def all_to_all(self, out: np.ndarray, x: np.ndarray) -> None:
        """Equal splits: chunk j of rank i's ``x`` lands in chunk i of rank j's ``out``. Collective.

        ``out`` may be ``x`` or overlap it (in place): ``x`` is then copied first."""
        op = "all_to_all"
        key = (op, id(out), id(x)) if self._path is self._default_path else None
        code, inp, plan, out_addr, target, replay = self._prepared.get(key, (out, x), self._check_all_to_all, out, x)
        if replay is not None and self._mesh.replay(replay):
            return
        self._bases[OUT, self.rank] = out_addr
        parity = self._mesh.call(op, self._path, inp, plan, MESH_BARRIER, code, x.size)
        if target is not None:
            self._buffers.output_done(out, target)
        self._pipe.tick_schedule(op, parity, x.nbytes, itemsize=x.itemsize)

    _all_to_all = all_to_all
    all_to_all = _native_method(all_to_all, "aa")

    def _check_all_to_all(self, out: np.ndarray, x: np.ndarray) -> tuple[tuple, bool]:
        """all_to_all's checks and what they decided (as _check_all_gather)."""
        op = "all_to_all"
        try:
            code = dtype_code(dtype_of(x, op, "input"), op)
            o = as_flat(out, op, "output", writable=True)
            self._buffers.check_mapped(o, op, "output")
            expect(x.size % self.size == 0, lambda: f"{op}: input has {x.size} elements, not divisible by "
                   f"{self.size} ranks")
            expect(o.size == x.size, lambda: f"{op}: output has {o.size} elements, expected {x.size}")
            expect(o.dtype == x.dtype, lambda: f"{op}: output dtype {o.dtype} differs from input dtype {x.dtype}",
                   TypeError)
            if self._path is not self._default_path:
                self._executor.check_path(op, self._path)
            inp = self._buffers.as_input(x, op, aliased(o, x))
            target = self._buffers.output(o)
        except Exception as e:
            self._protocol.begin(op, {}, error=e)
        me, n, nb = self.rank, self.size, x.nbytes
        plan = self._executor.phase(("all_to_all", nb), lambda: slices.all_to_all(me, n, nb))
        out_addr = _native.data_address(target)
        held = inp.in_place_of(x) if target is o else None
        if held is not None:
            replay = self._mesh.record(op, self._path, held, plan, MESH_BARRIER, code, x.size, out_addr=out_addr)
            return AllToAllArgs(code, held, plan, out_addr, None, replay), True
        return AllToAllArgs(code, inp, plan, out_addr, target, None), False

    @collective
    def broadcast(self, x: np.ndarray, root: int = 0) -> None:
        """Every rank's ``x`` receives the root's ``x``. Collective."""
        op = "broadcast"
        key = (op, id(x), root) if type(root) is int and self._path is self._default_path else None
        code, inp, plan, target, replay = self._prepared.get(key, (x,), self._check_broadcast, x, root)
        if replay is not None and self._mesh.replay(replay):
            return
        # a reader pulls into its own buffer, which it names as its input (bases[IN, me])
        parity = self._mesh.call(op, self._path, inp, plan, MESH_ROOT if self.rank == root else MESH_ROOT_READER, code,
                                 x.size, root, only=root)
        if target is not None:
            self._buffers.output_done(x, target)
        self._pipe.tick_schedule(op, parity, x.nbytes, root=root, itemsize=x.itemsize)

    _broadcast = broadcast
    broadcast = _native_method(broadcast, "as")

    def _check_broadcast(self, x: np.ndarray, root: int) -> tuple[tuple, bool]:
        """broadcast's checks and what they decided: dtype code, this rank's input (the root's
        buffer, or where a reader pulls to), a reader's plan (None at the root), where a reader
        writes (None: in place), the MeshCall (as _check_all_gather)."""
        op = "broadcast"
        try:
            code = dtype_code(dtype_of(x, op, "buffer"), op)
            expect(isinstance(root, (int, np.integer)) and 0 <= root < self.size,
                   lambda: f"{op}: root {root!r} is not a rank of this communicator (size {self.size})")
            if self._path is not self._default_path:
                self._executor.check_path(op, self._path)
            xf = as_flat(x, op, "buffer", writable=True)
            self._buffers.check_mapped(xf, op, "buffer")
            inp = self._buffers.as_input(x, op) if self.rank == root else CallInput(xf, None)
            target = self._buffers.output(xf) if self.rank != root else xf
        except Exception as e:
            self._protocol.begin(op, {}, error=e)
        me, n, nb = self.rank, self.size, x.nbytes
        if me == root:
            held = inp.in_place_of(x)
            if held is None:
                return BroadcastArgs(code, inp, None, None, None), False
            replay = self._mesh.record(op, self._path, held, None, MESH_ROOT, code, x.size, root, only=root)
            return BroadcastArgs(code, held, None, None, replay), True
        plan = self._executor.phase(("broadcast", nb, root), lambda: slices.broadcast(me, n, nb, root), shared=True)
        if target is xf:         # in place: remember the address only, not the caller's array
            own = CallInput(None, None, _native.data_address(xf) if nb else 0, nb)
            replay = self._mesh.record(op, self._path, own, plan, MESH_ROOT_READER, code, x.size, root, only=root)
            return BroadcastArgs(code, own, plan, None, replay), True
        return BroadcastArgs(code, CallInput(target, None), plan, target, None), False

    @collective
    def reduce_scatter(self, out: np.ndarray, x: np.ndarray, op: str = "sum") -> None:
        """``out`` receives chunk ``rank`` of the element-wise reduction of every rank's ``x``. Collective.

        In place: ``out`` may be this rank's chunk of ``x`` (zero copy); an ``out`` overlapping
        ``x`` otherwise has ``x`` copied first.

        Mesh: every output element is reduced in rank order. Ring: chunk c is reduced in the
        order the ring visits the ranks, c+1, c+2, ..., c (runtime/communicator/_ringsteps.py)."""
        name = "reduce_scatter"
        key = (name, id(out), id(x), op) if type(op) is str and self._path is self._default_path else None
        code, rcode, algo, inp, plan, out_addr, target, replay = self._prepared.get(
            key, (out, x), self._check_reduce_scatter, out, x, op)
        if replay is not None and self._mesh.replay(replay):
            return
        me, n, count, item = self.rank, self.size, x.size, x.itemsize
        self._bases[OUT, me] = out_addr
        if algo == "ring":
            parity = self._ring.enter(name, SCRATCH, self._ring.scratch(x.nbytes), code, out.size, rcode, inp)
            steps = self._executor.phases(("ring_reduce_scatter", count, item), lambda: [
                m for s in range(n - 1) for m in slices.ring_reduce_scatter_step(me, n, count, item, s)], item)
            self._ring.run(name, steps, self._path, code, rcode)
            self._protocol.finish(name)
        else:
            parity = self._mesh.call(name, self._path, inp, plan, MESH_BARRIER, code, out.size, 0, rcode, float(n))
        if target is not None:
            self._buffers.output_done(out, target)
        self._pipe.tick_schedule(name, parity, x.nbytes, algo, itemsize=x.itemsize)

    _reduce_scatter = reduce_scatter
    reduce_scatter = _native_method(reduce_scatter, "aas")

    def _check_reduce_scatter(self, out: np.ndarray, x: np.ndarray, op: str) -> tuple[tuple, bool]:
        """reduce_scatter's checks and what they decided (as _check_all_gather, with the reduce op)."""
        name = "reduce_scatter"
        try:
            code = dtype_code(dtype_of(x, name, "input"), name)
            rcode = reduce_code(op, x.dtype, name)
            o = as_flat(out, name, "output", writable=True)
            self._buffers.check_mapped(o, name, "output")
            expect(x.size == self.size * o.size, lambda: f"{name}: input has {x.size} elements, expected "
                   f"{self.size} x {o.size} = {self.size * o.size}")
            expect(o.dtype == x.dtype, lambda: f"{name}: output dtype {o.dtype} differs from input dtype {x.dtype}",
                   TypeError)
            if self._path is not self._default_path:
                self._executor.check_path(name, self._path)
            own = as_flat(x, name, "input")[self.rank * o.size:(self.rank + 1) * o.size]
            inp = self._buffers.as_input(x, name, aliased(o, x, (o, own)))
            algo = self._modeling.algo_for(name, x.nbytes, x.itemsize)
            target = self._buffers.output(o)
        except Exception as e:
            self._protocol.begin(name, {}, error=e)
        me, n, count, item = self.rank, self.size, x.size, x.itemsize
        plan = None
        if algo == "mesh":
            plan = self._executor.phase(("reduce_scatter", count, item),
                                        lambda: slices.reduce_scatter(me, n, count, item), item)
        out_addr = _native.data_address(target)
        held = inp.in_place_of(x) if algo == "mesh" and target is o else None
        if held is not None:
            replay = self._mesh.record(name, self._path, held, plan, MESH_BARRIER, code, o.size, 0, rcode, float(n),
                                     out_addr=out_addr)
            return ReduceScatterArgs(code, rcode, algo, held, plan, out_addr, None, replay), True
        return ReduceScatterArgs(code, rcode, algo, inp, plan, out_addr, target, None), False

    @collective
    def all_reduce(self, x: np.ndarray, op: str = "sum") -> None:
        """In place: every rank's ``x`` becomes the element-wise reduction of all ranks' ``x``.

        Collective. Mesh, up to EAGER_BYTES: every rank reduces the whole buffer from all
        ranks' eager copies (one barrier; runtime/pipeline/_buffers.py), or, once that would read
        EAGER_CHUNKS_READ bytes or more, its own chunk of them and gathers the others' reduced
        chunks (two barriers); above: reduce own chunk in
        place, then gather the others (three); every element is reduced in rank order. Ring: ring reduce-scatter, a barrier,
        ring all-gather; chunk c is reduced in the order c+1, ..., c (runtime/communicator/_ringsteps.py).
        """
        name = "all_reduce"
        key = (name, id(x), op) if type(op) is str and self._path is self._default_path else None
        code, rcode, algo, eager, inp, first, second, out_addr, target, replay = self._prepared.get(
            key, (x,), self._check_all_reduce, x, op)
        if replay is not None and self._mesh.replay(replay):
            return
        n, me, count, item = self.size, self.rank, x.size, x.itemsize
        bases = self._bases
        if eager:
            # every rank reduces the whole buffer (or its chunk) from the peers' eager copies
            # straight into x: nobody reads x, and the copies stay valid until the next call's
            # arrival barrier
            inp = self._buffers.eager_input(as_flat(x, name, "buffer"))
            bases[OUT, me] = out_addr
            parity = self._mesh.call(name, self._path, inp, first, MESH_NO_DEPARTURE, code, count, 0, rcode, float(n),
                                     second)
            if target is not None:
                self._buffers.output_done(x, target)
            self._pipe.tick_schedule(name, parity, x.nbytes, algo, itemsize=item)
            return
        if algo == "ring":
            parity = self._ring.enter(name, SCRATCH, self._ring.scratch(x.nbytes), code, count, rcode, inp)
            steps = self._executor.phases(("ring_all_reduce", count, item), lambda: [
                m for s in range(2 * (n - 1)) for m in slices.ring_all_reduce_step(me, n, count, item, s)], item)
            self._ring.run(name, steps, self._path, code, rcode, barrier=lambda: self._protocol.sync(name))
            self._protocol.finish(name)
        else:
            # large: reduce own chunk in place, barrier, gather the finished chunks; fewer
            # elements than ranks: reduce the whole buffer privately, barrier (nobody reads this
            # rank's input any more), copy it back
            scratch = np.empty(x.nbytes, np.uint8) if count < n else None
            if scratch is not None:
                bases[SCRATCH, me] = _native.data_address(scratch)
            departure = MESH_BARRIER if scratch is None else MESH_NO_DEPARTURE
            parity = self._mesh.call(name, self._path, inp, first, departure, code, count, 0, rcode, float(n), second)
        if target is not None:       # the input was staged: the result is in the staged copy
            copy_back(x, target)
            self._rt.stats["bytes_staged"] += x.nbytes
        self._pipe.tick_schedule(name, parity, x.nbytes, algo, itemsize=item)

    _all_reduce = all_reduce
    all_reduce = _native_method(all_reduce, "as")

    def _check_all_reduce(self, x: np.ndarray, op: str) -> tuple[tuple, bool]:
        """all_reduce's checks and what they decided: dtype and reduce codes, algorithm, eager,
        the input (None: the eager copy, made per call), the mesh's phases, and where the
        result is written: eager, the output's address and array (None: x in place); otherwise
        the staged copy to copy back (None: x was reduced in place); the MeshCall (as
        _check_all_gather)."""
        name = "all_reduce"
        try:
            code = dtype_code(dtype_of(x, name, "buffer"), name)
            rcode = reduce_code(op, x.dtype, name)
            xf = as_flat(x, name, "buffer", writable=True)
            self._buffers.check_mapped(xf, name, "buffer")
            if self._path is not self._default_path:
                self._executor.check_path(name, self._path)
            algo = self._modeling.algo_for(name, x.nbytes, x.itemsize)
            eager = algo == "mesh" and x.nbytes <= EAGER_BYTES
            inp = None if eager else self._buffers.as_input(x, name)
        except Exception as e:
            self._protocol.begin(name, {}, error=e)
        n, me, count, item, nb = self.size, self.rank, x.size, x.itemsize, x.nbytes
        first = second = None
        if eager:
            target = self._buffers.output(xf)
            if count >= n and n * nb >= EAGER_CHUNKS_READ:
                first, second = self._executor.phases(("all_reduce_eager_chunks", count, item),
                                                      lambda: slices.all_reduce_eager_chunks(me, n, count, item), item)
            else:
                first = self._executor.phase(("all_reduce_eager", nb, item),
                                             lambda: slices.all_reduce_eager(me, n, nb), item)
            out_addr = _native.data_address(target)
            if target is xf:
                replay = self._mesh.record(name, self._path, None, first, MESH_NO_DEPARTURE, code, count, 0, rcode,
                                           float(n), second, out_addr=out_addr, eager=x)
                return AllReduceArgs(code, rcode, algo, True, None, first, second, out_addr, None, replay), True
            return AllReduceArgs(code, rcode, algo, True, None, first, second, out_addr, target, None), False
        if algo == "mesh":
            first, second = self._executor.phases(("all_reduce", count, item),
                                                  lambda: slices.all_reduce(me, n, count, item, small=0), item)
        staged = inp.flat if inp.addr != _native.data_address(xf) or not xf.flags.c_contiguous else None
        held = inp.in_place_of(x) if algo == "mesh" and count >= n else None
        if held is not None:
            replay = self._mesh.record(name, self._path, held, first, MESH_BARRIER, code, count, 0, rcode, float(n),
                                       second)
            return AllReduceArgs(code, rcode, algo, False, held, first, second, 0, None, replay), True
        return AllReduceArgs(code, rcode, algo, False, inp, first, second, 0, staged, None), False

    # --- point to point (runtime/communicator/_p2p.py) ---------------------------------------------------
    @collective
    def send(self, x: np.ndarray, dst: int) -> None:
        """Blocking send: returns once rank ``dst`` has pulled ``x`` with a matching ``recv``."""
        self._p2p.call("send", x, dst, None, 0, self._path)

    @collective
    def recv(self, x: np.ndarray, src: int) -> None:
        """Blocking receive into ``x`` from rank ``src``; sizes and dtypes must match the send."""
        self._p2p.call("recv", None, 0, x, src, self._path)

    @collective
    def sendrecv(self, x: np.ndarray, dst: int, out: np.ndarray, src: int) -> None:
        """Send ``x`` to ``dst`` while receiving into ``out`` from ``src`` (MPI_Sendrecv).

        Both halves proceed at once, so a ring of sendrecv calls cannot deadlock. ``out`` may be
        ``x`` or overlap it (MPI_Sendrecv_replace): ``x`` is then copied first.
        """
        path = self._path
        key = (("sendrecv", id(x), dst, id(out), src)
               if type(dst) is int and type(src) is int and path is self._default_path else None)
        call = self._prepared.get(key, (x, out), self._p2p.check_sendrecv, x, dst, out, src, path)
        if call is None:
            self._p2p.call("sendrecv", x, dst, out, src, path)
            return
        r = _native.p2p_replay(self, call)       # prepared: the whole call in one native call
        if r is not None:
            self._p2p_replayed(call, r, x, dst, out, src)

    # The prepared common case is native (_replay.c, PreparedMethod); it calls _sendrecv for
    # anything else.
    _sendrecv = sendrecv
    sendrecv = _native.prepared_method("sendrecv", ("x", "dst", "out", "src"), "asas", (), "_sendrecv",
                                       _native.METHOD_SENDRECV, sendrecv)

    # --- sub-communicators ------------------------------------------------------------------
    @collective
    def split(self, color: int | None, key: int = 0) -> Communicator | None:
        """MPI_Comm_split: ranks with the same ``color`` form a communicator, ordered by
        (``key``, rank here). ``color=None`` (or negative) takes part but gets None. Collective."""
        op = "split"
        try:
            expect(color is None or isinstance(color, (int, np.integer)), lambda: f"{op}: color must be an int or None")
            expect(isinstance(key, (int, np.integer)), lambda: f"{op}: key must be an int")
        except Exception as e:
            self._protocol.begin(op, {}, error=e)
        color = -1 if color is None or color < 0 else int(color)
        try:
            slot = self._rt.reserve_slot() if color >= 0 else -1
        except TooManyCommunicators as e:        # the peers are told, as for a rejected argument
            self._protocol.begin(op, {}, error=e)
        try:
            descs = self._protocol.begin(op, {F_AUX0: color, F_AUX1: int(key), F_AUX2: slot})
        except BaseException:
            if slot >= 0:            # a peer rejected the split: no communicator holds the slot
                self._rt.release_slot(slot)
            raise
        s = self._rt.stats
        s["calls"]["split"] = s["calls"].get("split", 0) + 1
        if color < 0:
            return None
        mine = [(int(descs[i, F_AUX1]), i) for i in range(self.size) if int(descs[i, F_AUX0]) == color]
        mine.sort()
        return Communicator(self._rt, [self.members[i] for _, i in mine], [int(descs[i, F_AUX2]) for _, i in mine])

    def subgroup(self, ranks: Sequence[int], agree: Callable[[int], Sequence[int]]) -> Communicator:
        """The communicator of ``ranks`` (ranks of this communicator, in the new one's order),
        made by those ranks alone (MPI_Comm_create_group): collective over ``ranks`` only, the
        other ranks of this communicator take no part. Where every rank can take part, ``split``
        needs nothing more.

        ``agree(slot)`` must publish this rank's communicator slot to the other members and
        return every member's slot, in the order of ``ranks``: the members share no call of
        this communicator to agree through, so the caller brings the channel (torch.distributed
        brings its key-value store; stratacl/torch/_groups.py). Local apart from ``agree``."""
        op = "subgroup"
        ranks = [int(r) for r in ranks]
        if sorted(set(ranks)) != sorted(ranks) or not all(0 <= r < self.size for r in ranks):
            raise ValueError(f"{op}: ranks {ranks} must be distinct ranks of this communicator (size {self.size})")
        if self.rank not in ranks:
            raise ValueError(f"{op}: rank {self.rank} is not among the members {ranks}; only members call subgroup")
        slots = [int(s) for s in agree(self._rt.reserve_slot())]
        if len(slots) != len(ranks):
            raise ValueError(f"{op}: agree() returned {len(slots)} slots for {len(ranks)} members")
        s = self._rt.stats
        s["calls"][op] = s["calls"].get(op, 0) + 1
        return Communicator(self._rt, [self.members[r] for r in ranks], slots)
