"""The fabric model's per-job state held once per host: the timed plans a job's ranks share are
mapped read-only from the job's store (runtime/pipeline/_plans.py), not copied into every rank, and the
modeled clocks stay what they were, bit for bit."""
from __future__ import annotations

import os

import numpy as np
import pytest

import stratacl
from stratacl.runtime.pipeline import SharedPlans
from stratacl.runtime.memory import prefix
from stratacl.ub._clock import FabricModel, model_call
from stratacl.runtime.pipeline import EAGER_BYTES

pytestmark = pytest.mark.timeout(240)


def _program(comm, share_from):
    """all_reduce 1 MiB, all_gather 64 KiB a rank, all_to_all 4 KiB a pair, a barrier; this
    rank's modeled clock after each (float.hex: exact)."""
    if share_from is not None:
        comm._rt.plans.share_from = share_from
    n, me = comm.size, comm.rank
    out = []
    x = stratacl.empty((1 << 18,), np.float32)
    x[:] = me
    comm.all_reduce(x, op="sum")
    out.append(comm.clock().hex())
    part = stratacl.empty((8192,), np.int64)
    part[:] = me
    gathered = stratacl.empty((n * part.size,), np.int64)
    comm.all_gather(gathered, part)
    out.append(comm.clock().hex())
    a = stratacl.empty((n * 512,), np.int64)
    a[:] = me
    b = stratacl.empty((n * 512,), np.int64)
    comm.all_to_all(b, a)
    out.append(comm.clock().hex())
    comm.barrier()
    out.append(comm.clock().hex())
    comm.all_reduce(x, op="sum")             # the same shape again: its plan from the rank's cache
    out.append(comm.clock().hex())
    ok = bool((x == n * (n - 1) / 2 * n).all() and (gathered == np.repeat(np.arange(n), 8192)).all()
              and (b == np.repeat(np.arange(n), 512)).all())
    shared = [name for name in os.listdir("/dev/shm")
              if name.startswith(prefix(os.environ["STRATACL_JOB_ID"]) + "plan-") and not name.endswith(".lock")]
    return out, ok, len(shared)


# Every rank's clock after each call of ``_program``, recorded with the library before plans were
# mapped from the store (commit d0d1f98, where a rank unpickled its own copy of each shared plan):
# stratacl.spawn(_program, n, args=(share_from,), clock="virtual", hbm_size=64 << 20), on every
# rank alike; the same with the store on (share_from=1) and off (None: below SHARE_FROM).
BEFORE = {
    8: ["0x1.0515436bbf2bep-16", "0x1.5755f6d992f19p-16", "0x1.836ceab83bbaap-16", "0x1.8f2b64dbee475p-16", "0x1.44411711fd735p-15"],
    32: ["0x1.c7db89af962efp-16", "0x1.9143406712b0fp-15", "0x1.ca8a28c17ebb9p-15", "0x1.dc27dff70a8eap-15", "0x1.573bf6cca4e98p-14"],
}


@pytest.mark.parametrize("n,share_from", [(8, None), (8, 1), pytest.param(32, 1, marks=pytest.mark.slow)])
def test_modeled_clocks_are_the_same_bits_with_the_plans_mapped(n, share_from):
    results = stratacl.spawn(_program, n, args=(share_from,), clock="virtual", hbm_size=64 << 20, timeout=200)
    for rank, (clocks, ok, shared) in enumerate(results):
        assert ok, f"rank {rank}: wrong bytes"
        assert clocks == BEFORE[n], f"rank {rank}"
        assert shared == (0 if share_from is None else 3), f"rank {rank}: {shared} plans in the store"


def _arrays(obj, seen=None):
    """Every numpy array a plan holds."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _arrays(x, seen)
    elif hasattr(obj, "__dict__") or hasattr(obj, "__dataclass_fields__"):
        for x in (vars(obj).values() if hasattr(obj, "__dict__") else
                  (getattr(obj, f) for f in obj.__dataclass_fields__)):
            yield from _arrays(x, seen)


def test_a_shared_plan_is_mapped_read_only_and_times_the_same(tmp_path):
    n = 64
    own = FabricModel.from_settings("cm384", "roa", EAGER_BYTES)
    maker = FabricModel.from_settings("cm384", "roa", EAGER_BYTES)
    reader = FabricModel.from_settings("cm384", "roa", EAGER_BYTES)
    maker.shared = SharedPlans("t0", str(tmp_path), share_from=1)
    reader.shared = SharedPlans("t0", str(tmp_path), share_from=1)
    clocks = np.linspace(0.0, 7.5, n)
    for op, algo, nbytes, itemsize in [("all_reduce", "mesh", 1 << 20, 4), ("all_reduce", "ring", 1 << 20, 4),
                                       ("all_gather", "mesh", 1 << 16, 8), ("all_to_all", "mesh", 1 << 18, 8),
                                       ("barrier", "mesh", 0, 1)]:
        want = model_call(own, op, algo, range(n), nbytes, clocks, itemsize=itemsize)
        for model in (maker, reader):         # the maker maps the file it wrote, the reader the same file
            assert model_call(model, op, algo, range(n), nbytes, clocks, itemsize=itemsize).tobytes() == want.tobytes()
            arrays = list(_arrays(model.plan(op, algo, tuple(range(n)), nbytes, 0, itemsize)))
            assert arrays and not any(a.flags.writeable for a in arrays), op
    with open("/proc/self/maps") as f:
        mapped = {line.split()[-1] for line in f if str(tmp_path) in line}
    files = {str(tmp_path / name) for name in os.listdir(tmp_path) if not name.endswith(".lock")}
    assert mapped == files and len(files) == 5


def test_a_plan_file_written_by_something_else_is_named(tmp_path):
    store = SharedPlans("t0", str(tmp_path), share_from=1)
    store.fetch(b"shape", lambda: np.arange(4.0))
    path = next(str(tmp_path / name) for name in os.listdir(tmp_path) if not name.endswith(".lock"))
    with open(path, "r+b") as f:
        f.write(b"garbage")
    with pytest.raises(stratacl.StrataError, match=r"shared plan .* starts with b'garbage"):
        SharedPlans("t0", str(tmp_path), share_from=1).fetch(b"shape", lambda: None)
