"""Timed plans shared by a job's ranks: one rank times a call's shape, the others read it.

Under a modeled clock every member of a call runs the call's timed plan (``ub._clock``:
``FabricModel.plan``) on every member's entering clock, so every member needs the whole plan:
the fabric's share of every transfer and every member's core runs, O(N^2) work and memory for
a full-mesh call of N members (about 0.1 s and a few MiB at N = 256). Computed by each of N
ranks that is O(N^3) a job; shared, it is computed once:

    fetch(key, make)
        /dev/shm/stratacl-<job>-plan-<digest of key>        exists -> load it
        otherwise take the exclusive flock of its ``.lock`` file (the kernel queues the others)
            exists now -> load it;  else make(), write it beside, rename it into place

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
import os
import pickle
from typing import Callable

from ._segments import prefix

SHARE_FROM = 64          # members of a call from which its plan is shared
SHARE_LIMIT = 512        # shapes a process shares at most (each is a file in /dev/shm)
SHM_DIR = "/dev/shm"


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
        fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            got = _load(path)
            if got is None:
                got = make()
                part = f"{path}.{os.getpid()}"
                with open(part, "wb", opener=lambda p, flags: os.open(p, flags, 0o600)) as f:
                    pickle.dump(got, f, protocol=pickle.HIGHEST_PROTOCOL)
                os.rename(part, path)
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


def _load(path: str):
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None
