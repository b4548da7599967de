"""Asynchronous operations: ``comm.all_gather(out, x, async_op=True)`` returns a ``Work``.

    caller thread                         the communicator's worker thread (started on first use)
    op(..., async_op=True) --submit-->    queue (FIFO) --> runs the operation exactly as a
        <-- Work                                           blocking call would, in call order
    compute ...                                            (waits sleep with the GIL released,
    work.wait() <----------- done/error --                 large copies and reductions too)

Once a communicator has a worker, its blocking calls go through the same queue (submit, then
wait), so operations still run in the order the program issued them. Buffers passed to an
asynchronous operation belong to it until ``wait()`` returns, as in torch.distributed. An
operation's exception is raised by ``wait()``. An error every rank of the call saw (rejected
arguments, a mismatch: nothing was moved) leaves the communicator usable, as a blocking call
does; after any other (a timeout, a dead peer) the ranks no longer agree on the call sequence,
so the operations queued after it are not run and fail with the same exception.
"""
from __future__ import annotations

import collections
import functools
import inspect
import threading
from typing import Any, Callable

from ..._errors import CollectiveMismatch, NotInitialized

_AGREED = "_stratacl_seen_by_every_rank"

# the stand-in (a Work) of the front-end operation whose communicator calls this thread is
# making, if any: see stand_in
_ON_BEHALF = threading.local()


def agreed(error: BaseException) -> BaseException:
    """Mark ``error`` as one every rank of its call raised (the call sequence stays in step)."""
    setattr(error, _AGREED, True)
    return error


class Work:
    """Handle of one asynchronous operation (torch.distributed's Work, MPI's Request)."""

    __slots__ = {"operation": "The operation's name, e.g. 'all_gather'.",
                 "_done": None, "_error": None, "_result": None,
                 "modeled": "Under a modeled clock, once done: (start_us, end_us, what its cores did: a "
                            "list, one entry per communicator call); else None.",
                 "_join": None, "_issued": None, "_traced": None, "_overlaps": None}

    def __init__(self, operation: str, join: Callable[["Work"], None] | None = None):
        self.operation = operation
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._result: Any = None
        self.modeled = None     # see __slots__ and runtime/pipeline/_modeling.py
        self._join = join       # called once by the first successful wait(): the program joins the operation
        self._issued = 0.0      # a stand-in's program clock when its operation was issued (stand_in)
        self._traced = None     # its event in the rank's trace (runtime/services/_trace.py), if one is kept
        self._overlaps = False  # asynchronous: the program computes meanwhile (path=auto takes SDMA for it)

    def is_completed(self) -> bool:
        """True once the operation has finished (successfully or not). Never blocks."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the operation has finished; raise its exception if it failed. With a
        ``timeout`` (seconds), return False if it is still running then."""
        if not self._done.wait(timeout):
            return False
        if self._error is not None:
            raise self._error
        join, self._join = self._join, None
        if join is not None:
            join(self)
        return True

    def exception(self) -> BaseException | None:
        """The exception the operation raised, or None (still running, or it succeeded).
        Never blocks."""
        return self._error if self._done.is_set() else None

    def result(self) -> Any:
        """What the operation returned (``split``: the new communicator); waits for it first."""
        self.wait()
        return self._result

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "completed" if self._done.is_set() else "pending"
        return f"Work({self.operation}, {state})"


class Worker:
    """The FIFO thread that runs one communicator's operations once any of them is asynchronous."""

    def __init__(self, name: str, start: bool = True):
        """``start=False``: a worker already stopped, with no thread, which refuses every
        operation (a communicator's after ``finalize()``)."""
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._failed: BaseException | None = None
        self._stopping = not start
        self._thread = threading.Thread(target=self._run, name=name, daemon=True) if start else None
        if start:
            self._thread.start()

    def submit(self, operation: str, fn: Callable[[], Any], work: Work | None = None) -> Work:
        work = work if work is not None else Work(operation)
        with self._cond:
            if self._stopping:
                raise NotInitialized(f"{operation}: the communicator is shut down (stratacl.finalize() was "
                                     f"called); issue every operation before finalize()")
            self._queue.append((fn, work))
            self._cond.notify()
        return work

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                fn, work = self._queue.popleft()
            if self._failed is not None:
                work._error = self._failed
            else:
                try:
                    work._result = fn()
                except BaseException as e:     # delivered by Work.wait()
                    work._error = e
                    if not (isinstance(e, CollectiveMismatch) or getattr(e, _AGREED, False)):
                        self._failed = e
            work._done.set()

    def stop(self, timeout: float | None = None) -> None:
        """Let the queued operations finish, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)


def collective(fn: Callable) -> Callable:
    """Give a communicator operation the ``async_op`` and ``path`` keywords.

    The wrapper is generated with the operation's own parameters (as dataclasses generates
    ``__init__``), so the common call, blocking with no worker and no modeled clock, costs one
    plain Python call more than the operation itself: at N = 32 on two cores each microsecond
    of a rank's Python is about 16 of the call's (docs/performance.md), and a ``*args,
    **kwargs`` wrapper cost about 2 us of it."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    if any(p.kind is not p.POSITIONAL_OR_KEYWORD or p.name in ("async_op", "path") for p in params):
        raise TypeError(f"collective: {fn.__name__} needs plain named parameters")
    namespace: dict[str, Any] = {"fn": fn, "deferred": _deferred}
    declared = []
    for p in params:
        if p.default is not p.empty:
            namespace[f"default_{p.name}"] = p.default
        declared.append(p.name if p.default is p.empty else f"{p.name}=default_{p.name}")
    args = ", ".join(p.name for p in params)
    source = (
        f"def {fn.__name__}({', '.join(['self', *declared, '*', 'async_op=False', 'path=None'])}):\n"
        f"    if async_op or self._worker is not None or self._rt.clock is not None:\n"
        f"        return deferred(self, fn, lambda: fn(self, {args}), async_op, path)\n"
        f"    self._path = self._default_path if path is None else path\n"
        f"    return fn(self, {args})\n")
    exec(compile(source, f"<collective {fn.__name__}>", "exec"), namespace)
    call = functools.wraps(fn)(namespace[fn.__name__])
    # what inspect and help() show (they would follow __wrapped__ to ``fn``, which lacks the
    # keywords); the native methods' __wrapped__ is this function, so they show it too
    signature = inspect.signature(fn)
    call.__signature__ = signature.replace(parameters=[
        *signature.parameters.values(),
        inspect.Parameter("async_op", inspect.Parameter.KEYWORD_ONLY, default=False, annotation="bool"),
        inspect.Parameter("path", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="str | None")])
    call.__doc__ = (fn.__doc__ or "") + (
        "\n\n        ``async_op=True``: return a ``Work`` at once; see runtime/pipeline/_work.py. ``path='mte'|'sdma'``:"
        "\n        the data path of this call's copies (default: the ``path`` setting); see runtime/pipeline/_execute.py.")
    return call


def stand_in(comm, operation: str, async_op: bool) -> Work | None:
    """Under a modeled clock, the place in modeled time of a front end's operation whose
    communicator calls run later on a thread of the front end's own (stratacl.torch queues
    asynchronous operations on its group's worker): a Work issued at the program's clock now,
    kept for ``charge_compute`` while in flight if ``async_op``. The calls made inside
    ``on_behalf(work)`` enter at that clock (or when the communicator's previous operation
    ended) and leave the program's clock alone; ``work.wait()`` joins it, as for the
    communicator's own asynchronous operations. None without a modeled clock."""
    clock = comm._rt.clock
    if clock is None:
        return None
    return _issue(comm, operation, async_op, comm._modeling.join_work, clock.entering())


def _issue(comm, operation: str, async_op: bool, join, issued: float, record: bool = True) -> Work:
    """The Work of an operation issued now at modeled time ``issued``, to run later: kept for
    ``charge_compute`` while in flight if asynchronous, and (``record``) in the rank's trace."""
    work = Work(operation, join)
    work._issued = issued
    work._overlaps = async_op
    if async_op and comm._rt.clock is not None:
        comm._rt.track(work)
    if record and comm._rt.trace is not None:
        comm._rt.trace.issue(work, async_op)
    return work


class on_behalf:
    """Communicator calls made in this block (on this thread) are ``work``'s (see stand_in);
    ``work`` is done when the block ends. ``work`` None: nothing changes."""

    def __init__(self, work: Work | None):
        self._work = work

    def __enter__(self) -> None:
        if self._work is not None:
            _ON_BEHALF.work = self._work

    def __exit__(self, *exc) -> None:
        if self._work is not None:
            _ON_BEHALF.work = None
            self._work._done.set()


def _deferred(self, fn: Callable, body: Callable[[], Any], async_op: bool, path: str | None) -> Any:
    """A call other than the common one: under a modeled clock (the program's clock when it
    was called, or its stand-in's: see stand_in), or through the communicator's worker
    (asynchronous, or queued behind one)."""
    clock = self._rt.clock
    worker = self._worker
    behalf = getattr(_ON_BEHALF, "work", None) if clock is not None else None
    if path is None:            # an asynchronous operation's calls overlap compute (path=auto: SDMA)
        path = self._overlap_path if async_op or (behalf is not None and behalf._overlaps) else self._default_path
    if worker is None and not async_op:
        self._path = path
        if behalf is not None:
            self._modeling.issue(behalf._issued, behalf)
        else:
            self._modeling.issue(clock.entering())
        return body()
    issued = behalf._issued if behalf is not None else clock.entering() if clock is not None else 0.0

    def run(work: Work):
        self._path = path
        self._modeling.issue(issued, behalf if behalf is not None and not async_op else work)
        return body()
    if worker is None:
        worker = self._start_worker()
    own = behalf is None or async_op      # else the stand-in joins and is traced, not this Work
    work = _issue(self, fn.__name__, async_op, self._modeling.join_work if clock is not None and own else None,
                  issued, own)
    worker.submit(fn.__name__, lambda: run(work), work)
    return work if async_op else work.result()
