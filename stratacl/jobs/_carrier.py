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

    def close(self) -> None:
        """Free the window (collective). The buffers stay the caller's."""
        if self._win is None:
            return
        for a in self._local.values():
            self._win.Detach(a)
        self._win.Free()
        self._win = None
