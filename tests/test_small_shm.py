"""A small /dev/shm (a container's default is 64 MiB): the job's segments do not depend on its
size, a /dev/shm that fills up under the job is an OutOfMemory naming the size, never a SIGBUS,
and the launcher never dies of a signal while it reads a segment (docs/memory.md, "What backs
the segments").

The end-to-end tests run in a mount namespace of their own with a tmpfs of the size under test
on /dev/shm (``unshare -m``), so the host's /dev/shm is never filled; they skip, saying why,
where the user may not make one.
"""
from __future__ import annotations

import functools
import os
import shlex
import stat
import subprocess
import sys

import pytest

from launch_helpers import clean_env, launcher_command, script
from stratacl._config import Config
from stratacl.runtime.memory import _segments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTING = "@@ /dev/shm: "


@functools.lru_cache(maxsize=1)
def _namespace_refusal() -> str | None:
    """Why a private mount namespace with its own /dev/shm cannot be made here (None: it can)."""
    try:
        p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=1M tmpfs /dev/shm"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare could not run: {e}"
    if p.returncode != 0:
        return f"no private /dev/shm: unshare -m + mount tmpfs failed ({p.stderr.strip() or p.returncode})"
    return None


def in_small_shm(size: str, command: str, timeout: float) -> subprocess.CompletedProcess:
    """``command`` (shell) in a mount namespace whose /dev/shm is a fresh tmpfs of ``size``; the
    namespace's /dev/shm is listed afterwards (a line starting with LISTING)."""
    why = _namespace_refusal()
    if why:
        pytest.skip(why)
    inner = (f"mount -t tmpfs -o size={size} tmpfs /dev/shm || exit 99; {command}; rc=$?; "
             f"echo \"{LISTING}$(ls -A /dev/shm | tr '\\n' ' ')\"; exit $rc")
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", inner], capture_output=True,
                          text=True, timeout=timeout, env=clean_env(), cwd=ROOT)


def listing(p: subprocess.CompletedProcess) -> list[str]:
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(LISTING)]
    assert len(lines) == 1, p.stdout[-2000:]
    return lines[0][len(LISTING):].split()


def explain(p: subprocess.CompletedProcess) -> str:
    return f"exit code {p.returncode}\n--- stdout ---\n{p.stdout[-3000:]}\n--- stderr ---\n{p.stderr[-5000:]}"


@pytest.mark.timeout(300)
def test_the_readme_command_runs_in_a_64_mib_dev_shm():
    launch = " ".join(shlex.quote(a) for a in launcher_command())
    p = in_small_shm("64M", f"{launch} -n 32 --clock virtual examples/allreduce.py", timeout=280)
    assert p.returncode == 0, explain(p)
    assert sum("correct on every rank" in ln for ln in p.stdout.splitlines()) == 2, explain(p)
    assert "Bus error" not in p.stderr and "SIGBUS" not in p.stderr, explain(p)
    assert listing(p) == []


@pytest.mark.timeout(180)
def test_a_dev_shm_filled_under_the_job_is_out_of_memory_naming_the_size():
    # 2 ranks x 8 MiB of HBM fit a 32 MiB /dev/shm, so the HBM goes there; rank 0 then fills it
    launch = " ".join(shlex.quote(a) for a in launcher_command())
    p = in_small_shm("32M", f"{launch} -n 2 --hbm-size 8M {shlex.quote(script('fill_shm.py'))} filler 4",
                     timeout=160)
    assert p.returncode == 1, explain(p)
    assert "allocated on every rank" not in p.stdout
    assert "Bus error" not in p.stderr and "SIGBUS" not in p.stderr, explain(p)
    assert "Root cause (first failure):" in p.stderr, explain(p)
    error = [ln for ln in p.stderr.splitlines() if ln.startswith("  error     : ")]
    assert len(error) == 1, explain(p)
    assert error[0].startswith("  error     : OutOfMemory: rank ") and (
        ": out of memory allocating 4.0 MiB: no room for 4.0 MiB of HBM in /dev/shm, which backs this job's "
        "HBM: ") in error[0] and "docker run --shm-size" in error[0], error[0]
    assert listing(p) == ["filler"]         # the filler is the test's; nothing of the job's is left


def test_segments_leave_dev_shm_when_it_cannot_hold_the_hbm(monkeypatch):
    config = Config(hbm_size="64M")
    for free, where in ((2 * 64 << 20, "/dev/shm/"), (2 * 64 << 20 - 1, "/memfd:")):
        monkeypatch.setattr(_segments, "shm_free", lambda free=free: free)
        ctl_fd, hbm_fds = _segments.create_job_segments("test-small-shm", 2, config)
        try:
            paths = [os.readlink(f"/proc/self/fd/{fd}") for fd in (ctl_fd, *hbm_fds)]
            modes = [stat.S_IMODE(os.fstat(fd).st_mode) for fd in (ctl_fd, *hbm_fds)]
        finally:
            for fd in (ctl_fd, *hbm_fds):
                os.close(fd)
        assert paths[0].startswith("/memfd:stratacl-test-small-shm-ctl"), paths   # always: sparse, N^2
        assert all(p.startswith(where) for p in paths[1:]), (free, paths)
        assert modes == [0o600] * 3, modes


READ_FULL_MOUNT = """
import os, posix_ipc
from stratacl.runtime.services import flight as _flight
from stratacl.runtime.services._control import Control
shm = posix_ipc.SharedMemory("/stratacl-test-full-ctl", posix_ipc.O_CREX, mode=0o600,
                             size=Control.size_for(8))
shm.unlink()
with open("/dev/shm/filler", "wb") as f:            # the mount is full: no page can be allocated
    f.write(bytes(os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize))
ctl = Control(shm.fd, 8)
print("@@ records", sum(len(_flight.read(ctl, r)) for r in range(8)), flush=True)
"""


@pytest.mark.timeout(60)
def test_reading_flight_records_on_a_full_mount_is_no_sigbus():
    # as the launcher reads a failed job's flight records; through the mapping, the first page
    # nobody wrote would need a page the mount cannot give: SIGBUS
    p = in_small_shm("1M", f"{shlex.quote(sys.executable)} -c {shlex.quote(READ_FULL_MOUNT)}", timeout=50)
    assert p.returncode == 0, explain(p)
    assert "@@ records 0" in p.stdout, explain(p)
    assert listing(p) == ["filler"]
