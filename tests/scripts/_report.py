"""What the rank scripts use to tell the test what they saw: one JSON line per record on stdout.

Each record is a single ``write`` of less than PIPE_BUF bytes, so lines of different ranks sharing
the launcher's stdout never interleave. Lines start with ``@@ `` so tests can tell them apart from
anything else a rank prints.
"""
from __future__ import annotations

import json
import os
import time

MARK = "@@ "


def emit(**record) -> None:
    record.setdefault("pid", os.getpid())
    record.setdefault("rank", int(os.environ.get("STRATACL_RANK", "-1")))
    record.setdefault("t", time.monotonic())
    line = (MARK + json.dumps(record) + "\n").encode()
    assert len(line) < 4096, "a record must fit one atomic pipe write"
    os.write(1, line)


def failure_record(exc: BaseException) -> dict:
    return {"kind": "error", "type": type(exc).__name__, "message": str(exc),
            "peer": getattr(exc, "peer", None), "operation": getattr(exc, "operation", None)}


def torch_job_still_works(dist, torch) -> list[str]:
    """What is wrong, if anything, with a torch job after its store was attacked: an all_reduce
    must be exact, and a new group (agreed through the store) must work. Every rank calls it."""
    me, n = dist.get_rank(), dist.get_world_size()
    bad = []
    x = torch.arange(100, dtype=torch.float64) * (me + 1)
    dist.all_reduce(x)
    if not torch.equal(x, torch.arange(100, dtype=torch.float64) * (n * (n + 1) // 2)):
        bad.append(f"all_reduce: {x[:4].tolist()}")
    g = dist.new_group(list(range(n)))
    y = torch.tensor([float(me)])
    dist.all_reduce(y, group=g)
    if y.item() != n * (n - 1) / 2:
        bad.append(f"new_group all_reduce: {y.item()}")
    return bad
