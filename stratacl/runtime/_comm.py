"""Communicator: argument checks, descriptors, synchronisation, and the call into collectives.

One collective call, end to end:

    check arguments locally  --error-->  write why in this rank's slot (Layout.slot_reason),
          |                              publish a descriptor flagged 'rejected', arrive, raise;
          |                              the peers raise CollectiveMismatch quoting the reason
          |
    input in own HBM? yes: zero copy        no: staged into a communication buffer (counted)
          |
    publish descriptor {op, dtype, count, root, reduce op, input address and segment, epoch}
          |
    arrival barrier  -> every rank reads every descriptor; any disagreement raises
          |              CollectiveMismatch on every rank, before any byte moves
    the operator's phases (collectives._slices frontend, compiled once per call shape by
    collectives._backend) run on the cores or the SDMA engine (runtime/_execute.py); peers'
          |  inputs are read at their shared addresses
          |
    departure barrier -> inputs may be reused once this returns

Descriptors are double-buffered by call parity: a rank can only overwrite the slot of call k
after the arrival barrier of call k+1, which every peer reaches only once it has read call
k's descriptors.

On the cores' path the full-mesh operators make all of this after the argument checks one
native call (``_mesh`` -> ``_native.mesh``: entry, addresses, one or two phases through the
kernels' executor, departure); it returns early wherever Python must act (a late rank, a
disagreement, a peer buffer to check for readiness), and ``_mesh`` goes on from there step by
step (``_mesh_rest``). The ring algorithms and the SDMA path go step by step throughout.

A prepared call (runtime/_prepared.py) goes further: its checks decided every argument of
``_mesh`` once, so ``_replay_of`` fixes them in a ``Replay`` and each repetition is one
``_native.replay``: the numbering of the call and its barriers, the descriptor, ``mesh``'s
common case, the byte and call counts. The operations themselves are native methods
(``_native_method``) that find and replay the prepared call without entering Python. At N = 32
these took a 64-byte broadcast from about 13 to about 5 us of user CPU per rank
(docs/performance.md). The barrier's common case is native too (``barrier``).
"""
from __future__ import annotations

import array
import logging
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

import numpy as np

from .._errors import CollectiveMismatch, TooManyCommunicators
from ..collectives import _reduce, _slices
from ..collectives._backend import int64_word
from ..collectives._kernels import BUFFERS
from ..collectives._slices import OUT, SCRATCH
from . import _native
# _native.mesh: departures, and the stages it returns (the last two: where the Python path picks
# up); the words of Communicator._tally; all defined by _native.h
from ._native import (MESH_BARRIER, MESH_DEPART, MESH_DEPART_FIRST, MESH_DISAGREE, MESH_DONE, MESH_ENTER_WAIT,
                      MESH_MIDDLE, MESH_NO_DEPARTURE, MESH_ROOT, MESH_ROOT_READER, MESH_SOURCES, MESH_SOURCES_FIRST,
                      T_CALLS, T_NATIVE, T_SYNCS)
from ._args import _aliased, _copy_back, _expect, _fixed_address, _fixed_table, _flat
from ._buffers import EAGER_BYTES, EAGER_CHUNKS_READ, Buffers, _Input
from ._control import (DESC_FIXED, F_ADDR, F_AUX0, F_AUX1, F_AUX2, F_CALL, F_COUNT, F_DTYPE, F_EPOCH, F_FLAGS,
                       F_NBYTES, F_OP, F_REDOP, F_ROOT, F_SEG_OFF, F_SEG_SIZE, F_SEG_VA, FLAG_REJECTED, Layout)
from ._modeling import Modeled
from ._execute import Execute
from ._p2p import PointToPoint
from ._prepared import PreparedCalls
from ._ringsteps import RingSteps
from ._sync import SLICE, SPIN_POLLS, seq_reached, wait_until
from ._work import Worker, agreed, collective

if TYPE_CHECKING:
    from ._world import Runtime

log = logging.getLogger("stratacl")

OPS = {"barrier": 1, "all_gather": 2, "all_reduce": 3, "reduce_scatter": 4, "all_to_all": 5,
       "all_to_all_v": 6, "broadcast": 7, "split": 8}
OP_NAMES = {v: k for k, v in OPS.items()}
_native.set_barrier(OPS["barrier"], SPIN_POLLS, SLICE, log.isEnabledFor, logging.DEBUG, getattr(log, "_cache", None))


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


def _native_method(op, spec: str):
    """``op``'s prepared common case as a native method (_replay.c, PreparedMethod): a call
    repeated on the same arrays with positional arguments runs without Python; anything else
    calls the Python operation, kept as ``_<name>``. ``spec``: 'a' for each array parameter,
    's' for each scalar, in order."""
    names = op.__code__.co_varnames[1:len(spec) + 1]
    return _native.prepared_method(op.__name__, names, spec, op.__defaults__ or (), f"_{op.__name__}",
                                   _native.METHOD_MESH, op)


class Replay:
    """A prepared full-mesh call, fixed for ``_native.replay`` (Communicator._replay_of): its
    native arguments ``call``, and ``meshes``, _mesh's per call parity, for the Python path
    from wherever the native call stopped; ``word``: the root's departure count's address."""

    __slots__ = ("call", "meshes", "word")

    def __init__(self, call: tuple, meshes: tuple, word: int):
        self.call, self.meshes, self.word = call, meshes, word


# What each operation's checks decided (its _check_*), remembered by _prepared.PreparedCalls. The
# operation unpacks them in order; the native methods read only ``replay`` (_replay.c, NAMES_READ):
# the call's Replay, or None where the call is not replayed natively.
class AllGatherArgs(NamedTuple):
    code: int
    algo: str
    eager: bool
    inp: Any
    plan: Any
    out_addr: int
    target: Any
    replay: Replay | None


class AllToAllArgs(NamedTuple):
    code: int
    inp: Any
    plan: Any
    out_addr: int
    target: Any
    replay: Replay | None


class BroadcastArgs(NamedTuple):
    code: int
    inp: Any
    plan: Any
    target: Any
    replay: Replay | None


class ReduceScatterArgs(NamedTuple):
    code: int
    rcode: int
    algo: str
    inp: Any
    plan: Any
    out_addr: int
    target: Any
    replay: Replay | None


class AllReduceArgs(NamedTuple):
    code: int
    rcode: int
    algo: str
    eager: bool
    inp: Any
    first: Any
    second: Any
    out_addr: int
    target: Any
    replay: Replay | None


class Communicator(Buffers, PointToPoint, RingSteps, Modeled, Execute):
    """A group of ranks that run collectives together (MPI semantics for ``split``).

    Every collective method is a *collective operation*: all ranks of the communicator must
    call it in the same order with agreeing arguments, and it is host-blocking.

    ``rank`` is this rank's index in the communicator, ``size`` the number of members and
    ``members`` their world ranks, in communicator order.
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
        # The counts native code updates in place, as int64 words (_replay.c): calls, barriers,
        # whether the native methods may run; rooted operations per root (for _root_departure);
        # point-to-point sequence numbers per peer. As attributes, each update was a lookup, a
        # new int object and the old one's free, paid per call and rank.
        self._tally = array.array("q", bytes(8 * _native.T_WORDS))
        self._tally[T_NATIVE] = int(rt.clock is None)
        self._root_calls = array.array("q", bytes(8 * self.size))
        self._sent = array.array("q", bytes(8 * self.size))
        self._received = array.array("q", bytes(8 * self.size))
        self._staging = None
        self._ready = np.full((self.size, 2), -1, dtype=np.int64)   # last (seg_va, epoch) checked per member
        self._ready_extra = np.full((self.size, 2), -1, dtype=np.int64)   # the same, for ring extra buffers
        self._ring_steps = 0
        self._scratch_ring = None
        self._staging_out = None
        self._mapped = None        # jit under the modeled clock: (reader, owner) -> (seg_va, epoch) mapped
        self._always_stage = rt.config.registration == "staged"
        self._worker: Worker | None = None
        self._eager = None
        self._eager_slots: dict[tuple, _Input] = {}    # (parity, nbytes, dtype) -> slot
        self._prepared = PreparedCalls()       # checked arguments of repeated calls (_prepared.py)
        self._call_counts = rt.stats["calls"]
        self._init_execute()
        self._init_modeling()
        self._init_p2p()
        # everything the native fast path needs, handed over as one int64 array (_native.h, CX_*)
        cx = self._cx = np.zeros(_native.CX_DESC + 2 * self.size, dtype=np.int64)
        cx[_native.CX_COUNTER], cx[_native.CX_GEN], cx[_native.CX_ARRIVAL] = (
            self._counter_addr, self._gen_addr, self._arrival_addr)
        cx[_native.CX_N], cx[_native.CX_ME] = self.size, self.rank
        cx[_native.CX_TALLY] = _native.data_address(self._tally)
        cx[_native.CX_ROOTS] = _native.data_address(self._root_calls)
        cx[_native.CX_SENT] = _native.data_address(self._sent)
        cx[_native.CX_RECEIVED] = _native.data_address(self._received)
        cx[_native.CX_COUNTERS] = _native.data_address(self.counters.words)
        cx[_native.CX_BARRIERS] = rt.native_call_word("barrier")
        cx[_native.CX_DESC:] = [*self._desc_addrs[0], *self._desc_addrs[1]]

    def _start_worker(self) -> Worker:
        """The thread that runs this communicator's operations once one is asynchronous."""
        self._worker = Worker(f"stratacl-comm-{self._rt.rank}-{self._slot_offs[0]:x}")
        self._rt.workers.append(self._worker)
        self._tally[T_NATIVE] = 0       # calls now go through the worker, in order
        return self._worker

    _calls = int64_word("_tally", T_CALLS, "Operations called on this communicator; they number the descriptors.")
    _syncs = int64_word("_tally", T_SYNCS, "Barrier numbers taken (the counter's target is this times the size).")

    @property
    def topology(self):
        """The job's topology (``ub.Topology``): the levels and tiers ranks talk over and the
        fabric model's parameters; rank numbers are world ranks (``members``). Local."""
        return self._rt.topology

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}, members={self.members})"

    # --- synchronisation --------------------------------------------------------------------
    def _sync(self, operation: str) -> None:
        """Counter barrier: arrive, then a yielding spin and futex sleeps, all in native code."""
        self._syncs += 1
        if not _native.sync(self._cx, self._syncs, SPIN_POLLS, SLICE):
            self._wait_barrier(self._syncs, operation)

    def _root_departure_from(self, operation: str, is_root: bool, word: int, target: int) -> None:
        """Departure when only the root's buffer was read: readers count themselves done on
        ``word`` in the root's slot and leave; the root waits for it to reach ``target``."""
        if not is_root:
            _native.done(word, target)
        elif not _native.wait_seq_u32(word, target, SPIN_POLLS, SLICE):
            wait_until(lambda: seq_reached(_native.load_u32(word), target), word, self._rt.health, operation,
                       self._rt.config.timeout, list,    # who is late is not recorded; the health check names a dead rank
                       f"the other {self.size - 1} ranks to finish reading this root's buffer")

    def _wait_barrier(self, k: int, operation: str) -> None:
        """Barrier k, already arrived at: keep waiting, checking the job's health between sleeps."""
        target = k * self.size
        u32 = self._rt.ctl.u32

        def missing():
            arr = u32[self._arrival_idx]
            return [self.members[i] for i in range(self.size) if not seq_reached(int(arr[i]), k)]

        counter = self._counter_addr
        wait_until(lambda: _native.load_u64(counter) >= target, self._gen_addr, self._rt.health, operation,
                   self._rt.config.timeout, missing, f"{self.size} ranks to arrive")

    def _enter(self, operation: str, dtype: int = 0, count: int = 0, root: int = 0, redop: int = 0,
               inp: "_Input | None" = None, aux1: int = 0) -> int:
        """The fast path of _begin for operations that need no descriptor but their peers' input
        addresses: publish, arrive, wait and compare in one native call. Returns the slot parity."""
        parity, fields = self._descriptor(operation, dtype, count, root, redop, inp, aux1)
        self._arrive(operation, parity, fields)
        return parity

    def _arrive(self, operation: str, parity: int, fields: tuple) -> None:
        """Publish ``fields`` in slot ``parity``, arrive at the next barrier, wait, compare."""
        k = self._syncs = self._syncs + 1
        status = _native.enter(self._cx, parity, k, SPIN_POLLS, SLICE, fields)
        if status:
            self._arrived(operation, parity, k, status)

    def _arrived(self, operation: str, parity: int, k: int, status: int) -> None:
        """After ``_native.enter``'s ``status`` 1 (still waiting) or 2 (a disagreement): wait
        with health checks, compare; raises on a disagreement."""
        if status == 1:
            self._wait_barrier(k, operation)
            status = 0 if _native.agree(self._cx, parity) else 2
        if status:
            self._validate(operation, self._rt.ctl.i64[self._desc_idx[parity]], parity)   # raises

    def _descriptor(self, operation: str, dtype: int, count: int, root: int, redop: int, inp: "_Input | None",
                    aux1: int = 0) -> tuple[int, tuple]:
        """Number the next call; returns its slot parity and this rank's descriptor (F_* order)."""
        self._calls += 1
        fields = self._fields(operation, dtype, count, root, redop, inp, self._entering_bits(), aux1, self._calls)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s call %d: %s", operation, self._calls, list(fields))
        return self._calls & 1, fields

    @staticmethod
    def _fields(operation: str, dtype: int, count: int, root: int, redop: int, inp: "_Input | None", clock: int,
                aux1: int, call: int) -> tuple:
        """A descriptor's fields (F_* order)."""
        seg = inp.seg if inp is not None else None
        if seg is not None:
            return (OPS[operation], dtype, count, root, redop, 0, inp.addr, inp.nbytes, seg.va, seg.size,
                    seg.hbm_offset, seg.epoch, clock, aux1, 0, call)
        addr, nbytes = (inp.addr, inp.nbytes) if inp is not None else (0, 0)
        return (OPS[operation], dtype, count, root, redop, 0, addr, nbytes, 0, 0, 0, 0, clock, aux1, 0, call)

    def _mesh(self, operation: str, inp: "_Input | None", plan, departure: int, dtype: int = 0, count: int = 0,
              root: int = 0, redop: int = 0, divisor: float = 1.0, plan2=None, only: int = -1) -> int:
        """A full-mesh call: enter, every member's input address (readiness checked), the phase
        ``plan`` (None: nothing to pull), with ``plan2`` a barrier and that second phase, then
        the departure (MESH_* of _native.mesh); ``only`` >= 0: the one member whose input is
        read (broadcast's root). Returns the slot parity.

        The common case (the cores' path, peers' buffers already checked, nobody late by more
        than one wait slice) is one native call; it returns the stage from which the rest
        continues here exactly as the step-by-step path would."""
        parity, fields = self._descriptor(operation, dtype, count, root, redop, inp)
        own = inp.addr if inp is not None else 0
        # barrier k is the entry, k + 1 the middle (two phases), then the departure; like the
        # root's count of departures, a barrier is counted only once this rank reaches it, as
        # every rank does the same (a call that raises at its entry raises on every rank)
        k = self._syncs = self._syncs + 1
        last = k + 2 if plan2 is not None else k + 1       # the departure barrier's number
        word = target = 0
        if departure >= MESH_ROOT_READER:
            target = ((self._root_calls[root] + 1) * (self.size - 1)) & 0xFFFFFFFF
            word = self._rt.ctl.base + self._slot_offs[root] + self._lay.slot_root_done()
        if self._path != "mte" and any(p is not None and p.has_copies for p in (plan, plan2)):
            stage = MESH_SOURCES_FIRST           # the engine's path: nothing native past the entry
            status = _native.enter(self._cx, parity, k, SPIN_POLLS, SLICE, fields)
            if status:
                stage = MESH_ENTER_WAIT if status == 1 else MESH_DISAGREE
        else:
            stage, skipped = _native.mesh(self._cx, parity, k, SPIN_POLLS, SLICE, fields, self._ready, self._bases,
                                          own, only,
                                          plan.table if plan is not None else None, dtype, redop, divisor,
                                          departure, word, target, plan2.table if plan2 is not None else None)
            ran = ()
            if stage == MESH_DONE or stage == MESH_DEPART:
                ran = (plan, plan2)
                self._syncs = k + (plan2 is not None)
                self._departed(departure, last, root)
            elif stage == MESH_MIDDLE:
                ran = (plan,)
                self._syncs = k + 1
            c = self.counters
            for p in ran:
                if p is not None:
                    c.local += p.local
                    c.pulled += p.remote
                    c.written += p.written
            c.local -= skipped
            if stage == MESH_DONE:            # the common case, all native
                calls = self._call_counts
                calls[operation] = calls.get(operation, 0) + 1
                return parity
        self._mesh_rest(operation, stage, parity, k, inp, plan, plan2, departure, root, word, target, dtype, redop,
                        divisor, only)
        return parity

    def _mesh_rest(self, operation: str, stage: int, parity: int, k: int, inp: "_Input | None", plan, plan2,
                   departure: int, root: int, word: int, target: int, dtype: int, redop: int, divisor: float,
                   only: int) -> None:
        """A full-mesh call from ``stage``, where the native call (mesh, replay) stopped, to its
        end: what is left of barrier ``k`` (the entry) and the rest, step by step."""
        last = k + 2 if plan2 is not None else k + 1       # the departure barrier's number
        if stage == MESH_ENTER_WAIT:
            self._wait_barrier(k, operation)
            stage = MESH_SOURCES_FIRST if _native.agree(self._cx, parity) else MESH_DISAGREE
        if stage == MESH_DISAGREE:
            self._validate(operation, self._rt.ctl.i64[self._desc_idx[parity]], parity)   # raises
        if stage == MESH_SOURCES or stage == MESH_SOURCES_FIRST:
            self._peer_sources(operation, parity, inp, only=only)
            if plan is not None:
                self._run(operation, plan, dtype, redop, divisor)
            if plan2 is not None:
                self._syncs = k + 1
                if not _native.sync(self._cx, k + 1, SPIN_POLLS, SLICE):
                    self._wait_barrier(k + 1, operation)
                self._run(operation, plan2, dtype, redop, divisor)
            stage = MESH_DEPART_FIRST
        elif stage == MESH_MIDDLE:           # arrived at the middle barrier natively: wait, second phase
            self._wait_barrier(k + 1, operation)
            self._run(operation, plan2, dtype, redop, divisor)
            stage = MESH_DEPART_FIRST
        if stage == MESH_DEPART_FIRST:
            self._departed(departure, last, root)
            if departure == MESH_BARRIER:
                if not _native.sync(self._cx, last, SPIN_POLLS, SLICE):
                    self._wait_barrier(last, operation)
            elif departure >= MESH_ROOT_READER:
                self._root_departure_from(operation, departure == MESH_ROOT, word, target)
        elif stage == MESH_DEPART:            # arrived (or counted) natively: only the wait is left
            if departure == MESH_BARRIER:
                self._wait_barrier(last, operation)
            else:
                self._root_departure_from(operation, True, word, target)
        calls = self._call_counts
        calls[operation] = calls.get(operation, 0) + 1

    def _replay_of(self, operation: str, inp: "_Input | None", plan, departure: int, dtype: int = 0,
                   count: int = 0, root: int = 0, redop: int = 0, divisor: float = 1.0, plan2=None, only: int = -1,
                   out_addr: int = -1, eager: np.ndarray | None = None) -> "Replay | None":
        """A prepared call's _mesh, fixed for _native.replay (None where that cannot run it: a
        modeled clock, the engine's path, an eager input not contiguous). ``out_addr`` >= 0:
        this rank's OUT base. ``eager``: the input to copy into the call parity's eager slot,
        which is then the call's input (``inp`` is None)."""
        if self._rt.clock is not None or (self._path != "mte" and any(
                p is not None and p.has_copies for p in (plan, plan2))):
            return None
        if eager is not None and not eager.flags.c_contiguous:
            return None
        word = 0
        if departure >= MESH_ROOT_READER:
            word = self._rt.ctl.base + self._slot_offs[root] + self._lay.slot_root_done()
        moved = [(p.local, p.remote, p.written) if p is not None else (0, 0, 0) for p in (plan, plan2)]
        tables = [p.table if p is not None else None for p in (plan, plan2)]
        n = self.size
        arrays = [_fixed_address(self._cx, (None,)), _fixed_address(self._ready, (n, 2)),
                  _fixed_address(self._bases, (BUFFERS, n)), *_fixed_table(tables[0]), *_fixed_table(tables[1])]
        params = np.zeros((2, _native.RP_LEN), dtype=np.int64)     # a row per call parity, named by RP_*
        meshes = []
        for parity, row in enumerate(params):
            src, nbytes = 0, 0
            if eager is not None:
                inp = self._eager_slot(parity, eager.nbytes, eager.dtype)
                src, nbytes = _native.data_address(eager) if eager.nbytes else 0, eager.nbytes
            row[:DESC_FIXED] = self._fields(operation, dtype, count, root, redop, inp, 0, 0, 0)
            row[_native.RP_OWN:_native.RP_CX] = (inp.addr if inp is not None else 0, only, dtype, redop, departure,
                                                 root, word, out_addr, src, nbytes,
                                                 self._rt.native_call_word(operation))
            row[_native.RP_CX:_native.RP_BYTES] = arrays
            row[_native.RP_BYTES:_native.RP_LEN] = (*moved[0], *moved[1])
            meshes.append((operation, inp, plan, departure, dtype, count, root, redop, divisor, plan2, only))
        # the call holds every array whose address it carries
        call = [None] * _native.R_LEN
        call[_native.R_PARAMS], call[_native.R_CX], call[_native.R_READY] = params, self._cx, self._ready
        call[_native.R_BASES], call[_native.R_PLAN], call[_native.R_PLAN2] = self._bases, tables[0], tables[1]
        call[_native.R_DIVISOR], call[_native.R_STATS] = float(divisor), self._rt.stats
        call[_native.R_PARAMS_ADDR] = _native.data_address(params)
        return Replay(tuple(call), tuple(meshes), word)

    def _replay(self, replay: "Replay") -> bool:
        """Run a prepared call in one native call, and on from wherever that stopped. False
        when it did nothing (debug logging: the operation's Python path runs, and logs). The
        native methods (``_native_method``) do the same without this frame."""
        r = _native.replay(self, replay.call)
        if r is not None:
            if r[0] == _native.MESH_NOT_RUN:
                return False
            self._replayed(replay, r)
        return True

    def _replayed(self, replay: "Replay", r: tuple) -> None:
        """A prepared call on from wherever _native.replay stopped (``r``: what it returned,
        not MESH_NOT_RUN)."""
        stage, parity, k, target = r
        operation, inp, plan, departure, dtype, count, root, redop, divisor, plan2, only = replay.meshes[parity]
        self._mesh_rest(operation, stage, parity, k, inp, plan, plan2, departure, root, replay.word, target, dtype,
                        redop, divisor, only)

    def _departed(self, departure: int, barrier: int, root: int) -> None:
        if departure == MESH_BARRIER:
            self._syncs = barrier
        elif departure >= MESH_ROOT_READER:
            self._root_calls[root] += 1

    def _peer_sources(self, operation: str, parity: int, local: "_Input | None", only: int = -1) -> np.ndarray:
        """Every member's input address (``local`` for this rank), after the purely local
        readiness check of each peer buffer this rank reads (``only``: just that member)."""
        src = self._src
        own = local.addr if local is not None else 0
        i = _native.sources(self._cx, parity, self._ready, src, own, only)
        while i >= 0:
            d = self._rt.ctl.i64[self._desc_idx[parity][i]]
            self._rt.reg.ensure_ready(self.members[i], int(d[F_SEG_VA]), int(d[F_SEG_SIZE]), int(d[F_SEG_OFF]),
                                      int(d[F_EPOCH]), operation)
            self._ready[i, 0], self._ready[i, 1] = d[F_SEG_VA], d[F_EPOCH]
            i = _native.sources(self._cx, parity, self._ready, src, own, only)
        return src

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
        if F_AUX0 not in fields and operation != "split" and self._rt.clock is not None:
            desc[F_AUX0] = self._entering_bits()
        if error is not None:
            desc[F_FLAGS] = FLAG_REJECTED
            self._rt.ctl.put_reason(self._slot_offs[self.rank] + self._lay.slot_reason(parity), error)
        if ext is not None:
            i64[off + DESC_FIXED:off + DESC_FIXED + ext.size] = ext
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s call %d: %s", operation, self._calls, desc.tolist())
        self._sync(operation)
        if error is not None:
            raise agreed(error)
        if not _native.agree(self._cx, parity):
            self._validate(operation, i64[self._desc_idx[parity]], parity)   # builds the message, raises
        return i64[self._desc_idx[parity]] if self._want_descs.get(operation, True) else None

    def _validate(self, operation: str, descs: np.ndarray, parity: int) -> None:
        # one vectorised comparison on the fast path; the message is built only on a mismatch
        if not (descs[:, F_OP:F_FLAGS + 1] != descs[0, F_OP:F_FLAGS + 1]).any() and not descs[0, F_FLAGS]:
            return
        rejected = np.nonzero(descs[:, F_FLAGS] & FLAG_REJECTED)[0].tolist()
        if rejected:
            raise CollectiveMismatch(self._rejection(operation, rejected, parity))
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

    def _rejection(self, operation: str, rejected: list[int], parity: int) -> str:
        """The peers' message for members ``rejected`` (indices) having rejected their arguments
        in the call of ``parity``: each one's own error, as it wrote it (Layout.slot_reason)."""
        ctl, lay = self._rt.ctl, self._lay
        why = [(self.members[i], ctl.reason(self._slot_offs[i] + lay.slot_reason(parity))
                or "(see the error raised there)") for i in rejected]
        if len(why) == 1:
            return f"{operation}: rank {why[0][0]} rejected its arguments: {why[0][1]}; no data was moved"
        shown = "; ".join(f"rank {r}: {text}" for r, text in why[:4])
        more = f"; and {len(why) - 4} more" if len(why) > 4 else ""
        return (f"{operation}: ranks {[r for r, _ in why]} rejected their arguments ({shown}{more}); "
                f"no data was moved")

    _want_descs = {"barrier": False}

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

    # --- collectives ------------------------------------------------------------------------
    @collective
    def barrier(self) -> None:
        """Block until every rank of the communicator has called barrier. Collective."""
        self._tick("barrier", self._enter("barrier"), 0)
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
        if replay is not None and self._replay(replay):
            return
        me, n, nb = self.rank, self.size, x.nbytes
        if eager:
            inp = self._eager_input(_flat(x, op, "input"))
        self._bases[OUT, me] = out_addr
        if algo == "ring":
            parity = self._enter(op, code, x.size, inp=inp, aux1=self._publish_extra(target))
            left = (me - 1) % n
            self._peer_sources(op, parity, inp, only=left)
            self._bases[OUT, left] = self._left_extra_buffer(parity, op)
            steps = self._phases(("ring_all_gather", nb), lambda: [
                m for s in range(n - 1) for m in _slices.ring_all_gather_step(me, n, nb, s)])
            self._run_ring(op, steps, self._ring_flags(op, n - 1))
            self._finish(op)
        else:
            parity = self._mesh(op, inp, plan, MESH_NO_DEPARTURE if eager else MESH_BARRIER, code, x.size)
        if target is not None:
            self._output_done(out, target)
        self._tick(op, parity, x.nbytes, algo, itemsize=x.itemsize)

    _all_gather = all_gather
    all_gather = _native_method(all_gather, "aa")

    def _check_all_gather(self, out: np.ndarray, x: np.ndarray) -> tuple[tuple, bool]:
        """all_gather's argument checks (raising on every rank of the call), and what they decided
        (see _prepared.py): dtype code, algorithm, eager, the input (None: the eager copy, made
        per call), the mesh's plan, the output's address, where it is written (None: in place),
        the call's Replay (None: not replayed natively)."""
        op = "all_gather"
        try:
            code = _reduce.dtype_code(x.dtype, op)
            o = _flat(out, op, "output", writable=True)
            _expect(o.size == self.size * x.size, lambda: f"{op}: output has {o.size} elements, expected "
                    f"{self.size} x {x.size} = {self.size * x.size}")
            _expect(o.dtype == x.dtype, lambda: f"{op}: output dtype {o.dtype} differs from input dtype {x.dtype}",
                    TypeError)
            algo = self._algo_for(op, x.nbytes, x.itemsize)
            eager = algo == "mesh" and x.nbytes <= EAGER_BYTES
            if self._path is not self._default_path:
                self._check_path(op)
            _flat(x, op, "input")          # an eager input is read per call, but checked here
            own = o[self.rank * x.size:(self.rank + 1) * x.size]
            inp = None if eager else self._as_input(x, op, _aliased(o, x, (x, own)))
            target = self._output(o, hbm=algo == "ring")
        except Exception as e:
            self._begin(op, {}, error=e)
        me, n, nb = self.rank, self.size, x.nbytes
        plan = (self._phase(("all_gather", nb), lambda: _slices.all_gather(me, n, nb), shared=True)
                if algo == "mesh" else None)
        out_addr = _native.data_address(target)
        if algo == "mesh" and target is o:
            held = None if eager else inp.in_place_of(x)
            if eager:
                replay = self._replay_of(op, None, plan, MESH_NO_DEPARTURE, code, x.size, out_addr=out_addr, eager=x)
                return AllGatherArgs(code, algo, eager, None, plan, out_addr, None, replay), True
            if held is not None:
                replay = self._replay_of(op, held, plan, MESH_BARRIER, code, x.size, out_addr=out_addr)
                return AllGatherArgs(code, algo, eager, held, plan, out_addr, None, replay), True
        return AllGatherArgs(code, algo, eager, inp, plan, out_addr, target, None), False

    @collective
    def all_to_all(self, out: np.ndarray, x: np.ndarray) -> None:
        """Equal splits: chunk j of rank i's ``x`` lands in chunk i of rank j's ``out``. Collective.

        ``out`` may be ``x`` or overlap it (in place): ``x`` is then copied first."""
        op = "all_to_all"
        key = (op, id(out), id(x)) if self._path is self._default_path else None
        code, inp, plan, out_addr, target, replay = self._prepared.get(key, (out, x), self._check_all_to_all, out, x)
        if replay is not None and self._replay(replay):
            return
        self._bases[OUT, self.rank] = out_addr
        parity = self._mesh(op, inp, plan, MESH_BARRIER, code, x.size)
        if target is not None:
            self._output_done(out, target)
        self._tick(op, parity, x.nbytes, itemsize=x.itemsize)

    _all_to_all = all_to_all
    all_to_all = _native_method(all_to_all, "aa")

    def _check_all_to_all(self, out: np.ndarray, x: np.ndarray) -> tuple[tuple, bool]:
        """all_to_all's checks and what they decided (as _check_all_gather)."""
        op = "all_to_all"
        try:
            code = _reduce.dtype_code(x.dtype, op)
            o = _flat(out, op, "output", writable=True)
            _expect(x.size % self.size == 0, lambda: f"{op}: input has {x.size} elements, not divisible by "
                    f"{self.size} ranks")
            _expect(o.size == x.size, lambda: f"{op}: output has {o.size} elements, expected {x.size}")
            _expect(o.dtype == x.dtype, lambda: f"{op}: output dtype {o.dtype} differs from input dtype {x.dtype}",
                    TypeError)
            if self._path is not self._default_path:
                self._check_path(op)
            inp = self._as_input(x, op, _aliased(o, x))
            target = self._output(o)
        except Exception as e:
            self._begin(op, {}, error=e)
        me, n, nb = self.rank, self.size, x.nbytes
        plan = self._phase(("all_to_all", nb), lambda: _slices.all_to_all(me, n, nb))
        out_addr = _native.data_address(target)
        held = inp.in_place_of(x) if target is o else None
        if held is not None:
            replay = self._replay_of(op, held, plan, MESH_BARRIER, code, x.size, out_addr=out_addr)
            return AllToAllArgs(code, held, plan, out_addr, None, replay), True
        return AllToAllArgs(code, inp, plan, out_addr, target, None), False

    @collective
    def all_to_all_v(self, out: np.ndarray, x: np.ndarray, send_counts: Sequence[int],
                     recv_counts: Sequence[int]) -> None:
        """Variable splits, packed in rank order: ``send_counts[j]`` elements of ``x`` go to rank j,
        ``recv_counts[j]`` elements from rank j land in ``out``. Collective. ``out`` may overlap
        ``x`` (in place): ``x`` is then copied first.

        Under a modeled clock only its synchronisation is modeled, not its transfers."""
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
            if self._path is not self._default_path:
                self._check_path(op)
            inp = self._as_input(x, op, _aliased(o, x))
            target = self._output(o)
        except Exception as e:
            self._begin(op, {}, error=e)
        descs = self._begin(op, {F_DTYPE: code, **self._input_fields(inp)}, ext=np.concatenate([sc, rc]))
        parity = self._calls & 1
        ext = self._rt.ctl.i64[self._ext_idx[parity]]
        send, recv = ext[:, :n], ext[:, n:]
        bad = np.argwhere(recv != send.T)
        if bad.size:
            i, j = (int(v) for v in bad[0])
            raise CollectiveMismatch(
                f"{op}: rank {self.members[i]} expects {int(recv[i, j])} elements from rank {self.members[j]}, "
                f"which sends it {int(send[j, i])}; no data was moved")
        me, item = self.rank, x.itemsize
        self._src[:] = self._sources(descs, op, inp, need=recv[me] > 0)
        self._bases[OUT, me] = _native.data_address(target)
        for plan in self._phases(("all_to_all_v", item, send.tobytes(), recv[me].tobytes()),
                                 lambda: _slices.all_to_all_v(me, n, send, recv, item)):
            self._run(op, plan)
        self._finish(op)
        self._output_done(out, target, int(recv[self.rank].sum()))
        self._tick("barrier", parity, 0)

    @collective
    def broadcast(self, x: np.ndarray, root: int = 0) -> None:
        """Every rank's ``x`` receives the root's ``x``. Collective."""
        op = "broadcast"
        key = (op, id(x), root) if type(root) is int and self._path is self._default_path else None
        code, inp, plan, target, replay = self._prepared.get(key, (x,), self._check_broadcast, x, root)
        if replay is not None and self._replay(replay):
            return
        # a reader pulls into its own buffer, which it names as its input (bases[IN, me])
        parity = self._mesh(op, inp, plan, MESH_ROOT if self.rank == root else MESH_ROOT_READER, code, x.size,
                            root, only=root)
        if target is not None:
            self._output_done(x, target)
        self._tick(op, parity, x.nbytes, root=root, itemsize=x.itemsize)

    _broadcast = broadcast
    broadcast = _native_method(broadcast, "as")

    def _check_broadcast(self, x: np.ndarray, root: int) -> tuple[tuple, bool]:
        """broadcast's checks and what they decided: dtype code, this rank's input (the root's
        buffer, or where a reader pulls to), a reader's plan (None at the root), where a reader
        writes (None: in place), the Replay (as _check_all_gather)."""
        op = "broadcast"
        try:
            code = _reduce.dtype_code(x.dtype, op)
            _expect(isinstance(root, (int, np.integer)) and 0 <= root < self.size,
                    lambda: f"{op}: root {root!r} is not a rank of this communicator (size {self.size})")
            if self._path is not self._default_path:
                self._check_path(op)
            xf = _flat(x, op, "buffer", writable=True)
            inp = self._as_input(x, op) if self.rank == root else _Input(xf, None)
            target = self._output(xf) if self.rank != root else xf
        except Exception as e:
            self._begin(op, {}, error=e)
        me, n, nb = self.rank, self.size, x.nbytes
        if me == root:
            held = inp.in_place_of(x)
            if held is None:
                return BroadcastArgs(code, inp, None, None, None), False
            return BroadcastArgs(code, held, None, None, self._replay_of(op, held, None, MESH_ROOT, code, x.size, root,
                                                            only=root)), True
        plan = self._phase(("broadcast", nb, root), lambda: _slices.broadcast(me, n, nb, root), shared=True)
        if target is xf:         # in place: remember the address only, not the caller's array
            own = _Input(None, None, _native.data_address(xf) if nb else 0, nb)
            return BroadcastArgs(code, own, plan, None, self._replay_of(op, own, plan, MESH_ROOT_READER, code, x.size, root,
                                                           only=root)), True
        return BroadcastArgs(code, _Input(target, None), plan, target, None), False

    @collective
    def reduce_scatter(self, out: np.ndarray, x: np.ndarray, op: str = "sum") -> None:
        """``out`` receives chunk ``rank`` of the element-wise reduction of every rank's ``x``. Collective.

        In place: ``out`` may be this rank's chunk of ``x`` (zero copy); an ``out`` overlapping
        ``x`` otherwise has ``x`` copied first.

        Mesh: every output element is reduced in rank order. Ring: chunk c is reduced in the
        order the ring visits the ranks, c+1, c+2, ..., c (runtime/_ringsteps.py)."""
        name = "reduce_scatter"
        key = (name, id(out), id(x), op) if type(op) is str and self._path is self._default_path else None
        code, rcode, algo, inp, plan, out_addr, target, replay = self._prepared.get(
            key, (out, x), self._check_reduce_scatter, out, x, op)
        if replay is not None and self._replay(replay):
            return
        me, n, count, item = self.rank, self.size, x.size, x.itemsize
        self._bases[OUT, me] = out_addr
        if algo == "ring":
            part = self._ring_scratch(x.nbytes)
            parity = self._enter(name, code, out.size, 0, rcode, inp, aux1=self._publish_extra(part))
            left = (me - 1) % n
            self._peer_sources(name, parity, inp, only=left)
            self._bases[SCRATCH, me] = _native.data_address(part)
            self._bases[SCRATCH, left] = self._left_extra_buffer(parity, name)
            steps = self._phases(("ring_reduce_scatter", count, item), lambda: [
                m for s in range(n - 1) for m in _slices.ring_reduce_scatter_step(me, n, count, item, s)], item)
            self._run_ring(name, steps, self._ring_flags(name, n - 1), code, rcode)
            self._finish(name)
        else:
            parity = self._mesh(name, inp, plan, MESH_BARRIER, code, out.size, 0, rcode, float(n))
        if target is not None:
            self._output_done(out, target)
        self._tick(name, parity, x.nbytes, algo, itemsize=x.itemsize)

    _reduce_scatter = reduce_scatter
    reduce_scatter = _native_method(reduce_scatter, "aas")

    def _check_reduce_scatter(self, out: np.ndarray, x: np.ndarray, op: str) -> tuple[tuple, bool]:
        """reduce_scatter's checks and what they decided (as _check_all_gather, with the reduce op)."""
        name = "reduce_scatter"
        try:
            code = _reduce.dtype_code(x.dtype, name)
            rcode = _reduce.reduce_code(op, x.dtype, name)
            o = _flat(out, name, "output", writable=True)
            _expect(x.size == self.size * o.size, lambda: f"{name}: input has {x.size} elements, expected "
                    f"{self.size} x {o.size} = {self.size * o.size}")
            _expect(o.dtype == x.dtype, lambda: f"{name}: output dtype {o.dtype} differs from input dtype {x.dtype}",
                    TypeError)
            if self._path is not self._default_path:
                self._check_path(name)
            own = _flat(x, name, "input")[self.rank * o.size:(self.rank + 1) * o.size]
            inp = self._as_input(x, name, _aliased(o, x, (o, own)))
            algo = self._algo_for(name, x.nbytes, x.itemsize)
            target = self._output(o)
        except Exception as e:
            self._begin(name, {}, error=e)
        me, n, count, item = self.rank, self.size, x.size, x.itemsize
        plan = None
        if algo == "mesh":
            plan = self._phase(("reduce_scatter", count, item), lambda: _slices.reduce_scatter(me, n, count, item),
                               item)
        out_addr = _native.data_address(target)
        held = inp.in_place_of(x) if algo == "mesh" and target is o else None
        if held is not None:
            replay = self._replay_of(name, held, plan, MESH_BARRIER, code, o.size, 0, rcode, float(n),
                                     out_addr=out_addr)
            return ReduceScatterArgs(code, rcode, algo, held, plan, out_addr, None, replay), True
        return ReduceScatterArgs(code, rcode, algo, inp, plan, out_addr, target, None), False

    @collective
    def all_reduce(self, x: np.ndarray, op: str = "sum") -> None:
        """In place: every rank's ``x`` becomes the element-wise reduction of all ranks' ``x``.

        Collective. Mesh, up to EAGER_BYTES: every rank reduces the whole buffer from all
        ranks' eager copies (one barrier; runtime/_buffers.py), or, once that would read
        EAGER_CHUNKS_READ bytes or more, its own chunk of them and gathers the others' reduced
        chunks (two barriers); above: reduce own chunk in
        place, then gather the others (three); every element is reduced in rank order. Ring: ring reduce-scatter, a barrier,
        ring all-gather; chunk c is reduced in the order c+1, ..., c (runtime/_ringsteps.py).
        """
        name = "all_reduce"
        key = (name, id(x), op) if type(op) is str and self._path is self._default_path else None
        code, rcode, algo, eager, inp, first, second, out_addr, target, replay = self._prepared.get(
            key, (x,), self._check_all_reduce, x, op)
        if replay is not None and self._replay(replay):
            return
        n, me, count, item = self.size, self.rank, x.size, x.itemsize
        bases = self._bases
        if eager:
            # every rank reduces the whole buffer (or its chunk) from the peers' eager copies
            # straight into x: nobody reads x, and the copies stay valid until the next call's
            # arrival barrier
            inp = self._eager_input(_flat(x, name, "buffer"))
            bases[OUT, me] = out_addr
            parity = self._mesh(name, inp, first, MESH_NO_DEPARTURE, code, count, 0, rcode, float(n), second)
            if target is not None:
                self._output_done(x, target)
            self._tick(name, parity, x.nbytes, algo, itemsize=item)
            return
        if algo == "ring":
            part = self._ring_scratch(x.nbytes)
            parity = self._enter(name, code, count, 0, rcode, inp, aux1=self._publish_extra(part))
            left = (me - 1) % n
            self._peer_sources(name, parity, inp, only=left)
            bases[SCRATCH, me] = _native.data_address(part)
            bases[SCRATCH, left] = self._left_extra_buffer(parity, name)
            steps = self._phases(("ring_all_reduce", count, item), lambda: [
                m for s in range(2 * (n - 1)) for m in _slices.ring_all_reduce_step(me, n, count, item, s)], item)
            self._run_ring(name, steps, self._ring_flags(name, 2 * (n - 1)), code, rcode,
                           barrier=lambda: self._sync(name))
            self._finish(name)
        else:
            # large: reduce own chunk in place, barrier, gather the finished chunks; fewer
            # elements than ranks: reduce the whole buffer privately, barrier (nobody reads this
            # rank's input any more), copy it back
            scratch = np.empty(x.nbytes, np.uint8) if count < n else None
            if scratch is not None:
                bases[SCRATCH, me] = _native.data_address(scratch)
            parity = self._mesh(name, inp, first, MESH_BARRIER if scratch is None else MESH_NO_DEPARTURE, code,
                                count, 0, rcode, float(n), second)
        if target is not None:       # the input was staged: the result is in the staged copy
            _copy_back(x, target)
            self._rt.stats["bytes_staged"] += x.nbytes
        self._tick(name, parity, x.nbytes, algo, itemsize=item)

    _all_reduce = all_reduce
    all_reduce = _native_method(all_reduce, "as")

    def _check_all_reduce(self, x: np.ndarray, op: str) -> tuple[tuple, bool]:
        """all_reduce's checks and what they decided: dtype and reduce codes, algorithm, eager,
        the input (None: the eager copy, made per call), the mesh's phases, and where the
        result is written: eager, the output's address and array (None: x in place); otherwise
        the staged copy to copy back (None: x was reduced in place); the Replay (as
        _check_all_gather)."""
        name = "all_reduce"
        try:
            code = _reduce.dtype_code(x.dtype, name)
            rcode = _reduce.reduce_code(op, x.dtype, name)
            xf = _flat(x, name, "buffer", writable=True)
            if self._path is not self._default_path:
                self._check_path(name)
            algo = self._algo_for(name, x.nbytes, x.itemsize)
            eager = algo == "mesh" and x.nbytes <= EAGER_BYTES
            inp = None if eager else self._as_input(x, name)
        except Exception as e:
            self._begin(name, {}, error=e)
        n, me, count, item, nb = self.size, self.rank, x.size, x.itemsize, x.nbytes
        first = second = None
        if eager:
            target = self._output(xf)
            if count >= n and n * nb >= EAGER_CHUNKS_READ:
                first, second = self._phases(("all_reduce_eager_chunks", count, item),
                                             lambda: _slices.all_reduce_eager_chunks(me, n, count, item), item)
            else:
                first = self._phase(("all_reduce_eager", nb, item), lambda: _slices.all_reduce_eager(me, n, nb), item)
            out_addr = _native.data_address(target)
            if target is xf:
                replay = self._replay_of(name, None, first, MESH_NO_DEPARTURE, code, count, 0, rcode, float(n), second,
                                         out_addr=out_addr, eager=x)
                return AllReduceArgs(code, rcode, algo, True, None, first, second, out_addr, None, replay), True
            return AllReduceArgs(code, rcode, algo, True, None, first, second, out_addr, target, None), False
        if algo == "mesh":
            first, second = self._phases(("all_reduce", count, item),
                                         lambda: _slices.all_reduce(me, n, count, item, small=0), item)
        staged = inp.flat if inp.addr != _native.data_address(xf) or not xf.flags.c_contiguous else None
        held = inp.in_place_of(x) if algo == "mesh" and count >= n else None
        if held is not None:
            replay = self._replay_of(name, held, first, MESH_BARRIER, code, count, 0, rcode, float(n), second)
            return AllReduceArgs(code, rcode, algo, False, held, first, second, 0, None, replay), True
        return AllReduceArgs(code, rcode, algo, False, inp, first, second, 0, staged, None), False

    # --- sub-communicators ------------------------------------------------------------------
    @collective
    def split(self, color: int | None, key: int = 0) -> Communicator | None:
        """MPI_Comm_split: ranks with the same ``color`` form a communicator, ordered by
        (``key``, rank here). ``color=None`` (or negative) takes part but gets None. Collective."""
        op = "split"
        try:
            _expect(color is None or isinstance(color, (int, np.integer)), lambda: f"{op}: color must be an int or None")
            _expect(isinstance(key, (int, np.integer)), lambda: f"{op}: key must be an int")
        except Exception as e:
            self._begin(op, {}, error=e)
        color = -1 if color is None or color < 0 else int(color)
        try:
            slot = self._rt.reserve_slot() if color >= 0 else -1
        except TooManyCommunicators as e:        # the peers are told, as for a rejected argument
            self._begin(op, {}, error=e)
        descs = self._begin(op, {F_AUX0: color, F_AUX1: int(key), F_AUX2: slot})
        s = self._rt.stats
        s["calls"]["split"] = s["calls"].get("split", 0) + 1
        if color < 0:
            return None
        mine = [(int(descs[i, F_AUX1]), i) for i in range(self.size) if int(descs[i, F_AUX0]) == color]
        mine.sort()
        return Communicator(self._rt, [self.members[i] for _, i in mine], [int(descs[i, F_AUX2]) for _, i in mine])
