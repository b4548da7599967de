"""The expandable allocator: chunks mapped as pools grow, each registered on its own; blocks that
straddle chunks; churn under traffic; out of memory; the pools' invariants."""
from __future__ import annotations

import numpy as np
import pytest

import stratacl
from stratacl import ub
from helpers import ranks

KiB, MiB = 1024, 1024 * 1024
CHUNK = 64 * KiB                 # small chunks: blocks straddle several without using much memory


def _runtime():
    return stratacl.runtime._world._RUNTIME


def _registration(a: np.ndarray):
    return _runtime().own_segment(a.ctypes.data, a.nbytes)


def _pattern(rank: int, step: int, n: int, dtype=np.uint32) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + rank * 40503 + step * 7919) % 2**32).astype(dtype)


def fresh_chunks(comm, registration: str):
    """Blocks in chunks mapped just before the collective that reads them, one of them
    straddling a chunk peers had already mapped and chunks mapped afterwards."""
    n, me = comm.size, comm.rank
    staged0 = stratacl.stats()["bytes_staged"]
    first = stratacl.empty((10 * KiB // 4,), np.uint32)          # the small pool
    head = stratacl.empty((1320 * KiB // 4,), np.uint32)          # the large pool: chunks 0..20, 24 KiB free
    head[:] = _pattern(me, 0, head.size)
    out = np.empty((n * head.size,), np.uint32)
    comm.all_gather(out, head)                                     # peers map head's chunks
    ok = [bool((out.reshape(n, -1) == np.stack([_pattern(r, 0, head.size) for r in range(n)])).all())]
    # head ends inside a chunk: the next block starts in it and runs into chunks mapped now
    s0 = stratacl.memory_stats()
    grow = stratacl.empty((1048 * KiB // 4,), np.uint32)         # 24 KiB of chunk 20, then 21..36
    s1 = stratacl.memory_stats()
    new_chunks = s1["num_device_alloc"] - s0["num_device_alloc"]
    reg = _registration(grow)
    straddles = (reg.va < grow.ctypes.data and reg.size > CHUNK and type(reg).__name__ == "ChunkRange"
                 and reg.va <= grow.ctypes.data and grow.ctypes.data + grow.nbytes <= reg.va + reg.size)
    shares_old_chunk = (grow.ctypes.data - reg.va) // CHUNK == 0 and reg.va < head.ctypes.data + head.nbytes
    grow[:] = _pattern(me, 1, grow.size)
    out2 = stratacl.empty((n * grow.size,), np.uint32)
    comm.all_gather(out2, grow)                                    # no gap: first use right away
    want = np.stack([_pattern(r, 1, grow.size) for r in range(n)])
    ok.append(bool((out2.reshape(n, -1) == want).all()))
    red = grow.astype(np.uint64)
    comm.all_reduce(grow)
    ok.append(bool((grow == want.astype(np.uint32).sum(axis=0, dtype=np.uint32)).all()))
    grow[:] = red.astype(np.uint32)
    root = n - 1
    b = stratacl.empty((grow.size,), np.uint32)
    b[:] = grow if me == root else 0
    comm.broadcast(b, root=root)
    ok.append(bool((b == _pattern(root, 1, b.size)).all()))
    staged = stratacl.stats()["bytes_staged"] - staged0
    # every rank reads every peer's straddling block at its shared address
    addrs = np.zeros(n, np.int64)
    mine = np.array([grow.ctypes.data], np.int64)
    comm.all_gather(addrs, mine)
    views = []
    for p in range(n):
        v = ub.view(int(addrs[p]), (grow.size,), np.uint32)
        views.append(v.ctypes.data == int(addrs[p]) and bool((v == _pattern(p, 1, grow.size)).all()))
    comm.barrier()
    del first
    return ok, views, bool(straddles), bool(shares_old_chunk), new_chunks, staged


@pytest.mark.parametrize("n", ranks(1, 2, 3, 8, slow_from=8))
@pytest.mark.parametrize("registration", ["roa", "jit"])
def test_blocks_in_freshly_mapped_chunks_are_zero_copy_and_exact(n, registration):
    for rank, (ok, views, straddles, shares, new_chunks, staged) in enumerate(stratacl.spawn(
            fresh_chunks, n, args=(registration,), registration=registration, chunk_size=CHUNK, hbm_size="256M")):
        assert ok == [True] * 4, (rank, ok)
        assert views == [True] * n, (rank, views)
        assert straddles and shares, rank        # the block spans an old chunk and new ones
        assert new_chunks == 16, rank            # the 24 KiB left in head's last chunk, then 16 new ones
        assert staged == 0, rank


def growth_registrations(comm):
    """Each chunk mapped is one registration; peers map it on its own."""
    n, me = comm.size, comm.rank
    s0 = stratacl.memory_stats()
    x = stratacl.empty((5 * CHUNK,), np.uint8)     # five chunks, one growth
    s1 = stratacl.memory_stats()
    x[:] = me + 1
    addrs = np.zeros(n, np.int64)
    comm.all_gather(addrs, np.array([x.ctypes.data], np.int64))
    ub.wait_registered()                         # the gap: every peer's five chunks are mapped here
    reg = stratacl.stats()["registration"]
    maps_before = reg["background_maps"]
    out = np.empty(n * x.size, np.uint8)
    comm.all_gather(out, x)
    after = stratacl.stats()["registration"]
    del x
    comm.barrier()
    released = stratacl.empty_cache()
    s2 = stratacl.memory_stats()
    return (s1["num_registrations"] - s0["num_registrations"], s1["num_chunk_registrations"] - s0["num_chunk_registrations"],
            s1["registered_bytes.all.current"] - s0["registered_bytes.all.current"],
            maps_before, after["registrations_in_operator"] - reg["registrations_in_operator"],
            bool((out.reshape(n, -1) == (np.arange(n) + 1)[:, None]).all()),
            released, s2["num_deregistrations"] - s0["num_deregistrations"])


def test_each_chunk_mapped_is_a_registration_of_its_own():
    n = 4
    for regs, chunk_regs, nbytes, maps, in_op, ok, released, deregs in stratacl.spawn(
            growth_registrations, n, chunk_size=CHUNK, hbm_size="64M"):
        assert regs == chunk_regs == 5 and nbytes == 5 * CHUNK
        assert maps >= 5 * (n - 1)               # every peer's chunks, each mapped by itself
        assert in_op == 0 and ok                 # roa: nothing left to map in the operator
        assert released == 5 * CHUNK and deregs == 5


def churn(comm, iters: int, seed: int):
    """Grow, shrink and empty_cache under traffic: blocks of random sizes (straddling chunks),
    some kept, most freed, the cache emptied often so chunks are unmapped and mapped again at
    the same addresses with new contents. Every byte read is checked."""
    n, me = comm.size, comm.rank
    rng = np.random.default_rng(seed)              # the same sizes on every rank
    wrong = 0
    keep: list[tuple[np.ndarray, int]] = []
    addrs = np.zeros(n, np.int64)
    for it in range(iters):
        count = int(rng.integers(1, 400 * KiB))    # both pools; outputs up to 3.2 MB
        x = stratacl.empty((count,), np.uint16)
        x[:] = _pattern(me, it, count, np.uint16)
        out = stratacl.empty((n * count,), np.uint16) if it % 2 else np.empty(n * count, np.uint16)
        comm.all_gather(out, x)
        want = np.stack([_pattern(r, it, count, np.uint16) for r in range(n)])
        wrong += int((out.reshape(n, -1) != want).sum())
        # read one peer's newest block through its shared address too
        comm.all_gather(addrs, np.array([x.ctypes.data], np.int64))
        p = (me + 1 + it) % n
        v = ub.view(int(addrs[p]), (count,), np.uint16)   # jit: mapped by the all_gather's first use
        wrong += int((v != want[p]).sum())
        del v
        comm.barrier()                             # the owner frees its block only once read
        # kept blocks, whose neighbours come and go, still read right
        if keep:
            y, step = keep[it % len(keep)]
            o = np.empty(n * y.size, np.uint16)
            comm.all_gather(o, y)
            wrong += int((o.reshape(n, -1) != np.stack([_pattern(r, step, y.size, np.uint16)
                                                         for r in range(n)])).sum())
        if rng.random() < 0.3:
            keep.append((x, it))
        if len(keep) > 5:
            keep.pop(int(rng.integers(0, len(keep))))
        del x, out
        if rng.random() < 0.4:
            stratacl.empty_cache()
    s = stratacl.memory_stats()
    if _runtime().allocator.kind == "expandable":
        _runtime().allocator.check()
    return wrong, s["num_device_free"], s["num_device_alloc"]


@pytest.mark.parametrize("settings", [dict(registration="roa"), dict(registration="jit"),
                                      dict(registration="pool", hbm_size="256M"), dict(metadata_path="relay"),
                                      dict(registration="roa", chunk_size="2M")],
                         ids=["roa", "jit", "pool", "relay", "roa-2M"])
@pytest.mark.slow
def test_grow_shrink_empty_cache_under_traffic_never_reads_a_stale_byte(settings):
    kwargs = dict(hbm_size="64M", chunk_size=CHUNK)
    kwargs.update(settings)
    for wrong, unmapped, mapped in stratacl.spawn(churn, 4, args=(60, 11), **kwargs):
        assert wrong == 0
        assert unmapped > 0 and mapped > unmapped


def out_of_memory(comm):
    """Fill HBM with blocks of mixed sizes until an allocation cannot be mapped, then free and
    keep working."""
    held, err = [], None
    s0 = stratacl.memory_stats()
    try:
        for i in range(10_000):
            held.append(stratacl.empty(((i % 7 + 1) * 700 * KiB,), np.uint8))
    except stratacl.OutOfMemory as e:
        err = e
    s1 = stratacl.memory_stats()
    near_full = s1["reserved_bytes.all.current"] >= _runtime().hbm.capacity - 8 * MiB
    del held[::2]
    x = stratacl.empty((3 * MiB,), np.uint8)        # fits in what the frees gave back
    x[:] = comm.rank + 1
    held.clear()
    out = stratacl.empty((comm.size * x.size,), np.uint8)
    comm.all_gather(out, x)
    ok = bool((out.reshape(comm.size, -1) == (np.arange(comm.size) + 1)[:, None]).all())
    _runtime().allocator.check()
    return (type(err).__name__, isinstance(err, MemoryError), str(err), near_full, ok,
            s1["num_ooms"] - s0["num_ooms"], s1["num_alloc_retries"] - s0["num_alloc_retries"])


def test_an_allocation_that_cannot_be_mapped_is_out_of_memory_and_the_rank_recovers():
    for rank, (kind, is_mem, msg, near_full, ok, ooms, retries) in enumerate(
            stratacl.spawn(out_of_memory, 2, hbm_size="64M", chunk_size=CHUNK)):
        assert kind == "OutOfMemory" and is_mem
        assert msg.startswith(f"rank {rank}: out of HBM allocating ") and "STRATACL_HBM_SIZE" in msg
        assert "held by live arrays" in msg and "awaiting peers" in msg
        assert near_full and ok
        assert ooms == 1 and retries >= 1


def invariants(comm, steps: int, seed: int):
    """Random malloc / free / empty_cache in one rank; after every step the pools tile their
    ranges, the statistics equal a recount, and descriptors name exactly the chunks a block covers."""
    rt = _runtime()
    a = rt.allocator
    rng = np.random.default_rng(seed)
    live: list[np.ndarray] = []
    chunk = a.chunk
    s0 = stratacl.memory_stats()                  # the communicator's own buffers
    for step in range(steps):
        r = rng.random()
        if r < 0.55 or not live:
            big = rng.random() < 0.4
            nbytes = int(rng.integers(1, 8 * chunk if big else 4 * KiB))
            live.append(stratacl.empty((nbytes,), np.uint8))
            live[-1][[0, -1]] = 1                 # the block's first and last byte are mapped
        elif r < 0.95:
            live.pop(int(rng.integers(0, len(live))))
        else:
            stratacl.empty_cache()
        a.check()
        s = stratacl.memory_stats()
        blocks = [hbm_block(x) for x in live]
        for key, want in (("allocated_bytes", sum(b.size for b in blocks)),
                          ("requested_bytes", sum(x.nbytes for x in live)), ("allocation", len(live))):
            assert s[f"{key}.all.current"] - s0[f"{key}.all.current"] == want, key
        assert s["reserved_bytes.all.current"] == s["mapping.all.current"] * chunk
        assert s["registered_bytes.all.current"] == s["reserved_bytes.all.current"]
        for b in blocks:
            reg = b.seg
            assert reg.va <= b.va and b.va + b.size <= reg.va + reg.size
            assert reg.va % chunk == 0 and reg.size % chunk == 0
            assert reg.va + chunk > b.va and b.va + b.size > reg.va + reg.size - chunk   # no extra chunk
        # non-releasable: free bytes sharing a chunk with a live block
        before = s["reserved_bytes.all.current"]
        if step % 50 == 49:
            released = stratacl.empty_cache()
            s2 = stratacl.memory_stats()
            assert s2["reserved_bytes.all.current"] == before - released
            assert s2["inactive_split_bytes.all.current"] == (s2["reserved_bytes.all.current"]
                                                              - s2["allocated_bytes.all.current"])
    return True


def hbm_block(a: np.ndarray):
    from stratacl.runtime.memory import hbm_base
    return hbm_base(a).block


def test_the_pools_keep_their_invariants_through_random_traffic():
    assert stratacl.spawn(invariants, 1, args=(600, 5), chunk_size=CHUNK, hbm_size="32M") == [True]


def pool_mode(comm):
    a = _runtime().allocator
    x = stratacl.empty((3 * MiB,), np.uint8)
    return a.kind, stratacl.memory_stats()["registered_bytes.all.current"], "caching" in stratacl.memory_summary(), \
        _registration(x).size


def test_pool_keeps_the_caching_allocator_and_everything_registered():
    for kind, registered, summary, seg in stratacl.spawn(pool_mode, 2, registration="pool", hbm_size="128M"):
        assert kind == "caching" and registered == 128 * MiB and summary
        assert seg == 20 * MiB                   # a fixed segment, as torch sizes it


def test_chunk_size_must_be_a_multiple_of_4k():
    with pytest.raises(stratacl.ConfigError, match="STRATACL_CHUNK_SIZE='3000'.*multiple of 4K"):
        stratacl.Config({"STRATACL_CHUNK_SIZE": "3000"})
    assert stratacl.Config({"STRATACL_CHUNK_SIZE": "64K"}).chunk_size == 64 * KiB
    assert stratacl.Config({}).allocator == "expandable" and stratacl.Config({}).chunk_size == 2 * MiB



def inside_a_mapped_run(comm):
    """Under jit, a block inside one chunk of a run of chunks every peer has mapped is found
    there, as a registration cache finds a buffer inside a range it registered: its chunk was
    mapped with the run and is named no later, so nothing is mapped (modeled time: a warm
    call's). A block over a new run of two of those chunks is a registration of its own: its
    name is newer than the run's, and descriptors do not say whether its chunks were remapped
    in between."""
    n, me = comm.size, comm.rank

    def timed_all_gather(x):
        out = np.empty((n * x.size,), x.dtype)
        t0 = comm.clock()
        comm.all_gather(out, x)
        ok = bool((out.reshape(n, -1) == np.stack([_pattern(r, x.size, x.size) for r in range(n)])).all())
        return comm.clock() - t0, ok

    big = stratacl.empty((3 * CHUNK // 4 - 1024,), np.uint32)     # over three chunks: a run of its own
    big[:] = _pattern(me, big.size, big.size)
    run = _registration(big)
    first, ok0 = timed_all_gather(big)                           # every peer maps the run
    warm, ok1 = timed_all_gather(big)
    del big
    part = stratacl.empty((3 * CHUNK // 8,), np.uint32)          # over two of its chunks
    lone = stratacl.empty((3 * CHUNK // 32,), np.uint32)         # next to it, inside one chunk (not eager)
    part[:], lone[:] = _pattern(me, part.size, part.size), _pattern(me, lone.size, lone.size)
    part_reg, lone_reg = _registration(part), _registration(lone)
    placed = (type(run).__name__ == type(part_reg).__name__ == "ChunkRange" and type(lone_reg).__name__ == "Chunk"
              and run.va <= part_reg.va and part_reg.va + part_reg.size <= run.va + run.size
              and part_reg.size == 2 * CHUNK < run.size and part_reg.epoch > run.epoch >= lone_reg.epoch
              and run.va <= lone.ctypes.data and lone.ctypes.data + lone.nbytes <= run.va + run.size)
    part_time, ok2 = timed_all_gather(part)
    part_warm, _ = timed_all_gather(part)
    lone_time, ok3 = timed_all_gather(lone)
    lone_warm, _ = timed_all_gather(lone)
    return placed, ok0 and ok1 and ok2 and ok3, first - warm, part_time - part_warm, lone_time - lone_warm


def test_jit_finds_a_block_inside_a_chunk_of_a_run_its_peers_mapped():
    n = 4
    map_us = ub.load_topology("cm384").contention.registration_fixed_us    # one peer registration
    for placed, ok, first, part, lone in stratacl.spawn(inside_a_mapped_run, n, registration="jit", clock="virtual",
                                                        chunk_size=CHUNK, hbm_size="64M", timeout=120):
        assert placed and ok
        assert first * 1e6 >= (n - 1) * map_us           # the run's first read maps it from every peer
        assert part * 1e6 >= (n - 1) * map_us            # a new run inside it: mapped again
        assert abs(lone) < 1e-9                          # a chunk of it: nothing mapped
