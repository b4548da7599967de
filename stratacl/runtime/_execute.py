"""The communicator's side of the backend: every operator's phases run through here.

    operator (runtime/_comm.py, _p2p.py)
        -> _phases(key, frontend)      the call's compiled phases (collectives._backend.Plans,
                                       built from the collectives._slices frontend on first use)
        -> this call's buffers in self._bases[buf, member] (IN: every member's input, filled
           by the arrival's readiness check; OUT, SCRATCH: what the operator sets)
        -> _run(plan) per phase, on the call's path (the ``path`` setting, or ``path=`` of the
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

from .._errors import CommTimeout
from ..collectives import _backend
from ..collectives._kernels import BUFFERS, run_plan
from ..collectives._slices import IN
from ..sdma._engine import SdmaEngine
from ..sdma._model import PATHS
from . import _native
from ._sync import SLICE


class Execute:
    """Mixin of ``Communicator``."""

    def _init_execute(self) -> None:
        self._bases = np.zeros((BUFFERS, self.size), dtype=np.int64)
        self._src = self._bases[IN]            # filled by _peer_sources (a view: no copy per call)
        self._plans = _backend.Plans()
        self._default_path = self._rt.config.path
        self._path = self._default_path
        self.counters = _backend.Counters()      # summed over the rank's communicators by stats()
        self._rt.byte_counters.append(self.counters)

    def _check_path(self, operation: str) -> None:
        """Argument check of the call's ``path=`` (raised inside the operation's checks, so every
        rank of the call learns that this one rejected its arguments)."""
        if self._path not in PATHS:
            raise ValueError(f"{operation}: path must be one of {', '.join(PATHS)}, got {self._path!r}")

    def _phases(self, key: tuple, build, itemsize: int = 1) -> tuple:
        return self._plans.get(key, build, itemsize)

    def _phase(self, key: tuple, build, itemsize: int = 1, shared: bool = False) -> _backend.Plan:
        """The one phase of a one-phase operator (see _phases); ``shared``: every member reads
        the same sources (_backend.compile)."""
        plans = self._plans.get(key, build, itemsize, shared)
        assert len(plans) == 1, key
        return plans[0]

    def _execute(self, operation: str, plan: _backend.Plan, dtype_code: int = 0, redop_code: int = 0,
                 divisor: float = 1.0) -> int:
        """Execute one phase with the buffers in ``self._bases``, on the call's path; returns
        the bytes of copies found in place (skipped). Counts nothing: the mesh machine counts
        its phases, ``_run`` the others."""
        if self._path == "sdma" and plan.has_copies:
            skipped = self._offload(operation, plan.copies)
            if plan.reductions.size:
                run_plan(plan.reductions, self._bases, dtype_code, redop_code, divisor)
            return skipped
        return run_plan(plan.table, self._bases, dtype_code, redop_code, divisor)

    def _run(self, operation: str, plan: _backend.Plan, dtype_code: int = 0, redop_code: int = 0,
             divisor: float = 1.0) -> None:
        """Execute one phase outside the mesh machine (a ring step, all_to_all_v) and count its
        bytes (natively, as the machine does)."""
        skipped = self._execute(operation, plan, dtype_code, redop_code, divisor)
        _native.count(self._cx, plan.local, plan.remote, plan.written, skipped)

    def _engine(self) -> SdmaEngine:
        rt = self._rt
        if rt.sdma is None:
            rt.sdma = SdmaEngine(rt.model.comm_cores, rt.topology.sdma.max_descriptor_bytes,
                                 store_u32=_native.store_u32, futex_wake=_native.futex_wake,
                                 name=f"stratacl-sdma-{rt.rank}")
        return rt.sdma

    def _offload(self, operation: str, smap) -> int:
        """Run one phase's copies on the SDMA engine and wait for its notify; returns the bytes
        of copies skipped because they were already in place."""
        src, dst = _backend.addresses(smap, self._bases)
        moving = src != dst
        if not moving.any():
            return int(smap.nbytes.sum())
        model, eng = self._rt.model_for(self._path), self._engine()
        f = model.fabric
        members = np.asarray(self.members)
        tiers = f.tier_of(np.full(len(smap), members[self.rank]), members[smap.peer])
        tiers[smap.peer == self.rank] = f.local_tier
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
                                  f"{len(smap)} transfers within {self._rt.config.timeout:g} s")
        if eng.error is not None:
            raise eng.error
        return int(smap.nbytes[~moving].sum())
