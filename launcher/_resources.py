"""The job's shared resources, named ``stratacl-<job id>-...`` and owned by the launcher.

Each segment is created with mode 0600 (only the job's user can map it) and unlinked the
moment it exists: the launcher keeps the descriptor and hands it to the processes it starts,
so no name is left in /dev/shm whatever way the job ends, and no other job can open it.
``sweep`` removes anything with the job's prefix all the same (the daemon runs it when the
launcher disappears, in case the launcher died between create and unlink).
"""
from __future__ import annotations

import os

import posix_ipc

from stratacl._config import Config
from stratacl.runtime._control import Control
from stratacl.runtime._world import slice_bytes_for

SHM_DIR = "/dev/shm"


def prefix(job_id: str) -> str:
    return f"stratacl-{job_id}-"


def _create(name: str, size: int) -> int:
    shm = posix_ipc.SharedMemory("/" + name, flags=posix_ipc.O_CREX, mode=0o600, size=size)
    try:
        fd = os.dup(shm.fd)
    finally:
        shm.close_fd()
        shm.unlink()
    return fd


def create_job_segments(job_id: str, world: int, config: Config, launcher_pid: int | None = None
                        ) -> tuple[int, list[int]]:
    """Create the control segment and one HBM segment per rank; returns their descriptors."""
    p = prefix(job_id)
    ctl_fd = _create(p + "ctl", Control.size_for(world))
    hbm_fds = []
    try:
        for r in range(world):
            hbm_fds.append(_create(f"{p}hbm-{r}", config.hbm_size))
    except BaseException:
        for fd in [ctl_fd, *hbm_fds]:
            os.close(fd)
        raise
    ctl = Control(ctl_fd, world)
    ctl.init_header(config.hbm_size, config.va_base, slice_bytes_for(config.hbm_size),
                    launcher_pid if launcher_pid is not None else os.getpid())
    ctl.close()
    return ctl_fd, hbm_fds


def sweep(job_id: str) -> list[str]:
    """Unlink every leftover name of the job in /dev/shm; returns what was removed."""
    removed = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    p = prefix(job_id)
    for name in names:
        if name.startswith(p) or name.startswith("sem." + p):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except OSError:
                pass
    return removed
