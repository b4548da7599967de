"""Operators written on the call pipeline alone (runtime/pipeline/_call.py), with no native mesh
machine: all_to_all_v (variable splits), gather and scatter (to and from a root). A part of the
Communicator (runtime/communicator/_comm.py).

Each is the pipeline's stages in order: local checks (a rejecting rank's error travels to its
peers), enter and agree, peers' sources ready, one slice-map phase per step
(collectives/_slices.py), departure, a staged output copied out, the modeled clock ticked from
the call's traffic matrix.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..._errors import CollectiveMismatch
from ...collectives import dtype_code, schedules, slices
from .. import _native
from ..pipeline import aliased, as_flat, collective, dtype_of, expect


def _counts(counts, n: int, limit: int, operation: str, what: str, buffer: str) -> np.ndarray:
    """all_to_all_v's ``counts`` as int64 [n], checked: integers (a float is not silently cut,
    nor a string parsed), none negative, none and their sum no more than ``limit``, the
    elements of the ``buffer`` (each count is bounded before the sum, which so cannot wrap)."""
    try:
        a = np.asarray(counts)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{operation}: {what} must be a sequence of {n} integers ({e})") from None
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{operation}: {what} must be a sequence of {n} integers, got {a.dtype} values"
                        + (" (too large for 64 bits?)" if a.dtype == object else ""))
    a = a.reshape(-1)
    expect(a.size == n, lambda: f"{operation}: {what} needs {n} entries, got {a.size}")
    expect(not (a < 0).any(), lambda: f"{operation}: {what} must not be negative, got {a.tolist()}")
    expect(not (a > limit).any(), lambda: f"{operation}: {what} has a count of {int(a.max())} elements but the "
           f"{buffer} has {limit}")
    a = a.astype(np.int64)
    expect(int(a.sum()) <= limit, lambda: f"{operation}: {what} add up to {int(a.sum())} elements but the "
           f"{buffer} has {limit}")
    return a


class PipelinedOperators:
    """The Communicator's ``all_to_all_v``, ``gather`` and ``scatter``."""

    @collective
    def all_to_all_v(self, out: np.ndarray, x: np.ndarray, send_counts: Sequence[int],
                     recv_counts: Sequence[int]) -> None:
        """Variable splits, packed in rank order: ``send_counts[j]`` elements of ``x`` go to rank j,
        ``recv_counts[j]`` elements from rank j land in ``out``. Collective. ``out`` may overlap
        ``x`` (in place): ``x`` is then copied first.

        Under a modeled clock its transfers are timed from the counts (every member pulls
        ``recv_counts`` from each peer), as MoE dispatch is."""
        op = "all_to_all_v"
        n, pipe = self.size, self._pipe
        error = inp = target = None
        code = 0
        sc = rc = np.zeros(n, dtype=np.int64)
        try:
            code = dtype_code(dtype_of(x, op, "input"), op)
            o = as_flat(out, op, "output", writable=True)
            sc = _counts(send_counts, n, x.size, op, "send_counts", "input")
            rc = _counts(recv_counts, n, o.size, op, "recv_counts", "output")
            expect(o.dtype == x.dtype, lambda: f"{op}: output dtype {o.dtype} differs from input dtype {x.dtype}",
                   TypeError)
            self._buffers.check_mapped(o, op, "output")
            pipe.check_path(op)
            inp = pipe.input(x, op, aliased(o, x))
            target = pipe.output(o)
        except Exception as e:
            error = e
        parity = pipe.enter(op, code, inp, np.concatenate([sc, rc]), error)
        ext = pipe.extensions(parity)
        send, recv = ext[:, :n], ext[:, n:2 * n]
        bad = np.argwhere(recv != send.T)
        if bad.size:
            i, j = (int(v) for v in bad[0])
            raise CollectiveMismatch(
                f"{op}: rank {self.members[i]} expects {int(recv[i, j])} elements from rank {self.members[j]}, "
                f"which sends it {int(send[j, i])}; no data was moved")
        me, item = self.rank, x.itemsize
        pipe.sources_ready(op, parity, inp.addr, need=(recv[me] > 0).astype(np.int64))
        out_addr = _native.data_address(target)
        for plan in pipe.phases(("all_to_all_v", item, send.tobytes(), recv[me].tobytes()),
                                lambda: slices.all_to_all_v(me, n, send, recv, item)):
            pipe.run(op, plan, out_addr)
        pipe.finish(op)
        pipe.output_done(out, target, int(recv[me].sum()))
        pipe.tick(op, parity, [(recv * item, schedules.LOAD)])

    @collective
    def gather(self, out: np.ndarray | None, x: np.ndarray, root: int = 0) -> None:
        """At ``root``, ``out`` (size * x.size elements) receives every rank's ``x``, rank-major;
        on the other ranks ``out`` is not used (None will do). Collective: one full-mesh phase
        in which the root pulls every member's ``x``, then the departure barrier. ``x`` may be
        the root's chunk of ``out`` (in place)."""
        self._rooted("gather", out, x, root)

    @collective
    def scatter(self, out: np.ndarray, x: np.ndarray | None, root: int = 0) -> None:
        """Every rank's ``out`` receives block ``rank`` of the root's ``x`` (size * out.size
        elements); on the other ranks ``x`` is not used (None will do). Collective: one phase
        in which every member pulls its block from the root, then the departure barrier.
        ``out`` may be the root's block of ``x`` (in place)."""
        self._rooted("scatter", out, x, root)

    def _rooted(self, op: str, out, x, root) -> None:
        """gather and scatter on the call pipeline: ``block`` is the array every rank has (its
        block), ``whole`` the root's array of size x block elements."""
        pipe, n, me = self._pipe, self.size, self.rank
        error = inp = target = None
        code = count = 0
        try:
            expect(isinstance(root, (int, np.integer)) and not isinstance(root, bool) and 0 <= root < n,
                   lambda: f"{op}: root {root!r} is not a rank of this communicator (size {n})")
            block = x if op == "gather" else out
            code = dtype_code(dtype_of(block, op, "input" if op == "gather" else "output"), op)
            count = block.size
            b = as_flat(block, op, "input" if op == "gather" else "output", writable=op == "scatter")
            self._buffers.check_mapped(b, op, "input" if op == "gather" else "output")
            pipe.check_path(op)
            whole = None
            if me == root:
                what = "output" if op == "gather" else "input"
                whole = as_flat(out if op == "gather" else x, op, what, writable=op == "gather")
                self._buffers.check_mapped(whole, op, what)
                expect(whole.size == n * count, lambda: f"{op}: the root's {what} has {whole.size} elements, "
                       f"expected {n} x {count} = {n * count}")
                expect(whole.dtype == block.dtype, lambda: f"{op}: the root's {what} dtype {whole.dtype} differs "
                       f"from the {'input' if op == 'gather' else 'output'} dtype {block.dtype}", TypeError)
            own = whole[me * count:(me + 1) * count] if whole is not None else None
            if op == "gather":
                inp = pipe.input(x, op, whole is not None and aliased(whole, x, (x, own)))
                target = pipe.output(whole) if whole is not None else None
            else:
                inp = pipe.input(x, op, aliased(b, x, (b, own))) if whole is not None else None
                target = pipe.output(b)
        except Exception as e:
            error = e
        parity = pipe.enter(op, code, inp, error=error, count=count, root=int(root))
        nb = count * block.itemsize
        need = np.zeros(n, dtype=np.int64)
        if op == "scatter":
            need[root] = 1
        elif me == root:
            need[:] = 1
        need[me] = 0
        pipe.sources_ready(op, parity, inp.addr if inp is not None else 0, need)
        build = slices.gather if op == "gather" else slices.scatter
        plan = pipe.phase((op, nb, root, me == root), lambda: build(me, n, nb, root))
        pipe.run(op, plan, _native.data_address(target) if target is not None else 0)
        pipe.finish(op)
        if target is not None:
            pipe.output_done(whole if op == "gather" else b, target)
        traffic = np.zeros((n, n), dtype=np.int64)
        if op == "gather":
            traffic[root] = nb
        else:
            traffic[:, root] = nb
        pipe.tick(op, parity, [(traffic, schedules.LOAD)])
