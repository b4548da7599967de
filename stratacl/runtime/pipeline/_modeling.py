"""The communicator's side of the fabric model: algorithm choice and the modeled clock.

    algo_for(op, nbytes)    mesh | ring: the --algo setting; ``auto`` asks the fabric model
                            (ub._clock.choose_algo), identically on every member
    tick(op, descs, ...)    after a call, under --clock virtual|throttled: every member's
                            entering clock (descriptor field F_AUX0) and the jit mappings the
                            call made go through ub._clock.model_call; this rank keeps its exit

``Modeling`` is one component of a Communicator (runtime/communicator/_comm.py), which makes it first: the
slot protocol publishes its entering clock, the full-mesh driver and point-to-point read it.

jit mappings are derived from the descriptors, the same way on every member: member i maps
owner j's input segment in a call if i reads j in it (collectives._schedule.peers_read's
pattern) and has not mapped that (segment, epoch) before, nor a run of chunks holding it
(``_held``). That is what jit registration with a registration cache does;
the host's own mapping work does not enter modeled time.

Asynchronous operations (runtime/pipeline/_work.py) and compute:

    program clock (RankClock.now_us)      communicator's clock (Modeling._free_us)
    op(async_op=True) issued at t  ---->  enters at max(t, end of its previous operation),
    charge_compute(d, k): from t, k          ends at e (model_call), on its worker thread
       cores for d us, minus the cores   <-  the operations in flight occupy cores (their
       the operations in flight occupy       profiles: ub._profile.profile_call)
    work.wait(): program = max(now, e)

``charge_compute`` needs the modeled times of the operations in flight, so it waits until they
have completed (never for operations issued after it). The collective holds its cores first,
the compute job gets what is left (``ub._compute``: "comm first").
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

from ...collectives import schedules
from ...ub import ComputeJob, advance, choose_algo, from_bits, kernel_end, profile_plan, to_bits
from ..services import F_AUX0, F_EPOCH, F_NBYTES, F_SEG_SIZE, F_SEG_VA
from ._services import RankServices


class Modeling:
    """A communicator's modeled time and algorithm choice: the clock it enters each call
    with, where its previous operation ended, the asynchronous operation it runs for, the jit
    mappings its members made. Given the runtime and the members; the operators hand it each
    call's descriptors (``tick``)."""

    def __init__(self, rt: RankServices, members: list[int], rank: int):
        self._rt = rt
        self._members, self._rank, self._size = members, rank, len(members)
        self._issued_us = 0.0         # the program's clock when the running operation was called
        self._running = None          # the Work it runs for, or None (blocking, caller's thread)
        self._free_us = 0.0           # when this communicator's previous operation ended
        self._algo = rt.config.algo
        self._mapped = None           # jit: (an owner's seg_va, epoch) -> the members that mapped it
        self.key = 0                  # the communicator in a trace: its barrier counter's offset (a Communicator's)
        self._calls = 0               # calls timed on this communicator, for the trace

    def now(self) -> float | None:
        """``comm.clock()``: the program's clock, in seconds; None when the clock is off."""
        if self._rt.config.clock == "off":
            return None
        if self._rt.trace is not None:
            self._rt.trace.clock()
        return self._rt.clock.now_us * 1e-6

    def charge_kernel(self, flops: float, hbm_bytes: float, cores: int | None = None) -> float:
        """``comm.charge_kernel``: ``charge_compute`` of the kernel's roofline time
        (``Topology.kernel_us``), recorded with its FLOPs so that ``ub.extrapolate_dimension``
        can time it again at other model dimensions. Returns that time."""
        us = self._rt.topology.kernel_us(flops, hbm_bytes)
        self.charge_compute(us, cores, hbm_bytes, flops=flops)
        return us

    def charge_compute(self, duration_us: float, cores: int | None = None, hbm_bytes: float = 0.0,
                       flops: float | None = None) -> None:
        """``comm.charge_compute``: a compute kernel on the modeled clock (see the module docstring);
        ``flops``: the kernel's, for the trace, when ``charge_kernel`` derived the time from them."""
        c, prof = self._rt.clock, self._rt.profiler
        if c is None:
            return
        model = self._rt.model
        total = model.cores
        if duration_us < 0:
            raise ValueError(f"charge_compute: duration_us must be >= 0, got {duration_us}")
        k = total if cores is None else int(cores)
        if not 1 <= k <= total:
            raise ValueError(f"charge_compute: cores must be in 1..{total}, got {cores}")
        if hbm_bytes < 0:
            raise ValueError(f"charge_compute: hbm_bytes must be >= 0, got {hbm_bytes}")
        if hbm_bytes > 0 and duration_us > 0 and hbm_bytes / duration_us > model.fabric.hbm * (1 + 1e-9):
            raise ValueError(f"charge_compute: {hbm_bytes:g} bytes in {duration_us:g} us draw "
                             f"{hbm_bytes / duration_us / 1e3:g} GB/s, more than the die's HBM "
                             f"({model.fabric.hbm / 1e3:g} GB/s); Topology.kernel_us gives a kernel's time")
        if self._rt.trace is not None:
            self._rt.trace.compute(duration_us, k, hbm_bytes, flops)
        t0 = c.entering()
        job = ComputeJob(k, duration_us, t0, float(hbm_bytes))
        end = kernel_end(job, total, self._rt.in_flight_occupancy(t0, "charge_compute"), model.fabric.hbm)
        c.set("compute", end)
        if prof is not None:
            prof.record_many(np.arange(k), "compute", t0, end)

    @contextlib.contextmanager
    def probe(self, stage: str, core: int = 0):
        """``comm.probe``: ``stage`` on ``core`` in this rank's profile, from entry to exit of the block."""
        prof, c = self._rt.profiler, self._rt.clock
        if prof is None:
            yield
            return
        t0 = c.entering()
        try:
            yield
        finally:
            prof.record(core, stage, t0, c.entering())

    def issue(self, issued_us: float, work=None) -> None:
        """The operation about to run was called at ``issued_us`` on the program's clock, for
        ``work`` (None: blocking, on the caller's thread)."""
        self._issued_us, self._running = issued_us, work

    def entering_us(self) -> float:
        """The modeled time this rank enters the running call at: when the program called it,
        or when this communicator's previous operation ended, whichever is later."""
        return max(self._issued_us, self._free_us)

    def entering_bits(self) -> int:
        """``entering_us`` as the running call's descriptor carries it (0 without a modeled clock)."""
        return to_bits(self.entering_us()) if self._rt.clock is not None else 0

    def ended(self, op: str, start_us: float, end_us: float, occupancy=None) -> None:
        """The running call ends at ``end_us``: the program's clock moves there if the call is
        blocking; an asynchronous one records it on its Work (and what its cores did:
        ``occupancy``: (model, timed plan, members, entering clocks, this member), what
        ub._profile.profile_plan walks) for wait() and charge_compute."""
        self._free_us = end_us
        c, work = self._rt.clock, self._running
        if occupancy is None and self._rt.trace is not None:
            self._rt.trace.p2p(op)
        if work is None:
            c.set(op, end_us)
        else:
            c.ended(op, start_us, end_us)
            calls = [occupancy] if occupancy is not None else []
            if work.modeled is not None:     # a front end's operation made of several calls (_work.stand_in)
                start_us, calls = work.modeled[0], work.modeled[2] + calls
            work.modeled = (start_us, end_us, calls)

    def join_work(self, work) -> None:
        """``work.wait()`` under a modeled clock: the program's clock joins the operation's end."""
        if self._rt.trace is not None:
            self._rt.trace.wait(work)
        if work.modeled is not None:
            self._rt.clock.join(work.modeled[1])

    def algo_for(self, op: str, nbytes: int, itemsize: int = 1) -> str:
        """mesh or ring for a call of ``op`` on ``nbytes``: the same answer on every member."""
        algo = self._algo
        if algo == "mesh" or self._size < 2 or op not in schedules.RING_OPS:
            return "mesh"
        if algo == "ring":
            return "ring"
        return choose_algo(self._rt.model, op, self._members, nbytes, 0, itemsize)

    def tick(self, op: str, descs: np.ndarray, nbytes: int, algo: str, root: int, itemsize: int, path: str) -> None:
        """After a call under a modeled clock: its exit time from every member's descriptor
        ``descs`` (their entering clocks, F_AUX0), on the fabric model of ``path``."""
        entering = from_bits(descs[:, F_AUX0])
        extra = self._jit_extra(descs, op, algo, root) if self._rt.config.registration == "jit" else None
        model = self._rt.model_for(path)
        if self._rt.trace is not None:
            self._record(dict(op=op, algo=algo, nbytes=int(nbytes), root=int(root), itemsize=int(itemsize)), path,
                         extra, descs)
        self._timed(op, model, model.plan(op, algo, tuple(self._members), nbytes, root, itemsize), entering, extra)

    def tick_exchange(self, op: str, descs: np.ndarray, phases: list, staging, path: str,
                      routing: dict | None = None) -> None:
        """``tick`` for a call given by its traffic matrices (collectives._schedule.exchange):
        all_to_all_v, MoE dispatch and combine; ``staging``: (input, output) bytes per member
        that the staged registration copies, or None (ub._clock.FabricModel.plan_exchange). A
        jit member maps every owner it reads from in any phase. ``routing`` (MoE calls): the
        routing's shape, recorded with the call so that ``ub.extrapolate`` can draw it anew."""
        entering = from_bits(descs[:, F_AUX0])
        extra = None
        if self._rt.config.registration == "jit":
            reads = np.zeros((self._size, self._size), dtype=bool)
            for b, _ in phases:
                reads |= np.asarray(b) > 0
            np.fill_diagonal(reads, False)
            extra = self._jit_extra(descs, op, "mesh", 0, reads)
        model = self._rt.model_for(path)
        if self._rt.trace is not None:
            self._record(dict(op=op, phases=[(np.asarray(b, dtype=np.int64), int(k)) for b, k in phases],
                              staging=None if staging is None else [np.asarray(a, dtype=np.int64) for a in staging],
                              **({} if routing is None else {"routing": routing})),
                         path, extra, descs)
        self._timed(op, model, model.plan_exchange(tuple(self._members), phases, staging), entering, extra)

    def tick_host(self, op: str, phases: list, staging, path: str) -> None:
        """``tick_exchange`` for a rank's own transfers to and from its host memory
        (runtime/communicator/_hostrows.py): this one-member timeline enters at the program's clock or its
        previous call's end; no descriptors, no peers, no jit mappings."""
        entering = np.array([self.entering_us()])
        model = self._rt.model_for(path)
        if self._rt.trace is not None:
            self._calls += 1
            self._rt.trace.call(self._running, dict(
                comm=self.key, members=self._members, k=self._calls, path=path, extra=None, gap_s=None, op=op,
                phases=[(np.asarray(b, dtype=np.int64), int(k)) for b, k in phases],
                staging=[np.asarray(a, dtype=np.int64) for a in staging]))
        self._timed(op, model, model.plan_exchange(tuple(self._members), phases, staging), entering, None)

    def _record(self, inputs: dict, path: str, extra, descs: np.ndarray) -> None:
        """A call's model inputs, into the rank's trace (runtime/services/_trace.py), with the wall
        seconds since this rank's input was physically allocated (None: not in HBM)."""
        self._calls += 1
        own = descs[self._rank]
        born = self._rt.reg.allocated_at(int(own[F_SEG_VA]), int(own[F_SEG_SIZE])) if own[F_SEG_VA] else None
        self._rt.trace.call(self._running, dict(comm=self.key, members=self._members, k=self._calls, path=path,
                                                extra=None if extra is None else np.asarray(extra),
                                                gap_s=None if born is None else time.monotonic() - born, **inputs))

    def _timed(self, op: str, model, plan: list, entering: np.ndarray, extra) -> None:
        """This member's end of a call whose timed ``plan`` every member entered at ``entering``
        (plus ``extra``: jit mappings), and its cores' profile when the profiler runs."""
        me = self._rank
        clocks = entering if extra is None else entering + extra
        end = float(advance(plan, clocks)[me])
        self.ended(op, float(entering[me]), end, (model, plan, self._members, clocks, me))
        prof = self._rt.profiler
        if prof is not None:
            prof.absorb(profile_plan(model, plan, self._members, clocks_in=clocks, ranks=[me])[0])

    def _held(self, key: tuple[int, int], size: int) -> np.ndarray:
        """The members that mapped a run of chunks holding ``key``'s [va, va + size), as a
        registration cache finds a buffer inside a range it registered (NCCL's ncclRegFind).
        Only a run named no earlier than ``key`` counts: ``key``'s segment, live now, has had
        the same memory since it was named (a name is dropped once any of its chunks is
        unmapped), so the run covered that memory when it was mapped. A run named later may
        hold remapped chunks, which descriptors do not tell apart: mapped again."""
        va, epoch = key
        held = np.zeros(self._size, dtype=bool)
        for lo, hi, e, k in self._runs:
            if lo <= va and va + size <= hi and e >= epoch and k != key:
                held |= self._mapped[k]
        return held

    def _jit_extra(self, descs: np.ndarray, op: str, algo: str, root: int,
                   reads: np.ndarray | None = None) -> np.ndarray | None:
        """Every member's cost of the jit mappings it makes in this call: of each owner's input
        segment it reads (``reads[i, j]``: i reads j; default: the operator's pattern) and has
        not mapped before, itself or inside a run of chunks (``_held``)."""
        n = self._size
        if self._mapped is None:
            self._mapped, self._runs = {}, []
            cfg = self._rt.config       # runs of chunks: the expandable allocator's segments over several
            self._chunk = cfg.chunk_size if cfg.allocator == "expandable" else 1 << 62
        if op in ("barrier", "split") or n == 1:
            return None
        if reads is not None:
            reads = reads.copy()
        elif op == "sendrecv" or (algo == "ring" and op in schedules.RING_OPS):
            reads = np.roll(np.eye(n, dtype=bool), -1, axis=1)        # i reads i-1
        elif op == "broadcast":
            reads = np.zeros((n, n), dtype=bool)
            reads[:, root] = True
            reads[root, root] = False
        else:
            reads = ~np.eye(n, dtype=bool)
        reads &= (descs[:, F_NBYTES] != 0)[None, :]
        seg, size, epoch = descs[:, F_SEG_VA], descs[:, F_SEG_SIZE], descs[:, F_EPOCH]
        new = np.zeros_like(reads)
        for j in np.flatnonzero(reads.any(axis=0)):
            # an owner's segment (its VA is in the owner's slice of the window; the epoch tells a
            # reallocation at the same address apart) stays mapped in every reader that mapped it
            key = (int(seg[j]), int(epoch[j]))
            have = self._mapped.get(key)
            col = reads[:, j] if have is None else reads[:, j] & ~have
            if col.any() and self._runs:
                col = col & ~self._held(key, int(size[j]))
            if col.any():
                new[:, j] = col
                self._mapped[key] = col.copy() if have is None else have | col
                if have is None and int(size[j]) > self._chunk:
                    self._runs.append((key[0], key[0] + int(size[j]), key[1], key))
        if not new.any():
            return None
        cost = self._rt.model.registration_us(new.astype(np.float64), descs[:, F_SEG_SIZE][None, :])
        return cost.sum(axis=1)
