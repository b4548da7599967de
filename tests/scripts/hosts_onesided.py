"""The one-sided programs of tests/onesided_programs.py, and torch's symmetric memory, with the
peers on the other host among them: exact bytes, errors, the ordering stress test, racing
atomics; the modeled clock after the deterministic ones. One report per rank
(tests/test_emulated_hosts.py runs it on one host and on emulated hosts).

    stratacl-launch -n 8 --emulate-hosts 2 --clock virtual tests/scripts/hosts_onesided.py [--symm-mem] [--no-errors]
"""
from __future__ import annotations

import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.dirname(here)]
from _report import emit  # noqa: E402
from onesided_programs import atomics, clock, errors, exact, stress  # noqa: E402

import stratacl  # noqa: E402
from stratacl.runtime import _world  # noqa: E402

COUNT, ROUNDS = 1024, 8          # symm_mem: floats a buffer, rounds of put + signal to the right neighbour


def symm(far) -> list[str]:
    """torch's symmetric memory over the hosts: timed gets (an all-gather, exact against the
    built-in one), puts into the right neighbour ordered by put_signal/wait_signal, the pad's
    barrier; load/store views of a peer on another host refused, its pad pointer 0."""
    import torch
    import torch.distributed as dist

    import stratacl.torch  # noqa: F401  (registers the backend)
    from stratacl.torch import symm_mem
    dist.init_process_group("stratacl")
    n, me = dist.get_world_size(), dist.get_rank()

    def data(rank: int, rnd: int = 0) -> torch.Tensor:
        return torch.arange(COUNT, dtype=torch.float32) * 0.25 + rank * 1000.5 + rnd * 7.0

    bad = []
    t = symm_mem.empty(COUNT, dtype=torch.float32)
    t.copy_(data(me))
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)
    hdl.barrier()
    ref = stratacl.torch.empty(n * COUNT, dtype=torch.float32)
    dist.all_gather_into_tensor(ref, t)
    timed = torch.empty(n * COUNT)
    for p in range(n):
        hdl.get(p, timed[p * COUNT:(p + 1) * COUNT])
        if p in far:
            if hdl.signal_pad_ptrs[p] != 0:
                bad.append(f"signal_pad_ptrs[{p}] of a peer on another host is not 0")
            try:
                hdl.get_buffer(p, (COUNT,), torch.float32)
                bad.append(f"get_buffer of peer {p} on another host was not refused")
            except stratacl.OneSidedError as e:
                if "another host" not in str(e):
                    bad.append(f"get_buffer refusal: {e}")
        elif not torch.equal(hdl.get_buffer(p, (COUNT,), torch.float32), data(p)):
            bad.append(f"get_buffer of {p}")
    if not torch.equal(timed, ref):
        bad.append("all-gather through get differs from dist.all_gather_into_tensor")
    hdl.barrier()
    right, left = (me + 1) % n, (me - 1) % n
    for r in range(1, ROUNDS + 1):
        hdl.put(right, data(me, r))
        hdl.put_signal(right, channel=1)           # the put is in place before the signal
        hdl.wait_signal(left, channel=1)
        if not torch.equal(t, data(left, r)):
            bad.append(f"round {r}: put of {left} not visible with its signal")
        hdl.put_signal(left, channel=2)            # the buffer may be written again
        hdl.wait_signal(right, channel=2)
    hdl.barrier()
    pad = hdl.get_signal_pad(me)
    if int(pad.sum()) != 0:
        bad.append(f"signal pad not back to 0: {int(pad.sum())}")
    dist.destroy_process_group()
    return bad


comm = stratacl.init()
n, me = comm.size, comm.rank
host_of = _world.runtime().hosts.host_of
far = {r for r in range(n) if host_of is not None and host_of[r] != host_of[me]}
clocks: dict[str, float] = {}
bad = {"exact": exact(comm, far)}
clocks["exact"] = comm.clock()
timed = clock(comm, 1 << 20, [1, n // 2, n - 1])          # near and far from rank 0
clocks["clock"] = comm.clock()
if "--no-errors" not in sys.argv:        # its unmapped address is the default allocator's
    bad["errors"] = errors(comm, far)
    clocks["errors"] = comm.clock()
# racing (their modeled times depend on the race: not compared)
stress_bad, moves = stress(comm, 60, 2, 1024, 6)
bad["stress"] = stress_bad
olds, first, last = atomics(comm, 20)
bad["symm_mem"] = symm(far) if "--symm-mem" in sys.argv else []
emit(rank=me, bad=bad, clocks=clocks, timed=timed, moves=moves, olds=olds, counted=[first, last],
     far=sorted(far), bytes_carried=stratacl.stats().get("bytes_carried", 0))
stratacl.finalize()
