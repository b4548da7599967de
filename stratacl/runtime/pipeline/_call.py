"""The call pipeline: the one door through which every front end's call runs.

A front end (the Communicator's operators, ``stratacl.ep``, ``host_rows``, the torch backend,
a user's slice map) describes a call and passes it through these stages, in this order; it
never reaches into a communicator's components (``tests/test_layering.py`` checks that no
module outside ``stratacl/runtime`` touches a ``comm._`` attribute):

    call(operation, body, async_op, path)    defer: on the communicator's worker (asynchronous,
        |                                    or queued behind one) or at the modeled clock's
        |                                    entry; else the body runs now, on ``path``
    input / output / check_path / block      checked locally: zero copy or staged, the call's
        |                                    path, where a registered array lies
    enter(operation, dtype, inp, ext, error) publish the descriptor, arrive, agree; a rank that
        |                                    rejected its own arguments raises here, after its
        |                                    peers learned why (they raise CollectiveMismatch)
    sources_ready / block_ready              peers' buffers registered here and named
        |
    phase / compile / run(operation, plan, out)   one remote-slice phase run on the call's path
        |                                    (cores or SDMA engine), its bytes counted
    output_done, finish(operation)           a staged output copied out; departure barrier,
        |                                    the call counted
    tick(operation, parity, phases, ...)     the modeled clock: every member times the call from
                                             the same traffic matrices

``pipeline(comm)`` gives a communicator's pipeline. The full-mesh operators run their phases
in native code (runtime/communicator/_mesh.py), entry to departure in one call; the pipeline's ``mesh``
stage hands them there.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...collectives import OUT, SCRATCH, Plan, compile_plan
from .. import _native
from ..services import EXT_WORDS_EXTRA
from ._buffers import Buffers, CallInput
from ._execute import Executor
from ._modeling import Modeling
from ._services import RankServices
from ._work import _deferred


class Pipeline:
    """The stages of one owner's calls (a communicator's, or a rank's host transfers'); see
    the module docstring. Methods are local unless they say they are collective."""

    EXT_WORDS = EXT_WORDS_EXTRA      # extension words a front end may publish with its descriptor

    def __init__(self, owner, rt: RankServices, executor: Executor, modeling: Modeling, protocol=None,
                 buffers: Buffers | None = None):
        """``owner``: the object whose calls these are; it holds the call's path (``_path``,
        ``_default_path``, ``_overlap_path``) and its worker (``_worker``, ``_start_worker``)."""
        self._owner, self._rt = owner, rt
        self._exec, self._modeling, self._protocol, self._buffers = executor, modeling, protocol, buffers
        self._bases = executor.bases
        self._members, self._rank = executor._members, executor._rank

    # --- defer ------------------------------------------------------------------------------
    def call(self, operation: str, body: Callable[[], Any], async_op: bool = False, path: str | None = None):
        """Run ``body()`` as the call ``operation``: at once on ``path`` (default: the setting),
        or, when asynchronous, behind an asynchronous call, or under a modeled clock, through
        the owner's worker and clock (runtime/pipeline/_work.py); returns its result, or a ``Work``
        when ``async_op``."""
        owner = self._owner
        if async_op or owner._worker is not None or self._rt.clock is not None:
            return _deferred(owner, _named(operation), body, async_op, path)
        owner._path = owner._default_path if path is None else path
        return body()

    @property
    def timed(self) -> bool:
        """A modeled clock runs (``tick`` times the call)."""
        return self._rt.clock is not None

    @property
    def path(self) -> str:
        """The path of the call being run (``mte``, ``sdma`` or ``auto``'s choice)."""
        return self._owner._path

    @property
    def model(self):
        """The rank's fabric model (``ub.FabricModel``), as the job's settings made it."""
        return self._rt.model

    def algo_for(self, operation: str, nbytes: int, itemsize: int = 1) -> str:
        """``mesh`` or ``ring``: what a built-in operator takes on ``nbytes`` (the same on every
        member)."""
        return self._modeling.algo_for(operation, nbytes, itemsize)

    # --- local checks and staging -----------------------------------------------------------
    def far_members(self) -> np.ndarray:
        """Which members (a bool per index) are on another host than this rank; none on one
        host. What this rank writes into such a member's memory lands in this host's mirror of
        it, which the carrier puts back into the member's segment only for the ranges a front
        end names to it (fabric/_usermap.py, runtime/hosts/_reads.py)."""
        remote = self._rt.hosts.remote()
        return np.fromiter((m in remote for m in self._members), bool, len(self._members))

    def check_path(self, operation: str) -> None:
        """ValueError unless the call's ``path=`` is one of the paths (raise it inside the
        argument checks, so that ``enter`` tells the peers)."""
        owner = self._owner
        if owner._path is not owner._default_path:
            self._exec.check_path(operation, owner._path)

    def input(self, x: np.ndarray, operation: str, stage: bool = False) -> CallInput:
        """Where peers read ``x``: itself (zero copy, in this rank's HBM) or a staged copy."""
        return self._buffers.as_input(x, operation, stage)

    def output(self, flat: np.ndarray, hbm: bool = False) -> np.ndarray:
        """Where the call writes the 1-D output ``flat``: itself or a communication buffer."""
        return self._buffers.output(flat, hbm)

    def output_done(self, flat: np.ndarray, target: np.ndarray, count: int | None = None) -> None:
        """Copy a staged output (its first ``count`` elements) out of its buffer."""
        self._buffers.output_done(flat, target, count)

    def empty(self, shape, dtype) -> np.ndarray:
        """A new array in this rank's HBM (registered on allocation)."""
        return self._rt.empty(shape, dtype)

    def block(self, array: np.ndarray) -> tuple[int, int, int, int, int]:
        """Where a registered array of this rank lies, for peers to map it: (address, segment
        address, segment size, offset in the HBM, epoch)."""
        addr = _native.data_address(array)
        seg = self._buffers.hbm_segment(array, addr)
        return addr, seg.va, seg.size, seg.hbm_offset, seg.epoch

    # --- agreement --------------------------------------------------------------------------
    def enter(self, operation: str, dtype: int = 0, inp: CallInput | None = None, ext: np.ndarray | None = None,
              error: BaseException | None = None, count: int = 0, root: int = 0, redop: int = 0) -> int:
        """Publish this rank's descriptor of the call (its dtype code, input, ``ext`` words, and
        the element ``count``, ``root`` and reduce op code ``redop``, which every member must
        agree on; an ``operation`` outside the operator table is a user's slice map), arrive and
        agree; returns the call's parity. ``error``: this rank rejected its arguments: raised
        here once the peers know why. Collective."""
        return self._protocol.enter(operation, dtype, count, root, redop, inp, ext=ext, error=error)

    def reject(self, operation: str, error: BaseException) -> None:
        """This rank rejects its arguments: raise ``error`` once the peers know why. Collective."""
        self._protocol.enter(operation, error=error)

    def extensions(self, parity: int) -> np.ndarray:
        """Every member's extension words of the call of ``parity`` [size, words]."""
        return self._protocol.extensions(parity)

    def descriptors(self, parity: int) -> np.ndarray:
        """Every member's descriptor of the call of ``parity``."""
        return self._protocol.descriptors(parity)

    def sources_ready(self, operation: str, parity: int, own: int, need: np.ndarray | None = None,
                      only: int = -1) -> np.ndarray:
        """Every member's input address (``own``: this rank's) named for the plans, once the
        peers' buffers this rank reads (``need``: members marked 1) are mapped here."""
        return self._exec.peer_sources(operation, parity, own, only, need)

    def block_ready(self, operation: str, member: int, va: int, size: int, offset: int, epoch: int) -> None:
        """Member ``member``'s registered segment (as ``block`` gave it) mapped here."""
        self._rt.reg.ensure_ready(self._members[member], va, size, offset, epoch, operation)

    def name_scratch(self, addrs: np.ndarray) -> None:
        """Every member's SCRATCH buffer address, for the plans that read it."""
        self._bases[SCRATCH] = addrs

    def name_buffers(self, row: int, addrs: np.ndarray) -> None:
        """Every member's buffer ``row`` (collectives._slices IN, OUT, SCRATCH) for the plans."""
        self._bases[row] = addrs

    def barrier(self, operation: str) -> None:
        """A barrier between two phases of the call. Collective."""
        self._protocol.sync(operation)

    # --- phases -----------------------------------------------------------------------------
    def phase(self, key: tuple, build: Callable, itemsize: int = 1, shared: bool = False) -> Plan:
        """A one-phase slice map compiled once per ``key`` (``build()`` its slices)."""
        return self._exec.phase(key, build, itemsize, shared)

    def phases(self, key: tuple, build: Callable, itemsize: int = 1) -> tuple:
        """A call shape's compiled phases, once per ``key``."""
        return self._exec.phases(key, build, itemsize)

    @staticmethod
    def compile(smap) -> Plan:
        """One slice map compiled, not cached (a routing's rows, which change per call)."""
        return compile_plan(smap)

    def run(self, operation: str, plan: Plan, out: np.ndarray | int | None = None, dtype: int = 0,
            redop: int = 0, divisor: float = 1.0) -> None:
        """Run one phase into ``out`` (this rank's OUT buffer: an array or its address; None:
        as named before) on the call's path, its bytes counted."""
        if out is not None:
            self._bases[OUT, self._rank] = out if isinstance(out, int) else _native.data_address(out)
        self._exec.run(operation, plan, self._owner._path, dtype, redop, divisor)

    def execute(self, operation: str, plan: Plan) -> None:
        """Run one phase on the call's path, uncounted (a rank's own copies)."""
        self._exec.execute(operation, plan, self._owner._path)

    def set_bases(self, row: int, member: int, addr: int) -> None:
        """Name buffer ``row`` of ``member`` for the plans."""
        self._bases[row, member] = addr

    def finish(self, operation: str, departure: bool = True) -> None:
        """Departure barrier (none if nobody still reads this rank's buffers), the call counted.
        Collective."""
        self._protocol.finish(operation, departure)

    # --- modeled clock ----------------------------------------------------------------------
    def tick(self, operation: str, parity: int, phases: list, staging=None, routing: dict | None = None) -> None:
        """Under a modeled clock: the call's exit time from its traffic matrices (``phases``:
        [(bytes[reader, owner], kind)]; ``staging``: bytes a staged call copies in and out)."""
        if self._rt.clock is not None:
            self._modeling.tick_exchange(operation, self._protocol.descriptors(parity), phases, staging,
                                         self._owner._path, routing)

    def tick_schedule(self, operation: str, parity: int, nbytes: int, algo: str = "mesh", root: int = 0,
                      itemsize: int = 1) -> None:
        """``tick`` for a built-in operator timed from its schedule (collectives/_schedule.py)."""
        if self._rt.clock is not None:
            self._modeling.tick(operation, self._protocol.descriptors(parity), nbytes, algo, root, itemsize,
                                self._owner._path)

    def tick_host(self, operation: str, phases: list, staging) -> None:
        """``tick`` for a rank's own transfers to its host memory (no peers)."""
        if self._rt.clock is not None:
            self._modeling.tick_host(operation, phases, staging, self._owner._path)


def pipeline(comm) -> Pipeline:
    """The call pipeline of communicator ``comm`` (see the module docstring)."""
    return comm._pipe


def _named(operation: str) -> Callable:
    """A stand-in function named ``operation`` (a Work and the worker name calls by it)."""
    def op():
        pass
    op.__name__ = operation
    return op
