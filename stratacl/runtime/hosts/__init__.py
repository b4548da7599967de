"""Jobs across hosts, and jobs another launcher started.

    _hosts         HostMap: which host each rank is on; a rank's end of a one-sided call with a far peer
    _carrier       one host's end of the cross-host path: its HBM in one MPI window, the
                   other hosts' bytes in mirrors, words and failures carried at barriers; run in
                   the host's launcher, in its first rank, or as a process of its own
    _carrierwords  where the words a carrier carries sit in the host's control segment
    _reads         what a carrier reads for a barrier of a call: the far slices of its plans
    _requests      one-sided calls with a far peer: this host's ranks' requests, other hosts' updates
    _lost          a carrier failed or another host was lost: the job ends, named, on every host
    _foreign       joining a job torchrun or mpirun started (``foreign``: detect, join, joined)
"""
from . import _foreign as foreign
from ._carrier import CarrierThread as CarrierThread
from ._carrier import MPIRUN_FLAGS as MPIRUN_FLAGS
from ._carrier import hosts_of as hosts_of
from ._carrier import mpirun_env as mpirun_env
from ._hosts import HostMap as HostMap

__all__ = [
    "MPIRUN_FLAGS", "CarrierThread", "HostMap", "foreign", "hosts_of", "mpirun_env",
]
