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

Signal words live in signal pads (``signal_pad``; their layout and the one way a word is
updated: runtime/services/_pads.py): n u64 signal words, then a change counter waiters sleep
on, the number of waiters, the last signaller, and an arrival log of the modeled time each
recent value arrives at.

A peer on another host (a job over hosts: runtime/hosts/_hosts.py) has no window here that
loads and stores reach: its bytes move through this host's carrier (``HostMap.far_put``,
``far_get``), its words are updated by its own host's carrier (``far_update``), each call
done when it returns, so the ordering rules hold as on one host. What the carrier is given
is where the bytes are in the peer's HBM segment, which only the peer's allocator knows: so
a far peer is reached in symmetric objects whose placement every member shared when they
were made (``exchange``: ``allocate``, ``signal_pad``, and ``shmem.buffer_register``), and
refused elsewhere. A view of a far peer's memory (``shmem.peer_view``) is refused and
``shmem.ptr`` gives 0 for it (nvshmem_ptr's NULL: no load/store path).

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
from .memory import hbm_runs
from .services import (
    LOG_ENTRIES, MASK64, PAD_LAST, PAD_LOG, PAD_ROWS, PAD_SEQ, PAD_SIGNAL, PAD_WAITERS, SLICE, UPDATES, update_word,
)

SIGNAL_OPS = ("set", "add")
COMPARISONS = {"eq": operator.eq, "ne": operator.ne, "gt": operator.gt, "ge": operator.ge,
               "lt": operator.lt, "le": operator.le}
ATOMICS = UPDATES

# live signal pads of this process: own base address -> (n, weak reference to the pad's block,
# the members' bases by world rank for a pad made with symmetric=False, else None)
_PADS: dict[int, tuple[int, weakref.ref, dict | None]] = {}
_PAD_BASES: list[int] = []
# the modeled time this rank's latest put lands at (quiet joins it), per runtime
_LANDING: dict[int, float] = {}
# what ``exchange`` sends of an array: its address and bytes, and its segment's address, bytes
# and HBM offset (what a descriptor names)
EXCHANGED = 5


class FarObject:
    """An object of a rank on another host, as ``exchange`` learnt it: its address and bytes,
    its segment's (va, size, HBM offset), a weak reference to this rank's counterpart (the
    entry lives as long as it), and, with the expandable allocator, the rank's chunk-table
    entries for the segment once read."""

    __slots__ = ("addr", "nbytes", "va", "size", "off", "ref", "table")

    def __init__(self, addr: int, nbytes: int, va: int, size: int, off: int, ref: weakref.ref):
        self.addr, self.nbytes, self.va, self.size, self.off, self.ref = addr, nbytes, va, size, off, ref
        self.table: np.ndarray | None = None

    def overlaps(self, addr: int, nbytes: int) -> bool:
        return addr < self.addr + self.nbytes and self.addr < addr + nbytes


# the far members' objects, per runtime: world rank -> [FarObject]
_FAR: dict[int, dict[int, list[FarObject]]] = {}


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
        return self.members[p]

    def far(self, world: int) -> bool:
        """World rank ``world`` is on another host than this rank."""
        hosts = self._rt.hosts
        return hosts.spanned and hosts.host_of[world] != hosts.host

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
        elif self.far(world):
            if self.far_runs(world, target, nbytes) is None:
                raise OneSidedError(
                    f"{op}: rank {self.rank} -> peer {pe}: {target:#x}+{nbytes} is not inside a symmetric object of "
                    f"peer {pe} (world rank {world}), which is on host {self._rt.hosts.host_of[world]}: a peer on "
                    f"another host is reached only in objects made by shmem.empty/zeros/signal_pad or "
                    f"registered with shmem.buffer_register", op, pe, target)
            return target
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

    def view(self, target: int, nbytes: int, pe: int, op: str) -> np.ndarray:
        """Loads and stores on peer ``pe``'s bytes at ``target`` (checked by ``remote``);
        OneSidedError for a peer on another host, which no load or store reaches."""
        world = self.members[pe]
        if self.far(world):
            raise OneSidedError(f"{op}: rank {self.rank} -> peer {pe}: peer {pe} (world rank {world}) is on another "
                                f"host (host {self._rt.hosts.host_of[world]}), and loads and stores do not cross "
                                f"hosts; move its bytes with shmem.put/get", op, pe, target)
        return self.window(target, nbytes)

    def copy(self, op: str, target: int, buf: np.ndarray, pe: int, put: bool) -> None:
        """Copy the bytes ``buf`` to peer ``pe``'s ``target`` (``put``), or from there into
        ``buf`` (checked by ``remote``): through the window, or for a peer on another host,
        through this host's carrier."""
        world = self.members[pe]
        if not buf.nbytes:
            return
        if self.far(world):
            move = self._rt.hosts.far_put if put else self._rt.hosts.far_get
            move(op, world, self.far_runs(world, target, buf.nbytes), buf, self._rt.health, self.timeout)
        elif put:
            self.window(target, buf.nbytes)[:] = buf
        else:
            buf[:] = self.window(target, buf.nbytes)

    def allocate(self, shape, dtype, op: str) -> np.ndarray:
        """A symmetric HBM array: allocated here, then checked to sit at the same offset of
        every member's slice (``exchange``). Collective, host-blocking."""
        a = self._rt.empty(shape, dtype)
        self.check_symmetric(self.exchange(a, op), op)
        return a

    def exchange(self, a: np.ndarray, op: str) -> list[int]:
        """Every member's address of its counterpart of this rank's HBM array ``a`` (0 for an
        empty one), by rank. With them travels where each is in its member's HBM (the segment
        its descriptors would name), kept while ``a`` lives for the members on other hosts
        (``far_runs``). One allgather of the same size whether the members share a host or not:
        the modeled clock does not see the hosts. Collective."""
        mine = np.zeros(EXCHANGED, dtype=np.int64)
        spans = self._rt.hosts.spans(self.members)
        if a.nbytes:
            addr = address_of(a)
            # where it is in the HBM matters to members on other hosts only: on one host the
            # allocator is not asked (a few us of a ~100 us collective), the range only checked
            if spans:
                seg = self._rt.own_segment(addr, a.nbytes)
                ours = seg is not None
            else:
                seg, w = None, self._rt.window
                ours = w.owner(addr) == w.owner(addr + a.nbytes - 1) == self.me
            if not ours:
                raise OneSidedError(f"{op}: rank {self.rank}: {addr:#x}+{a.nbytes} is not one allocation of this "
                                    f"rank's HBM (allocate it with stratacl.empty)", op, None, addr)
            mine[:] = (addr, a.nbytes, seg.va, seg.size, seg.hbm_offset) if seg else (addr, a.nbytes, 0, 0, 0)
        every = np.zeros((self.size, EXCHANGED), dtype=np.int64)
        self.comm.all_gather(every.reshape(-1), mine)
        if spans:
            table = _FAR.setdefault(id(self._rt), {})
            ref = weakref.ref(a)
            for world, (addr, nbytes, va, size, off) in zip(self.members, every.tolist()):
                if self.far(world) and nbytes:
                    live = [e for e in table.get(world, []) if e.ref() is not None and not e.overlaps(addr, nbytes)]
                    table[world] = live + [FarObject(addr, nbytes, va, size, off, ref)]
        return every[:, 0].tolist()

    def check_symmetric(self, addrs: list[int], op: str) -> None:
        """Every member's address (``exchange``'s, by rank) is at the same offset of its slice
        (0: an empty array, not compared). Raises OneSidedError on every member if not."""
        w = self._rt.window
        offs = [addr - w.slice_start(m) if addr else -1 for m, addr in zip(self.members, addrs)]
        if len(set(offs)) > 1:
            raise OneSidedError(f"{op}: the members' allocations are not symmetric: offsets in their slices "
                                f"{offs} (by rank); allocate symmetric objects in the same order and "
                                f"sizes on every rank", op, None, addrs[self.rank])

    # --- peers on other hosts -----------------------------------------------------------------
    def far_runs(self, world: int, target: int, nbytes: int) -> list[tuple[int, int]] | None:
        """(HBM offset, bytes) runs of far rank ``world``'s [target, target + nbytes), inside an
        object it exchanged (``exchange``) that is still live here; None if there is none.
        With the expandable allocator the object's chunks are where the rank's chunk table
        says: its entries are read once, through this host's carrier into the mirror."""
        for obj in _FAR.get(id(self._rt), {}).get(world, []):
            if obj.addr <= target and target + nbytes <= obj.addr + obj.nbytes and obj.ref() is not None:
                reg = self._rt.reg
                if not reg.chunk:
                    return [(obj.off + target - obj.va, nbytes)]
                if obj.table is None:
                    obj.table = self._table(world, obj, reg.chunk, reg.table_offset)
                start = self._rt.window.slice_start(world)
                start += (obj.va - start) // reg.chunk * reg.chunk          # the entry obj.table begins at
                return [(o, n) for _, o, n in hbm_runs(target, target + nbytes, obj.va, obj.size, obj.off, reg.chunk,
                                                       obj.table, start)]
        return None

    def _table(self, world: int, obj: "FarObject", chunk: int, table_offset: int) -> np.ndarray:
        """Far rank ``world``'s chunk-table entries for the chunks of ``obj``'s segment, from the
        first: read from its HBM into this host's mirror by the carrier, then from the mirror."""
        start = self._rt.window.slice_start(world)
        first, last = (obj.va - start) // chunk, (obj.va + obj.size - 1 - start) // chunk
        out = np.zeros(last - first + 1, dtype=np.int64)
        self._rt.hosts.far_get("shmem.chunk_table", world, [(table_offset + 8 * first, out.nbytes)],
                               out.view(np.uint8), self._rt.health, self.timeout)
        return out

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
        bases = self.exchange(block, op)
        if symmetric:
            self.check_symmetric(bases, op)
        else:
            peers = dict(zip(self.members, bases))
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
        self.update(op, target, stride, pe, "set" if sig_op == "set" else "fetch_add", int(value) & MASK64)

    def update(self, op: str, target: int, stride: int, pe: int, kind: str, a: int = 0, b: int = 0) -> int:
        """Update peer ``pe``'s u64 word at ``target`` (services/_pads.py, ``update_word``:
        ``kind`` with operands a, b; a signal when ``stride``, a signal pad's row stride) and
        return the value it held. A signal's modeled arrival (now + the flag latency) is logged
        with its value; on another host's peer, that host's carrier makes the update."""
        c = self._rt.clock
        arrival = None
        world = self.members[pe]
        if c is not None and stride and kind != "fetch":
            arrival = to_bits(c.entering() + (float(c.model.fabric.flag_us(self.me, world)) if world != self.me else 0.0))
            key = id(self._rt)
            _LANDING[key] = max(_LANDING.get(key, 0.0), us_from_bits(arrival))
        if self.far(world):
            (offset, _), = self.far_runs(world, target, 8)
            return self._rt.hosts.far_update(op, world, offset, stride, kind, a, b, arrival, self._rt.health,
                                             self.timeout)
        return update_word(target, stride, kind, a, b, arrival, self.me)

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
        stride = 0
        mine = self.untranslate(target, self.members[pe])
        found = self.pad_word(mine, op)
        if found is not None and (mine - found[0]) % 8 == 0:
            stride = 8 * found[1]          # a signal pad's word: the update is a signal (logged, waiters woken)
        old = self.update(op, target, stride, pe, kind, a, b)
        self.charge_atomic(op, pe)
        return int(old)


def _forget_dead_pads() -> None:
    dead = [b for b, (_, ref, _) in _PADS.items() if ref() is None]
    for b in dead:
        del _PADS[b]
        _PAD_BASES.remove(b)
