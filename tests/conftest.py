"""Shared test harness: every test leaves no process and no /dev/shm name behind.

Multi-rank tests go through ``stratacl.spawn`` (or the ``stratacl-launch`` CLI), which has its
own deadline via ``STRATACL_TIMEOUT``; pytest-timeout (pyproject) bounds every test, with
faulthandler dumping stacks just before.

Other jobs may run on the host meanwhile (another suite, a user's job): the leak check counts
only the names of this test's own jobs. Each test gets a tag (``STRATACL_TEST_JOB_TAG``, which
every job id its jobs make starts with: runtime/memory/_names.py) in the environment its jobs inherit
(the helpers that clean a job's environment keep it); after the test, every process that
carries the tag (a job's daemon in a session of its own, say) is waited for, then any name
``stratacl-<tag>...`` left in /dev/shm is a leak of this test's.
"""
from __future__ import annotations

import itertools
import os

import psutil

from stratacl.jobs._processes import collect, end, wait_gone
from stratacl.runtime.memory._names import TAG_ENV
import pytest

SHM = "/dev/shm"
_TESTS = itertools.count()


def stratacl_names(tag: str = "") -> set[str]:
    return {n for n in os.listdir(SHM) if n.startswith(f"stratacl-{tag}") or n.startswith(f"sem.stratacl-{tag}")}


def tagged_processes(tag: str) -> list[psutil.Process]:
    """This process's descendants, and every process (of this user) whose environment carries
    ``tag``: a job's daemon or carrier left its parent's tree on purpose."""
    return [p for p in collect(children_of=psutil.Process(), marker=(TAG_ENV, tag)) if p.pid != os.getpid()]


@pytest.fixture(autouse=True)
def no_leftovers():
    # "z" ends the tag: no test's tag starts another's
    tag = f"t{os.getpid():x}n{next(_TESTS):x}z"
    os.environ[TAG_ENV] = tag
    try:
        yield
        alive = wait_gone(tagged_processes(tag), 10)
        end(alive, 5)
        leaked = stratacl_names(tag)
        assert not alive, f"processes left behind: {[p.pid for p in alive]}"
        assert not leaked, f"names left in /dev/shm: {sorted(leaked)}"
    finally:
        os.environ.pop(TAG_ENV, None)
