"""The rank template: Python and the library imported once, every rank forked from it.

    launcher --(fork: env, argv; fds: report socket, stdout, stderr)--> template --fork--> rank
             <--(pid) -----------------------------------------------
             <--(exit: pid, returncode), when a rank ends (a pidfd per rank tells the template)
    launcher closes its socket at the end of the job -> the template exits

A rank spawned with ``python -m stratacl.jobs._rankboot`` pays the interpreter's start and the
library's import (numpy, the fabric model, the runtime: about 0.25 s of CPU) on its own; N
ranks pay it N times, all at once, on a host's few cores. Forked from the template, a rank
starts with everything imported (a fork of it takes about a millisecond), and the imported
pages stay shared with the template and the other ranks until written.

The template is the launcher's child, started with the ranks' common environment (so numeric
libraries see their thread counts, and Python its start-up variables, as the ranks would) and
the job's control and HBM descriptors. It holds no thread, no runtime and no job state: it
imports the library, checks that it still has a single thread, freezes its objects out of the
garbage collector's reach (a collection would write to every object and copy the pages) and
serves requests. Were a library to start a thread at import, the template says so and the
launcher spawns the ranks instead (forking a process with threads is unsafe).

The ranks are the template's children, as a forkserver's workers are its own: the template
reaps them and reports each exit status to the launcher (``ForkedRank`` gives the supervisor
what it used of ``subprocess.Popen``). Death follows the chain: the template dies with the
launcher and a rank with the template (PR_SET_PDEATHSIG both); the launcher's signals and the
daemon's kills reach a rank by its pid as before.

A forked rank is made what a spawned one is: its own environment (``os.environ``, which also
sets the C environment), its descriptors (stdout and stderr on its pipes, the report socket, the
job's segments; every other descriptor closed), default signal dispositions, fresh random
seeds, then ``_rankboot.main``, which ties it to its parent (PR_SET_PDEATHSIG, a process group
of its own, the parent checked) and runs the target.

The launcher may name heavy modules the target will import (``preload``: torch, when the
script or module imports it at its top, or when the process calling ``stratacl.spawn`` has):
the template imports them too, after the library and before its single-thread check, so a
rank does not pay torch's import (about 1.3 s of CPU) on its own. A module that fails to
import is left to the rank, which then fails as it would have; one that starts a thread makes
the template refuse, and the launcher starts a template without it.
"""
from __future__ import annotations

import gc
import importlib
import json
import os
import pickle
import selectors
import signal
import socket
import sys
import time

MAX_FDS = 4                     # descriptors a request carries: report socket, stdout, stderr


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


# --- in the template -----------------------------------------------------------------------------
def _become_rank(req: dict, fds: list[int], keep: set[int], template: int) -> None:
    """In the forked rank: take the rank's descriptors and environment, run it; never returns."""
    try:
        report, out, err = fds
        os.dup2(out, 1)
        os.dup2(err, 2)
        env = dict(req["env"])
        boot = json.loads(env["STRATACL_BOOT"])
        boot["report"] = report
        env["STRATACL_BOOT"] = json.dumps(boot)
        keep = keep | {0, 1, 2, report}
        for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        import stratacl.jobs
        stratacl.jobs.forked_from = template
        # a fork copies the random generators' states: every rank would draw the same numbers
        if "random" in sys.modules:
            sys.modules["random"].seed()
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()
        sys.argv = [sys.argv[0], *req["argv"]]
        gc.unfreeze()
        from . import _rankboot
        _rankboot.main()            # ends with os._exit
    except BaseException:           # noqa: BLE001 - no return into the template's loop
        try:
            import traceback
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:       # noqa: BLE001
            pass
    os._exit(70)


def _serve(sock: socket.socket, keep: set[int]) -> None:
    """Fork ranks on request; report each one's end. Returns at EOF on the launcher's socket."""
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, None)
    template = os.getpid()
    while True:
        for key, _ in sel.select():
            if key.data is None:
                try:
                    msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, MAX_FDS)
                except OSError:
                    return
                if not msg:
                    return
                try:
                    req = pickle.loads(msg)
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        _become_rank(req, fds, keep, template)
                    # the rank's end, as a readable descriptor: no signal handler, no thread
                    sel.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
                    reply = ("pid", pid)
                except Exception as e:      # noqa: BLE001 - the launcher names it
                    reply = ("error", f"{type(e).__name__}: {e}")
                finally:
                    for fd in fds:
                        os.close(fd)
                sock.sendall(pickle.dumps(reply))
            else:
                pid = key.data
                sel.unregister(key.fileobj)
                os.close(key.fd)
                _pid, status = os.waitpid(pid, 0)
                sock.sendall(pickle.dumps(("exit", pid, os.waitstatus_to_exitcode(status))))


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    keep = {int(f) for f in sys.argv[2].split(",") if f}     # the job's segments
    launcher = int(sys.argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)              # the launcher handles Ctrl-C
    # what every rank needs, imported once (a submodule's import runs the package's __init__,
    # the public face, first: numpy, the runtime, the fabric model, the operators)
    from stratacl.runtime import set_pdeathsig
    from . import _rankboot, _wire      # noqa: F401
    for name in filter(None, sys.argv[4].split(",") if len(sys.argv) > 4 else []):
        try:
            importlib.import_module(name)
        except Exception:       # noqa: BLE001 - the rank imports it again and fails as it would have
            pass
    set_pdeathsig(signal.SIGKILL)
    if os.getppid() != launcher:
        os._exit(70)                    # the launcher is already gone
    if _threads() != 1:
        sock.sendall(pickle.dumps(("refused", f"{_threads()} threads after import")))
        os._exit(0)
    gc.collect()
    gc.freeze()
    sock.sendall(pickle.dumps(("ready", os.getpid())))
    try:
        _serve(sock, keep)
    except OSError:
        pass
    os._exit(0)     # ranks still running die with the template (their PR_SET_PDEATHSIG)


# --- in the launcher ----------------------------------------------------------------------------
class ForkedRank:
    """What the supervisor uses of ``subprocess.Popen``, for a rank the template forked and
    reaps: its exit status comes over the template's socket."""

    def __init__(self, pid: int, template: "Template"):
        self.pid = pid
        self.returncode: int | None = None
        self._template = template

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._template.exit_status(self.pid, block=False)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = self._template.exit_status(self.pid, block=True)
        return self.returncode


class Template:
    """The launcher's end: start the template, fork ranks, learn their ends, stop it.

    ``start`` returns False when the template refused (a thread after import) or could not
    start; the caller then spawns its ranks. ``close`` (after every rank has ended) stops and
    reaps the template."""

    POLL_EVERY = 0.005          # seconds between reads of the socket for ends, however many ranks poll
    IN_FLIGHT = 16              # requests sent before the first reply is read (Job.run)
    START_TIMEOUT = 120.0       # seconds the template may take to import the library

    def __init__(self):
        self.proc = None
        self.sock: socket.socket | None = None
        self.why = ""
        self._exits: dict[int, int] = {}
        self._gone = False           # the template ended: every rank not reported died with it
        self._read_at = 0.0

    def start(self, env: dict[str, str], job_fds: list[int], stdin, preload: list[str] = ()) -> bool:
        """Start the template (importing ``preload`` too); False if it refused or did not start.
        A template that refused with ``preload`` is started again without it."""
        if preload and self._start(env, job_fds, stdin, preload):
            return True
        return self._start(env, job_fds, stdin, [])

    def _start(self, env: dict[str, str], job_fds: list[int], stdin, preload: list[str]) -> bool:
        import subprocess
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # a process group of its own: a terminal's Ctrl-C reaches the launcher alone
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "stratacl.jobs._template", str(theirs.fileno()),
                 ",".join(map(str, job_fds)), str(os.getpid()), ",".join(preload)],
                env=env, pass_fds=(*job_fds, theirs.fileno()), process_group=0, stdin=stdin)
        finally:
            theirs.close()
        self.sock = mine            # blocking: MSG_DONTWAIT reads are the non-blocking ones
        try:
            import select
            if not select.select([mine], [], [], self.START_TIMEOUT)[0]:
                raise OSError(f"nothing in {self.START_TIMEOUT:g} s")
            msg = mine.recv(1 << 16)
            kind, what = pickle.loads(msg) if msg else ("refused", "it exited while importing")
        except (OSError, pickle.UnpicklingError) as e:
            kind, what = "refused", f"no answer ({e})"
        if kind != "ready":
            self.why = what
            self.close()
            return False
        return True

    def fork(self, env: dict[str, str], argv: list[str], fds: list[int]) -> ForkedRank:
        """Fork one rank; ``fds``: its report socket, stdout and stderr (the caller closes its copies)."""
        self.request(env, argv, fds)
        return self.forked()

    def request(self, env: dict[str, str], argv: list[str], fds: list[int]) -> None:
        """Ask for one rank without waiting: ``forked`` returns the ranks in the order asked.
        Several requests in flight let the template fork back to back rather than wait for
        the launcher between ranks, which on a loaded host is a scheduling round trip each."""
        socket.send_fds(self.sock, [pickle.dumps({"env": env, "argv": argv})], fds)

    def forked(self) -> ForkedRank:
        """The oldest requested rank, once forked."""
        while True:
            reply = self._read(block=True)
            if reply is None:
                if self._gone:
                    raise OSError("the rank template exited")
                continue
            if reply[0] == "pid":
                return ForkedRank(reply[1], self)
            if reply[0] == "error":
                raise OSError(f"the rank template could not fork a rank: {reply[1]}")

    def exit_status(self, pid: int, block: bool) -> int | None:
        """``pid``'s return code (negative: the signal), or None while it runs (``block``: wait)."""
        if not block and pid not in self._exits and not self._gone:
            now = time.monotonic()
            if now - self._read_at >= self.POLL_EVERY:
                self._read_at = now
                while self._read(block=False) is not None:
                    pass
        while block and pid not in self._exits and not self._gone:
            self._read(block=True)
        if pid in self._exits:
            return self._exits[pid]
        return -signal.SIGKILL if self._gone else None

    def _read(self, block: bool):
        """One message from the template, exits recorded; None when there is none (or at EOF)."""
        if self._gone:
            return None
        try:
            msg = self.sock.recv(1 << 16, 0 if block else socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            msg = b""
        if not msg:
            self._gone = True
            return None
        reply = pickle.loads(msg)
        if reply[0] == "exit":
            self._exits[reply[1]] = reply[2]
        return reply

    def close(self) -> None:
        """Stop the template (EOF on its socket) and reap it."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except Exception:           # noqa: BLE001
                self.proc.kill()
                self.proc.wait()
            self.proc = None


if __name__ == "__main__":
    main()
