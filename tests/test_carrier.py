"""The cross-host carrier (stratacl/runtime/hosts/_carrier.py) under the MPI launcher: one carrier per
emulated host, every byte between hosts through MPI (a dynamic window over the host's
segments, MPI_Get under passive-target locks)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MPIRUN = shutil.which("mpirun", path=os.path.dirname(sys.executable))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120),      # jobs over emulated hosts: the jobs tier
              pytest.mark.skipif(MPIRUN is None, reason="no mpirun beside this Python: pip install -e '.[cluster]'")]


def _hosts(k: int) -> dict[int, dict]:
    pytest.importorskip("mpi4py")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    run = subprocess.run([MPIRUN, *root, "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,tcp",
                          "--mca", "pml", "ob1", "--mca", "osc", "rdma", "-n", str(k), sys.executable,
                          os.path.join(HERE, "scripts", "carrier_hosts.py")],
                         capture_output=True, text=True, timeout=100, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    out = {}
    for line in run.stdout.splitlines():
        if "@@ " in line:
            rec = json.loads(line.split("@@ ", 1)[1])
            out[rec["rank"]] = rec
    return out


@pytest.mark.parametrize("k", [2, 3])
def test_carriers_read_other_hosts_bytes_exactly_and_fresh(k):
    hosts = _hosts(k)
    assert sorted(hosts) == list(range(k))
    per_host = 70000 * 2 * (k - 1)                   # two ranks on each other host
    for h, seen in hosts.items():
        assert seen["moved_first"] and seen["first"], seen
        assert seen["fresh"], seen                   # read again after the owners rewrote: no stale bytes
        assert seen["after"], seen                   # a refused read harmed nobody
        assert seen["moved"] == 3 * per_host, seen
    assert hosts[0]["refused"] == ("carrier of host 0: refused 2 read(s): rank 0 has no mirror on host 0; "
                                   f"rank 2: bytes [{(1 << 20) - 5}, {(1 << 20) + 5}) leave its 1048576-byte segment")
    assert all(hosts[h]["refused"] is None for h in range(1, k))
