"""The fabric and its model: topology and tiers, the cost model, modeled clocks, trace replay.

For users: ``view`` and ``wait_registered`` (any rank's registered buffer at its shared
address), ``replay``/``load_traces`` (a recorded job's modeled time without ranks),
``extrapolate``/``extrapolate_dimension`` (traces of a larger job), ``Topology``/``Tier``/
``load_topology`` (the model as data). The names below ``__all__`` are the model as the rest of
the library consults it: the runtime's clocks and profiler, ``stratacl.estimate`` and
``stratacl.ep.estimate``. The model is given what it needs; it imports nothing of the runtime,
whose registration unit serves ``view``:

    init()       runtime --activate_mappings(unit)--> here    (finalize(): activate_mappings(None))
    ub.view(a)   --> the unit's view(a, shape, dtype): it checks that a is registered (catching
                     up with its owner) and returns a view of the shared address window

Making an address readable is the runtime's mechanism (runtime/memory/_registration.py: a
background thread, maps at fixed addresses, the mailbox); the fabric only names what it uses
of it (``SharedMappings``).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from .._errors import NotInitialized
from .._errors import ReplayError as ReplayError
from ._dimension import extrapolate_dimension as extrapolate_dimension
from ._extrapolate import extrapolate as extrapolate
from ._topology import Tier as Tier
from ._topology import Topology as Topology
from ._topology import load as load_topology
from ._tracereplay import Replay as Replay
from ._tracereplay import load as load_traces
from ._tracereplay import replay as replay

# the model as the library consults it (the runtime, the estimates, the MoE front end, the bench)
from ._clock import FabricModel as FabricModel
from ._clock import advance as advance
from ._clock import choose_algo as choose_algo
from ._clock import model_call as model_call
from ._clock import model_exchange as model_exchange
from ._compute import ComputeJob as ComputeJob
from ._compute import kernel_end as kernel_end
from ._estimates import ModeledCost as ModeledCost
from ._estimates import cached_model as cached_model
from ._profile import Profiler as Profiler
from ._profile import call_cores as call_cores
from ._profile import profile_call as profile_call
from ._profile import profile_plan as profile_plan
from ._profile import profiles_cores as profiles_cores
from ._profile import write_chrome_trace as write_chrome_trace
from ._rankclock import RankClock as RankClock
from ._rankclock import from_bits as from_bits
from ._rankclock import to_bits as to_bits
from ._rankclock import us_from_bits as us_from_bits

__all__ = ["Replay", "ReplayError", "Tier", "Topology", "extrapolate", "extrapolate_dimension", "load_topology",
           "load_traces", "replay", "view", "wait_registered"]


class SharedMappings(Protocol):
    """What ``view`` and ``wait_registered`` use of a rank's registration unit
    (runtime.memory.RegistrationUnit)."""

    def view(self, address: int, shape, dtype) -> np.ndarray: ...
    def catch_up(self, operation: str = "wait_registered") -> None: ...


# This process's unit while it is in a job: the runtime activates it in init() and clears it in
# finalize(), as it sets and clears its own runtime.
_active: SharedMappings | None = None


def activate_mappings(unit: SharedMappings | None) -> None:
    """Make ``unit`` the one ``view`` reads through (None: this process left its job)."""
    global _active
    _active = unit


def _active_unit() -> SharedMappings:
    unit = _active
    if unit is None:
        raise NotInitialized("stratacl is not initialised in this process: call stratacl.init() first")
    return unit


def wait_registered() -> None:
    """Block until this rank has mapped every buffer its peers had registered when the call
    started: the background registration work of recent allocations is done. Not collective;
    after a barrier it covers everything allocated before that barrier. Operators never need
    it (they check readiness themselves); it keeps that background work out of a timing, as the
    gap between allocation and first use does in a real job."""
    _active_unit().catch_up()


def view(address: int, shape, dtype) -> np.ndarray:
    """A numpy view of any rank's registered buffer at its shared virtual address.

    Local and cheap when the range is already mapped here; otherwise it first catches up with
    the metadata the owner has published. Raises RegistrationError for an address that is not
    part of a registered range (never allocated, released, or in ``jit`` mode not yet used).
    In ``pool`` mode the owner's whole pre-registered region is registered, allocated or not.
    """
    return _active_unit().view(address, shape, dtype)
