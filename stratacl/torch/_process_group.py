"""The "stratacl" process group: torch.distributed's calls mapped onto one Communicator.

Every operation is the communicator's own on numpy views of the tensors (_tensors.py), so a
tensor in HBM is read by peers in place and any other one is staged by the communicator, as a
numpy array would be. What torch has and the communicator does not is composed from its
operations:

    torch                                   communicator
    allreduce, broadcast, barrier           all_reduce, broadcast, barrier
    all_gather_single (into_tensor)         all_gather
    reduce_scatter_single (_tensor)         reduce_scatter
    all_to_all_single, equal / uneven       all_to_all / all_to_all_v (counts from the splits)
    allgather / reduce_scatter / alltoall   the same, through one packed HBM buffer per call
      on lists of tensors
    gather(root)                            all_to_all_v: every rank sends its tensor to root only
    scatter(root)                           all_to_all_v: root sends tensor j to rank j only
    reduce(root)                            all_reduce; only root's tensor takes the result
    send, recv, isend, irecv, batches       send / recv / sendrecv (_ordering.py: how they are paired)
    ..._coalesced                           the operations one after the other, as one Work

Reductions the communicator's kernels do not have, on bfloat16 (numpy has none) and the
bitwise ops (BAND, BOR, BXOR on integers and bool), are folded by torch itself: an all_to_all
brings every rank's copy of this rank's chunk, torch's own elementwise op folds them in rank
order (``acc = x_0; acc = op(acc, x_1); ...``, AVG: the sum divided by N), and an all_gather
returns the chunks; reduce_scatter stops after the fold. The bits are torch's by construction,
and the traffic is the full mesh's (each rank reads a 1/N of every peer's buffer twice).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from . import _tensors
from ._ordering import Sequencer, TorchWork

# torch's reduce ops the communicator's kernels do, by name (collectives/_reduce.py)
_NATIVE_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod", dist.ReduceOp.MIN: "min",
               dist.ReduceOp.MAX: "max", dist.ReduceOp.AVG: "avg"}
_BITWISE = (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR)
# one fold step acc = acc op b, in place, by torch (bfloat16 and the bitwise ops)
_STEP = {dist.ReduceOp.SUM: torch.Tensor.add_, dist.ReduceOp.AVG: torch.Tensor.add_,
         dist.ReduceOp.PRODUCT: torch.Tensor.mul_,
         dist.ReduceOp.MIN: lambda a, b: torch.minimum(a, b, out=a),
         dist.ReduceOp.MAX: lambda a, b: torch.maximum(a, b, out=a),
         dist.ReduceOp.BAND: torch.Tensor.bitwise_and_, dist.ReduceOp.BOR: torch.Tensor.bitwise_or_,
         dist.ReduceOp.BXOR: torch.Tensor.bitwise_xor_}


# (op, dtype, operation) -> what _reduce_op decided: the same few recur on every call
_REDUCE_NAMES: dict[tuple, str | None] = {}


def _red_op(op) -> dist.ReduceOp.RedOpType:
    return op.op if hasattr(op, "op") else op


class ProcessGroupStrataCL(dist.ProcessGroup):
    """torch.distributed's process group over a StrataCL communicator (``comm``): group rank
    i is communicator rank i. Made by ``init_process_group("stratacl")`` and ``new_group``
    (stratacl/torch/_groups.py), not by users."""

    def __init__(self, comm, timeout=None):
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self._sequencer = Sequencer(f"{comm.members[comm.rank]}-{len(comm.members)}", comm)

    def getBackendName(self) -> str:
        return "stratacl"

    def shutdown(self) -> None:
        """``destroy_process_group``: the group's queued operations run, its thread ends."""
        self._sequencer.close()

    # torch keeps a group's name and description in its C++ backends, which a Python process
    # group has none of; DeviceMesh and the functional collectives look groups up by name
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return getattr(self, "_group_name", "")

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return getattr(self, "_group_desc", "")

    def __repr__(self) -> str:
        return f"ProcessGroupStrataCL(rank={self.comm.rank}, size={self.comm.size}, members={self.comm.members})"

    # --- plumbing ---------------------------------------------------------------------------
    def _run(self, operation: str, outputs: list, fn, opts=None) -> TorchWork:
        async_op = getattr(opts, "asyncOp", True) if opts is not None else True
        return self._sequencer.submit(TorchWork(operation, outputs, self._sequencer), fn, async_op)

    @staticmethod
    def _single(tensors: list, operation: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise ValueError(f"stratacl {operation}: expects one tensor per rank, got {len(tensors)}")
        _tensors.check(tensors[0], operation)
        return tensors[0]

    def _reduce_op(self, opts, dtype: torch.dtype, operation: str):
        """The communicator's op name, or None: torch folds (bfloat16, bitwise)."""
        op = opts.reduceOp
        key = (getattr(op, "op", op), dtype, operation)
        got = _REDUCE_NAMES.get(key, _REDUCE_NAMES)
        if got is _REDUCE_NAMES:
            got = _REDUCE_NAMES[key] = self._decide_reduce_op(*key)
        return got

    @staticmethod
    def _decide_reduce_op(op, dtype: torch.dtype, operation: str):
        if op in _BITWISE:
            if dtype.is_floating_point or dtype.is_complex:
                raise TypeError(f"stratacl {operation}: {op.name} needs an integer or bool tensor, got {dtype}")
            return None
        if op not in _NATIVE_OPS:
            raise ValueError(f"stratacl {operation}: reduce op {op.name} is not supported "
                             f"(SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR are)")
        if dtype.is_complex and op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            raise TypeError(f"stratacl {operation}: {op.name} is not defined on complex tensors")
        if op == dist.ReduceOp.AVG and not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError(f"stratacl {operation}: AVG needs a floating tensor, got {dtype}")
        return None if dtype is torch.bfloat16 else _NATIVE_OPS[op]

    def _fold(self, rows: torch.Tensor, op, out: torch.Tensor) -> None:
        """out = rows[0] op rows[1] op ... in rank order, by torch (bfloat16, bitwise)."""
        out.copy_(rows[0])
        step = _STEP[op]
        for r in range(1, rows.shape[0]):
            step(out, rows[r])
        if op == dist.ReduceOp.AVG:
            out.div_(rows.shape[0])

    def _reduce_scatter_folded(self, out: torch.Tensor, x: torch.Tensor, op) -> None:
        """out (k elements) = this rank's chunk of the fold of every rank's x (n * k), by torch."""
        n, k = self.comm.size, out.numel()
        rows = torch.empty((n, k), dtype=x.dtype)
        self.comm.all_to_all(_tensors.array(rows), _tensors.array(x))
        self._fold(rows, op, out.reshape(-1))

    def _all_reduce_folded(self, x: torch.Tensor, op) -> None:
        n, c = self.comm.size, x.numel()
        if c == 0:
            return
        k = -(-c // n)
        send = _tensors.empty(n * k, dtype=x.dtype)
        send[:c] = x.reshape(-1)
        send[c:].zero_()
        chunk = _tensors.empty(k, dtype=x.dtype)
        self._reduce_scatter_folded(chunk, send, op)
        whole = torch.empty(n * k, dtype=x.dtype)
        self.comm.all_gather(_tensors.array(whole), _tensors.array(chunk))
        x.view(-1).copy_(whole[:c])

    def _all_reduce_one(self, x: torch.Tensor, opts, operation: str = "allreduce", a: np.ndarray | None = None):
        name = self._reduce_op(opts, x.dtype, operation)
        if name is None:
            op = _red_op(opts.reduceOp)
            return lambda: self._all_reduce_folded(x, op)
        a = _tensors.array(x) if a is None else a
        return lambda: self.comm.all_reduce(a, name)

    # --- collectives ------------------------------------------------------------------------
    # The four operations a training step repeats (allreduce, all_gather_single,
    # reduce_scatter_single, all_to_all_single) take each tensor's kept view with its checks
    # (_tensors.checked): at N = 8 on two cores, a rank's Python per call costs about four
    # times as much of the call's wall time (docs/notebook/performance-2026-12-02.md, "torch.distributed").
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        if len(tensors) != 1:
            raise ValueError(f"stratacl allreduce: expects one tensor per rank, got {len(tensors)}")
        x = tensors[0]
        a = _tensors.checked(x, "allreduce")
        if not getattr(opts, "asyncOp", True):
            name = self._reduce_op(opts, x.dtype, "allreduce")
            work = None if name is None else self._sequencer.now("allreduce", tensors, self.comm.all_reduce, a, name)
            if work is not None:
                return work
        return self._run("allreduce", tensors, self._all_reduce_one(x, opts, "allreduce", a), opts)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        for t in tensors:
            _tensors.check(t, "allreduce_coalesced")
        calls = [self._all_reduce_one(t, opts, "allreduce_coalesced") for t in tensors]
        return self._run("allreduce_coalesced", tensors, lambda: [c() for c in calls], opts)

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        x = self._single(tensors, "broadcast")
        a, root = _tensors.array(x), opts.rootRank
        return self._run("broadcast", tensors, lambda: self.comm.broadcast(a, root), opts)

    def barrier(self, opts=None):
        return self._run("barrier", [], self.comm.barrier, opts if opts is not None else dist.BarrierOptions())

    def _all_gather_one(self, out: torch.Tensor, x: torch.Tensor, operation: str):
        o = _tensors.checked(out, operation, "output")
        a = _tensors.checked(x, operation, "input")
        if out.dtype != x.dtype:
            raise TypeError(f"stratacl {operation}: output dtype {out.dtype} differs from input dtype {x.dtype}")
        return lambda: self.comm.all_gather(o, a)

    def all_gather_single(self, output, input, opts=None):
        if not getattr(opts, "asyncOp", True):
            o = _tensors.checked(output, "all_gather_into_tensor", "output")
            a = _tensors.checked(input, "all_gather_into_tensor", "input")
            if output.dtype == input.dtype:
                work = self._sequencer.now("all_gather_into_tensor", [output], self.comm.all_gather, o, a)
                if work is not None:
                    return work
        fn = self._all_gather_one(output, input, "all_gather_into_tensor")
        return self._run("all_gather_into_tensor", [output], fn, opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        calls = [self._all_gather_one(o, i, "all_gather_into_tensor_coalesced") for o, i in zip(outputs, inputs)]
        return self._run("all_gather_into_tensor_coalesced", outputs, lambda: [c() for c in calls], opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _all_gather_list(self, outs: list, x: torch.Tensor, operation: str):
        n = self.comm.size
        if len(outs) != n:
            raise ValueError(f"stratacl {operation}: output list has {len(outs)} tensors, expected {n}")
        for o in outs:
            _tensors.check(o, operation, "output")
            if o.numel() != x.numel() or o.dtype != x.dtype:
                raise ValueError(f"stratacl {operation}: every output must have the input's {x.numel()} elements "
                                 f"of {x.dtype}, got {o.numel()} of {o.dtype}")
        a = _tensors.array(x)

        def run():
            whole = torch.empty((n, x.numel()), dtype=x.dtype)
            self.comm.all_gather(_tensors.array(whole), a)
            for j, o in enumerate(outs):
                o.view(-1).copy_(whole[j])
        return run

    def allgather(self, output_tensors, input_tensors, opts=None):
        x = self._single(input_tensors, "allgather")
        fn = self._all_gather_list(output_tensors[0], x, "allgather")
        return self._run("allgather", output_tensors, fn, opts)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """``output_lists[r][i]`` takes rank r's ``input_tensors[i]`` (as gloo: one list per
        rank, each as long as the inputs), through one packed all_gather."""
        op, n = "allgather_coalesced", self.comm.size
        if len(output_lists) != n:
            raise ValueError(f"stratacl {op}: expects {n} output lists (one per rank), got {len(output_lists)}")
        for t in input_tensors:
            _tensors.check(t, op, "input")
        dtype = input_tensors[0].dtype if input_tensors else torch.float32
        for outs in output_lists:
            if len(outs) != len(input_tensors):
                raise ValueError(f"stratacl {op}: every output list must have {len(input_tensors)} tensors "
                                 f"(one per input), got {len(outs)}")
            for o, x in zip(outs, input_tensors):
                _tensors.check(o, op, "output")
                if o.numel() != x.numel() or o.dtype != x.dtype or x.dtype != dtype:
                    raise ValueError(f"stratacl {op}: output {tuple(o.shape)} {o.dtype} does not match input "
                                     f"{tuple(x.shape)} {x.dtype} (inputs must share one dtype)")
        counts = [t.numel() for t in input_tensors]

        def run():
            total = sum(counts)
            packed = _tensors.empty(total, dtype=dtype)
            for piece, x in zip(packed.split(counts), input_tensors):
                piece.copy_(x.reshape(-1))
            whole = torch.empty((n, total), dtype=dtype)
            self.comm.all_gather(_tensors.array(whole), _tensors.array(packed))
            for r, outs in enumerate(output_lists):
                for piece, o in zip(whole[r].split(counts), outs):
                    o.view(-1).copy_(piece)
        return self._run(op, output_lists, run, opts)

    def _reduce_scatter_one(self, out: torch.Tensor, x: torch.Tensor, opts, operation: str):
        o = _tensors.checked(out, operation, "output")
        a = _tensors.checked(x, operation, "input")
        if out.dtype != x.dtype:
            raise TypeError(f"stratacl {operation}: output dtype {out.dtype} differs from input dtype {x.dtype}")
        name = self._reduce_op(opts, x.dtype, operation)
        if name is None:
            op = _red_op(opts.reduceOp)
            if x.numel() != self.comm.size * out.numel():
                raise ValueError(f"stratacl {operation}: input has {x.numel()} elements, expected "
                                 f"{self.comm.size} x {out.numel()}")
            return lambda: self._reduce_scatter_folded(out, x, op)
        return lambda: self.comm.reduce_scatter(o, a, name)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        if not getattr(opts, "asyncOp", True):
            o = _tensors.checked(output, "reduce_scatter_tensor", "output")
            a = _tensors.checked(input, "reduce_scatter_tensor", "input")
            if output.dtype == input.dtype:
                name = self._reduce_op(opts, input.dtype, "reduce_scatter_tensor")
                work = None if name is None else self._sequencer.now("reduce_scatter_tensor", [output],
                                                                    self.comm.reduce_scatter, o, a, name)
                if work is not None:
                    return work
        fn = self._reduce_scatter_one(output, input, opts, "reduce_scatter_tensor")
        return self._run("reduce_scatter_tensor", [output], fn, opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        calls = [self._reduce_scatter_one(o, i, opts, "reduce_scatter_tensor_coalesced")
                 for o, i in zip(outputs, inputs)]
        return self._run("reduce_scatter_tensor_coalesced", outputs, lambda: [c() for c in calls], opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        out = self._single(output_tensors, "reduce_scatter")
        parts = input_tensors[0]
        n = self.comm.size
        if len(parts) != n:
            raise ValueError(f"stratacl reduce_scatter: input list has {len(parts)} tensors, expected {n}")
        for p in parts:
            _tensors.check(p, "reduce_scatter", "input")
            if p.numel() != out.numel() or p.dtype != out.dtype:
                raise ValueError(f"stratacl reduce_scatter: every input must have the output's {out.numel()} "
                                 f"elements of {out.dtype}, got {p.numel()} of {p.dtype}")
        self._reduce_op(opts, out.dtype, "reduce_scatter")

        def run():
            packed = _tensors.empty((n, out.numel()), dtype=out.dtype)
            for j, p in enumerate(parts):
                packed[j].copy_(p.reshape(-1))
            self._reduce_scatter_one(out, packed, opts, "reduce_scatter")()
        return self._run("reduce_scatter", output_tensors, run, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        op = "all_to_all_single"
        o = _tensors.checked(output, op, "output")
        a = _tensors.checked(input, op, "input")
        if output.dtype != input.dtype:
            raise TypeError(f"stratacl {op}: output dtype {output.dtype} differs from input dtype {input.dtype}")
        if not output_split_sizes and not input_split_sizes:
            if not getattr(opts, "asyncOp", True):
                work = self._sequencer.now(op, [output], self.comm.all_to_all, o, a)
                if work is not None:
                    return work
            return self._run(op, [output], lambda: self.comm.all_to_all(o, a), opts)
        send = self._counts(input, a, input_split_sizes, op, "input")
        recv = self._counts(output, o, output_split_sizes, op, "output")
        return self._run(op, [output], lambda: self.comm.all_to_all_v(o, a, send, recv), opts)

    alltoall_base = all_to_all_single

    def _counts(self, t: torch.Tensor, a: np.ndarray, splits, operation: str, what: str) -> list[int]:
        """Element counts of ``a`` per rank from torch's splits along dim 0 (empty: equal)."""
        n = self.comm.size
        rows = t.shape[0] if t.dim() else 1
        if not splits:
            if rows % n:
                raise ValueError(f"stratacl {operation}: {what} dim 0 ({rows}) is not divisible by {n} ranks")
            splits = [rows // n] * n
        if len(splits) != n or sum(splits) != rows:
            raise ValueError(f"stratacl {operation}: {what} splits {list(splits)} must have {n} entries adding up "
                             f"to dim 0 ({rows})")
        per_row = a.size // rows if rows else 0
        return [int(s) * per_row for s in splits]

    def alltoall(self, output_tensors, input_tensors, opts=None):
        op = "alltoall"
        n = self.comm.size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"stratacl {op}: expects {n} input and {n} output tensors")
        for t in (*output_tensors, *input_tensors):
            _tensors.check(t, op)
        dtype = input_tensors[0].dtype
        if any(t.dtype != dtype for t in (*output_tensors, *input_tensors)):
            raise TypeError(f"stratacl {op}: every tensor must be {dtype}")

        def run():
            send_n = [t.numel() for t in input_tensors]
            recv_n = [t.numel() for t in output_tensors]
            packed = _tensors.empty(sum(send_n), dtype=dtype)
            for piece, t in zip(packed.split(send_n), input_tensors):
                piece.copy_(t.reshape(-1))
            got = torch.empty(sum(recv_n), dtype=dtype)
            a, o = _tensors.array(packed), _tensors.array(got)
            w = 2 if dtype.is_complex else 1          # numpy elements per tensor element
            self.comm.all_to_all_v(o, a, [c * w for c in send_n], [c * w for c in recv_n])
            for piece, t in zip(got.split(recv_n), output_tensors):
                t.view(-1).copy_(piece)
        return self._run(op, output_tensors, run, opts)

    # --- rooted operations, composed ----------------------------------------------------------
    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        x = self._single(tensors, "reduce")
        root = opts.rootRank
        name = self._reduce_op(opts, x.dtype, "reduce")
        if name is not None:        # the rooted reduce: only the root loads its peers' tensors
            a = _tensors.array(x)
            return self._run("reduce", tensors, lambda: self.comm.reduce(a if self.comm.rank == root else None, a,
                                                                         name, root), opts)
        # an op the library folds in torch (_all_reduce_folded): every rank reduces, the root keeps it
        target = x if self.comm.rank == root else torch.empty_like(x)
        fn = self._all_reduce_one(target, opts, "reduce")
        if target is x:
            return self._run("reduce", tensors, fn, opts)

        def run():
            target.copy_(x)
            fn()
        return self._run("reduce", tensors, run, opts)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        op, root = "gather", opts.rootRank
        x, a, outs = self._rooted(op, root, input_tensors, output_tensors, "output", "input")

        def run():
            whole = _tensors.empty((len(outs), x.numel()), dtype=x.dtype) if outs else None
            self.comm.gather(_tensors.array(whole) if outs else None, a, root)
            for j, o in enumerate(outs):
                o.view(-1).copy_(whole[j])
        return self._run(op, output_tensors, run, opts)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        op, root = "scatter", opts.rootRank
        out, o, parts = self._rooted(op, root, output_tensors, input_tensors, "input", "output")

        def run():
            packed = None
            if parts:
                packed = _tensors.empty((len(parts), out.numel()), dtype=out.dtype)
                for j, p in enumerate(parts):
                    packed[j].copy_(p.reshape(-1))
            self.comm.scatter(o, _tensors.array(packed) if parts else None, root)
        return self._run(op, output_tensors, run, opts)

    def _rooted(self, op: str, root: int, mine, roots, what: str, other: str):
        """A gather's or scatter's set-up: this rank's tensor and its array, and the root's list
        of ``what`` tensors (``roots[0]``; empty on other ranks)."""
        n, me = self.comm.size, self.comm.rank
        t = self._single(mine, op)
        listed = _root_list(roots[0], n, t, op, what, other) if me == root else []
        return t, _tensors.array(t), listed

    # --- point to point (batched: _ordering.py) -----------------------------------------------
    def _p2p(self, operation: str, tensors, peer: int, is_send: bool) -> TorchWork:
        x = self._single(tensors, operation)
        if not (0 <= peer < self.comm.size) or peer == self.comm.rank:
            raise ValueError(f"stratacl {operation}: peer {peer} is not another rank of this group "
                             f"(size {self.comm.size})")
        work = TorchWork(operation, tensors, self._sequencer, p2p=True)
        return self._sequencer.post_p2p(is_send, _tensors.array(x), peer, work, self._run_p2p)

    def send(self, tensors, dstRank: int, tag: int = 0):
        _untagged("send", tag)
        return self._p2p("send", tensors, dstRank, True)

    def recv(self, tensors, srcRank: int, tag: int = 0):
        _untagged("recv", tag)
        return self._p2p("recv", tensors, srcRank, False)

    def recv_anysource(self, tensors, tag: int = 0):
        raise ValueError("stratacl recv: a receive from any source is not supported; name the source rank")

    def _run_p2p(self, batch: list) -> None:
        """A batch of sends and receives in issue order: the i-th send and the i-th receive run
        together (sendrecv), the rest alone, in order."""
        sends = [b for b in batch if b[0]]
        recvs = [b for b in batch if not b[0]]
        for i in range(max(len(sends), len(recvs))):
            s = sends[i] if i < len(sends) else None
            r = recvs[i] if i < len(recvs) else None
            if s is not None and r is not None:
                fn = lambda s=s, r=r: self.comm.sendrecv(s[1], s[2], r[1], r[2])
                s[3]._run(fn)
                if s[3]._error is not None:
                    r[3]._fail(s[3]._error)
                else:
                    r[3]._run(lambda: None)
            elif s is not None:
                s[3]._run(lambda s=s: self.comm.send(s[1], s[2]))
            else:
                r[3]._run(lambda r=r: self.comm.recv(r[1], r[2]))


def _root_list(tensors: list, n: int, like, op: str, what: str, other: str) -> list:
    """The root's list of a gather (outputs) or scatter (inputs): ``n`` tensors, each checked,
    each with ``like``'s (the ``other`` side's) element count and dtype."""
    if len(tensors) != n:
        raise ValueError(f"stratacl {op}: root needs {n} {what} tensors, got {len(tensors)}")
    for t in tensors:
        _tensors.check(t, op, what)
        if t.numel() != like.numel() or t.dtype != like.dtype:
            raise ValueError(f"stratacl {op}: every {what} must have the {other}'s {like.numel()} elements of "
                             f"{like.dtype}, got {t.numel()} of {t.dtype}")
    return tensors


def _untagged(operation: str, tag: int) -> None:
    """Refuse a tag: sends and receives between two ranks match in the order they were posted
    (runtime/communicator/_p2p.py), never by tag as gloo's do, so a tagged exchange whose tags arrive out of
    order would pair the wrong messages without a word."""
    if tag != 0:
        raise ValueError(f"stratacl {operation}: tag {tag} is not supported: messages between two ranks are "
                         f"matched in the order they were posted, not by tag; leave tag at 0")
