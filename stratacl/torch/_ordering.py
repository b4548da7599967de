"""How a process group's operations run, in the order the program issued them, and the TorchWork
torch gets for each.

    caller thread                           the group's worker thread (started on first use)
    op(..., asyncOp=False), nothing queued  runs the operation inline: no thread hop
    op(..., asyncOp=True) --queue-->        FIFO: runs it, completes its Future, then its TorchWork
        <-- TorchWork                            (DDP's communication hooks chain on the Future)
    work.wait()   runs the operation itself if it is next in line and the worker is idle

Point-to-point operations are collected, not run, until the program waits on (or polls, or
asks for the future of) one of them, or issues any other operation; the batch then runs as
one queued item which pairs each send with a receive (``Communicator.sendrecv``) in issue
order. A communicator's send completes when its receiver has pulled the bytes (a rendezvous,
MPI_Ssend), so running ``isend(1); irecv(1)`` one after the other on both ranks would
deadlock; paired, both halves proceed at once, which is what torch programs that exchange
with ``isend``/``irecv`` or ``batch_isend_irecv`` expect.

Errors: a StrataCL error (mismatch, dead peer, timeout) reaches the caller of ``wait()`` (and
the Future) as ``torch.distributed.DistBackendError`` whose message is StrataCL's and whose
``__cause__`` is the StrataCL exception; a bad argument stays the TypeError or ValueError it is.
"""
from __future__ import annotations

import atexit
import collections
import threading
import weakref
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

import stratacl


def backend_error(operation: str, e: BaseException) -> BaseException:
    """What torch users get for ``e``: StrataCL's own errors as DistBackendError (see the module
    docstring), anything else as it is."""
    if isinstance(e, stratacl.StrataError):
        err = dist.DistBackendError(f"stratacl {operation}: {type(e).__name__}: {e}")
        err.__cause__ = e
        return err
    return e


# sequencers whose worker thread was started: joined at exit (Sequencer.close), by a hook
# registered at the first start, after stratacl.init() registered finalize(): atexit runs
# hooks last-in first-out, so the queued operations run before the rank finalizes
_LIVE: "weakref.WeakSet[Sequencer]" = weakref.WeakSet()
_HOOKED = False
CLOSE_TIMEOUT_S = 60.0


def _close_all() -> None:
    for sequencer in list(_LIVE):
        sequencer.close()


# guards a Work's completion against a concurrent first get_future(): the future is made
# only when asked for (most blocking calls never are), and completed exactly once
_COMPLETION = threading.Lock()


class TorchWork(dist._Work):
    """One operation of a stratacl process group: torch's Work, completed with its Future.

    Cheap to make, since a blocking call makes one per call: its Future is made on the first
    ``get_future()`` (completed then if the operation already ran), and a wait for an operation
    that has not run sleeps on its sequencer's condition, which every completion notifies."""

    def __init__(self, operation: str, outputs: list, sequencer: Sequencer, p2p: bool = False):
        super().__init__()
        self.operation = operation
        self._outputs = outputs
        self._sequencer = sequencer
        self._p2p = p2p
        self._future: torch.futures.Future | None = None
        self._done = False
        self._error: BaseException | None = None
        self._stand_in = None        # under a modeled clock, its place in modeled time (Sequencer.submit)

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except BaseException as e:          # delivered by wait() and the Future
            self._complete(backend_error(self.operation, e))
        else:
            self._complete(None)

    def _fail(self, error: BaseException) -> None:
        self._complete(error)

    def _complete(self, error: BaseException | None) -> None:
        # called inside Sequencer._execute, which then notifies the sequencer's waiters
        with _COMPLETION:
            self._error = error
            self._done = True
            future = self._future
        if future is not None:
            _settle(future, error, self._outputs)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Block until the operation has run; raise its error. Host-blocking, as gloo's."""
        if not self._done:
            if self._p2p:
                self._sequencer.flush()
            self._sequencer.help(self)
            self._sequencer.wait_for(self)
        if self._error is not None:
            raise self._error
        if self._stand_in is not None:           # the program's modeled clock joins the operation
            stand_in, self._stand_in = self._stand_in, None
            stand_in.wait()
        return True

    def is_completed(self) -> bool:
        if self._p2p and not self._done:
            self._sequencer.flush()
        return self._done

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self):
        return self._error

    def get_future(self) -> torch.futures.Future:
        """Completes with the operation's output tensors (a list), or its error."""
        if self._p2p and not self._done:
            self._sequencer.flush()
        with _COMPLETION:
            future, made = self._future, False
            if future is None:
                future = self._future = torch.futures.Future()
                made = self._done
        if made:
            _settle(future, self._error, self._outputs)
        return future

    def result(self) -> list:
        self.wait()
        return self._outputs

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "completed" if self._done else "pending"
        return f"stratacl.torch.TorchWork({self.operation}, {state})"


def _settle(future: torch.futures.Future, error: BaseException | None, outputs: list) -> None:
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(outputs)


class Sequencer:
    """One process group's operations, in program order: inline, on its worker thread, or
    batched (point-to-point); see the module docstring."""

    def __init__(self, name: str, comm=None):
        self._name = name
        self._comm = comm                        # its modeled clock, for operations run later (_queued)
        # the fast paths take the condition's lock directly (a C call, not Condition's Python
        # __enter__/__exit__): a blocking call passes here twice
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: collections.deque = collections.deque()
        self._busy = False
        self._sleepers = 0                      # threads in _cond.wait(): the worker, waiters
        self._thread: threading.Thread | None = None
        self._closing = False                    # close(): the worker ends once the queue is empty
        self._p2p: list = []                     # (is_send, array, peer, work), in issue order
        self._p2p_lock = threading.Lock()
        self._run_batch: Callable[[list], None] | None = None

    def submit(self, work: TorchWork, fn: Callable[[], Any], async_op: bool) -> TorchWork:
        if self._p2p:
            self.flush()
        with self._lock:
            inline = not async_op and not self._queue and not self._busy
            if not inline:
                fn = self._queued([work], fn, async_op)
                self._queue.append((work, fn))
                self._start()
                self._cond.notify_all()
            else:
                self._busy = True
        if inline:
            self._execute(work, fn)
        return work

    def _queued(self, works: list, fn: Callable[[], Any], async_op: bool) -> Callable[[], Any]:
        """``fn`` for the queue. Under a modeled clock its communicator calls take their place
        in modeled time now, in program order, not when a thread runs them: they enter at the
        program's clock of this moment and move it only when the program waits (``Communicator.stand_in``), so an asynchronous operation overlaps the compute the
        program charges meanwhile, as the communicator's own ``async_op=True`` does."""
        comm = self._comm
        stand_in = comm.stand_in(works[0].operation, async_op) if comm is not None else None
        if stand_in is None:
            return fn
        for w in works:
            w._stand_in = stand_in

        def on_behalf() -> Any:
            with comm.on_behalf(stand_in):
                return fn()
        return on_behalf

    def now(self, operation: str, outputs: list, fn: Callable[..., Any], *args: Any) -> TorchWork | None:
        """A blocking operation run here and now, when nothing is queued, running or collected
        (None otherwise: the caller goes through ``submit``): ``fn(*args)``, then its TorchWork,
        completed. The common case of a training loop, with the least Python between the
        caller and the communicator: at N = 8 on two cores each microsecond of it costs about
        four of the call's wall time (docs/notebook/performance-2026-12-02.md, "torch.distributed")."""
        if self._p2p:
            return None
        with self._lock:
            if self._queue or self._busy:
                return None
            self._busy = True
        work = TorchWork(operation, outputs, self)
        try:
            fn(*args)
        except BaseException as e:      # nobody else sees the TorchWork yet: no completion lock
            work._error = backend_error(operation, e)
        finally:
            work._done = True
            with self._lock:
                self._busy = False
                if self._sleepers:
                    self._cond.notify_all()
        return work

    def wait_for(self, work: TorchWork) -> None:
        """Sleep until ``work`` has completed (on the worker thread)."""
        with self._cond:
            while not work._done:
                self._sleepers += 1
                try:
                    self._cond.wait()
                finally:
                    self._sleepers -= 1

    def post_p2p(self, is_send: bool, array, peer: int, work: TorchWork, run_batch: Callable[[list], None]) -> TorchWork:
        with self._p2p_lock:
            self._run_batch = run_batch
            self._p2p.append((is_send, array, peer, work))
        return work

    def flush(self) -> None:
        """Queue the point-to-point operations collected so far as one batch."""
        with self._p2p_lock:
            batch, self._p2p = self._p2p, []
            run_batch = self._run_batch
        if batch:
            works = [w for *_, w in batch]
            fn = self._queued(works, lambda: run_batch(batch), True)
            with self._cond:
                self._queue.append((works, fn))
                self._start()
                self._cond.notify_all()

    def help(self, work: TorchWork) -> None:
        """Run the queue's head in this thread while the worker is idle, up to ``work``."""
        while not work._done:
            with self._cond:
                if not self._queue or self._busy:
                    return
                head = self._queue[0][0]
                if not (head is work or (isinstance(head, list) and any(w is work for w in head))):
                    return
                item, fn = self._queue.popleft()
                self._busy = True
            self._execute(item, fn)

    def _execute(self, work: TorchWork | list, fn: Callable[[], Any]) -> None:
        try:
            if isinstance(work, list):
                fn()                 # a point-to-point batch completes its own Works
            else:
                work._run(fn)
        finally:
            with self._lock:
                self._busy = False
                if self._sleepers:
                    self._cond.notify_all()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"stratacl-torch-{self._name}", daemon=True)
            global _HOOKED
            if not _HOOKED:
                atexit.register(_close_all)
                _HOOKED = True
            _LIVE.add(self)
            self._thread.start()

    def close(self, timeout: float | None = CLOSE_TIMEOUT_S) -> None:
        """Run what is queued, then end the worker thread and join it (a later operation starts
        another). Called when the group is shut down and at exit: a daemon thread still inside
        torch when the interpreter finalizes (completing a Future releases the GIL in C++, and
        a waiter may already have seen the TorchWork done) is ended by the interpreter mid-call, and
        the process aborts ("terminate called without an active exception")."""
        with self._cond:
            thread = self._thread
            if thread is None:
                return
            self._closing = True
            self._cond.notify_all()
        if thread is threading.current_thread():
            return
        thread.join(timeout)
        with self._cond:
            if not thread.is_alive() and self._thread is thread:
                self._thread, self._closing = None, False

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue or self._busy:
                    if self._closing and not self._queue:
                        return
                    self._sleepers += 1
                    try:
                        self._cond.wait()
                    finally:
                        self._sleepers -= 1
                work, fn = self._queue.popleft()
                self._busy = True
            self._execute(work, fn)
