"""The job's names in /dev/shm: nobody else can predict them, nobody can take them first.

Every named object of a job (its segments ``stratacl-<job id>-ctl`` / ``-hbm-<r>``, the
semaphore ``sem.stratacl-<job id>-ready`` of a job started by torchrun or mpirun, its plan
files ``stratacl-<job id>-plan-*``) starts with the job id, and the job id is random:

    job id = [STRATACL_TEST_JOB_TAG] + 16 hex digits of secrets.token_hex (64 bits)

made once per job by the process that creates the job (the launcher; under torchrun or
mpirun the first rank, which hands it to the others through the launcher's own channel:
runtime/hosts/_foreign.py). Nothing another user can read (/proc, a launcher's name, a pid, a uid)
derives it. Every object is created with O_EXCL and mode 0600: if the name is there already,
it is refused (``BootstrapError``), never opened, and nothing of the job is left behind.

``STRATACL_TEST_JOB_TAG`` (letters and digits, at most 16; a test hook, not a setting) starts
every job id a process's jobs make: the test suite sets one per test, so it counts only its
own jobs' names in /dev/shm, whatever other jobs run on the host (tests/conftest.py).
"""
from __future__ import annotations

import os
import re
import secrets

from ..._errors import BootstrapError

TAG_ENV = "STRATACL_TEST_JOB_TAG"
_TAG_RE = re.compile(r"^[0-9a-z]{0,16}$")


def new_job_id() -> str:
    """A fresh job id: the tag (if any), then 64 random bits."""
    tag = os.environ.get(TAG_ENV, "")
    if not _TAG_RE.match(tag):
        raise BootstrapError(f"{TAG_ENV}={tag!r}: expected at most 16 lowercase letters and digits")
    return tag + secrets.token_hex(8)


def refused(what: str, name: str) -> BootstrapError:
    """The error for a name that exists before the job made it."""
    return BootstrapError(
        f"stratacl.init(): /dev/shm{name} already exists before this job created it ({what}); it was refused, not "
        f"opened (a name the job picks at random is there only if another process put it there): start the job "
        f"again, which picks another name, and find who made it (ls -l /dev/shm)")


def create_semaphore(name: str):
    """A new semaphore ``name`` (with its leading /), 0600, value 0; an existing one is refused."""
    import posix_ipc
    try:
        return posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=0o600, initial_value=0)
    except posix_ipc.ExistentialError:
        raise refused("the semaphore the host's daemon posts", "/sem." + name.lstrip("/")) from None
