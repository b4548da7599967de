"""One rank of a peer library running ``stratacl-bench``'s sweep: mpi4py (Open MPI) or gloo (torch).

    python -m stratacl.bench._peer_rank mpi  SPEC_JSON OUT_JSON [--timeout S]     (under mpirun)
    python -m stratacl.bench._peer_rank gloo SPEC_JSON OUT_JSON --rank R --world N --init tcp://127.0.0.1:P

The driver (``_peers.run_peer``) starts these processes; each builds a ``Backend`` for its library
and runs ``_cases.sweep``, the same function, sizes, data and check as StrataCL's own ranks. Rank 0
writes ``{"rows": [...]}`` to OUT_JSON, or ``{"unsupported": why}`` when the library cannot run the
sweep (a dtype or reduction it lacks); every rank then exits 0. Any other failure is a traceback
on stderr and a non-zero exit, which the driver turns into a short message. Progress goes to stderr.

Each rank dies with its parent (PR_SET_PDEATHSIG): mpirun for mpi, the driver for gloo.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import functools
import json
import os
import signal
import sys
import traceback

import numpy as np

from . import _cases

PR_SET_PDEATHSIG = 1


class Unsupported(Exception):
    """The peer library cannot run this sweep (same answer on every rank, decided before any data moves)."""


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent goes; no-op where prctl is missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent was already gone before prctl took effect
        os._exit(1)


class MpiBackend:
    """mpi4py buffer calls over MPI_COMM_WORLD; the transport is whatever mpirun selected (vader here)."""

    name = "mpi"

    def __init__(self):
        import mpi4py
        # the sweep is single-threaded, and MPI_THREAD_MULTIPLE (mpi4py's default) costs Open MPI locks
        mpi4py.rc.thread_level = "single"
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._type = None
        self._op = None

    def check(self, spec: _cases.Spec) -> None:
        MPI, dtype = self.MPI, np.dtype(spec.dtype)
        try:
            native = MPI.Datatype.fromcode(dtype.char)
            if native.Get_size() != dtype.itemsize:   # a name this MPI leaves null (MPIX_C_FLOAT16 in Open MPI 4)
                native = None
        except (MPI.Exception, KeyError, ValueError):
            native = None
        if spec.op in ("all_reduce", "reduce_scatter"):
            if native is None:
                raise Unsupported(f"{MPI.Get_library_version().split(',')[0].strip()} has no datatype "
                                  f"for {dtype} to reduce with {spec.redop}")
            if dtype.kind == "c" and spec.redop in ("min", "max"):
                raise Unsupported(f"MPI has no {spec.redop} for complex {dtype}")
            self._type = native
            if dtype.kind == "b":
                # numpy's add/max on bool is OR and multiply/min is AND; MPI_SUM on MPI_C_BOOL is undefined
                self._op = {"sum": MPI.LOR, "max": MPI.LOR, "prod": MPI.LAND, "min": MPI.LAND}[spec.redop]
            else:
                self._op = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}[spec.redop]
        elif native is not None:
            self._type = native
        else:
            # moving data needs no arithmetic: an element is just itemsize bytes (float16, bfloat16, ...)
            self._type = MPI.BYTE.Create_contiguous(dtype.itemsize).Commit()

    def alloc(self, count, dtype):
        return np.empty(count, dtype)

    def call(self, op, out, x, redop, root):
        c, t, n = self.comm, self._type, self.size
        if op == "all_gather":
            return functools.partial(c.Allgather, [x, t], [out, t])
        if op == "all_reduce":
            return functools.partial(c.Allreduce, self.MPI.IN_PLACE, [x, t], self._op)
        if op == "reduce_scatter":
            return functools.partial(c.Reduce_scatter_block, [x, t], [out, t], self._op)
        if op == "all_to_all":
            return functools.partial(c.Alltoall, [x, t], [out, t])
        if op == "broadcast":
            return functools.partial(c.Bcast, [x, t], root)
        if op == "sendrecv":
            return functools.partial(c.Sendrecv, [x, t], (self.rank + 1) % n, 0, [out, t], (self.rank - 1) % n, 0)
        if op == "barrier":
            return c.Barrier
        raise ValueError(f"unknown operator {op!r}")

    def barrier(self):
        self.comm.Barrier()

    def mean(self, value):
        return self.comm.allreduce(float(value)) / self.size

    def total(self, value):
        return int(self.comm.allreduce(int(value)))

    def close(self):
        pass

    def abort(self):
        self.comm.Abort(1)


class TorchReductions:
    """The sweep's bookkeeping reductions over torch.distributed (the gloo peer's and the
    ``--api torch`` ranks'): one-element float64 / int64 tensors ``_f64``, ``_i64`` reduced
    through ``dist`` over ``size`` ranks."""

    def mean(self, value):
        self._f64[0] = value
        self.dist.all_reduce(self._f64)
        return float(self._f64[0]) / self.size

    def total(self, value):
        self._i64[0] = value
        self.dist.all_reduce(self._i64)
        return int(self._i64[0])

    def maximum(self, value):
        self._f64[0] = value
        self.dist.all_reduce(self._f64, op=self.dist.ReduceOp.MAX)
        return float(self._f64[0])


class GlooBackend(TorchReductions):
    """torch.distributed with the gloo backend: TCP over loopback (gloo has no shared-memory transport).

    Buffers are numpy arrays; each call wraps them with ``torch.from_numpy`` (no copy, ~1 us).
    Where a library has several ways to do an operator, ``check`` takes the first that works on a
    tiny buffer, in order of preference, so a torch without the single-tensor forms still runs.
    """

    name = "gloo"

    def __init__(self, rank: int, world: int, init: str, timeout: float):
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        if not dist.is_available() or not dist.is_gloo_available():
            raise RuntimeError(f"torch {torch.__version__} was built without torch.distributed gloo")
        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self._redop = None
        self._impl = {}
        self._f64 = torch.zeros(1, dtype=torch.float64)
        self._i64 = torch.zeros(1, dtype=torch.int64)

    def _t(self, a):
        return self.torch.from_numpy(a)

    # each takes (out tensor, x tensor) and runs one operator one way
    def _ag_single(self, o, x):
        self.dist.all_gather_single(o, x)

    def _ag_into_tensor(self, o, x):
        self.dist.all_gather_into_tensor(o, x)

    def _ag_list(self, o, x):
        self.dist.all_gather(list(o.chunk(self.size)), x)

    def _rs_single(self, o, x):
        self.dist.reduce_scatter_single(o, x, op=self._redop)

    def _rs_tensor(self, o, x):
        self.dist.reduce_scatter_tensor(o, x, op=self._redop)

    def _rs_list(self, o, x):
        self.dist.reduce_scatter(o, list(x.chunk(self.size)), op=self._redop)

    def _rs_via_all_reduce(self, o, x):
        # twice the traffic of a real reduce-scatter: only when gloo has none
        s = x.clone()
        self.dist.all_reduce(s, op=self._redop)
        o.copy_(s[self.rank * o.numel():(self.rank + 1) * o.numel()])

    CANDIDATES = {
        "all_gather": [("all_gather_single", "_ag_single"), ("all_gather_into_tensor", "_ag_into_tensor"),
                       ("all_gather", "_ag_list")],
        "reduce_scatter": [("reduce_scatter_single", "_rs_single"), ("reduce_scatter_tensor", "_rs_tensor"),
                           ("reduce_scatter", "_rs_list"), ("all_reduce", "_rs_via_all_reduce")],
    }

    def check(self, spec: _cases.Spec) -> None:
        dist, dtype = self.dist, np.dtype(spec.dtype)
        self._redop = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
                       "max": dist.ReduceOp.MAX}[spec.redop]
        try:
            self._t(np.zeros(1, dtype))
        except TypeError as e:
            raise Unsupported(f"torch cannot hold {dtype}: {e}") from None
        sh = _cases.shape(spec.op, self.size, self.size * dtype.itemsize, dtype.itemsize)
        x = self.alloc(sh.n_in, dtype)
        x[...] = _cases.input_data(spec.op, self.rank, self.size, sh, dtype, spec.redop)
        out = self.alloc(sh.n_out, dtype) if sh.n_out else None
        root = spec.root if spec.op == "broadcast" else -1
        errors = []
        for api, method in self.CANDIDATES.get(spec.op, [(spec.op, None)]):
            if method is not None:
                if not hasattr(dist, api):
                    continue
                self._impl[spec.op] = getattr(self, method)
            try:
                self.call(spec.op, out, x, spec.redop, root)()
            except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
                errors.append(f"{api}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
                continue
            if self.rank == 0 and method is not None:
                print(f"stratacl-bench: gloo {spec.op} runs as torch.distributed.{api}", file=sys.stderr, flush=True)
            return
        raise Unsupported(f"gloo {spec.op} on {dtype}: " + "; ".join(errors))

    def alloc(self, count, dtype):
        return np.empty(count, dtype)

    def call(self, op, out, x, redop, root):
        dist, n = self.dist, self.size
        tx = self._t(x)
        if op == "all_reduce":
            return functools.partial(dist.all_reduce, tx, op=self._redop)
        if op in ("all_gather", "reduce_scatter"):
            return functools.partial(self._impl[op], self._t(out), tx)
        if op == "all_to_all":
            return functools.partial(dist.all_to_all_single, self._t(out), tx)
        if op == "broadcast":
            return functools.partial(dist.broadcast, tx, src=root)
        if op == "sendrecv":
            if n == 1:
                return functools.partial(np.copyto, out, x)
            return functools.partial(self._sendrecv, tx, self._t(out))
        if op == "barrier":
            return dist.barrier
        raise ValueError(f"unknown operator {op!r}")

    def _sendrecv(self, tx, tout):
        dist, n = self.dist, self.size
        ops = [dist.P2POp(dist.isend, tx, (self.rank + 1) % n), dist.P2POp(dist.irecv, tout, (self.rank - 1) % n)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    def barrier(self):
        self.dist.barrier()

    def close(self):
        self.dist.destroy_process_group()

    def abort(self):
        os._exit(1)


def _write(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stratacl.bench._peer_rank")
    p.add_argument("peer", choices=("mpi", "gloo"))
    p.add_argument("spec", help="the sweep, as JSON of stratacl.bench._cases.Spec")
    p.add_argument("out", help="rank 0 writes the rows here as JSON")
    p.add_argument("--timeout", type=float, default=900.0, help="gloo's collective timeout, seconds")
    p.add_argument("--rank", type=int, default=0, help="gloo only")
    p.add_argument("--world", type=int, default=1, help="gloo only")
    p.add_argument("--init", default=None, help="gloo only: init_method, tcp://127.0.0.1:PORT")
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    die_with_parent()
    spec = _cases.Spec(**json.loads(a.spec))
    backend = MpiBackend() if a.peer == "mpi" else GlooBackend(a.rank, a.world, a.init, a.timeout)
    tag = f"[{a.peer} rank {backend.rank}/{backend.size}]"
    try:
        try:
            backend.check(spec)
        except Unsupported as e:
            if backend.rank == 0:
                _write(a.out, {"unsupported": str(e)})
            backend.close()
            return 0

        def progress(row):
            print(f"stratacl-bench: {a.peer} {row['op']} {row['size']} B done ({row['time_us']:.1f} us)",
                  file=sys.stderr, flush=True)

        rows = _cases.sweep(backend, spec, progress=progress)
        if backend.rank == 0:
            _write(a.out, {"rows": rows})
        backend.close()
        return 0
    except BaseException:
        # one rank's failure must end the job, not leave the others blocked in a collective
        sys.stderr.write("".join(f"{tag} {ln}\n" for ln in traceback.format_exc().splitlines()))
        sys.stderr.flush()
        backend.abort()
        return 1


if __name__ == "__main__":
    sys.exit(main())
