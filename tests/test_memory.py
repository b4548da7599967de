"""HBM, the caching allocator, zero copy and shadow addressing, and registration modes."""
from __future__ import annotations

import numpy as np
import pytest

import stratacl
from stratacl import ub

MiB = 1024 * 1024


def caching(comm):
    s0 = stratacl.memory_stats()
    a = stratacl.empty((1000,), np.float32)
    s1 = stratacl.memory_stats()
    addr = a.ctypes.data
    del a                                   # block back to the cache: no physical event
    b = stratacl.zeros((1000,), np.float32)
    s2 = stratacl.memory_stats()
    reused = b.ctypes.data == addr
    big = stratacl.empty((3 * MiB,), np.uint8)  # large pool, under 10 MiB: a 20 MiB segment, as torch's
    s3 = stratacl.memory_stats()
    del big
    released = stratacl.empty_cache()
    s4 = stratacl.memory_stats()
    mapped = "num_device_alloc"
    return (s0[mapped], s1[mapped], s2[mapped], s3[mapped], reused, released, s4["num_device_free"],
            s4["allocated_bytes.all.current"], bool((b == 0).all()))


def test_caching_allocator_maps_only_on_a_miss():
    (m0, m1, m2, m3, reused, released, rel, allocated, zeroed), = stratacl.spawn(caching, 1, allocator="caching")
    assert (m1 - m0, m2 - m1, m3 - m2) == (1, 0, 1)
    assert reused and zeroed
    assert released == 20 * MiB and rel == 1    # the 3 MiB request's 20 MiB segment went back
    assert allocated == 4096                     # the live 1000 x f32 block, rounded to 512 B


def out_of_memory(comm):
    keep = stratacl.empty((48 * MiB,), np.uint8)
    try:
        stratacl.empty((32 * MiB,), np.uint8)
    except stratacl.OutOfMemory as e:
        err = (isinstance(e, MemoryError), str(e))
    else:
        return None
    del keep
    again = stratacl.empty((32 * MiB,), np.uint8)   # works once memory is freed
    again[:] = 7
    x = stratacl.empty((4,), np.int32)
    x[:] = comm.rank
    comm.all_reduce(x)
    return err, int(again[-1]), x.tolist()


def test_out_of_hbm_is_a_memory_error_and_the_rank_recovers():
    for rank, res in enumerate(stratacl.spawn(out_of_memory, 2, hbm_size="64M")):
        assert res is not None, "allocation past capacity did not fail"
        (is_mem, msg), last, reduced = res
        assert is_mem
        assert f"rank {rank}: out of HBM allocating 32.0 MiB" in msg and "STRATACL_HBM_SIZE" in msg
        assert last == 7 and reduced == [1, 1, 1, 1]


def zero_copy(comm, count):
    n = comm.size
    x = stratacl.empty((count,), np.float32)
    x[:] = comm.rank
    out = stratacl.empty((n * count,), np.float32)
    comm.barrier()
    before = stratacl.stats()
    comm.all_gather(out, x)
    comm.all_reduce(x)
    after = stratacl.stats()
    hbm = {k: after[k] - before[k] for k in ("bytes_staged", "output_bytes_written", "bytes_pulled")}
    plain = np.full(count, comm.rank, np.float32)
    out2 = np.empty(n * count, np.float32)
    comm.all_gather(out2, plain)
    final = stratacl.stats()
    return hbm, final["bytes_staged"] - after["bytes_staged"], final["staged_calls"] - after["staged_calls"], \
        bool((out2 == np.repeat(np.arange(n, dtype=np.float32), count)).all())


@pytest.mark.parametrize("n", [2, 8])
def test_hbm_buffers_move_with_zero_staged_bytes_and_each_output_byte_written_once(n):
    count = 10_000
    for hbm, staged_plain, staged_calls, ok in stratacl.spawn(zero_copy, n, args=(count,)):
        assert hbm["bytes_staged"] == 0
        # all_gather writes n * count * 4 output bytes; all_reduce rewrites x (count * 4) once
        assert hbm["output_bytes_written"] == n * count * 4 + count * 4
        # pulled: all_gather reads the (n-1) peers' inputs; the full-mesh all_reduce reads (n-1)
        # of the n blocks of x from peers twice (reduce-scatter, then all_gather of the sums)
        per = count * 4
        assert count % n == 0
        assert hbm["bytes_pulled"] == (n - 1) * per + 2 * (n - 1) * (per // n)
        assert staged_plain == count * 4 and staged_calls == 1 and ok


def shadow(comm):
    """Rank 0 owns a buffer; everyone looks at it through its shared address."""
    me = comm.rank
    addr = np.zeros(1, np.int64)
    if me == 0:
        buf = stratacl.empty((300_000,), np.int32)   # large pool: a segment of its own
        buf[:256] = np.arange(256)
        addr[0] = buf.ctypes.data
    comm.broadcast(addr, root=0)
    a = int(addr[0])
    v = ub.view(a, (256,), np.int32)
    first = (v.ctypes.data == a, v.tolist() == list(range(256)))
    comm.barrier()
    if me == 0:
        buf[:256] = -np.arange(256)        # the owner writes after peers mapped it
    comm.barrier()
    later = v.tolist() == [-i for i in range(256)]
    errors = []
    for bad in (a + 1024 * 1024 * 1024, 0x10):   # inside rank 0's slice but unallocated; outside the window
        try:
            ub.view(bad, (4,), np.int32)
        except stratacl.RegistrationError as e:
            errors.append(type(e).__name__)
    comm.barrier()
    if me == 0:
        del buf
        stratacl.empty_cache()              # physical release: peers unmap in the background
    comm.barrier()
    try:
        ub.view(a, (256,), np.int32)
        released = "still mapped"
    except stratacl.RegistrationError as e:
        released = str(e)
    return first, later, errors, released


@pytest.mark.parametrize("registration", ["roa", "pool"])
def test_shadow_addressing_same_address_same_bytes_on_every_rank(registration):
    for rank, (first, later, errors, released) in enumerate(stratacl.spawn(shadow, 4, registration=registration,
                                                                           hbm_size="2G")):
        assert first == (True, True) and later
        if registration == "roa":
            assert errors == ["RegistrationError", "RegistrationError"]
            assert "no registration" in released
        else:
            # pool: the whole pre-registered region stays registered, allocated or not
            assert errors == ["RegistrationError"] and released == "still mapped"


def registration_counters(comm, rounds):
    """Allocate, leave the gap registration-on-allocation relies on, then use the buffer."""
    n, me = comm.size, comm.rank
    addrs = np.zeros(n, np.int64)
    comm.all_reduce(addrs, op="max")               # sets up the staging buffer used below
    out = []
    for i in range(rounds):
        x = stratacl.empty((1_100_000 + i,), np.uint8)   # large pool: a fresh segment every round
        x[:] = me
        addrs[:] = 0
        addrs[me] = x.ctypes.data
        comm.all_reduce(addrs, op="max")
        if stratacl.config.registration == "roa":
            for p in range(n):                     # the gap: wait until the metadata has arrived
                ub.view(int(addrs[p]), (16,), np.uint8)
        before = stratacl.stats()["registration"]
        o = np.empty(n * x.size, np.uint8)
        comm.all_gather(o, x)
        comm.all_gather(o, x)                      # warm: nothing left to register
        after = stratacl.stats()["registration"]
        out.append({k: after[k] - before[k] for k in ("registrations_in_operator", "ready_waits", "ready_checks")})
        del x
        stratacl.empty_cache()
    return out, stratacl.stats()["registration"]


@pytest.mark.parametrize("n", [4, 8])
def test_roa_keeps_registration_off_the_critical_path_and_jit_puts_it_on(n):
    for rounds, total in stratacl.spawn(registration_counters, n, args=(3,), registration="roa"):
        for r in rounds:
            assert r["registrations_in_operator"] == 0 and r["ready_waits"] == 0
            assert r["ready_checks"] == n - 1    # the purely local check ran once per peer segment
        assert total["background_maps"] >= 3 * (n - 1)     # every peer segment mapped by the thread
        assert total["background_unmaps"] >= 2 * (n - 1)
    for rounds, total in stratacl.spawn(registration_counters, n, args=(3,), registration="jit"):
        # first use maps each of the n-1 peers' new segments inside the operator, the second nothing
        assert all(r["registrations_in_operator"] == n - 1 for r in rounds)
        assert total["background_maps"] == 0


def use_before_registration(comm):
    """No gap at all: the operator maps what the background thread has not mapped yet."""
    x = stratacl.empty((1_200_000,), np.uint8)       # a segment of its own
    x[:] = comm.rank
    o = np.empty(comm.size * x.size, np.uint8)
    comm.all_gather(o, x)
    s = stratacl.stats()["registration"]
    ok = bool((o.reshape(comm.size, -1) == np.arange(comm.size, dtype=np.uint8)[:, None]).all())
    return ok, s["ready_waits"], s["registrations_in_operator"]


def test_roa_first_use_before_the_mapping_is_done_is_still_correct():
    for ok, waits, in_op in stratacl.spawn(use_before_registration, 8):
        assert ok
        # a late check maps in the operator, like jit (unless the thread got there in between)
        assert in_op <= waits <= 7


def churn(comm, iters):
    """Alloc/free/realloc under traffic: every iteration's data is new, no stale byte may appear."""
    n, me = comm.size, comm.rank
    wrong = 0
    keep = []
    for it in range(iters):
        size = 1000 + (it * 7919) % 400_000
        x = stratacl.empty((size,), np.uint16)
        x[:] = (it * 31 + me) % 65536
        out = stratacl.empty((n * size,), np.uint16) if it % 2 else np.empty(n * size, np.uint16)
        comm.all_gather(out, x)
        want = np.repeat((it * 31 + np.arange(n)) % 65536, size).astype(np.uint16)
        wrong += int((out != want).sum())
        if it % 3 == 0:
            keep.append(x)                 # some blocks live on, others go back to the cache
        if len(keep) > 4:
            keep.pop(0)
        del x, out
        if it % 4 == 3:
            stratacl.empty_cache()         # physical release -> peers unmap -> ranges reused
    return wrong, stratacl.memory_stats()["num_device_free"]


@pytest.mark.parametrize("settings", [dict(registration="roa"), dict(registration="jit"),
                                      dict(registration="pool", hbm_size="256M"), dict(metadata_path="relay")],
                         ids=["roa", "jit", "pool", "relay"])
@pytest.mark.slow
def test_alloc_free_realloc_under_traffic_never_reads_stale_data(settings):
    kwargs = dict(hbm_size="64M")
    kwargs.update(settings)
    for wrong, released in stratacl.spawn(churn, 4, args=(40,), **kwargs):
        assert wrong == 0
        assert released > 0
