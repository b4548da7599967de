"""One host's end of a job's cross-host path (``Carrier``): the host's HBM segments exposed to
the other hosts in one MPI window, and the other hosts' bytes read into mirrors; and the host's
event loop (``serve``) that carries words, bytes and failures between hosts.

A job spanning hosts runs one carrier per host (``CarrierThread``), over an MPI communicator
of one process per host (the ``cluster`` extra installs mpi4py and the Open MPI wheel): in a
thread of the host's launcher under ``stratacl-launch --hosts`` (jobs/_hostjob.py), in a thread
of the host's first rank under the user's mpirun, in a process of its own under torchrun
(``main``; runtime/hosts/_foreign.py). Ranks keep their host's shared memory and native path; no rank maps a segment of
another host. What crosses hosts (docs/cluster.md, "Across hosts") goes through ``serve``, the host's event loop (below): the words of the ranks' slots and
point-to-point announcements as messages between carriers, the bytes of HBM with ``read``:
``MPI_Get`` at the owner's HBM offset, from a dynamic window (``MPI_Win_create_dynamic``, each
local segment attached where the carrier maps it; the addresses are traded once, at
construction) under a shared passive-target lock, into the owner's mirror on this host (which
the host's ranks map at the owner's shadow addresses). The owner's carrier does nothing for it
but call into MPI now and then, which ``serve`` does every POLL_S. A want that names no mirror
or leaves the segment is refused with ``ValueError`` after the other wants were read.

Constructing a carrier is collective over ``comm``; ``close`` (collective too) frees the window.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Iterable, Mapping, Sequence

import numpy as np

from .. import _native
from ..memory import RegistrationUnit
from ..services import (
    CARRIER_QUEUE, COMM_SLOTS, F_ADDR, F_AUX1, F_NBYTES, F_SEG_OFF, F_SEG_SIZE, F_SEG_VA, H_CARRIER,
    H_CARRIER_BELL, H_CARRIER_PID, H_CARRIER_READ, H_HBM_SIZE, H_SLICE, H_VA_BASE, STATE_DEAD, STATE_FINALIZED, Control,
)
from ._carrierwords import CarrierWords
from ._reads import FarReads
from ._lost import TAG_FAILED, HostLost, failed, lost_hosts
from ._requests import TAG_UPDATE, TAG_UPDATED, FarRequests


class Carrier:
    """One host's carrier over ``comm`` (one MPI process per host; host index = ``comm.rank``).

    ``host_of[r]``: the host of job rank r. ``local``: this host's ranks' HBM segments (any
    writable buffer of at least ``hbm_size`` bytes, mapped by this process), exposed to the
    other hosts. ``mirrors``: for each rank of another host whose bytes this host's ranks read,
    the buffer its bytes land in. Collective over ``comm``."""

    def __init__(self, comm, hbm_size: int, host_of: Sequence[int], local: Mapping[int, object],
                 mirrors: Mapping[int, object]):
        from mpi4py import MPI
        self._mpi = MPI
        self.comm = comm
        self.host = comm.rank
        self.hbm_size = int(hbm_size)
        self.host_of = [int(h) for h in host_of]
        self._local = {int(r): self._bytes(b, f"segment of rank {r}") for r, b in local.items()}
        self._mirrors = {int(r): self._bytes(b, f"mirror of rank {r}") for r, b in mirrors.items()}
        wrong = sorted(r for r in self._local if self.host_of[r] != self.host)
        wrong += sorted(r for r in self._mirrors if self.host_of[r] == self.host)
        if wrong:
            raise ValueError(f"carrier of host {self.host}: ranks {wrong} are on the wrong side (a local segment "
                             f"must be of a rank of this host, a mirror of a rank of another host)")
        # an MPI error raises here instead of aborting the process (MPI_ERRORS_ARE_FATAL): with
        # Open MPI's fault tolerance on (MPIRUN_FLAGS), a host whose process died makes the next
        # call that involves it raise MPI_ERR_PROC_FAILED, and ``failed`` names that host
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        self._win = MPI.Win.Create_dynamic(comm=comm)
        self._win.Set_errhandler(MPI.ERRORS_RETURN)
        for a in self._local.values():
            self._win.Attach(a)
        self._at: dict[int, int] = {}                # rank -> address of its segment at its carrier
        for table in comm.allgather({r: MPI.Get_address(a) for r, a in self._local.items()}):
            self._at.update(table)
        self.moved = 0                                # bytes read from other hosts, ever
        self.failure: BaseException | None = None     # what ``failed`` made of the first error
        self.failing = threading.Lock()               # the carrier and the host watch may both fail
        self.outstanding: list = []                   # serve's sends in flight (their buffers)

    def _bytes(self, buf, what: str) -> np.ndarray:
        a = np.frombuffer(buf, np.uint8)
        if a.size < self.hbm_size:
            raise ValueError(f"{what}: {a.size} bytes, expected at least {self.hbm_size}")
        return a[:self.hbm_size]

    def _checked(self, wants, refused: list) -> list:
        plan = []
        for owner, offset, nbytes in wants:
            owner, offset, nbytes = int(owner), int(offset), int(nbytes)
            if owner not in self._mirrors or owner not in self._at:
                refused.append(f"rank {owner} has no mirror on host {self.host}")
            elif offset < 0 or nbytes < 0 or offset + nbytes > self.hbm_size:
                refused.append(f"rank {owner}: bytes [{offset}, {offset + nbytes}) leave its {self.hbm_size}-byte "
                               f"segment")
            elif nbytes:
                plan.append((owner, offset, nbytes))
        return plan

    def read(self, wants: Iterable[tuple[int, int, int]]) -> int:
        """Read each (owner rank, HBM offset, bytes) from the owner's segment into its mirror
        here, each owner's host under a shared passive-target lock; returns the bytes read. The
        owners' carriers must call into MPI meanwhile (``serve`` polls it) for their side to
        progress."""
        return self._move(wants, "read")

    def put(self, wants: Iterable[tuple[int, int, int]]) -> int:
        """Put each (owner rank, HBM offset, bytes) of the owner's mirror here into its segment,
        as ``read`` reads; the lock's release (MPI_Win_unlock) completes them there first."""
        return self._move(wants, "put")

    def _move(self, wants, what: str) -> int:
        refused: list = []
        plan = self._checked(wants, refused)
        MPI, win = self._mpi, self._win
        op = win.Get if what == "read" else win.Put
        for host in sorted({self.host_of[o] for o, _, _ in plan}):
            win.Lock(host, MPI.LOCK_SHARED)
            for owner, offset, nbytes in plan:
                if self.host_of[owner] == host:
                    op([self._mirrors[owner][offset:offset + nbytes], MPI.BYTE], host,
                       target=(self._at[owner] + offset, nbytes, MPI.BYTE))
            win.Unlock(host)
        moved = sum(p[2] for p in plan)
        self.moved += moved if what == "read" else 0
        if refused:
            raise ValueError(f"carrier of host {self.host}: refused {len(refused)} {what}(s): " + "; ".join(refused))
        return moved

    def address(self, rank: int) -> int:
        """Where this process maps the segment of ``rank``, a rank of this host."""
        return self._local[rank].ctypes.data

    def segment(self, rank: int) -> np.ndarray:
        """The bytes of ``rank``'s segment here: its own for a rank here, else its mirror."""
        return self._local[rank] if rank in self._local else self._mirrors[rank]

    def close(self) -> None:
        """Free the window (collective). The buffers stay the caller's."""
        if self._win is None:
            return
        for a in self._local.values():
            self._win.Detach(a)
        self._win.Free()
        self._win = None


# --- the host's event loop -----------------------------------------------------------------
TAG_SEND, TAG_DONE, TAG_BLOCK = 11, 12, 14           # carrier-to-carrier messages (serve; TAG_FAILED: _lost.py)
TAG_WATCH = 15                                      # never sent: the host watch's receive
TAG_RING = 16                                       # a member's ring-step word, to its right neighbour's host
POLL_S = 0.001                                      # how often an idle carrier calls into MPI
WATCH_S = 0.05                                      # how often the host watch asks MPI (CarrierThread)


def serve(ctl, carrier: Carrier, chunk: int, table_offset: int, slice_start, stop=lambda: False) -> None:
    """Carry this host's side of the job (runtime/hosts/_hosts.py) until ``stop()``, one event at a
    time, asleep on the host's bell between them (and calling into MPI every POLL_S, which is
    how other carriers' reads of this host progress):

    - barrier k of a communicator spanning hosts, once its members on this host all arrived
      (an entry in the host's queue, H_CARRIER, naming the member that arrived last and its
      slot, whose card lists the members and their slots): send their slot words to every
      other host in the communicator, and once every such host's have come, write them here,
      read what the call's slice maps have the members here pull from far members in the
      next phase into the mirrors (passive-target reads; runtime/hosts/_reads.py), set the
      barrier's generation word; and before the words leave, put what the members here
      stored into far members' mirrors in the phase the barrier ends into their segments;
    - a send from a rank here to a far rank (its sequence word moved): the descriptor and the
      number go to the receiver's carrier, which reads the sender's segment into its mirror
      before it announces the send to the receiver; the receiver's answer (done word, status)
      comes back the same way;
    - a ring step finished by a rank here whose right neighbour in a communicator is far (its
      ring-step word moved): the word goes to the neighbour's carrier, which reads what the
      neighbour's next steps pull from the rank (runtime/hosts/_reads.py, ``FarReads.ring``)
      into the mirror before it writes the word there;
    - a one-sided call of a rank here with a far peer (its request word moved): its bytes put
      or got, or its update made by the peer's carrier, then the rank answered
      (runtime/hosts/_requests.py). A rank makes one request at a time, so its put is in
      place before its next request (the signal of a put_signal) leaves;
    - the job's first failure recorded on this host goes to every other host, and one
      recorded elsewhere is recorded here."""
    from mpi4py import MPI

    NO_READS = _native.CARRIER_NO_READS
    comm = carrier.comm
    world, host, host_of = ctl.world, carrier.host, carrier.host_of
    mine = [r for r in range(world) if host_of[r] == host]
    w = CarrierWords(ctl)
    queue, bell = ctl.base + H_CARRIER, ctl.base + H_CARRIER_BELL

    def read(wants) -> None:     # counted for the host's ranks (stats()), before they are told
        carrier.read(wants)
        _native.store_u64(ctl.base + H_CARRIER_READ, carrier.moved)

    far = FarReads(ctl, host, host_of, read, carrier.segment, chunk, table_offset, slice_start)

    # point-to-point words of members here towards far members, of the world communicator and
    # of each communicator spanning hosts a member here announced (an entry k = 0, with its
    # card): (a, a's slot, b's index, b, b's slot, a's index); and what was forwarded last
    pairs: list[tuple] = []
    seq_at = done_at = np.zeros(0, np.int64)
    sent = answered = np.zeros(0, np.uint32)

    # ring-step words of members here whose right neighbour is far, in the world and in each
    # communicator spanning hosts: (members, slots, the member's index); what was forwarded last
    rings: list[tuple] = []
    ring_at = np.zeros(0, np.int64)
    stepped = np.zeros(0, np.uint32)

    def carry_p2p(a: int, members: list[int], slots: list[int]) -> None:
        nonlocal seq_at, done_at, sent, answered, ring_at, stepped
        i = members.index(a)
        new = [(a, slots[i], j, b, slots[j], i) for j, b in enumerate(members) if host_of[b] != host]
        pairs.extend(new)
        seq_at = np.append(seq_at, [w.send_seq(*p[:3]) // 4 for p in new]).astype(np.int64)
        done_at = np.append(done_at, [w.recv_done(*p[:3]) // 4 for p in new]).astype(np.int64)
        # the world's words may have moved before this loop began; a new communicator's are 0
        # until its first call, which may be announced before this entry is read
        world_words = not any(slots)
        zero = np.zeros(len(new), np.uint32)
        sent = np.append(sent, ctl.u32[seq_at[len(sent):]] if world_words else zero).astype(np.uint32)
        answered = np.append(answered, ctl.u32[done_at[len(answered):]] if world_words else zero).astype(np.uint32)
        if host_of[members[(i + 1) % len(members)]] != host:
            rings.append((members, slots, i))
            ring_at = np.append(ring_at, w.ring_step(a, slots[i]) // 4).astype(np.int64)
            stepped = np.append(stepped, ctl.u32[ring_at[-1]] if world_words else 0).astype(np.uint32)

    for a in mine:
        carry_p2p(a, list(range(world)), [0] * world)

    requests = FarRequests(ctl, carrier, comm, mine, host_of, read)      # one-sided calls with far peers
    failure_known = ctl.failure() is not None
    head = _native.load_u64(queue + 8)
    waiting: dict[tuple, deque] = {}     # communicator -> its barriers handed here, oldest first
    inbox: dict[tuple, int] = {}         # (communicator, host) -> its arrivals not yet used here
    # isend requests not known complete: each holds the buffer MPI sends from, so it must live
    # until then, also past the loop (the carrier keeps what is left: Carrier.outstanding)
    sending: list = carrier.outstanding
    status = MPI.Status()
    while not stop():
        seen = _native.load_u32(bell)
        busy = False
        # barriers whose members here have all arrived
        while head != _native.load_u64(queue):
            entry = queue + 64 + 8 * (head % CARRIER_QUEUE)
            v = _native.load_u64(entry)
            if not v:
                break                    # its place taken, not written yet
            _native.store_u64(entry, 0)
            head += 1
            _native.store_u64(queue + 8, head)
            pulled = not v & NO_READS       # a call's departure: nothing is pulled after it
            r, slot = divmod(((v & ~NO_READS) >> 32) - 1, COMM_SLOTS)
            members, slots = w.card(r, slot)
            busy = True
            if not v & 0xFFFFFFFF:           # a new communicator: carry r's point-to-point words
                carry_p2p(r, members, slots)
                far.forget(members, slots)
                continue
            key = (members[0], slots[0])
            # far stores of the phase this barrier ends: in their owners' segments before it leaves
            carrier.put(far.stores(members, slots))
            block = b"".join(bytes(ctl.u8[w.own(m, sl)]) for m, sl in zip(members, slots) if host_of[m] == host)
            hosts = sorted({host_of[m] for m in members} - {host})
            sending += [comm.isend((members, slots, block), dest=g, tag=TAG_BLOCK) for g in hosts]
            waiting.setdefault(key, deque()).append((v & 0xFFFFFFFF, members, slots, hosts, pulled))
            busy = True
        for key, barriers in waiting.items():
            while barriers and all(inbox.get((key, g)) for g in barriers[0][3]):
                k, members, slots, hosts, pulled = barriers.popleft()
                for g in hosts:
                    inbox[key, g] -= 1
                if pulled:
                    read(far.barrier(members, slots))
                gen = w.gen(members[0], slots[0])
                _native.store_u32(gen, k)
                _native.futex_wake(gen, 2**31 - 1)
                busy = True
        sending[:] = [q for q in sending if not q.Test()]
        # sends and answers of ranks here to far ranks
        if pairs:
            now_sent, now_answered = ctl.u32[seq_at], ctl.u32[done_at]
            for i in np.flatnonzero(now_sent != sent):
                pair = pairs[i]
                d = np.array(w.descriptor(w.send_desc(*pair[:3])))
                why = bytes(ctl.u8[w.send_reason(*pair[:3])])
                comm.send((pair, int(now_sent[i]), d, why), dest=host_of[pair[3]], tag=TAG_SEND)
                busy = True
            for i in np.flatnonzero(now_answered != answered):
                pair = pairs[i]
                # a's answer, why it failed if it did, and its modeled receive time, which it
                # wrote into b's descriptor of the send (runtime/communicator/_p2p.py, _complete_send)
                st = int(ctl.u32[w.recv_status(*pair[:3]) // 4])
                why = bytes(ctl.u8[w.recv_reason(*pair[:3])])
                t = int(w.descriptor(w.send_desc(*pair[3:]))[F_AUX1])
                comm.send((pair, int(now_answered[i]), st, why, t), dest=host_of[pair[3]], tag=TAG_DONE)
                busy = True
            sent, answered = now_sent.copy(), now_answered.copy()
        # ring steps of ranks here, to their right neighbours' hosts (after the blocks of the
        # barriers they passed: a far neighbour's carrier has the call's descriptors first)
        if rings:
            now_stepped = ctl.u32[ring_at]
            for k in np.flatnonzero(now_stepped != stepped):
                members, slots, i = rings[k]
                comm.send((members, slots, i, int(now_stepped[k])), dest=host_of[members[(i + 1) % len(members)]],
                          tag=TAG_RING)
                busy = True
            stepped = now_stepped.copy()
        busy = requests.poll() or busy
        # what other carriers sent
        while comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            tag, msg = status.Get_tag(), comm.recv(source=status.Get_source(), tag=status.Get_tag())
            if tag == TAG_BLOCK:
                # another host's members arrived: their words are written here at once, in
                # order with everything else that host sent (a send announced after the
                # barrier comes after them), as one host's memory would show them; the
                # barrier completes here once this host's members arrived too
                members, slots, block = msg
                at, g = 0, status.Get_source()
                for m, sl in zip(members, slots):
                    if host_of[m] == g:
                        at += w.write_collective(m, sl, block, at)
                key = (members[0], slots[0])
                inbox[key, g] = inbox.get((key, g), 0) + 1
            elif tag == TAG_SEND:
                # far member a's send to member b here: a's words where a's host has them
                pair, seq, d, why = msg
                a = pair[:3]
                w.descriptor(w.send_desc(*a))[:] = d
                ctl.u8[w.send_reason(*a)] = np.frombuffer(why, np.uint8)
                read(far.runs(pair[0], [(int(d[F_ADDR]), int(d[F_NBYTES]))], int(d[F_SEG_VA]), int(d[F_SEG_SIZE]),
                              int(d[F_SEG_OFF])))
                _native.store_u32(ctl.base + w.send_seq(*a), seq)
                _native.futex_wake(ctl.base + w.send_seq(*a), 2**31 - 1)
            elif tag == TAG_DONE:
                # far member a's answer to the send of member b here
                pair, seq, st, why, t = msg
                a = pair[:3]
                ctl.u8[w.recv_reason(*a)] = np.frombuffer(why, np.uint8)
                w.descriptor(w.send_desc(*pair[3:]))[F_AUX1] = t
                _native.store_u32(ctl.base + w.recv_status(*a), st)
                _native.store_u32(ctl.base + w.recv_done(*a), seq)
                _native.futex_wake(ctl.base + w.recv_done(*a), 2**31 - 1)
            elif tag == TAG_RING:
                # far member i's ring steps: what the member after it here pulls from them is
                # read before the word that lets it pull is written
                members, slots, i, now = msg
                word = w.ring_step(members[i], slots[i])
                read(far.ring(members, slots, i, int(ctl.u32[word // 4]), now))
                _native.store_u32(ctl.base + word, now)
                _native.futex_wake(ctl.base + word, 2**31 - 1)
            elif tag == TAG_UPDATE:
                requests.update(msg, status.Get_source())
            elif tag == TAG_UPDATED:
                requests.updated(msg)
            elif tag == TAG_FAILED and not failure_known:
                rank, kind, value = msg
                failure_known = True
                if rank < 0:                 # another host's carrier failed
                    ctl.record_shutdown(value, kind)
                else:
                    ctl.set_state(rank, STATE_DEAD)
                    ctl.record_failure(rank, kind, value)
            busy = True
        # the job's first failure, recorded here by the launcher
        if not failure_known and (f := ctl.failure()) is not None and f[0] >= 0:
            failure_known = True
            for g in range(comm.size):
                if g != host:
                    comm.send(f, dest=g, tag=TAG_FAILED)
        if not busy:
            _native.futex_wait(bell, seen, POLL_S)
    end = time.monotonic() + 5           # stopping: let the last blocks leave (bounded)
    while sending and time.monotonic() < end:
        sending[:] = [q for q in sending if not q.Test()]
        time.sleep(0.001)


# settings each process may have its own of; every other one must be the same on every host
PER_PROCESS = {"STRATACL_TIMEOUT", "STRATACL_PROFILE", "STRATACL_TRACE", "STRATACL_TAG_OUTPUT", "STRATACL_DEBUG",
               "STRATACL_GRACE", "STRATACL_DEADLINE"}


def same_settings(comm, config) -> None:
    """Raise ValueError naming every setting the hosts do not agree on (a job over hosts whose
    launcher does not carry the settings, torchrun's nodes, takes each host's environment).
    Collective over the carriers."""
    mine = {k: v for k, v in config.as_env().items() if k not in PER_PROCESS}
    every = comm.allgather(mine)
    differ = sorted({k for e in every for k in set(e) | set(mine) if e.get(k) != mine.get(k)})
    if differ:
        said = "; ".join(f"{k}: " + ", ".join(f"host {g} {e.get(k, '(default)')}" for g, e in enumerate(every))
                         for k in differ)
        raise ValueError(f"the hosts' settings differ ({said}); give every host the same STRATACL_* settings")


class CarrierThread:
    """This host's carrier, serving in a thread while the process's main thread goes on: in a
    host launcher (jobs/_hostjob.py), which stops it once its ranks ended; or in the first rank
    of a host under mpirun (runtime/hosts/_foreign.py, ``until_done``), where it stops by itself once
    every rank of the host finalized or died and every other host's carrier did too. Over
    ``comm`` (one process per host, host index = ``comm.rank``), with the host's control
    segment and every rank's HBM segment (this host's ranks' own, the other ranks' mirrors).
    Constructing it is collective over ``comm``."""

    def __init__(self, comm, host_of: list[int], ctl, hbm_fds: list[int], config, until_done: bool = False):
        import mmap

        same_settings(comm, config)
        hbm, slice_bytes, va_base = ctl.header(H_HBM_SIZE), ctl.header(H_SLICE), ctl.header(H_VA_BASE)
        maps = {r: mmap.mmap(fd, hbm, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) for r, fd in enumerate(hbm_fds)}
        mine = {r for r, h in enumerate(host_of) if h == comm.rank}
        self.carrier = Carrier(comm, hbm, host_of, {r: m for r, m in maps.items() if r in mine},
                               {r: m for r, m in maps.items() if r not in mine})
        expandable = config.allocator == "expandable" and config.registration != "pool"
        chunk = config.chunk_size if expandable else 0
        table_offset = RegistrationUnit.table_offset(hbm, slice_bytes, chunk) if chunk else 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._ending = comm.Dup() if until_done else None       # the carriers' last meeting
        self._watched = comm.Dup()          # where the watch learns that another host's process died
        self._watched.Set_errhandler(self.carrier._mpi.ERRORS_RETURN)
        self.lost: HostLost | None = None
        self._grace = config.grace
        started, failed_at = time.monotonic(), []

        def done() -> bool:
            # stopped; or, until_done: every rank of the host is done, or, bounded, the job
            # failed (its ranks raise and leave) or a rank never came (its daemon gave up on it)
            if self._stop.is_set():
                return True
            if not until_done:
                return False
            if all(ctl.state(r) in (STATE_FINALIZED, STATE_DEAD) for r in mine):
                return True
            now = time.monotonic()
            if not failed_at and ctl.failure() is not None:
                failed_at.append(now)
            if failed_at and now - failed_at[0] > 2 * config.grace + 10:
                return True
            return now - started > config.timeout and any(ctl.pid(r) <= 0 for r in mine)
        self._thread = threading.Thread(
            target=self._run, args=(ctl, chunk, table_offset, lambda r: va_base + r * slice_bytes, done),
            name="stratacl-carrier", daemon=True)
        self._watch = threading.Thread(target=self._watch_hosts, args=(ctl,), name="stratacl-host-watch",
                                       daemon=True)
        self._watch.start()
        self._thread.start()

    def _watch_hosts(self, ctl) -> None:
        """Until stopped, learn within WATCH_S that another host's process (its launcher, or its
        carrier) died, whatever the carrier thread is doing: a read from that host's window may
        never return (Open MPI's one-sided component does not fail it), so the carrier itself
        might never see it. A receive nothing is ever sent to is failed by MPI once a process of
        the communicator is (--with-ft ulfm): then the job ends here naming the lost host, as
        ``failed`` would, and the launcher is told (``error``)."""
        MPI = self.carrier._mpi
        req = self._watched.Irecv(bytearray(8), source=MPI.ANY_SOURCE, tag=TAG_WATCH)
        try:
            while not self._stop.wait(WATCH_S):
                req.Test()
        except MPI.Exception as e:
            if lost_hosts(self._watched, e) and self.error is None:
                error = failed(ctl, self.carrier, e, self._watched)
                self.lost = error if isinstance(error, HostLost) else None
                self.error = f"{type(error).__name__}: {error}"
            return
        try:
            req.Cancel()
            req.Wait()
        except MPI.Exception:
            pass

    def _run(self, ctl, chunk: int, table_offset: int, slice_start, stop) -> None:
        try:
            try:
                serve(ctl, self.carrier, chunk, table_offset, slice_start, stop=stop)
            except BaseException as e:
                raise failed(ctl, self.carrier, e) from None
            if self._ending is not None:
                # this host is done, but another host's carrier may still read its segments:
                # serve them (MPI progresses while we test) until every carrier is here. Bounded:
                # a host gone for good does not hold this one.
                req, end = self._ending.Ibarrier(), time.monotonic() + 2 * self._grace + 10
                while not req.Test() and time.monotonic() < end:
                    time.sleep(POLL_S)
        except BaseException as e:      # the launcher ends the job and says why
            self.error = f"{type(e).__name__}: {e}"
        finally:
            if self._ending is not None:    # ended by itself: so does the watch, before MPI ends
                self._stop.set()
                self._watch.join(timeout=10)

    def join(self, timeout: float) -> bool:
        """Wait at most ``timeout`` s for the carrier to end by itself; True if it did."""
        self._thread.join(timeout=timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._watch.join(timeout=10)
        # a carrier stuck in a read from a lost host never returns: it is not waited for
        self._thread.join(timeout=0.5 if self.lost is not None else 10)


# how the carriers' processes are started when a launcher of ours starts them (jobs/_hostjob.py,
# and under torchrun runtime/hosts/_foreign.py): TCP between hosts, the one-sided component that
# serves dynamic windows over it
MPIRUN_FLAGS = ("--with-ft", "ulfm", "--bind-to", "none", "--mca", "btl", "self,tcp", "--mca", "pml", "ob1",
                "--mca", "osc", "rdma")


def _users_mpi_setting(key: str) -> bool:
    """An MPI setting of the user's that an ``mpirun`` of carriers keeps: how it reaches the
    hosts (``PRTE_MCA_plm_ssh_agent``, ``..._args``: another rsh, ssh options) and which
    networks it uses (``OMPI_MCA_btl_tcp_if_include``, ``PRTE_MCA_oob_tcp_if_exclude``, ...)."""
    return key.startswith("PRTE_MCA_plm_ssh_") or (key.startswith(("OMPI_MCA_", "PRTE_MCA_"))
                                                    and key.endswith(("_if_include", "_if_exclude")))


def mpirun_env(env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The environment for an ``mpirun`` of carriers started from ``env`` (none of the MPI
    job this process may be part of, but the user's settings of how to reach the hosts), and
    its ``-x`` flags: the settings, Python's own variables and thread counts reach the other
    hosts."""
    env = {k: v for k, v in env.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_")) or _users_mpi_setting(k)}
    return env, [a for k in sorted(env) if k.startswith(("STRATACL_", "PYTHON", "OMP_")) for a in ("-x", k)]


def main(argv: list[str]) -> int:
    """A host's carrier in its own process (``python -m stratacl.runtime.hosts JOB WORLD HOSTS``,
    one per host under one mpirun, host index = MPI rank): opens the host's segments
    of job ``JOB``h<host> by name (runtime/hosts/_foreign.py leaves them until every rank has joined,
    which needs the carriers) and serves until every rank of every host is done."""
    import json
    import os

    from mpi4py import MPI

    from stratacl._config import Config
    from stratacl.runtime.memory import open_job_segments
    base, world, host_of = argv[0], int(argv[1]), json.loads(argv[2])
    comm = MPI.COMM_WORLD
    ctl_fd, hbm_fds = open_job_segments(f"{base}h{comm.rank}", world)
    ctl = Control(ctl_fd, world)
    # the host's daemon watches this process from now on: if it ends before the host's ranks,
    # they are told (FAILED_CARRIER) rather than left to time out
    _native.store_u64(ctl.base + H_CARRIER_PID, os.getpid() | comm.rank << 32)
    config = Config()
    thread = CarrierThread(comm, host_of, ctl, hbm_fds, config, until_done=True)
    mine, lost_at = [r for r, h in enumerate(host_of) if h == comm.rank], None
    while not thread.join(1.0):
        if thread.lost is None:
            continue
        # another host was lost: the carrier may be stuck in a read from it, which never
        # returns; once this host's ranks are gone (or after the bound the carrier itself
        # keeps), leave without MPI's finalize, as a host launcher does
        lost_at = lost_at or time.monotonic()
        if (all(ctl.state(r) in (STATE_FINALIZED, STATE_DEAD) for r in mine)
                or time.monotonic() - lost_at > 2 * config.grace + 10):
            print(f"stratacl carrier of host {comm.rank}: {thread.error}", flush=True)
            os._exit(1)
    for fd in (ctl_fd, *hbm_fds):
        os.close(fd)
    if thread.error:
        print(f"stratacl carrier of host {comm.rank}: {thread.error}", flush=True)
    return 1 if thread.error else 0


def hosts_of(world: int, hosts: int) -> list[int]:
    """The host of each rank: ``hosts`` contiguous blocks of ranks, as even as they come."""
    return [r * hosts // world for r in range(world)]

