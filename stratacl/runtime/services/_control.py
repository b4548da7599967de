"""The job's control segment: host-DRAM state every rank, the daemon and the launcher map.

The launcher creates one shared-memory segment per job and hands its descriptor to every
process it starts. It holds, in fixed places computed by ``Layout``:

    header            job facts and the first failure, written by the launcher; the count of
                      ranks asleep on a communicator word (so that wakes can be skipped)
    region[r]         one per rank: pid and state, a doorbell, the inbound mailbox rings
                      (one single-producer ring per sender, the daemon's last), its flight
                      recorder (runtime/services/_flight.py), and the rank's communicator slots (barrier
                      words, descriptors, the text of why the rank rejected its arguments,
                      written only then: Layout.slot_reason, and the members' list of the
                      communicators whose index 0 the rank is: Layout.slot_members)
    daemon region     the daemon's doorbell and one inbound ring per rank (the relay path)

Every word has exactly one writer except the central barrier counter and the sleepers' count
(atomic read-modify-writes) and doorbells (any producer may ring them). Nothing here is a lock.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from .. import _native

# an operation descriptor's DESC_FIXED int64 fields, F_* (collectives and point-to-point share
# the layout): native code reads them, so _native.h defines them; the slot's users take them
# from here, with the rest of the layout
from .._native import (  # noqa: F401
    DESC_FIXED, F_ADDR, F_AUX0, F_AUX1, F_AUX2, F_CALL, F_COUNT, F_DTYPE, F_EPOCH, F_FLAGS, F_NBYTES, F_OP, F_REDOP,
    F_ROOT, F_SEG_OFF, F_SEG_SIZE, F_SEG_VA, FL_WORDS, FLIGHT_ENTRIES, FLIGHT_HEADER,
)

MAGIC = 0x5354524154414C31  # "STRATAL1"
HEADER_BYTES = 4096
RING_ENTRIES = 64
RING_ENTRY_WORDS = 8                      # 8 x u64 = one 64-byte message
RING_BYTES = 128 + RING_ENTRIES * RING_ENTRY_WORDS * 8
COMM_SLOTS = 128
FLIGHT_BYTES = (FLIGHT_HEADER + FLIGHT_ENTRIES * FL_WORDS) * 8
P2P_DESC = DESC_FIXED                     # a point-to-point descriptor is an operation descriptor
# a collective descriptor's extension words: 2 per member (all_to_all_v's counts; the ring's
# extra buffer), and this many more for the operations that name a second buffer and their
# shape (stratacl.ep: ep/_buffer.py, E_*)
EXT_WORDS_EXTRA = 12
FLAG_REJECTED = 1                         # the rank rejected its own arguments; it raises, peers too

# the world communicator's calls made by init() itself (its barrier), before the program's first
WORLD_INIT_CALLS = 1

# rank states
STATE_STARTING, STATE_RUNNING, STATE_FINALIZED, STATE_DEAD = 0, 1, 2, 3

# header word offsets (bytes)
H_MAGIC, H_WORLD, H_FAILED_RANK, H_FAILED_KIND, H_FAILED_VALUE, H_LAUNCHER_PID = 0, 8, 16, 24, 32, 40
H_HBM_SIZE, H_VA_BASE, H_SLICE = 48, 56, 64
# a host's carrier in a process of its own (runtime/hosts/_carrier.py main): its pid | its host << 32,
# which the host's daemon watches (jobs/_daemon.py --watch); 0: none
H_CARRIER_PID = 72
# u64: the bytes the host's carrier has read from other hosts into its mirrors since the job
# began (runtime/hosts/_carrier.py, ``serve``; written before the barrier the read was for
# completes), which every rank of the host reads as stats()["bytes_carried"]
H_CARRIER_READ = 80
H_SLEEPERS = 128                          # u32, own cache line: see set_sleepers in _waits.c
# the carrier's queue of barriers its host's ranks have all arrived at: a u64 tail (producers
# take a place with fetch-add), a u64 head (the carrier's), then CARRIER_QUEUE u64 entries, each
# (the arriving rank * COMM_SLOTS + its slot + 1) << 32 | barrier number, 0 while empty
H_CARRIER = 512
CARRIER_QUEUE = 64
# u32, own cache line: rung (incremented, woken) after every word the carrier forwards is written
H_CARRIER_BELL = 256
FAILED_EXIT, FAILED_SIGNAL, FAILED_SHUTDOWN, FAILED_DAEMON = 1, 2, 3, 4    # 0: none
# FAILED_GONE: a rank of a job started by another launcher ended unfinalized, its exit status
# unknown to the host's daemon (jobs/_daemon.py --watch)
FAILED_GONE = 5
# FAILED_CARRIER: the carrier of host <value> (a job spanning hosts: runtime/hosts/_carrier.py) failed;
# no call across hosts can complete
FAILED_CARRIER = 6
# ... or, with HOST_LOST set in <value>, another host was lost (its launcher or carrier died: its
# MPI process is gone) and the carrier that saw it first says which: host_lost() packs the host
# and its first and last rank into the value, carrier_failure() says it in words
HOST_LOST = 1 << 62


def host_lost(host: int, first: int, last: int) -> int:
    """FAILED_CARRIER's value for "host ``host`` (ranks first-last) was lost"."""
    return HOST_LOST | host | first << 20 | last << 40


def carrier_failure(value: int) -> str:
    """What FAILED_CARRIER's ``value`` says happened, in words."""
    if value & HOST_LOST:
        host, first, last = value & 0xFFFFF, value >> 20 & 0xFFFFF, value >> 40 & 0xFFFFF
        ranks = f"rank {first}" if first == last else f"ranks {first}-{last}"
        return f"host {host} ({ranks}) was lost: its launcher or carrier died"
    return f"the carrier of host {value} (its path to the other hosts) failed"
_SHUTDOWNS = (FAILED_SHUTDOWN, FAILED_DAEMON, FAILED_CARRIER)       # the whole job's, no rank's

# rank region word offsets (bytes)
R_PID, R_STATE, R_DOORBELL, R_PUBLISHED = 0, 8, 16, 24
# a one-sided call of the rank with a peer on another host (runtime/hosts/_hosts.py, ``far_call``),
# which the host's carrier carries out (runtime/hosts/_carrier.py): u32 the rank's request
# number, u32 the carrier's answer (the number it has done), then u64 words: what to do
# (OS_PUT, OS_GET, or OS_UPDATE + the index of the update in services/_pads.py's UPDATES),
# the peer (world rank), the HBM offset in its segment, the bytes (an update: 1 when it
# carries a modeled arrival), the update's operands a and b, the signal pad's row stride (0:
# a plain word), the arrival's bits, and the value the word held (the carrier's answer)
R_ONESIDED = 32
OS_SEQ, OS_DONE, OS_KIND, OS_PEER, OS_OFFSET, OS_NBYTES, OS_A, OS_B, OS_STRIDE, OS_ARRIVAL, OS_OLD = (
    0, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72)
OS_PUT, OS_GET, OS_UPDATE = 1, 2, 3
R_RINGS = 128

# a rejection's reason: "Type: message" as UTF-8, NUL-terminated, cut to fit with the marker
REASON_BYTES = 256
REASON_CUT = b" [...]"


def _align(n: int, a: int = 64) -> int:
    return (n + a - 1) // a * a


class Layout:
    """Byte offsets of everything in a control segment for a world of ``world`` ranks."""

    def __init__(self, world: int):
        self.world = world
        self.desc_words = DESC_FIXED + 2 * world + EXT_WORDS_EXTRA
        self.slot_bytes = _align(self.slot_slots() + 4 * world, 4096)
        self.rings_bytes = (world + 1) * RING_BYTES
        self.flight_offset = _align(R_RINGS + self.rings_bytes)
        self.slots_offset = _align(self.flight_offset + FLIGHT_BYTES, 4096)
        self.region_bytes = self.slots_offset + COMM_SLOTS * self.slot_bytes
        self.daemon_offset = HEADER_BYTES + world * self.region_bytes
        self.total = self.daemon_offset + _align(R_RINGS + world * RING_BYTES, 4096)

    def region(self, rank: int) -> int:
        """Offset of a rank's region; ``rank == world`` is the daemon's."""
        return HEADER_BYTES + rank * self.region_bytes

    def ring(self, consumer: int, producer: int) -> int:
        """Offset of the ring carrying messages from ``producer`` to ``consumer``.

        Either side may be ``world``, meaning the daemon.
        """
        return self.region(consumer) + R_RINGS + producer * RING_BYTES

    def flight(self, rank: int) -> int:
        """Offset of a rank's flight recorder (_native.h, FL_*; runtime/services/_flight.py)."""
        return self.region(rank) + self.flight_offset

    def slot(self, rank: int, index: int) -> int:
        return self.region(rank) + self.slots_offset + index * self.slot_bytes

    def world_slot(self) -> int:
        """The world communicator's slot (every rank's slot 0; a communicator is known by its
        member 0's slot). Its first call is init()'s own barrier (WORLD_INIT_CALLS): messages
        number a program's calls on it from the next one, as 1."""
        return self.slot(0, 0)

    # offsets inside a communicator slot
    SLOT_COUNTER, SLOT_GEN, SLOT_ARRIVAL, SLOT_SEND_SEQ = 0, 8, 12, 16

    def slot_recv_done(self) -> int:
        return 16 + 4 * self.world

    def slot_recv_status(self) -> int:
        return 16 + 8 * self.world

    def slot_root_done(self) -> int:
        """u32: how many members have finished reading this member's buffer as a root, ever."""
        return 16 + 12 * self.world

    def slot_ring_step(self) -> int:
        """u32: ring steps this member has finished on this communicator, ever."""
        return 16 + 12 * self.world + 4

    def slot_p2p_desc(self) -> int:
        return _align(16 + 12 * self.world + 8)

    def slot_desc(self, parity: int) -> int:
        return self.slot_p2p_desc() + self.world * P2P_DESC * 8 + parity * self.desc_words * 8

    def slot_reason(self, which: int) -> int:
        """REASON_BYTES of text (Control.put_reason) saying why this member rejected its
        arguments, read by the peers it flagged the rejection to: ``which`` 0 and 1, in the
        collective call of that parity (read after its arrival barrier, rewritten at call k+2,
        as the descriptors); 2 + p, in its send to member p (read before p confirms the
        receive); 2 + world + p, in its receive from member p (read by p once confirmed; the
        next receive from p comes after p's next send)."""
        return _align(self.slot_desc(2)) + which * REASON_BYTES

    def slot_slots(self) -> int:
        """i32 words after slot_members' list: each member's slot index in that communicator.
        In a job over hosts every member writes the list and these in its own slot (the
        communicator's card, which its host's carrier reads: runtime/hosts/_carrier.py)."""
        return self.slot_members() + 4 * (1 + self.world)

    def slot_members(self) -> int:
        """i32 words: how many members the communicator whose barrier counter this slot holds
        has, then their world ranks; written by that member (its index 0) as it makes the
        communicator, read by the flight recorder's reader (runtime/services/_flight.py)."""
        return _align(self.slot_reason(2 + 2 * self.world))


class Control:
    """One process's mapping of the control segment, with typed views and raw addresses."""

    def __init__(self, fd: int, world: int):
        self.layout = Layout(world)
        self.world = world
        self._mm = mmap.mmap(fd, self.layout.total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._fd = os.dup(fd)       # for read(): its own, whatever the caller does with ``fd``
        self.u8 = np.frombuffer(self._mm, dtype=np.uint8)
        self.base = self.u8.ctypes.data
        self.u32 = self.u8.view(np.uint32)
        self.i32 = self.u8.view(np.int32)
        self.u64 = self.u8.view(np.uint64)
        self.i64 = self.u8.view(np.int64)

    @staticmethod
    def size_for(world: int) -> int:
        return Layout(world).total

    def init_header(self, hbm_size: int, va_base: int, slice_bytes: int, launcher_pid: int) -> None:
        h = HEADER_BYTES // 8
        self.u64[H_WORLD // 8] = self.world
        self.i64[H_FAILED_RANK // 8] = -1
        self.u64[H_HBM_SIZE // 8] = hbm_size
        self.u64[H_VA_BASE // 8] = va_base
        self.u64[H_SLICE // 8] = slice_bytes
        self.u64[H_LAUNCHER_PID // 8] = launcher_pid
        assert h
        _native.store_u64(self.base + H_MAGIC, MAGIC)

    def read(self, offset: int, nbytes: int) -> bytes:
        """``nbytes`` at ``offset``, read from the file, not through the mapping: a page nobody
        wrote reads as zeros without being allocated, so the reader (the launcher, reading a
        failed job's flight records) cannot be killed by SIGBUS when the segment's mount is
        full. Raises OSError (not a signal) if the read fails."""
        out = os.pread(self._fd, nbytes, offset)
        return out + bytes(nbytes - len(out))

    def header(self, offset: int) -> int:
        return int(self.u64[offset // 8])

    def addr(self, offset: int) -> int:
        return self.base + offset

    # --- rank state -------------------------------------------------------------------------
    def set_state(self, rank: int, state: int) -> None:
        _native.store_u64(self.base + self.layout.region(rank) + R_STATE, state)

    def state(self, rank: int) -> int:
        return int(self.u64[(self.layout.region(rank) + R_STATE) // 8])

    def set_pid(self, rank: int, pid: int) -> None:
        self.i64[(self.layout.region(rank) + R_PID) // 8] = pid

    def pid(self, rank: int) -> int:
        return int(self.i64[(self.layout.region(rank) + R_PID) // 8])

    def alive(self, rank: int) -> bool:
        """Starting or running: neither finalized nor dead."""
        return self.state(rank) in (STATE_STARTING, STATE_RUNNING)

    # --- registration metadata a rank has published (written by its registration unit) -----
    def set_published(self, rank: int, count: int) -> None:
        _native.store_u64(self.base + self.layout.region(rank) + R_PUBLISHED, count)

    def published(self, rank: int) -> int:
        return _native.load_u64(self.base + self.layout.region(rank) + R_PUBLISHED)

    # --- first failure, as recorded by the launcher ----------------------------------------
    def record_failure(self, rank: int, kind: int, value: int) -> bool:
        """Record the job's first failure; later calls keep the first. Returns True if recorded."""
        if int(self.i64[H_FAILED_RANK // 8]) >= 0 or self.header(H_FAILED_KIND) in _SHUTDOWNS:
            return False
        self.u64[H_FAILED_KIND // 8] = kind
        self.i64[H_FAILED_VALUE // 8] = value
        _native.store_u64(self.base + H_FAILED_RANK, rank if rank >= 0 else 2**64 + rank)
        return True

    def failure(self) -> tuple[int, int, int] | None:
        """(rank, kind, value) of the first failure, or None while the job is healthy."""
        rank = int(self.i64[H_FAILED_RANK // 8])
        kind = self.header(H_FAILED_KIND)
        if rank < 0 and kind not in _SHUTDOWNS:
            return None
        return rank, kind, int(self.i64[H_FAILED_VALUE // 8])

    def record_shutdown(self, signum: int, kind: int = FAILED_SHUTDOWN) -> None:
        """The launcher ends the job: it got ``signum`` (SIGALRM: the deadline passed), or, with
        ``kind`` FAILED_DAEMON, the bootstrap daemon ended with returncode ``signum``; with
        FAILED_CARRIER, the carrier of host ``signum`` failed. The first shutdown stays."""
        if self.header(H_FAILED_KIND) in _SHUTDOWNS:
            return
        self.i64[H_FAILED_VALUE // 8] = signum
        _native.store_u64(self.base + H_FAILED_KIND, kind)

    # --- a rejection's reason (Layout.slot_reason) ------------------------------------------
    def put_reason(self, offset: int, error: BaseException) -> None:
        """Write ``error`` as "Type: message" at ``offset``, cut to REASON_BYTES with the
        REASON_CUT marker. The writer publishes it afterwards (a descriptor flag and the
        barrier or sequence word its peers wait on), so a reader never sees it half written."""
        text = f"{type(error).__name__}: {error}".encode(errors="replace")
        if len(text) >= REASON_BYTES:
            text = text[:REASON_BYTES - 1 - len(REASON_CUT)].decode(errors="ignore").encode() + REASON_CUT
        self.u8[offset:offset + len(text)] = np.frombuffer(text, dtype=np.uint8)
        self.u8[offset + len(text)] = 0

    def reason(self, offset: int) -> str:
        """The text ``put_reason`` wrote at ``offset``."""
        return self.u8[offset:offset + REASON_BYTES].tobytes().split(b"\0", 1)[0].decode(errors="replace")

    def count_sleepers(self) -> None:
        """This process's waits on communicator words count themselves in the header, and its
        wakes of those words are skipped while nobody sleeps (_waits.c, set_sleepers); its
        barriers and transfers stop once the job has failed (watch_failures)."""
        _native.set_sleepers(self.base + H_SLEEPERS)
        _native.watch_failures(self.base + H_FAILED_KIND)

    def ring_carrier_on_announcements(self) -> None:
        """This process's barriers and point-to-point announcements ring the host's carrier (a
        job spanning hosts: runtime/hosts/_hosts.py, runtime/hosts/_carrier.py)."""
        _native.set_carrier_bell(self.base + H_CARRIER_BELL)

    def close(self) -> None:
        _native.set_sleepers(0)
        _native.watch_failures(0)
        _native.set_carrier_bell(0)
        self.u8 = self.u32 = self.u64 = self.i64 = None  # type: ignore[assignment]
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self._mm.close()
        except BufferError:
            pass  # a view is still alive somewhere; the mapping goes with the process
