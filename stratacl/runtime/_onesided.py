"""One-sided access to a communicator's members' HBM: the runtime's interface for front ends.

Shadow virtual addressing makes every rank's HBM one symmetric heap: an object allocated in
the same order on every rank sits at the same offset of each rank's slice of the shared
address window, and a peer's counterpart of my object is at the same offset of the peer's
slice, mapped here by the registration unit. A front end (``stratacl.shmem``,
``stratacl.torch.symm_mem``) goes through one ``SymmetricHeap`` per communicator:

    shmem.put(dst, src, pe, comm)                   public names only (stratacl/shmem/)
        |  heap = SymmetricHeap.of(comm)
        |  heap.remote(addr, n, pe, op)             my address -> pe's counterpart; refused
        |                                           (OneSidedError) unless the range is
        |                                           registered there: nothing is written
        |  heap.window(addr, n)[:] = bytes          the bytes, through the shadow window
        |  heap.charge_put(op, pe, n)               the rank's modeled clock (ub.RankClock,
        v                                           the fabric's tier between the two ranks)
    heap.signal(op, sig, value, sig_op, pe)         data fenced before the signal; the
    heap.wait(op, sig, cmp, value, timeout)         signaller's modeled time travels with it

Signal words live in signal pads (``signal_pad``): n u64 signal words followed by more rows of
n u64 (``PAD_ROWS``): a change counter whose low 32 bits are the futex word waiters sleep on,
the number of waiters asleep (a wake is skipped when it is 0), the last signaller's world
rank + 1 (for a timeout's message), and, with a modeled clock, an arrival log: for each of
the last ``LOG_ENTRIES`` values the word took, that value + 1 and the modeled time the update
that made it arrives at (entry ``value % LOG_ENTRIES``). A signaller stores the value, then
bumps the counter, then reads the waiters; a waiter counts itself, then sleeps only while the
counter is unchanged: whichever comes first, no wake-up is lost.

Modeled time (``--clock virtual|throttled``; nothing is charged with the clock off). Every
transfer is timed as a point-to-point pull of its bytes between the two ranks
(``RankClock.received``: the tier's latency, its bandwidth, the cores that move it):

- ``get``: blocking, the caller's clock moves to the end of the transfer;
- ``put``: the caller's clock moves by the transfer less its tier latency (the bytes have
  left; the source may be reused), the bytes land a latency later: ``quiet`` joins the latest
  landing of this rank's puts;
- ``put_signal``: a put, then the signal, which leaves behind the data (at the caller's clock
  after the put) and arrives a flag latency later (``BandwidthSharing.flag_us``: the tier's latency +
  ``sync.flag_us``), so with the data's landing; that arrival is logged under the value the
  signal makes;
- ``wait_until``: the waiter's clock becomes max(own, the arrival of the update that made the
  condition true), as at any flag; for a counter several ranks add to, the latest of the
  contributions up to that value. An update made after that one (a signaller that raced
  ahead before the waiter looked) is not waited for: the same program gives the same
  modeled times whatever the host's timing;
- atomics: a round trip of one word (request and reply); on the rank's own word, nothing;
- a rank's signal to itself arrives at once (no flag latency).
"""
from __future__ import annotations

import bisect
import operator
import time
import weakref

import numpy as np

from .._errors import OneSidedError, SignalTimeout
from ..ub import to_bits, us_from_bits
from . import _native
from ._world import runtime
from .services import SLICE

# a signal pad's rows of n u64 words: the signals, then their bookkeeping (module docstring)
PAD_SIGNAL, PAD_SEQ, PAD_WAITERS, PAD_LAST, PAD_LOG = range(5)
LOG_ENTRIES = 32            # values whose arrival a signal word remembers (a fan-in of up to 32 is exact)
PAD_ROWS = PAD_LOG + 2 * LOG_ENTRIES
SIGNAL_OPS = ("set", "add")
COMPARISONS = {"eq": operator.eq, "ne": operator.ne, "gt": operator.gt, "ge": operator.ge,
               "lt": operator.lt, "le": operator.le}
MASK64 = (1 << 64) - 1
ATOMICS = ("fetch_add", "compare_swap", "fetch", "set")

# live signal pads of this process: own base address -> (n, weak reference to the pad's block,
# the members' bases by world rank for a pad made with symmetric=False, else None)
_PADS: dict[int, tuple[int, weakref.ref, dict | None]] = {}
_PAD_BASES: list[int] = []
# the modeled time this rank's latest put lands at (quiet joins it), per runtime
_LANDING: dict[int, float] = {}


def address_of(a: np.ndarray) -> int:
    """The address of an array's first byte."""
    return int(a.__array_interface__["data"][0])


class SymmetricHeap:
    """One communicator's members' HBM seen as a symmetric heap (see the module docstring).

    ``rank``, ``size``, ``members`` as the communicator's; ``pe`` arguments are its ranks."""

    _of: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def __init__(self, comm):
        self._rt = runtime()
        self.members = list(comm.members)
        self.rank, self.size = comm.rank, comm.size
        self.me = self.members[self.rank]
        self.comm = comm

    @classmethod
    def of(cls, comm=None) -> "SymmetricHeap":
        """The heap of ``comm`` (None: the world communicator), made once per communicator."""
        if comm is None:
            comm = runtime().world_comm
        heap = cls._of.get(comm)
        if heap is None or heap._rt is not runtime():
            heap = cls._of[comm] = cls(comm)
        return heap

    @property
    def timeout(self) -> float:
        """The communication timeout (``STRATACL_TIMEOUT``), the default of every wait."""
        return float(self._rt.config.timeout)

    # --- addresses ----------------------------------------------------------------------------
    def peer(self, pe, op: str, addr: int | None = None) -> int:
        """The world rank of communicator rank ``pe``; OneSidedError (naming ``addr``, the
        address the call was for, if given) if it is out of range."""
        at = "" if addr is None else f" (for address {addr:#x})"
        try:
            p = operator.index(pe)
        except TypeError:
            raise OneSidedError(f"{op}: rank {self.rank}: the peer must be an int, got {pe!r}{at}", op, None,
                                addr) from None
        if not 0 <= p < self.size:
            raise OneSidedError(f"{op}: rank {self.rank}: peer {p} is out of range{at}: the communicator has ranks "
                                f"0..{self.size - 1}", op, p, addr)
        if self._rt.hosts.spanned:
            self._rt.hosts.refuse_peers(op, [self.members[p]], "one-sided calls")
        return self.members[p]

    def remote(self, addr: int, nbytes: int, pe: int, op: str, align: int = 1) -> int:
        """The address of peer ``pe``'s counterpart of [addr, addr + nbytes): ``addr`` is in
        this rank's slice of the window (a symmetric address: the same offset in pe's slice),
        or already in pe's. Refused (OneSidedError naming the peer and the address) unless
        the whole range is registered memory of pe that this rank can reach, or ``addr`` is
        not a multiple of ``align``."""
        world = self.peer(pe, op, addr)
        w = self._rt.window
        owner = w.owner(addr)
        if owner == self.me:
            target = self.translate(addr, world)
        elif owner == world:
            target = addr
        else:
            whose = "outside the shared address window" if owner < 0 else f"in world rank {owner}'s slice"
            raise OneSidedError(f"{op}: rank {self.rank} -> peer {pe}: address {addr:#x} is {whose}; name a "
                                f"symmetric object by this rank's own address (or by peer {pe}'s)", op, pe, addr)
        if target % align:
            raise OneSidedError(f"{op}: rank {self.rank} -> peer {pe}: address {target:#x} is not aligned to "
                                f"{align} bytes (a 64-bit atomic needs an 8-byte aligned word)", op, pe, target)
        if nbytes <= 0:
            return target
        if w.owner(target + nbytes - 1) != world:
            ok = False
        elif world == self.me:
            ok = self._rt.own_segment(target, nbytes) is not None
        else:
            ok = self._rt.reg.lookup(world, target, nbytes, op)
        if not ok:
            hint = ("; registration=jit maps a peer's buffer only when an operator first reads it: use roa or pool "
                    "for one-sided calls" if self._rt.config.registration == "jit" else
                    "; allocate symmetric objects with shmem.empty/zeros, in the same order on every rank")
            raise OneSidedError(f"{op}: rank {self.rank} -> peer {pe}: {target:#x}+{nbytes} is not inside a "
                                f"registered HBM range of peer {pe} (world rank {world}){hint}", op, pe, target)
        return target

    def window(self, addr: int, nbytes: int) -> np.ndarray:
        """The bytes [addr, addr + nbytes) of the shadow window (checked by ``remote`` first)."""
        return self._rt.window.view(addr, nbytes)

    def allocate(self, shape, dtype, op: str) -> np.ndarray:
        """A symmetric HBM array: allocated here, then checked to sit at the same offset of
        every member's slice (an allgather of the offsets). Collective, host-blocking."""
        a = self._rt.empty(shape, dtype)
        self.check_symmetric(address_of(a) if a.nbytes else 0, op)
        return a

    def check_symmetric(self, addr: int, op: str) -> None:
        """Every member's ``addr`` is at the same offset of its slice (0: an empty array, not
        compared). Collective; raises OneSidedError on every member if not."""
        w = self._rt.window
        off = np.array([addr - w.slice_start(self.me) if addr else -1], dtype=np.int64)
        offs = np.zeros(self.size, dtype=np.int64)
        self.comm.all_gather(offs, off)
        if len(set(offs.tolist())) > 1:
            raise OneSidedError(f"{op}: the members' allocations are not symmetric: offsets in their slices "
                                f"{offs.tolist()} (by rank); allocate symmetric objects in the same order and "
                                f"sizes on every rank", op, None, addr)

    # --- signal pads --------------------------------------------------------------------------
    def signal_pad(self, n: int, op: str = "signal_pad", symmetric: bool = True) -> np.ndarray:
        """``n`` u64 signal words, zeroed (collective, ends with a barrier). ``symmetric``: the
        pad must sit at the same offset of every member's slice (checked); otherwise the
        members' addresses are exchanged and the pad's words translate through them."""
        n = operator.index(n)
        if n < 1:
            raise ValueError(f"{op}: a signal pad needs at least one word, got {n}")
        block = self._rt.empty((PAD_ROWS, n), np.uint64)
        block[...] = 0
        base = address_of(block)
        peers = None
        if symmetric:
            self.check_symmetric(base, op)
        else:
            bases = np.zeros(self.size, dtype=np.int64)
            self.comm.all_gather(bases, np.array([base], dtype=np.int64))
            peers = dict(zip(self.members, bases.tolist()))
        _forget_dead_pads()
        _PADS[base] = (n, weakref.ref(block), peers)
        bisect.insort(_PAD_BASES, base)
        self.comm.barrier()          # every member's pad is zero before anyone signals into it
        return block[PAD_SIGNAL]

    @staticmethod
    def _pad_at(addr: int) -> tuple[int, int, dict | None] | None:
        """(base, n, peers' bases) of this process's live pad whose block holds ``addr``."""
        i = bisect.bisect_right(_PAD_BASES, addr) - 1
        if i < 0:
            return None
        base = _PAD_BASES[i]
        n, ref, peers = _PADS[base]
        if ref() is None or not base <= addr < base + 8 * PAD_ROWS * n:
            return None
        return base, n, peers

    def translate(self, addr: int, world: int) -> int:
        """World rank ``world``'s counterpart of this rank's address ``addr``: the same offset
        of its slice, or for a pad made with symmetric=False, the same offset of its pad."""
        w = self._rt.window
        pad = self._pad_at(addr)
        if pad is not None and pad[2] is not None:
            return pad[2][world] + (addr - pad[0])
        return addr - w.slice_start(self.me) + w.slice_start(world)

    def untranslate(self, target: int, world: int) -> int:
        """This rank's address of world rank ``world``'s address ``target`` (``translate``'s inverse)."""
        for base, (n, ref, peers) in _PADS.items():
            if peers is not None and ref() is not None and peers[world] <= target < peers[world] + 8 * PAD_ROWS * n:
                return base + (target - peers[world])
        w = self._rt.window
        return target - w.slice_start(world) + w.slice_start(self.me)

    def pad_word(self, addr: int, op: str) -> tuple[int, int] | None:
        """(this rank's pad base, n) of the live pad whose signal words hold ``addr``, or None."""
        pad = self._pad_at(addr)
        if pad is None or addr >= pad[0] + 8 * pad[1]:
            return None
        return pad[0], pad[1]

    def signal_words(self, sig: int, pe: int, op: str) -> tuple[int, int]:
        """(peer ``pe``'s address of signal word ``sig``, the pad's row stride in bytes): ``sig``
        is this rank's (or pe's) address of a signal pad's word; OneSidedError otherwise."""
        w = self._rt.window
        mine = sig
        if w.owner(sig) != self.me:
            world = self.peer(pe, op, sig)
            if w.owner(sig) == world:
                mine = self.untranslate(sig, world)
        found = self.pad_word(mine, op)
        if found is None or (mine - found[0]) % 8:
            raise OneSidedError(f"{op}: rank {self.rank} -> peer {pe}: {sig:#x} is not a word of a live signal pad "
                                f"(make signal words with shmem.signal_pad)", op, pe, sig)
        base, n = found
        pad = self.remote(base, 8 * PAD_ROWS * n, pe, op, align=8)
        return pad + (mine - base), 8 * n

    # --- modeled time -------------------------------------------------------------------------
    def _transfer_us(self, src: int, dst: int, nbytes: int, t0: float) -> float:
        """When ``nbytes`` moved from world rank ``src`` to ``dst`` from ``t0`` are in place."""
        return self._rt.clock.received(src, dst, nbytes, float("-inf"), t0)

    def charge_put(self, op: str, pe: int, nbytes: int) -> float | None:
        """A put of ``nbytes`` to ``pe``: the caller's clock moves past the bytes' departure;
        returns when they land (None with the clock off)."""
        c = self._rt.clock
        if c is None:
            return None
        world = self.members[pe]
        t0 = c.entering()
        land = self._transfer_us(self.me, world, nbytes, t0)
        f = c.model.fabric
        alpha = float(f.latency[int(f.tier_of(self.me, world))]) if nbytes else 0.0
        c.set(op, max(t0, land - alpha))
        key = id(self._rt)
        _LANDING[key] = max(_LANDING.get(key, 0.0), land)
        return land

    def charge_get(self, op: str, pe: int, nbytes: int) -> None:
        c = self._rt.clock
        if c is not None:
            t0 = c.entering()
            c.set(op, self._transfer_us(self.members[pe], self.me, nbytes, t0))

    def charge_atomic(self, op: str, pe: int) -> None:
        """A remote atomic with a reply: one word there, one back. On this rank's own word
        it is a local memory access: not charged."""
        c = self._rt.clock
        if c is not None and self.members[pe] != self.me:
            world, t0 = self.members[pe], c.entering()
            c.set(op, self._transfer_us(world, self.me, 8, self._transfer_us(self.me, world, 8, t0)))

    @staticmethod
    def fence() -> None:
        """Order this rank's stores: every transfer here is complete on return, so a full
        memory fence orders them as seen from every peer."""
        _native.fence()

    def quiet(self, op: str = "quiet") -> None:
        """Every put of this rank has landed: a fence, and the clock joins their latest landing."""
        _native.fence()
        c = self._rt.clock
        if c is not None:
            land = _LANDING.get(id(self._rt), 0.0)
            c.set(op, max(c.entering(), land))

    # --- signals ------------------------------------------------------------------------------
    @staticmethod
    def check_sig_op(op: str, sig_op: str) -> None:
        if sig_op not in SIGNAL_OPS:
            raise ValueError(f"{op}: sig_op must be one of {SIGNAL_OPS}, got {sig_op!r}")

    def signal(self, op: str, words: tuple[int, int], value: int, sig_op: str, pe: int) -> None:
        """Update peer ``pe``'s signal word (``words``: what ``signal_words`` returned) by
        ``sig_op`` (``set`` or ``add``) ``value``, after every store this rank made before (a
        full fence)."""
        self.check_sig_op(op, sig_op)
        target, stride = words
        value = int(value) & MASK64
        self.update(target, stride, pe, lambda old: value if sig_op == "set" else (old + value) & MASK64)

    def update(self, target: int, stride: int, pe: int, new_value, expect: int | None = None) -> int:
        """Change peer ``pe``'s signal word at ``target`` to ``new_value(old)`` atomically (only
        if it holds ``expect``, when given) and return the old value. Before the word changes:
        a fence (every earlier store of this rank is visible first), the signaller noted, and
        with a modeled clock the new value's arrival (now + the flag latency) in the word's
        log. After: its change counted, its waiters woken."""
        _native.fence()
        c = self._rt.clock
        arrival = None
        if c is not None:
            world = self.members[pe]
            arrival = to_bits(c.entering() + (float(c.model.fabric.flag_us(self.me, world)) if world != self.me else 0.0))
            key = id(self._rt)
            _LANDING[key] = max(_LANDING.get(key, 0.0), us_from_bits(arrival))
        _native.store_u64(target + PAD_LAST * stride, self.me + 1)
        old = _native.load_u64(target)
        while True:
            if expect is not None and old != expect:
                return old
            new = new_value(old)
            if arrival is not None:
                # logged before the word changes: a waiter that sees the value finds its arrival
                slot = target + (PAD_LOG + 2 * (new % LOG_ENTRIES)) * stride
                _native.store_u64(slot + stride, arrival)
                _native.store_u64(slot, (new + 1) & MASK64)
            got = _native.cas_u64(target, old, new)
            if got == old:
                break
            old = got
        self.bump(target, stride)
        return old

    @staticmethod
    def bump(target: int, stride: int) -> None:
        """A signal word changed: count the change, wake its waiters if any sleep."""
        seq = target + PAD_SEQ * stride
        _native.fetch_add_u64(seq, 1)
        if _native.load_u64(target + PAD_WAITERS * stride):
            _native.futex_wake(seq, 0x7FFFFFFF)

    @staticmethod
    def arrival(sig: int, stride: int, cmp: str, value: int, seen: int) -> float | None:
        """The modeled time the condition (``cmp`` ``value``) became true on this rank's word
        ``sig``, which now holds ``seen``: for a rising condition (eq, ge, gt) the latest
        arrival among the logged values up to the first that satisfies it (a fan-in's last
        contribution; a later update, made while this rank had not looked yet, is not waited
        for); otherwise the arrival of the value seen. None if the log holds none of them."""
        def logged(v: int) -> float | None:
            slot = sig + (PAD_LOG + 2 * (v % LOG_ENTRIES)) * stride
            if _native.load_u64(slot) != (v + 1) & MASK64:
                return None
            return us_from_bits(_native.load_u64(slot + stride))
        if cmp not in ("eq", "ge", "gt"):
            return logged(seen)
        first = value + 1 if cmp == "gt" else value
        hit = logged(first)
        k = first
        while hit is None and k < min(seen, first + LOG_ENTRIES):       # the word jumped past `first`
            k += 1
            hit = logged(k)
        if hit is None:
            return None
        below = [t for v in range(max(0, first - LOG_ENTRIES + 1), first) if (t := logged(v)) is not None]
        return max([hit, *below])

    def wait(self, op: str, sig: int, cmp: str, value: int, timeout: float | None) -> int:
        """Sleep (in the kernel) until this rank's signal word ``sig`` compares ``cmp`` to
        ``value``; then the clock joins the signal's arrival. Returns the value seen."""
        test = COMPARISONS.get(cmp)
        if test is None:
            raise ValueError(f"{op}: cmp must be one of {sorted(COMPARISONS)}, got {cmp!r}")
        value = int(value) & MASK64
        w = self._rt.window
        if w.owner(sig) != self.me:
            raise OneSidedError(f"{op}: rank {self.rank} waits on its own signal words; {sig:#x} is not in its "
                                f"slice", op, self.rank, sig)
        found = self.pad_word(sig, op)
        if found is None or (sig - found[0]) % 8:
            raise OneSidedError(f"{op}: rank {self.rank}: {sig:#x} is not a word of a live signal pad (make signal "
                                f"words with shmem.signal_pad)", op, self.rank, sig)
        stride = 8 * found[1]
        seq, waiters = sig + PAD_SEQ * stride, sig + PAD_WAITERS * stride
        timeout = self.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + timeout
        health = self._rt.health
        while True:
            seen_seq = _native.load_u32(seq)
            v = _native.load_u64(sig)
            if test(v, value):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                last = _native.load_u64(sig + PAD_LAST * stride)
                peer = self.members.index(last - 1) if last and (last - 1) in self.members else None
                by = f"last updated by peer {peer}" if peer is not None else "never updated"
                raise SignalTimeout(f"{op}: rank {self.rank} waited {timeout:g} s for its signal word {sig:#x} to be "
                                    f"{cmp} {value}; it holds {v} ({by})", op, peer, sig)
            _native.fetch_add_u64(waiters, 1)
            try:
                _native.futex_wait(seq, seen_seq, min(SLICE, left))
            finally:
                _native.fetch_add_u64(waiters, MASK64)
            health.check(op, [])
        _native.fence()
        c = self._rt.clock
        if c is not None:
            t = self.arrival(sig, stride, cmp, value, v)
            c.set(op, c.entering() if t is None else max(c.entering(), t))
        return v

    # --- atomics ------------------------------------------------------------------------------
    def atomic(self, op: str, kind: str, addr: int, pe: int, a: int = 0, b: int = 0) -> int:
        """A 64-bit atomic on peer ``pe``'s word ``addr`` (8-byte aligned): ``fetch_add`` a,
        ``compare_swap`` (expected a, desired b), ``fetch``, ``set`` a. Returns the old value.
        On a signal pad's word it counts as a signal (its waiters wake)."""
        target = self.remote(addr, 8, pe, op, align=8)
        a, b = int(a) & MASK64, int(b) & MASK64
        if kind not in ATOMICS:
            raise ValueError(f"{op}: unknown atomic {kind!r} (one of {ATOMICS})")
        if kind != "fetch":
            # a signal pad's word: the update is a signal (logged, its waiters woken)
            mine = self.untranslate(target, self.members[pe])
            found = self.pad_word(mine, op)
            if found is not None and (mine - found[0]) % 8 == 0:
                stride = 8 * found[1]
                if kind == "fetch_add":
                    old = self.update(target, stride, pe, lambda o: (o + a) & MASK64)
                elif kind == "compare_swap":
                    old = self.update(target, stride, pe, lambda o: b, expect=a)
                else:
                    old = self.update(target, stride, pe, lambda o: a)
                self.charge_atomic(op, pe)
                return int(old)
        if kind == "fetch_add":
            old = _native.fetch_add_u64(target, a)
        elif kind == "compare_swap":
            old = _native.cas_u64(target, a, b)
        elif kind == "fetch":
            old = _native.load_u64(target)
        else:
            old = _native.load_u64(target)
            _native.store_u64(target, a)
        self.charge_atomic(op, pe)
        return int(old)


def _forget_dead_pads() -> None:
    dead = [b for b, (_, ref, _) in _PADS.items() if ref() is None]
    for b in dead:
        del _PADS[b]
        _PAD_BASES.remove(b)
