"""``stratacl.spawn``: run a function on N ranks through the job supervisor (stratacl.jobs)."""
from __future__ import annotations

import pickle
import sys
import types
from typing import Any, Callable

from ._config import Config
from ._errors import BootstrapError, RankFailure


class RemoteTraceback(Exception):
    """Carries a rank's formatted traceback as the cause of the re-raised exception."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n" + self.tb


def _imports_of(fn) -> set[str]:
    """The top-level packages of the modules bound in ``fn``'s module (its ``import x`` lines)."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    return {v.__name__.split(".")[0] for v in vars(module).values()
            if isinstance(v, types.ModuleType)} if module is not None else set()


def spawn(fn: Callable[..., Any], nranks: int, args: tuple = (), **settings: Any) -> list[Any]:
    """Run ``fn(comm, *args)`` in ``nranks`` fresh rank processes; return their results by rank.

    ``fn`` and ``args`` must be picklable (``fn`` defined at module level). ``settings`` are
    the launcher's settings (``hbm_size=``, ``registration=``, ``timeout=``, ...). If a rank
    fails, the first failure is raised here: the rank's own exception when it can be rebuilt
    (with the rank's traceback as its cause), otherwise ``RankFailure``. Host-blocking.
    """
    from . import jobs
    from .jobs import Job, format_failure, preflight

    if jobs.importing_main:
        raise BootstrapError(
            "stratacl.spawn was called while a rank was importing the main module to find the function "
            "it runs: start the job under `if __name__ == \"__main__\":`, as with multiprocessing's spawn")
    config = Config(**settings)
    preflight(nranks, config)          # what every rank would refuse, raised once, here
    main_path = None
    if getattr(fn, "__module__", None) == "__main__":
        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        # started with -m: the rank imports the module by name; else it runs the file by path
        main_path = ("module", spec.name) if spec is not None else ("path", getattr(main, "__file__", None))
    payload = pickle.dumps((fn, tuple(args)), protocol=pickle.HIGHEST_PROTOCOL)
    outcome = Job(nranks, config, ("spawn", list(sys.path), main_path, payload), imports=_imports_of(fn)).run()
    if outcome.ok:
        return [pickle.loads(r.result) if r.result is not None else None for r in outcome.ranks]
    root = outcome.root_cause
    block = format_failure(outcome)
    if root is not None and root.error and root.error.get("exception"):
        try:
            exc = pickle.loads(root.error["exception"])
        except Exception:
            exc = None
        # SystemExit / KeyboardInterrupt in a rank end that rank; re-raised here they would end
        # the caller too, so they are reported as a RankFailure like a crash
        if isinstance(exc, Exception):
            exc.add_note(f"(raised on rank {root.rank} of {nranks}; job {outcome.job_id})")
            raise exc from RemoteTraceback(root.error["traceback"])
    raise RankFailure(block, root.rank if root is not None else None,
                      (root.error or {}).get("traceback", "") if root is not None else "")
