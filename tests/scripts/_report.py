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
