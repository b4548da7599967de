"""Joining a job started by another launcher: torchrun, or mpirun (Open MPI; MPICH's mpiexec).

``stratacl-launch`` creates a job's segments and hands every rank their descriptors. Under a
launcher of its own kind a program has no such parent, so ``init()`` reads the launcher's
environment instead (``detect``) and the ranks on the host meet through /dev/shm:

    every rank: job id = hash(what the launcher made unique for this launch, uid)
                open (or create) the semaphore stratacl-<job id>-ready, 0600
    local rank 0: create the segments by name (0600, names kept), start the host's daemon
                  (stratacl.jobs._daemon --watch: a pidfd per rank; names a rank that ends
                  unfinalized in the control segment, sweeps /dev/shm once every rank ended),
                  which posts the semaphore once it is watching; wait for that, pass it on
    other ranks:  wait on the semaphore (kernel waits, within the timeout), pass it on, open the
                  segments by name
    every rank:  write its pid to the control segment (the daemon watches it from then on)
    after init's barrier every rank holds every descriptor: local rank 0 unlinks the names

No port is opened: the launcher's own store and rendezvous stay the launcher's business, and
the job id is derived from what it already agreed on (torchrun's run id, master address and
port and restart count; Open MPI's PMIx namespace; MPICH's process manager), so no exchange
is needed.

A launch whose ranks span hosts (``hosts``: torchrun's nodes, Open MPI's host names gathered
over MPI, or ``STRATACL_EMULATE_HOSTS`` on one machine) is one job of one part per host, as
``stratacl-launch --hosts`` makes (jobs/_hostjob.py): each host's job id is the launch's with
``h<host>``, its first rank does the above for the host's ranks (segments for every rank of
the job: its host's own HBM, a mirror of each far rank) and the host's carrier
(runtime/_carrier.py) carries the rest: under mpirun a thread of that rank, over an MPI
communicator of the hosts' first ranks; under torchrun a process per node, under one mpirun
the first rank of node 0 starts once every node's first rank has written its host name and
settings into torchrun's store (which also checks that the nodes' settings agree). MPICH's
launches stay on one host.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import time

from .._errors import BootstrapError


@dataclasses.dataclass(frozen=True)
class Launch:
    """What a foreign launcher told this process."""
    launcher: str           # for messages: "torchrun", "mpirun (Open MPI)", "mpiexec (MPICH)"
    rank: int
    world: int
    local_rank: int
    local_world: int
    identity: str           # what its launcher made unique for this launch, on this host
    node: int | None = None  # torchrun's node (GROUP_RANK), when it gives one
    nodes: int | None = None  # and how many there are (GROUP_WORLD_SIZE)

    @property
    def job_id(self) -> str:
        """The same on every rank of this launch on this host; another on any other launch."""
        key = f"{self.launcher}\0{self.identity}\0{os.getuid()}".encode()
        return hashlib.sha256(key).hexdigest()[:8]


def _ints(environ, *names: str) -> list[int] | None:
    try:
        return [int(environ[n]) for n in names]
    except (KeyError, ValueError):
        return None


def detect(environ=None) -> Launch | None:
    """The launcher this process was started by, from its environment; None if none we know."""
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env:
        got = _ints(env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        if got is not None:
            ident = "/".join(env.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                                                     "TORCHELASTIC_RESTART_COUNT"))
            node = _ints(env, "GROUP_RANK", "GROUP_WORLD_SIZE") or [None, None]
            return Launch("torchrun", *got, ident, *node)
    got = _ints(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE")
    if got is not None:
        # the PMIx namespace names one run of mpirun ("prterun-<host>-<pid>@1")
        ident = env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid", "")
        return Launch("mpirun (Open MPI)", *got, ident)
    got = _ints(env, "PMI_RANK", "PMI_SIZE")
    if got is not None:
        local = _ints(env, "MPI_LOCALRANKID", "MPI_LOCALNRANKS") or [got[0], got[1]]
        # Hydra's proxy on this host is every local rank's parent
        ident = f"{env.get('PMI_KVSNAME', '')}/{os.getppid()}"
        return Launch("mpiexec (MPICH)", *got, *local, ident)
    return None


@dataclasses.dataclass
class Joined:
    """What ``join`` made or opened: the host's job (its id, its control segment's and every
    rank's HBM segment's descriptors), whether this rank created it, and over hosts each rank's
    host and, on the first rank of each host under mpirun, the carriers' MPI communicator."""
    job_id: str
    ctl_fd: int
    hbm_fds: list[int]
    created: bool
    host_of: list[int] | None = None
    carriers: object = None


def hosts(launch: Launch, config) -> list[int] | None:
    """Each rank's host, for a launch whose ranks span hosts (or split into
    ``config.emulate_hosts`` emulated hosts on one); None for a launch on one host."""
    from ._carrier import hosts_of
    k = config.emulate_hosts
    if k > 1:
        if launch.local_world != launch.world:
            raise BootstrapError(
                f"stratacl.init(): STRATACL_EMULATE_HOSTS={k} splits ranks of one host into emulated hosts, but "
                f"{launch.launcher} started these ranks on several hosts ({launch.local_world} of {launch.world} here)")
        if k > launch.world:
            raise BootstrapError(f"stratacl.init(): STRATACL_EMULATE_HOSTS={k}: more hosts than ranks ({launch.world})")
        return hosts_of(launch.world, k)
    if launch.local_world == launch.world:
        return None
    if launch.launcher.startswith("mpirun"):
        import socket
        return _by_first_seen(_mpi().COMM_WORLD.allgather(socket.gethostname()))
    if launch.launcher == "torchrun" and launch.node is not None and launch.nodes:
        # torchrun numbers the ranks node after node; each node may run its own number of them,
        # which its first rank writes into torchrun's store
        store = _torchrun_store(config)
        key = f"stratacl/{launch.job_id}/ranks-of-node/"
        if launch.local_rank == 0:
            store.set(f"{key}{launch.node}", str(launch.local_world))
        counts = [int(store.get(f"{key}{g}")) for g in range(launch.nodes)]
        if sum(counts) == launch.world and launch.rank == sum(counts[:launch.node]) + launch.local_rank:
            return [g for g, c in enumerate(counts) for _ in range(c)]
    raise BootstrapError(
        f"stratacl.init(): {launch.launcher} started rank {launch.rank} of {launch.world} as local rank "
        f"{launch.local_rank} of {launch.local_world} on this host; a StrataCL job started by {launch.launcher} "
        f"must have all its ranks on one host (run {launch.world} processes on one node, or start the job with "
        f"torchrun, numbering ranks node after node, Open MPI's mpirun or stratacl-launch --hosts, which carry "
        f"it across hosts: docs/cluster.md)")


def _torchrun_store(config):
    """A client of torchrun's own store (MASTER_ADDR, MASTER_PORT), as torch's env:// makes."""
    import datetime

    from torch.distributed import TCPStore
    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                    timeout=datetime.timedelta(seconds=config.timeout))


def _by_first_seen(names: list[str]) -> list[int]:
    index: dict[str, int] = {}
    return [index.setdefault(n, len(index)) for n in names]


def _mpi():
    # Open MPI's UCX one-sided component refuses (loudly) on hosts without UCX hardware; the
    # carriers' window takes the next one, unless the user chose one
    os.environ.setdefault("OMPI_MCA_osc", "^ucx")
    try:
        from mpi4py import MPI
    except ImportError:
        raise BootstrapError(
            "stratacl.init(): a job whose ranks span hosts is carried over MPI, and mpi4py is not installed "
            "beside this Python: pip install 'stratacl-emu[cluster]'") from None
    return MPI


def _check_spanning(launch: Launch, config, host_of: list[int]) -> None:
    from ._hosts import uncarried
    why = [f"STRATACL_{name.upper()}={value} ({reason})" for name, value, reason in uncarried(config)]
    if why:
        raise BootstrapError(f"stratacl.init(): a job spanning hosts ({max(host_of) + 1} here) does not run with "
                             + "; ".join(why))


def _semaphore(job_id: str, prefix: str):
    import posix_ipc
    # every rank may be first: O_CREAT (not O_CREX) makes one semaphore whoever gets there first
    return posix_ipc.Semaphore(f"/{prefix}ready", posix_ipc.O_CREAT, mode=0o600, initial_value=0)


def join(launch: Launch, config) -> Joined:
    """Create (the first rank of the host) or open (the others) the host's segments of the job.
    Blocks the other ranks until the first has made it, at most ``config.timeout`` seconds.
    Over hosts (``hosts``): every host has a job of its own, the first rank of each starts the
    host's daemon for the host's ranks and, under mpirun, joins the other hosts' first ranks in
    the carriers' communicator (collective over every rank of the launch)."""
    import posix_ipc        # here: a rank of a stratacl-launch job never needs it

    from ._segments import create_job_segments, open_job_segments, prefix
    host_of = hosts(launch, config)
    job_id, local, ranks, carriers = launch.job_id, launch.local_rank, None, None
    if host_of is not None:
        _check_spanning(launch, config, host_of)
        host = host_of[launch.rank]
        ranks = [r for r, h in enumerate(host_of) if h == host]
        job_id, local = f"{job_id}h{host}", ranks.index(launch.rank)
        if launch.launcher.startswith("mpirun"):
            mpi = _mpi()
            # the first rank of each host, in host order: the carriers' communicator
            carriers = mpi.COMM_WORLD.Split(0 if local == 0 else mpi.UNDEFINED, host)
            carriers = None if carriers == mpi.COMM_NULL else carriers
    p = prefix(job_id)
    ready = _semaphore(job_id, p)
    try:
        if local == 0:
            try:
                ctl_fd, hbm_fds = create_job_segments(job_id, launch.world, config, keep_names=True)
            except posix_ipc.ExistentialError:
                raise BootstrapError(
                    f"stratacl.init(): rank {launch.rank}: /dev/shm already holds the segments of job {job_id} "
                    f"({launch.launcher} launch {launch.identity!r}): a process of an earlier launch with the same "
                    f"ids is still running, or was ended before its daemon could clean up; end it, or remove "
                    f"/dev/shm/{p}* and /dev/shm/sem.{p}*") from None
            try:
                start_daemon(job_id, launch.world, ctl_fd, config.timeout, ranks,
                             carrier_process=host_of is not None and carriers is None)
                # the daemon posts the semaphore once it watches the ranks: until then nobody joins
                if not _wait_posted(ready, config.timeout):
                    raise BootstrapError(
                        f"stratacl.init(): rank {launch.rank}: the host's daemon of job {job_id} did not start "
                        f"within {config.timeout:g} s (python -m stratacl.jobs._daemon --watch); nothing would clean "
                        f"up after the job, so it is not started")
            except BaseException:
                from ._segments import unlink_job_names
                unlink_job_names(job_id, launch.world)
                _forget(ready)
                for fd in (ctl_fd, *hbm_fds):
                    os.close(fd)
                raise
            ready.release()
            if host_of is not None and carriers is None:
                _start_carriers(launch, config, host_of, launch.job_id)
            return Joined(job_id, ctl_fd, hbm_fds, True, host_of, carriers)
        if not _wait_posted(ready, config.timeout):
            _forget(ready)
            raise BootstrapError(
                f"stratacl.init(): rank {launch.rank}: waited {config.timeout:g} s for the first rank of this host to create job "
                f"{job_id} ({launch.launcher}); it has not called stratacl.init() (or init_process_group('stratacl')) "
                f"or it failed before; raise STRATACL_TIMEOUT if it is only slow")
        ready.release()          # for the next rank
        try:
            ctl_fd, hbm_fds = open_job_segments(job_id, launch.world)
        except posix_ipc.ExistentialError:
            raise BootstrapError(
                f"stratacl.init(): rank {launch.rank}: the segments of job {job_id} are gone: the job ended (a rank "
                f"failed, or the names were already removed because every rank had joined: is WORLD_SIZE "
                f"{launch.world} right?)") from None
        return Joined(job_id, ctl_fd, hbm_fds, False, host_of, carriers)
    finally:
        ready.close()


def _start_carriers(launch: Launch, config, host_of: list[int], base: str) -> None:
    """torchrun over hosts (whose ranks have no MPI of their own): the carriers run in processes
    of their own, one per host, under one mpirun (``python -m stratacl.runtime._carrier``), which
    the first rank of host 0 starts once the first rank of every host has said where it is, in
    torchrun's store. Each opens its host's segments by name; the ranks' first barrier waits for
    them. On real hosts mpirun reaches the others as ``stratacl-launch --hosts`` does (ssh,
    docs/cluster.md). What they write to stderr (why one failed) goes where this rank's does."""
    import json
    import shutil
    import socket

    from ._carrier import MPIRUN_FLAGS, PER_PROCESS, mpirun_env
    host = host_of[launch.rank]
    store = _torchrun_store(config)
    key = f"stratacl/{base}/host/"
    # torchrun carries no settings between nodes: every host's first rank checks that all agree
    settings = {k: v for k, v in config.as_env().items() if k not in PER_PROCESS}
    store.set(f"{key}{host}", json.dumps([socket.gethostname(), settings]))
    every = [json.loads(store.get(f"{key}{g}")) for g in range(max(host_of) + 1)]
    differ = sorted({k for _, s in every for k in s if s.get(k) != settings.get(k)})
    if differ:
        said = "; ".join(f"{k}: " + ", ".join(f"host {g} {s.get(k)}" for g, (_, s) in enumerate(every)) for k in differ)
        raise BootstrapError(f"stratacl.init(): rank {launch.rank}: the hosts' settings differ ({said}); give every "
                             f"node the same STRATACL_* settings")
    if host != 0:
        return
    mpirun = shutil.which("mpirun", path=os.path.dirname(sys.executable))
    if mpirun is None:
        raise BootstrapError("stratacl.init(): a torchrun job whose ranks span hosts is carried over MPI, and there is "
                             "no mpirun beside this Python: pip install 'stratacl-emu[cluster]'")
    names = [name for name, _ in every]
    hosts: list[list] = []                   # [name, carriers]: hosts of one name (emulated) share it
    for name in names:
        if hosts and hosts[-1][0] == name:
            hosts[-1][1] += 1
        else:
            hosts.append([name, 1])
    env, exported = mpirun_env(dict(os.environ))
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    subprocess.Popen([mpirun, *root, "-H", ",".join(f"{n}:{c}" for n, c in hosts), *MPIRUN_FLAGS, *exported,
                      "-n", str(len(names)), sys.executable, "-P", "-m", "stratacl.runtime._carrier", base,
                      str(launch.world), json.dumps(host_of)],
                     env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def _wait_posted(ready, timeout: float) -> bool:
    """Take the semaphore within ``timeout`` seconds of the monotonic clock. A semaphore's timed
    wait ends at a wall-clock time, which a clock step moves: it sleeps in slices of at most a
    second, each ended by the kernel, and the deadline is kept here."""
    import posix_ipc
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            ready.acquire(min(1.0, left))
            return True
        except posix_ipc.BusyError:
            continue


def _forget(ready) -> None:
    """A rank that gave up waiting removes the semaphore's name (it may have created it: the
    job it waited for is gone, or never came)."""
    try:
        ready.unlink()
    except Exception:       # noqa: BLE001 - already gone
        pass


def joined(job_id: str, world: int, created: bool) -> None:
    """Every rank has opened the segments (init's barrier is past): the creator removes the names."""
    if not created:
        return
    import posix_ipc

    from ._segments import prefix, unlink_job_names
    unlink_job_names(job_id, world)
    try:
        posix_ipc.unlink_semaphore(f"/{prefix(job_id)}ready")
    except posix_ipc.ExistentialError:
        pass


def start_daemon(job_id: str, world: int, ctl_fd: int, timeout: float, ranks: list[int] | None = None,
                 carrier_process: bool = False) -> None:
    """The host's daemon, in a session of its own (a launcher that ends a rank's process group
    leaves it to clean up), holding none of the rank's pipes (a launcher that forwards output
    would wait for it)."""
    subprocess.Popen([sys.executable, "-P", "-m", "stratacl.jobs._daemon", "--watch", job_id, str(world),
                      str(ctl_fd), str(timeout), *([",".join(map(str, ranks))] if ranks is not None else []),
                      *(["carrier"] if carrier_process else [])],
                     pass_fds=(ctl_fd,), start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
