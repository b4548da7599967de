"""A torch program that ends without destroy_process_group while its group's worker may still
be inside torch: an asynchronous all_reduce whose Future has a slow callback.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/scripts/torch_exit_threads.py
    stratacl-launch -n 2 tests/scripts/torch_exit_threads.py

Its first exit hook (so the last to run) prints ``@@ {"rank": r, "live": [...]}``, the group
worker threads still alive then: none, once the exit has joined them. A daemon thread left
inside torch when the interpreter finalizes aborts the process instead.
"""
import atexit
import json
import os
import threading
import time

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK", "-1"))


def report() -> None:
    live = sorted(t.name for t in threading.enumerate() if t.name.startswith("stratacl-torch-"))
    os.write(1, ("@@ " + json.dumps({"rank": RANK, "live": live}) + "\n").encode())


atexit.register(report)

import stratacl.torch  # noqa: E402,F401  (registers the backend)

dist.init_process_group("stratacl")
RANK = dist.get_rank()
work = dist.all_reduce(torch.ones(4), async_op=True)      # queued: the group's worker runs it
work.get_future().then(lambda f: time.sleep(0.3))
work.wait()
