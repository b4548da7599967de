"""The communicator's side of the backend: every operator's phases run through here.

    operator (runtime/communicator/: _comm.py, _p2p.py, _ringsteps.py, _mesh.py)
        -> phases(key, frontend)       the call's compiled phases (collectives._backend.Plans,
                                       built from the collectives._slices frontend on first use)
        -> this call's buffers in bases[buf, member] (IN: every member's input, filled by the
           arrival's readiness check, ``peer_sources``; OUT, SCRATCH: what the operator sets)
        -> run(plan) per phase, on the call's path (the ``path`` setting, or ``path=`` of the
           call):
             mte    the cores: one native call executes the phase's copies and reductions
             sdma   the copies become descriptors on this rank's SDMA engine: units and their
                    cores from the fabric model's partitioner (the policy its modeled timelines
                    use), each core posting its units in task order to its own queue, one notify
                    record per core that posted, the doorbell; the calling thread (the cores) is
                    free until it waits for the notify (cross-kernel completion). Reductions stay
                    on the cores.
"""
from __future__ import annotations

import time

import numpy as np

from ..._errors import CommTimeout
from ...collectives import BUFFERS, IN, Plan, Plans, addresses, run_plan
from ...sdma import PATHS, SdmaEngine, paths_of
from .. import _native
from ..services import F_EPOCH, F_SEG_OFF, F_SEG_SIZE, F_SEG_VA, SLICE
from ._services import RankServices


class Executor:
    """A communicator's buffers of the call and the phases that move bytes between them:
    ``bases`` (BUFFERS x members: IN, OUT, SCRATCH addresses), ``ready`` (the (segment,
    epoch) of each member's buffer last checked registered here), the compiled plans, the
    path the copies run on. Given the runtime, the members and the slot protocol (whose
    descriptors name the peers' inputs and whose ``cx`` counts the bytes)."""

    def __init__(self, rt: RankServices, members: list[int], rank: int, protocol):
        # protocol None: a rank's own copies with no peers (runtime/communicator/_hostrows.py), which only execute
        self._rt, self._protocol, self._cx = rt, protocol, protocol.cx if protocol is not None else None
        self._members, self._rank = members, rank
        n = len(members)
        self.bases = np.zeros((BUFFERS, n), dtype=np.int64)
        self.src = self.bases[IN]            # filled by peer_sources (a view: no copy per call)
        self.ready = np.full((n, 2), -1, dtype=np.int64)   # last (seg_va, epoch) checked per member
        self._plans = Plans()
        # a blocking call's path and an asynchronous one's (they differ under path=auto)
        self.default_path, self.overlap_path = paths_of(rt.config.path)

    def check_path(self, operation: str, path: str) -> None:
        """Argument check of the call's ``path=`` (raised inside the operation's checks, so every
        rank of the call learns that this one rejected its arguments)."""
        if path not in PATHS:
            raise ValueError(f"{operation}: path must be one of {', '.join(PATHS)}, got {path!r}")

    def phases(self, key: tuple, build, itemsize: int = 1) -> tuple:
        """The compiled phases of a call shape ``key`` (``build``: its frontend, run on first use)."""
        return self._plans.get(key, build, itemsize)

    def phase(self, key: tuple, build, itemsize: int = 1, shared: bool = False) -> Plan:
        """The one phase of a one-phase operator (see phases); ``shared``: every member reads
        the same sources (collectives.compile_plan)."""
        plans = self._plans.get(key, build, itemsize, shared)
        assert len(plans) == 1, key
        return plans[0]

    def peer_sources(self, operation: str, parity: int, own: int, only: int = -1,
                     need: np.ndarray | None = None) -> np.ndarray:
        """Every member's input address in the call of ``parity`` (``own``: this rank's), in
        ``src`` (bases' IN row), after the purely local registration check of each peer
        buffer this rank reads (``only``: that member's; ``need``: the members marked, an int64
        array), recorded in ``ready``: a (segment, epoch) checked once stays valid, since a
        released segment cannot appear in a descriptor again and a new one has a new epoch."""
        ready, src = self.ready, self.src
        i = _native.sources(self._cx, parity, ready, src, own, only, need)
        while i >= 0:
            d = self._protocol.descriptor(parity, i)
            self._rt.reg.ensure_ready(self._members[i], int(d[F_SEG_VA]), int(d[F_SEG_SIZE]), int(d[F_SEG_OFF]),
                                      int(d[F_EPOCH]), operation)
            ready[i, 0], ready[i, 1] = d[F_SEG_VA], d[F_EPOCH]
            i = _native.sources(self._cx, parity, ready, src, own, only, need)
        return src

    def execute(self, operation: str, plan: Plan, path: str, dtype_code: int = 0, redop_code: int = 0,
                divisor: float = 1.0) -> int:
        """Execute one phase with the buffers in ``bases``, on ``path``; returns the bytes of
        copies found in place (skipped). Counts nothing: the mesh machine counts its phases,
        ``run`` the others."""
        if path == "sdma" and plan.has_copies:
            skipped = self._offload(operation, plan.copies, path)
            if plan.reductions.size:
                run_plan(plan.reductions, self.bases, dtype_code, redop_code, divisor)
            return skipped
        return run_plan(plan.table, self.bases, dtype_code, redop_code, divisor)

    def run(self, operation: str, plan: Plan, path: str, dtype_code: int = 0, redop_code: int = 0,
            divisor: float = 1.0) -> None:
        """Execute one phase outside the mesh machine (a ring step, all_to_all_v, a receive)
        and count its bytes (natively, as the machine does)."""
        skipped = self.execute(operation, plan, path, dtype_code, redop_code, divisor)
        _native.count(self._cx, plan.local, plan.remote, plan.written, skipped)

    def _engine(self) -> SdmaEngine:
        rt = self._rt
        if rt.sdma is None:
            rt.sdma = SdmaEngine(rt.model.comm_cores, rt.topology.sdma.max_descriptor_bytes,
                                 name=f"stratacl-sdma-{rt.rank}")
        return rt.sdma

    def _offload(self, operation: str, smap, path: str) -> int:
        """Run one phase's copies on the SDMA engine and wait for its notify; returns the bytes
        of copies skipped because they were already in place."""
        src, dst = addresses(smap, self.bases)
        moving = src != dst
        if not moving.any():
            return int(smap.nbytes.sum())
        model, eng = self._rt.model_for(path), self._engine()
        f = model.fabric
        members = np.asarray(self._members)
        tiers = f.tier_of(np.full(len(smap), members[self._rank]), members[smap.peer])
        tiers[smap.peer == self._rank] = f.local_tier
        units, pol = model.policy(smap.peer, smap.nbytes, tiers)
        posted = []
        for core, idx in enumerate(pol.lists()):
            idx = idx[moving[units.slice[idx]]]
            if idx.size:
                sl, off = units.slice[idx], units.offset[idx]
                eng.post(core, dst[sl] + off, src[sl] + off, units.nbytes[idx])
                posted.append(core)
        note = eng.post_notify(posted)
        eng.doorbell()
        deadline = time.monotonic() + self._rt.config.timeout
        while not note.wait(SLICE):
            self._rt.health.check(operation, [])
            if time.monotonic() > deadline:
                raise CommTimeout(f"{operation}: rank {self._rt.rank}: the SDMA engine did not complete "
                                  f"{len(smap)} transfers within {self._rt.config.timeout:g} s", operation)
        if eng.error is not None:
            raise eng.error
        return int(smap.nbytes[~moving].sum())
