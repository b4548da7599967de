"""One-sided programs (``stratacl.shmem``) every rank runs, each returning what it found wrong:
tests/test_shmem.py spawns them on one host, tests/scripts/hosts_onesided.py runs them on
emulated hosts (``far``: the world ranks on another host than the caller's; loads and stores
do not reach those, everything else does).

Every rank computes what every peer sent (``helpers.rank_data``), so each checks its own HBM
byte for byte. The ordering stress test is what the memory model promises: a receiver that
sees a signal move reads the data of every round the signal covers, each time, while its
sender races ahead as far as the receiver's credits allow.
"""
from __future__ import annotations

import numpy as np

import stratacl
from helpers import rank_data
from stratacl import shmem


def sizes(n):
    return [0, 1, 7, 1000, 65537] if n <= 8 else [0, 7, 1000]


def exact(comm, far=()):
    n, me = comm.size, comm.rank
    bad = []
    for dt in (np.uint8, np.float32, np.int64):
        for count in sizes(n):
            tag = f"{np.dtype(dt)}/{count}"
            rows = shmem.zeros((n, count), dt)
            # put: row `me` of every peer's array (self included) gets my data
            for pe in range(n):
                shmem.put(rows[me], rank_data(me, count, dt, "put" + tag + f"/{pe}"), pe)
            shmem.barrier_all()
            for src in range(n):
                if rows[src].tobytes() != rank_data(src, count, dt, "put" + tag + f"/{me}").tobytes():
                    bad.append(f"put {tag}: row from {src}")
            # get: every peer's row addressed to me, into plain numpy memory
            for pe in range(n):
                got = np.empty(count, dt)
                shmem.get(got, rows[pe], pe)
                if got.tobytes() != rank_data(pe, count, dt, "put" + tag + f"/{pe}").tobytes():
                    bad.append(f"get {tag}: from {pe}")
            shmem.barrier_all()
    # a sub-communicator: pe numbers its ranks
    sub = comm.split(me % 2, me)
    y = shmem.zeros(4, np.int64)          # symmetric over the world, so over any sub-communicator too
    if sub.size > 1:
        shmem.put(y, np.full(4, me, np.int64), (sub.rank + 1) % sub.size, comm=sub)
        shmem.barrier_all(comm=sub)
        left = sub.members[(sub.rank - 1) % sub.size]
        if y.tolist() != [left] * 4:
            bad.append(f"sub-communicator put: {y.tolist()} != {[left] * 4}")
    # peer_view and ptr name the same bytes; on another host neither reaches them (ptr: 0)
    z = shmem.zeros(8, np.int32)
    z[:] = me
    shmem.barrier_all()
    right = (me + 1) % n
    if right in far:
        bad += expect(lambda: shmem.peer_view(z, right), stratacl.OneSidedError, f"peer {right}", "another host",
                      "loads and stores do not cross hosts")
        if shmem.ptr(z, right) != 0:
            bad.append("ptr of a peer on another host is not 0")
    else:
        if shmem.peer_view(z, right).tolist() != [right] * 8:
            bad.append("peer_view")
        if stratacl.ub.view(shmem.ptr(z, right), (8,), np.int32).tolist() != [right] * 8:
            bad.append("ptr")
    shmem.barrier_all()
    # allocations that differ between ranks: a symmetric pad is refused on every rank, one made
    # with symmetric=False exchanges its addresses and works
    keep = stratacl.empty(1000 * (me + 1), np.uint8)       # noqa: F841  (held: the offsets differ)
    try:
        shmem.signal_pad(1)
        bad.append("an asymmetric signal pad was accepted")
    except stratacl.OneSidedError as e:
        if "not symmetric" not in str(e):
            bad.append(f"asymmetric pad: {e}")
    sig = shmem.signal_pad(1, symmetric=False)
    shmem.put_signal(sig[:0], sig[:0], sig[0:1], me + 1, shmem.SIGNAL_SET, right)
    if shmem.wait_until(sig[0:1], shmem.CMP_EQ, (me - 1) % n + 1) != (me - 1) % n + 1:
        bad.append("signal through a non-symmetric pad")
    if shmem.atomic_fetch(sig[0:1] if right in far else shmem.ptr(sig, right), right) != me + 1:
        bad.append("atomic on a non-symmetric pad's word")
    shmem.barrier_all()
    return bad


def pattern(src: int, rnd: int, count: int) -> np.ndarray:
    return (np.arange(count, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(src * 1_000_003 + rnd)


def ring_race(comm, rounds, slots, count):
    """Every rank streams `rounds` rounds to its right neighbour through `slots` data slots,
    signalling each round; the receiver checks, every time the signal moves, the data of every
    round it moved over, then hands the slots back (credits)."""
    n, me = comm.size, comm.rank
    right, left = (me + 1) % n, (me - 1) % n
    data = shmem.zeros((slots, count), np.uint64)
    sig = shmem.signal_pad(2)            # [0]: rounds arrived from the left; [1]: credits from the right
    arrived, credit = sig[0:1], sig[1:2]
    bad, moves, seen, sent = [], 0, 0, 0
    while seen < rounds or sent < rounds:
        # send what the credits allow
        while sent < rounds and sent + 1 - slots <= int(credit[0]):
            sent += 1
            shmem.put_signal(data[sent % slots], pattern(me, sent, count), arrived, sent, shmem.SIGNAL_SET, right)
        if seen < rounds:
            v = shmem.wait_until(arrived, shmem.CMP_GT, seen)
            moves += 1
            for r in range(seen + 1, v + 1):
                if not np.array_equal(data[r % slots], pattern(left, r, count)):
                    bad.append(f"round {r} from {left}: data not visible with its signal {v}")
            seen = v
            shmem.atomic_set(credit, seen, left)       # a pad word: a signal too (wakes the sender)
        elif sent < rounds:
            shmem.wait_until(credit, shmem.CMP_GE, sent + 1 - slots)
    shmem.barrier_all()
    return bad, moves


def fan_in(comm, rounds, count):
    """Every rank put_signals (SIGNAL_ADD) into rank 0's slot for it, racing; rank 0 checks all
    slots once the count covers everyone, each round."""
    n, me = comm.size, comm.rank
    slots = shmem.zeros((n, count), np.uint64)
    sig = shmem.signal_pad(1)
    bad = []
    for r in range(1, rounds + 1):
        shmem.put_signal(slots[me], pattern(me, r, count), sig[0:1], 1, shmem.SIGNAL_ADD, 0)
        if me == 0:
            shmem.wait_until(sig[0:1], shmem.CMP_GE, n * r)
            bad += [f"round {r}: slot {s}" for s in range(n) if not np.array_equal(slots[s], pattern(s, r, count))]
        shmem.barrier_all()
    return bad


def stress(comm, rounds, slots, count, fan_rounds):
    bad, moves = ring_race(comm, rounds, slots, count)
    return bad + fan_in(comm, fan_rounds, count), moves


def atomics(comm, k):
    n, me = comm.size, comm.rank
    words = shmem.zeros(2, np.uint64)
    olds = [shmem.atomic_fetch_add(words[0:1], 1, 0) for _ in range(k)]
    target = n - 1
    for _ in range(k):                     # an increment made of compare_swap retries
        seen = shmem.atomic_fetch(words[1:2], target)
        while True:
            got = shmem.atomic_compare_swap(words[1:2], seen, seen + 1, target)
            if got == seen:
                break
            seen = got
    shmem.barrier_all()
    return olds, int(words[0]) if me == 0 else None, int(words[1]) if me == target else None


def clock(comm, nbytes, fars):
    """Rank 0 puts and put_signals to each of `fars` in turn; returns what both clocks did, and
    the tier between them, per far rank."""
    me = comm.rank
    x = shmem.zeros(nbytes, np.uint8)
    sig = shmem.signal_pad(len(fars))
    src = np.ones(nbytes, np.uint8)
    outs = []
    for i, far in enumerate(fars):
        out = {}
        if me == 0:
            t0 = comm.clock()
            shmem.put(x, src, far)
            t1 = comm.clock()
            shmem.quiet()
            t2 = comm.clock()
            shmem.put_signal(x, src, sig[i:i + 1], 1, shmem.SIGNAL_SET, far)
            t3 = comm.clock()
            out = dict(put=t1 - t0, quiet=t2 - t1, sent=t3)
        elif me == far:
            before = comm.clock()
            shmem.wait_until(sig[i:i + 1], shmem.CMP_EQ, 1)
            out = dict(before=before, after=comm.clock())
        tier = comm.topology.tier(0, far)
        out.update(latency=tier.latency_us * 1e-6, flag=comm.topology.contention.flag_us * 1e-6)
        outs.append(out)
        shmem.barrier_all()
    return outs


def expect(fn, kind, *parts):
    try:
        fn()
    except kind as e:
        msg = str(e)
        missing = [p for p in parts if p not in msg]
        return [] if not missing else [f"{kind.__name__} message {msg!r} lacks {missing}"]
    except Exception as e:      # noqa: BLE001
        return [f"expected {kind.__name__}, got {type(e).__name__}: {e}"]
    return [f"expected {kind.__name__}, nothing raised"]


def errors(comm, far=()):
    n, me = comm.size, comm.rank
    right = (me + 1) % n
    x = shmem.zeros(64, np.uint64)
    sig = shmem.signal_pad(1)
    x[:] = 1000 + me
    shmem.barrier_all()
    bad = []
    E = stratacl.OneSidedError
    src = np.arange(64, dtype=np.uint64)
    # a peer out of range
    bad += expect(lambda: shmem.put(x, src, n), E, f"peer {n}", "out of range", "shmem.put", "for address 0x")
    bad += expect(lambda: shmem.get(np.empty(4, np.uint64), x, -1), E, "peer -1", "shmem.get")
    # an address no registered range of the peer holds
    hole = stratacl.runtime.address_of(x) - 2 * stratacl.config.hbm_size     # in my slice (4 x HBM), unmapped
    unknown = "not inside a symmetric object" if right in far else "not inside a registered"
    bad += expect(lambda: shmem.put(hole, src, right), E, f"peer {right}", unknown)
    bad += expect(lambda: shmem.atomic_fetch_add(hole, 1, right), E, f"peer {right}", unknown)
    try:
        shmem.put(hole, src, right)
    except E as e:
        if (e.operation, e.peer) != ("shmem.put", right) or e.address is None or f"{e.address:#x}" not in str(e):
            bad.append(f"attributes: {(e.operation, e.peer, e.address)}")
    # memory that is not this rank's HBM cannot be registered (refused on every rank, before
    # the collective)
    bad += expect(lambda: shmem.buffer_register(np.zeros(8)), E, "not one allocation of this rank's HBM",
                  "shmem.buffer_register")
    # too many bytes for the destination array
    bad += expect(lambda: shmem.put(x[:8], src, right), ValueError, "do not fit")
    # misaligned and mistyped atomics
    bad += expect(lambda: shmem.atomic_fetch_add(stratacl.runtime.address_of(x) + 4, 1, right), E, "aligned",
                   f"peer {right}")
    bad += expect(lambda: shmem.atomic_compare_swap(x.view(np.uint32)[:2], 0, 1, right), E, "64-bit")
    # a signal that is no signal pad's word; put_signal writes nothing then
    bad += expect(lambda: shmem.put_signal(x, src, x[0:1], 1, shmem.SIGNAL_SET, right), E, "signal pad")
    bad += expect(lambda: shmem.put_signal(x, src, sig[0:1], 1, "xor", right), ValueError, "sig_op")
    # a wait that times out, naming the word and (once there is one) the last signaller
    bad += expect(lambda: shmem.wait_until(sig[0:1], shmem.CMP_EQ, 7, timeout=0.2), stratacl.SignalTimeout,
                   "never updated", f"{stratacl.runtime.address_of(sig):#x}")
    shmem.barrier_all()
    shmem.put_signal(x[:0], src[:0], sig[0:1], 3, shmem.SIGNAL_SET, right)
    shmem.barrier_all()
    left = (me - 1) % n
    try:
        shmem.wait_until(sig[0:1], shmem.CMP_EQ, 7, timeout=0.2)
        bad.append("no timeout")
    except stratacl.SignalTimeout as e:
        if e.peer != left or f"last updated by peer {left}" not in str(e) or "holds 3" not in str(e):
            bad.append(f"timeout names {e.peer}: {e}")
    shmem.barrier_all()
    # none of the refused calls wrote anything: every rank's array is as it was
    if x.tolist() != [1000 + me] * 64:
        bad.append(f"memory changed: {x[:4]}...")
    return bad
