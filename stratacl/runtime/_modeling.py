"""The communicator's side of the fabric model: algorithm choice and the modeled clock.

    _algo_for(op, nbytes)   mesh | ring: the --algo setting; ``auto`` asks the fabric model
                            (ub._clock.choose_algo), identically on every member
    _tick(op, ...)          after a call, under --clock virtual|throttled: every member's
                            entering clock (descriptor field F_AUX0) and the jit mappings the
                            call made go through ub._clock.model_call; this rank keeps its exit

jit mappings are derived from the descriptors, the same way on every member: member i maps
owner j's input segment in a call if i reads j in it (collectives._schedule.peers_read's
pattern) and has not mapped that (segment, epoch) before. That is what jit registration does;
the host's own mapping work does not enter modeled time.
"""
from __future__ import annotations

import contextlib

import numpy as np

from .._errors import ConfigError
from ..collectives import _schedule
from ..ub._clock import choose_algo
from ..ub._profile import profile_call
from ..ub._rankclock import from_bits
from ._control import F_AUX0, F_EPOCH, F_NBYTES, F_SEG_SIZE, F_SEG_VA


class Modeled:
    """Mixin of ``Communicator``."""

    def clock(self) -> float:
        """This rank's modeled time in seconds (``--clock virtual`` or ``throttled``). Not collective."""
        if self._rt.config.clock == "off":
            raise ConfigError("comm.clock(): the clock is off; launch with --clock virtual (or STRATACL_CLOCK)")
        return self._rt.clock.now_us * 1e-6

    def charge_compute(self, duration_us: float, cores: int | None = None) -> None:
        """Charge ``duration_us`` of modeled compute on ``cores`` of this rank's NPU cores (default:
        all of them) to its modeled clock and, when profiling, to those cores' timelines. Not
        collective; a no-op without a modeled clock. Overlap with an asynchronous collective is
        not modeled here (see ub._compute.overlap for the model of it)."""
        c, prof = self._rt.clock, self._rt.profiler
        if c is None:
            return
        if duration_us < 0:
            raise ValueError(f"charge_compute: duration_us must be >= 0, got {duration_us}")
        t0 = c.entering()
        c.set("compute", t0 + duration_us)
        if prof is not None:
            k = self._rt.model.cores if cores is None else int(cores)
            prof.record_many(np.arange(k), "compute", t0, t0 + duration_us)

    @contextlib.contextmanager
    def probe(self, stage: str, core: int = 0):
        """Developer marker: record ``stage`` on ``core`` from entry to exit of the block, in
        modeled time, into this rank's profile (``--profile DIR``); a no-op otherwise."""
        prof, c = self._rt.profiler, self._rt.clock
        if prof is None:
            yield
            return
        t0 = c.entering()
        try:
            yield
        finally:
            prof.record(core, stage, t0, c.entering())

    def _entering_bits(self) -> int:
        """The modeled clock this rank enters the current call with, as its descriptor carries it
        (0 without a modeled clock)."""
        c = self._rt.clock
        return c.bits() if c is not None else 0

    def _algo_for(self, op: str, nbytes: int, itemsize: int = 1) -> str:
        algo = self._rt.config.algo
        if algo == "mesh" or self.size < 2 or op not in _schedule.RING_OPS:
            return "mesh"
        if algo == "ring":
            return "ring"
        return choose_algo(self._rt.model, op, self.members, nbytes, 0, itemsize)

    def _tick(self, op: str, parity: int, nbytes: int, algo: str = "mesh", root: int = 0, itemsize: int = 1) -> None:
        c = self._rt.clock
        if c is None:
            return
        descs = self._rt.ctl.i64[self._desc_idx[parity]]
        entering = from_bits(descs[:, F_AUX0])
        extra = self._jit_extra(descs, op, algo, root) if self._rt.config.registration == "jit" else None
        c.advance(op, algo, self.members, nbytes, entering, extra, self.rank, root, itemsize)
        prof = self._rt.profiler
        if prof is not None:
            clocks = entering if extra is None else entering + extra
            prof.absorb(profile_call(c.model, op, algo, self.members, nbytes, root, itemsize, clocks_in=clocks,
                                     ranks=[self.rank])[0])

    def _jit_extra(self, descs: np.ndarray, op: str, algo: str, root: int) -> np.ndarray | None:
        n = self.size
        if self._mapped is None:
            self._mapped = np.full((n, n, 2), -1, dtype=np.int64)
        if op in ("barrier", "split") or n == 1:
            return None
        if op == "sendrecv" or (algo == "ring" and op in _schedule.RING_OPS):
            reads = np.roll(np.eye(n, dtype=bool), -1, axis=1)        # i reads i-1
        elif op == "broadcast":
            reads = np.zeros((n, n), dtype=bool)
            reads[:, root] = True
            reads[root, root] = False
        else:
            reads = ~np.eye(n, dtype=bool)
        reads &= (descs[:, F_NBYTES] != 0)[None, :]
        seg, epoch = descs[:, F_SEG_VA], descs[:, F_EPOCH]
        new = reads & ((self._mapped[:, :, 0] != seg[None, :]) | (self._mapped[:, :, 1] != epoch[None, :]))
        if not new.any():
            return None
        self._mapped[new, 0] = np.broadcast_to(seg[None, :], (n, n))[new]
        self._mapped[new, 1] = np.broadcast_to(epoch[None, :], (n, n))[new]
        cost = self._rt.model.registration_us(new.astype(np.float64), descs[:, F_SEG_SIZE][None, :])
        return cost.sum(axis=1)
