"""Finding and ending a job's processes from outside it: one loop for the launcher's tools,
the benchmarks and the tests (psutil).

    collect(pids, children_of, marker)   the live processes named by pid, the descendants of a
                                         process, and those whose environment carries a marker
    wait_gone(procs, seconds)            wait for them to exit; the ones still alive
    end(procs, grace)                    SIGTERM, wait, SIGKILL what is left, wait; still alive
"""
from __future__ import annotations

from typing import Iterable

import psutil

_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError)


def collect(pids: Iterable[int] = (), children_of: psutil.Process | None = None,
            marker: tuple[str, str] | None = None) -> list[psutil.Process]:
    """The live processes among ``pids``, every descendant of ``children_of``, and every process
    whose environment has ``marker`` = (name, value); each once."""
    found: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            found[pid] = psutil.Process(pid)
        except psutil.NoSuchProcess:
            pass
    if children_of is not None:
        try:
            found.update((p.pid, p) for p in children_of.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    if marker is not None:
        name, value = marker
        for p in psutil.process_iter():
            if p.pid in found:
                continue
            try:
                if p.environ().get(name) == value:
                    found[p.pid] = p
            except _GONE:
                pass
    return list(found.values())


def wait_gone(procs: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """Wait up to ``seconds`` for ``procs`` to exit; the ones still running (zombies count as gone)."""
    _, alive = psutil.wait_procs(procs, timeout=seconds)
    left = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


def end(procs: list[psutil.Process], grace: float) -> list[psutil.Process]:
    """SIGTERM ``procs``, wait ``grace`` seconds, SIGKILL the rest and wait again; the ones
    still running after that."""
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    alive = wait_gone(procs, grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return wait_gone(alive, grace)
