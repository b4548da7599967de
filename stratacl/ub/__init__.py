"""The fabric: topology and tiers, the registration unit, shadow mappings, trace replay."""
from __future__ import annotations

import numpy as np

from .._errors import ReplayError as ReplayError
from ._registration import active as _active_unit
from ._tracereplay import Replay as Replay
from ._dimension import extrapolate_dimension as extrapolate_dimension
from ._extrapolate import extrapolate as extrapolate
from ._tracereplay import load as load_traces
from ._tracereplay import replay as replay
from ._topology import Tier as Tier
from ._topology import Topology as Topology
from ._topology import load as load_topology

__all__ = ["Replay", "ReplayError", "Tier", "Topology", "extrapolate", "extrapolate_dimension", "load_topology",
           "load_traces", "replay", "view", "wait_registered"]


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
