"""The job's shared resources, named ``stratacl-<job id>-...``: their cleanup path.

The library creates them (``stratacl.runtime.memory._segments``: each segment 0600 and unlinked the
moment it exists, or a memfd that never had a name; the launcher keeps the descriptors and hands them to the processes it
starts). ``sweep`` removes anything with the job's prefix all the same: the daemon runs it
when the launcher disappears, in case the launcher died between create and unlink.
"""
from __future__ import annotations

import os

from stratacl.runtime.memory import prefix

SHM_DIR = "/dev/shm"


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
