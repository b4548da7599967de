"""One host's end of a job's cross-host path (``Carrier``): the host's HBM segments exposed to
the other hosts in one MPI window, the other hosts' bytes read into mirrors, and the control
blocks the hosts trade at a barrier.

A job spanning hosts runs one carrier per host, an MPI process (mpirun starts them; the
``cluster`` extra installs mpi4py and the Open MPI wheel). Ranks keep their host's shared
memory and native path; no rank maps a segment of another host. What crosses hosts crosses at
the barriers of communicators that span hosts (docs/cluster.md, "Across hosts: the carrier"),
in two collective steps every carrier takes in the same order:

    exchange(block)   every carrier gives one control block (its ranks' descriptors, states,
                      clocks: opaque bytes here) and receives every carrier's, in host order
    refresh(wants)    every carrier reads the byte ranges its ranks are about to pull from
                      ranks of other hosts, (owner rank, HBM offset, bytes), with MPI_Get at
                      that offset of the owner's segment into the owner's mirror on this host
                      (which the host's ranks map at the owner's shadow addresses)

The window is dynamic (``MPI_Win_create_dynamic``, each local segment attached where the
carrier maps it; the addresses are traded once, at construction) and refresh is one
active-target epoch: a fence opens it and one closes it, so every carrier is inside MPI while
the others read from it and no progress thread is needed. A want that names no mirror or
leaves the segment is refused with ``ValueError`` on its carrier after the closing fence, the
other wants of that refresh read: the other carriers are not left waiting, and the job can go
on.

Every carrier must call ``exchange`` and ``refresh`` the same number of times, in the same
order (they are collective over ``comm``), and ``close`` once at the end.
"""
from __future__ import annotations

import sys
from typing import Iterable, Mapping, Sequence

import numpy as np


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
        self._win = MPI.Win.Create_dynamic(comm=comm)
        for a in self._local.values():
            self._win.Attach(a)
        self._at: dict[int, int] = {}                # rank -> address of its segment at its carrier
        for table in comm.allgather({r: MPI.Get_address(a) for r, a in self._local.items()}):
            self._at.update(table)
        self.moved = 0                                # bytes read from other hosts, ever

    def _bytes(self, buf, what: str) -> np.ndarray:
        a = np.frombuffer(buf, np.uint8)
        if a.size < self.hbm_size:
            raise ValueError(f"{what}: {a.size} bytes, expected at least {self.hbm_size}")
        return a[:self.hbm_size]

    def exchange(self, block: bytes) -> list[bytes]:
        """Give this host's control block; returns every host's, in host order. Collective."""
        return self.comm.allgather(bytes(block))

    def refresh(self, wants: Iterable[tuple[int, int, int]]) -> int:
        """Read each (owner rank, HBM offset, bytes) from the owner's segment into its mirror
        here; returns the bytes read. Collective (the other carriers serve their segments)."""
        plan, refused = [], []
        for owner, offset, nbytes in wants:
            owner, offset, nbytes = int(owner), int(offset), int(nbytes)
            if owner not in self._mirrors or owner not in self._at:
                refused.append(f"rank {owner} has no mirror on host {self.host}")
            elif offset < 0 or nbytes < 0 or offset + nbytes > self.hbm_size:
                refused.append(f"rank {owner}: bytes [{offset}, {offset + nbytes}) leave its {self.hbm_size}-byte "
                               f"segment")
            elif nbytes:
                plan.append((owner, offset, nbytes))
        MPI, win = self._mpi, self._win
        win.Fence()
        for owner, offset, nbytes in plan:
            dst = self._mirrors[owner][offset:offset + nbytes]
            win.Get([dst, MPI.BYTE], self.host_of[owner], target=(self._at[owner] + offset, nbytes, MPI.BYTE))
        win.Fence()
        moved = sum(p[2] for p in plan)
        self.moved += moved
        if refused:
            raise ValueError(f"carrier of host {self.host}: refused {len(refused)} read(s): " + "; ".join(refused))
        return moved

    def mirror(self, rank: int) -> np.ndarray:
        """The bytes of ``rank``'s mirror on this host."""
        return self._mirrors[rank]

    def close(self) -> None:
        """Free the window (collective). The buffers stay the caller's."""
        if self._win is None:
            return
        for a in self._local.values():
            self._win.Detach(a)
        self._win.Free()
        self._win = None


# --- a host's carrier process in a job (python -m stratacl.jobs._carrier, under mpirun) -------
def _world_slot(ctl, rank: int) -> tuple[int, int]:
    """[start, end) in the control segment of the words of ``rank``'s world-communicator slot
    that are its own: all but the barrier counter and generation word, which are each host's."""
    from stratacl.runtime._control import Layout
    start = ctl.layout.slot(rank, 0)
    return start + Layout.SLOT_ARRIVAL, start + ctl.layout.slot_bytes


def serve(ctl, carrier: Carrier, chunk: int, table_offset: int, slice_start, stop=lambda: False) -> None:
    """Complete the world communicator's barriers on this host (runtime/_hosts.py): whenever the
    host's ranks have all arrived at barrier k (the control segment's H_CARRIER word), trade
    their slot words with the other hosts, read the HBM bytes the other hosts' ranks published
    in their descriptors into the mirrors, then set the barrier's generation word to k."""
    from stratacl.runtime import _native
    from stratacl.runtime._control import DESC_FIXED, F_CALL, F_NBYTES, F_SEG_OFF, F_SEG_SIZE, F_SEG_VA, H_CARRIER
    from stratacl.runtime._control import Layout
    from stratacl.ub._registration import RegistrationUnit
    world, lay, host, host_of = ctl.world, ctl.layout, carrier.host, carrier.host_of
    mine = [r for r in range(world) if host_of[r] == host]
    theirs = {g: [r for r in range(world) if host_of[r] == g] for g in set(host_of) if g != host}
    word = ctl.base + H_CARRIER
    gen = ctl.base + lay.slot(0, 0) + Layout.SLOT_GEN
    spans = {r: _world_slot(ctl, r) for r in range(world)}
    table_bytes = RegistrationUnit.table_bytes(slice_start(1) - slice_start(0), chunk) if chunk else 0
    done = 0
    while not stop():
        k = _native.load_u32(word)
        if k == done:
            _native.futex_wait(word, k, 1.0)
            continue
        block = b"".join(bytes(ctl.u8[a:b]) for a, b in (spans[r] for r in mine))
        for g, got in enumerate(carrier.exchange(block)):
            if g == host:
                continue
            at = 0
            for r in theirs[g]:
                a, b = spans[r]
                ctl.u8[a:b] = np.frombuffer(got, np.uint8, b - a, at)
                at += b - a
        remote = [r for g in theirs for r in theirs[g]]
        if chunk:
            carrier.refresh([(r, table_offset, table_bytes) for r in remote])
        wants = []
        for r in remote:
            descs = [ctl.i64[(lay.slot(r, 0) + lay.slot_desc(p)) // 8:][:DESC_FIXED] for p in (0, 1)]
            d = max(descs, key=lambda x: int(x[F_CALL]))
            va, size, off = int(d[F_SEG_VA]), int(d[F_SEG_SIZE]), int(d[F_SEG_OFF])
            if not int(d[F_NBYTES]) or not size:
                continue
            if not chunk:
                wants.append((r, off, size))
                continue
            table = carrier.mirror(r)[table_offset:table_offset + table_bytes].view(np.int64)
            for c in range(va, va + size, chunk):
                at = int(table[(c - slice_start(r)) // chunk]) - 1
                wants.append((r, at if at >= 0 else off, chunk))
        carrier.refresh(wants)
        _native.store_u32(gen, k)
        _native.futex_wake(gen, 2**31 - 1)
        done = k


def main() -> None:
    """``python -m stratacl.jobs._carrier JOB_ID WORLD HOSTS CHUNK`` under mpirun, one process per
    host (its MPI rank is its host's index): open the host's segments by name, serve."""
    import mmap
    import os

    from mpi4py import MPI

    from stratacl.runtime._control import H_HBM_SIZE, H_SLICE, H_VA_BASE, Control
    from stratacl.runtime._segments import prefix
    from stratacl.ub._registration import RegistrationUnit
    job_id, world, hosts, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    comm = MPI.COMM_WORLD
    host = comm.rank
    host_of = hosts_of(world, hosts)
    p = "/dev/shm/" + prefix(job_id)

    def opened(name: str):
        fd = os.open(p + name, os.O_RDWR)
        try:
            return mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)

    ctl = Control(os.open(p + control_name(host), os.O_RDWR), world)
    hbm = ctl.header(H_HBM_SIZE)
    slice_bytes, va_base = ctl.header(H_SLICE), ctl.header(H_VA_BASE)
    local = {r: opened(f"hbm-{r}") for r in range(world) if host_of[r] == host}
    mirrors = {r: opened(mirror_name(host, r)) for r in range(world) if host_of[r] != host}
    carrier = Carrier(comm, hbm, host_of, local, mirrors)
    table_offset = RegistrationUnit.table_offset(hbm, slice_bytes, chunk) if chunk else 0
    serve(ctl, carrier, chunk, table_offset, lambda r: va_base + r * slice_bytes)


def hosts_of(world: int, hosts: int) -> list[int]:
    """The host of each rank: ``hosts`` contiguous blocks of ranks, as even as they come."""
    return [r * hosts // world for r in range(world)]


def control_name(host: int) -> str:
    """The name (after the job's prefix) of ``host``'s copy of the control segment."""
    return "ctl" if host == 0 else f"ctl-h{host}"


def mirror_name(host: int, rank: int) -> str:
    """The name (after the job's prefix) of ``host``'s mirror of ``rank``'s HBM segment."""
    return f"mirror-h{host}-{rank}"


if __name__ == "__main__":
    main()
