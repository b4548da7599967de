"""The job's shared-memory segments: one control segment and one HBM segment per rank.

    launcher (a job of N ranks)  or  init() without the launcher (a job of one)
        |  create_job_segments(job id, N, config)
        v
    stratacl-<job id>-ctl, stratacl-<job id>-hbm-<r>: created 0600, unlinked at once
        |  the descriptors are kept and handed to every process of the job
        v
    Runtime: maps the control segment and the HBM segments from those descriptors

Each segment is created with mode 0600 (only the job's user can map it) and unlinked the
moment it exists, so no name is left in /dev/shm whatever way the job ends, and no other job
can open it.

What backs them (docs/memory.md, "What backs the segments"): segments handed down by descriptor
do not need /dev/shm at all, so they need not depend on its size (a container's is often
64 MiB). The control segment is always a ``memfd_create`` file: it is sparse and grows with
the square of the ranks (100 MiB of address at 32 ranks, 13 GiB at 384), so no /dev/shm could
be judged against it. The HBM segments are POSIX shared memory in /dev/shm when its free space
(statvfs) holds every rank's whole HBM, and memfd files otherwise. Either way a file of the
kernel's shmem, the same pages, the same speed; a memfd is charged to no mount's size limit, so
touching it never raises SIGBUS for want of room (memory short is the OOM killer's, which the
launcher names). In /dev/shm a neighbour may still fill the mount after the check, so the HBM's
pages there are reserved when an allocation carves them (``Hbm.alloc``): a full /dev/shm is an
``OutOfMemory`` naming the size, never a SIGBUS.

The names all start with ``prefix(job id)``: the launcher's sweep removes any leftover with it (in case a process died between create and unlink). The runtime owns the
segments' names, sizes and header facts; the launcher only decides when a job starts and ends.

A job started by another launcher (torchrun, mpirun: runtime/hosts/_foreign.py) has no common parent to
hand descriptors down, so its first rank on the host creates the segments with ``keep_names``,
the other ranks open them by name (``open_job_segments``), and the names are unlinked
(``unlink_job_names``) once every rank holds its descriptors; the host's daemon sweeps them if
the job ends before that.
"""
from __future__ import annotations

import os

import posix_ipc

from ..._config import Config
from ..services import Control
from ._window import PAGE, round_up


def prefix(job_id: str) -> str:
    """What every shared-memory name of the job starts with."""
    return f"stratacl-{job_id}-"


def slice_bytes_for(hbm_size: int) -> int:
    """Address space per rank: four times the HBM, so freed addresses can be reused
    independently of the HBM behind them, and each pool of the expandable allocator can reserve
    twice the HBM (runtime/memory/_expandable.py)."""
    return 4 * round_up(hbm_size, PAGE)


def _names(job_id: str, world: int) -> list[str]:
    """The job's segment names: the control segment's, then each rank's HBM segment's."""
    p = prefix(job_id)
    return [p + "ctl"] + [f"{p}hbm-{r}" for r in range(world)]


SHM_DIR = "/dev/shm"


def shm_free() -> int:
    """Bytes /dev/shm can still take (0 if there is none)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _memfd(name: str, size: int) -> int:
    """An anonymous shmem file of ``size`` bytes, mode 0600, sparse: no name anywhere, only the
    descriptor."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)        # as the named segments: only the job's user, even through /proc
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create(name: str, size: int, keep_name: bool = False) -> int:
    shm = posix_ipc.SharedMemory("/" + name, flags=posix_ipc.O_CREX, mode=0o600, size=size)
    try:
        fd = os.dup(shm.fd)
    finally:
        shm.close_fd()
        if not keep_name:
            shm.unlink()
    return fd


def create_named(job_id: str, name: str, size: int) -> int:
    """One more segment of the job, ``stratacl-<job id>-<name>``, 0600, its name kept for other
    processes to open (a host's carrier: jobs/_hostjob.py); ``resources.sweep`` removes it."""
    return _create(prefix(job_id) + name, size, keep_name=True)


def open_job_segments(job_id: str, world: int) -> tuple[int, list[int]]:
    """Open the segments of a job another process created with ``keep_names``; returns their
    descriptors, as ``create_job_segments`` does. Raises posix_ipc.ExistentialError if one is gone."""
    fds: list[int] = []
    try:
        for name in _names(job_id, world):
            shm = posix_ipc.SharedMemory("/" + name)
            try:
                fds.append(os.dup(shm.fd))
            finally:
                shm.close_fd()
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds[0], fds[1:]


def unlink_job_names(job_id: str, world: int) -> None:
    """Remove the names ``create_job_segments(keep_names=True)`` left; the segments live on in
    the descriptors already open. Names already gone are skipped."""
    for name in _names(job_id, world):
        try:
            posix_ipc.unlink_shared_memory("/" + name)
        except posix_ipc.ExistentialError:
            pass


def create_job_segments(job_id: str, world: int, config: Config, launcher_pid: int | None = None,
                        keep_names: bool = False) -> tuple[int, list[int]]:
    """Create the control segment and one HBM segment per rank; returns their descriptors.
    With ``keep_names`` the names stay in /dev/shm for other processes to open (see above), all
    of them POSIX shared memory; without, the control segment is a memfd, and so are the HBM
    segments unless /dev/shm holds all of them."""
    p = prefix(job_id)
    if keep_names:
        ctl_fd = _create(p + "ctl", Control.size_for(world), keep_names)
    else:
        ctl_fd = _memfd(p + "ctl", Control.size_for(world))
    in_shm = keep_names or world * config.hbm_size <= shm_free()
    hbm_fds = []
    try:
        for r in range(world):
            name = f"{p}hbm-{r}"
            hbm_fds.append(_create(name, config.hbm_size, keep_names) if in_shm else _memfd(name, config.hbm_size))
    except BaseException:
        for fd in [ctl_fd, *hbm_fds]:
            os.close(fd)
        if keep_names:
            unlink_job_names(job_id, world)
        raise
    ctl = Control(ctl_fd, world)
    ctl.init_header(config.hbm_size, config.va_base, slice_bytes_for(config.hbm_size),
                    launcher_pid if launcher_pid is not None else os.getpid())
    ctl.close()
    return ctl_fd, hbm_fds
