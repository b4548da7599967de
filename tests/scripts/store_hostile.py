"""A torch job under stratacl-launch whose store is attacked while it starts.

    EMU_STORE_CASE=flood   every rank connects to the test's gate (EMU_GATE, a Unix socket) and
                           says where the store is; rank 0 goes on to serve it, the others wait
                           for the test's word before init_process_group: the test floods the
                           store in between
    EMU_STORE_CASE=frames  after init, rank 1 opens two connections of its own with the job's
                           secret and sends, after the handshake, an empty frame on one and a
                           2 GiB length on the other; each must be closed, the store kept

Then every rank runs collectives and a new group (agreed through the store) and checks them
exactly: ``@@ {"kind": "done", "rank": r, "bad": [...], ...}``.
"""
import hashlib
import hmac
import json
import os
import socket
import struct
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import stratacl.torch  # noqa: E402,F401
from _report import emit, torch_job_still_works  # noqa: E402

case = os.environ["EMU_STORE_CASE"]
me = int(os.environ["STRATACL_RANK"])
if case == "flood":
    gate = socket.socket(socket.AF_UNIX)
    gate.connect(os.environ["EMU_GATE"])
    gate.sendall((json.dumps({"rank": me, "store": os.environ["STRATACL_STORE"]}) + "\n").encode())
    if me != 0:
        assert gate.recv(1) == b"g"
dist.init_process_group("stratacl", timeout=timedelta(seconds=60))
n = dist.get_world_size()
extra = {}
if case == "frames" and me == 1:
    from stratacl.torch import _store
    host, port = os.environ["STRATACL_STORE"].rsplit(":", 1)
    secret = bytes.fromhex(os.environ["STRATACL_JOB_SECRET"])
    closed = []
    for frame in (b"\0\0\0\0", struct.pack("!I", 2 << 30)):
        s = socket.create_connection((host, int(port)), timeout=30)
        magic = _store._recv_exact(s, len(_store.MAGIC))
        s.sendall(hmac.new(secret, _store._recv_exact(s, 32), hashlib.sha256).digest())
        welcome = s.recv(1)
        s.sendall(frame)
        try:
            closed.append([welcome.hex(), s.recv(1).hex()])     # "" = closed by the store
        except (ConnectionError, TimeoutError) as e:
            closed.append([welcome.hex(), type(e).__name__])
        s.close()
    extra["closed"] = closed
dist.barrier()
bad = torch_job_still_works(dist, torch)      # the collectives and a new group, after the attack
emit(kind="done", bad=bad, **extra)
dist.destroy_process_group()
raise SystemExit(1 if bad else 0)
