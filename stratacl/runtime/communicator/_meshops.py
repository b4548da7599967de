"""The full-mesh operators: each is its argument check, and its method is derived from that.

An operator the native mesh machine runs is three things: its row in the operator table
(stratacl/_operators.py), its slice map (collectives/_slices.py) and its check here, which
raises on every rank of a bad call and decides the rest (``MeshArgs``): the phases, the input,
how the call departs, where its result is written. From the check ``mesh_operator`` derives

    the Python operation   the one skeleton, ``MeshOperators._run``: the checked arguments
        |                  (remembered for a repeated call: _prepared.py), a replay if they
        |                  carry one, else the call (MeshDriver.call; RingSteps.call for
        |                  --algo ring), the staged output copied out, the modeled clock ticked
    the native method      the same call's common case with no Python (_replay.c,
                           PreparedMethod): a repeat on the same arrays, positional
                           arguments, no modeled clock, replays the MeshCall the check recorded

The check's signature and docstring are the operation's; an ``np.ndarray`` parameter is an
array the call reads or writes, any other a scalar every rank passes alike.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

import numpy as np

from ...collectives import OUT, SCRATCH, dtype_code, reduce_code, schedules, slices
from .. import _native
from .._native import MESH_BARRIER, MESH_NO_DEPARTURE, MESH_ROOT, MESH_ROOT_READER
from ..pipeline import EAGER_BYTES, EAGER_CHUNKS_READ, CallInput, aliased, as_flat, collective, dtype_of, expect
from ._mesh import MeshCall


class MeshArgs(NamedTuple):
    """What a full-mesh operator's check decided, remembered for a repeated call. Native code
    reads ``replay`` only (_replay.c, NAMES_READ)."""
    code: int                   # the dtype's code
    rcode: int                  # the reduce op's code (0 where nothing is reduced)
    algo: str                   # "mesh" or "ring"
    inp: Any                    # this rank's CallInput (None: the eager copy of arrays[eager], made per call)
    first: Any                  # the mesh's phases (compiled plans; None: none)
    second: Any
    departure: int              # MESH_*
    count: int                  # the descriptor's element count
    root: int
    only: int                   # the one member read (-1: every member)
    divisor: float              # avg's
    out_addr: int               # this rank's OUT base, named as the call starts (-1: none)
    eager: int                  # the array copied into the eager slot per call (-1: none)
    scratch: bool               # a scratch buffer of the call's own (a reduction of fewer elements than ranks)
    output: int                 # the array a staged result is copied to
    target: Any                 # where the result is written when not in place (None: in place)
    nbytes: int                 # the bytes the modeled clock times
    itemsize: int
    replay: MeshCall | None     # the call recorded for native replay (None: not replayed)
    # under a modeled clock, an operator without a schedule (collectives/_schedule.py) is timed
    # from its traffic, every member's slice map summed: [(bytes[reader, owner], kind)] a phase
    traffic: list | None = None


def mesh_operator(check: Callable) -> Any:
    """The method of the operator checked by ``check`` (``_check_<operator>``): native, calling
    the Python operation derived from the check for anything but its common case."""
    name = check.__name__.removeprefix("_check_")
    signature = inspect.signature(check).replace(return_annotation="None")
    params = list(signature.parameters.values())[1:]
    spec = "".join("a" if "ndarray" in str(p.annotation) else "s" for p in params)
    arrays = tuple(i for i, s in enumerate(spec) if s == "a")
    scalars = tuple(i for i, s in enumerate(spec) if s == "s")

    def operation(self, *args):
        # the key of a repeated call, as native code builds it: the arrays by identity, the
        # scalars by value (plain ints and strings only), on the default path only
        key = None
        if self._path is self._default_path and all(type(args[i]) in (int, str) for i in scalars):
            key = (name, *[id(v) if s == "a" else v for v, s in zip(args, spec)])
        self._run(name, key, tuple(args[i] for i in arrays), check, args)

    operation.__name__ = operation.__qualname__ = name
    operation.__doc__ = check.__doc__
    operation.__signature__ = signature
    defaults = tuple(p.default for p in params if p.default is not p.empty)
    return _native.prepared_method(name, tuple(p.name for p in params), spec, defaults, _native.METHOD_MESH,
                                   collective(operation))


class MeshOperators:
    """The Communicator's full-mesh operators (a part of it: runtime/communicator/_comm.py)."""

    def _run(self, name: str, key: tuple | None, arrays: tuple, check: Callable, args: tuple) -> None:
        """Every full-mesh operation, from its checked arguments (see the module docstring)."""
        a = self._prepared.get(key, arrays, check, self, *args)
        if a.replay is not None and self._mesh.replay(a.replay):
            return
        inp = a.inp
        if a.eager >= 0:
            inp = self._buffers.eager_input(as_flat(arrays[a.eager], name, "input"))
        if a.out_addr >= 0:
            self._bases[OUT, self.rank] = a.out_addr
        if a.algo == "ring":
            parity = self._ring.call(name, a, inp, self._path)
        else:
            if a.scratch:
                scratch = np.empty(a.nbytes, np.uint8)
                self._bases[SCRATCH, self.rank] = _native.data_address(scratch)
            parity = self._mesh.call(name, self._path, inp, a.first, a.departure, a.code, a.count, a.root, a.rcode,
                                     a.divisor, a.second, a.only)
        if a.target is not None:
            self._buffers.output_done(arrays[a.output], a.target)
        if a.traffic is None:
            self._pipe.tick_schedule(name, parity, a.nbytes, a.algo, a.root, a.itemsize)
        else:
            self._pipe.tick(name, parity, a.traffic)

    def _traffic(self, smap: Callable[[int], list]) -> list | None:
        """Under a modeled clock, a call's traffic (MeshArgs.traffic) from ``smap(member)``,
        every member's slice map; None without one."""
        if self._rt.clock is None:
            return None
        n = self.size
        maps = [smap(r) for r in range(n)]
        phases = []
        for i in range(len(maps[0])):
            bytes_read = np.array([maps[r][i].per_peer(n) for r in range(n)], dtype=np.int64)
            reduces = any((maps[r][i].op == slices.LOAD_ACC).any() for r in range(n))
            phases.append((bytes_read, schedules.LOAD_REDUCE if reduces else schedules.LOAD))
        return phases

    def _remembered(self, name: str, a: MeshArgs, inp: CallInput | None,
                    eager: np.ndarray | None = None) -> tuple[MeshArgs, bool]:
        """``a`` to remember: the result in place, the input ``inp`` (which holds no array), and
        the MeshCall a replay runs (``eager``: the array copied into the eager slot per call)."""
        replay = self._mesh.record(name, self._path, inp, a.first, a.departure, a.code, a.count, a.root, a.rcode,
                                   a.divisor, a.second, a.only, out_addr=a.out_addr, eager=eager)
        return a._replace(inp=inp, target=None, replay=replay), True

    def _mode(self, op: str, x: np.ndarray) -> tuple[str, bool]:
        """The call's algorithm and whether its input is eager (copied into a slot), the path checked."""
        if self._path is not self._default_path:
            self._executor.check_path(op, self._path)
        algo = self._modeling.algo_for(op, x.nbytes, x.itemsize)
        return algo, algo == "mesh" and x.nbytes <= EAGER_BYTES

    def _output(self, out: np.ndarray, op: str) -> np.ndarray:
        o = as_flat(out, op, "output", writable=True)
        self._buffers.check_mapped(o, op, "output")
        return o

    @staticmethod
    def _same_dtype(o: np.ndarray, x: np.ndarray, op: str) -> None:
        expect(o.dtype == x.dtype, lambda: f"{op}: output dtype {o.dtype} differs from input dtype {x.dtype}", TypeError)

    # --- the operators ----------------------------------------------------------------------
    def _check_all_gather(self, out: np.ndarray, x: np.ndarray) -> tuple[MeshArgs, bool]:
        """``out`` (size * x.size elements) receives every rank's ``x``, rank-major. Collective.

        In place: ``x`` may be this rank's chunk of ``out`` (zero copy); an ``x`` overlapping
        ``out`` otherwise is copied first."""
        op, me, n = "all_gather", self.rank, self.size
        try:
            code = dtype_code(dtype_of(x, op, "input"), op)
            o = self._output(out, op)
            expect(o.size == n * x.size, lambda: f"{op}: output has {o.size} elements, expected "
                   f"{n} x {x.size} = {n * x.size}")
            self._same_dtype(o, x, op)
            algo, eager = self._mode(op, x)
            if eager:                      # an eager input is read per call, but checked here
                self._buffers.check_mapped(as_flat(x, op, "input"), op, "input")
            own = o[me * x.size:(me + 1) * x.size]
            inp = None if eager else self._buffers.as_input(x, op, aliased(o, x, (x, own)))
            target = self._buffers.output(o, hbm=algo == "ring")
        except Exception as e:
            self._protocol.enter(op, error=e)
        nb = x.nbytes
        plan = (self._executor.phase(("all_gather", nb), lambda: slices.all_gather(me, n, nb), shared=True)
                if algo == "mesh" else None)
        a = MeshArgs(code, 0, algo, inp, plan, None, MESH_NO_DEPARTURE if eager else MESH_BARRIER, x.size, 0, -1, 1.0,
                     _native.data_address(target), 1 if eager else -1, False, 0, target, nb, x.itemsize, None)
        if algo == "mesh" and target is o:
            if eager:
                return self._remembered(op, a, None, x)
            held = inp.in_place_of(x)
            if held is not None:
                return self._remembered(op, a, held)
        return a, False

    all_gather = mesh_operator(_check_all_gather)

    def _check_all_to_all(self, out: np.ndarray, x: np.ndarray) -> tuple[MeshArgs, bool]:
        """Equal splits: chunk j of rank i's ``x`` lands in chunk i of rank j's ``out``. Collective.

        ``out`` may be ``x`` or overlap it (in place): ``x`` is then copied first."""
        op, me, n = "all_to_all", self.rank, self.size
        try:
            code = dtype_code(dtype_of(x, op, "input"), op)
            o = self._output(out, op)
            expect(x.size % n == 0, lambda: f"{op}: input has {x.size} elements, not divisible by {n} ranks")
            expect(o.size == x.size, lambda: f"{op}: output has {o.size} elements, expected {x.size}")
            self._same_dtype(o, x, op)
            if self._path is not self._default_path:
                self._executor.check_path(op, self._path)
            inp = self._buffers.as_input(x, op, aliased(o, x))
            target = self._buffers.output(o)
        except Exception as e:
            self._protocol.enter(op, error=e)
        nb = x.nbytes
        plan = self._executor.phase(("all_to_all", nb), lambda: slices.all_to_all(me, n, nb))
        a = MeshArgs(code, 0, "mesh", inp, plan, None, MESH_BARRIER, x.size, 0, -1, 1.0, _native.data_address(target),
                     -1, False, 0, target, nb, x.itemsize, None)
        held = inp.in_place_of(x) if target is o else None
        return self._remembered(op, a, held) if held is not None else (a, False)

    all_to_all = mesh_operator(_check_all_to_all)

    def _check_broadcast(self, x: np.ndarray, root: int = 0) -> tuple[MeshArgs, bool]:
        """Every rank's ``x`` receives the root's ``x``. Collective."""
        op, me, n = "broadcast", self.rank, self.size
        try:
            code = dtype_code(dtype_of(x, op, "buffer"), op)
            expect(isinstance(root, (int, np.integer)) and 0 <= root < n,
                   lambda: f"{op}: root {root!r} is not a rank of this communicator (size {n})")
            if self._path is not self._default_path:
                self._executor.check_path(op, self._path)
            xf = as_flat(x, op, "buffer", writable=True)
            self._buffers.check_mapped(xf, op, "buffer")
            # a reader pulls into its own buffer, which it names as its input (bases[IN, me])
            inp = self._buffers.as_input(x, op) if me == root else CallInput(xf, None)
            target = self._buffers.output(xf) if me != root else xf
        except Exception as e:
            self._protocol.enter(op, error=e)
        nb = x.nbytes
        plan = None
        if me != root:
            plan = self._executor.phase(("broadcast", nb, root), lambda: slices.broadcast(me, n, nb, root), shared=True)
        a = MeshArgs(code, 0, "mesh", inp, plan, None, MESH_ROOT if me == root else MESH_ROOT_READER, x.size, root,
                     root, 1.0, -1, -1, False, 0, None, nb, x.itemsize, None)
        if me == root:
            held = inp.in_place_of(x)
            return self._remembered(op, a, held) if held is not None else (a, False)
        if target is xf:         # in place: remember the address only, not the caller's array
            return self._remembered(op, a, CallInput(None, None, _native.data_address(xf) if nb else 0, nb))
        return a._replace(inp=CallInput(target, None), target=target), False

    broadcast = mesh_operator(_check_broadcast)

    def _check_reduce_scatter(self, out: np.ndarray, x: np.ndarray, op: str = "sum") -> tuple[MeshArgs, bool]:
        """``out`` receives chunk ``rank`` of the element-wise reduction of every rank's ``x``. Collective.

        In place: ``out`` may be this rank's chunk of ``x`` (zero copy); an ``out`` overlapping
        ``x`` otherwise has ``x`` copied first.

        Mesh: every output element is reduced in rank order. Ring: chunk c is reduced in the
        order the ring visits the ranks, c+1, c+2, ..., c (runtime/communicator/_ringsteps.py)."""
        name, me, n = "reduce_scatter", self.rank, self.size
        try:
            code = dtype_code(dtype_of(x, name, "input"), name)
            rcode = reduce_code(op, x.dtype, name)
            o = self._output(out, name)
            expect(x.size == n * o.size, lambda: f"{name}: input has {x.size} elements, expected "
                   f"{n} x {o.size} = {n * o.size}")
            self._same_dtype(o, x, name)
            if self._path is not self._default_path:
                self._executor.check_path(name, self._path)
            own = as_flat(x, name, "input")[me * o.size:(me + 1) * o.size]
            inp = self._buffers.as_input(x, name, aliased(o, x, (o, own)))
            algo = self._modeling.algo_for(name, x.nbytes, x.itemsize)
            target = self._buffers.output(o)
        except Exception as e:
            self._protocol.enter(name, error=e)
        count, item = x.size, x.itemsize
        plan = None
        if algo == "mesh":
            plan = self._executor.phase(("reduce_scatter", count, item),
                                        lambda: slices.reduce_scatter(me, n, count, item), item)
        a = MeshArgs(code, rcode, algo, inp, plan, None, MESH_BARRIER, o.size, 0, -1, float(n),
                     _native.data_address(target), -1, False, 0, target, x.nbytes, item, None)
        held = inp.in_place_of(x) if algo == "mesh" and target is o else None
        return self._remembered(name, a, held) if held is not None else (a, False)

    reduce_scatter = mesh_operator(_check_reduce_scatter)

    def _check_all_reduce(self, x: np.ndarray, op: str = "sum") -> tuple[MeshArgs, bool]:
        """In place: every rank's ``x`` becomes the element-wise reduction of all ranks' ``x``.

        Collective. Mesh, up to EAGER_BYTES: every rank reduces the whole buffer from all
        ranks' eager copies straight into ``x`` (one barrier; runtime/pipeline/_buffers.py), or,
        once that would read EAGER_CHUNKS_READ bytes or more, its own chunk of them and gathers
        the others' reduced chunks (two barriers); above: reduce own chunk in place, then
        gather the others (three); fewer elements than ranks: reduce the whole buffer
        privately, then copy it back after a barrier. Every element is reduced in rank order.
        Ring: ring reduce-scatter, a barrier, ring all-gather; chunk c is reduced in the order
        c+1, ..., c (runtime/communicator/_ringsteps.py)."""
        name, me, n = "all_reduce", self.rank, self.size
        try:
            code = dtype_code(dtype_of(x, name, "buffer"), name)
            rcode = reduce_code(op, x.dtype, name)
            xf = as_flat(x, name, "buffer", writable=True)
            self._buffers.check_mapped(xf, name, "buffer")
            algo, eager = self._mode(name, x)
            inp = None if eager else self._buffers.as_input(x, name)
        except Exception as e:
            self._protocol.enter(name, error=e)
        count, item, nb = x.size, x.itemsize, x.nbytes
        a = MeshArgs(code, rcode, algo, inp, None, None, MESH_BARRIER, count, 0, -1, float(n), -1, -1, False, 0, None,
                     nb, item, None)
        if eager:
            # the peers' eager copies stay valid until the next call's arrival barrier: nobody
            # reads x, which every rank reduces into, so nobody waits at the departure
            target = self._buffers.output(xf)
            if count >= n and n * nb >= EAGER_CHUNKS_READ:
                first, second = self._executor.phases(("all_reduce_eager_chunks", count, item),
                                                      lambda: slices.all_reduce_eager_chunks(me, n, count, item), item)
            else:
                first = self._executor.phase(("all_reduce_eager", nb, item),
                                             lambda: slices.all_reduce_eager(me, n, nb), item)
                second = None
            a = a._replace(first=first, second=second, departure=MESH_NO_DEPARTURE,
                           out_addr=_native.data_address(target), eager=0, target=target)
            return self._remembered(name, a, None, x) if target is xf else (a, False)
        if algo == "mesh":
            first, second = self._executor.phases(("all_reduce", count, item),
                                                  lambda: slices.all_reduce(me, n, count, item, small=0), item)
            a = a._replace(first=first, second=second, departure=MESH_BARRIER if count >= n else MESH_NO_DEPARTURE,
                           scratch=count < n)
        if inp.addr != _native.data_address(xf) or not xf.flags.c_contiguous:
            a = a._replace(target=inp.flat)           # staged: the result is copied back from the copy
        held = inp.in_place_of(x) if algo == "mesh" and count >= n else None
        return self._remembered(name, a, held) if held is not None else (a, False)

    all_reduce = mesh_operator(_check_all_reduce)

    def _check_reduce(self, out: np.ndarray | None, x: np.ndarray, op: str = "sum", root: int = 0
                      ) -> tuple[MeshArgs, bool]:
        """At ``root``, ``out`` (as many elements as ``x``, its dtype) receives the reduction of
        every rank's ``x`` in rank order, the same bits all_reduce gives (MPI_Reduce); on the
        other ranks ``out`` is not used (None will do). ``out`` may be ``x`` (in place).
        Collective: one full-mesh phase in which the root loads every member's ``x`` and
        accumulates, then the departure barrier."""
        name, me, n = "reduce", self.rank, self.size
        o = target = None
        try:
            expect(isinstance(root, (int, np.integer)) and not isinstance(root, bool) and 0 <= root < n,
                   lambda: f"reduce: root {root!r} is not a rank of this communicator (size {n})")
            code = dtype_code(dtype_of(x, name, "input"), name)
            rcode = reduce_code(op, x.dtype, name)
            self._buffers.check_mapped(as_flat(x, name, "input"), name, "input")
            if self._path is not self._default_path:
                self._executor.check_path(name, self._path)
            if me == root:
                o = self._output(out, name)
                expect(o.size == x.size, lambda: f"reduce: the root's output has {o.size} elements, "
                       f"expected {x.size} (the input's)")
                expect(o.dtype == x.dtype, lambda: f"reduce: the root's output dtype {o.dtype} differs "
                       f"from the input dtype {x.dtype}", TypeError)
                target = self._buffers.output(o)
            # the root writes its output while its peers read its input: an overlap is staged
            inp = self._buffers.as_input(x, name, o is not None and aliased(o, x, (x, o)))
        except Exception as e:
            self._protocol.enter(name, error=e)
        nb, root = x.nbytes, int(root)
        plan = self._executor.phase((name, nb, root, me == root), lambda: slices.reduce(me, n, nb, root), x.itemsize)
        a = MeshArgs(code, rcode, "mesh", inp, plan, None, MESH_BARRIER, x.size, root, -1 if me == root else me,
                     float(n), -1 if target is None else _native.data_address(target), -1, False, 0, target, nb,
                     x.itemsize, None, self._traffic(lambda r: slices.reduce(r, n, nb, root)))
        held = inp.in_place_of(x) if out is not None and target is o else None
        return self._remembered(name, a, held) if held is not None else (a, False)

    reduce = mesh_operator(_check_reduce)
