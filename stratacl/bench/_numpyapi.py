"""The sweep's backend through StrataCL's numpy API (``comm.all_reduce`` and the rest):
stratacl-bench's own ranks (_command.py) run it, and so do the ranks of ``--api torch``
(_torchapi.py), beside the torch calls, to price the torch layer."""
from __future__ import annotations

import functools

import numpy as np


class StrataBackend:
    name = "stratacl"

    def __init__(self, comm, buffers: str, modeled: bool = False):
        import stratacl
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self._alloc = (lambda c, d: stratacl.empty((c,), d)) if buffers == "hbm" else (lambda c, d: np.empty(c, d))
        self._scalar = np.zeros(1, np.float64)
        self._count = np.zeros(1, np.int64)
        # comm.clock(): this rank's modeled time in seconds (None when the clock is off);
        # a runtime without it leaves the model columns null
        self.clock = getattr(comm, "clock", None) if modeled else None
        if stratacl.config.clock == "throttled":
            self.late = lambda: stratacl.stats()["clock"]["late_calls"]

    def core_figures(self, op: str, nbytes: int, root: int, itemsize: int) -> dict:
        """core_gap and core_busy_us of one call as the ranks' model times it (the same
        ub._profile.call_cores that estimate rows use)."""
        from ..runtime import pipeline
        from ..ub import call_cores
        pipe = pipeline(self.comm)
        return call_cores(pipe.model, op, pipe.algo_for(op, nbytes, itemsize), self.comm.members, nbytes, root,
                          itemsize)

    def alloc(self, count, dtype):
        return self._alloc(count, dtype)

    def call(self, op, out, x, redop, root):
        c, n = self.comm, self.size
        if op == "all_gather":
            return functools.partial(c.all_gather, out, x)
        if op == "all_reduce":
            return functools.partial(c.all_reduce, x, op=redop)
        if op == "reduce_scatter":
            return functools.partial(c.reduce_scatter, out, x, op=redop)
        if op == "all_to_all":
            return functools.partial(c.all_to_all, out, x)
        if op == "broadcast":
            return functools.partial(c.broadcast, x, root=root)
        if op == "sendrecv":
            if n == 1:
                return functools.partial(np.copyto, out, x)
            return functools.partial(c.sendrecv, x, (self.rank + 1) % n, out, (self.rank - 1) % n)
        if op == "barrier":
            return c.barrier
        raise ValueError(f"unknown operator {op!r}")

    def barrier(self):
        self.comm.barrier()

    def settle(self):
        """Before timing a size: every rank's new buffers registered everywhere (the gap
        between allocation and first use that roa relies on, section 5 of the paper)."""
        import stratacl
        self.comm.barrier()
        stratacl.ub.wait_registered()
        self.comm.barrier()

    def mean(self, value):
        self._scalar[0] = value
        self.comm.all_reduce(self._scalar, op="sum")
        return float(self._scalar[0]) / self.size

    def total(self, value):
        self._count[0] = value
        self.comm.all_reduce(self._count, op="sum")
        return int(self._count[0])

    def maximum(self, value):
        self._scalar[0] = value
        self.comm.all_reduce(self._scalar, op="max")
        return float(self._scalar[0])
