"""The calls of ``stratacl.shmem``: argument handling on the front end's side, everything that
needs the runtime through ``stratacl.runtime.SymmetricHeap`` (one per communicator).

    put(dst, src, pe)          src's bytes -> heap.remote(dst) in pe's HBM
    get(dst, src, pe)          heap.remote(src) in pe's HBM -> dst's bytes
    put_signal(...)            put, then heap.signal (every check made before the first byte moves)
    wait_until(sig, cmp, v)    heap.wait: futex sleep on the word's change counter, bounded
"""
from __future__ import annotations

import numpy as np

from .._errors import OneSidedError
from ..runtime import SymmetricHeap, address_of

SIGNAL_SET, SIGNAL_ADD = "set", "add"
CMP_EQ, CMP_NE, CMP_GT, CMP_GE, CMP_LT, CMP_LE = "eq", "ne", "gt", "ge", "lt", "le"


def _symmetric(x, op: str, what: str) -> tuple[int, int | None]:
    """(address, bytes it names or None for a bare address) of a symmetric object."""
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise ValueError(f"{op}: the {what} array must be C-contiguous (shape {x.shape}, strides {x.strides})")
        return address_of(x), x.nbytes
    try:
        return int(x), None
    except TypeError:
        raise TypeError(f"{op}: the {what} must be an HBM array or an address (int), got {type(x).__name__}") from None


def _fits(op: str, what: str, capacity: int | None, nbytes: int) -> None:
    if capacity is not None and nbytes > capacity:
        raise ValueError(f"{op}: {nbytes} bytes do not fit in the {what} array ({capacity} bytes)")


def _signal(signal, op: str) -> int:
    """The address of a signal word: a one-element view of a signal pad (``sig[i:i+1]``) or an int."""
    if isinstance(signal, np.ndarray):
        if signal.size != 1 or signal.dtype != np.uint64:
            raise ValueError(f"{op}: a signal is one u64 word of a signal pad, e.g. sig[i:i+1]; got shape "
                             f"{signal.shape} and dtype {signal.dtype}")
        return address_of(signal)
    return int(signal)


def my_pe(comm=None) -> int:
    """This rank in ``comm`` (default: the world communicator). Local."""
    return SymmetricHeap.of(comm).rank


def n_pes(comm=None) -> int:
    """The number of ranks of ``comm``. Local."""
    return SymmetricHeap.of(comm).size


def empty(shape, dtype=np.float32, comm=None) -> np.ndarray:
    """A symmetric HBM array (uninitialised): ``stratacl.empty`` checked to sit at the same
    offset of every member's slice. Collective over ``comm`` (an allgather of the offsets);
    raises OneSidedError on every member if the allocations are not symmetric."""
    return SymmetricHeap.of(comm).allocate(shape, dtype, "shmem.empty")


def zeros(shape, dtype=np.float32, comm=None) -> np.ndarray:
    """``empty`` filled with zeros, and a barrier: no peer writes into it before it is zero. Collective."""
    heap = SymmetricHeap.of(comm)
    a = heap.allocate(shape, dtype, "shmem.zeros")
    a[...] = 0
    heap.comm.barrier()
    return a


def buffer_register(a: np.ndarray, comm=None) -> None:
    """Make the HBM array ``a`` (from ``stratacl.empty``, not ``shmem.empty``) reachable by
    one-sided calls from the members of ``comm`` on other hosts, as nvshmemx_buffer_register
    does for a buffer NVSHMEM did not allocate: where ``a`` is in this rank's HBM is shared with
    them (held while ``a`` lives). On one host every HBM array is reachable already, and this
    does nothing. Collective over ``comm``."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"shmem.buffer_register: expected an HBM array, got {type(a).__name__}")
    SymmetricHeap.of(comm).exchange(a, "shmem.buffer_register")


def signal_pad(n: int, comm=None, symmetric: bool = True) -> np.ndarray:
    """``n`` zeroed u64 signal words over ``comm``; a signal is one word of it, passed as a
    one-element view (``sig[i:i+1]``). ``symmetric``: the pad sits at the same offset of every
    member's slice (checked, OneSidedError otherwise); ``symmetric=False`` exchanges the
    members' addresses instead, for programs whose allocations differ between ranks.
    Collective (ends with a barrier)."""
    return SymmetricHeap.of(comm).signal_pad(n, "shmem.signal_pad", symmetric)


def ptr(dst, pe: int, comm=None) -> int:
    """The address of ``pe``'s counterpart of this rank's symmetric object ``dst`` (an array or
    an address), at which ``stratacl.ub.view`` reads it (nvshmem_ptr); 0, as nvshmem_ptr's
    NULL, when ``pe`` is on another host (no load or store reaches it). Checked:
    OneSidedError if it is not registered memory of ``pe``. Local."""
    op = "shmem.ptr"
    addr, nbytes = _symmetric(dst, op, "symmetric")
    heap = SymmetricHeap.of(comm)
    target = heap.remote(addr, nbytes or 1, pe, op)
    return 0 if heap.far(heap.members[pe]) else target


def peer_view(a: np.ndarray, pe: int, comm=None) -> np.ndarray:
    """A numpy view of ``pe``'s counterpart of this rank's symmetric array ``a`` (loads and
    stores go straight to ``pe``'s HBM, uncharged by the modeled clock). Local."""
    op = "shmem.peer_view"
    addr, nbytes = _symmetric(a, op, "symmetric")
    heap = SymmetricHeap.of(comm)
    target = heap.remote(addr, nbytes, pe, op)
    return heap.view(target, nbytes, pe, op).view(a.dtype).reshape(a.shape)


def put(dst, src, pe: int, comm=None) -> None:
    """Copy ``src`` (any array; all its bytes) into ``pe``'s counterpart of ``dst`` (this rank's
    symmetric array or address). On return the bytes are in ``pe``'s HBM and ``src`` may be
    reused; ``quiet`` makes every put visible to every rank. Local, host-blocking."""
    op = "shmem.put"
    heap = SymmetricHeap.of(comm)
    data = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
    addr, capacity = _symmetric(dst, op, "destination")
    _fits(op, "destination", capacity, data.nbytes)
    target = heap.remote(addr, data.nbytes, pe, op)
    heap.copy(op, target, data, pe, put=True)
    heap.charge_put(op, pe, data.nbytes)


def get(dst: np.ndarray, src, pe: int, comm=None) -> None:
    """Fill ``dst`` (any writable C-contiguous array; all its bytes) from ``pe``'s counterpart
    of ``src`` (this rank's symmetric array or address). On return ``dst`` holds the bytes.
    Local, host-blocking."""
    op = "shmem.get"
    if not isinstance(dst, np.ndarray) or not dst.flags.c_contiguous or not dst.flags.writeable:
        raise ValueError(f"{op}: the destination must be a writable C-contiguous numpy array")
    heap = SymmetricHeap.of(comm)
    addr, capacity = _symmetric(src, op, "source")
    _fits(op, "source", capacity, dst.nbytes)
    target = heap.remote(addr, dst.nbytes, pe, op)
    heap.copy(op, target, dst.reshape(-1).view(np.uint8), pe, put=False)
    heap.charge_get(op, pe, dst.nbytes)


def put_signal(dst, src, signal, value: int, sig_op: str, pe: int, comm=None) -> None:
    """``put``, then update ``pe``'s counterpart of the signal word ``signal`` (``SIGNAL_SET``
    or ``SIGNAL_ADD`` ``value``): a rank that sees the signal's new value sees the data.
    Everything is checked before the first byte moves. Local, host-blocking."""
    op = "shmem.put_signal"
    heap = SymmetricHeap.of(comm)
    heap.check_sig_op(op, sig_op)
    data = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
    addr, capacity = _symmetric(dst, op, "destination")
    _fits(op, "destination", capacity, data.nbytes)
    target = heap.remote(addr, data.nbytes, pe, op)
    words = heap.signal_words(_signal(signal, op), pe, op)
    heap.copy(op, target, data, pe, put=True)
    heap.charge_put(op, pe, data.nbytes)
    heap.signal(op, words, value, sig_op, pe)


def signal_fetch(signal) -> int:
    """The value of this rank's signal word (one read). Local."""
    heap = SymmetricHeap.of(None)
    addr = _signal(signal, "shmem.signal_fetch")
    if heap.pad_word(addr, "shmem.signal_fetch") is None:
        raise ValueError(f"shmem.signal_fetch: {addr:#x} is not a word of this rank's signal pads")
    return int(np.frombuffer(heap.window(addr, 8), dtype=np.uint64)[0])


def wait_until(signal, cmp: str, value: int, timeout: float | None = None, comm=None) -> int:
    """Sleep until this rank's signal word compares ``cmp`` (``CMP_EQ``, ``CMP_GE``, ...) to
    ``value``; returns the value seen. The data of the put_signals that made it are then
    readable, and the modeled clock joins the latest signal's arrival. Raises SignalTimeout
    (naming the last signaller and the word) after ``timeout`` seconds (default: the
    communication timeout, STRATACL_TIMEOUT). Local: sleeps in the kernel, host-blocking."""
    heap = SymmetricHeap.of(comm)
    return heap.wait("shmem.wait_until", _signal(signal, "shmem.wait_until"), cmp, value, timeout)


def quiet(comm=None) -> None:
    """Every put and atomic this rank issued is complete and visible to every rank; the
    modeled clock joins their landing. Local."""
    SymmetricHeap.of(comm).quiet("shmem.quiet")


def fence(comm=None) -> None:
    """Order this rank's puts and atomics to each peer: those before are visible there before
    those after. Costs no modeled time (it only orders). Local."""
    SymmetricHeap.of(comm).fence()


def barrier_all(comm=None) -> None:
    """``quiet``, then a barrier of ``comm``: after it every rank sees every put made before it.
    Collective."""
    heap = SymmetricHeap.of(comm)
    heap.quiet("shmem.barrier_all")
    heap.comm.barrier()


def _word(dst, op: str) -> int:
    """The address of a 64-bit word: an int, or an array of 8-byte items (its first)."""
    addr, _ = _symmetric(dst, op, "word")
    if isinstance(dst, np.ndarray) and (dst.dtype.itemsize != 8 or dst.size < 1):
        raise OneSidedError(f"{op}: atomics act on 64-bit words; the array has dtype {dst.dtype} and "
                            f"{dst.size} elements", op, None, addr)
    return addr


def atomic_fetch_add(dst, value: int, pe: int, comm=None) -> int:
    """Add ``value`` to ``pe``'s counterpart of the u64 word ``dst`` (8-byte aligned); returns
    the old value. Local; a round trip in modeled time."""
    addr = _word(dst, "shmem.atomic_fetch_add")
    return SymmetricHeap.of(comm).atomic("shmem.atomic_fetch_add", "fetch_add", addr, pe, value)


def atomic_compare_swap(dst, cond: int, value: int, pe: int, comm=None) -> int:
    """If ``pe``'s word ``dst`` holds ``cond``, store ``value``; returns the value it held
    (NVSHMEM's argument order). Local; a round trip in modeled time."""
    addr = _word(dst, "shmem.atomic_compare_swap")
    return SymmetricHeap.of(comm).atomic("shmem.atomic_compare_swap", "compare_swap", addr, pe, cond, value)


def atomic_fetch(dst, pe: int, comm=None) -> int:
    """An atomic read of ``pe``'s u64 word ``dst``. Local."""
    addr = _word(dst, "shmem.atomic_fetch")
    return SymmetricHeap.of(comm).atomic("shmem.atomic_fetch", "fetch", addr, pe)


def atomic_set(dst, value: int, pe: int, comm=None) -> None:
    """An atomic store of ``value`` into ``pe``'s u64 word ``dst``. Local."""
    addr = _word(dst, "shmem.atomic_set")
    SymmetricHeap.of(comm).atomic("shmem.atomic_set", "set", addr, pe, value)
