"""Communicator: the public operations and the components that run them. Its methods live in
a few parts: this module (barrier, point to point, split, subgroup), _meshops.py (the
operators the native mesh machine runs: all_gather, all_to_all, broadcast, reduce_scatter,
all_reduce, reduce, each its argument check), _pipelined.py (all_to_all_v, gather, scatter:
the call pipeline's stages alone), _program.py (modeled time, host rows). Every call runs
through the communicator's pipeline (runtime/pipeline/_call.py), which front ends outside the
runtime use too. The rest is done by the components it is made of, each owning its state and
given, when made (in this order), the components it uses:

    Modeling       pipeline/_modeling.py   modeled clock: entering time, exit (tick); algorithm choice
    SlotProtocol   pipeline/_protocol.py   slot words, call and barrier counts; the entry (publish,
                                           arrive, agree), barriers, a mismatch's message
    Executor       pipeline/_execute.py    the call's buffer table, peers' readiness, compiled phases
                                           run on the call's path (the cores or the SDMA engine)
    Buffers        pipeline/_buffers.py    zero copy or staged, eager slots
    RingSteps      _ringsteps.py           a ring call: entry, steps, scratch buffer
    MeshDriver     _mesh.py                full-mesh records: built, run, replayed, resumed
    PointToPoint   _p2p.py                 every peer's send and receive words; the calls

A collective call end to end (the data path) is drawn once, in docs/architecture.md.

Native code reads the communicator through one tuple, ``_native_view``, laid out by NV_*
(runtime/_native.h): the components' words and methods it needs, bound when it is made. The
operations' common case, a repeated blocking call with positional arguments, no modeled clock and no debug
logging, runs in native code from the method call on (_meshops.py, ``mesh_operator``); at
N = 32 on two cores every microsecond of a rank's Python costs about 16 of the call
(docs/performance.md).
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

import numpy as np

from ..._errors import TooManyCommunicators
from ...collectives import Counters
from .. import _native
from .._native import T_NATIVE
from ..pipeline import OPS, Buffers, Executor, Modeling, Pipeline, RankServices, SlotProtocol, Worker, collective, expect
from ..services import F_AUX0, F_AUX1, F_AUX2, SLICE, SPIN_POLLS
from ._mesh import MeshDriver
from ._meshops import MeshOperators
from ._p2p import PointToPoint
from ._pipelined import PipelinedOperators
from ._prepared import PreparedCalls
from ._program import ProgramTime
from ._ringsteps import RingSteps

log = logging.getLogger("stratacl")


class Communicator(ProgramTime, MeshOperators, PipelinedOperators):
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
        # what native code reads of this communicator (runtime/_native.h, NV_*)
        view = [None] * _native.NV_LEN
        view[_native.NV_CX], view[_native.NV_ARRIVED] = self._protocol.cx, self._protocol.arrived
        view[_native.NV_PREPARED] = self._prepared._entries      # never replaced, only cleared
        view[_native.NV_MESH_STOPPED], view[_native.NV_P2P_STOPPED] = self._mesh.resume, self._p2p.replayed
        self._native_view = tuple(view)
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
    # Python is about 16 of the barrier's (performance.md). It calls _barrier for anything else
    # (set_barrier, below the class).
    _barrier = barrier
    barrier = _native.barrier_method

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
            self._p2p.replayed(call, r, x, dst, out, src)

    # The prepared common case is native (_replay.c, PreparedMethod); it calls this Python
    # operation for anything else.
    sendrecv = _native.prepared_method("sendrecv", ("x", "dst", "out", "src"), "asas", (), _native.METHOD_SENDRECV,
                                       sendrecv)

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
            self._protocol.enter(op, error=e)
        color = -1 if color is None or color < 0 else int(color)
        try:
            slot = self._rt.reserve_slot() if color >= 0 else -1
        except TooManyCommunicators as e:        # the peers are told, as for a rejected argument
            self._protocol.enter(op, error=e)
        try:
            descs = self._protocol.descriptors(self._protocol.enter(op, aux=(color, int(key), slot)))
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


# the barrier's settings for native code, and its Python operation, which it calls for anything
# but the common case
_native.set_barrier(OPS["barrier"], SPIN_POLLS, SLICE, log.isEnabledFor, logging.DEBUG, getattr(log, "_cache", None),
                    Communicator._barrier)
