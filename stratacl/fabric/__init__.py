"""Write your own fabric-native operator: a slice map run through the library's backend.

    import stratacl
    from stratacl import fabric

    smap = fabric.SliceMap()
    for p in range(comm.size):                  # a one-shot all_reduce: reduce every peer's x
        smap.reduce(p, x.nbytes)
    fabric.run(comm, smap, src=x, dst=out)      # collective; async_op=, path= as any operator

See stratacl/fabric/_usermap.py for the data path and docs/one-sided.md for the examples.
"""
from ._usermap import ACTIONS as ACTIONS
from ._usermap import SliceMap as SliceMap
from ._usermap import run as run

__all__ = ["ACTIONS", "SliceMap", "run"]
