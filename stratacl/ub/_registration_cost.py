"""What registration costs in modeled time: the four steps of a UB registration, the RDMA
registration it is compared with, and registration-on-allocation's background path.

    one UB registration of a buffer of b bytes between an owner and a peer (paper Fig. 4b):
        export      owner: a physical-memory handle for the buffer          export_us
        import      peer:  the handle                                       import_us
        reserve VA  peer:  a local virtual address (here: the shadow one)   reserve_va_us
        map         peer:  the VA onto the owner's HBM, page table updated  map_us + map_us_per_gib x b / GiB

    jit (in the operator, per peer read):   all four steps, one peer after the other (Fig. 5a:
                                            mappings take the page-table lock, so a rank's
                                            registrations of N-1 peers are serialized)
    roa (in the background, per allocation):
        owner   export ----> metadata broadcast (direct: stores into the peers' host DRAM;
                             relay: through a relay; paper section 7)
        peer                    import, reserve VA, map ... for each owner whose metadata it
                                holds, one after the other (the same lock)
        -> the buffer is mapped everywhere export + broadcast + k x (import + reserve + map)
           after its allocation, k = the owners announcing at once; the operator's first use
           waits only if it comes earlier (paper section 5: it does not, the gap is larger)

    RDMA registration (Fig. 4a's baseline): rdma_us + rdma_us_per_gib x b / GiB (pin the pages,
    map them for the NIC, create the memory region, exchange its key).

The parameters are the topology's ``registration`` section (``ub/_topology.py``, each with the
figure it comes from). Everything here is a pure function of a topology's ``Contention``.
"""
from __future__ import annotations

import numpy as np

from ._topology import Contention

GIB = float(1 << 30)
STEPS = ("export", "import", "reserve_va", "map")
PATHS = ("direct", "relay")


def ub_steps_us(c: Contention, nbytes) -> dict[str, np.ndarray]:
    """Each step of one UB registration of ``nbytes`` (scalar or array), in us."""
    b = np.asarray(nbytes, dtype=np.float64)
    one = np.ones_like(b)
    return {"export": c.export_us * one, "import": c.import_us * one, "reserve_va": c.reserve_va_us * one,
            "map": c.map_us + c.map_us_per_gib * b / GIB}


def ub_registration_us(c: Contention, nbytes) -> np.ndarray:
    """One UB registration of ``nbytes`` between two ranks: its four steps one after the other."""
    return c.registration_fixed_us + c.map_us_per_gib * np.asarray(nbytes, dtype=np.float64) / GIB


def rdma_registration_us(c: Contention, nbytes) -> np.ndarray | None:
    """One RDMA registration of ``nbytes``; None when the topology has no RDMA model."""
    if c.rdma_us is None:
        return None
    return c.rdma_us + c.rdma_us_per_gib * np.asarray(nbytes, dtype=np.float64) / GIB


def metadata_us(c: Contention, path: str) -> float:
    """One registration's metadata reaching every peer over ``path`` (direct | relay)."""
    if path not in PATHS:
        raise ValueError(f"metadata path must be one of {', '.join(PATHS)}, got {path!r}")
    return c.metadata_direct_us if path == "direct" else c.metadata_relay_us


def background_us(c: Contention, nbytes, path: str = "direct", owners: int = 1) -> float:
    """Registration-on-allocation: from an allocation of ``nbytes`` to its mapping on every
    peer, when ``owners`` ranks announce an allocation of that size at once (each peer maps
    them one after the other). Not on any critical path unless an operator touches the buffer
    sooner."""
    if owners < 1:
        raise ValueError(f"owners must be >= 1, got {owners}")
    peer = ub_registration_us(c, nbytes) - c.export_us       # import, reserve VA, map
    return float(c.export_us + metadata_us(c, path) + owners * peer)
