"""What a rank's program does beside its communicator's collectives: its modeled time (the
clock, compute kernels charged to it, stand-ins for a front end's later calls, probes) and its
rows to and from host memory. A part of the Communicator (runtime/communicator/_comm.py)."""
from __future__ import annotations

import numpy as np

from ..pipeline import Work, on_behalf, stand_in


class ProgramTime:
    """The Communicator's modeled-time and host-memory methods."""

    # --- modeled time -----------------------------------------------------------------------
    def clock(self) -> float | None:
        """This rank's modeled time in seconds (``--clock virtual`` or ``throttled``): the program's
        clock, which an asynchronous operation moves only when it is waited for. None when the
        clock is off (``--clock off``, the default), as ``stand_in`` is, so a program meant for
        either clock tests ``t is not None`` rather than catching an error (before, it raised
        ConfigError). Not collective."""
        return self._modeling.now()

    def charge_compute(self, duration_us: float, cores: int | None = None, hbm_bytes: float = 0) -> None:
        """Charge a compute kernel to the modeled clock: ``duration_us`` when it has ``cores`` of
        this rank's NPU cores (default: all of them) and the die's HBM to itself. Operations in
        flight (``async_op=True``, not yet waited for) keep the cores they occupy and the HBM
        bandwidth they draw; the kernel runs on what is left, so it takes longer where they
        overlap (MTE: the communication cores for the whole call; SDMA: only descriptor posting
        and polling; HBM: the kernel draws ``hbm_bytes / duration_us`` alone and is slowed
        while the operations' reads, writes and staging copies leave it less). Waits until those
        operations have completed, since their modeled times are needed. When profiling, the
        kernel is recorded on its cores. Not collective; a no-op without a modeled clock."""
        self._modeling.charge_compute(duration_us, cores, hbm_bytes)

    def charge_kernel(self, flops: float, hbm_bytes: float, cores: int | None = None) -> float:
        """``charge_compute`` of a kernel given by its work: ``flops`` and the bytes it reads and
        writes in HBM, timed by the roofline ``self.topology.kernel_us(flops, hbm_bytes)`` (the
        same modeled time, bit for bit). The trace records the FLOPs too, so that
        ``ub.extrapolate_dimension`` can time the kernel at other model dimensions. Returns the
        kernel's roofline time in us (also without a modeled clock). Not collective."""
        return self._modeling.charge_kernel(flops, hbm_bytes, cores)

    def stand_in(self, operation: str, async_op: bool = True) -> Work | None:
        """For a front end that runs this communicator's calls later, on a thread of its own
        (stratacl.torch queues a group's asynchronous operations on its worker): under a
        modeled clock, a ``Work`` that holds ``operation``'s place in modeled time from now,
        in program order; the calls made inside ``with comm.on_behalf(work):`` enter at the
        program's clock of this moment (or when this communicator's previous operation
        ended) and leave it alone, and ``work.wait()`` joins them, as for ``async_op=True``.
        ``async_op``: ``charge_compute`` shares the cores with it while it is in flight. None
        without a modeled clock. Not collective."""
        return stand_in(self, operation, async_op)

    def on_behalf(self, work: Work | None):
        """Context manager: communicator calls made on this thread inside it are ``work``'s
        (see ``stand_in``); ``work`` completes when it exits. ``None``: no effect."""
        return on_behalf(work)

    def probe(self, stage: str, core: int = 0):
        """Developer marker: record ``stage`` on ``core`` from entry to exit of the block, in
        modeled time, into this rank's profile (``--profile DIR``); a no-op otherwise."""
        return self._modeling.probe(stage, core)

    # --- host memory -----------------------------------------------------------------------
    def host_rows(self, cache: np.ndarray, host: np.ndarray, fetch_rows=None, fetch_slots=None,
                  store_slots=None, store_rows=None, *, async_op: bool = False, path: str | None = None):
        """Move whole rows between ``host``, a table in this rank's host memory (any array outside
        HBM), and ``cache``, an array of rows in its HBM: first ``host[store_rows] =
        cache[store_slots]`` (write-back), then ``cache[fetch_slots] = host[fetch_rows]``.
        Index arrays pair up one to one; a destination row may appear once. Rows move on
        ``path`` (default: the setting; under ``auto`` the cores, or SDMA when asynchronous),
        through a communication buffer under ``--registration staged``, zero copy otherwise.
        Under a modeled clock it is timed on the topology's ``host`` tier (runtime/communicator/_hostrows.py).
        Not collective. ``async_op=True``: the arguments are checked at once, the rows move on
        the rank's host-transfer thread and a ``Work`` is returned, as for an asynchronous
        collective (the rows, tables and index arrays belong to it until ``wait()``); such
        transfers run in call order. Else host-blocking."""
        if self._rt.host is None:
            from ._hostrows import HostRows
            self._rt.host = HostRows(self._rt)
        return self._rt.host.move(cache, host, fetch_rows, fetch_slots, store_slots, store_rows, path, async_op)
