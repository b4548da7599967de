"""The job's shared store of timed plans (runtime/pipeline/_plans.py): one process times a shape, the
others read it; a maker that dies leaves no one waiting; a large job's modeled times are the
estimate's, with its plans shared."""
from __future__ import annotations

import errno
import hashlib
import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

import stratacl
from stratacl.runtime.pipeline import SharedPlans
from stratacl.runtime.memory import prefix

pytestmark = pytest.mark.timeout(120)
ctx = multiprocessing.get_context("fork")


def _fetch(directory: str, log: str, inside, release, out) -> None:
    def make():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        inside.put(os.getpid())
        release.wait(60)      # the parent lets the maker finish once the others queue behind it
        return np.arange(1000) * 3

    out.put((os.getpid(), SharedPlans("t0", directory, share_from=1).fetch(b"shape", make).tolist()))


def _queued_on(path: str) -> int:
    """How many processes wait for a flock on ``path`` (/proc/locks lists them with "->")."""
    st = os.stat(path)
    dev_ino = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as f:
        return sum(1 for line in f if "->" in line and dev_ino in line)


def test_one_process_makes_a_shape_and_every_other_reads_it(tmp_path):
    log = str(tmp_path / "makers")
    inside, release, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_fetch, args=(str(tmp_path), log, inside, release, out)) for _ in range(4)]
    for p in procs:
        p.start()
    inside.get(timeout=60)
    lock = next(str(tmp_path / n) for n in os.listdir(tmp_path) if n.endswith(".lock"))
    deadline = time.monotonic() + 30
    while _queued_on(lock) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    queued = _queued_on(lock)
    release.set()
    got = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert queued == 3, "the other processes did not wait for the maker"
    with open(log) as f:
        makers = f.read().split()
    assert len(makers) == 1
    assert all(plan == list(range(0, 3000, 3)) for _, plan in got)
    assert store_files(tmp_path) == 1


def store_files(directory) -> int:
    return sum(1 for name in os.listdir(directory) if name.startswith(prefix("t0") + "plan-")
               and not name.endswith(".lock"))


def _stuck_maker(directory: str, inside, release) -> None:
    def make():
        inside.send(1)
        release.recv()        # never comes: the parent kills this process here
        return "from the stuck maker"

    SharedPlans("t0", directory, share_from=1).fetch(b"shape", make)


def _second(directory: str, out) -> None:
    out.put(SharedPlans("t0", directory, share_from=1).fetch(b"shape", lambda: f"made by {os.getpid()}"))


def test_a_maker_that_dies_leaves_no_one_waiting(tmp_path):
    inside_r, inside_w = ctx.Pipe(duplex=False)
    release_r, release_w = ctx.Pipe(duplex=False)
    stuck = ctx.Process(target=_stuck_maker, args=(str(tmp_path), inside_w, release_r))
    stuck.start()
    assert inside_r.poll(30), "the first process never began to make the plan"
    out = ctx.Queue()
    second = ctx.Process(target=_second, args=(str(tmp_path), out))
    second.start()
    os.kill(stuck.pid, signal.SIGKILL)       # it dies holding the shape's lock
    stuck.join(30)
    assert out.get(timeout=60) == f"made by {second.pid}"
    second.join(30)


def _modeled_all_reduce(comm):
    x = stratacl.empty((1 << 16,), np.float32)
    comm.all_reduce(x)                       # the shape's first call: its plan is made here
    t0 = comm.clock()
    comm.all_reduce(x)
    period = comm.clock() - t0
    shared = sorted(n for n in os.listdir("/dev/shm")
                    if n.startswith(prefix(os.environ["STRATACL_JOB_ID"]) + "plan-") and not n.endswith(".lock"))
    return period, len(shared)


@pytest.mark.slow
def test_a_large_job_shares_its_plans_and_keeps_the_estimate():
    n = 64
    results = stratacl.spawn(_modeled_all_reduce, n, clock="virtual", hbm_size=8 << 20, timeout=240)
    want = stratacl.estimate("all_reduce", n, 1 << 18).time_us * 1e-6
    for rank, (period, shared) in enumerate(results):
        assert period == pytest.approx(want, rel=1e-9), f"rank {rank}"
        assert shared >= 2, f"rank {rank} saw {shared} shared plans"


def test_a_full_dev_shm_shares_nothing_and_the_rank_goes_on(tmp_path, monkeypatch):
    # a small /dev/shm (a container's 64 MiB) that a large job's plans fill: writing one fails
    # with ENOSPC; the rank keeps the plan it made, and no partial file is left
    from stratacl.runtime.pipeline import _plans

    def full(f, plan):
        f.write(b"part of a plan")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_plans, "_write", full)
    got = SharedPlans("t0", str(tmp_path), share_from=1).fetch(b"shape", lambda: [1, 2, 3])
    assert got == [1, 2, 3]
    digest = hashlib.blake2b(b"shape", digest_size=16).hexdigest()
    assert [p.name for p in tmp_path.iterdir()] == [f"{prefix('t0')}plan-{digest}.lock"]
