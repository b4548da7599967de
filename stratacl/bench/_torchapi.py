"""``stratacl-bench --api torch``: the sweep through ``torch.distributed`` with backend "stratacl".

    stratacl ranks (stratacl.spawn)
      rank_main: init_process_group("stratacl")  (env:// from the job, as under stratacl-launch)
        TorchBackend   dist.all_reduce / all_gather_single / reduce_scatter_single /
                       all_to_all_single / broadcast / batch_isend_irecv / barrier on
                       tensors from stratacl.torch.empty (--buffers hbm) or torch.empty (plain)
        StrataBackend  the same sweep through the numpy API (comm.all_reduce, ...), on the same
                       communicator, in the same processes
      _cases.sweep_alternating: per size, both timed in alternating order, ``spec.rounds`` times
      -> rank 0: the torch rows (the table's) and the numpy rows (the torch layer's cost)

What the torch layer costs is then measured where nothing else differs: same ranks, same
communicator, same moment of the host. ``--vs gloo`` runs gloo through the same torch calls
(bench/_peer_rank.py's GlooBackend), after.

The data is filled and checked by ``_cases`` as numpy arrays: ``alloc`` makes the tensor and
returns its numpy view (``Tensor.numpy()``, whose base is a tensor on the same storage), and
``call`` binds the tensors behind the arrays, once per sweep point, as a torch program keeps
its tensors from step to step.
"""
from __future__ import annotations

import functools

import numpy as np

from . import _cases
from ._peer_rank import TorchReductions

# the bench's operators as torch.distributed calls, in order of preference (the first that
# torch has): torch 2.13 names the single-tensor forms all_gather_single / reduce_scatter_single
# and keeps all_gather_into_tensor / reduce_scatter_tensor as deprecated aliases of them
TORCH_CALLS = {"all_reduce": ("all_reduce",), "all_gather": ("all_gather_single", "all_gather_into_tensor"),
               "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor"),
               "all_to_all": ("all_to_all_single",), "broadcast": ("broadcast",),
               "sendrecv": ("batch_isend_irecv",), "barrier": ("barrier",)}


def torch_call(op: str) -> str:
    """The torch.distributed function ``op`` runs as (see TORCH_CALLS)."""
    import torch.distributed as dist
    return next((f for f in TORCH_CALLS[op] if hasattr(dist, f)), TORCH_CALLS[op][-1])


class TorchBackend(TorchReductions):
    """The bench's Backend through torch.distributed on the world group of backend "stratacl"."""

    name = "torch"

    def __init__(self, comm, buffers: str):
        import torch
        import torch.distributed as dist

        import stratacl.torch as st
        torch.set_num_threads(1)       # ranks outnumber cores, as the gloo peer's
        if not dist.is_initialized():
            dist.init_process_group("stratacl")
        self.torch, self.dist, self.comm = torch, dist, comm
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self._empty = st.empty if buffers == "hbm" else (lambda c, dtype: torch.empty(c, dtype=dtype))
        self._redop = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
                       "max": dist.ReduceOp.MAX, "none": None}
        self._f64 = torch.zeros(1, dtype=torch.float64)
        self._i64 = torch.zeros(1, dtype=torch.int64)

    def alloc(self, count: int, dtype: np.dtype) -> np.ndarray:
        tdtype = self.torch.from_numpy(np.empty(0, dtype)).dtype
        return self._empty(count, dtype=tdtype).numpy()

    def _t(self, a: np.ndarray):
        """The tensor behind an array of ``alloc``."""
        b = a.base
        if isinstance(b, self.torch.Tensor) and b.data_ptr() == a.ctypes.data and b.numel() == a.size:
            return b
        return self.torch.from_numpy(a)

    def call(self, op, out, x, redop, root):
        dist, n = self.dist, self.size
        tx = self._t(x)
        f = getattr(dist, torch_call(op))
        if op == "all_reduce":
            return functools.partial(f, tx, op=self._redop[redop])
        if op == "all_gather":
            return functools.partial(f, self._t(out), tx)
        if op == "reduce_scatter":
            return functools.partial(f, self._t(out), tx, op=self._redop[redop])
        if op == "all_to_all":
            return functools.partial(f, self._t(out), tx)
        if op == "broadcast":
            return functools.partial(f, tx, src=root)
        if op == "sendrecv":
            if n == 1:
                return functools.partial(np.copyto, out, x)
            ops = [dist.P2POp(dist.isend, tx, (self.rank + 1) % n),
                   dist.P2POp(dist.irecv, self._t(out), (self.rank - 1) % n)]
            return functools.partial(self._batch, ops)
        if op == "barrier":
            return dist.barrier
        raise ValueError(f"unknown operator {op!r}")

    def _batch(self, ops):
        for w in self.dist.batch_isend_irecv(ops):
            w.wait()

    def barrier(self):
        self.comm.barrier()

    def settle(self):
        import stratacl
        self.comm.barrier()
        stratacl.ub.wait_registered()
        self.comm.barrier()



def rank_main(comm, spec, buffers: str, with_numpy: bool = True):
    """Inside every rank: the sweep through torch (and through the numpy API, alternating);
    rank 0 returns ``(torch rows, numpy rows or None)``."""
    import sys

    import torch.distributed as dist

    from ._numpyapi import StrataBackend

    def progress(row):
        print(f"stratacl-bench: {row['op']} {row['size']} B done ({row['time_us']:.1f} us)", file=sys.stderr,
              flush=True)

    backends = [TorchBackend(comm, buffers)]
    if with_numpy:
        backends.append(StrataBackend(comm, buffers))
        backends[-1].name = "numpy"
    rows = _cases.sweep_alternating(backends, spec, progress=progress)
    dist.destroy_process_group()
    if comm.rank != 0:
        return None
    return rows[0], (rows[1] if with_numpy else None)

