"""A job over several hosts: ``stratacl-launch --hosts h1:4,h2:4`` (or ``--hostfile``), and its
stand-in on one machine, ``--emulate-hosts K``.

    stratacl-launch ----mpirun----> host launcher 0 (python -m stratacl.jobs._hostlaunch) on h1
         (waits, forwards          |  its ranks, its segments, its daemon, its carrier thread
          signals, exit code)      +-> host launcher 1 on h2 ...

``mpirun`` (the Open MPI wheel of the ``cluster`` extra) starts one host launcher per host; each
is an MPI process (its host index is its MPI rank) and runs the host's part of the job as
``stratacl-launch`` runs a whole job on one host (jobs/_supervisor.py, ``Job`` with a
``HostPart``): it creates the host's control segment and one HBM segment per rank of the job
(its own ranks' HBM; for each rank of another host, this host's mirror of it), starts the
host's daemon and forks its ranks, and runs the host's carrier (runtime/hosts/_carrier.py) in a thread,
which is how words, bytes and failures cross hosts. No rank maps a segment of another host.

Under ``--emulate-hosts K`` the K host launchers run on this machine, each with a job id of its
own for its segments' names; as root, each in namespaces of its own (jobs/_machines.py: its own
/dev/shm, loopback and address on a link the job makes, entered by mpirun's remote-launch
agent), otherwise sharing this machine's (loopback TCP between their carriers).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading

from stratacl.runtime.hosts import MPIRUN_FLAGS, hosts_of, mpirun_env
from stratacl.runtime.memory import new_job_id

HOSTJOB_ENV = "STRATACL_HOSTJOB"         # what the host launchers read (JSON; hostjob_env)
OUTCOME = "stratacl-host-outcome: "      # a host launcher's last line on stderr: "<index> <exit code>"
RELAY_QUIET_S = 0.2                      # how long the relay of mpirun's stderr waits for more once mpirun exited


@dataclasses.dataclass
class HostPart:
    """This host's part of a job over hosts: its index, every rank's host, the MPI
    communicator of the host launchers, where rank 0's host serves the job's store."""
    index: int
    host_of: list[int]
    comm: object
    address: str                     # the interface rank 0's host listens on for the store

    @property
    def ranks(self) -> list[int]:
        return [r for r, h in enumerate(self.host_of) if h == self.index]


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """``h1:4,h2:4`` -> [(h1, 4), (h2, 4)]; a hostfile's lines ``h1 slots=4`` or ``h1:4``."""
    out = []
    for item in text.replace("\n", ",").split(","):
        item = item.split("#", 1)[0].strip()
        if not item:
            continue
        if "slots=" in item:
            name, _, slots = item.partition(" slots=")
        else:
            name, _, slots = item.partition(":")
        try:
            count = int(slots.strip())
        except ValueError:
            raise ValueError(f"{item!r}: expected HOST:RANKS (or 'HOST slots=RANKS' in a hostfile)") from None
        if count < 1:
            raise ValueError(f"{item!r}: a host needs at least one rank")
        out.append((name.strip(), count))
    if not out:
        raise ValueError("no hosts given")
    return out


def refusal(n: int, config, hosts: list[tuple[str, int]] | None = None) -> str | None:
    """Why a job of ``n`` ranks cannot run over ``hosts`` (or ``config.emulate_hosts`` emulated
    hosts), or None."""
    k = len(hosts) if hosts else config.emulate_hosts
    if k <= 1 and not hosts:
        return None
    flag = "--hosts" if hosts else f"--emulate-hosts {k}"
    if hosts and sum(c for _, c in hosts) != n:
        return f"--hosts gives {sum(c for _, c in hosts)} ranks, -n {n}"
    if not hosts and k > n:
        return f"--emulate-hosts {k}: more hosts than ranks ({n})"
    if hosts:
        try:
            store_address(hosts)
        except ValueError as e:
            return str(e)
    if _mpirun() is None:
        return f"{flag} needs mpirun and mpi4py beside this Python (pip install 'stratacl-emu[cluster]')"
    return None


def _mpirun() -> str | None:
    return shutil.which("mpirun", path=os.path.dirname(sys.executable))


def _loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(name)).is_loopback
    except (OSError, ValueError):
        return False


def store_address(hosts: list[tuple[str, int]]) -> str:
    """The address rank 0's host serves the job's store on: loopback when every host is this
    machine; the first host's address otherwise. A first host whose name resolves to loopback
    here (this machine, with the 127.0.1.1 line some /etc/hosts have) is reached by the others
    at this machine's address on the route to them."""
    if all(_loopback(h) for h, _ in hosts):
        return "127.0.0.1"
    first = hosts[0][0]
    if not _loopback(first):
        return socket.gethostbyname(first)
    other = next(h for h, _ in hosts if not _loopback(h))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(other), 9))      # a route only: nothing is sent
            return s.getsockname()[0]
    except OSError as e:
        raise ValueError(f"--hosts: {first!r} is this machine, and no route from it reaches {other!r} ({e}); name "
                         f"the first host by an address the others reach") from None


def launch(n: int, config, target: tuple, hosts: list[tuple[str, int]] | None) -> int:
    """Run the job through mpirun, one host launcher per host (``hosts``: real hosts; None:
    ``config.emulate_hosts`` hosts on this machine, each in namespaces of its own where they can
    be made, jobs/_machines.py). Returns the exit code."""
    machines, emulated = None, hosts is None
    if emulated:
        k = config.emulate_hosts
        counts = [hosts_of(n, k).count(g) for g in range(k)]
        hosts = [("localhost", c) for c in counts]
        machines = _emulated_machines(k, config)
        if machines is not None:
            hosts = [(a, c) for a, c in zip(machines.addresses, counts)]
    try:
        return _run(n, config, target, hosts, machines, shared=emulated and machines is None)
    finally:
        if machines is not None:
            machines.close()


def _emulated_machines(k: int, config):
    """K machines of namespaces for ``--emulate-hosts K``, or None (``--shared-hosts``, or they
    cannot be made here: said in one line)."""
    from stratacl.jobs import _machines
    if config.shared_hosts:
        return None
    why = _machines.unavailable()
    if why is None:
        try:
            return _machines.Machines(k)
        except OSError as e:
            why = str(e)
    print(f"stratacl-launch: --emulate-hosts {k}: the hosts share this machine's /dev/shm and loopback "
          f"(no namespaces of their own: {why})", file=sys.stderr, flush=True)
    return None


def _run(n: int, config, target: tuple, hosts: list[tuple[str, int]], machines, shared: bool) -> int:
    emulated = shared                  # hosts sharing this machine's namespaces: no -H, loopback
    host_of = [g for g, (_, c) in enumerate(hosts) for _ in range(c)]
    # the store listens on rank 0's host (docs/cluster.md, "On real hosts")
    address = "127.0.0.1" if emulated else store_address(hosts)
    env = dict(os.environ)
    env.update(config.as_env())
    env[HOSTJOB_ENV] = json.dumps({"n": n, "host_of": host_of, "target": list(target), "address": address,
                                   "job": new_job_id(), "secret": os.urandom(32).hex()})
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    where = ["--oversubscribe"] if emulated else ["-H", ",".join(f"{h}:1" for h, _ in hosts)]
    env, exported = mpirun_env(env)
    argv = [_mpirun(), *root, *where, *MPIRUN_FLAGS, *([] if emulated else exported), "-n", str(len(hosts)),
            sys.executable, "-P", "-m", "stratacl.jobs._hostlaunch"]
    if machines is not None:
        # mpirun runs on the machines' link, as on a login node; its agent enters each machine
        argv, env = machines.head_command(argv), machines.mpirun_env(env)
    # mpirun hands this stdin to host 0's launcher, whose ranks inherit it as on one host; its
    # stderr comes through here, less each host launcher's outcome line
    p = subprocess.Popen(argv, env=env, start_new_session=True, stderr=subprocess.PIPE)
    outcomes: dict[int, int] = {}
    ended = threading.Event()
    relay = threading.Thread(target=_relay_stderr, args=(p.stderr.fileno(), outcomes, ended), daemon=True)
    relay.start()

    def forward(signum, frame):
        try:
            os.killpg(p.pid, signum)
        except ProcessLookupError:
            pass
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = p.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    ended.set()
    relay.join()
    p.stderr.close()
    return job_exit_code(code, outcomes, len(hosts))


def job_exit_code(mpirun_code: int, outcomes: dict[int, int], k: int) -> int:
    """The job's exit code from mpirun's and the host launchers' own (``outcomes``: host index
    -> code, from their OUTCOME lines). mpirun's, unless it says 0: under ``--with-ft ulfm`` it
    exits 0 when launchers die by a signal (a host launcher killed, or crashed in MPI), so a
    host that did not report, or reported a failure, fails the job and is named."""
    if mpirun_code != 0:
        return mpirun_code
    silent = [g for g in range(k) if g not in outcomes]
    if silent:
        print(f"stratacl-launch: the launcher of host(s) {', '.join(map(str, silent))} ended without reporting "
              f"how (killed by a signal, or crashed): the job failed", file=sys.stderr, flush=True)
        return 1
    return max(outcomes.values(), default=0)


def _relay_stderr(fd: int, outcomes: dict[int, int], ended: threading.Event) -> None:
    """Copy mpirun's stderr to ours as it comes, keeping back (and recording) the host
    launchers' OUTCOME lines; a line that starts like one is held until its end. Until the
    pipe's end, or once ``ended`` (mpirun exited, having passed on all its processes' output)
    as soon as nothing more comes for RELAY_QUIET_S: a process mpirun left (a daemon of it
    still ending on another host) may hold the pipe open."""
    mark = OUTCOME.encode()
    held, at_start = b"", True
    while True:
        if not select.select([fd], [], [], RELAY_QUIET_S)[0]:
            if ended.is_set():
                break
            continue
        data = os.read(fd, 1 << 16)
        if not data:
            break
        out = []
        for piece in (held + data).splitlines(keepends=True):
            held = b""
            # (Open MPI ends a help message it forwards with a NUL byte, which may start our line)
            line = piece.lstrip(b"\0")
            if at_start and (line.startswith(mark) or mark.startswith(line)):
                if not piece.endswith(b"\n"):
                    held = piece                    # could be an outcome line: wait for the rest
                    continue
                index, _, code = line[len(mark):].strip().partition(b" ")
                try:
                    outcomes[int(index)] = int(code)
                    continue
                except ValueError:
                    pass                            # not one of ours: pass it on
            out.append(piece)
            at_start = piece.endswith(b"\n")
        _write_all(b"".join(out))
    _write_all(held)


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(sys.stderr.fileno(), view):]
