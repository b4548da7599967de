"""A custom all-gather written with torch's symmetric-memory API, exact against the built-in one.

    stratacl-launch -n 8 --clock virtual examples/symm_all_gather.py [--count 16384]

Every rank's input lives in HBM (``symm_mem.empty``); ``rendezvous`` hands every rank the
others' buffers, and each rank assembles the output itself from the peers' buffers:

- ``views``: ``hdl.get_buffer(p, ...)`` is a tensor over rank p's HBM, copied with ``copy_``
  (torch's own way; the copies are plain loads, which the modeled clock does not see: only
  the two signal-pad barriers are timed);
- ``gets``: the same with ``hdl.get(p, out)``, one-sided gets the fabric model times one after
  the other (tier latency + bytes at the tier's bandwidth each).

Both are checked bit for bit against ``dist.all_gather_into_tensor`` on backend "stratacl"
(the library's full-mesh all_gather, whose cores pull from every peer at once). Rank 0 prints
the modeled time of each (the slowest rank's, from the last rank in to the last rank out);
the exit code says whether every rank got the right bytes.
"""
import argparse
import sys
import warnings

import torch
import torch.distributed as dist

import stratacl
import stratacl.torch
from stratacl.torch import symm_mem

# torch 2.13 calls all_gather_into_tensor deprecated (for all_gather_single); it is the name compared against
warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)

parser = argparse.ArgumentParser()
parser.add_argument("--count", type=int, default=16384, help="float32 elements per rank (default 64 KiB)")
count = parser.parse_args().count

dist.init_process_group("stratacl")
comm = stratacl.init()                  # the same job: its clock is the rank's modeled clock
n, me = dist.get_world_size(), dist.get_rank()
modeled = stratacl.config.clock != "off"

inp = symm_mem.empty(count, dtype=torch.float32)
inp.copy_(torch.arange(count, dtype=torch.float32) * 0.5 + me * 1000.25)
hdl = symm_mem.rendezvous(inp, dist.group.WORLD)


def gather_views(out: torch.Tensor) -> None:
    hdl.barrier()                        # every rank's input is written
    for k in range(n):
        p = (me + k) % n
        out[p * count:(p + 1) * count].copy_(hdl.get_buffer(p, (count,), torch.float32))
    hdl.barrier()                        # no rank overwrites its input while a peer still reads it


def gather_gets(out: torch.Tensor) -> None:
    hdl.barrier()
    for k in range(n):
        p = (me + k) % n
        hdl.get(p, out[p * count:(p + 1) * count])
    hdl.barrier()


def slowest(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


def timed(call) -> float:
    """Modeled seconds of ``call``, from the last rank in to the last rank out (0 without a clock)."""
    dist.barrier()
    t0 = comm.clock() if modeled else 0.0
    call()
    t1 = comm.clock() if modeled else 0.0
    return slowest(t1) - slowest(t0) if modeled else 0.0


ref = stratacl.torch.empty(n * count, dtype=torch.float32)
dist.all_gather_into_tensor(ref, inp)                  # warm-up: registration and the call's plan
rows = [("dist.all_gather_into_tensor", timed(lambda: dist.all_gather_into_tensor(ref, inp)), ref)]
for name, fn in (("rendezvous + get_buffer views", gather_views), ("rendezvous + hdl.get", gather_gets)):
    out = torch.full((n * count,), float("nan"), dtype=torch.float32)
    rows.append((name, timed(lambda: fn(out)), out))

exact = torch.tensor([int(all(torch.equal(o.view(torch.int32), ref.view(torch.int32)) for _, _, o in rows[1:]))])
dist.all_reduce(exact, op=dist.ReduceOp.MIN)
if me == 0:
    print(f"symm_mem all-gather: {n} ranks, {count * 4 >> 10} KiB per rank (float32), topology "
          f"{comm.topology.name}, clock {stratacl.config.clock}")
    for name, t, _ in rows:
        print(f"{name:<32} " + (f"modeled {t * 1e6:9.2f} us" if modeled else "modeled       -"))
    print(f"exact against dist.all_gather_into_tensor on every rank: {'yes' if exact.item() else 'NO'}")
dist.destroy_process_group()
stratacl.finalize()
sys.exit(0 if exact.item() else 1)
