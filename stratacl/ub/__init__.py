"""The fabric: topology and tiers, the registration unit, shadow mappings."""
from __future__ import annotations

import numpy as np

from .._errors import RegistrationError
from ._topology import Tier as Tier
from ._topology import Topology as Topology
from ._topology import load as load_topology

__all__ = ["Tier", "Topology", "load_topology", "view", "wait_registered"]


def wait_registered() -> None:
    """Block until this rank has mapped every buffer its peers had registered when the call
    started: the background registration work of recent allocations is done. Not collective;
    after a barrier it covers everything allocated before that barrier. Operators never need
    it (they check readiness themselves); it keeps that background work out of a timing, as the
    gap between allocation and first use does in a real job."""
    from ..runtime._world import runtime
    runtime().reg.catch_up()


def view(address: int, shape, dtype) -> np.ndarray:
    """A numpy view of any rank's registered buffer at its shared virtual address.

    Local and cheap when the range is already mapped here; otherwise it first catches up with
    the metadata the owner has published. Raises RegistrationError for an address that is not
    part of a registered range (never allocated, released, or in ``jit`` mode not yet used).
    In ``pool`` mode the owner's whole pre-registered region is registered, allocated or not.
    """
    from ..runtime._world import runtime
    rt = runtime()
    dtype = np.dtype(dtype)
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    owner = rt.window.owner(address)
    if owner < 0 or rt.window.owner(address + max(nbytes, 1) - 1) != owner:
        raise RegistrationError(f"ub.view: {address:#x}+{nbytes} is not inside one rank's slice of the "
                                f"shared address window")
    if owner == rt.rank and rt.reg.mode != "pool":
        ok = rt.own_segment(address, nbytes) is not None
    else:
        ok = rt.reg.lookup(owner, address, nbytes)
    if not ok:
        raise RegistrationError(
            f"ub.view: rank {rt.rank} has no registration of rank {owner}'s range {address:#x}+{nbytes} "
            f"(never allocated, already released, or in jit mode not yet used by an operator)")
    return rt.window.view(address, nbytes).view(dtype).reshape(shape)
