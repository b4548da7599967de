"""``Communicator.host_rows``: rows between host memory and an HBM cache (runtime/communicator/_hostrows.py).

Exact bytes on every data path and registration, clear errors for bad arguments, and a modeled
time equal to the fabric model's for the same transfers (ub._clock.model_exchange)."""
from __future__ import annotations

import numpy as np
import pytest

import stratacl
from stratacl.ub._clock import FabricModel, model_exchange
from stratacl.ub._sharing import HOST_LOAD, HOST_STORE


def swap_rows(comm):
    """Fetch three rows, dirty one, evict it while refilling its slot; return what each step held."""
    cache = stratacl.empty((6, 5), np.float64)
    cache[:] = -1.0
    host = np.arange(40 * 5, dtype=np.float64).reshape(40, 5) + 1000 * comm.rank
    want_host = host.copy()
    comm.host_rows(cache, host, np.array([7, 39, 0]), np.array([5, 0, 2]))
    first = cache.copy()
    cache[5] *= -3.0
    want_host[7] = cache[5]
    comm.host_rows(cache, host, [11], [5], store_slots=[5], store_rows=[7])
    t0 = comm.clock() if stratacl.config.clock != "off" else 0.0
    comm.host_rows(cache, host, np.arange(3), np.array([1, 3, 4]), store_slots=[0], store_rows=[2])
    dt = comm.clock() - t0 if stratacl.config.clock != "off" else 0.0
    want_host[2] = first[0]
    return first, cache.copy(), host, want_host, dt


@pytest.mark.timeout(120)
@pytest.mark.parametrize("settings", [dict(path="mte"), dict(path="sdma"), dict(registration="staged"),
                                      dict(registration="pool", clock="off")])
def test_host_rows_move_exact_bytes(settings):
    for rank, (first, cache, host, want_host, _) in enumerate(stratacl.spawn(swap_rows, 2, timeout=60, **settings)):
        base = np.arange(40 * 5, dtype=np.float64).reshape(40, 5) + 1000 * rank
        assert np.array_equal(first[[5, 0, 2]], base[[7, 39, 0]]) and (first[[1, 3, 4]] == -1).all()
        assert np.array_equal(cache[5], base[11]) and np.array_equal(cache[[1, 3]], base[[0, 1]])
        assert np.array_equal(cache[4], first[0])          # write-backs come first: row 2 was just stored
        assert np.array_equal(host, want_host)


def timed_call(comm, nfetch, nstore):
    cache = stratacl.empty((64, 16), np.float32)
    host = np.zeros((256, 16), np.float32)
    t0 = comm.clock()
    comm.host_rows(cache, host, np.arange(nfetch), np.arange(nfetch), np.arange(nstore) + 32,
                   np.arange(nstore) + 100)
    return comm.clock() - t0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("registration, path", [("roa", "mte"), ("staged", "mte"), ("roa", "sdma")])
def test_host_rows_take_the_models_time_on_the_host_tier(registration, path):
    got = stratacl.spawn(timed_call, 1, args=(20, 7), timeout=60, clock="virtual", registration=registration,
                         path=path)[0]
    model = FabricModel("cm384", registration, path=path, partition="balanced", eager_bytes=16 * 1024)
    row = 16 * 4
    want = model_exchange(model, (0,), [(np.array([[7 * row]]), HOST_STORE), (np.array([[20 * row]]), HOST_LOAD)],
                          [0.0], staging=(np.array([7 * row]), np.array([20 * row])))[0]
    assert got * 1e6 == pytest.approx(want, rel=1e-9)
    # at least the host tier's latency twice (a store, then a load) and the bytes at 40 GB/s
    assert want >= 2 * 1.0 + 27 * row / 40e3


def overlapped(comm, compute_us):
    """A fetch issued with async_op=True, a kernel charged meanwhile, then wait(): the bytes,
    and the modeled times of the fetch alone, the kernel alone and the two overlapped."""
    modeled = stratacl.config.clock != "off"
    cache = stratacl.empty((64, 16), np.float32)
    host = np.arange(256 * 16, dtype=np.float32).reshape(256, 16) + 10000 * comm.rank
    now = comm.clock if modeled else (lambda: 0.0)
    t0 = now()
    comm.host_rows(cache, host, np.arange(64), np.arange(64))
    alone = now() - t0
    t0 = now()
    comm.charge_compute(compute_us)
    kernel = now() - t0
    rows = np.arange(64) + 100
    t0 = now()
    work = comm.host_rows(cache, host, rows, np.arange(64)[::-1].copy(), async_op=True)
    comm.charge_compute(compute_us)
    work.wait()
    both = now() - t0
    return type(work).__name__, bool(np.array_equal(cache[::-1], host[rows])), alone, kernel, both


@pytest.mark.timeout(120)
@pytest.mark.parametrize("settings", [dict(path="mte"), dict(path="auto"), dict(path="sdma", registration="staged"),
                                      dict(clock="off")])
def test_an_asynchronous_fetch_overlaps_the_kernels_charged_meanwhile(settings):
    settings = {"clock": "virtual", **settings}
    for kind, exact, alone, kernel, both in stratacl.spawn(overlapped, 2, args=(20.0,), timeout=60, **settings):
        assert kind == "Work" and exact
        if settings["clock"] == "off":
            continue
        assert 0 < alone < kernel == pytest.approx(20e-6)
        assert kernel <= both < alone + kernel            # the fetch ran beside the kernel
        if settings.get("path") == "auto":                # on SDMA: the kernel keeps nearly every core
            assert both - kernel < 0.1 * alone


CACHE_BEFORE = -np.arange(12, dtype=np.float32).reshape(4, 3) - 1      # distinct from every host row
HOST_BEFORE = np.arange(30, dtype=np.float32).reshape(10, 3) + 1


def bad_calls(comm, async_op=False):
    cache = stratacl.empty((4, 3), np.float32)
    cache[:] = CACHE_BEFORE
    host = HOST_BEFORE.copy()
    errors = []
    for args, kw in [((cache, host, [10], [0]), {}),                        # row outside the table
                     ((cache, host, [1], [4]), {}),                         # slot outside the cache
                     ((cache, host, [1, 2], [0]), {}),                      # unpaired
                     ((cache, host, [1, 2], [0, 0]), {}),                   # a slot filled twice
                     ((cache, host, [1.0], [0]), {}),                       # not integers
                     ((cache, np.zeros((10, 3), np.float64), [1], [0]), {}),   # dtype differs
                     ((cache, np.zeros((10, 4), np.float32), [1], [0]), {}),   # row width differs
                     ((np.zeros((4, 3), np.float32), host, [1], [0]), {}),     # cache not in HBM
                     ((cache, stratacl.empty((10, 3), np.float32), [1], [0]), {}),   # host table in HBM
                     ((cache, host, [1], [0]), {"path": "dma"}),
                     ((cache, "host", [1], [0]), {})]:
        try:
            comm.host_rows(*args, async_op=async_op, **kw)     # asynchronous: refused at the call too
            errors.append(None)
        except Exception as e:
            errors.append((type(e).__name__, str(e)))
    return errors, cache.copy(), host


@pytest.mark.timeout(60)
@pytest.mark.parametrize("async_op", [False, True])
def test_bad_arguments_are_clear_errors_and_move_nothing(async_op):
    errors, cache, host = stratacl.spawn(bad_calls, 1, args=(async_op,), timeout=30)[0]
    kinds = [e[0] if e else None for e in errors]
    assert kinds == ["IndexError", "IndexError", "ValueError", "ValueError", "TypeError", "ValueError",
                     "ValueError", "ValueError", "ValueError", "ValueError", "TypeError"], errors
    assert all(e[1].startswith("host_rows: ") for e in errors)
    assert "fetch_rows[0] = 10 is outside 0..9" in errors[0][1]
    assert "not in this rank's HBM" in errors[7][1] and "host table is in HBM" in errors[8][1]
    # every call was refused before a byte moved: the cache and the host table are as they were
    assert np.array_equal(cache, CACHE_BEFORE), cache
    assert np.array_equal(host, HOST_BEFORE), host
