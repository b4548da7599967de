"""Ranks forked from the rank template (stratacl/jobs/_template.py), and the waits that sleep.

A forked rank must be what a spawned one was: named in the root-cause block with its traceback
when it raises, its own random draws, nothing left behind; and it must really be forked (a
rank that reports no template was spawned)."""
from __future__ import annotations

import json
import subprocess
import sys
import types

import psutil
import pytest

from launch_helpers import launch, script
from stratacl._config import Config
from stratacl.jobs._supervisor import Job


def _probes(stdout: str) -> list[dict]:
    return sorted((json.loads(line) for line in stdout.splitlines() if line.startswith("{")),
                  key=lambda r: r["rank"])


def test_ranks_are_forked_from_one_template_that_ends_with_the_job():
    n = 4
    run = launch("-n", str(n), script("template_probe.py"), timeout=120)
    assert run.returncode == 0, run.explain()
    probes = _probes(run.stdout)
    assert [p["rank"] for p in probes] == list(range(n)), run.explain()
    template = {p["forked_from"] for p in probes}
    # one template, the parent of every rank, and not the launcher
    assert len(template) == 1 and 0 not in template, probes
    assert all(p["ppid"] == p["forked_from"] != p["launcher"] for p in probes), probes
    # a fork copies the generators' states: each rank draws its own numbers
    assert len({p["random"] for p in probes}) == n and len({p["numpy"] for p in probes}) == n, probes
    assert not psutil.pid_exists(template.pop())


def test_what_runs_as_a_module_is_not_imported_by_its_package_first():
    # python -m X runs X as __main__ after importing X's package: had the package imported X
    # already (an API that names it), X would run twice, as two modules (runpy warns)
    run_as_main = ["stratacl.jobs._rankboot", "stratacl.jobs._template", "stratacl.jobs._daemon"]
    code = ("import sys, stratacl, stratacl.jobs, stratacl.runtime.hosts; "
            f"print([m for m in {run_as_main!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_spawned_ranks_report_no_template(capfd):
    # the other start method, through the same supervisor: the probe tells them apart
    outcome = Job(2, Config(), ("script", script("template_probe.py"), [script("template_probe.py")]),
                  start_method="spawn").run()
    assert outcome.ok
    probes = _probes(capfd.readouterr().out)
    assert [p["forked_from"] for p in probes] == [0, 0], probes
    assert all(p["ppid"] == p["launcher"] for p in probes), probes


def test_a_forked_rank_that_raises_is_named_with_its_traceback():
    run = launch("-n", "3", "--timeout", "60", script("template_probe.py"), "1", timeout=120)
    assert run.returncode == 1, run.explain()
    block = run.stderr[run.stderr.index("Root cause (first failure):"):]
    assert "\n  rank      : 1 (pid " in block, block
    assert "\n  error     : ValueError: raised in a forked rank\n" in block, block
    tb = block[block.index("  traceback :"):]
    assert "template_probe.py" in tb and 'raise ValueError("raised in a forked rank")' in tb, tb


# --- waits ------------------------------------------------------------------------------------

def test_a_long_wait_sleeps_longer_each_time_up_to_the_cap(monkeypatch):
    """wait_until's sleeps double from SLICE to MAX_SLICE: a waiter whose peers are late wakes
    a few times a second, not 1 / SLICE times. Time is faked: the futex sleep advances a clock."""
    import array

    from stratacl._errors import CommTimeout
    from stratacl.runtime import _native
    from stratacl.runtime.services import _sync

    clock = [0.0]
    naps: list[float] = []

    def futex_wait(addr, seen, timeout, counted=False):
        naps.append(round(timeout, 6))
        clock[0] += timeout
        return False

    fake_native = types.SimpleNamespace(fence=_native.fence, load_u32=_native.load_u32, futex_wait=futex_wait)
    monkeypatch.setattr(_sync, "_native", fake_native)
    monkeypatch.setattr(_sync, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    checks = []
    health = types.SimpleNamespace(rank=0, ctl=types.SimpleNamespace(failure=lambda: None),
                                   check=lambda op, waiting: checks.append(waiting))
    word = array.array("I", [0])
    with pytest.raises(CommTimeout):
        _sync.wait_until(lambda: False, _native.data_address(word), health, "barrier", 10.0, lambda: [3],
                         "4 ranks to arrive")
    doubling = []
    nap = _sync.SLICE
    while nap < _sync.MAX_SLICE:
        doubling.append(round(nap, 6))
        nap *= 2
    assert naps[:len(doubling)] == doubling, naps
    assert set(naps[len(doubling):-1]) == {_sync.MAX_SLICE}, naps
    assert len(checks) == len(naps) and all(w == [3] for w in checks)      # one health check a sleep
    assert len(naps) < 10.0 / _sync.MAX_SLICE + len(doubling) + 1


def test_draining_a_full_ring_rings_its_producers_doorbell():
    """A producer with messages left over sleeps on its doorbell; the consumer that makes room
    in a full ring rings it (else the producer would poll)."""
    import os

    from stratacl.runtime.services._control import RING_ENTRIES, Control
    from stratacl.runtime.services import Mailbox

    fd = os.memfd_create("mailbox")
    try:
        os.ftruncate(fd, Control.size_for(2))
        ctl = Control(fd, 2)
        producer, consumer = Mailbox(ctl, 0), Mailbox(ctl, 1)
        for i in range(RING_ENTRIES - 1):
            producer.post(1, (i,) * 8)
        assert producer.flush() == 0
        bell = producer.doorbell_value()
        assert len(consumer.drain()) == RING_ENTRIES - 1
        assert producer.doorbell_value() == bell          # the ring was not full: no wake
        for i in range(RING_ENTRIES + 5):
            producer.post(1, (i,) * 8)
        assert producer.flush() == 5                      # 5 left: the ring is full
        assert len(consumer.drain()) == RING_ENTRIES
        assert producer.doorbell_value() == bell + 1      # room made: the producer is woken
        assert producer.flush() == 0
        del producer, consumer
        ctl.close()
    finally:
        os.close(fd)
