"""Shared test harness: every test leaves no process and no /dev/shm name behind.

Multi-rank tests go through ``stratacl.spawn`` (or the ``stratacl-launch`` CLI), which has its
own deadline via ``STRATACL_TIMEOUT``; pytest-timeout (pyproject) bounds every test, with
faulthandler dumping stacks just before.
"""
from __future__ import annotations

import os

import psutil

from stratacl.jobs._processes import collect, end, wait_gone
import pytest

SHM = "/dev/shm"


def stratacl_names() -> set[str]:
    return {n for n in os.listdir(SHM) if n.startswith("stratacl-") or n.startswith("sem.stratacl-")}


@pytest.fixture(autouse=True)
def no_leftovers():
    before = stratacl_names()
    yield
    alive = wait_gone(collect(children_of=psutil.Process()), 10)
    end(alive, 5)
    leaked = stratacl_names() - before
    assert not alive, f"processes left behind: {[p.pid for p in alive]}"
    assert not leaked, f"names left in /dev/shm: {sorted(leaked)}"
