"""--path sdma in the data path: copies go through the rank's SDMA engine, bytes stay exact."""
from __future__ import annotations

import numpy as np

import stratacl
from stratacl.sdma._engine import SdmaEngine


def offloaded(comm):
    n, me = comm.size, comm.rank
    x = stratacl.empty((300_000,), np.int32)
    x[:] = np.arange(x.size) * (me + 1)
    out = stratacl.empty((n * x.size,), np.int32)
    comm.all_gather(out, x)
    ok = bool((out.reshape(n, -1) == np.arange(x.size)[None, :] * np.arange(1, n + 1)[:, None]).all())
    s = stratacl.stats()
    return ok, s["sdma"]["descriptors"], s["sdma"]["bytes"], s["sdma"]["notifies"]


def test_sdma_path_moves_the_bytes_through_the_engine():
    n = 4
    for ok, descriptors, nbytes, notifies in stratacl.spawn(offloaded, n, path="sdma", timeout=60):
        assert ok
        assert nbytes >= n * 300_000 * 4 and descriptors >= n          # every block, in 1 MiB descriptors
        assert notifies >= 1


def test_engine_runs_each_queue_in_order_and_completes_by_notify():
    eng = SdmaEngine(queues=3, max_bytes=1000)
    try:
        src = np.arange(10_000, dtype=np.uint8)
        dst = np.zeros_like(src)
        a, b = dst.ctypes.data, src.ctypes.data
        assert eng.post(0, [a], [b], [6000]) == 6                        # cut into 1000-byte descriptors
        eng.post(1, [a + 6000], [b + 6000], [4000])
        note = eng.post_notify([0, 1])                                   # after each core's copies
        eng.doorbell()
        assert note.wait(10)
        assert (dst == src).all()
        assert eng.counters["descriptors"] == 10 and eng.counters["bytes"] == 10_000
        assert eng.counters["notifies"] == 2
    finally:
        eng.stop(10)


def per_call_path(comm):
    n, me = comm.size, comm.rank
    x = stratacl.empty((50_000,), np.int32)
    x[:] = np.arange(x.size) + me
    out = stratacl.empty((n * x.size,), np.int32)
    want = (np.arange(x.size)[None, :] + np.arange(n)[:, None]).reshape(-1)
    seen = []
    t0 = comm.clock()
    comm.all_gather(out, x, path="sdma")
    t_sdma = comm.clock() - t0
    seen.append((out == want).all() and stratacl.stats()["sdma"]["bytes"] == n * x.nbytes)
    out[:] = 0
    t0 = comm.clock()
    comm.all_gather(out, x)                                # the setting (mte): the engine stays idle
    t_mte = comm.clock() - t0
    seen.append((out == want).all() and stratacl.stats()["sdma"]["bytes"] == n * x.nbytes)
    work = comm.all_gather(out, x, async_op=True, path="sdma")
    work.wait()
    seen.append((out == want).all() and stratacl.stats()["sdma"]["bytes"] == 2 * n * x.nbytes)
    try:
        comm.all_gather(out, x, path="dma" if me == 1 else "mte")
        errors = None
    except Exception as e:                                 # every rank hears of the bad argument
        errors = (type(e).__name__, str(e))
    comm.barrier()                                         # and the communicator is still usable
    return seen, t_sdma, t_mte, errors


def test_path_per_call_overrides_the_setting():
    n = 4
    for me, (seen, t_sdma, t_mte, errors) in enumerate(stratacl.spawn(per_call_path, n, clock="virtual", timeout=60)):
        assert seen == [True, True, True]
        sdma = stratacl.estimate("all_gather", n, 50_000 * 4 * n, path="sdma")
        mte = stratacl.estimate("all_gather", n, 50_000 * 4 * n, path="mte")
        assert abs(t_sdma * 1e6 - sdma.time_us) <= 1e-9 * sdma.time_us
        assert abs(t_mte * 1e6 - mte.time_us) <= 1e-9 * mte.time_us
        assert t_sdma != t_mte
        if me == 1:
            assert errors == ("ValueError", "all_gather: path must be one of mte, sdma, got 'dma'")
        else:
            assert errors == ("CollectiveMismatch", "all_gather: rank 1 rejected its arguments: ValueError: "
                              "all_gather: path must be one of mte, sdma, got 'dma'; no data was moved")
