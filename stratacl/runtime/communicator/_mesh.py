"""The full-mesh call: its record, and Python's part in its protocol.

A full-mesh operator (all_gather, all_reduce, reduce_scatter, all_to_all, broadcast) decides in
its checks the call's phases (compiled plans, collectives._backend), its input and how it
departs; the communicator's ``MeshDriver`` fixes them in a ``MeshCall``: the int64 rows native
code reads (RP_*, one per call parity, _native.h) and what Python needs where the call stops.
The protocol has one owner, native code (_meshcall.c, mesh_advance):

    MeshCall --_native.mesh_call--> number the call, publish, entry barrier, agreement,
        |                           readiness of the peer buffers read, phase 1, [barrier,
        |                           phase 2], departure; count bytes, barriers and the call
        | stops where Python must act, handing back its state:
        |   MESH_ENTER_WAIT, MESH_MIDDLE_WAIT, MESH_DEPART_WAIT   wait on, checking the job's health
        |   MESH_DISAGREE                       the mismatch's message, raised on every rank
        |   MESH_SOURCES                        a peer buffer's registration check (ub), recorded
        |   MESH_RUN_FIRST, MESH_RUN_SECOND     the phase on the SDMA engine (runtime/pipeline/_execute.py)
        +--_native.mesh_resume(state)--> on from there, until MESH_DONE

A prepared call (runtime/communicator/_prepared.py) keeps its MeshCall (``MeshDriver.record``) and replays
it (``_native.replay``, or its operation's native method with no Python at all); any other
call (``MeshDriver.call``) patches the record of its shape with its input, or builds one.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ...collectives import BUFFERS
from .. import _native
from .._native import (
    MESH_BARRIER, MESH_DEPART_WAIT, MESH_DISAGREE, MESH_ENTER_WAIT, MESH_MIDDLE_WAIT, MESH_NOT_RUN, MESH_ROOT_READER,
    MESH_RUN_SECOND, MESH_SOURCES, T_CALLS,
)
from ..pipeline import RankServices, descriptor, fixed_address, fixed_table
from ..services import DESC_FIXED

if TYPE_CHECKING:
    from ..pipeline import CallInput

log = logging.getLogger("stratacl")


class MeshCall:
    """A full-mesh call fixed for native code: ``call``, the tuple the mesh machine reads
    (R_*: its RP_* rows and every array whose address they carry), and what Python needs at
    a stop: the operation, the path its phases run on, its two phases' plans, how it
    departs, the root's departure word (0: none), the reduction's dtype, op and divisor, the
    one member read (-1: all)."""

    __slots__ = ("call", "operation", "path", "plans", "departure", "word", "dtype", "redop", "divisor", "only")

    def __init__(self, call: tuple, operation: str, path: str, plans: tuple, departure: int, word: int, dtype: int,
                 redop: int, divisor: float, only: int):
        self.call, self.operation, self.path, self.plans = call, operation, path, plans
        self.departure, self.word, self.dtype, self.redop, self.divisor, self.only = (departure, word, dtype, redop,
                                                                                       divisor, only)


RECORDS_LIMIT = 64


class MeshDriver:
    """A communicator's full-mesh calls: their records and Python's part at a stop. Given the
    runtime, the members' count, the slot protocol (waits, the mismatch's message, slot
    words), the executor (buffer table, readiness, phases on the engine's path), the
    communication buffers (eager slots) and the modeled clock (the descriptor's entering
    time)."""

    def __init__(self, rt: RankServices, size: int, protocol, executor, buffers, modeling):
        self._rt, self._size = rt, size
        self._protocol, self._executor, self._buffers = protocol, executor, buffers
        self._cx, self._tally = protocol.cx, protocol.tally
        self._entering_bits = modeling.entering_bits
        # the records of calls that are not prepared, by everything but their input: a call
        # repeated with a new input (staged, eager, a modeled clock) patches its record's
        # descriptor and input address instead of building one (runtime/communicator/_prepared.py keeps
        # the prepared calls' records)
        self._records: dict[tuple, MeshCall] = {}

    def _record(self, operation: str, path: str, inp: "CallInput | None", plan, departure: int, dtype: int = 0,
                count: int = 0, root: int = 0, redop: int = 0, divisor: float = 1.0, plan2=None, only: int = -1,
                out_addr: int = -1, eager: np.ndarray | None = None, clock: int = 0) -> MeshCall:
        """The record of a full-mesh call on ``path``: the input ``inp`` (this rank's; None:
        nothing to read), the phases ``plan`` and ``plan2`` (None: none), the departure
        (MESH_*), ``only`` >= 0 the one member read (broadcast's root). ``out_addr`` >= 0:
        this rank's OUT base, set as the call starts. ``eager``: the input, copied as the call
        starts into the call parity's eager slot, which is then its input. ``clock``: the
        descriptor's modeled-clock bits (F_AUX0)."""
        word = 0
        if departure >= MESH_ROOT_READER and self._protocol.carried:
            # across hosts a root's readers cannot count themselves done on its word: everyone
            # departs through a barrier, which the carriers carry (runtime/hosts/_hosts.py)
            departure = MESH_BARRIER
        if departure >= MESH_ROOT_READER:
            word = self._rt.ctl.base + self._protocol.slot_offs[root] + self._protocol.lay.slot_root_done()
        plans = (plan, plan2)
        tables = [p.table if p is not None else None for p in plans]
        n, ready, bases = self._size, self._executor.ready, self._executor.bases
        params = np.zeros((2, _native.RP_LEN), dtype=np.int64)     # a row per call parity, named by RP_*
        row = params[0]
        row[_native.RP_ONLY:_native.RP_OUT] = (only, dtype, redop, departure, root, word)
        row[_native.RP_OUT] = out_addr
        row[_native.RP_COUNTED] = self._rt.native_call_word(operation)
        row[_native.RP_CALLER_PHASES] = path != "mte" and any(p is not None and p.has_copies for p in plans)
        row[_native.RP_CX:_native.RP_BYTES] = (
            fixed_address(self._cx, (None,)), fixed_address(ready, (n, 2)),
            fixed_address(bases, (BUFFERS, n)), *fixed_table(tables[0]), *fixed_table(tables[1]))
        for i, p in enumerate(plans):
            if p is not None:
                row[_native.RP_BYTES + 3 * i:_native.RP_BYTES + 3 * i + 3] = (p.local, p.remote, p.written)
        params[1] = row
        for parity, row in enumerate(params):
            if eager is not None:
                inp = self._buffers.eager_slot(parity, eager.nbytes, eager.dtype)
                row[_native.RP_EAGER_FROM] = _native.data_address(eager) if eager.nbytes else 0
                row[_native.RP_EAGER_BYTES] = eager.nbytes
            row[:DESC_FIXED] = descriptor(operation, dtype, count, root, redop, inp, clock, 0)
            row[_native.RP_OWN] = inp.addr if inp is not None else 0
        # the call holds every array whose address it carries
        call = [None] * _native.R_LEN
        call[_native.R_PARAMS], call[_native.R_CX], call[_native.R_READY] = params, self._cx, ready
        call[_native.R_BASES], call[_native.R_PLAN], call[_native.R_PLAN2] = bases, tables[0], tables[1]
        call[_native.R_DIVISOR], call[_native.R_STATS] = float(divisor), self._rt.stats
        call[_native.R_PARAMS_ADDR] = _native.data_address(params)
        return MeshCall(tuple(call), operation, path, plans, departure, word, dtype, redop, divisor, only)

    def call(self, operation: str, path: str, inp: "CallInput | None", plan, departure: int, dtype: int = 0,
             count: int = 0, root: int = 0, redop: int = 0, divisor: float = 1.0, plan2=None, only: int = -1) -> int:
        """A full-mesh call, start to end (see ``_record`` for the arguments). Returns the
        call's slot parity."""
        key = (operation, departure, dtype, count, root, redop, divisor, only, path)
        mc = self._records.get(key)
        if mc is not None and mc.plans[0] is plan and mc.plans[1] is plan2:
            params = mc.call[_native.R_PARAMS]     # the same call but for its input: patch both parities
            params[:, :DESC_FIXED] = descriptor(operation, dtype, count, root, redop, inp, self._entering_bits(), 0)
            params[:, _native.RP_OWN] = inp.addr if inp is not None else 0
        else:
            mc = self._record(operation, path, inp, plan, departure, dtype, count, root, redop, divisor, plan2, only,
                              clock=self._entering_bits())
            if len(self._records) >= RECORDS_LIMIT:
                self._records.clear()
            self._records[key] = mc
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s call %d: %s", operation, self._tally[T_CALLS] + 1,
                      mc.call[_native.R_PARAMS][0, :DESC_FIXED].tolist())
        state = _native.mesh_call(mc.call)
        if state is not None:
            self.resume(mc, state)
        return self._tally[T_CALLS] & 1

    def record(self, operation: str, path: str, inp: "CallInput | None", plan, departure: int, dtype: int = 0,
               count: int = 0, root: int = 0, redop: int = 0, divisor: float = 1.0, plan2=None, only: int = -1,
               out_addr: int = -1, eager: np.ndarray | None = None) -> MeshCall | None:
        """A prepared call's record, for ``replay`` and the native methods; None where a
        replay cannot run it (a modeled clock, the engine's path, an eager input not
        contiguous), which leaves every call to ``call``."""
        if self._rt.clock is not None or (path != "mte" and any(
                p is not None and p.has_copies for p in (plan, plan2))):
            return None
        if eager is not None and not eager.flags.c_contiguous:
            return None
        return self._record(operation, path, inp, plan, departure, dtype, count, root, redop, divisor, plan2, only,
                            out_addr, eager)

    def replay(self, replay: MeshCall) -> bool:
        """Run a prepared call. False when it did nothing (debug logging: the operation's
        Python path runs, and logs). The native methods do the same without this frame."""
        state = _native.replay(None, replay.call)       # its first argument (the communicator) is not read
        if state is not None:
            if state[0] == MESH_NOT_RUN:
                return False
            self.resume(replay, state)
        return True

    def resume(self, mc: MeshCall, state: tuple) -> None:
        """Do what a stopped mesh call needs of Python, and resume it, until it is done (also
        a native method's prepared call, from its stop: ``Communicator._replayed``)."""
        op = mc.operation
        while state is not None:
            stage, parity, k, target = state
            skipped = 0
            if stage == MESH_SOURCES:
                self._executor.peer_sources(op, parity, int(mc.call[_native.R_PARAMS][parity, _native.RP_OWN]), mc.only)
            elif stage == MESH_DISAGREE:
                self._protocol.validate(op, parity)
                raise AssertionError(f"{op}: native code found a disagreement the descriptors do not show")
            elif stage == MESH_DEPART_WAIT and mc.departure != MESH_BARRIER:
                self._protocol.wait_root(op, mc.word, target)
            elif stage in (MESH_ENTER_WAIT, MESH_MIDDLE_WAIT, MESH_DEPART_WAIT):
                self._protocol.wait_barrier(k, op)
            else:                                # MESH_RUN_FIRST, MESH_RUN_SECOND
                skipped = self._executor.execute(op, mc.plans[stage == MESH_RUN_SECOND], mc.path, mc.dtype,
                                                 mc.redop, mc.divisor)
            state = _native.mesh_resume(mc.call, state, skipped)
