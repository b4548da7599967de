"""The rank template: Python and the library imported once, every rank forked from it.

    launcher --(request: env, argv; fds: report socket, stdout, stderr)--> template
    template: fork -> intermediate: fork -> rank        intermediate exits at once, so the rank
              <-- rank's pid -- intermediate            is reparented to the launcher (a child
              waitpid(intermediate), then "go" --> rank  subreaper while it starts ranks)
    launcher <--(rank's pid)-- template

A rank spawned with ``python -m stratacl.jobs._rankboot`` pays the interpreter's start and the
library's import (numpy, the fabric model, the runtime: about 0.25 s of CPU) on its own; N
ranks pay it N times, all at once, on a host's few cores. Forked from the template, a rank
starts with everything imported, and the imported pages are shared with the template and the
other ranks until written.

The template is the launcher's child, started with the ranks' common environment (so
numeric libraries see their thread counts, and Python its start-up variables, as the ranks
would), and the job's control and HBM descriptors. It holds no thread, no runtime and no job
state: it imports the library, checks that it still has a single thread, freezes its objects
out of the garbage collector's reach (a collection would write to every object and copy the
pages) and waits for requests. Were a library to start a thread at import, the template says
so and the launcher spawns the ranks instead (forking a process with threads is unsafe).

A forked rank is made what a spawned one is: its own environment (``os.environ``, which also
sets the C environment), its descriptors (stdout and stderr on its pipes, the report socket, the
job's segments; every other descriptor closed), default signal dispositions, fresh random
seeds, then ``_rankboot.main``, which ties it to the launcher (PR_SET_PDEATHSIG, a process
group of its own, its parent checked) and runs the target. The rank waits for "go" until its
intermediate parent has been reaped, that is until it is the launcher's child, so its
PR_SET_PDEATHSIG names the launcher.
"""
from __future__ import annotations

import gc
import json
import os
import pickle
import signal
import socket
import struct
import sys
import threading

# set in a rank forked from the template: the template's pid (a test reads it)
forked_from = 0

_PID = struct.Struct("q")
MAX_FDS = 4                     # descriptors a request carries: report socket, stdout, stderr


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _become_rank(req: dict, fds: list[int], keep: set[int], template: int) -> None:
    """In the forked rank: take the rank's descriptors and environment, run it; never returns."""
    global forked_from
    code = 70
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
        forked_from = template
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
    os._exit(code)


def _fork_rank(req: dict, fds: list[int], keep: set[int]) -> int:
    """Fork the rank through an intermediate that exits at once; returns the rank's pid."""
    go_r, go_w = os.pipe()
    pid_r, pid_w = os.pipe()
    template = os.getpid()
    mid = os.fork()
    if mid == 0:
        try:
            os.close(pid_r)
            pid = os.fork()
            if pid == 0:
                os.close(pid_w)
                os.close(go_w)
                os.read(go_r, 1)         # until the intermediate is reaped (or the template is gone)
                os.close(go_r)
                _become_rank(req, fds, keep, template)
            os.write(pid_w, _PID.pack(pid))
        finally:
            os._exit(0)
    os.close(pid_w)
    os.close(go_r)
    try:
        data = os.read(pid_r, _PID.size)
        os.waitpid(mid, 0)
        if len(data) != _PID.size:
            raise OSError("the template's intermediate process ended before forking the rank")
        os.write(go_w, b"g")
        return _PID.unpack(data)[0]
    finally:
        os.close(pid_r)
        os.close(go_w)


# --- in the launcher ----------------------------------------------------------------------------
_PR_SET_CHILD_SUBREAPER = 36
_subreaper_lock = threading.Lock()
_subreaper_users = 0            # jobs of this process forking ranks now (spawn() may run two at once)


def _prctl_subreaper(on: bool) -> None:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _subreaper(on: bool) -> None:
    """Be a child subreaper while any job of this process forks ranks: the flag is the
    process's, so one job's end must not clear it under another that is still forking."""
    global _subreaper_users
    with _subreaper_lock:
        if on:
            if _subreaper_users == 0:
                _prctl_subreaper(True)
            _subreaper_users += 1
        else:
            _subreaper_users -= 1
            if _subreaper_users == 0:
                _prctl_subreaper(False)


class ForkedRank:
    """What the supervisor uses of ``subprocess.Popen``, for a rank the template forked: the
    rank is the launcher's child (reparented), so it is reaped with ``waitpid`` as usual."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 0      # reaped by someone else: what Popen.poll says then
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            try:
                _pid, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                self.returncode = 0
        return self.returncode


class Template:
    """The launcher's end: start the template, ask it for ranks, stop it.

    ``start`` returns False when the template refused (a thread after import) or could not
    start; the caller then spawns its ranks. While ranks are being forked the launcher is a
    child subreaper (PR_SET_CHILD_SUBREAPER), so each rank becomes its child when the
    template's intermediate process exits; ``close`` clears it, so nothing orphaned later
    comes to the launcher."""

    def __init__(self):
        self.proc = None
        self.sock: socket.socket | None = None
        self.why = ""
        self._subreaper = False

    def start(self, env: dict[str, str], job_fds: list[int], stdin) -> bool:
        import subprocess
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "stratacl.jobs._template", str(theirs.fileno()),
                 ",".join(map(str, job_fds))],
                env=env, pass_fds=(*job_fds, theirs.fileno()), process_group=0, stdin=stdin)
        finally:
            theirs.close()
        self.sock = mine
        mine.settimeout(120.0)
        try:
            msg = mine.recv(1 << 16)
            kind, what = pickle.loads(msg) if msg else ("refused", "it exited while importing")
        except (OSError, pickle.UnpicklingError) as e:
            kind, what = "refused", f"no answer ({e})"
        if kind != "ready":
            self.why = what
            self.close()
            return False
        _subreaper(True)
        self._subreaper = True
        return True

    def fork(self, env: dict[str, str], argv: list[str], fds: list[int]) -> ForkedRank:
        """Fork one rank; ``fds``: its report socket, stdout and stderr (the caller closes its copies)."""
        socket.send_fds(self.sock, [pickle.dumps({"env": env, "argv": argv})], fds)
        msg = self.sock.recv(1 << 16)
        if not msg:
            raise OSError("the rank template exited")
        kind, what = pickle.loads(msg)
        if kind != "pid":
            raise OSError(f"the rank template could not fork a rank: {what}")
        try:
            pid, status = os.waitpid(what, os.WNOHANG)
        except ChildProcessError:
            raise OSError(f"rank process {what} forked by the template did not become the launcher's child; "
                          f"it cannot be supervised") from None
        rank = ForkedRank(what)
        if pid:
            rank.returncode = os.waitstatus_to_exitcode(status)
        return rank

    def close(self) -> None:
        """Stop the template (EOF on its socket) and reap it; no longer a subreaper."""
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
        if self._subreaper:
            self._subreaper = False
            _subreaper(False)


# --- the template process ----------------------------------------------------------------------
def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    keep = {int(f) for f in sys.argv[2].split(",") if f}     # the job's segments
    signal.signal(signal.SIGINT, signal.SIG_IGN)              # the launcher handles Ctrl-C
    import stratacl                     # noqa: F401 - what every rank needs, imported once
    from stratacl.runtime import _native, _world   # noqa: F401
    from . import _rankboot, _wire      # noqa: F401
    _native.set_pdeathsig(signal.SIGKILL)
    if _threads() != 1:
        sock.send(pickle.dumps(("refused", f"{_threads()} threads after import")))
        os._exit(0)
    gc.collect()
    gc.freeze()
    sock.send(pickle.dumps(("ready", os.getpid())))
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, MAX_FDS)
        except OSError:
            break
        if not msg:
            break
        try:
            req = pickle.loads(msg)
            sys.stdout.flush()
            sys.stderr.flush()
            reply = ("pid", _fork_rank(req, fds, keep))
        except Exception as e:          # noqa: BLE001 - the launcher names it
            reply = ("error", f"{type(e).__name__}: {e}")
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(pickle.dumps(reply))
    os._exit(0)


if __name__ == "__main__":
    main()
