"""Where an operation reads and writes: the caller's HBM arrays (zero copy) or communication
buffers (the staged path).

    input  x in this rank's HBM, contiguous, not --registration staged
               yes: peers read x itself at its shared address (zero copy)
               no:  x is copied into a registered communication buffer first (counted in
                    stats()["bytes_staged"]); peers read that
    output o 1-D and contiguous (and in this rank's HBM when a ring neighbour reads it), not
           --registration staged
               yes: the operation writes o itself
               no:  it writes a communication buffer, copied out afterwards

Communication buffers are this rank's own HBM allocations, so they are registered on
allocation like any other; they grow to the largest size used and are kept.

Small inputs (up to EAGER_BYTES, full-mesh all_gather and all_reduce) take the eager path
instead: the input is copied into one of two slots of this rank (by call parity, like the
descriptors) and peers read the slot. The slot of call k is next written at call k+2, after
the arrival barrier of call k+1, which every peer reaches only once done reading it; so these
calls need no departure barrier, which halves their synchronisation. The copies are counted
in stats()["bytes_eager"]. Each slot has room for as many bytes again after the copy: an
all_reduce that reduces by chunks (EAGER_CHUNKS_READ) leaves its member's reduced chunk there
for the others to gather after a middle barrier, under the same parity rule.

Both thresholds are this module's policy. The fabric model times the same eager schedule, so
the runtime hands EAGER_BYTES to the models it builds (and estimate-only mode to its own):
collectives._schedule and ub._clock take it as a parameter and hold no copy of it.
"""
from __future__ import annotations

import numpy as np

from ..._errors import RegistrationError
from .. import _native
from ..memory import hbm_base
from ._args import as_flat, copy_back
from ._services import RankServices

EAGER_BYTES = 16 * 1024             # up to this, full-mesh all_gather and all_reduce take the eager path
# an eager all_reduce whose members would each read this many bytes of copies (N x the
# input) or more reduces one chunk per member instead, for one more barrier: 16 KiB at N = 32
# 750-920 -> 530-570 us, 4 KiB at N = 32 530-550 -> 480-550 us; 4 KiB at N = 8 (32 KiB read)
# measured 52-60 us whole and 60-65 us by chunks
EAGER_CHUNKS_READ = 64 * 1024


class CallInput:
    """A contiguous byte range peers may read: the caller's HBM array or a staged copy.
    ``flat`` is None in a prepared call's copy (runtime/communicator/_prepared.py), which must not keep the
    caller's array alive."""

    __slots__ = ("flat", "addr", "seg", "nbytes")

    def __init__(self, flat: np.ndarray | None, seg, addr: int | None = None, nbytes: int | None = None):
        self.flat, self.seg = flat, seg
        if flat is None:
            self.addr, self.nbytes = addr, nbytes
        else:
            self.addr = (_native.data_address(flat) if addr is None else addr) if flat.size else 0
            self.nbytes = flat.nbytes

    def in_place_of(self, x: np.ndarray) -> "CallInput | None":
        """This input without its array, if peers read ``x`` itself from a block ``x`` holds
        (zero copy, and reusable while ``x`` lives: runtime/communicator/_prepared.py); else None."""
        if self.seg is None or self.addr != _native.data_address(x) or hbm_base(x) is None:
            return None
        return CallInput(None, self.seg, self.addr, self.nbytes)


def buffer_size(nbytes: int) -> int:
    """The size a communication buffer of at least ``nbytes`` is allocated with: a power of two,
    at least 4 KiB, so a buffer that grows does so a few times, not at every new size."""
    return 1 << max(12, (max(nbytes, 1) - 1).bit_length())


class Buffers:
    """A communicator's communication buffers (staged inputs and outputs, eager slots) and
    where each operation reads and writes. Given the runtime and the slot protocol (the next
    call's parity picks the eager slot)."""

    def __init__(self, rt: RankServices, protocol):
        self._rt, self._protocol = rt, protocol
        self._always_stage = rt.config.registration == "staged"
        self._staging = None
        self._staging_out = None
        self._eager = None
        self._eager_slots: dict[tuple, CallInput] = {}    # (parity, nbytes, dtype) -> slot

    def as_input(self, x: np.ndarray, operation: str, stage: bool = False) -> CallInput:
        """Zero copy when ``x`` is contiguous and in this rank's HBM; otherwise, or if ``stage``
        (the call's output overlaps it: _args.aliased), stage it."""
        flat = as_flat(x, operation, "input")
        if flat.size == 0:
            return CallInput(flat, None)
        if flat.flags.c_contiguous and not self._always_stage and not stage:
            addr = _native.data_address(flat)
            seg = self.hbm_segment(flat, addr)
            if seg is not None:
                return CallInput(flat, seg, addr)
        self.check_mapped(flat, operation, "input")
        buf = self._staging_buffer(flat.nbytes)[:flat.nbytes].view(flat.dtype)
        np.copyto(buf, flat.reshape(-1))
        self._rt.stats["bytes_staged"] += flat.nbytes
        self._rt.stats["staged_calls"] += 1
        addr = _native.data_address(buf)
        return CallInput(buf, self._rt.own_segment(addr, buf.nbytes), addr)

    def eager_input(self, flat: np.ndarray) -> CallInput:
        """A copy of a small input in this rank's eager slot for the next call (see above)."""
        inp = self.eager_slot(self._protocol.next_parity(), flat.nbytes, flat.dtype)
        np.copyto(inp.flat, flat if flat.ndim == 1 else flat.reshape(-1))
        self._rt.stats["bytes_eager"] += flat.nbytes
        return inp

    def eager_slot(self, parity: int, nbytes: int, dtype: np.dtype) -> CallInput:
        """The eager slot of call parity ``parity`` for ``nbytes`` of ``dtype``, as an input."""
        key = (parity, nbytes, dtype)
        inp = self._eager_slots.get(key)
        if inp is None:
            if self._eager is None:      # per parity: the input copy, then room for a reduced chunk
                self._eager = self._rt.empty((4 * EAGER_BYTES,), np.uint8)
            if len(self._eager_slots) >= 64:        # a few shapes recur; do not grow without bound
                self._eager_slots.clear()
            start = parity * 2 * EAGER_BYTES
            slot = self._eager[start:start + nbytes].view(dtype)
            addr = _native.data_address(slot)
            inp = self._eager_slots[key] = CallInput(slot, self.hbm_segment(slot, addr) if nbytes else None, addr)
        return inp

    def hbm_segment(self, a: np.ndarray, addr: int):
        """The segment of this rank's HBM holding ``a``, or None. An array made by
        stratacl.empty (or a view of one) keeps its block alive, so its segment is found
        without the allocator's lock; anything else is looked up."""
        b = hbm_base(a)
        if b is not None:
            seg = b.block.seg
            if seg.va <= addr and addr + a.nbytes <= seg.va + seg.size:
                return seg
        return self._rt.own_segment(addr, a.nbytes)

    def check_mapped(self, a: np.ndarray, operation: str, what: str) -> None:
        """RegistrationError unless every byte of ``a`` that lies in the shared address window is
        mapped here: an array of ``stratacl.empty`` (or a view of one) holds its HBM, but a
        ``ub.view`` of a buffer that was freed and released (``empty_cache``) points at
        reserved, unmapped addresses, which copying from or into would fault on. Called for
        arrays read or written other than as HBM the rank holds; in ``pool`` mode the whole
        region stays mapped."""
        if a.size == 0 or hbm_base(a) is not None or self._rt.reg.mode == "pool":
            return
        try:
            lo = hi = _native.data_address(a)
        except ValueError:               # a dtype the buffer protocol does not carry (datetime64)
            lo = hi = a.__array_interface__["data"][0]
        for extent, stride in zip(a.shape, a.strides):
            if stride < 0:
                lo += (extent - 1) * stride
            else:
                hi += (extent - 1) * stride
        hi += a.itemsize
        window, rt = self._rt.window, self._rt
        owner = window.owner(lo)
        if owner < 0 and window.owner(hi - 1) < 0:
            return                       # an ordinary array, outside the window
        if owner == rt.rank:
            mapped = rt.own_segment(lo, hi - lo) is not None
        else:
            mapped = owner >= 0 and window.owner(hi - 1) == owner and rt.reg.lookup(owner, lo, hi - lo, operation)
        if not mapped:
            raise RegistrationError(
                f"{operation}: the {what} array at {lo:#x}+{hi - lo} lies in rank {owner}'s HBM addresses but is not "
                f"mapped on rank {rt.rank}: its HBM was released (a ub.view of a freed array, after empty_cache?); "
                f"keep the array from stratacl.empty alive while its views are used")

    def _staging_buffer(self, nbytes: int) -> np.ndarray:
        if self._staging is None or self._staging.nbytes < nbytes:
            self._staging = None
            self._staging = self._rt.empty((buffer_size(nbytes),), np.uint8)
        return self._staging

    def output(self, o: np.ndarray, hbm: bool = False) -> np.ndarray:
        """Where an operation writes its output: ``o`` itself when it is 1-D and contiguous
        (and, if ``hbm``, in this rank's HBM, because a ring neighbour reads it), otherwise a
        communication buffer copied out by ``output_done``; always the buffer in staged mode.
        (The caller has checked that ``o`` is mapped: ``check_mapped``.)"""
        if not self._always_stage and o.ndim == 1 and o.flags.c_contiguous:
            if not hbm or o.size == 0 or self.hbm_segment(o, _native.data_address(o)) is not None:
                return o
        if self._staging_out is None or self._staging_out.nbytes < o.nbytes:
            self._staging_out = None
            self._staging_out = self._rt.empty((buffer_size(o.nbytes),), np.uint8)
        return self._staging_out[:o.nbytes].view(o.dtype)

    def output_done(self, out: np.ndarray, target: np.ndarray, count: int | None = None) -> None:
        """Copy the output (its first ``count`` elements, if given) out of the communication
        buffer, if ``output`` chose one."""
        if target is not out and target.size and not np.may_share_memory(target, out):
            if count is None:
                copy_back(out, target)
            else:
                out.flat[:count] = target[:count]
            self._rt.stats["bytes_staged"] += (out.size if count is None else count) * out.itemsize
