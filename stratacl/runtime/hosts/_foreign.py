"""Joining a job started by another launcher: torchrun, or mpirun (Open MPI; MPICH's mpiexec).

``stratacl-launch`` creates a job's segments and hands every rank their descriptors. Under a
launcher of its own kind a program has no such parent, so ``init()`` reads the launcher's
environment instead (``detect``) and the ranks on the host meet through /dev/shm:

    first rank of the host: job id = a random one (runtime/memory/_names.py; under torchrun the
                  launch's first rank makes it and every rank reads it from torchrun's
                  store); create the semaphore stratacl-<job id>-ready (O_EXCL, 0600) and the
                  segments by name (O_EXCL, 0600, names kept), start the host's daemon
                  (stratacl.jobs._daemon --watch: a pidfd per rank; names a rank that ends
                  unfinalized in the control segment, sweeps /dev/shm once every rank ended),
                  which posts the semaphore once it is watching; wait for that, remove the
                  semaphore's name, then tell the host's other ranks the job id (or why it
                  failed) through the launcher's channel: MPI (a broadcast on the host's
                  ranks) under mpirun and mpiexec, torchrun's store under torchrun
    other ranks:  wait for that word (within the timeout), open the segments by name
    every rank:  write its pid to the control segment (the daemon watches it from then on)
    after init's barrier every rank holds every descriptor: the first rank unlinks the names

No port is opened: the launcher's own channel carries the one word. The names are random, so
no other user can know them before they exist, and a name that exists already is refused,
never opened: nobody can stop or enter a job by making its names first.

A launch whose ranks span hosts (``hosts``: torchrun's nodes, Open MPI's host names gathered
over MPI, or ``STRATACL_EMULATE_HOSTS`` on one machine) is one job of one part per host, as
``stratacl-launch --hosts`` makes (jobs/_hostjob.py): each host's job id is the launch's with
``h<host>``, its first rank does the above for the host's ranks (segments for every rank of
the job: its host's own HBM, a mirror of each far rank) and the host's carrier
(runtime/hosts/_carrier.py) carries the rest: under mpirun a thread of that rank, over an MPI
communicator of the hosts' first ranks; under torchrun a process per node, under one mpirun
the first rank of node 0 starts once every node's first rank has written its host name and
settings into torchrun's store (which also checks that the nodes' settings agree). MPICH's
launches stay on one host.
"""
from __future__ import annotations

import atexit
import dataclasses
import hashlib
import os
import subprocess
import sys
import time
from typing import Callable

from ..._errors import BootstrapError
from ..memory import create_semaphore, new_job_id


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
    def key(self) -> str:
        """The same on every rank of this launch; another on any other launch. Names this
        launch's keys in its launcher's store; never a name in /dev/shm (anyone can derive it)."""
        key = f"{self.launcher}\0{self.identity}\0{os.getuid()}".encode()
        return hashlib.sha256(key).hexdigest()[:16]


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
        key = f"stratacl/{launch.key}/ranks-of-node/"
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


# When init() is what starts MPI in this process, the process's MPI_Finalize at exit is
# stratacl's (_finalize_mpi), not mpi4py's: after a failure of the job (_failed, which
# runtime/_world.py sets to a look at the job's failure word) it runs only if every process
# of the launch comes to it within the grace
_failed: Callable[[], bool] | None = None
_grace = 5.0


def failure_reported_by(check: Callable[[], bool], grace: float) -> None:
    """``check()`` tells, at exit, whether the job failed (a rank died, timed out, or its
    carrier failed); ``grace``: how long the processes then wait for each other at exit."""
    global _failed, _grace
    _failed, _grace = check, grace


def _finalize_mpi() -> None:
    from mpi4py import MPI
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    if _failed is not None and _failed() and not _all_came(MPI, _grace):
        # Open MPI's MPI_Finalize meets every process of the launch in a fence, and one that
        # died never comes: with --enable-recovery survivors that had reported PeerFailure hung
        # there for good when mpirun had not yet reaped the dead rank. The launcher sees this
        # process end without MPI_Finalize; the job has failed already.
        return
    MPI.Finalize()


def _all_came(MPI, grace: float) -> bool:
    """Whether every process of the launch reaches this barrier within ``grace`` seconds
    (testing at most every 20 ms). Then MPI_Finalize cannot wait for a dead one; and a process
    that failed first does not leave (and have mpirun end the others) before the others have
    reported the failure."""
    world = MPI.COMM_WORLD
    world.Set_errhandler(MPI.ERRORS_RETURN)        # a dead process is an answer here, not an abort
    try:
        req = world.Ibarrier()
        deadline, pause = time.monotonic() + grace, 0.0005
        while not req.Test():
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(0.02, 2 * pause)
    except MPI.Exception:
        return False
    return True


def _mpi():
    # Open MPI's UCX one-sided component refuses (loudly) on hosts without UCX hardware; the
    # carriers' window takes the next one, unless the user chose one
    os.environ.setdefault("OMPI_MCA_osc", "^ucx")
    try:
        if "mpi4py.MPI" not in sys.modules:
            import mpi4py
            mpi4py.rc.finalize = False
            atexit.register(_finalize_mpi)     # before init() registers finalize(): runs after it
        from mpi4py import MPI
    except ImportError:
        raise BootstrapError(
            "stratacl.init(): a job whose ranks span hosts is carried over MPI, and mpi4py is not installed "
            "beside this Python: pip install 'stratacl-emu[cluster]'") from None
    return MPI


class _Word:
    """The launcher's channel between the first rank of a host and the host's other ranks: one
    word, the job id (or, starting with "!", why the first rank could not make the job)."""

    def __init__(self, launch: Launch, config, host_of: list[int] | None, host: int):
        self.launch, self.timeout, self.host = launch, config.timeout, host
        self.comm = self.store = None
        self.base = None                     # torchrun: the launch's job id, the same on every host
        if launch.launcher == "torchrun":
            self.store = _torchrun_store(config)
            key = f"stratacl/{launch.key}/job-id"
            if launch.rank == 0:
                self.store.set(key, new_job_id())
            self.base = self._get(key, "the launch's first rank to pick the job id")
            self.local = launch.local_rank if host_of is None else [r for r, h in enumerate(host_of)
                                                                    if h == host].index(launch.rank)
        else:
            mpi = _mpi()
            world = mpi.COMM_WORLD
            self.comm = world if host_of is None else world.Split(host, launch.rank)
            self.local = self.comm.Get_rank()

    def _get(self, key: str, what: str) -> str:
        try:
            return self.store.get(key).decode()
        except Exception as e:          # noqa: BLE001 - torch's DistStoreError (a timeout) or its network errors
            raise BootstrapError(
                f"stratacl.init(): rank {self.launch.rank}: waited {self.timeout:g} s in torchrun's store for {what} "
                f"({type(e).__name__}: {e}); it has not called stratacl.init() (or init_process_group('stratacl')) "
                f"or it failed before; raise STRATACL_TIMEOUT if it is only slow") from None

    def job_id(self) -> str:
        """The first rank's job id: under torchrun the launch's (every host's first rank
        appends its host), else a new one."""
        return new_job_id() if self.base is None else self.base

    def tell(self, word: str) -> None:
        """The first rank: say the host's job id, or "!" and why it failed."""
        if self.store is not None:
            self.store.set(f"stratacl/{self.launch.key}/word/{self.host}", word)
        else:
            self._bcast(word)

    def hear(self) -> str:
        """Another rank: the first rank's word, within the timeout."""
        if self.store is not None:
            return self._get(f"stratacl/{self.launch.key}/word/{self.host}",
                             "the first rank of this host to create the job")
        return self._bcast(None)

    def _bcast(self, word: str | None) -> str:
        """A broadcast from the host's first rank that waits at most the timeout (an MPI
        collective has none of its own), testing at most every 20 ms."""
        buf = bytearray(4096)
        if word is not None:
            data = word.encode()[:len(buf) - 4]
            buf[:4 + len(data)] = len(data).to_bytes(4, "little") + data
        req = self.comm.Ibcast(buf, root=0)
        deadline, pause = time.monotonic() + self.timeout, 0.0005
        while not req.Test():
            if time.monotonic() > deadline:
                if word is not None:
                    return word     # the others gave up: they raise, naming this rank
                raise BootstrapError(
                    f"stratacl.init(): rank {self.launch.rank}: waited {self.timeout:g} s for the first rank of this "
                    f"host to create the job ({self.launch.launcher}); it has not called stratacl.init() (or "
                    f"init_process_group('stratacl')) or it failed before; raise STRATACL_TIMEOUT if it is only slow")
            time.sleep(pause)
            pause = min(0.02, 2 * pause)
        return bytes(buf[4:4 + int.from_bytes(buf[:4], "little")]).decode()


def join(launch: Launch, config) -> Joined:
    """Create (the first rank of the host) or open (the others) the host's segments of the job.
    Blocks the other ranks until the first has made it, at most ``config.timeout`` seconds.
    Over hosts (``hosts``): every host has a job of its own, the first rank of each starts the
    host's daemon for the host's ranks and, under mpirun, joins the other hosts' first ranks in
    the carriers' communicator (collective over every rank of the launch)."""
    import posix_ipc        # here: a rank of a stratacl-launch job never needs it

    from ..memory import create_job_segments, open_job_segments, prefix, unlink_job_names
    host_of = hosts(launch, config)
    carriers, host = None, 0
    if host_of is not None:
        host = host_of[launch.rank]
    word = _Word(launch, config, host_of, host)
    local = word.local
    if host_of is not None and launch.launcher.startswith("mpirun"):
        mpi = _mpi()
        # the first rank of each host, in host order: the carriers' communicator
        carriers = mpi.COMM_WORLD.Split(0 if local == 0 else mpi.UNDEFINED, host)
        carriers = None if carriers == mpi.COMM_NULL else carriers
    ranks = None if host_of is None else [r for r, h in enumerate(host_of) if h == host]
    if local != 0:
        said = word.hear()
        if said.startswith("!"):
            raise BootstrapError(f"stratacl.init(): rank {launch.rank}: the first rank of this host could not create "
                                 f"the job: {said[1:]}")
        job_id = said
        try:
            ctl_fd, hbm_fds = open_job_segments(job_id, launch.world)
        except posix_ipc.ExistentialError:
            raise BootstrapError(
                f"stratacl.init(): rank {launch.rank}: the segments of job {job_id} are gone: the job ended (a rank "
                f"failed, or the names were already removed because every rank had joined: is WORLD_SIZE "
                f"{launch.world} right?)") from None
        return Joined(job_id, ctl_fd, hbm_fds, False, host_of, carriers)
    base = word.job_id()
    job_id = base if host_of is None else f"{base}h{host}"
    p = prefix(job_id)
    made: list[int] = []
    ready = None
    try:
        ready = create_semaphore(f"/{p}ready")
        try:
            ctl_fd, hbm_fds = create_job_segments(job_id, launch.world, config, keep_names=True)
        except posix_ipc.ExistentialError as e:
            from ..memory import refused
            raise refused("a segment of the job", f"/{p}* ({e})") from None
        made = [ctl_fd, *hbm_fds]
        start_daemon(job_id, launch.world, ctl_fd, config.timeout, ranks,
                     carrier_process=host_of is not None and carriers is None)
        # the daemon posts the semaphore once it watches the ranks: until then nobody joins
        if not _wait_posted(ready, config.timeout):
            raise BootstrapError(
                f"stratacl.init(): rank {launch.rank}: the host's daemon of job {job_id} did not start "
                f"within {config.timeout:g} s (python -m stratacl.jobs._daemon --watch); nothing would clean "
                f"up after the job, so it is not started")
        _forget(ready)
    except BaseException as e:
        if made:
            unlink_job_names(job_id, launch.world)
            for fd in made:
                os.close(fd)
        if ready is not None:
            _forget(ready)
        try:
            word.tell("!" + (str(e) or type(e).__name__))
        except Exception:           # noqa: BLE001 - the others time out instead
            pass
        raise
    finally:
        if ready is not None:
            ready.close()
    word.tell(job_id)
    if host_of is not None and carriers is None:
        _start_carriers(launch, config, host_of, base)
    return Joined(job_id, ctl_fd, hbm_fds, True, host_of, carriers)


def _start_carriers(launch: Launch, config, host_of: list[int], base: str) -> None:
    """torchrun over hosts (whose ranks have no MPI of their own): the carriers run in processes
    of their own, one per host, under one mpirun (``python -m stratacl.runtime.hosts``), which
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
                      "-n", str(len(names)), sys.executable, "-P", "-m", "stratacl.runtime.hosts", base,
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
    """The first rank removes the semaphore's name: the daemon posted it (or never will)."""
    try:
        ready.unlink()
    except Exception:       # noqa: BLE001 - already gone
        pass


def joined(job_id: str, world: int, created: bool) -> None:
    """Every rank has opened the segments (init's barrier is past): the creator removes the names."""
    if not created:
        return
    import posix_ipc

    from ..memory import prefix, unlink_job_names
    unlink_job_names(job_id, world)
    try:            # gone already (join removed it once the daemon posted), unless that failed
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
