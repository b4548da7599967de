"""``--path sdma`` in the data path: a phase's copies go to this rank's SDMA engine.

    phase's slice map (collectives._slices frontend) + every member's buffer addresses
        -> absolute (src, dst) of every slice
        -> units and their cores: the fabric model's partitioner (the same policy its modeled
           timelines use), so each core posts its units, in task order, to its own queue
        -> one notify record per core that posted, the doorbell; the calling thread (the
           cores) is free until it waits for the notify (cross-kernel completion)

Reductions stay on the cores (MTE): only copy phases (all_gather, all_to_all, broadcast, the
gather phase of all_reduce) are offloaded.
"""
from __future__ import annotations

import time

import numpy as np

from .._errors import CommTimeout
from ..collectives import _slices
from ..sdma._queues import SdmaEngine
from ._sync import SLICE


class Offload:
    """Mixin of ``Communicator``."""

    def _engine(self) -> SdmaEngine:
        rt = self._rt
        if rt.sdma is None:
            rt.sdma = SdmaEngine(rt.model.comm_cores, rt.topology.sdma.max_descriptor_bytes,
                                 name=f"stratacl-sdma-{rt.rank}")
        return rt.sdma

    def _offload(self, operation: str, smap: _slices.SliceMap, bases: np.ndarray) -> None:
        """Run one copy phase on the SDMA engine and wait for its notify."""
        if len(smap) == 0:
            return
        src, dst = _slices.addresses(smap, bases)
        model, eng = self._rt.model, self._engine()
        f = model.fabric
        members = np.asarray(self.members)
        tiers = f.tier_of(np.full(len(smap), members[self.rank]), members[smap.peer])
        tiers[smap.peer == self.rank] = f.local_tier
        units, pol = model.policy(smap.peer, smap.nbytes, tiers)
        posted = []
        for core, idx in enumerate(pol.lists()):
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
        c = self.counters
        own = int(smap.nbytes[smap.peer == self.rank].sum())
        total = int(smap.nbytes.sum())
        c.local += own
        c.pulled += total - own
        c.written += total
