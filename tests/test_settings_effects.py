"""Settings docs/reference.md documents, seen to take effect in a launched job on 2 ranks.

- ``STRATACL_DEBUG``: ``detail`` logs every call with its descriptor, ``info`` only the join;
- ``--pool-size``: under ``--registration pool`` the pre-registered region, and so the rank's
  allocatable HBM, is that size;
- the address window: a rank whose window (``STRATACL_VA_BASE``) is already mapped gets a
  ``BootstrapError`` saying which range and what to change.

Each rank program is written to the test's temporary folder and reports through ``@@`` lines
(launch_helpers.parse_records); the launcher runs with a deadline (``launch(timeout=...)``).
"""
from __future__ import annotations

import re
import textwrap

import pytest

from stratacl.runtime.pipeline import OPS

from launch_helpers import clean_env, launch

pytestmark = pytest.mark.timeout(120)

N = 2


def _program(tmp_path, body: str) -> str:
    p = tmp_path / "prog.py"
    p.write_text("import json, os\nimport numpy as np\nimport stratacl\n\n"
                 "def report(**record):\n"
                 "    os.write(1, ('@@ ' + json.dumps(record) + '\\n').encode())\n\n" + textwrap.dedent(body))
    return str(p)


ALL_REDUCE = """
comm = stratacl.init()
x = stratacl.empty((8192,), np.float32)
x[:] = comm.rank + 1
for _ in range(3):              # the same call on the same array: replayed natively unless logged
    comm.all_reduce(x)
report(rank=comm.rank, values=sorted(set(x.tolist())))
stratacl.finalize()
"""


def _debug_run(tmp_path, level: str):
    run = launch("-n", str(N), _program(tmp_path, ALL_REDUCE), env=clean_env(STRATACL_DEBUG=level), timeout=90)
    assert run.returncode == 0, run.explain()
    # 1 + 2 = 3, then 6, then 12: the calls ran, logged or not
    assert sorted((r["rank"], r["values"]) for r in run.records) == [(r, [12.0]) for r in range(N)]
    return run.stderr


def test_debug_detail_logs_every_call_with_its_descriptor(tmp_path):
    err = _debug_run(tmp_path, "detail")
    for r in range(N):
        assert re.search(rf"^\[rank {r}\] INFO stratacl: rank {r} of {N} joined job [0-9a-z]+ "
                         r"\(registration=roa, metadata=direct\)$", err, re.M), err[-3000:]
        calls = re.findall(rf"^\[rank {r}\] DEBUG stratacl: all_reduce call (\d+): \[([-0-9, ]+)\]$", err, re.M)
        assert len(calls) == 3, err[-3000:]
        numbers = [int(k) for k, _ in calls]
        assert numbers == list(range(numbers[0], numbers[0] + 3))      # one line per call, in order
        for _, fields in calls:
            desc = [int(v) for v in fields.split(",")]
            # descriptor: operation, dtype, count, root, reduce op, call, input address, input bytes, ...
            assert (desc[0], desc[2], desc[3], desc[7]) == (OPS["all_reduce"], 8192, 0, 8192 * 4), desc


def test_debug_info_logs_the_join_but_no_call(tmp_path):
    err = _debug_run(tmp_path, "info")
    for r in range(N):
        assert f"[rank {r}] INFO stratacl: rank {r} of {N} joined job" in err, err[-3000:]
    assert "DEBUG" not in err, err[-3000:]


POOL = """
comm = stratacl.init()
a = stratacl.empty((20 << 20,), np.uint8)
try:
    b = stratacl.empty((16 << 20,), np.uint8)
    report(rank=comm.rank, oom=None)
except stratacl.OutOfMemory as e:
    report(rank=comm.rank, oom=str(e), memory_error=isinstance(e, MemoryError))
stratacl.finalize()
"""


def test_pool_size_is_the_rank_s_allocatable_hbm(tmp_path):
    """A 32 MiB pool in 128 MiB of HBM: 20 MiB fit, 16 more do not, and the error says 32 MiB."""
    run = launch("-n", str(N), "--registration", "pool", "--pool-size", "32M", "--hbm-size", "128M",
                 _program(tmp_path, POOL), timeout=90)
    assert run.returncode == 0, run.explain()
    got = {r["rank"]: r for r in run.records}
    assert sorted(got) == list(range(N)), run.explain()
    for r, rec in got.items():
        assert rec["oom"] is not None and rec["memory_error"], rec
        assert rec["oom"].startswith(f"rank {r}: out of HBM allocating 16.0 MiB (segment of 16.0 MiB): "
                                     f"capacity 32.0 MiB, 20.0 MiB held by live arrays"), rec


WINDOW_BASE = 0x300000000000

TAKE_WINDOW = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
base = int(os.environ["STRATACL_VA_BASE"], 0)
# one page at the window's start, as another library's mapping would be (MAP_FIXED_NOREPLACE)
got = libc.mmap(base, 4096, 0, 0x02 | 0x20 | 0x100000, -1, 0)
assert got == base, (hex(base), got, ctypes.get_errno())
stratacl.init()
report(rank=int(os.environ["RANK"]), joined=True)
"""


def test_a_taken_address_window_is_a_bootstrap_error(tmp_path):
    run = launch("-n", str(N), "--grace", "1", _program(tmp_path, TAKE_WINDOW),
                 env=clean_env(STRATACL_VA_BASE=hex(WINDOW_BASE)), timeout=90)
    assert run.returncode != 0, run.explain()
    assert run.records == [], run.explain()           # no rank joined
    assert re.search(rf"BootstrapError: cannot reserve the shared address window {WINDOW_BASE:#x}\+0x[0-9a-f]+ "
                     r"\(File exists\); pick another base with STRATACL_VA_BASE", run.stderr), run.explain()
