"""Entry point of every rank process: ties the rank to its launcher, then runs the user's code.

    python -P -m stratacl.jobs._rankboot script PATH ARGS...
    python -P -m stratacl.jobs._rankboot module NAME ARGS...
    python -P -m stratacl.jobs._rankboot spawn       (function and arguments come over the socket)

``-P`` keeps the launcher's working directory off ``sys.path`` while the library loads; the
target then gets the path Python itself would give it (the script's folder, or the working
directory for a module).

The rank dies with its parent (PR_SET_PDEATHSIG): the launcher, or the rank template
(_template) that forked it and dies with the launcher. It reports its traceback or its result over
its socket, and exits 1 on an exception.
"""
from __future__ import annotations

import atexit
import faulthandler
import json
import os
import pickle
import runpy
import signal
import socket
import sys
import time
import traceback
import types


def _bind_to_launcher() -> None:
    import stratacl.jobs as jobs
    from stratacl.runtime import set_pdeathsig
    set_pdeathsig(signal.SIGKILL)
    try:
        os.setpgid(0, 0)     # a group of its own (done by the launcher on Python >= 3.11; see _supervisor)
    except OSError:
        pass
    # the parent is the launcher, or the rank template that forked this rank (which dies with it)
    parent = jobs.forked_from or int(os.environ.get("STRATACL_LAUNCHER_PID", "0"))
    if os.getppid() != parent:
        os._exit(70)  # the launcher (or the template) is already gone


def _report_error(sock: socket.socket, exc: BaseException) -> None:
    from stratacl.jobs import _wire
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickled = pickle.dumps(exc)
        pickle.loads(pickled)
    except Exception:
        pickled = None
    rank = int(os.environ.get("STRATACL_RANK", "-1"))
    # the ranks this error says failed first (the launcher's root cause is one of them if they
    # failed too): a peer that died, timed out, or rejected its arguments
    blames = list(getattr(exc, "rejected", ()) or getattr(exc, "missing", ()))
    peer = getattr(exc, "peer", None)
    if not blames and isinstance(peer, int):
        blames = [peer]
    try:
        _wire.send(sock, ("error", {"rank": rank, "type": type(exc).__name__, "message": str(exc),
                                    "traceback": tb, "exception": pickled, "time": time.monotonic(),
                                    "blames": blames}))
    except OSError:
        pass


def _mark_dead() -> None:
    from stratacl.runtime import is_initialized, runtime
    from stratacl.runtime.services import STATE_DEAD
    if is_initialized():
        rt = runtime()
        rt.ctl.set_state(rt.rank, STATE_DEAD)


def _load_main(main: tuple[str, str]) -> None:
    """Make a spawning script's functions importable here, as multiprocessing does: its
    ``__main__`` is imported again (by module name, or run by path) under another name."""
    import stratacl.jobs as jobs
    kind, where = main
    jobs.importing_main = True       # a spawn() at the script's top level must not start a job here
    try:
        if kind == "module":
            import importlib
            mod = importlib.import_module(where)
        else:
            mod = types.ModuleType("__mp_main__")
            mod.__file__ = where
            sys.modules["__mp_main__"] = mod
            mod.__dict__.update(runpy.run_path(where, run_name="__mp_main__"))
    finally:
        jobs.importing_main = False
    sys.modules["__main__"] = mod


def main() -> None:
    _bind_to_launcher()
    faulthandler.enable()
    boot = json.loads(os.environ["STRATACL_BOOT"])
    sock = socket.socket(fileno=boot["report"])
    from stratacl.jobs import _wire
    kind, rest = sys.argv[1], sys.argv[2:]
    code = 0
    try:
        if kind == "spawn":
            sys_path, main_path, payload = _wire.recv(sock)
            sys.path[:] = sys_path
            if main_path and main_path[1]:
                _load_main(main_path)
            fn, args = pickle.loads(payload)
            from stratacl.runtime import init
            comm = init()
            result = fn(comm, *args)
            _wire.send(sock, ("result", pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)))
        elif kind == "script":
            sys.argv = rest
            sys.path.insert(0, os.path.dirname(os.path.abspath(rest[0])))
            runpy.run_path(rest[0], run_name="__main__")
        elif kind == "module":
            sys.argv = rest
            sys.path.insert(0, os.getcwd())
            runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
        else:
            raise SystemExit(f"stratacl rank boot: unknown target kind {kind!r}")
    except SystemExit as e:
        if e.code not in (None, 0):
            code = e.code if isinstance(e.code, int) else 1
            if not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
            _report_error(sock, e)
            _mark_dead()
    except BaseException as e:  # noqa: BLE001 - every failure must reach the launcher
        traceback.print_exc()
        _report_error(sock, e)
        _mark_dead()
        code = 1
    finally:
        if code == 0:
            # the program's exit hooks, as its interpreter would run them (os._exit below does
            # not): last registered first, finalize() among them when init() registered it
            atexit._run_exitfuncs()
            from stratacl.runtime import finalize
            finalize()
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
