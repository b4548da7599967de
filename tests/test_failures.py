"""Failure handling: a rank raising, exiting or being SIGKILLed, the launcher killed or
signalled, a job past its deadline, and the isolation of one job's memory from another's.

Every case asserts what the user sees (exit code, exception type, the rank and the operation
named in messages) and, through conftest's autouse fixture plus explicit checks, that no
process and no /dev/shm name survives.
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import stratacl
from launch_helpers import (assert_all_gone, clean_env, launch, launcher_command, read_lines_until, script,
                            shm_names)

# --- functions the spawned ranks run (module level: ranks import this module) ---------------


def _record(outdir: str, rank: int, exc: BaseException) -> None:
    Path(outdir, f"rank{rank}.json").write_text(json.dumps({
        "type": type(exc).__name__, "message": str(exc), "peer": getattr(exc, "peer", None),
        "operation": getattr(exc, "operation", None), "t": time.monotonic()}))


def _raise_on_rank(comm, bad: int, outdir: str):
    x = stratacl.empty((16,), np.float32)
    x[:] = comm.rank
    out = stratacl.empty((16 * comm.size,), np.float32)
    comm.all_gather(out, x)
    if comm.rank == bad:
        raise ValueError("boom")
    try:
        comm.all_gather(out, x)
    except stratacl.PeerFailure as e:
        _record(outdir, comm.rank, e)
        raise
    return "completed"


def _raise_in_a_sendrecv_ring(comm, bad: int, outdir: str):
    x = stratacl.empty((4096,), np.float32)
    x[:] = comm.rank
    got = stratacl.empty((4096,), np.float32)
    n, me = comm.size, comm.rank
    comm.sendrecv(x, (me + 1) % n, got, (me - 1) % n)
    if me == bad:
        raise ValueError("boom")
    try:
        comm.sendrecv(x, (me + 1) % n, got, (me - 1) % n)
    except stratacl.PeerFailure as e:
        _record(outdir, comm.rank, e)
        raise
    return got.tolist() == [float((me - 1) % n)] * 4096


def _sigkill_on_rank(comm, victim: int, outdir: str):
    x = stratacl.empty((1024,), np.float32)
    x[:] = comm.rank
    out = stratacl.empty((1024 * comm.size,), np.float32)
    comm.all_gather(out, x)
    if comm.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_gather(out, x)
    except stratacl.PeerFailure as e:
        _record(outdir, comm.rank, e)
        raise
    return "completed"


def _exit_on_rank(comm, who: int, code: int):
    if comm.rank == who:
        raise SystemExit(code)
    comm.barrier()


def _exit_unfinalized_on_rank(comm, who: int):
    comm.barrier()
    if comm.rank == who:
        os._exit(0)
    comm.barrier()


def _segments_and_sum(comm, fifo_out: str | None, fifo_in: str | None):
    """Report the descriptor modes and shm mappings this rank sees, after an all_reduce.

    With fifos, rank 0 swaps job ids with a rank 0 of another job while both jobs are running
    (opening a fifo blocks until the other side opens it), so the two jobs provably overlap.
    """
    boot = json.loads(os.environ["STRATACL_BOOT"])
    job = os.environ["STRATACL_JOB_ID"]
    other = None
    if comm.rank == 0 and fifo_out:
        if fifo_out < fifo_in:        # a fixed order on both sides, so the two opens always pair up
            with open(fifo_out, "w") as f:
                f.write(job)
            with open(fifo_in) as f:
                other = f.read()
        else:
            with open(fifo_in) as f:
                other = f.read()
            with open(fifo_out, "w") as f:
                f.write(job)
    x = stratacl.empty((1000,), np.float64)
    x[:] = comm.rank + 1
    comm.all_reduce(x)
    with open("/proc/self/maps") as f:
        maps = sorted({ln.split(None, 5)[5].strip() for ln in f if "/dev/shm/" in ln or "/memfd:" in ln})
    return {
        "job": job, "other": other,
        "ctl_mode": stat.S_IMODE(os.fstat(boot["ctl"]).st_mode),
        "hbm_modes": [stat.S_IMODE(os.fstat(fd).st_mode) for fd in boot["hbm"]],
        "maps": maps,
        "shm_listing": [n for n in os.listdir("/dev/shm") if n.startswith(f"stratacl-{job}-")],
        "sum": x.tolist(),
    }


def _peer_died_message(op: str, rank: int, peer: int, code: int = 1) -> str:
    """A peer that raised is reported either from the launcher's record of its exit or, if a
    waiting rank looks first, from the state the dying rank set itself."""
    return (rf"{op}: rank {rank}: peer rank {peer} (exited with code {code}; this operation cannot complete"
            rf"|has died and will not take part)")


def _rank_records(outdir: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in outdir.glob("rank*.json")}


# --- 1. a rank raises -----------------------------------------------------------------------

def test_spawn_reraises_the_ranks_exception_and_peers_get_peer_failure(tmp_path):
    n, bad = 4, 2
    with pytest.raises(ValueError) as info:
        stratacl.spawn(_raise_on_rank, n, args=(bad, str(tmp_path)), timeout=60)
    exc = info.value
    assert type(exc) is ValueError and exc.args == ("boom",)
    assert any(re.fullmatch(rf"\(raised on rank {bad} of {n}; job [0-9a-z]+\)", note)
               for note in exc.__notes__), exc.__notes__
    cause = exc.__cause__
    assert cause is not None and "raise ValueError(\"boom\")" in str(cause) and "_raise_on_rank" in str(cause)

    seen = _rank_records(tmp_path)
    assert sorted(seen) == [r for r in range(n) if r != bad]
    for rank, rec in seen.items():
        assert rec["type"] == "PeerFailure", rec
        assert rec["peer"] == bad and rec["operation"] == "all_gather", rec
        assert re.fullmatch(_peer_died_message("all_gather", rank, bad), rec["message"]), rec


def test_spawn_at_a_scripts_top_level_says_to_guard_it(tmp_path):
    """Without `if __name__ == "__main__":` every rank, importing the script to find ``fn``,
    would reach the same spawn call: it raises there with the fix, and the caller gets it."""
    unguarded = tmp_path / "unguarded.py"
    unguarded.write_text("import stratacl\n\ndef work(comm):\n    return comm.rank\n\n"
                         "print(stratacl.spawn(work, 2, timeout=60))\n")
    run = subprocess.run([sys.executable, str(unguarded)], capture_output=True, text=True, timeout=120,
                         env=clean_env())
    assert run.returncode != 0, run.stdout
    last = run.stderr.strip().splitlines()
    assert "BootstrapError: stratacl.spawn was called while a rank was importing the main module" in run.stderr
    assert 'if __name__ == "__main__":' in run.stderr and "ModuleNotFoundError" not in run.stderr, last[-5:]


def test_a_dead_neighbour_fails_both_halves_of_sendrecv(tmp_path):
    """The receive from the dead rank and the send to it each end in PeerFailure naming it (the
    native point-to-point call hands its waits to Python's health-checked ones)."""
    n, bad = 4, 2
    with pytest.raises(ValueError):
        stratacl.spawn(_raise_in_a_sendrecv_ring, n, args=(bad, str(tmp_path)), timeout=60)
    seen = _rank_records(tmp_path)
    assert sorted(seen) == [bad - 1, bad + 1]
    for rank, rec in seen.items():
        assert rec["type"] == "PeerFailure" and rec["peer"] == bad, rec
    assert seen[bad - 1]["operation"] == f"send to {bad}"
    assert seen[bad + 1]["operation"] == f"recv from {bad}"


def test_cli_rank_raises_exit_1_with_root_cause_block():
    n, bad = 4, 2
    run = launch("-n", str(n), "--timeout", "60", script("raise_in_rank.py"), str(bad), timeout=120)
    assert run.returncode == 1, run.explain()

    # the other ranks were in an all_gather and were told which peer failed
    errors = run.by_rank("error")
    assert sorted(errors) == [r for r in range(n) if r != bad], run.explain()
    for rank, rec in errors.items():
        assert rec["type"] == "PeerFailure" and rec["peer"] == bad and rec["operation"] == "all_gather", rec
        assert re.fullmatch(_peer_died_message("all_gather", rank, bad), rec["message"]), rec
    assert not run.by_rank("completed")

    # the launcher's root-cause block names the rank that raised, with its traceback
    err = run.stderr
    block = err[err.index("Root cause (first failure):"):]
    m = re.search(r"^  rank      : (\d+) \(pid (\d+)\)$", block, re.M)
    assert m and int(m.group(1)) == bad, block
    assert "\n  ended by  : exit code 1\n" in block
    assert "\n  error     : ValueError: boom\n" in block
    tb = block[block.index("  traceback :"):]
    assert "raise_in_rank.py" in tb and 'raise ValueError("boom")' in tb and "ValueError: boom" in tb
    others = block[block.index("Other ranks:"):]
    for r in range(n):
        if r != bad:
            assert re.search(rf"^  rank {r}: exit code 1: PeerFailure: {_peer_died_message('all_gather', r, bad)}$",
                             others, re.M), others


# --- 2. a rank SIGKILLed in the middle of a collective -------------------------------------

def test_cli_rank_sigkilled_mid_collective():
    n, victim, timeout = 8, 3, 60
    run = launch("-n", str(n), "--timeout", str(timeout), script("kill_in_collective.py"), str(victim),
                 timeout=120)
    assert run.returncode == 1, run.explain()
    # sooner than the communication timeout: the dead peer is reported, not waited for (and the
    # messages below say "killed by SIGKILL", which a timeout would not know)
    assert run.elapsed < timeout, f"job took {run.elapsed:.1f} s with --timeout {timeout}"

    dying = run.by_rank("dying")
    assert list(dying) == [victim], run.explain()
    killed_at = dying[victim]["t"]
    errors = run.by_rank("error")
    assert sorted(errors) == [r for r in range(n) if r != victim], run.explain()
    for rank, rec in errors.items():
        assert rec["type"] == "PeerFailure", rec
        assert rec["peer"] == victim and rec["operation"] == "all_gather", rec
        assert rec["message"] == (f"all_gather: rank {rank}: peer rank {victim} killed by SIGKILL; "
                                  f"this operation cannot complete"), rec
        assert rec["t"] - killed_at < timeout, f"rank {rank} noticed after {rec['t'] - killed_at:.1f} s"

    block = run.stderr[run.stderr.index("Root cause (first failure):"):]
    assert f"\n  rank      : {victim} (pid {dying[victim]['pid']})\n" in block, block
    assert "\n  ended by  : killed by SIGKILL\n" in block, block
    assert "traceback : (none: the process did not get to report one)" in block
    assert_all_gone([dying[victim]["pid"], *(rec["pid"] for rec in errors.values())], timeout=5)


def test_spawn_rank_sigkilled_gives_rank_failure(tmp_path):
    n, victim = 4, 3
    with pytest.raises(stratacl.RankFailure) as info:
        stratacl.spawn(_sigkill_on_rank, n, args=(victim, str(tmp_path)), timeout=60)
    exc = info.value
    assert exc.rank == victim, str(exc)
    assert f"\n  rank      : {victim} (pid " in str(exc), str(exc)
    assert "\n  ended by  : killed by SIGKILL\n" in str(exc), str(exc)
    seen = _rank_records(tmp_path)
    assert sorted(seen) == [0, 1, 2]
    for rank, rec in seen.items():
        assert (rec["type"], rec["peer"], rec["operation"]) == ("PeerFailure", victim, "all_gather"), rec
        assert f"peer rank {victim} killed by SIGKILL" in rec["message"]


# --- after the first failure: grace, then SIGTERM, then SIGKILL ----------------------------

@pytest.mark.slow
@pytest.mark.parametrize("mode, ender", [("plain", "SIGTERM"), ("ignore-term", "SIGKILL")])
def test_ranks_outside_collectives_are_ended_after_the_grace_period(mode, ender):
    n, grace = 3, 1.0
    run = launch("-n", str(n), "--grace", str(grace), "--timeout", "600", script("outlive_failure.py"), mode,
                 timeout=120)
    assert run.returncode == 1, run.explain()
    rounds = 1 if ender == "SIGTERM" else 2          # SIGKILL comes one more grace period later
    assert rounds * grace <= run.elapsed < rounds * grace + 30, run.elapsed
    block = run.stderr[run.stderr.index("Root cause (first failure):"):]
    assert re.search(r"^  rank      : 0 \(pid \d+\)$", block, re.M), block
    assert "\n  error     : ValueError: boom\n" in block
    for r in range(1, n):
        assert f"\n  rank {r}: killed by {ender} (sent by the launcher)\n" in block, block
    assert_all_gone([rec["pid"] for rec in run.by_rank("started").values()], timeout=5)


# --- 3. the launcher SIGKILLed --------------------------------------------------------------

def _start_blocking_job(n: int, tmp_path: Path, own_group: bool = False, grace: float | None = None
                        ) -> tuple[subprocess.Popen, list[int], str, Path]:
    """``own_group``: the launcher leads a process group, as a terminal's foreground job does
    (here in a session of its own, which keeps its ranks' groups in that session too).
    ``grace``: the launcher's --grace (None: its default)."""
    err = tmp_path / "launcher.stderr"
    extra = [] if grace is None else ["--grace", str(grace)]
    with open(err, "wb") as ef:
        proc = subprocess.Popen(launcher_command() + ["-n", str(n), "--timeout", "600", *extra,
                                                      script("block_in_collectives.py")],
                                stdout=subprocess.PIPE, stderr=ef, env=clean_env(),
                                start_new_session=own_group)
    try:
        lines = read_lines_until(proc, n, "ready ", timeout=120)
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise
    pids = [int(ln.split()[1]) for ln in lines]
    jobs = {ln.split()[2] for ln in lines}
    assert len(set(pids)) == n and len(jobs) == 1, lines
    return proc, pids, jobs.pop(), err


@pytest.mark.slow
def test_launcher_sigkilled_takes_ranks_and_daemon_with_it(tmp_path):
    import psutil
    n = 8
    proc, pids, job, _ = _start_blocking_job(n, tmp_path)
    children = psutil.Process(proc.pid).children()
    daemons = [c.pid for c in children if "stratacl.jobs._daemon" in " ".join(c.cmdline())]
    assert len(daemons) == 1, [c.cmdline() for c in children]
    # the ranks are the launcher's children, or its rank template's (stratacl/jobs/_template.py)
    assert set(pids) <= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}

    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.stdout.close()
    assert_all_gone(pids + daemons, timeout=15)
    assert shm_names(job) == []


def test_daemon_sigkilled_ends_the_job_with_peer_failure_everywhere(tmp_path):
    """The bootstrap daemon is what cleans up after a launcher that dies: without it the job
    cannot keep that promise, so the launcher ends it. Every rank, busy in all_reduces among
    live peers, raises PeerFailure at its next barrier."""
    import psutil
    n = 4
    proc, pids, job, err = _start_blocking_job(n, tmp_path)
    daemons = [c for c in psutil.Process(proc.pid).children() if "stratacl.jobs._daemon" in " ".join(c.cmdline())]
    assert len(daemons) == 1
    os.kill(daemons[0].pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == 1
    proc.stdout.close()
    text = err.read_text()
    assert "its bootstrap daemon ended (killed by SIGKILL) while the ranks ran" in text, text
    for r in range(n):
        assert re.search(rf"^  rank {r}: exit code 1: PeerFailure: all_reduce: rank {r}: the job is shutting down: "
                         rf"its bootstrap daemon ended \(killed by SIGKILL\)$", text, re.M), text
    assert_all_gone(pids, timeout=15)
    assert shm_names(job) == []


# --- 4. SIGINT / SIGTERM to the launcher ----------------------------------------------------

@pytest.mark.parametrize("sig, code, to_group", [(signal.SIGINT, 130, False), (signal.SIGTERM, 143, False),
                                                (signal.SIGINT, 130, True)],
                         ids=["SIGINT", "SIGTERM", "ctrl-c"])
def test_launcher_signal_orderly_shutdown(tmp_path, sig, code, to_group):
    # to_group: a terminal's Ctrl-C signals the launcher's whole process group; the ranks, each in
    # a group of its own, must hear of it only from the launcher
    # SIGTERM reaches ranks at once: no need to wait out the grace period before SIGKILL. The
    # grace is long, so a launcher that waited it out would miss the deadline by far
    n, grace = 4, 600
    proc, pids, job, err = _start_blocking_job(n, tmp_path, own_group=to_group, grace=grace)
    if to_group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    proc.communicate(timeout=grace / 10)
    assert proc.returncode == code, err.read_text()
    stderr = err.read_text()
    assert f"the launcher received {sig.name} and shut the job down" in stderr, stderr
    assert "Root cause" not in stderr, stderr     # no rank failed on its own
    assert_all_gone(pids, timeout=15)
    assert shm_names(job) == []


# --- 5. --deadline --------------------------------------------------------------------------

@pytest.mark.slow
def test_deadline_ends_a_hung_job_with_124():
    n, stuck, deadline = 4, 1, 4
    run = launch("-n", str(n), "--timeout", "600", "--deadline", str(deadline), script("hang_barrier.py"),
                 str(stuck), timeout=120)
    assert run.returncode == 124, run.explain()
    assert deadline <= run.elapsed < deadline + 30, run.elapsed
    assert "the job ran past its deadline (--deadline / STRATACL_DEADLINE) and was ended" in run.stderr
    assert "Root cause" not in run.stderr     # the launcher ended every rank; none failed on its own
    # the stuck rank is ended by SIGTERM; a waiting one might see the shutdown just before it does
    assert f"\n  rank {stuck}: killed by SIGTERM (sent by the launcher)\n" in run.stderr, run.explain()
    for r in range(n):
        assert re.search(rf"^  rank {r}: (killed by SIGTERM \(sent by the launcher\)|exit code 1: PeerFailure: "
                         rf"barrier: rank {r}: the job is shutting down: it passed its deadline \(--deadline\))$",
                         run.stderr, re.M), run.explain()
    assert sorted(run.by_rank("started")) == list(range(n)), run.explain()
    assert not run.by_rank("completed")
    assert_all_gone([r["pid"] for r in run.by_rank("started").values()], timeout=5)


def test_a_rank_hung_after_its_peers_finished_is_named_by_the_launcher():
    """No peer waits on a rank that hangs before finalize, so no timeout of theirs can name it:
    the launcher does, the communication timeout after the last peer finished, long before the
    job's deadline."""
    n, stuck, timeout, deadline = 3, 1, 1, 20
    run = launch("-n", str(n), "--timeout", str(timeout), "--grace", "1", "--deadline", str(deadline),
                 script("hang_before_finalize.py"), str(stuck), timeout=120)
    assert run.returncode not in (0, 124), run.explain()
    block = run.stderr[run.stderr.index("Root cause"):]
    assert re.search(rf"^  rank      : {stuck} \(pid", block, re.M), run.explain()
    assert re.search(r"^  hung      : still running, not finalized, [0-9.]+ s after its last peer finished \(the "
                     r"communication timeout is 1 s\): hung in finalize or before it; its newest call: barrier #",
                     block, re.M), run.explain()
    assert sorted(run.by_rank("completed")) == [r for r in range(n) if r != stuck], run.explain()
    assert run.elapsed < deadline / 2, run.elapsed
    assert_all_gone([r["pid"] for r in run.by_rank("started").values()], timeout=5)


def _wait_forever_on_rank(comm, who: int):
    if comm.rank == who:
        threading.Event().wait()
    comm.barrier()


@pytest.mark.slow
def test_spawn_deadline_raises_rank_failure_naming_no_rank():
    t0 = time.monotonic()
    with pytest.raises(stratacl.RankFailure) as info:
        stratacl.spawn(_wait_forever_on_rank, 3, args=(1,), timeout=600, deadline=3)
    assert 3 <= time.monotonic() - t0 < 3 + 30
    assert info.value.rank is None       # the launcher ended every rank: none failed on its own
    assert "the job ran past its deadline" in str(info.value)
    assert "Root cause" not in str(info.value)


# --- 6. isolation: modes, mappings, two jobs at once ----------------------------------------

def _check_isolated(results: list[dict], n: int) -> str:
    jobs = {r["job"] for r in results}
    assert len(jobs) == 1
    job = jobs.pop()
    expected_sum = float(n * (n + 1) // 2)
    for rank, r in enumerate(results):
        assert r["ctl_mode"] == 0o600 and r["hbm_modes"] == [0o600] * n, r
        assert r["sum"] == [expected_sum] * 1000
        # every shared mapping is one of this job's segments, already unlinked (a memfd never had
        # a name; the HBM is in /dev/shm only when it held all of it: docs/memory.md)
        assert r["maps"], r
        for m in r["maps"]:
            assert re.fullmatch(rf"(/dev/shm/|/memfd:)stratacl-{job}-(ctl|hbm-\d+) \(deleted\)", m), (rank, m)
        assert {f"/dev/shm/stratacl-{job}-hbm-{rank} (deleted)", f"/memfd:stratacl-{job}-hbm-{rank} (deleted)"} \
            & set(r["maps"]), (rank, r["maps"])
        assert f"/memfd:stratacl-{job}-ctl (deleted)" in r["maps"]
        assert r["shm_listing"] == []          # no name in /dev/shm while the job runs
    return job


def test_segments_private_to_the_user_and_mapped_unlinked():
    n = 4
    results = stratacl.spawn(_segments_and_sum, n, args=(None, None), timeout=60)
    _check_isolated(results, n)


def test_two_concurrent_jobs_are_isolated(tmp_path):
    n = 4
    a_to_b, b_to_a = str(tmp_path / "a_to_b"), str(tmp_path / "b_to_a")
    os.mkfifo(a_to_b)
    os.mkfifo(b_to_a)
    results: dict[str, object] = {}

    def run(name, fifo_out, fifo_in):
        try:
            # the deadline bounds the fifo rendezvous should the other job never start
            results[name] = stratacl.spawn(_segments_and_sum, n, args=(fifo_out, fifo_in), timeout=60,
                                           deadline=120)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            results[name] = e

    threads = [threading.Thread(target=run, args=("a", a_to_b, b_to_a)),
               threading.Thread(target=run, args=("b", b_to_a, a_to_b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=200)
    assert not any(t.is_alive() for t in threads)
    for name in "ab":
        assert isinstance(results[name], list), results[name]
    job_a = _check_isolated(results["a"], n)
    job_b = _check_isolated(results["b"], n)
    assert job_a != job_b
    # each rank 0 learned the other job's id while both ran, and (checked above) maps only its own
    # job's segments
    assert results["a"][0]["other"] == job_b and results["b"][0]["other"] == job_a


def _open_as_another_user(comm, uid: int):
    """Rank 0 forks a child that becomes ``uid`` and tries to reach this job's segments: by name
    in /dev/shm, through this rank's open descriptors and through its mapped files in /proc.
    Returns what each attempt raised (the class name), or 'opened'."""
    boot = json.loads(os.environ["STRATACL_BOOT"])
    job = os.environ["STRATACL_JOB_ID"]
    comm.barrier()
    if comm.rank != 0:
        comm.barrier()
        return None
    me = os.getpid()
    with open("/proc/self/maps") as f:
        mapped = sorted({ln.split()[0] for ln in f if "/dev/shm/" in ln or "/memfd:" in ln})[:3]
    paths = ([f"/dev/shm/{n}" for n in os.listdir("/dev/shm") if job in n]
             + [f"/proc/{me}/fd/{fd}" for fd in [boot["ctl"], *boot["hbm"]]]
             + [f"/proc/{me}/map_files/{span}" for span in mapped])
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        out = {}
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            for path in paths:
                try:
                    with open(path, "rb") as f:
                        f.read(1)
                    out[path] = "opened"
                except OSError as e:
                    out[path] = type(e).__name__
        finally:
            os.write(w, json.dumps(out).encode())
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        seen = json.loads(f.read())
    os.waitpid(child, 0)
    comm.barrier()
    return {"paths": paths, "seen": seen}


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to a second uid needs root")
def test_another_user_cannot_open_or_map_a_jobs_segments():
    results = stratacl.spawn(_open_as_another_user, 2, args=(65534,), timeout=60)
    got = results[0]
    # no name to open (segments are unlinked at once), and the descriptors and mappings of a
    # rank are closed to another user
    assert not [p for p in got["paths"] if p.startswith("/dev/shm/")], got
    assert len(got["paths"]) >= 3, got
    assert got["seen"] == {p: "PermissionError" for p in got["paths"]}, got


# --- 8. exit codes --------------------------------------------------------------------------

def test_the_daemon_reads_how_a_rank_it_did_not_start_ended_from_its_zombie():
    # under torchrun or mpirun the host's daemon is not the ranks' parent: it learns how one
    # ended from /proc/<pid>/stat while the process waits to be reaped, and once reaped, only
    # that it ended
    from stratacl.jobs._daemon import _exit_status
    from stratacl.runtime.services import FAILED_EXIT, FAILED_GONE, FAILED_SIGNAL

    def zombie(code):
        child = subprocess.Popen([sys.executable, "-c", code])
        fd = os.pidfd_open(child.pid)
        try:
            select.select([fd], [], [], 30)          # readable once it ended; not reaped
        finally:
            os.close(fd)
        return child

    for code, seen in (("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", (FAILED_SIGNAL, signal.SIGKILL)),
                       ("import os; os._exit(0)", (FAILED_EXIT, 0)),
                       ("import os; os._exit(7)", (FAILED_EXIT, 7))):
        child = zombie(code)
        assert _exit_status(child.pid) == seen, code
        child.wait(timeout=30)
        assert _exit_status(child.pid) == (FAILED_GONE, 0), code


def test_cli_rank_sys_exit_code_is_the_launchers():
    n, who, code = 4, 2, 3
    run = launch("-n", str(n), "--timeout", "60", script("exit_code.py"), str(who), str(code), timeout=120)
    assert run.returncode == code, run.explain()
    block = run.stderr[run.stderr.index("Root cause (first failure):"):]
    assert re.search(rf"^  rank      : {who} \(pid \d+\)$", block, re.M), block
    assert f"\n  ended by  : exit code {code}\n" in block
    for r in range(n):
        if r != who:
            assert re.search(rf"^  rank {r}: exit code 1: PeerFailure: {_peer_died_message('barrier', r, who, code)}$",
                             block, re.M), block


@pytest.mark.slow
def test_cli_rank_exiting_0_without_finalize_is_the_root_cause():
    """os._exit(0) after init() is no clean finish: the peers raise naming it, the launcher makes it
    the root cause and exits 1."""
    n, who = 4, 2
    run = launch("-n", str(n), "--timeout", "20", script("exit_unfinalized.py"), str(who), timeout=120)
    assert run.returncode == 1, run.explain()
    block = run.stderr[run.stderr.index("Root cause (first failure):"):]
    assert re.search(rf"^  rank      : {who} \(pid \d+\)$", block, re.M), block
    assert "\n  ended by  : exit code 0 without stratacl.finalize(): " in block, block
    seen = run.by_rank("error")
    assert sorted(seen) == [r for r in range(n) if r != who], run.explain()
    for r, rec in seen.items():
        assert (rec["type"], rec["peer"], rec["operation"]) == ("PeerFailure", who, "barrier"), rec
        assert rec["message"].startswith(f"barrier: rank {r}: peer rank {who} exited (code 0) without finalizing"), rec
        assert re.search(rf"^  rank {r}: exit code 1: PeerFailure: barrier: rank {r}: peer rank {who} exited \(code 0\) "
                         rf"without finalizing", block, re.M), block


def test_the_rank_that_rejected_its_arguments_is_the_root_cause_not_an_earlier_victim():
    n, who = 4, 2
    run = launch("-n", str(n), "--timeout", "20", script("reject_late.py"), str(who), timeout=120)
    assert run.returncode == 1, run.explain()
    block = run.stderr[run.stderr.index("Root cause (first failure):"):]
    assert re.search(rf"^  rank      : {who} \(pid \d+\)$", block, re.M), block
    assert "\n  error     : TypeError: all_reduce: the buffer must be a numpy array, got NoneType\n" in block, block
    for r in range(n):
        if r != who:
            assert re.search(rf"^  rank {r}: exit code 1: CollectiveMismatch: all_reduce: rank {who} rejected its "
                             rf"arguments: TypeError: ", block, re.M), block


def test_spawn_rank_exiting_0_without_finalize_is_a_rank_failure():
    with pytest.raises(stratacl.RankFailure) as info:
        stratacl.spawn(_exit_unfinalized_on_rank, 3, args=(1,), timeout=60)
    assert info.value.rank == 1
    assert "ended by  : exit code 0 without stratacl.finalize()" in str(info.value)


def test_spawn_rank_sys_exit_is_a_rank_failure_not_an_exit_of_the_caller():
    with pytest.raises(stratacl.RankFailure) as info:
        stratacl.spawn(_exit_on_rank, 3, args=(1, 3), timeout=60)
    assert info.value.rank == 1
    assert "ended by  : exit code 3" in str(info.value)
    assert "SystemExit: 3" in info.value.traceback_text
