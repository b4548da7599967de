"""A job split over emulated hosts (``stratacl-launch --emulate-hosts K``): each host has its
own control segment copy, no rank maps a segment of another host, and what crosses hosts goes
through one MPI carrier per host (stratacl/runtime/hosts/_carrier.py, _hostjob.py, runtime/hosts/_hosts.py).

K = 2, N = 8: every collective of the world communicator, point-to-point calls and one-sided
calls (stratacl.shmem, torch's symmetric memory) between hosts exact on every rank, the modeled
clock after each call equal bit for bit to the same program on one host, what cannot cross
(a load/store view of a far peer) refused by name, a rank killed on the other host
named by every survivor (its failure carried by the carriers), nothing left; what a host's
carrier reads for a call, exactly what the call's slice maps pull from the other host.

Each emulated host runs in network, IPC, mount and UTS namespaces of its own (jobs/_machines.py):
the kernel keeps a rank from another host's /dev/shm and loopback, and after every test of this
file (passed or failed) no namespace of a job is left, nor a link or mount of this machine changed."""
from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from launch_helpers import (assert_all_gone, clean_env, launch, launcher_command, own_shm_names, read_lines_until,
                            script, torchrun_nodes)

MPIRUN = shutil.which("mpirun", path=os.path.dirname(sys.executable))
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),      # jobs over emulated hosts: the jobs tier
              pytest.mark.skipif(MPIRUN is None, reason="no mpirun beside this Python: pip install -e '.[cluster]'")]

N, K = 8, 2


def _net_namespaces(tag: str | None = None) -> set[int]:
    """The network namespaces (inodes) some process of this machine is in (with ``tag``: some
    process of this test's jobs, whose environment carries it; other tests may run meanwhile)."""
    out = set()
    for p in psutil.process_iter():
        try:
            if tag is None or p.environ().get("STRATACL_TEST_JOB_TAG") == tag:
                out.add(os.stat(f"/proc/{p.pid}/ns/net").st_ino)
        except (psutil.Error, OSError):
            pass
    return out


def _machine_view() -> tuple:
    """This machine's own links, mounts and named network namespaces."""
    links = sorted(line.split(":")[1].strip() for line in subprocess.run(
        ["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines())
    with open("/proc/self/mountinfo") as f:
        mounts = sorted(line.split(" - ")[0].split(" ", 4)[4] for line in f)
    netns = subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    return links, mounts, netns


@pytest.fixture(autouse=True)
def _no_namespace_link_or_mount_left():
    before, view = _net_namespaces(), _machine_view()
    yield
    # the kernel removes a namespace (its links, its /dev/shm) once its last process ended
    tag = os.environ["STRATACL_TEST_JOB_TAG"]
    new, end = _net_namespaces(tag) - before, time.monotonic() + 20
    while new and time.monotonic() < end:
        time.sleep(0.1)
        new = _net_namespaces(tag) - before
    assert not new, f"network namespaces left: {new}"
    assert _machine_view() == view


def _carriers_left() -> list[psutil.Process]:
    left = []
    for p in psutil.process_iter(["cmdline"]):
        if "stratacl.runtime.hosts" in (p.info["cmdline"] or []):
            left.append(p)
    return left


def _reports(run) -> dict[int, dict]:
    return {r["rank"]: r for r in run.records if "checks" in r}


def _mpirun(n: int, *argv: str, **settings: str) -> subprocess.CompletedProcess:
    """``mpirun -n n python argv`` with ``settings``: a program started by the user's mpirun."""
    env = {k: v for k, v in clean_env(STRATACL_TIMEOUT="60", OMP_NUM_THREADS="1", **settings).items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.pop("PYTHONUNBUFFERED", None)    # a rank's report line reaches the shared pipe in one write
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    run = subprocess.run([MPIRUN, *root, "--oversubscribe", "-n", str(n), sys.executable, *argv], env=env,
                         capture_output=True, text=True, timeout=200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # the hosts' daemons (one per host) sweep /dev/shm once their ranks ended, in their own sessions
    _gone, alive = psutil.wait_procs(_watching_daemons(), timeout=30)
    assert not alive, [p.pid for p in alive]
    return run


def _watching_daemons() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if "stratacl.jobs._daemon" in (p.info["cmdline"] or []) and "--watch" in p.info["cmdline"]]


def _mpirun_reports(run) -> dict[int, dict]:
    return {rec["rank"]: rec for line in run.stdout.splitlines() if line.startswith("@@ ")
            for rec in [json.loads(line[3:])] if "checks" in rec}


# settings a job over hosts runs with as on one host: the default, ring steps (every all_gather,
# reduce_scatter and all_reduce a ring: each step's word and the bytes it pulls from a far left
# neighbour carried), a pre-registered pool, registration metadata relayed by each host's daemon
SETTINGS = {"mesh": (), "ring": ("--algo", "ring"), "pool": ("--registration", "pool"),
            "relay": ("--metadata-path", "relay")}


def _one_host_run(*flags: str) -> dict[int, dict]:
    """hosts_collectives.py on one host with ``flags``: every rank's results, modeled clocks, maps."""
    together = launch("-n", str(N), "--clock", "virtual", *flags, script("hosts_collectives.py"),
                      env=clean_env(STRATACL_TIMEOUT="60"), timeout=200)
    assert together.returncode == 0, together.explain()
    t = _reports(together)
    assert sorted(t) == list(range(N))
    for r in range(N):
        assert all(t[q]["own"] in t[r]["mapped"] for q in range(N)), r     # one host: every rank's segment
        assert t[r]["refusals"] == {"peer_view": None}
    return t


@pytest.fixture(scope="module")
def one_host() -> dict[int, dict]:
    """hosts_collectives.py on one host, default settings."""
    return _one_host_run()


@pytest.fixture(scope="module")
def one_host_with(one_host):
    """hosts_collectives.py on one host with a setting of SETTINGS (each run once)."""
    runs = {"mesh": one_host}

    def get(setting: str) -> dict[int, dict]:
        if setting not in runs:
            runs[setting] = _one_host_run(*SETTINGS[setting])
        return runs[setting]
    return get


def _same_as_one_host_but_split(a: dict[int, dict], t: dict[int, dict]) -> None:
    """Every result exact (point-to-point on a split across hosts too), every modeled clock
    equal bit for bit to the one-host run; each rank mapped its host's ranks' segments and never
    another host's (their bytes reach it in this host's mirrors); what cannot cross hosts (a
    load/store view of a far peer's memory) refused by name."""
    assert sorted(a) == list(range(N))
    for r in range(N):
        assert a[r]["checks"] and all(v is True for v in a[r]["checks"].values()), (r, a[r]["checks"])
        assert a[r]["checks"] == t[r]["checks"]
        assert a[r]["clocks"] == t[r]["clocks"], r               # the model does not see the hosts
        assert a[r]["metadata_to_far"] == 0, r                   # far ranks map mirrors: no metadata to them
        host = r * K // N
        for q in range(N):
            assert (a[q]["own"] in a[r]["mapped"]) == (q * K // N == host), (r, q)
        far = (r + N // 2) % N
        assert a[r]["refusals"]["peer_view"] == (
            f"OneSidedError: shmem.peer_view: rank {r} -> peer {far}: peer {far} (world rank {far}) is on another "
            f"host (host {1 - host}), and loads and stores do not cross hosts; move its bytes with shmem.put/get")
    assert not own_shm_names()


@pytest.mark.parametrize("setting", SETTINGS)
def test_every_collective_and_send_recv_across_two_hosts_are_exact_with_the_single_host_modeled_clock(
        one_host, one_host_with, setting):
    apart = launch("-n", str(N), "--emulate-hosts", str(K), "--clock", "virtual", *SETTINGS[setting],
                   script("hosts_collectives.py"), env=clean_env(STRATACL_TIMEOUT="60"), timeout=200)
    assert apart.returncode == 0, apart.explain()
    together = one_host_with(setting)
    _same_as_one_host_but_split(_reports(apart), together)
    if setting == "ring":
        # the calls ran as rings on both sides: their modeled times are not the mesh's
        assert all(together[r]["clocks"]["all_reduce 256 KiB"] != one_host[r]["clocks"]["all_reduce 256 KiB"]
                   for r in range(N))
    assert not _carriers_left()


def _onesided(*flags: str, hosts: int = K) -> dict[int, dict]:
    """hosts_onesided.py over ``hosts`` hosts with ``flags``: every rank's report."""
    split = ("--emulate-hosts", str(hosts)) if hosts > 1 else ()
    args = [f for f in flags if f in ("--symm-mem", "--no-errors")]      # the script's own flags
    run = launch("-n", str(N), *split, "--clock", "virtual", *[f for f in flags if f not in args],
                 script("hosts_onesided.py"), *args, env=clean_env(STRATACL_TIMEOUT="60"), timeout=200)
    assert run.returncode == 0, run.explain()
    reports = {r["rank"]: r for r in run.records if "bad" in r}
    assert sorted(reports) == list(range(N))
    return reports


def _onesided_exact(a: dict[int, dict], hosts: int) -> None:
    """Every program of tests/onesided_programs.py found nothing wrong on any rank, with the
    other host's ranks among each rank's peers; the racing atomics' counts exact."""
    for r in range(N):
        assert a[r]["far"] == [q for q in range(N) if q * hosts // N != r * hosts // N], r
        assert all(v == [] for v in a[r]["bad"].values()), (r, a[r]["bad"])
    olds = sorted(v for r in range(N) for v in a[r]["olds"])
    assert olds == list(range(N * 20))                   # every fetch_add saw a distinct old value
    assert a[0]["counted"][0] == N * 20 and a[N - 1]["counted"][1] == N * 20
    assert all(1 <= a[r]["moves"] <= 60 for r in range(N))


def test_one_sided_calls_and_symm_mem_across_two_hosts_are_exact_with_the_single_host_modeled_clock():
    # shmem put/get/put_signal/wait_until/atomics and torch's symmetric memory between ranks of
    # two hosts (the carriers move the bytes and make the updates), the ordering stress test
    # among them: exact, the refusals named, the modeled clock after the deterministic programs
    # equal bit for bit to one host's, and the carriers moved bytes (the test would pass if
    # every peer were near)
    apart, together = _onesided("--symm-mem"), _onesided("--symm-mem", hosts=1)
    _onesided_exact(apart, K)
    _onesided_exact(together, 1)
    for r in range(N):
        assert apart[r]["clocks"] == together[r]["clocks"] and apart[r]["timed"] == together[r]["timed"], r
        assert apart[r]["bytes_carried"] > 0, r
    # with fixed segments (no chunk table to read) and registration metadata relayed, and with a
    # pre-registered pool: the same programs, exact
    for flags in (("--allocator", "caching", "--metadata-path", "relay"), ("--registration", "pool")):
        _onesided_exact(_onesided(*flags, "--no-errors"), K)
    assert not own_shm_names()
    assert not _carriers_left()


def _planned_reads(frontend: str, args: list, host: int) -> int:
    """The bytes the ranks of ``host`` pull from the other host's inputs in a call whose slice
    maps are ``slices.<frontend>(me, N, *args)``: phase by phase, the union of their slices
    that load from a far rank's input (a byte pulled by two ranks here crosses once)."""
    import numpy as np

    from stratacl.collectives import slices
    here = [r for r in range(N) if r * K // N == host]
    args = [np.array(a) if isinstance(a, list) else a for a in args]
    maps = [getattr(slices, frontend)(me, N, *args) for me in here]
    total = 0
    for phase in range(max(len(m) for m in maps)):
        pulled: dict[int, set] = {}
        for m in maps:
            if phase < len(m):
                s = m[phase]
                for q, buf, src, nb, op in zip(s.peer, s.src_buf, s.src, s.nbytes, s.op):
                    if q * K // N != host and buf == slices.IN and op != slices.STORE:
                        pulled.setdefault(int(q), set()).update(range(int(src), int(src + nb)))
        total += sum(len(b) for b in pulled.values())
    return total


def test_a_carrier_reads_for_a_call_exactly_the_slices_its_plans_pull_from_the_other_host():
    # what a host's carrier reads for a call (stats()["bytes_carried"]), against what the
    # call's slice maps have the host's ranks pull from far ranks: not a byte more (a whole
    # input, a phase's slices read at another barrier too), not a byte less (a result would
    # come out of stale mirror bytes: inputs change at every call). The caching allocator:
    # no chunk-table entries are read beside the bytes.
    run = launch("-n", str(N), "--emulate-hosts", str(K), "--allocator", "caching", script("carrier_reads.py"),
                 env=clean_env(STRATACL_TIMEOUT="60"), timeout=200)
    assert run.returncode == 0, run.explain()
    cases = [r for r in run.records if "case" in r]
    assert len(cases) == 12 * N, [r["case"] for r in cases]
    planned = {}
    for r in cases:
        host = r["rank"] * K // N
        key = (r["case"], host)
        if key not in planned:
            planned[key] = _planned_reads(r["frontend"], r["args"], host)
        assert r["exact"], (r["rank"], r["case"])
        assert r["reads"] == [planned[key]] * len(r["reads"]), (r["rank"], r["case"], planned[key])
    # something crosses both ways (the test would pass on nothing read for nothing planned)
    assert all(planned["all_reduce 262144 B", h] and planned["all_to_all", h] for h in range(K)), planned
    assert not own_shm_names()


def test_a_carrier_reads_for_a_ring_call_exactly_what_its_steps_pull_from_a_far_neighbour():
    # under --algo ring a member pulls from its left neighbour only: what a host's carrier reads
    # for a call is what the steps of its members whose left neighbour is far pull from it (at
    # the barriers, and as the neighbour's ring-step word moves), each step's bytes once; not
    # the mesh's plan at the barriers besides. The caching allocator: no chunk-table entries.
    from stratacl.collectives import slices
    run = launch("-n", str(N), "--emulate-hosts", str(K), "--algo", "ring", "--allocator", "caching",
                 script("ring_reads.py"), env=clean_env(STRATACL_TIMEOUT="60"), timeout=200)
    assert run.returncode == 0, run.explain()
    cases = [r for r in run.records if "case" in r]
    assert len(cases) == 3 * N, [r["case"] for r in cases]
    for r in cases:
        host = r["rank"] * K // N
        step = getattr(slices, f"ring_{r['frontend']}_step")
        steps = 2 * (N - 1) if r["frontend"] == "all_reduce" else N - 1
        planned = 0
        for j in range(N):
            left = (j - 1) % N
            if j * K // N == host and left * K // N != host:
                for s in range(steps):
                    m = step(j, N, *r["args"], s)[0]
                    planned += int(m.nbytes[m.peer == left].sum())
        assert r["exact"], (r["rank"], r["case"])
        assert planned and r["reads"] == [planned] * 3, (r["rank"], r["case"], planned)
    assert not own_shm_names()


@pytest.mark.parametrize("algo", ["mesh", "ring"])
def test_a_program_mpirun_starts_over_two_hosts_is_one_job_carried_by_the_first_rank_of_each(one_host_with, algo):
    # the user's mpirun, its ranks split into hosts as --emulate-hosts splits them (on real
    # hosts, by host name): the first rank of each host carries its host's part in a thread;
    # settings from the environment (STRATACL_ALGO=ring was refused at init() once)
    run = _mpirun(N, script("hosts_collectives.py"), STRATACL_EMULATE_HOSTS=str(K), STRATACL_CLOCK="virtual",
                  STRATACL_ALGO=algo)
    _same_as_one_host_but_split(_mpirun_reports(run), one_host_with(algo))


def test_hosts_under_mpirun_with_different_settings_are_refused_by_name():
    # mpirun's application contexts give the second host's ranks another HBM size: the first
    # rank of each host (its carrier) finds the hosts disagree and says which setting
    env = {k: v for k, v in clean_env(STRATACL_TIMEOUT="30", OMP_NUM_THREADS="1", STRATACL_EMULATE_HOSTS="2",
                                      STRATACL_HBM_SIZE="64M").items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    prog = [sys.executable, script("barriers_until_failure.py")]
    run = subprocess.run([MPIRUN, *root, "--oversubscribe", "-n", "2", *prog, ":", "-n", "2", "-x",
                          "STRATACL_HBM_SIZE=32M", *prog], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert run.stderr.count("ValueError: the hosts' settings differ (STRATACL_HBM_SIZE: host 0 67108864, host 1 "
                            "33554432); give every host the same STRATACL_* settings") == 2, run.stderr[-3000:]
    for r, host in ((1, 0), (3, 1)):   # the other rank of each host is told at once, not at its timeout
        assert (f"PeerFailure: barrier: rank {r}: the job is shutting down: the carrier of host {host} (its path to "
                f"the other hosts) failed") in run.stderr, run.stderr[-3000:]
    _gone, alive = psutil.wait_procs(_watching_daemons(), timeout=30)
    assert not alive
    assert not own_shm_names()


def test_a_program_torchrun_starts_on_two_nodes_is_one_job_carried_by_carriers_under_mpirun(one_host):
    # two torchrun agents (--nnodes 2), as on two machines: the first rank of node 0 starts one
    # carrier per node under mpirun, once every node's first rank said where it is
    run = torchrun_nodes(K, N // K, script("hosts_collectives.py"),
                         env=clean_env(STRATACL_TIMEOUT="60", STRATACL_CLOCK="virtual", OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.explain()
    _same_as_one_host_but_split({rec["rank"]: rec for rec in run.records if "checks" in rec}, one_host)
    assert not _carriers_left()


def test_a_rank_killed_on_the_other_host_is_named_by_every_survivor_and_nothing_is_left():
    victim, timeout = 6, 60
    run = launch("-n", str(N), "--emulate-hosts", str(K), "--timeout", str(timeout),
                 script("kill_in_collective.py"), str(victim), timeout=180)
    assert run.returncode == 1, run.explain()
    dying = run.by_rank("dying")
    assert list(dying) == [victim], run.explain()
    errors = run.by_rank("error")
    assert sorted(errors) == [r for r in range(N) if r != victim], run.explain()
    for rank, rec in errors.items():
        assert rec["type"] == "PeerFailure" and rec["peer"] == victim, rec
        assert rec["message"] == (f"all_gather: rank {rank}: peer rank {victim} killed by SIGKILL; "
                                  f"this operation cannot complete"), rec
    assert "\n  ended by  : killed by SIGKILL\n" in run.stderr, run.stderr[-2000:]
    assert_all_gone([dying[victim]["pid"], *(rec["pid"] for rec in errors.values())], timeout=15)
    assert not own_shm_names()
    assert not _carriers_left()


def _job_ended_by(act, n: int = 4, prog: str = "barriers_until_failure.py", timeout: float = 40):
    """Start ``-n n --emulate-hosts 2 prog``, wait until it is ready, ``act(p, tree)`` (the
    launcher's process and every process under it then), and wait for the job to end; the whole
    tree is killed if it does not (mpirun runs in a session of its own). Returns the launcher's
    exit code, its stdout and stderr as text, and the tree."""
    p = subprocess.Popen(launcher_command() + ["-n", str(n), "--emulate-hosts", "2", "--timeout", "60", script(prog)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), start_new_session=True)
    tree: list[psutil.Process] = []
    try:
        read_lines_until(p, 1, '@@ {"ready"', timeout=60)
        tree = psutil.Process(p.pid).children(recursive=True)
        act(p, tree)
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            for q in [psutil.Process(p.pid), *tree]:
                try:
                    q.kill()
                except psutil.NoSuchProcess:
                    pass
            p.wait(10)
    return p.returncode, out.decode(), err.decode(errors="replace"), tree


def _host_launchers(tree: list[psutil.Process]) -> dict[str, psutil.Process]:
    """The host launchers of a job over hosts by host index (not mpirun itself)."""
    return {q.environ()["OMPI_COMM_WORLD_RANK"]: q for q in tree
            if "stratacl.jobs._hostlaunch" in q.cmdline() and "OMPI_COMM_WORLD_RANK" in q.environ()}


# a segmentation fault inside Open MPI's one-sided read or its lock, in the carrier thread
OSC_RDMA_CRASH = re.compile(r"Fatal Python error: Segmentation fault\n\nCurrent thread [^\n]*\n"
                            r'  File "[^"]*/runtime/hosts/_carrier\.py", line \d+ in _move\n')


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n, prog, op", [(4, "barriers_until_failure.py", "barrier"),
                                         (8, "barriers_until_failure.py", "barrier"),
                                         (4, "all_reduces_until_failure.py", "all_reduce")])
def test_a_host_whose_launcher_is_killed_is_named_by_every_rank_of_the_other_host_and_nothing_is_left(n, prog, op):
    # host 1's launcher (which runs its carrier) is SIGKILLed while every rank waits in barriers
    # across the hosts, or runs all_reduces whose bytes the carriers read from each other: Open
    # MPI must not abort host 0's launcher (it runs with --with-ft ulfm, its carrier's MPI
    # errors return), and host 0's carrier may be in a read from host 1 that never returns; its
    # host watch finds host 1's process failed and names it, every rank of host 0 raises at
    # once (not CommTimeout 60 s later), host 0's launcher prints its block naming host 1, the
    # job exits 1
    def kill_host_1(p, tree):
        launchers = _host_launchers(tree)
        assert sorted(launchers) == ["0", "1"], launchers
        launchers["1"].kill()
    code, out, err, tree = _job_ended_by(kill_host_1, n, prog)      # (40 s: the ranks' own timeout is 60 s)
    assert code == 1, out[-2000:] + err[-4000:]
    if op == "all_reduce" and OSC_RDMA_CRASH.search(err):
        # Open MPI's osc rdma may crash host 0's launcher in a read from the lost host before MPI
        # knows it failed (docs/cluster.md, "A lost host"): the job still fails by name, clean
        assert err.endswith("stratacl-launch: the launcher of host(s) 0, 1 ended without reporting how (killed "
                            "by a signal, or crashed): the job failed\n"), err[-4000:]
        assert_all_gone([q.pid for q in tree], timeout=15)
        assert not own_shm_names()
        return
    half = n // 2
    lost = f"host 1 (ranks {half}-{n - 1}) was lost: its launcher or carrier died"
    errors = {rec["rank"]: rec["error"] for line in out.splitlines() if line.startswith("@@ ")
              for rec in [json.loads(line[3:])] if "error" in rec}
    assert sorted(errors) == list(range(half)), out[-2000:] + err[-4000:]
    for r, e in errors.items():
        assert e == f"PeerFailure: {op}: rank {r}: the job is shutting down: {lost}", e
    assert f"\n  host 0 of 2: ranks 0..{half - 1} of {n} (each host's launcher reports its own ranks)\n  {lost} " \
           f"(MPI: MPI_ERR_PROC_FAILED" in err, err[-4000:]
    assert_all_gone([q.pid for q in tree], timeout=15)
    assert not own_shm_names()


def test_a_job_whose_every_host_launcher_is_killed_fails_though_mpirun_says_0():
    # under --with-ft ulfm mpirun exits 0 when its processes die by a signal: with every host's
    # launcher SIGKILLed nothing is left to say the job failed but stratacl-launch, which counts
    # each host launcher's last line (its exit code) and names the hosts that sent none
    def kill_both(p, tree):
        launchers = _host_launchers(tree)
        assert sorted(launchers) == ["0", "1"], launchers
        for q in launchers.values():
            q.kill()
    code, _out, err, tree = _job_ended_by(kill_both)
    assert code == 1, err[-4000:]
    assert err.endswith("stratacl-launch: the launcher of host(s) 0, 1 ended without reporting how (killed by a "
                        "signal, or crashed): the job failed\n"), err[-4000:]
    assert "stratacl-host-outcome" not in err
    assert_all_gone([q.pid for q in tree], timeout=15)
    assert not own_shm_names()


@pytest.mark.parametrize("flags, why", [
    (["-n", "1"], "--emulate-hosts 2: more hosts than ranks (1)"),
])
def test_a_job_emulated_hosts_cannot_split_is_refused_at_launch(flags, why):
    n = [] if "-n" in flags else ["-n", "4"]
    run = launch(*n, *flags, "--emulate-hosts", "2", script("rank_info.py"), timeout=60)
    assert run.returncode == 2, run.explain()
    assert re.match(r"stratacl-launch: " + re.escape(why), run.stderr), run.stderr


def test_the_torch_backend_and_ep_dispatch_combine_run_exact_across_two_hosts():
    env = clean_env(STRATACL_TIMEOUT="60")
    torch_run = launch("-n", "4", "--emulate-hosts", str(K), script("torch_unmodified.py"), env=env, timeout=200)
    assert torch_run.returncode == 0, torch_run.explain()
    reports = {r["rank"]: r for r in torch_run.records}
    assert sorted(reports) == [0, 1, 2, 3] and all(r["bad"] == [] for r in reports.values()), reports
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    # sizes at which a rank's tokens (4-8 MiB) and its routing block sit in segments of their
    # own: the carrier must read both (the block is named in the call's extension words)
    for mode, tokens in (("ht", "2048"), ("ll", "1024")):
        moe = launch("-n", "4", "--emulate-hosts", str(K), os.path.join(examples, "moe_layer.py"), "--mode", mode,
                     "--tokens", tokens, "--hidden", "1024", env=env, timeout=200)
        assert moe.returncode == 0, moe.explain()
        assert "dispatched rows exact and layer output within float32 rounding" in moe.stdout, moe.stdout
        assert moe.stdout.rstrip().endswith("on every rank: yes"), moe.stdout
    assert not own_shm_names()


def _hosts_collectives_exact(run, host_of: list[int]) -> None:
    """Every check of hosts_collectives.py true on every rank, and no rank mapping a segment of
    a rank on another host."""
    assert run.returncode == 0, run.explain()
    rep = _reports(run)
    assert sorted(rep) == list(range(len(host_of)))
    for r in rep:
        assert all(v is True for v in rep[r]["checks"].values()), (r, rep[r]["checks"])
        for q in rep:
            assert (rep[q]["own"] in rep[r]["mapped"]) == (host_of[q] == host_of[r]), (r, q)


def test_hosts_on_this_machine_run_the_job_through_mpirun_one_launcher_per_host():
    # the flags of real hosts, every host named localhost: uneven parts (3 + 1), the store on
    # loopback, every result exact, no rank mapping another host's segment
    run = launch("-n", "4", "--hosts", "localhost:3,localhost:1", "--clock", "virtual", script("hosts_collectives.py"),
                 env=clean_env(STRATACL_TIMEOUT="60"), timeout=200)
    _hosts_collectives_exact(run, [0, 0, 0, 1])
    assert not own_shm_names()


def test_hosts_and_a_hostfile_naming_machines_run_as_on_real_hosts(tmp_path):
    # two emulated machines (namespaces of their own, an address each on a link) named by
    # address, stratacl-launch run on the link as on a login node, mpirun reaching each through
    # its remote-launch agent as through ssh: the real-host path (-H, the settings exported with
    # -x, the store on the first host's address, which host 1 reaches over the link only)
    from stratacl.jobs._machines import Machines
    machines = Machines(2)
    try:
        first, second = machines.addresses
        env = machines.mpirun_env(clean_env(STRATACL_TIMEOUT="60"))
        hostfile = tmp_path / "hosts"
        hostfile.write_text(f"# two machines\n{first} slots=3\n{second} slots=1\n")
        run = launch("-n", "4", "--hostfile", str(hostfile), "--clock", "virtual", script("hosts_collectives.py"),
                     env=env, timeout=200, wrap=machines.head_command([]))
        _hosts_collectives_exact(run, [0, 0, 0, 1])
        run = launch("-n", "4", "--hosts", f"{first}:3,{second}:1", script("host_isolation.py"), env=env, timeout=200,
                     wrap=machines.head_command([]))
        rep = _isolation(run)
        for r in range(4):
            assert rep[r]["store_host"] == first and rep[r]["store"] == "ok", rep[r]
            assert rep[r]["address"] == (first if r < 3 else second), rep[r]
            assert rep[r]["opened"] == ("ok" if r < 3 else "ENOENT"), rep[r]
            assert rep[r]["loopback_store"] == "ECONNREFUSED", rep[r]     # it listens on the link only
    finally:
        machines.close()
    assert not own_shm_names()


def test_the_store_listens_where_the_other_hosts_reach_it():
    from stratacl.jobs._hostjob import store_address
    assert store_address([("localhost", 2), ("localhost", 2)]) == "127.0.0.1"     # every host is this one
    assert store_address([("192.0.2.1", 2), ("localhost", 2)]) == "192.0.2.1"     # the first host, by name
    # the first host is this machine but its name resolves to loopback here (a 127.0.1.1 line
    # in /etc/hosts): this machine's address on the route to the others, never loopback
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            outward = s.getsockname()[0]
    except OSError:
        with pytest.raises(ValueError, match="no route from it reaches '192.0.2.1'"):
            store_address([("localhost", 2), ("192.0.2.1", 2)])
    else:
        assert store_address([("localhost", 2), ("192.0.2.1", 2)]) == outward
        assert not ipaddress.ip_address(outward).is_loopback


@pytest.mark.parametrize("flags, why", [
    (["--hosts", "h1:x"], "--hosts: 'h1:x': expected HOST:RANKS (or 'HOST slots=RANKS' in a hostfile)"),
    (["--hosts", "localhost:2,localhost:1"], "--hosts gives 3 ranks, -n 4"),
    (["--hosts", "localhost:2,localhost:2", "--hostfile", "x"], "give --hosts or --hostfile, not both"),
])
def test_a_bad_host_list_is_refused_at_launch(flags, why):
    run = launch("-n", "4", *flags, script("rank_info.py"), timeout=60)
    assert run.returncode == 2, run.explain()
    assert run.stderr.strip() == f"stratacl-launch: {why}", run.stderr


def _isolation(run) -> dict[int, dict]:
    assert run.returncode == 0, run.explain()
    rep = {r["rank"]: r for r in run.records if r.get("kind") == "isolation"}
    assert sorted(rep) == [0, 1, 2, 3], run.explain()
    return rep


def test_each_emulated_host_has_its_own_dev_shm_address_and_loopback_kept_apart_by_the_kernel():
    run = launch("-n", "4", "--emulate-hosts", "2", script("host_isolation.py"), env=clean_env(STRATACL_TIMEOUT="60"),
                 timeout=120)
    rep = _isolation(run)
    assert "no namespaces of their own" not in run.stderr
    here = os.stat("/dev/shm").st_dev
    for r in range(4):
        same, other = (0, 1) if r < 2 else (2, 3), (2, 3) if r < 2 else (0, 1)
        # rank 0's object is in host 0's /dev/shm only: on host 1 the kernel finds no such name
        assert rep[r]["opened"] == ("ok" if r < 2 else "ENOENT"), rep[r]
        assert rep[r]["shm_dev"] != here and all(rep[r]["shm_dev"] == rep[q]["shm_dev"] for q in same)
        assert all(rep[r]["shm_dev"] != rep[q]["shm_dev"] for q in other)
        assert rep[r]["interfaces"] == ["eth0", "lo"], rep[r]
        assert not ipaddress.ip_address(rep[r]["address"]).is_loopback
        assert all(rep[r]["address"] == rep[q]["address"] for q in same)
        assert all(rep[r]["address"] != rep[q]["address"] for q in other)
        assert all(rep[r]["hostname"] != rep[q]["hostname"] for q in other)
        # the store is on host 0's address: reached there from both hosts, never over a loopback
        assert rep[r]["store_host"] == rep[0]["address"] and rep[r]["store"] == "ok", rep[r]
        assert rep[r]["loopback_store"] == "ECONNREFUSED", rep[r]


def test_where_namespaces_cannot_be_made_the_hosts_share_the_machine_and_the_launcher_says_so():
    # without CAP_SYS_ADMIN (root, but unshare gets EPERM): today's emulation, said in one line
    run = launch("-n", "4", "--emulate-hosts", "2", script("host_isolation.py"), env=clean_env(STRATACL_TIMEOUT="60"),
                 timeout=120, wrap=["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"])
    rep = _isolation(run)
    assert run.stderr.count("stratacl-launch: --emulate-hosts 2: the hosts share this machine's /dev/shm and "
                            "loopback (no namespaces of their own: unshare: unshare failed: Operation not "
                            "permitted)\n") == 1, run.stderr[-2000:]
    assert all(rep[r]["opened"] == "ok" and rep[r]["loopback_store"] == "ok" for r in range(4)), rep
    assert len({rep[r]["shm_dev"] for r in range(4)} | {os.stat("/dev/shm").st_dev}) == 1


def test_sigint_to_the_launcher_ends_every_host_and_removes_their_namespaces():
    def interrupt(p, tree):
        inside = {os.stat(f"/proc/{q.pid}/ns/net").st_ino for q in tree if q.is_running()}
        assert len(inside - {os.stat("/proc/self/ns/net").st_ino}) >= 2       # the head's and the hosts'
        p.send_signal(signal.SIGINT)
    code, _out, _err, tree = _job_ended_by(interrupt, timeout=60)
    assert code != 0
    assert_all_gone([q.pid for q in tree], timeout=15)


def test_the_readme_example_on_a_second_machine_s_worth_of_ranks_through_mpi():
    # 32 ranks a host, as the README's example has on one: 64 over two emulated hosts
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    run = launch("-n", "64", "--emulate-hosts", "2", "--clock", "virtual", os.path.join(examples, "allreduce.py"),
                 timeout=200)
    assert run.returncode == 0, run.explain()
    lines = run.stdout.splitlines()
    assert lines[0].startswith("StrataCL-emu job: 64 ranks"), run.stdout
    assert sum(line.endswith("correct on every rank") for line in lines) == 2, run.stdout
    assert not own_shm_names()
