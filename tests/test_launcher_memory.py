"""The launcher and host memory: the warning before a job that would not fit, and the
root-cause block's "probably the kernel's OOM killer" when a rank dies of a SIGKILL the
launcher did not send while memory was short.

Nothing here exhausts memory: the decision is a pure function tested on made-up readings, and
the end-to-end tests point the launcher at a fake /proc (``STRATACL_TEST_HOST_MEMORY``) whose
OOM kill count the dying rank itself raises.
"""
from __future__ import annotations

import signal

import pytest

from launch_helpers import clean_env, launch, script
from stratacl.jobs import _memory
from stratacl.jobs._memory import (RANK_FOOTPRINT, MemoryReport, MemoryWatch, memory_lines, oom_verdict,
                                   short_memory_warning)

GiB = 1024**3
KILL = -signal.SIGKILL


# --- the decision, on made-up readings ------------------------------------------------------

def test_a_risen_oom_kill_count_makes_a_sigkill_the_oom_killers():
    why = oom_verdict(KILL, False, {"/proc/vmstat oom_kill": 2}, 10 * GiB, 16 * GiB)
    assert why == "the OOM kill count rose by 2 during the job (/proc/vmstat oom_kill)"


def test_a_cgroup_count_alone_is_enough():
    why = oom_verdict(KILL, False, {"/proc/vmstat oom_kill": 0, "cg oom_kill": 1}, None, None)
    assert why == "the OOM kill count rose by 1 during the job (cg oom_kill)"


def test_low_available_memory_without_a_counter_is_enough():
    why = oom_verdict(KILL, False, {}, int(0.04 * 16 * GiB), 16 * GiB)
    assert why is not None and why.startswith("memory was short: MemAvailable fell to 655.4 MiB of 16.0 GiB")


@pytest.mark.parametrize("returncode, by_launcher, kills, available", [
    (KILL, False, {"/proc/vmstat oom_kill": 0}, 8 * GiB),      # plenty of memory, no OOM kill
    (KILL, False, {}, int(0.06 * 16 * GiB)),                   # low, but above the threshold
    (KILL, True, {"/proc/vmstat oom_kill": 1}, 0),             # the launcher's own SIGKILL
    (-signal.SIGTERM, False, {"/proc/vmstat oom_kill": 1}, 0), # the OOM killer only sends SIGKILL
    (1, False, {"/proc/vmstat oom_kill": 1}, 0),               # an exit code
    (None, False, {"/proc/vmstat oom_kill": 1}, 0),            # still running
])
def test_no_oom_verdict_otherwise(returncode, by_launcher, kills, available):
    assert oom_verdict(returncode, by_launcher, kills, available, 16 * GiB) is None


def test_memory_lines_say_what_the_ranks_held():
    report = MemoryReport({"/proc/vmstat oom_kill": 1}, 8 * GiB, 16 * GiB, peak_held=3 * GiB,
                          peak_private=GiB, peak_hbm=2 * GiB, last_private={3: 512 * 1024**2})
    lines = memory_lines(3, KILL, False, report)
    assert lines == [
        "  probably  : killed by the kernel's OOM killer: the OOM kill count rose by 1 during the job "
        "(/proc/vmstat oom_kill)",
        "  memory    : the ranks held up to 3.0 GiB (at most 1.0 GiB private, 2.0 GiB of HBM touched; sampled every 1 s)",
        "              rank 3 held 512.0 MiB private when last sampled"]
    assert memory_lines(3, KILL, True, report) == []
    assert memory_lines(3, KILL, False, None) == []


def test_warning_when_the_ranks_would_not_fit():
    fits = {"MemAvailable": 32 * RANK_FOOTPRINT}
    assert short_memory_warning(32, fits) is None
    text = short_memory_warning(33, fits)
    assert text is not None and text.startswith("stratacl-launch: warning: 33 ranks need at least 792.0 MiB "
                                                "(33 x 24.0 MiB"), text
    assert "768.0 MiB available (MemAvailable)" in text
    assert short_memory_warning(10**6, {}) is None          # no MemAvailable: no guess


def _fake_proc(tmp_path, available_kb: int, oom_kills: int = 0):
    (tmp_path / "meminfo").write_text(f"MemTotal:       16000000 kB\nMemFree:        100 kB\n"
                                      f"MemAvailable:   {available_kb} kB\n")
    (tmp_path / "vmstat").write_text(f"nr_free_pages 1\noom_kill {oom_kills}\n")
    return str(tmp_path)


def test_the_watch_reads_the_counters_rise_and_the_lowest_available(tmp_path, monkeypatch):
    monkeypatch.setenv(_memory.TEST_HOOK, _fake_proc(tmp_path, 8_000_000, oom_kills=7))
    watch = MemoryWatch()
    _fake_proc(tmp_path, 500_000, oom_kills=9)
    watch.sample({}, [])
    report = watch.report()
    assert report.oom_kills == {"/proc/vmstat oom_kill": 2}
    assert (report.min_available, report.total) == (500_000 * 1024, 16_000_000 * 1024)


# --- end to end, through stratacl-launch ---------------------------------------------------

@pytest.mark.parametrize("oom", [True, False], ids=["oom-count-rose", "no-oom"])
def test_root_cause_block_names_the_oom_killer_only_when_the_count_rose(tmp_path, oom):
    victim = 1
    env = clean_env(STRATACL_TEST_HOST_MEMORY=_fake_proc(tmp_path, 8_000_000, oom_kills=41))
    run = launch("-n", "3", "--grace", "2", script("oom_victim.py"), str(victim), *(["oom"] if oom else []),
                 env=env, timeout=120)
    assert run.returncode != 0, run.explain()
    block = run.stderr[run.stderr.index("Root cause (first failure):"):]
    assert f"\n  rank      : {victim} (pid " in block, block
    assert "\n  ended by  : killed by SIGKILL\n" in block, block
    if oom:
        assert ("\n  probably  : killed by the kernel's OOM killer: the OOM kill count rose by 1 during the job "
                "(/proc/vmstat oom_kill)\n") in block, block
        assert "\n  memory    : the ranks held up to " in block, block
        assert "MiB of HBM touched; sampled every 1 s)\n" in block, block
        assert f"\n              rank {victim} held " in block, block
    else:
        assert "OOM" not in block and "memory    :" not in block, block


@pytest.mark.parametrize("available_kb, warned", [(50 * 1024, True), (8_000_000, False)])
def test_warning_before_starting_ranks_that_would_not_fit(tmp_path, available_kb, warned):
    env = clean_env(STRATACL_TEST_HOST_MEMORY=_fake_proc(tmp_path, available_kb))
    run = launch("-n", "4", script("rank_info.py"), env=env, timeout=120)
    assert run.returncode == 0, run.explain()          # a warning, not a refusal
    expected = ("stratacl-launch: warning: 4 ranks need at least 96.0 MiB (4 x 24.0 MiB, a rank's own memory "
                "after stratacl.init()), but the host has 50.0 MiB available (MemAvailable)")
    assert (expected in run.stderr) == warned, run.explain()
    if warned:
        # before any rank ran: it precedes every line the ranks wrote
        assert run.stderr.startswith(expected), run.explain()
