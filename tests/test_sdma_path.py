"""--path sdma in the data path: copies go through the rank's SDMA engine, bytes stay exact."""
from __future__ import annotations

import numpy as np

import stratacl
from stratacl.runtime import _native
from stratacl.sdma._queues import SdmaEngine


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


def test_engine_runs_each_queue_in_order_and_completes_by_flag_or_notify():
    eng = SdmaEngine(queues=3, max_bytes=1000)
    try:
        src = np.arange(10_000, dtype=np.uint8)
        dst = np.zeros_like(src)
        flag = np.zeros(1, dtype=np.uint32)
        a, b = dst.ctypes.data, src.ctypes.data
        assert eng.post(0, [a], [b], [6000]) == 6                        # cut into 1000-byte descriptors
        eng.post(1, [a + 6000], [b + 6000], [4000])
        eng.post_flag(1, flag.ctypes.data, 7)                            # tail: after core 1's copies
        note = eng.post_notify([0, 1])
        eng.doorbell()
        assert note.wait(10)
        assert _native.wait_seq_u32(flag.ctypes.data, 7, 0, 10.0)
        assert (dst == src).all()
        assert eng.counters["descriptors"] == 10 and eng.counters["bytes"] == 10_000
        assert eng.counters["flags"] == 1 and eng.counters["notifies"] == 2
    finally:
        eng.stop(10)
