"""A first job: all_reduce and all_gather on HBM buffers, checked on every rank, timed twice.

    stratacl-launch -n 32 --clock virtual examples/allreduce.py

Each call is timed on the host (wall) and on the fabric model of the topology (modeled: the
ranks' virtual clocks, ``--clock virtual``); without a modeled clock the modeled column is the
model's estimate for the same call (``stratacl.estimate``). Bus bandwidth follows nccl-tests:
algbw = bytes / time, busbw = algbw x 2(N-1)/N for all_reduce and (N-1)/N for all_gather.
Rank 0 prints one small table; the exit code says whether every rank got the right bytes.
"""
import sys
import time

import numpy as np

import stratacl

comm = stratacl.init()
n, me = comm.size, comm.rank
cfg = stratacl.config
modeled = cfg.clock != "off"


def slowest(value: float) -> float:
    """The largest of every rank's ``value`` (a collective)."""
    v = np.array([value], dtype=np.float64)
    comm.all_reduce(v, op="max")
    return float(v[0])


def timed(call) -> tuple[float, float]:
    """Wall and modeled seconds of one collective ``call``: from the last rank in to the last rank out."""
    comm.barrier()
    m0 = comm.clock() if modeled else 0.0
    t0 = time.perf_counter()
    call()
    wall = slowest(time.perf_counter() - t0)
    model = slowest(comm.clock()) - slowest(m0) if modeled else 0.0
    return wall, model


# all_reduce: 1 MiB of float32 per rank, in place; one warm-up call, then the checked, timed one
count = 1 << 18
x = stratacl.empty((count,), np.float32)      # lives in this rank's HBM: peers read it with no copy
comm.all_reduce(x, op="sum")
x[:] = me
reduce_times = timed(lambda: comm.all_reduce(x, op="sum"))
ok_reduce = bool((x == n * (n - 1) / 2).all())

# all_gather: 64 KiB of int64 per rank, rank-major into an N x 64 KiB output
part = stratacl.empty((8192,), np.int64)
part[:] = me
gathered = stratacl.empty((n * part.size,), np.int64)
comm.all_gather(gathered, part)
gathered[:] = -1
gather_times = timed(lambda: comm.all_gather(gathered, part))
# one rank's block at a time: the whole expected output (np.repeat) would be N x 64 KiB of private
# memory in every rank at once, 10 GiB at N = 384, more than the HBM the call itself touches
blocks = gathered.reshape(n, part.size)
ok_gather = all(bool((blocks[r] == r).all()) for r in range(n))

flags = np.array([ok_reduce, ok_gather], dtype=np.bool_)
comm.all_reduce(flags, op="min")              # everyone agrees on the verdict
stats = stratacl.stats()

if me == 0:
    rows = [("all_reduce sum", x.nbytes, x.nbytes, 2 * (n - 1) / n, reduce_times, flags[0]),
            ("all_gather", part.nbytes, gathered.nbytes, (n - 1) / n, gather_times, flags[1])]
    source = "virtual clock" if modeled else "estimate"
    print(f"StrataCL-emu job: {n} ranks (one NPU die each) on topology {comm.topology.name}, "
          f"registration {cfg.registration}, algo {cfg.algo}, path {cfg.path}, clock {cfg.clock}")
    print(f"{'call':<15} {'per rank':>9} {'wall (host)':>12} "
          f"{'modeled on ' + comm.topology.name:>17} {'busbw':>11}  result")
    for name, per_rank, size, factor, (wall, model), ok in rows:
        if not modeled:
            model = stratacl.estimate(name.split()[0], n, size, topology=cfg.topology,
                                      registration=cfg.registration).time_us * 1e-6
        busbw = size / model * factor / 1e9 if model > 0 else 0.0
        print(f"{name:<15} {per_rank >> 10:>5} KiB {wall * 1e3:>9.2f} ms {model * 1e6:>14.1f} us "
              f"{busbw:>6.1f} GB/s  {'correct on every rank' if ok else 'WRONG'}")
    print(f"modeled: {source}; busbw from the modeled time, nccl-tests factors. Rank 0 pulled "
          f"{stats['bytes_pulled']} bytes from peers' HBM and staged {stats['bytes_staged']}.")
stratacl.finalize()
sys.exit(0 if flags.all() else 1)
