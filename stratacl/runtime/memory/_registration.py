"""The memory registration unit: makes physical allocations remotely accessible.

Registration-on-allocation (``roa``, the default), as a flow:

    allocating thread                       background registration thread (every rank)
    -----------------                       ------------------------------------------
    segment mapped (physical event)
      -> count it as published
      -> queue {owner, va, size, HBM offset, epoch} ----> post to every peer (direct)
      -> return at once                                  or to the daemon (relay)
                                            peer: drain mailbox, map the owner's pages at
                                                  the same address, record (va, epoch)
    operator touches a peer buffer
      -> ensure_ready: local table lookup; waits only if the mapping is not done yet

Release: the owner takes back its address at once and queues RELEASE; each peer unmaps in the
background and ACKs; the physical range is reused only after every ACK (see ``Hbm``).

``jit`` maps a peer buffer on first use inside the operator (synchronous, on the critical path,
cached afterwards). ``pool`` maps one pre-registered region of every peer at start-up.

With the expandable allocator (``chunk`` > 0) every registration is one chunk of HBM
(runtime/memory/_expandable.py): a growth of N chunks is N registrations, each announced on its own
(incremental registration on remap), and a descriptor may name a run of chunks (a block that
straddles them), which a peer maps chunk by chunk. Where each chunk's HBM is, the owner writes
in its chunk table (one int64 per chunk-sized slot of its address slice, HBM offset + 1, 0 when
unmapped) at the end of its HBM segment before the chunk can appear in any descriptor; a peer
reads it for the chunks of a run it has not mapped (jit's first use, roa's late ones). An owner
reuses a chunk's address and HBM only after every peer has acknowledged its release, so a
chunk mapped here is the owner's current one: readiness is "every chunk of the run is mapped
here", and the epoch only tells runs apart.

The unit is given what it needs and reads no other runtime internals: the runtime builds it
with the control segment, a mailbox endpoint, the shadow address window and the peers' HBM
descriptors (the protocols below say which methods are used) and activates it in the fabric
while the process is in a job (``ub.activate_mappings``), which is how ``ub.view`` finds it.
The message kinds are this protocol's; the mailbox only carries them.
"""
from __future__ import annotations

import collections
import math
import mmap
import operator
import threading
import time
from typing import Callable, Protocol

import numpy as np

from ..._errors import RegistrationError

# message kinds of the registration protocol, in the kind byte of a mailbox header
MSG_REGISTER, MSG_RELEASE, MSG_ACK = 1, 2, 3
# seconds the background thread sleeps with nothing to do before it looks at dead peers again:
# N ranks' threads waking 10 times a second were 10 N idle wake-ups a second on the host's cores
IDLE_WAIT = 1.0


class ControlSegment(Protocol):
    """What the unit reads and writes in the job's control segment (runtime.services._control.Control)."""

    def alive(self, rank: int) -> bool: ...
    def published(self, rank: int) -> int: ...
    def set_published(self, rank: int, count: int) -> None: ...


class MailboxEndpoint(Protocol):
    """This rank's endpoint of the mailbox rings (runtime.services._mailbox.Mailbox); endpoint ``world``
    is the daemon (the relay path)."""

    BROADCAST: int

    @staticmethod
    def pack_header(kind: int, src: int, dst: int) -> int: ...
    @staticmethod
    def unpack_header(word: int) -> tuple[int, int, int]: ...
    def post(self, dst: int, words: tuple[int, ...]) -> None: ...
    def flush(self, alive=None) -> int: ...
    def drain(self) -> np.ndarray: ...
    def doorbell_value(self) -> int: ...
    def wait(self, seen_doorbell: int, timeout: float) -> None: ...
    def ring_own_doorbell(self) -> None: ...


class AddressWindow(Protocol):
    """The shadow virtual-address window (runtime.memory._window.ShadowWindow)."""

    slice_bytes: int

    def slice_start(self, rank: int) -> int: ...
    def owner(self, va: int) -> int: ...
    def map(self, va: int, size: int, fd: int, offset: int, writable: bool = True) -> None: ...
    def unmap(self, va: int, size: int) -> None: ...
    def view(self, va: int, nbytes: int) -> np.ndarray: ...


class RegistrationUnit:
    """This rank's registration unit; also the allocator's interception layer.

    ``own_segment(addr, nbytes)``: this rank's allocated segment holding the range, or None
    (the allocator's answer, for ``view`` of an own address). ``chunk``: the expandable
    allocator's chunk size (every registration is one chunk), or 0 (fixed segments);
    ``table_offset``: where the chunk table starts in every rank's HBM segment."""

    def __init__(self, rank: int, world: int, ctl: ControlSegment, mailbox: MailboxEndpoint,
                 window: AddressWindow, hbm_fds: list[int], mode: str, path: str,
                 check_job: Callable[[str, list[int]], None], timeout: float,
                 own_segment: Callable[[int, int], object], chunk: int = 0, table_offset: int = 0):
        self.rank, self.world, self.ctl, self.window = rank, world, ctl, window
        self.hbm_fds, self.mode, self.path, self.chunk = hbm_fds, mode, path, chunk
        self.table_offset = table_offset
        self.check_job, self.timeout, self.own_segment = check_job, timeout, own_segment
        self.hbm = None                      # set by the runtime once HBM exists
        self.pool_bytes = 0
        self.mailbox = mailbox
        self.cond = threading.Condition()
        self._mapped: list[dict[int, tuple[int, int]]] = [dict() for _ in range(world)]  # owner -> va -> (epoch, size)
        self._mapped_at: dict[int, float] = {}     # own segment (chunk) va -> when last mapped (allocated_at)
        # chunk mode: (va, epoch) of runs found wholly mapped here, per owner (cleared on its releases)
        self._runs_ready: list[set] = [set() for _ in range(world)]
        self._tables: list[np.ndarray] = []       # chunk mode: every rank's chunk table
        if chunk:
            entries = window.slice_bytes // chunk
            for owner in range(world):
                prot = mmap.PROT_READ | (mmap.PROT_WRITE if owner == rank else 0)
                m = mmap.mmap(hbm_fds[owner], entries * 8, flags=mmap.MAP_SHARED, prot=prot, offset=table_offset)
                self._tables.append(np.frombuffer(m, dtype=np.int64))
        self._processed = [0] * world      # metadata messages handled per owner
        self._requests: collections.deque = collections.deque()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.thread_error: BaseException | None = None
        self.latencies: collections.deque = collections.deque(maxlen=4096)  # (owner, recv_ns, mapped_ns)
        self.counters = dict(published=0, background_maps=0, background_unmaps=0, acks_received=0,
                             ready_checks=0, ready_waits=0, ready_wait_ns=0,
                             registrations_in_operator=0, registration_in_operator_ns=0)
        # this rank as an owner: its registrations (segments, chunks or the pool) and their bytes
        self.owned = dict(registered=0, registered_peak=0, registrations=0, deregistrations=0,
                          registered_bytes=0, registered_bytes_peak=0, registered_bytes_total=0,
                          deregistered_bytes_total=0, chunk_registrations=0, announced=0)
        self._sent = 0                       # REGISTERs the background thread has posted (its counter)
        # ranks on other hosts (runtime/hosts/_hosts.py): they map this host's mirror of this rank, which
        # their carrier refreshes, so they are sent no metadata and owe no acknowledgement
        self.remote: set[int] = set()

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"stratacl-registration-{self.rank}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        if self._thread is not None:
            self.mailbox.ring_own_doorbell()
            self._thread.join(timeout=5.0)
        self._tables = []

    @staticmethod
    def table_bytes(slice_bytes: int, chunk: int) -> int:
        """The size of a chunk table (one int64 per chunk of an address slice), in whole pages."""
        return -(-(slice_bytes // chunk * 8) // mmap.PAGESIZE) * mmap.PAGESIZE

    @staticmethod
    def table_offset(capacity: int, slice_bytes: int, chunk: int) -> int:
        """Where the chunk table sits in every HBM segment of ``capacity`` bytes: at its end, on a
        chunk boundary, out of the allocator's reach (read by peers and by a host's carrier)."""
        return (capacity - RegistrationUnit.table_bytes(slice_bytes, chunk)) // chunk * chunk

    def _table_slot(self, owner: int, va: int) -> int:
        return (va - self.window.slice_start(owner)) // self.chunk

    def map_pools(self, pool_bytes: int) -> None:
        """``pool`` mode: every peer's whole pre-registered region, mapped once at start-up."""
        self.pool_bytes = pool_bytes
        self._pool_mapped_at = time.monotonic()
        for owner in range(self.world):
            self.window.map(self.window.slice_start(owner), pool_bytes, self.hbm_fds[owner], 0)
        self._count_owned(pool_bytes, 1)

    def _count_owned(self, nbytes: int, registrations: int) -> None:
        o = self.owned
        o["registered"] += registrations
        o["registered_bytes"] += nbytes
        if registrations > 0:
            o["registrations"] += registrations
            o["registered_bytes_total"] += nbytes
            o["registered_peak"] = max(o["registered_peak"], o["registered"])
            o["registered_bytes_peak"] = max(o["registered_bytes_peak"], o["registered_bytes"])
        else:
            o["deregistrations"] -= registrations
            o["deregistered_bytes_total"] -= nbytes

    # --- interception layer (called by the allocator, on physical events only) --------------
    def allocated_at(self, va: int, size: int) -> float | None:
        """When the physical memory under this rank's segment [va, va + size) was last mapped
        (``time.monotonic()``; the latest of its chunks'): the start of the allocation-to-
        communication gap (paper section 9.4). ``pool``: when the pool was mapped. None: unknown."""
        if self.mode == "pool":
            return getattr(self, "_pool_mapped_at", None)
        if self.chunk:
            times = [self._mapped_at[c] for c in range(va, va + max(size, 1), self.chunk) if c in self._mapped_at]
            return max(times) if times else None
        return self._mapped_at.get(va)

    def segment_mapped(self, seg) -> None:
        self._mapped_at[seg.va] = time.monotonic()
        if self.mode == "pool":
            return                       # inside the pre-registered pool: not a registration
        self._count_owned(seg.size, 1)
        if self.chunk:
            self.owned["chunk_registrations"] += 1
            self._tables[self.rank][self._table_slot(self.rank, seg.va)] = seg.hbm_offset + 1
        if self.mode != "roa":
            return
        self.owned["announced"] += 1
        self._publish(MSG_REGISTER, seg)

    def segment_released(self, seg) -> None:
        if self.mode == "pool":
            self.hbm.release_after_acks(seg.epoch, seg.hbm_offset, seg.size, set())
            return
        self._count_owned(-seg.size, -1)
        if self.chunk:
            self._tables[self.rank][self._table_slot(self.rank, seg.va)] = 0
        peers = {p for p in range(self.world) if p != self.rank and p not in self.remote and self._peer_alive(p)}
        self.hbm.release_after_acks(seg.epoch, seg.hbm_offset, seg.size, peers)
        self._publish(MSG_RELEASE, seg)

    def _publish(self, kind: int, seg) -> None:
        self.counters["published"] += 1
        self.ctl.set_published(self.rank, self.counters["published"])
        self._requests.append((kind, seg.va, seg.size, seg.hbm_offset, seg.epoch, time.monotonic_ns()))
        self.mailbox.ring_own_doorbell()

    def _peer_alive(self, p: int) -> bool:
        return self.ctl.alive(p)

    # --- background thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                seen = self.mailbox.doorbell_value()
                busy = self._send_requests()
                msgs = self.mailbox.drain()
                if len(msgs):
                    self._handle(msgs)
                    busy = True
                left = self.mailbox.flush(self._endpoint_alive)
                if self._stop and not left and not self._requests:
                    break   # stopping: only once everything this rank published has left
                if self.hbm is not None:
                    self.hbm.forget_peers(lambda p: not self._peer_alive(p))
                if not busy:
                    # asleep until a doorbell: a message in, a request of this rank's, room in a
                    # ring it could not fill (the consumer rings, _mailbox.Mailbox.drain) or stop;
                    # the timeout only bounds how late a dead peer's pending acks are forgotten
                    self.mailbox.wait(seen, 0.05 if left or self._stop else IDLE_WAIT)
        except BaseException as e:  # surfaced by ensure_ready / view; the thread must not die silently
            self.thread_error = e
            with self.cond:
                self.cond.notify_all()

    def _endpoint_alive(self, dst: int) -> bool:
        return dst == self.world or self._peer_alive(dst)

    def _send_requests(self) -> bool:
        did = False
        pack_header, broadcast = self.mailbox.pack_header, self.mailbox.BROADCAST
        while self._requests:
            kind, va, size, off, epoch, t = self._requests.popleft()
            did = True
            if kind == MSG_REGISTER:
                self._sent += 1
            if self.path == "relay":
                self.mailbox.post(self.world, (pack_header(kind, self.rank, broadcast), self.rank, epoch, va,
                                               size, off, t, 0))
            else:
                words = (pack_header(kind, self.rank, broadcast), self.rank, epoch, va, size, off, t, 0)
                for p in range(self.world):
                    if p != self.rank and p not in self.remote:
                        self.mailbox.post(p, words)
        return did

    def _handle(self, msgs: np.ndarray) -> None:
        now = time.monotonic_ns()
        pack_header, unpack_header = self.mailbox.pack_header, self.mailbox.unpack_header
        for row in msgs.tolist():
            kind, src, _ = unpack_header(row[0])
            owner, epoch, va, size, off, t_sent = row[1], row[2], row[3], row[4], row[5], row[6]
            if kind == MSG_REGISTER:
                with self.cond:
                    entry = self._mapped[owner].get(va)
                    # an operator may have been first (chunk mode: a chunk mapped here is current)
                    if (entry is None) if self.chunk else (entry != (epoch, size)):
                        self._drop_overlaps(owner, va, size)
                        self.window.map(va, size, self.hbm_fds[owner], off)
                        self._mapped[owner][va] = (epoch, size)
                        self.counters["background_maps"] += 1
                    self._processed[owner] += 1
                    self.cond.notify_all()
                self.latencies.append((owner, now - t_sent, time.monotonic_ns() - t_sent))
            elif kind == MSG_RELEASE:
                with self.cond:
                    entry = self._mapped[owner].get(va)
                    if entry is not None and entry[0] <= epoch:
                        self.window.unmap(va, entry[1])
                        del self._mapped[owner][va]
                        self.counters["background_unmaps"] += 1
                    self._runs_ready[owner].clear()
                    self._processed[owner] += 1
                    self.cond.notify_all()
                ack = (pack_header(MSG_ACK, self.rank, owner), owner, epoch, va, size, off, t_sent, 0)
                self.mailbox.post(self.world if self.path == "relay" else owner, ack)
            elif kind == MSG_ACK:
                self.counters["acks_received"] += 1
                self.hbm.ack(epoch, src)

    def _drop_overlaps(self, owner: int, va: int, size: int) -> None:
        table = self._mapped[owner]
        for other_va, (epoch, other_size) in list(table.items()):
            if other_va < va + size and va < other_va + other_size:
                self.window.unmap(other_va, other_size)
                del table[other_va]

    # --- readiness (called by operators, purely local) --------------------------------------
    def ensure_ready(self, owner: int, seg_va: int, seg_size: int, seg_offset: int, epoch: int,
                     operation: str) -> None:
        """Make sure ``owner``'s segment is mapped here; cheap when it already is."""
        if owner == self.rank or self.mode == "pool":
            return
        self.counters["ready_checks"] += 1
        if self.chunk:
            self._ensure_chunks(owner, seg_va, seg_size, seg_offset, epoch, operation)
            return
        entry = self._mapped[owner].get(seg_va)
        if entry is not None and entry[0] == epoch:
            return
        t0 = time.monotonic_ns()
        if self.mode == "jit":
            with self.cond:
                self._drop_overlaps(owner, seg_va, seg_size)
                self.window.map(seg_va, seg_size, self.hbm_fds[owner], seg_offset)
                self._mapped[owner][seg_va] = (epoch, seg_size)
            self.counters["registrations_in_operator"] += 1
            self.counters["registration_in_operator_ns"] += time.monotonic_ns() - t0
            return
        # roa, first use before the background mapping is done: the operator already holds the
        # segment's metadata, so it maps it itself rather than wait (never worse than jit); the
        # background thread then finds the mapping in place
        with self.cond:
            if self._mapped[owner].get(seg_va, (None,))[0] != epoch:
                self._drop_overlaps(owner, seg_va, seg_size)
                self.window.map(seg_va, seg_size, self.hbm_fds[owner], seg_offset)
                self._mapped[owner][seg_va] = (epoch, seg_size)
                self.counters["registrations_in_operator"] += 1
        dt = time.monotonic_ns() - t0
        self.counters["ready_waits"] += 1
        self.counters["ready_wait_ns"] += dt
        self.counters["registration_in_operator_ns"] += dt

    def _ensure_chunks(self, owner: int, va: int, size: int, offset: int, epoch: int, operation: str) -> None:
        """``ensure_ready`` in chunk mode: map here whichever chunks of the run [va, va + size)
        are not mapped yet (jit: all of them, at first use; roa: those the background thread has
        not reached, as a late check does for a segment). A lone chunk's HBM offset is in the
        descriptor, a run's in the owner's chunk table."""
        ready = self._runs_ready[owner]
        if (va, epoch) in ready:
            return
        table, g = self._mapped[owner], self.chunk
        missing = [c for c in range(va, va + size, g) if c not in table]
        if not missing:
            ready.add((va, epoch))
            return
        t0 = time.monotonic_ns()
        mapped = 0
        with self.cond:
            for c in missing:
                if c not in table:       # the background thread may have mapped it meanwhile
                    at = offset if size == g else int(self._tables[owner][self._table_slot(owner, c)]) - 1
                    if at < 0:
                        raise RegistrationError(
                            f"{operation}: rank {self.rank} found no HBM for rank {owner}'s chunk {c:#x} of the "
                            f"run {va:#x}+{size} in its chunk table (the run was released while in use?)")
                    self.window.map(c, g, self.hbm_fds[owner], at)
                    table[c] = (epoch, g)
                    mapped += 1
            ready.add((va, epoch))
        dt = time.monotonic_ns() - t0
        self.counters["registrations_in_operator"] += mapped
        self.counters["registration_in_operator_ns"] += dt
        if self.mode == "roa":
            self.counters["ready_waits"] += 1
            self.counters["ready_wait_ns"] += dt

    def _wait(self, done: Callable[[], bool], owner: int | None, operation: str, what: str) -> None:
        """Wait for the background thread; ``owner`` (if given) must stay alive meanwhile."""
        deadline = time.monotonic() + self.timeout
        with self.cond:
            while not done():
                if self.thread_error is not None:
                    raise RegistrationError(f"{operation}: registration thread of rank {self.rank} failed: "
                                            f"{self.thread_error!r}") from self.thread_error
                self.check_job(operation, [] if owner is None else [owner])
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RegistrationError(f"{operation}: rank {self.rank} waited {self.timeout:g} s for {what}")
                self.cond.wait(min(left, 0.05))

    # --- ub.view ----------------------------------------------------------------------------
    def view(self, address: int, shape, dtype) -> np.ndarray:
        """``ub.view`` on this rank (see there)."""
        dtype = np.dtype(dtype)
        shape, nbytes = array_extent(shape, dtype, "ub.view")
        window = self.window
        owner = window.owner(address)
        if owner < 0 or window.owner(address + max(nbytes, 1) - 1) != owner:
            raise RegistrationError(f"ub.view: {address:#x}+{nbytes} is not inside one rank's slice of the "
                                    f"shared address window")
        if owner == self.rank and self.mode != "pool":
            ok = self.own_segment(address, nbytes) is not None
        else:
            ok = self.lookup(owner, address, nbytes)
        if not ok:
            raise RegistrationError(
                f"ub.view: rank {self.rank} has no registration of rank {owner}'s range {address:#x}+{nbytes} "
                f"(never allocated, already released, or in jit mode not yet used by an operator)")
        return window.view(address, nbytes).view(dtype).reshape(shape)

    def lookup(self, owner: int, addr: int, nbytes: int, operation: str = "ub.view") -> bool:
        """True if [addr, addr + nbytes) of ``owner`` is mapped here, after catching up with every
        metadata message the owner had published when the call started."""
        if self.mode == "pool":
            start = self.window.slice_start(owner)
            return start <= addr and addr + nbytes <= start + self.pool_bytes
        published = self.ctl.published(owner)
        # messages already published are in our rings: no need for the owner to be alive
        self._wait(lambda: self._processed[owner] >= published, None, operation,
                   f"metadata from rank {owner}")
        with self.cond:
            # the mappings overlapping the range, in address order, must cover it without a gap
            spans = sorted((va, va + size) for va, (_, size) in self._mapped[owner].items()
                           if va < addr + max(nbytes, 1) and addr < va + size)
        pos = addr
        for start, end in spans:
            if start > pos:
                break
            pos = max(pos, end)
        return pos >= addr + max(nbytes, 1)

    def catch_up(self, operation: str = "wait_registered") -> None:
        """Return once this rank has handled every registration message its peers had published
        when the call started (so their buffers are mapped here, in roa mode)."""
        if self.mode == "pool":
            return
        for owner in range(self.world):
            if owner == self.rank or not self._peer_alive(owner):
                continue
            published = self.ctl.published(owner)
            self._wait(lambda: self._processed[owner] >= published, None, operation,
                       f"metadata from rank {owner}")

    def stats(self) -> dict:
        out = dict(self.counters)
        out["mode"], out["metadata_path"] = self.mode, self.path
        out["peer_segments_mapped"] = sum(len(t) for t in self._mapped)
        return out

    def memory_stats(self) -> dict[str, int]:
        """This rank's registrations as an owner, under memory_stats' names: registered bytes and
        registrations (current, peak, and in total: allocated = registered, freed = deregistered),
        chunk registrations, and what is still in flight: registrations queued for peers (roa)
        and releases whose peers have not all acknowledged."""
        o = self.owned
        count, nbytes = self.hbm.awaiting() if self.hbm is not None else (0, 0)
        return {"registered_bytes.all.current": o["registered_bytes"],
                "registered_bytes.all.peak": o["registered_bytes_peak"],
                "registered_bytes.all.allocated": o["registered_bytes_total"],
                "registered_bytes.all.freed": o["deregistered_bytes_total"],
                "registration.all.current": o["registered"], "registration.all.peak": o["registered_peak"],
                "registration.all.allocated": o["registrations"], "registration.all.freed": o["deregistrations"],
                "num_registrations": o["registrations"], "num_chunk_registrations": o["chunk_registrations"],
                "num_deregistrations": o["deregistrations"],
                "registrations_in_flight": o["announced"] - self._sent,
                "deregistrations_in_flight": count, "deregistration_in_flight_bytes": nbytes}

    def reset_peak(self) -> None:
        o = self.owned
        o["registered_peak"], o["registered_bytes_peak"] = o["registered"], o["registered_bytes"]


def hbm_runs(lo: int, hi: int, va: int, size: int, off: int, chunk: int = 0, table=None,
             start: int = 0) -> list[tuple[int, int, int]]:
    """The bytes [lo, hi) (addresses, cut to the segment) of a segment mapped at ``va``, ``size``
    bytes from HBM offset ``off``, as (address, HBM offset, bytes) runs: one, or with the
    expandable allocator (``chunk`` > 0) one per chunk the range touches, each where the owner's
    chunk table (``table``, its entries from the slice's ``start``: HBM offset + 1, 0 if not
    written) says the chunk is."""
    lo, hi = max(lo, va), min(hi, va + size)
    if hi <= lo:
        return []
    if not chunk:
        return [(lo, off + lo - va, hi - lo)]
    out = []
    for c in range(va + (lo - va) // chunk * chunk, hi, chunk):
        at = int(table[(c - start) // chunk]) - 1
        a, b = max(lo, c), min(hi, c + chunk)
        out.append((a, (at if at >= 0 else off + c - va) + a - c, b - a))
    return out


def array_extent(shape, dtype: np.dtype, operation: str) -> tuple[tuple[int, ...], int]:
    """``shape`` as a tuple of ints and the bytes an array of it and ``dtype`` spans; a shape
    that is not ints, or has a negative dimension, raises naming ``operation``."""
    try:
        shape = (operator.index(shape),) if np.isscalar(shape) else tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(f"{operation}: the shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"{operation}: negative dimensions are not allowed: {shape}")
    return shape, math.prod(shape) * dtype.itemsize      # Python ints: a huge shape cannot wrap
