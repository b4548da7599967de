"""The communicator: its operators and what each decides.

    _comm        Communicator: its components, barrier, point to point, split, subgroup
    _meshops     the operators the native mesh machine runs (all_gather, all_to_all, broadcast,
                 reduce_scatter, all_reduce, reduce), each its argument check; the one skeleton
    _pipelined   all_to_all_v, gather, scatter: the call pipeline's stages alone
    _mesh        the full-mesh call's record and Python's part in its protocol (MeshDriver)
    _prepared    prepared calls: a repeated call's checks made once and replayed in native code
    _p2p         send/recv/sendrecv, pull mode
    _ringsteps   the ring algorithms' steps (--algo ring)
    _program     a rank's program beside its collectives: modeled time, compute, probes
    _hostrows    rows between host memory and HBM (an embedding cache's misses)

The protocol's native half (agreement, the full-mesh state machine, one point-to-point call,
the replay of prepared calls) is in the runtime's native layer (stratacl/runtime/_native.h).
"""
from ._comm import Communicator as Communicator

__all__ = [
    "Communicator",
]
