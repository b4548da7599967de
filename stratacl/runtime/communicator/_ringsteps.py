"""A communicator's ring calls (``RingSteps``, one of its components): the entry that names
the left neighbour's buffer, the step driver and its step words, the scratch buffer.

Ring algorithms (``--algo ring``) run N-1 steps per chain, each member pulling from its left
neighbour i-1 only (the steps' slice maps: collectives._slices.ring_*_step; their timing:
collectives._schedule). Step s waits until i-1 has finished its step s-1, runs its phase on the
backend and tells i+1; all_reduce's two chains (reduce-scatter, then all-gather in place) are
separated by a barrier. Reductions fold chunk c over members c+1, c+2, ..., c (mod N), the
order the ring visits them, so floating-point results differ from the mesh's rank order in
rounding (as any ring implementation's do); avg sums along the ring and divides by N once, in
the last reduce step.

Each member counts the ring steps it has finished on a communicator, ever, in a u32 of its
communicator slot; step s of a call waits until the left neighbour's count reaches the call's
base + s. A ring call also publishes one more buffer than its input (all_gather: the output
the right neighbour pulls forwarded chunks from; reduce_scatter / all_reduce: the scratch
buffer holding partial reductions), in descriptor field F_AUX1 and the first four extension
words (segment va, size, HBM offset, epoch), so the right neighbour can check its readiness;
the fifth holds the call's base (its count before the call, mod 2**32), by which a host's
carrier tells, from a far member's ring-step word, which step of which call it finished and
reads what the step after it pulls (runtime/hosts/_reads.py, ``FarReads.ring``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...collectives import OUT, REDUCE_OPS, SCRATCH, slices
from .. import _native
from ..pipeline import RankServices, buffer_size
from ..services import DESC_FIXED, F_AUX1, H_CARRIER_BELL, SLICE, SPIN_POLLS, WAKE_ALL, wait_until

if TYPE_CHECKING:
    from ..pipeline import CallInput


_SUM, _AVG = REDUCE_OPS["sum"], REDUCE_OPS["avg"]


class RingSteps:
    """A communicator's ring calls besides the slot protocol: the steps this member has
    finished (its ring-step word), the step driver, the extra buffer each member names and
    its left neighbour's, and the scratch buffer. Given the runtime, the members, the slot
    protocol (descriptor words, slot offsets), the executor (phases, readiness) and the
    communication buffers (segments of this rank's HBM)."""

    def __init__(self, rt: RankServices, members: list[int], rank: int, protocol, executor, buffers):
        self._rt, self._protocol, self._executor, self._buffers = rt, protocol, executor, buffers
        self._size = n = len(members)
        self._rank, self._left = rank, (rank - 1) % n
        self._left_member = members[self._left]
        ctl, lay, offs = rt.ctl, protocol.lay, protocol.slot_offs
        self._left_word = ctl.base + offs[self._left] + lay.slot_ring_step()
        self._own_word = ctl.base + offs[rank] + lay.slot_ring_step()
        self._steps = 0                 # ring steps finished on this communicator, ever (mod 2**32 in the word)
        # a right neighbour on another host learns of this member's steps through the host's
        # carrier (runtime/hosts/_carrier.py), which each step rings; 0: on this host
        right = members[(rank + 1) % n]
        self._bell = ctl.base + H_CARRIER_BELL if right in rt.hosts.remote() else 0
        self._scratch = None
        self._ready_extra = np.full((n, 2), -1, dtype=np.int64)   # as Executor.ready, for the extra buffers

    def call(self, operation: str, a, inp: "CallInput | None", path: str) -> int:
        """A ring call of ``operation`` (all_gather, reduce_scatter or all_reduce) from its
        checked arguments ``a`` (communicator/_meshops.py, MeshArgs), start to end. Returns
        the slot parity. all_gather's right neighbour pulls forwarded chunks from the output
        (in this rank's HBM: ``a.target``); the reductions' from the scratch buffer."""
        me, n, item = self._rank, self._size, a.itemsize
        count = a.nbytes // item                 # the input's elements
        if operation == "all_gather":
            parity = self.enter(operation, OUT, a.target, a.code, a.count, 0, inp)
            steps = self._executor.phases(("ring_all_gather", a.nbytes), lambda: [
                m for s in range(n - 1) for m in slices.ring_all_gather_step(me, n, a.nbytes, s)])
            self.run(operation, steps, path)
        else:
            parity = self.enter(operation, SCRATCH, self.scratch(a.nbytes), a.code, a.count, a.rcode, inp)
            chains, step = ((1, slices.ring_reduce_scatter_step) if operation == "reduce_scatter"
                            else (2, slices.ring_all_reduce_step))
            steps = self._executor.phases((f"ring_{operation}", count, item), lambda: [
                m for s in range(chains * (n - 1)) for m in step(me, n, count, item, s)], item)
            self.run(operation, steps, path, a.code, a.rcode,
                     barrier=(lambda: self._protocol.sync(operation)) if chains == 2 else None)
        self._protocol.finish(operation)
        return parity

    def enter(self, operation: str, buf: int, extra: np.ndarray, dtype: int, count: int, redop: int,
              inp: "CallInput | None") -> int:
        """Enter a ring call: publish this rank's descriptor naming ``extra`` (in this rank's
        HBM: the buffer its right neighbour pulls from, the output or the scratch buffer),
        arrive and agree (raises on a disagreement), then check the left neighbour's input and
        extra buffer ready and name both buffers in the table (``buf``: OUT or SCRATCH).
        Returns the slot parity."""
        addr = _native.data_address(extra)
        seg = self._buffers.hbm_segment(extra, addr) if extra.nbytes else None
        ext = ((seg.va, seg.size, seg.hbm_offset, seg.epoch) if seg is not None else (0, 0, 0, 0)) + (
            self._steps & 0xFFFFFFFF,)       # the base of the steps ``run`` is about to take
        parity = self._protocol.enter(operation, dtype, count, 0, redop, inp, aux1=addr, ext=ext)
        left = self._left
        self._executor.peer_sources(operation, parity, inp.addr if inp is not None else 0, only=left)
        bases = self._executor.bases
        bases[buf, self._rank] = addr
        bases[buf, left] = self._left_extra_buffer(parity, operation)
        return parity

    def run(self, operation: str, steps, path: str, dtype_code: int = 0, redop_code: int = 0,
            barrier=None) -> None:
        """Run a ring call's compiled steps in order (one phase each, on ``path``), step s once
        the left neighbour has finished its step s-1. A second chain starts at step N-1,
        after ``barrier``, without waiting for the neighbour."""
        n, execute = self._size, self._executor.run
        base = self._steps
        self._steps += len(steps)
        fold = _SUM if redop_code == _AVG else redop_code
        for s, plan in enumerate(steps):
            if s == n - 1 and barrier is not None:
                barrier()
            elif s:
                self._wait_left(base, s, operation)
            execute(operation, plan, path, dtype_code, redop_code if s == n - 2 else fold, float(n))
            word = self._own_word
            _native.store_u32(word, (base + s + 1) & 0xFFFFFFFF)
            _native.futex_wake(word, WAKE_ALL)
            if self._bell:
                _native.fetch_add_u64(self._bell, 1)
                _native.futex_wake(self._bell, 1)

    def _wait_left(self, base: int, s: int, operation: str) -> None:
        target = (base + s) & 0xFFFFFFFF
        word = self._left_word
        if _native.wait_seq_u32(word, target, SPIN_POLLS, SLICE):
            return
        left = self._left_member
        wait_until(lambda: _native.seq_reached(_native.load_u32(word), target), word, self._rt.health, operation,
                   self._rt.config.timeout, lambda: [left], f"rank {left} to finish ring step {s - 1}")

    def _left_extra_buffer(self, parity: int, operation: str) -> int:
        """The address of the left neighbour's extra buffer, once mapped here."""
        left = self._left
        words = self._protocol.words_of(left, parity)
        addr = int(words[F_AUX1])
        va, size, hbm_off, epoch = (int(v) for v in words[DESC_FIXED:DESC_FIXED + 4])
        ready = self._ready_extra[left]
        if va and (ready[0] != va or ready[1] != epoch):
            self._rt.reg.ensure_ready(self._left_member, va, size, hbm_off, epoch, operation)
            ready[0], ready[1] = va, epoch
        return addr

    def scratch(self, nbytes: int) -> np.ndarray:
        """A communicator-owned HBM buffer of at least ``nbytes`` (partials, forwarded chunks)."""
        if self._scratch is None or self._scratch.nbytes < nbytes:
            self._scratch = None
            self._scratch = self._rt.empty((buffer_size(nbytes),), np.uint8)
        return self._scratch
