"""Process supervision: one job = the bootstrap daemon + N rank processes, all or nothing.

    Job.run()
      create segments (named, mode 0600, unlinked at once)  -> descriptors
      the job's store: a secret (STRATACL_JOB_SECRET) and a socket listening on loopback, handed
                     to the ranks (rank 0 serves it under torch: stratacl/torch/_store.py)
      start daemon  (pipe: EOF = launcher gone -> daemon kills ranks and sweeps /dev/shm)
      warn          when N ranks' footprint would not fit in MemAvailable (_memory)
      start ranks   (forked from the rank template, which imported the library once and
                     reports their ends (_template); spawned with python -m
                     stratacl.jobs._rankboot if it cannot be used; die with the launcher;
                     stdout and stderr are pipes of their own, forwarded line by line: _output)
      loop: read reports, reap exits, sample the ranks' memory once a second
        first failure -> recorded in the control segment (peers raise PeerFailure)
                      -> after `grace` s SIGTERM the rest, after another `grace` s SIGKILL
        every peer finished, a rank not finalized `timeout` s later
                      -> that rank is the failure: hung in (or before) finalize; SIGTERM it
      stop daemon, close everything, return a JobOutcome

Each rank leads its own process group, so a terminal's Ctrl-C reaches only the launcher, which
then shuts the job down in order; a terminal stdin is replaced by /dev/null, a pipe or file is
inherited. Ranks stay in the launcher's session: with autogroup scheduling
(/proc/sys/kernel/sched_autogroup_enabled) a session is one scheduling group, and a rank alone in
its group could not hand its core to a peer with sched_yield (runtime/services/_sync.py).
"""
from __future__ import annotations

import json
import os
import pickle
import resource
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

from stratacl._config import Config
from stratacl.runtime.hosts import CarrierThread
from stratacl.runtime.memory import create_job_segments, new_job_id
from stratacl.runtime.services import (
    FAILED_DAEMON, FAILED_EXIT, FAILED_SIGNAL, STATE_DEAD, STATE_FINALIZED, STATE_RUNNING, Control, flight,
)
from ._hostjob import HostPart

from . import _wire
from ._memory import MemoryWatch, short_memory_warning
from ._outcome import JobOutcome, RankEnd
from ._output import OutputForwarder
from ._resources import sweep

# each rank leads a process group: set before exec where Popen can (Python >= 3.11), and by
# the rank itself first thing in _rankboot otherwise (preexec_fn is unsafe with threads)
_OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {}


# thread counts of numeric libraries a rank gets as "1" unless the user set them (_rank_env)
RANK_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _free_port() -> int:
    """A TCP port on the loopback interface that no one listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# modules the rank template imports for a target that will (jobs/_template.py): heavy to
# import, and single-threaded once imported; with each, the library's own module for it, and
# for torch what its autograd imports at a rank's first backward (torch.autograd._make_grads
# imports symbolic_shapes, and with it sympy: 0.2 s of CPU in every rank that trains)
PRELOADABLE = {"torch": ["torch", "stratacl.torch", "torch.fx.experimental.symbolic_shapes"]}


def preload_for(target: tuple, imports: set[str] = frozenset()) -> list[str]:
    """The PRELOADABLE modules ``target`` imports: a script's or module's top-level imports
    (read, not run); for ``stratacl.spawn``, ``imports`` (what the function's module has)."""
    names = set(imports) if target[0] == "spawn" else _top_level_imports(target)
    return [m for top, mods in PRELOADABLE.items() if top in names for m in mods]


def _top_level_imports(target: tuple) -> set[str]:
    """The top-level packages a script's or module's top-level code imports (read, not run)."""
    path = target[1]
    if target[0] == "module":
        if "." in target[1]:
            return set()     # finding a submodule would import its package here, in the launcher
        import importlib.util
        try:
            spec = importlib.util.find_spec(target[1])
        except (ImportError, ValueError):
            return set()
        path = spec.origin if spec is not None else None
    try:
        import ast
        with open(path, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, TypeError, ValueError, SyntaxError):
        return set()        # the rank reports what is wrong with its target
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


class Job:
    """Run ``target`` on ``nprocs`` ranks. target: ('script', path, args) | ('module', name, args)
    | ('spawn', payload). ``imports``: for 'spawn', the top-level packages the function's
    module has imported (what the rank template may import beforehand: ``preload_for``)."""

    def __init__(self, nprocs: int, config: Config, target: tuple, handle_signals: bool = False,
                 extra_env: dict[str, str] | None = None, start_method: str = "fork", part: HostPart | None = None,
                 job_id: str | None = None, secret: str | None = None, imports: set[str] | None = None):
        if nprocs < 1:
            raise ValueError(f"need at least one rank, got {nprocs}")
        self.n, self.config, self.target = nprocs, config, target
        self.imports = imports or set()
        # a job over hosts (_hostjob.py): this launcher runs this host's part, its ranks only
        self.part = part
        self.ranks = part.ranks if part is not None else list(range(nprocs))
        self.handle_signals = handle_signals
        self.extra_env = extra_env or {}
        if start_method not in ("fork", "spawn"):
            raise ValueError(f"start_method is 'fork' (from the rank template) or 'spawn', not {start_method!r}")
        self.start_method = start_method
        self.job_id = job_id or new_job_id()
        if part is not None:
            self.job_id += f"h{part.index}"         # each host's names and plans its own
        self._signal = 0
        self._master_port = _free_port()
        # the job's store (stratacl/torch/_store.py): only a process that holds the secret gets in
        self._secret = secret or secrets.token_hex(32)
        self._store_address = "127.0.0.1"
        self._carrier = None
        self._store: socket.socket | None = None
        self._interactive = os.isatty(1)

    # --- start ------------------------------------------------------------------------------
    def _common_env(self) -> dict[str, str]:
        """The environment every rank shares (the template's too): all but the rank's own words."""
        env = dict(os.environ)
        # numpy's BLAS and OpenMP start a thread per core in every rank, and those threads spin
        # after each use: with many ranks per core that is CPU the ranks need. One thread each
        # unless the user asked otherwise (torchrun does the same for OMP_NUM_THREADS).
        for threads in RANK_THREAD_VARS:
            env.setdefault(threads, "1")
        env.update(self.config.as_env())
        env.update(self.extra_env)
        env.update({
            "STRATACL_JOB_ID": self.job_id, "STRATACL_WORLD_SIZE": str(self.n),
            "STRATACL_LAUNCHER_PID": str(os.getpid()), "WORLD_SIZE": str(self.n),
            "LOCAL_WORLD_SIZE": str(len(self.ranks)),
            # what torch.distributed's env:// rendezvous reads, as torchrun sets it: rank 0 serves
            # the TCPStore on this port (a port free when the job started)
            "MASTER_ADDR": self._store_address, "MASTER_PORT": str(self._master_port),
            "STRATACL_JOB_SECRET": self._secret,
            "STRATACL_STORE": "%s:%d" % (self._store_address, self._store_port),
        })
        if self.config.tag_output or self._interactive:
            # a rank's stdout is a pipe, which Python buffers in blocks: unbuffered, each line
            # reaches a terminal (or the tagged stream) when printed, as a terminal's line
            # buffering would give. The forwarder puts the pieces back into whole lines.
            env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _rank_env(self, common: dict[str, str], rank: int, boot: dict) -> dict[str, str]:
        env = dict(common)
        env.update({"STRATACL_RANK": str(rank), "STRATACL_BOOT": json.dumps(boot), "RANK": str(rank),
                    "LOCAL_RANK": str(self.ranks.index(rank))})
        return env

    def _target_argv(self) -> list[str]:
        """What _rankboot reads from its sys.argv[1:]: the target's kind, then (script or
        module) the rank's argv, [path or module, *args]."""
        kind = self.target[0]
        return [kind] if kind == "spawn" else [kind, *self.target[2]]

    def _argv(self) -> list[str]:
        # -P: the working directory stays off sys.path, so a source checkout there (with no built
        # extensions) cannot shadow the installed library; _rankboot adds what the target needs
        return [sys.executable, "-P", "-m", "stratacl.jobs._rankboot", *self._target_argv()]

    def run(self) -> JobOutcome:
        _raise_descriptor_limit(self.n)
        part = self.part
        # over hosts, the HBM segment of a rank of another host is this host's mirror of it
        ctl_fd, hbm_fds = create_job_segments(self.job_id, self.n, self.config)
        ctl = Control(ctl_fd, self.n)
        job_fds = [ctl_fd, *hbm_fds]
        # loopback only (over hosts: rank 0's host, on the interface the host list names),
        # listening before any rank starts: a rank's connect never races rank 0
        if part is None or part.index == 0:
            self._store_address = "127.0.0.1" if part is None else part.address
            self._store = socket.create_server((self._store_address, 0), backlog=max(128, self.n))
            self._store_port = self._store.getsockname()[1]
        if part is not None:
            self._store_address, self._store_port, self._master_port = part.comm.bcast(
                (self._store_address, getattr(self, "_store_port", 0), self._master_port), root=0)
        store_fd = self._store.fileno() if self._store is not None else -1
        pipe_r, pipe_w = os.pipe()
        procs: list[subprocess.Popen] = []
        socks: list[socket.socket] = []
        daemon = None
        template = None
        output = OutputForwarder(sys.stdout, sys.stderr, tag=self.config.tag_output)
        old_handlers = {}
        try:
            if self.handle_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    old_handlers[sig] = signal.signal(sig, self._on_signal)
            daemon = subprocess.Popen(
                [sys.executable, "-P", "-m", "stratacl.jobs._daemon", self.job_id, str(self.n), str(ctl_fd),
                 str(pipe_r), *([",".join(map(str, self.ranks))] if part is not None else [])],
                pass_fds=(ctl_fd, pipe_r), start_new_session=True, stdin=subprocess.DEVNULL)
            os.close(pipe_r)
            pipe_r = -1
            warning = short_memory_warning(self.n)
            if warning:
                print(warning, file=sys.stderr, flush=True)
            watch = MemoryWatch()
            output.start()
            # a rank outside the foreground group that read the terminal would be stopped (SIGTTIN)
            stdin = subprocess.DEVNULL if os.isatty(0) else None
            common = self._common_env()
            # imported here, not with the package: the template runs as python -m stratacl.jobs._template
            from ._template import Template
            template = Template() if self.start_method == "fork" else None
            if template is not None and not template.start(common, [*job_fds, *([store_fd] if store_fd >= 0 else [])],
                                                           stdin, preload_for(self.target, self.imports)):
                print(f"stratacl-launch: ranks are spawned, not forked from a template: {template.why}",
                      file=sys.stderr, flush=True)
                template = None
            asked: list[tuple] = []     # ranks requested from the template, not yet forked: their descriptors

            def take_forked() -> None:
                rank, mine, closing = asked.pop(0)
                try:
                    p = template.forked()
                finally:
                    for fd in closing:
                        os.close(fd)
                procs.append(p)
                ctl.set_pid(rank, p.pid)
                watch.note(rank, p.pid)

            for rank in self.ranks:
                mine, theirs = socket.socketpair()
                boot = {"ctl": ctl_fd, "hbm": hbm_fds, "report": theirs.fileno(), "store": store_fd}
                if part is not None:
                    boot["hosts"] = part.host_of
                # pipes of the rank's own: in one shared pipe, lines written in pieces interleave
                out_r, out_w = os.pipe()
                err_r, err_w = os.pipe()
                output.add(rank, out_r, err_r)
                socks.append(mine)
                closing = (theirs.detach(), out_w, err_w)
                env = self._rank_env(common, rank, boot)
                if template is not None:
                    try:
                        template.request(env, self._target_argv(), list(closing))
                    except BaseException:
                        for fd in closing:
                            os.close(fd)
                        raise
                    asked.append((rank, mine, closing))
                    if len(asked) >= Template.IN_FLIGHT:
                        take_forked()
                    continue
                try:
                    p = subprocess.Popen(self._argv(), env=env,
                                         pass_fds=(*job_fds, *([store_fd] if store_fd >= 0 else []), closing[0]),
                                         **_OWN_GROUP, stdin=stdin, stdout=out_w, stderr=err_w)
                finally:
                    for fd in closing:
                        os.close(fd)
                procs.append(p)
                ctl.set_pid(rank, p.pid)
                watch.note(rank, p.pid)
            try:
                while asked:
                    take_forked()
            except BaseException:
                # ranks asked for but never named: their descriptors here (the template's
                # close ends them, as it does every rank it forked)
                for _rank, _mine, closing in asked:
                    for fd in closing:
                        os.close(fd)
                raise
            if part is not None:
                self._carrier = CarrierThread(part.comm, part.host_of, ctl, hbm_fds, self.config)
            if self.target[0] == "spawn":
                threading.Thread(target=_send_payload, args=(socks, self.target[1:]), daemon=True).start()
            # the launcher keeps the HBM descriptors until the end: their size on disk is what
            # the job's HBM holds (MemoryWatch)
            return self._supervise(ctl, procs, socks, daemon, watch, hbm_fds)
        finally:
            for p in procs:
                if p.poll() is None:
                    _kill(p, signal.SIGKILL)
                    p.wait()
            if template is not None:
                template.close()
            if self._carrier is not None:
                self._carrier.stop()
            # the ranks are gone, but their last lines may still sit in the pipes: forward them
            # before returning (a process the rank left behind may hold a pipe open, so bounded)
            output.finish(timeout=10)
            for s in socks:
                s.close()
            os.close(pipe_w)
            if pipe_r >= 0:
                os.close(pipe_r)
            if daemon is not None:
                try:
                    daemon.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
            for fd in hbm_fds:
                os.close(fd)
            if self._store is not None:
                self._store.close()
            ctl.close()
            os.close(ctl_fd)
            sweep(self.job_id)
            for sig, h in old_handlers.items():
                signal.signal(sig, h)

    def _on_signal(self, signum, frame) -> None:
        self._signal = signum

    # --- supervise --------------------------------------------------------------------------
    def _supervise(self, ctl: Control, procs: list[subprocess.Popen], socks: list[socket.socket],
                   daemon: subprocess.Popen, watch: MemoryWatch, hbm_fds: list[int]) -> JobOutcome:
        ends = [RankEnd(r, p.pid) for r, p in zip(self.ranks, procs)]
        outcome = JobOutcome(self.job_id, ends)
        if self.part is not None:
            k = max(self.part.host_of) + 1
            outcome.part = (f"host {self.part.index} of {k}: ranks {self.ranks[0]}..{self.ranks[-1]} of {self.n} "
                            f"(each host's launcher reports its own ranks)")
        sel = selectors.DefaultSelector()
        readers = {}
        for r, s in enumerate(socks):
            sel.register(s, selectors.EVENT_READ, r)
            readers[r] = _wire.FrameReader()
        grace = self.config.grace
        started = time.monotonic()
        failed_at = term_at = None
        killed = False
        while True:
            for key, _ in sel.select(timeout=0.02):
                r = key.data
                try:
                    data = key.fileobj.recv(1 << 20, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                for frame in readers[r].feed(data):
                    kind, body = pickle.loads(frame)
                    if kind == "error":
                        ends[r].error = body
                    elif kind == "result":
                        ends[r].result = body
            now = time.monotonic()
            for i, p in enumerate(procs):
                if ends[i].returncode is None and p.poll() is not None:
                    e, r = ends[i], ends[i].rank
                    e.returncode, e.ended_at = p.returncode, now
                    # exit code 0 after init() but without finalize() (os._exit(0), a thread
                    # calling exit in the middle of the job): its peers would wait for it in vain
                    e.unfinalized = p.returncode == 0 and ctl.state(r) == STATE_RUNNING
                    if p.returncode != 0 or e.unfinalized:
                        ctl.set_state(r, STATE_DEAD)
                        if term_at is None:
                            kind = FAILED_SIGNAL if p.returncode < 0 else FAILED_EXIT
                            ctl.record_failure(r, kind, abs(p.returncode))
                            if failed_at is None:
                                failed_at, outcome.reason = now, outcome.reason or "failure"
                    elif ctl.state(r) != STATE_FINALIZED:
                        # it never joined (no init()): nothing waits on it
                        ctl.set_state(r, STATE_FINALIZED)
            if failed_at is None and term_at is None:
                alone = self._hung_after_peers(ctl, ends, now)
                if alone is not None:
                    # nothing waits on it, so no peer's timeout can name it: the launcher does
                    failed_at, outcome.reason = now, outcome.reason or "failure"
                    term_at = outcome.shutdown_at = now
                    self._terminate(procs, ends, signal.SIGTERM)
            if watch.due(now) or failed_at == now:
                # also at the first failure: what the job held when a rank died (its HBM stays)
                watch.sample({e.rank: p.pid for e, p in zip(ends, procs) if e.returncode is None},
                             [hbm_fds[r] for r in self.ranks])
            if all(e.returncode is not None for e in ends):
                # drain what the last ranks wrote before they exited
                for key in list(sel.get_map().values()):
                    _drain_blocking(key.fileobj, readers[key.data], ends[key.data])
                break
            if self._signal and term_at is None:
                outcome.reason, outcome.signal = "signal", self._signal
                ctl.record_shutdown(self._signal)
                term_at = outcome.shutdown_at = now
                self._terminate(procs, ends, signal.SIGTERM)
            if failed_at is None and term_at is None and daemon.poll() is not None:
                # the ranks learn it at their next wait and raise; those that do not wait are
                # ended after the grace period, as after a rank's failure
                outcome.reason, outcome.signal = "daemon", daemon.returncode
                ctl.record_shutdown(daemon.returncode, FAILED_DAEMON)
                failed_at = outcome.shutdown_at = now
            if failed_at is None and term_at is None and self._carrier is not None and self._carrier.error:
                # no call across hosts can complete; the carrier recorded it (its ranks raise)
                outcome.reason, outcome.carrier = "carrier", self._carrier.error
                failed_at = outcome.shutdown_at = now
            deadline = self.config.deadline
            if deadline and term_at is None and now - started > deadline:
                outcome.reason = "deadline"
                ctl.record_shutdown(signal.SIGALRM)
                term_at = outcome.shutdown_at = now
                self._terminate(procs, ends, signal.SIGTERM)
            if failed_at is not None and term_at is None and now - failed_at > grace:
                term_at = outcome.shutdown_at = now
                self._terminate(procs, ends, signal.SIGTERM)
            if term_at is not None and not killed and now - term_at > grace:
                killed = True
                self._terminate(procs, ends, signal.SIGKILL)
        sel.close()
        outcome.memory = watch.report()
        if not outcome.ok:
            outcome.flight = {r: flight.read(ctl, r) for r in self.ranks}
            outcome.flight_read_at = time.monotonic()
        return outcome

    def _hung_after_peers(self, ctl: Control, ends: list[RankEnd], now: float) -> RankEnd | None:
        """The one rank still running, not finalized, the communication timeout after its last
        peer finished normally, if there is one (marked hung, with its newest call). A rank alone
        in the job waits on no one, so no peer's timeout or liveness check can name it: it hangs
        in finalize or before it (after its last call), or computes that long alone; the
        timeout is the bound any peer would have given it. A rank that did finalize is left to
        its work."""
        running = [e for e in ends if e.returncode is None]
        if len(running) != 1 or len(ends) < 2 or any(e.failed for e in ends if e.returncode is not None):
            return None
        r = running[0]
        last_peer = max(e.ended_at for e in ends if e is not r)
        if ctl.state(r.rank) == STATE_FINALIZED or now - last_peer <= self.config.timeout:
            return None
        recs = flight.read(ctl, r.rank)
        newest = recs[-1].call_name() if recs else "no call recorded"
        r.hung_at = now
        r.hung = (f"still running, not finalized, {now - last_peer:.1f} s after its last peer finished (the "
                  f"communication timeout is {self.config.timeout:g} s): hung in finalize or before it; its newest "
                  f"call: {newest}")
        return r

    @staticmethod
    def _terminate(procs, ends, sig) -> None:
        for p, e in zip(procs, ends):
            if p.poll() is None:
                e.killed_by_launcher = True
                _kill(p, sig)
                if sig == signal.SIGTERM:
                    # a stopped rank (SIGSTOP, a debugger's stop) takes its SIGTERM only once continued
                    _kill(p, signal.SIGCONT)


def _raise_descriptor_limit(nranks: int) -> None:
    """Make room for the launcher's 4 descriptors a rank (its HBM segment, its report socket,
    its two output pipes): a common soft limit of 1024 would stop a job at about 250 ranks.
    The soft limit is raised toward the hard one, never lowered."""
    need = 4 * nranks + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    new = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if new > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


def _kill(p: subprocess.Popen, sig: int) -> None:
    try:
        os.kill(p.pid, sig)
    except ProcessLookupError:
        pass


def _drain_blocking(sock: socket.socket, reader: _wire.FrameReader, end: RankEnd) -> None:
    sock.setblocking(True)
    sock.settimeout(5.0)
    try:
        while True:
            data = sock.recv(1 << 20)
            if not data:
                break
            for frame in reader.feed(data):
                kind, body = pickle.loads(frame)
                if kind == "error":
                    end.error = body
                elif kind == "result":
                    end.result = body
    except OSError:
        pass


def _send_payload(socks: list[socket.socket], payload: tuple) -> None:
    for s in socks:
        try:
            _wire.send(s, payload)
        except OSError:
            pass
