"""What a rank's components may use of its runtime.

``init()`` makes one ``Runtime`` per rank process (runtime/_world.py); every component of a
communicator (SlotProtocol, Executor, Buffers, Modeling, MeshDriver, RingSteps, PointToPoint, the
call Pipeline, HostRows) is handed it as ``rt`` and sees it through this typing.Protocol: the rank's
settings, its control segment and registration unit, its clocks and recorders, its HBM
allocator, and the few services below. ``tests/test_layering.py`` checks both sides: the
Runtime has every member, and the components use no other.
"""
from __future__ import annotations

import array
from typing import Any, Protocol

import numpy as np

from ..._config import Config
from ...ub import FabricModel, RankClock, Topology
from ..memory import RegistrationUnit, ShadowWindow
from ..services import Control, JobHealth, Trace


class RankServices(Protocol):
    rank: int
    config: Config
    topology: Topology
    ctl: Control                    # the job's control segment (slots, words, flight recorder)
    hosts: Any                      # which host each rank is on (runtime/hosts/_hosts.py)
    health: JobHealth               # peers' liveness, for every wait
    window: ShadowWindow            # the shared virtual address window
    reg: RegistrationUnit           # peers' segments mapped here, on allocation or first use
    allocator: Any                  # the HBM allocator (runtime/memory/_allocator.py, runtime/memory/_expandable.py)
    clock: RankClock | None         # the modeled clock (None: --clock off)
    trace: Trace | None             # --trace
    profiler: Any                   # --profile (ub/_profile.py), or None
    sdma: Any                       # the SDMA engine once started (sdma/_engine.py), or None
    host: Any                       # the channel to host memory once used (runtime/communicator/_hostrows.py)
    stats: dict                     # stratacl.stats()'s counters
    native_calls: array.array       # calls the native methods completed, per NATIVE_CALLS name
    byte_counters: list             # every communicator's byte counters, summed by stats()
    communicators: Any              # the live communicators (a weak set), shut by finalize()
    workers: list                   # every worker thread, stopped by finalize()
    world_comm: Any                 # the world communicator

    @property
    def model(self) -> FabricModel:
        """The fabric model the rank times its calls with (the job's settings)."""

    def model_for(self, path: str) -> FabricModel:
        """The fabric model of a call on ``path``."""

    def empty(self, shape, dtype) -> np.ndarray:
        """A new array in the rank's HBM."""

    def own_segment(self, addr: int, nbytes: int):
        """The segment of the rank's HBM holding [addr, addr + nbytes), or None."""

    def native_call_word(self, operation: str) -> int:
        """The address of the counter of ``operation``'s natively completed calls."""

    def reserve_slot(self) -> int:
        """A free communicator slot of the control segment."""

    def release_slot(self, slot: int) -> None:
        """Give back a slot no communicator holds."""

    def track(self, work) -> None:
        """Keep an asynchronous operation for ``charge_compute`` while it is in flight."""

    def in_flight_occupancy(self, t0: float, operation: str) -> list:
        """What the operations in flight at modeled time ``t0`` hold of the cores and the HBM."""
