"""PyTorch's generic distributed tests (``DistributedTest._DistTestBase``) on backend "stratacl".

    stratacl-launch -n 3 --timeout 30 tests/scripts/torch_suite.py [PATTERN ...] [--exclude PATTERN ...]

torch ships these tests as methods of a mixin that its own harness runs one per fresh set of
processes it forks itself (MultiProcessTestCase). A StrataCL rank has to be started by the
launcher, so here every rank of one job runs the selected methods one after the other on one
object that provides what the methods use (``rank``, ``world_size``, ``_barrier`` over a
shared directory), with ``init_process_group("stratacl")`` done once.

Which methods apply is decided by decorators when torch's module is imported, from the
``BACKEND`` environment variable. This script imports it with ``BACKEND=gloo``, so the tests
torch runs for its CPU backend are the ones selected (and the few runtime branches on
``BACKEND`` take gloo's CPU path); the process group the methods talk to is "stratacl" all the
same. Two more sets, which torch's decorators keep from gloo for reasons that are gloo's or
its CI's, not the operation's (docs/torch.md, "PyTorch's own tests"):

- ``all_to_all*``, which torch runs on CPU for MPI only: taken from a second import of the
  module with ``BACKEND=mpi`` (flavour ``mpi``);
- methods under ``skip_if_small_worldsize`` (world size under 8 unless the backend is MPI):
  run with ``BACKEND=mpi`` in the environment while they run (flavour ``gloo/mpi-env``).

The two tests that compare the backend's name with ``BACKEND`` run with the module's
``BACKEND`` set to "stratacl" (``NAME_TESTS``).

Each rank reports one ``@@ {"kind": "test", ...}`` line per method: outcome ``pass``,
``skip`` (with torch's reason: a decorator, ``SkipTest`` or a skip exit code), ``fail``
(an assertion) or ``error`` (any other exception), and a ``done`` line at the end. Ranks meet
through the job's TCPStore after every method (not through the backend, so a method that
failed on one rank does not leave the next one out of step) and the script exits 0 whatever
the outcomes: tests/test_torch_suite.py judges them. ``--list`` prints the selected names.
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import sys
import time
import traceback
import unittest
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import emit  # noqa: E402

# tests that check dist.get_backend() / dist.Backend against BACKEND: they get the real name
NAME_TESTS = {"test_get_backend", "test_Backend_enum_class"}
STORE_WAIT = timedelta(seconds=120)


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("patterns", nargs="*", default=["test_*"], help="fnmatch patterns of method names")
    p.add_argument("--exclude", action="append", default=[], help="fnmatch pattern of names not to run")
    p.add_argument("--list", action="store_true", help="print the selected names (rank 0) and exit")
    p.add_argument("--temp-dir", help="directory shared by the ranks (default: /tmp/stratacl-torch-suite-PORT)")
    return p.parse_args()


def main() -> int:
    args = arguments()
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    temp = args.temp_dir or f"/tmp/stratacl-torch-suite-{os.environ['MASTER_PORT']}"
    # what torch's harness sets before a test process imports the module
    os.environ.update(BACKEND="gloo", TEMP_DIR=temp, INIT_METHOD="env://", TORCH_SHOW_CPP_STACKTRACES="1")
    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")    # keep the report lines short
    import torch
    import torch.distributed as dist
    from torch.testing._internal import common_distributed, common_utils
    from torch.testing._internal.distributed import distributed_test as gloo

    import stratacl.torch  # noqa: F401  (registers "stratacl")

    mpi = _import_as(gloo, "mpi")
    os.environ["BACKEND"] = "gloo"
    modules = {"gloo": gloo, "mpi": mpi}
    for module in modules.values():
        module.Barrier.sync = classmethod(_file_barrier(module, dist))
    names = sorted(m for m in dir(gloo.DistributedTest._DistTestBase) if m.startswith("test_")
                   and any(fnmatch.fnmatchcase(m, p) for p in args.patterns)
                   and not any(fnmatch.fnmatchcase(m, p) for p in args.exclude))
    plan = {name: _flavour(gloo, mpi, name) for name in names}
    if args.list:
        if rank == 0:
            print("\n".join(f"{name} {plan[name][0]}" for name in names))
        return 0

    for sub in ("barrier", "test_dir"):
        os.makedirs(os.path.join(temp, sub), exist_ok=True)
    cases = {}
    for flavour, module in modules.items():
        class Case(common_utils.TestCase, module.DistributedTest._DistTestBase):
            """What the methods expect of torch's harness object (TestDistBackend)."""
            init_method = "env://"
            file_name = None

            @property
            def world_size(self):          # a string, as torch's harness has it
                return os.environ["WORLD_SIZE"]
        cases[flavour] = Case

    skip_codes = {s.exit_code: s.message for s in common_distributed.TEST_SKIPS.values()}
    dist.init_process_group("stratacl")
    store = dist.distributed_c10d._get_default_store()   # kept: rank 0 serves it for the job
    env0 = dict(os.environ)

    def meet(tag: str) -> None:
        store.set(f"suite/{tag}/{rank}", "1")
        store.wait([f"suite/{tag}/{r}" for r in range(n)], STORE_WAIT)

    meet("start")
    counts: dict[str, int] = {}
    for k, name in enumerate(names):
        flavour, fn = plan[name]
        dt = modules[flavour.split("/")[0]]
        t0 = time.monotonic()
        if getattr(fn, "__unittest_skip__", False):
            outcome, why = "skip", fn.__unittest_skip_why__
        else:
            case = cases[flavour.split("/")[0]](name)
            case.rank = rank
            dt.BACKEND = "stratacl" if name in NAME_TESTS else flavour.split("/")[0]
            os.environ["BACKEND"] = "mpi" if flavour != "gloo" else "gloo"
            common_utils.set_rng_seed()
            try:
                getattr(case, name)()
                outcome, why = "pass", ""
            except unittest.SkipTest as e:
                outcome, why = "skip", str(e)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else -1
                outcome, why = ("skip", skip_codes[code]) if code in skip_codes else ("error", f"exit {e.code}")
            except AssertionError as e:
                outcome, why = "fail", _short(e)
            except Exception as e:
                outcome, why = "error", _short(e)
            finally:
                dt.BACKEND = flavour.split("/")[0]
        emit(kind="test", name=name, flavour=flavour, outcome=outcome, why=why[-1500:], secs=round(time.monotonic() - t0, 3))
        counts[outcome] = counts.get(outcome, 0) + 1
        _reset(env0, dist, torch)
        meet(f"{k}/end")
        # a method that failed on some rank may have left torch's file barrier counting apart
        if rank == 0:
            for f in os.listdir(os.path.join(temp, "barrier")):
                os.unlink(os.path.join(temp, "barrier", f))
        for module in modules.values():
            module.Barrier.barrier_id = 0
        if not dist.is_initialized():     # the method destroyed the default group
            dist.init_process_group("stratacl", store=dist.PrefixStore(f"suite/reinit/{k}", store),
                                    rank=rank, world_size=n)
        meet(f"{k}/next")
    emit(kind="done", counts=counts)
    meet("finish")
    if rank == 0:
        shutil.rmtree(temp, ignore_errors=True)
    dist.destroy_process_group()
    return 0


def _file_barrier(module, dist):
    """torch's ``Barrier.sync`` (the methods' ``_barrier``, distributed_test.py), the same file
    barrier polled every 5 ms instead of every 100 ms: the suite's methods meet in it 87 times,
    and a rank that arrived last left the others sleeping up to 0.1 s each time (5-7 s of the
    job a rank). Not the backend under test: a directory of files, one per process."""
    def sync(cls, wait_for=None, timeout=10):
        if wait_for is None:
            wait_for = dist.get_world_size()
        cls.barrier_id += 1
        barrier_dir = os.path.join(os.environ["TEMP_DIR"], "barrier")
        with module._lock():
            with open(os.path.join(barrier_dir, str(os.getpid())), "w") as f:
                f.write(str(cls.barrier_id))
        start_time = time.time()
        while True:
            arrived = 0
            with module._lock():
                for f_name in os.listdir(barrier_dir):
                    with open(os.path.join(barrier_dir, f_name)) as f:
                        if int(f.read()) >= cls.barrier_id:
                            arrived += 1
            if arrived == wait_for:
                break
            if time.time() - start_time > timeout:
                raise RuntimeError("barrier timeout")
            time.sleep(0.005)
    return sync


def _import_as(gloo, flavour: str):
    """A second copy of torch's test module, imported with ``BACKEND=flavour``."""
    import importlib.util
    name = f"_stratacl_suite_distributed_test_{flavour}"
    os.environ["BACKEND"] = flavour
    spec = importlib.util.spec_from_file_location(name, gloo.__file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module          # pickled objects (object collectives) find their classes
    spec.loader.exec_module(module)
    return module


def _flavour(gloo, mpi, name: str) -> tuple:
    """(flavour, method) a test runs as: gloo's unless torch keeps it from gloo only (see the
    module docstring); a method statically skipped in both keeps gloo's skip and reason."""
    fn = getattr(gloo.DistributedTest._DistTestBase, name)
    if getattr(fn, "__unittest_skip__", False):
        other = getattr(mpi.DistributedTest._DistTestBase, name)
        return ("mpi", other) if not getattr(other, "__unittest_skip__", False) else ("gloo", fn)
    f = fn
    while f is not None:
        if getattr(getattr(f, "__code__", None), "co_qualname", "").startswith("skip_if_small_worldsize"):
            return "gloo/mpi-env", fn
        f = getattr(f, "__wrapped__", None)
    return "gloo", fn


def _short(e: BaseException) -> str:
    """The exception and the test file's innermost frames, for the report line."""
    tb = traceback.extract_tb(e.__traceback__)
    where = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in tb[-3:]]
    return f"{type(e).__name__}: {str(e)[:900]} [at {' < '.join(reversed(where))}]"


def _reset(env0: dict, dist, torch) -> None:
    """Undo what a method may leave behind in this process (torch's harness has a fresh one)."""
    os.environ.clear()
    os.environ.update(env0)
    dist.set_debug_level_from_env()
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)


if __name__ == "__main__":
    sys.exit(main())
