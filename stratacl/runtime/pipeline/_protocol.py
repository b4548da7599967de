"""A communicator's slot protocol: descriptors, barriers, agreement, and the messages of a mismatch.

Every operation on a communicator is numbered, and every member publishes a descriptor of it
in its slot of the control segment (runtime/services/_control.py, ``Layout.slot``) before arriving at
the operation's entry barrier:

    publish descriptor {op, dtype, count, root, reduce op, input address and segment, call}
        |   (a rank that rejects its own arguments writes why, Layout.slot_reason, and flags it)
    arrive at barrier k  -> every member reads every descriptor; any disagreement raises
        |                   CollectiveMismatch on every rank, before any byte moves
    ... the operation (runtime/communicator/_mesh.py for the full-mesh calls) ...
    departure barrier    -> inputs may be reused once it returns

The numbering of the calls and of the barriers (the communicator's T_CALLS and T_SYNCS words)
is native code's alone (_native.c: ``enter``, ``sync``, the mesh machine, the barrier method):
a barrier is numbered as this rank arrives at it, so after an error every rank saw (a
mismatch) the members still agree on the numbers. Python here waits, with the job's health
checked between sleeps, where native code stopped waiting, and builds the messages.

``SlotProtocol`` is one component of a Communicator (runtime/communicator/_comm.py): it owns the slot's words
and the counts native code keeps (``cx``, ``tally``), and the other components ask it for
descriptors, extension words and reasons rather than computing slot offsets of their own.

Descriptors are double-buffered by call parity: a rank can only overwrite the slot of call k
after the arrival barrier of call k+1, which every peer reaches only once it has read call
k's descriptors.
"""
from __future__ import annotations

import array
import logging
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..._errors import CollectiveMismatch
from ..._operators import OPERATORS
from ...collectives import DTYPE_BY_CODE, REDUCE_NAMES, int64_word
from .. import _native
from .._native import T_CALLS, T_NATIVE, T_SYNCS
from ..services import (
    DESC_FIXED, EXT_WORDS_EXTRA, F_AUX0, F_COUNT, F_DTYPE, F_FLAGS, F_OP, F_REDOP, F_ROOT, FLAG_REJECTED, SLICE,
    SPIN_POLLS, WORLD_INIT_CALLS, Layout, wait_until,
)
from ._services import RankServices
from ._work import agreed

if TYPE_CHECKING:
    from ._buffers import CallInput

log = logging.getLogger("stratacl")

# every operation code of a call's descriptor, from the operator table (point to point has its own
# descriptors: runtime/communicator/_p2p.py)
OPS = {op.name: op.code for op in OPERATORS if op.family != "p2p"}
# every code a member's descriptor can hold, point to point's too, by name: a message names them
OP_NAMES = {op.code: op.name for op in OPERATORS}
_SLICE_MAP = OPS["slice_map"]       # the code of any other name: a user's slice map (stratacl.fabric)

_COMPARED = ((F_DTYPE, "dtype"), (F_COUNT, "element count"), (F_ROOT, "root"), (F_REDOP, "reduce op"))


def _value_name(field: int, v: int) -> str:
    if field == F_OP:
        if v == 0:
            return "no call (its descriptor is empty)"
        return OP_NAMES.get(v, f"an unknown operation (code {v})")
    if field == F_DTYPE:
        dt = DTYPE_BY_CODE.get(v)
        return str(dt) if dt is not None else "-"
    if field == F_REDOP:
        return REDUCE_NAMES.get(v, "-")
    return str(v)


def descriptor(operation: str, dtype: int, count: int, root: int, redop: int, inp: "CallInput | None", clock: int,
               aux1: int) -> tuple:
    """A descriptor's fields, F_* order (F_CALL 0: native code numbers the call)."""
    seg = inp.seg if inp is not None else None
    if seg is not None:
        return (OPS.get(operation, _SLICE_MAP), dtype, count, root, redop, 0, inp.addr, inp.nbytes, seg.va, seg.size,
                seg.hbm_offset, seg.epoch, clock, aux1, 0, 0)
    addr, nbytes = (inp.addr, inp.nbytes) if inp is not None else (0, 0)
    return (OPS.get(operation, _SLICE_MAP), dtype, count, root, redop, 0, addr, nbytes, 0, 0, 0, 0, clock, aux1, 0, 0)


class SlotProtocol:
    """A communicator's slot protocol: every member's slot words, the counts native code
    keeps, and the protocol steps on them (publish, barriers, agreement, the mismatch's
    message). Given the runtime, the members and their slots, the byte counters native code
    adds to, and the modeled clock (``Modeling``) whose entering time each descriptor carries.

    ``cx`` is everything native code needs, as one int64 array (_native.h, CX_*); ``tally``,
    ``root_calls`` the counts it updates in place; ``lay`` and ``slot_offs`` (every member's
    slot offset in the control segment) name the other words of a slot (point-to-point, ring
    steps, a root's departure)."""

    def __init__(self, rt: RankServices, members: list[int], rank: int, slots: Sequence[int], counters: array.array, modeling):
        self._rt = rt
        self._entering_bits = modeling.entering_bits
        self._members, self._rank, self._size = members, rank, len(members)
        n = self._size
        lay: Layout = rt.ctl.layout
        self.lay = lay
        base = rt.ctl.base
        self.slot_offs = [lay.slot(m, s) for m, s in zip(members, slots)]
        # messages number the program's calls from 1: on the world, init()'s barrier is not one
        self.init_calls = WORLD_INIT_CALLS if self.slot_offs[0] == lay.world_slot() else 0
        me = self.slot_offs[rank]
        self._counter_addr = base + self.slot_offs[0] + Layout.SLOT_COUNTER
        self._gen_addr = base + self.slot_offs[0] + Layout.SLOT_GEN
        self._arrival_idx = np.array([(o + Layout.SLOT_ARRIVAL) // 4 for o in self.slot_offs])
        self._desc_off = [me + lay.slot_desc(p) for p in (0, 1)]
        # word indices of every member's descriptor, per parity: built with numpy, as a Python
        # loop over N members x 2N extension words cost O(N^2) per rank (0.3 s at N = 256)
        self._desc_base = [(np.array(self.slot_offs, dtype=np.int64) + lay.slot_desc(p)) // 8 for p in (0, 1)]
        self._desc_idx = [b[:, None] + np.arange(DESC_FIXED) for b in self._desc_base]
        self._ext_idx = None    # N x (2N + EXT_WORDS_EXTRA) per parity: made by extensions() when first read
        desc_addrs = [base + o + lay.slot_desc(p) for p in (0, 1) for o in self.slot_offs]
        # The counts native code updates in place, as int64 words: calls, barriers, whether the
        # native methods may run (T_*); rooted operations per root (the mesh machine's rooted
        # departures); point-to-point sequence numbers per peer. As attributes, each update was
        # a lookup, a new int object and the old one's free, paid per call and rank.
        self.tally = array.array("q", bytes(8 * _native.T_WORDS))
        self.tally[T_NATIVE] = int(rt.clock is None)
        self.root_calls = array.array("q", bytes(8 * n))
        self._sent = array.array("q", bytes(8 * n))
        self._received = array.array("q", bytes(8 * n))
        cx = self.cx = np.zeros(_native.CX_DESC + 2 * n, dtype=np.int64)
        cx[_native.CX_COUNTER], cx[_native.CX_GEN] = self._counter_addr, self._gen_addr
        cx[_native.CX_ARRIVAL] = base + me + Layout.SLOT_ARRIVAL
        cx[_native.CX_N], cx[_native.CX_ME] = n, rank
        cx[_native.CX_TALLY] = _native.data_address(self.tally)
        cx[_native.CX_ROOTS] = _native.data_address(self.root_calls)
        cx[_native.CX_SENT] = _native.data_address(self._sent)
        cx[_native.CX_RECEIVED] = _native.data_address(self._received)
        cx[_native.CX_COUNTERS] = _native.data_address(counters)
        cx[_native.CX_BARRIERS] = rt.native_call_word("barrier")
        cx[_native.CX_FLIGHT] = base + lay.flight(rt.rank)       # runtime/services/_flight.py
        cx[_native.CX_CTL] = base
        # across hosts (runtime/hosts/_carrier.py): the counter counts this host's members, and the host's
        # carrier completes the barrier; a communicator within one host never involves it
        local, queue, entry = rt.hosts.barrier_words(members, slots, rank)
        cx[_native.CX_LOCAL_N] = n if local is None else local
        cx[_native.CX_CARRIER], cx[_native.CX_CARRIER_ID] = queue, entry
        self.carried = bool(queue)       # the barriers of this communicator cross hosts
        if self.carried:                 # the communicator's card, for this host's carrier
            at = (me + lay.slot_members()) // 4
            rt.ctl.i32[at + 1:at + 1 + n] = members
            rt.ctl.i32[(me + lay.slot_slots()) // 4:][:n] = slots
            rt.ctl.i32[at] = n
            if any(slots):
                # a communicator other than the world (whose words the carrier knows from the
                # start): the carrier reads the card and carries this member's point-to-point
                # words from now on; its words are all 0 until this member's first call
                _native.carrier_post(cx, 0)
        cx[_native.CX_DESC:] = desc_addrs
        if rank == 0:                   # who the members are, for the flight recorder's reader
            at = (self.slot_offs[0] + lay.slot_members()) // 4
            rt.ctl.i32[at + 1:at + 1 + n] = members
            rt.ctl.i32[at] = n

    # read-only here: native code numbers (see the module docstring)
    calls = int64_word("tally", T_CALLS, "Operations called on this communicator; they number the descriptors.",
                       writable=False)
    syncs = int64_word("tally", T_SYNCS, "Barriers arrived at (barrier k completes when the counter reaches k "
                       "times the size).", writable=False)

    def next_parity(self) -> int:
        """The descriptor slot the next call publishes in."""
        return (self.calls + 1) & 1

    def descriptors(self, parity: int) -> np.ndarray:
        """Every member's descriptor of the call of ``parity``, a row each (F_*)."""
        return self._rt.ctl.i64[self._desc_idx[parity]]

    def descriptor(self, parity: int, i: int) -> np.ndarray:
        """Member ``i``'s descriptor of the call of ``parity``."""
        return self._rt.ctl.i64[self._desc_idx[parity][i]]

    def extensions(self, parity: int) -> np.ndarray:
        """Every member's extension words of the call of ``parity`` (2 N + EXT_WORDS_EXTRA each),
        a row each."""
        if self._ext_idx is None:
            words = np.arange(DESC_FIXED, DESC_FIXED + 2 * self._size + EXT_WORDS_EXTRA)
            self._ext_idx = [b[:, None] + words for b in self._desc_base]
        return self._rt.ctl.i64[self._ext_idx[parity]]

    def words_of(self, i: int, parity: int) -> np.ndarray:
        """Member ``i``'s descriptor of ``parity`` with its extension words (a view: F_* fields,
        then from DESC_FIXED the extension)."""
        off = (self.slot_offs[i] + self.lay.slot_desc(parity)) // 8
        return self._rt.ctl.i64[off:off + DESC_FIXED + 2 * self._size]

    def publish_extension(self, parity: int, words) -> None:
        """Write this rank's extension words of its descriptor of ``parity``, from the first."""
        off = self._desc_off[parity] // 8 + DESC_FIXED
        self._rt.ctl.i64[off:off + len(words)] = words

    def put_reason(self, which: int, error: BaseException) -> None:
        """Why this rank rejected its arguments, in its slot's reason ``which`` (Layout.slot_reason)."""
        self._rt.ctl.put_reason(self.slot_offs[self._rank] + self.lay.slot_reason(which), error)

    def reason(self, i: int, which: int) -> str:
        """What member ``i`` wrote in its slot's reason ``which``."""
        return self._rt.ctl.reason(self.slot_offs[i] + self.lay.slot_reason(which))

    # --- barriers ---------------------------------------------------------------------------
    def sync(self, operation: str) -> None:
        """The next barrier: arrive, then a yielding spin and futex sleeps in native code, then
        waits with health checks here."""
        k = _native.sync(self.cx, SPIN_POLLS, SLICE)
        if k < 0:
            self.wait_barrier(-k, operation)

    def wait_barrier(self, k: int, operation: str) -> None:
        """Barrier k, already arrived at: keep waiting, checking the job's health between sleeps."""
        target = k * self._size
        u32 = self._rt.ctl.u32

        def missing():
            arr = u32[self._arrival_idx]
            return [self._members[i] for i in range(self._size) if not _native.seq_reached(int(arr[i]), k)]

        counter, gen = self._counter_addr, self._gen_addr
        if self.carried:           # the host's carrier sets the generation word once every host arrived
            def done():
                return _native.seq_reached(_native.load_u32(gen), k)
        else:
            def done():
                return _native.load_u64(counter) >= target
        wait_until(done, gen, self._rt.health, operation, self._rt.config.timeout, missing,
                   f"{self._size} ranks to arrive")

    def wait_root(self, operation: str, word: int, target: int) -> None:
        """A root's departure: wait, with health checks, for every reader to have counted itself
        done on ``word`` (in the root's slot) up to ``target``."""
        if not _native.wait_seq_u32(word, target, SPIN_POLLS, SLICE):
            wait_until(lambda: _native.seq_reached(_native.load_u32(word), target), word, self._rt.health,
                       operation, self._rt.config.timeout,
                       list,    # who is late is not recorded; the health check names a dead rank
                       f"the other {self._size - 1} ranks to finish reading this root's buffer")

    # --- entry: publish, arrive, agree ------------------------------------------------------
    def enter(self, operation: str, dtype: int = 0, count: int = 0, root: int = 0, redop: int = 0,
              inp: "CallInput | None" = None, aux1: int = 0, *, ext=None, aux: tuple | None = None,
              error: BaseException | None = None) -> int:
        """The one entry of every call: publish this rank's descriptor of the next call (the
        dtype code, element ``count``, ``root`` and reduce op code ``redop`` every member must
        agree on, the input ``inp``, F_AUX1 ``aux1``; ``ext`` its extension words; ``aux`` the
        F_AUX0-2 words in place of the modeled clock and ``aux1``, as split's), arrive, wait,
        agree: one native call in the common case. Returns the call's slot parity; raises on
        a disagreement. ``error``: this rank rejected its arguments; the descriptor says so
        and ``error`` is raised here once the peers know why."""
        if error is not None:
            fields = [0] * DESC_FIXED
            fields[F_OP] = OPS.get(operation, OPS["slice_map"])
            fields[F_FLAGS] = FLAG_REJECTED
            fields[F_AUX0] = 0 if operation == "split" else self._entering_bits()
            self.put_reason(self.next_parity(), error)
        else:
            fields = descriptor(operation, dtype, count, root, redop, inp,
                                0 if aux is not None or operation == "split" else self._entering_bits(), aux1)
            if aux is not None:
                fields = (*fields[:F_AUX0], *aux, *fields[F_AUX0 + len(aux):])
        if ext is not None:
            self.publish_extension(self.next_parity(), ext)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s call %d: %s", operation, self.calls + 1, list(fields))
        status, parity, k = _native.enter(self.cx, SPIN_POLLS, SLICE, tuple(fields))
        if error is not None:
            if status == 1:
                self.wait_barrier(k, operation)
                _native.agree(self.cx, parity)
            raise agreed(error)
        if status:
            self.arrived(operation, parity, k, status)
        return parity

    def arrived(self, operation: str, parity: int, k: int, status: int) -> None:
        """After an entry's ``status`` 1 (still waiting) or 2 (a disagreement): wait with health
        checks, compare; raises on a disagreement."""
        if status == 1:
            self.wait_barrier(k, operation)
            status = 0 if _native.agree(self.cx, parity) else 2
        if status:
            self.validate(operation, parity)   # raises

    def finish(self, operation: str, departure: bool = True) -> None:
        """Departure barrier (unless nobody can still be reading this rank's input), then stats."""
        if departure:
            self.sync(operation)
        s = self._rt.stats
        s["calls"][operation] = s["calls"].get(operation, 0) + 1

    # --- a disagreement's message -----------------------------------------------------------
    def validate(self, operation: str, parity: int) -> None:
        """Raise CollectiveMismatch if the descriptors of slot ``parity`` disagree or one is
        flagged: the rejecting ranks' own errors, or the first field the ranks differ on."""
        descs = self.descriptors(parity)
        # one vectorised comparison; the message is built only on a mismatch
        if not (descs[:, F_OP:F_FLAGS + 1] != descs[0, F_OP:F_FLAGS + 1]).any() and not descs[0, F_FLAGS]:
            return
        rejected = np.nonzero(descs[:, F_FLAGS] & FLAG_REJECTED)[0].tolist()
        if rejected:
            raise CollectiveMismatch(self._rejection(operation, rejected, parity),
                                     tuple(self._members[i] for i in rejected))
        for field, label in ((F_OP, "operation"), *_COMPARED):
            col = descs[:, field]
            if (col != col[0]).any():
                groups: dict[int, list[int]] = {}
                for i, v in enumerate(col.tolist()):
                    groups.setdefault(v, []).append(self._members[i])
                seen = "; ".join(f"rank(s) {rs}: {_value_name(field, v)}" for v, rs in groups.items())
                raise CollectiveMismatch(
                    f"{operation}: ranks disagree on the {label} of call #{self.calls - self.init_calls} on this "
                    f"communicator ({seen}); no data was moved")

    def _rejection(self, operation: str, rejected: list[int], parity: int) -> str:
        """The peers' message for members ``rejected`` (indices) having rejected their arguments
        in the call of ``parity``: each one's own error, as it wrote it (Layout.slot_reason)."""
        why = [(self._members[i], self.reason(i, parity) or "(see the error raised there)") for i in rejected]
        if len(why) == 1:
            return f"{operation}: rank {why[0][0]} rejected its arguments: {why[0][1]}; no data was moved"
        shown = "; ".join(f"rank {r}: {text}" for r, text in why[:4])
        more = f"; and {len(why) - 4} more" if len(why) > 4 else ""
        return (f"{operation}: ranks {[r for r, _ in why]} rejected their arguments ({shown}{more}); "
                f"no data was moved")
