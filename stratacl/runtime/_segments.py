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
can open it. The names all start with ``prefix(job id)``: the launcher's sweep removes any
leftover with it (in case a process died between create and unlink). The runtime owns the
segments' names, sizes and header facts; the launcher only decides when a job starts and ends.
"""
from __future__ import annotations

import os

import posix_ipc

from .._config import Config
from ._control import Control
from ._window import PAGE, round_up


def prefix(job_id: str) -> str:
    """What every shared-memory name of the job starts with."""
    return f"stratacl-{job_id}-"


def slice_bytes_for(hbm_size: int) -> int:
    """Address space per rank: four times the HBM, so freed addresses can be reused
    independently of the HBM behind them, and each pool of the expandable allocator can reserve
    twice the HBM (runtime/_expandable.py)."""
    return 4 * round_up(hbm_size, PAGE)


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
