"""One rank's modeled clock: what ``comm.clock()`` reads under ``--clock virtual|throttled``.

    collective call on every member
        arrival: each member publishes the clock it enters with (descriptor field F_AUX0)
        ... the data path moves the real bytes ...
        every member runs the call's timed plan (ub._clock: FabricModel.plan, or plan_exchange
        for calls given by their traffic) on all entering clocks (+ the jit mappings the call
        made, which every member derives from the descriptors alike) and keeps its own exit
        time -> RankClock.set (runtime/pipeline/_modeling.py)
    throttled: advance then sleeps until wall time = anchor + modeled time x dilation; a call
    that ends later than that is counted late and the anchor moves by the lag (lateness is the
    host's, it never enters modeled time). Wall time the rank spends between calls (its real
    compute) enters its clock as wall / dilation when it next enters a call, so compute and
    communication overlap as they would on the modeled fabric.

Asynchronous operations (``async_op=True``). ``now_us`` is the program's clock: an operation
enters at the program's clock when it was issued (or when the previous operation of its
communicator ended, if later), and its exit does not move the program's clock until
``Work.wait()`` (``join``): the program computes meanwhile, as a framework overlaps a kernel
with a collective. ``comm.charge_compute`` during that time shares the rank's cores with the
operations in flight (runtime/pipeline/_modeling.py, ub/_compute.py).

The modeled time depends only on the calls, their sizes, the topology and the registration
mode, never on how long the host took: the same program gives the same modeled times on an
idle or a loaded host, and ``stratacl.estimate`` gives the same numbers without moving bytes.
"""
from __future__ import annotations

import struct
import threading
import time

import numpy as np

from ._clock import FabricModel, model_send_recv
from ._topology import Topology

# a throttled call that ends behind its schedule by more than this share of its own dilated
# duration, plus a fixed slack for timer and wake-up noise, is "late"
LATE_SHARE, LATE_SLACK = 0.10, 0.0005


def to_bits(us: float) -> int:
    """A modeled time as the int64 that carries it in a descriptor."""
    return struct.unpack("<q", struct.pack("<d", us))[0]


def us_from_bits(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(bits)))[0]


def from_bits(bits: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(bits, dtype=np.int64).view(np.float64)


class RankClock:
    def __init__(self, topology: Topology, registration: str, mode: str, dilation: float, eager_bytes: int):
        if mode not in ("virtual", "throttled"):
            raise ValueError(f"RankClock: mode must be virtual or throttled, got {mode!r}")
        self.model = FabricModel.from_settings(topology, registration, eager_bytes)
        self.mode, self.dilation = mode, float(dilation)
        self.now_us = 0.0
        self.calls: dict[str, list] = {}          # op -> [count, total modeled us, last modeled us]
        self.late_calls = 0
        self.max_lag_s = 0.0
        self._wall0 = time.monotonic()
        self._wall_exit: float | None = None
        self._lock = threading.Lock()      # operations may end on communicators' worker threads

    def anchor(self) -> None:
        """Throttled: wall time follows modeled time from here (every rank anchors right after
        the same barrier, so their schedules agree to within that barrier's skew)."""
        self._wall0 = time.monotonic() - self.now_us * 1e-6 * self.dilation
        self._wall_exit = None

    def entering(self) -> float:
        """The clock a call starts from. Throttled: wall time spent since the last call ended
        counts, divided by the dilation (virtual: communication alone advances the clock)."""
        if self.mode == "throttled" and self._wall_exit is not None:
            now = time.monotonic()
            self.now_us += (now - self._wall_exit) * 1e6 / self.dilation
            self._wall_exit = now
        return self.now_us

    def bits(self) -> int:
        """``entering()`` as the int64 a descriptor carries."""
        return to_bits(self.entering())

    def received(self, sender: int, receiver: int, nbytes: int, t_send: float, t_recv: float) -> float:
        """Point-to-point, receiver's side (global ranks): when the pull of ``nbytes`` completes,
        for a send posted at ``t_send`` and a receive entered at ``t_recv``."""
        return float(model_send_recv(self.model, sender, receiver, nbytes, t_send, t_recv)[1])

    def sent(self, sender: int, receiver: int, t_send: float, t_received: float) -> float:
        """Point-to-point, sender's side: when the receiver's done flag (raised at
        ``t_received``) reaches a sender that posted at ``t_send``."""
        return max(t_send, t_received + float(self.model.fabric.flag_us(receiver, sender)))

    def set(self, op: str, t_us: float) -> None:
        """The program's clock moves to ``t_us``, the end of a blocking ``op``."""
        dur = t_us - self.now_us
        self._count(op, dur)
        self.now_us = t_us
        if self.mode == "throttled":
            self._follow(t_us, dur)
            self._wall_exit = time.monotonic()

    def ended(self, op: str, start_us: float, end_us: float) -> None:
        """An operation run on a worker thread (asynchronous, or queued behind one) ended at
        ``end_us``; the program's clock moves only when it joins it. Throttled: the worker
        sleeps until its wall time catches up with ``end_us``."""
        self._count(op, end_us - start_us)
        if self.mode == "throttled":
            self._follow(end_us, end_us - start_us)

    def join(self, end_us: float) -> None:
        """The program waits for an operation that ended at ``end_us`` (``Work.wait()``)."""
        t = self.entering()
        with self._lock:
            self.now_us = max(t, end_us)
        if self.mode == "throttled":
            self._wall_exit = time.monotonic()

    def _count(self, op: str, dur: float) -> None:
        with self._lock:
            c = self.calls.get(op)
            if c is None:
                self.calls[op] = [1, dur, dur]
            else:
                c[0] += 1
                c[1] += dur
                c[2] = dur

    def _follow(self, t_us: float, dur_us: float) -> None:
        target = self._wall0 + t_us * 1e-6 * self.dilation
        lag = time.monotonic() - target
        if lag < 0:
            time.sleep(-lag)
        else:
            with self._lock:
                if lag > LATE_SHARE * dur_us * 1e-6 * self.dilation + LATE_SLACK:
                    self.late_calls += 1
                    self.max_lag_s = max(self.max_lag_s, lag)
                self._wall0 += lag          # the next call is scheduled from where this one really ended

    def stats(self) -> dict:
        out = {"mode": self.mode, "now_us": self.now_us,
               "calls": {op: {"count": c[0], "total_us": c[1], "last_us": c[2]} for op, c in self.calls.items()}}
        if self.mode == "throttled":
            out.update(dilation=self.dilation, late_calls=self.late_calls, max_lag_s=self.max_lag_s)
        return out
