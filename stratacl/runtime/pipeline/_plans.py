"""Timed plans shared by a job's ranks: one rank times a call's shape, every rank maps it.

Under a modeled clock every member of a call runs the call's timed plan (``ub._clock``:
``FabricModel.plan``) on every member's entering clock, so every member needs the whole plan:
the fabric's share of every transfer and every member's core runs, O(N^2) work and memory for
a full-mesh call of N members (about 0.1 s and a few MiB at N = 256). Computed by each of N
ranks that is O(N^3) a job; shared, it is computed once:

    fetch(key, make)
        /dev/shm/stratacl-<job>-plan-<digest of key>        exists -> map it
        otherwise try the exclusive flock of its ``.lock`` file, without waiting
            taken: exists now -> map it;  else make(), write it beside, rename it into place, map it
            held by a maker: wait for the shared flock (granted to every waiter at once when the
                maker lets go), map it; absent then (the maker died): queue for the exclusive one

Held once per host, not once per rank. A plan file is the plan's pickle (protocol 5) with its
arrays out of band, each at a 64-byte aligned offset of the file:

    header   MAGIC, in-band length, buffer count, (offset, length) of each buffer
    in-band  the pickle of the plan's Python objects (lists, tuples, core runs: a few KiB)
    buffers  the bytes of every array the plan holds (its durations, flag latencies, core
             timelines: 0.5-3 MiB at N = 384)

A rank maps the file read-only and shared (it is tmpfs: the pages are the file's, counted once
on the host) and rebuilds the plan's objects from the in-band part with its arrays as views of
the mapping. Only those few Python objects are the rank's own, so a rank's memory stays flat
in N where each rank held a private copy of every plan before (5.5 MiB a rank at N = 384 for
the README example's calls, 2 GiB for the job). The arrays are the bytes the maker computed,
so the modeled times are the same bit for bit; they are read-only in every rank, the maker
included (it maps its own file too), so a consumer that wrote into a plan would fail at once
rather than change one rank's times.

A rank that dies holding the lock releases it by exiting (flocks end with their holder), so
no rank waits on a dead one: the next in line makes the plan itself. The names carry the job's
prefix, so the launcher's sweep removes them with the job's segments.

Only calls of at least ``SHARE_FROM`` members are shared (below that a plan costs less than
the file work), and at most ``SHARE_LIMIT`` shapes a process: calls given by their traffic
(all_to_all_v, MoE) are not shared, since their matrices differ from call to call.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import mmap
import os
import pickle
import struct
from typing import Callable

from ..._errors import BootstrapError, StrataError
from ..memory import prefix

SHARE_FROM = 64          # members of a call from which its plan is shared
SHARE_LIMIT = 512        # shapes a process shares at most (each is a file in /dev/shm)
SHM_DIR = "/dev/shm"
MAGIC = b"stratacl-plan-v2"   # 16 bytes: a plan file's first bytes
_ALIGN = 64              # offset of every array's bytes in a plan file


class SharedPlans:
    """The job's store of timed plans, keyed by bytes that name the model and the call."""

    def __init__(self, job_id: str, directory: str = SHM_DIR, share_from: int = SHARE_FROM):
        self._stem = os.path.join(directory, f"{prefix(job_id)}plan-")
        self.share_from = int(share_from)
        self._shared = 0

    def wants(self, members: int) -> bool:
        """Whether a call of ``members`` members goes through the store."""
        return members >= self.share_from and self._shared < SHARE_LIMIT

    def fetch(self, key: bytes, make: Callable[[], object]):
        """The plan stored under ``key``, made by ``make`` (once in the job) if it is not there."""
        self._shared += 1
        path = self._stem + hashlib.blake2b(key, digest_size=16).hexdigest()
        got = _load(path)
        if got is not None:
            return got
        try:
            fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError:             # /dev/shm full (of inodes): the plan is this rank's alone
            return make()
        try:
            _own(fd, path + ".lock")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # another rank holds it, making the plan: wait for a shared lock, which the kernel
                # grants every waiter at once when the maker lets go (queued for the exclusive
                # one they would be let in one by one: N scheduler hand-offs for every shape)
                fcntl.flock(fd, fcntl.LOCK_SH)
                got = _load(path)
                if got is not None:
                    return got
                fcntl.flock(fd, fcntl.LOCK_EX)        # the maker died before writing it
            got = _load(path)
            if got is None:
                part = f"{path}.{os.getpid()}"
                plan = make()
                try:
                    with open(part, "wb", opener=lambda p, flags: os.open(p, flags | os.O_EXCL | os.O_NOFOLLOW,
                                                                          0o600)) as f:
                        _write(f, plan)
                    os.rename(part, path)
                except OSError:     # /dev/shm full (a small one: docs/memory.md): share nothing, go on
                    try:
                        os.unlink(part)
                    except OSError:
                        pass
                    return plan
                got = _load(path)         # the maker holds the mapped plan too, not its own copy
                _trim()
            return got
        finally:
            os.close(fd)


def _trim() -> None:
    """Give the heap that making a plan grew back to the system: its N^2 temporaries are freed
    but stay in glibc's heap otherwise (5 MiB of a maker's memory at N = 384)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):      # not glibc
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


def _write(f, plan) -> None:
    """``plan`` into the open file ``f``: header, in-band pickle, arrays out of band (aligned)."""
    buffers: list = []
    inband = pickle.dumps(plan, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    head = len(MAGIC) + 16 + 16 * len(raws)
    at = _aligned(head + len(inband))
    spans = []
    for r in raws:
        spans += [at, r.nbytes]
        at = _aligned(at + r.nbytes)
    f.write(MAGIC + struct.pack(f"<QQ{len(spans)}Q", len(inband), len(raws), *spans) + inband)
    for r, offset in zip(raws, spans[::2]):
        f.write(bytes(offset - f.tell()))
        f.write(r)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _own(fd: int, path: str) -> None:
    """Refuse a file of the job's that another user made (its name was taken first): a plan is
    unpickled, a lock is held; neither may be another's."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise BootstrapError(f"{path}: made by uid {st.st_uid} with mode {st.st_mode & 0o777:o}, not by this user "
                             f"with mode 600; it is not read (remove it, and find who made it)")


def _load(path: str):
    """The plan in ``path``, its arrays read-only views of the file mapped shared; None if absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        _own(fd, path)
        view = memoryview(mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ))
    finally:
        os.close(fd)
    if view[:len(MAGIC)] != MAGIC:
        raise StrataError(f"modeled clock: the shared plan {path} starts with {bytes(view[:len(MAGIC)])!r}, expected "
                          f"{MAGIC!r}: something other than this library's plan store wrote it; remove the job's "
                          f"plan files ({os.path.basename(path).rsplit('-', 1)[0]}-*) and run the job again")
    at = len(MAGIC)
    inband, count = struct.unpack_from("<QQ", view, at)
    spans = struct.unpack_from(f"<{2 * count}Q", view, at + 16)
    at += 16 + 16 * count
    return pickle.loads(view[at:at + inband],
                        buffers=[view[o:o + n] for o, n in zip(spans[::2], spans[1::2])])
