"""Every collective of the world communicator once, each result checked exactly on this rank,
the modeled clock after each, and which HBM segments this rank mapped. One report per rank
(tests/test_emulated_hosts.py runs it on one host and on emulated hosts)."""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import emit, failure_record  # noqa: E402

import stratacl  # noqa: E402
from stratacl import fabric, shmem  # noqa: E402
from stratacl.runtime import _world  # noqa: E402

comm = stratacl.init()
n, me = comm.size, comm.rank
checks: dict[str, bool] = {}
# a symmetric object, first (symmetric: the same offset on every rank, which the allocations
# the cases below make and free in their own order could change)
buf = stratacl.empty((4,), np.float32)
sym = shmem.zeros((4,), np.float32)
clocks: dict[str, float] = {}


def case(name, run):
    try:
        checks[name] = bool(run())
    except Exception as e:          # noqa: BLE001 -- reported, the test names what failed
        checks[name] = f"{type(e).__name__}: {e}"
    clocks[name] = comm.clock()


def all_reduce_large():
    x = stratacl.empty((1 << 16,), np.float32)
    x[:] = np.arange(x.size, dtype=np.float32) % 13 + me
    comm.all_reduce(x)
    return (x == (np.arange(x.size, dtype=np.float32) % 13) * n + n * (n - 1) / 2).all()


def all_reduce_small(op):
    x = stratacl.empty((16,), np.float64)
    x[:] = me + 1
    comm.all_reduce(x, op=op)
    return (x == {"sum": n * (n + 1) / 2, "max": n, "avg": (n + 1) / 2}[op]).all()


def all_gather(part):
    x = stratacl.empty((part,), np.int64)
    x[:] = me * 1000 + np.arange(part)
    out = stratacl.empty((n * part,), np.int64)
    comm.all_gather(out, x)
    return (out.reshape(n, part) == np.arange(n)[:, None] * 1000 + np.arange(part)).all()


def reduce_scatter():
    x = stratacl.empty((n * 4096,), np.float32)
    x[:] = np.arange(x.size) % 7 + me
    out = stratacl.empty((4096,), np.float32)
    comm.reduce_scatter(out, x)
    return (out == (np.arange(me * 4096, (me + 1) * 4096) % 7) * n + n * (n - 1) / 2).all()


def broadcast(root):
    x = stratacl.empty((50000,), np.float64)
    x[:] = np.arange(x.size) + me
    comm.broadcast(x, root)
    return (x == np.arange(x.size) + root).all()


def all_to_all():
    x = stratacl.empty((n * 300,), np.int32)
    x[:] = me * 100 + np.repeat(np.arange(n), 300)
    out = stratacl.empty((n * 300,), np.int32)
    comm.all_to_all(out, x)
    return (out == np.repeat(np.arange(n) * 100 + me, 300)).all()


case("all_reduce 256 KiB", all_reduce_large)


def all_reduce_eager_chunks():
    # 16 KiB on 8 ranks: the eager path reducing by chunks (each member leaves its reduced
    # chunk in its eager slot, after its copy, for the others to gather)
    x = stratacl.empty((4096,), np.float32)
    x[:] = np.arange(4096) % 11 + me
    comm.all_reduce(x)
    return (x == (np.arange(4096) % 11) * n + n * (n - 1) / 2).all()


case("all_reduce 16 KiB (eager, by chunks)", all_reduce_eager_chunks)
for op in ("sum", "max", "avg"):
    case(f"all_reduce 128 B {op}", lambda op=op: all_reduce_small(op))
case("all_gather 8 B", lambda: all_gather(1))
case("all_gather 64 KiB", lambda: all_gather(8192))
case("reduce_scatter", reduce_scatter)
case("broadcast root 0", lambda: broadcast(0))
case("broadcast root n-1", lambda: broadcast(n - 1))
case("all_to_all", all_to_all)


def reduce(root):
    # twice on the same arrays: the second call is the prepared one (replayed natively)
    x = stratacl.empty((20000,), np.float32)
    out = stratacl.empty((20000,), np.float32)
    ok = True
    for k in range(2):
        x[:] = np.arange(x.size) % 13 + me + k
        out[:] = -1
        comm.reduce(out, x, "sum", root)
        ok &= (out == ((np.arange(x.size) % 13 + k) * n + n * (n - 1) / 2 if me == root else -1)).all()
    return bool(ok)


case("reduce root 0", lambda: reduce(0))
case("reduce root n-1", lambda: reduce(n - 1))


def rooted(op, root):
    # gather and scatter: the operators on the call pipeline alone (no native mesh machine)
    x = stratacl.empty((1500,), np.float32)
    x[:] = np.arange(1500) % 7 + me
    whole = stratacl.empty((n * 1500,), np.float32)
    if op == "gather":
        comm.gather(whole if me == root else None, x, root)
        return me != root or (whole.reshape(n, -1) == np.arange(1500) % 7 + np.arange(n)[:, None]).all()
    if op == "scatter":
        whole[:] = np.arange(n * 1500) % 5 + me
        comm.scatter(x, whole if me == root else None, root)
        return (x == np.arange(me * 1500, (me + 1) * 1500) % 5 + root).all()


def all_to_all_v():
    sends = np.array([[(i + 2 * j) % 5 for j in range(n)] for i in range(n)]) * 50
    x = stratacl.empty((int(sends[me].sum()),), np.int32)
    x[:] = me * 1000 + np.repeat(np.arange(n), sends[me])
    out = stratacl.empty((int(sends[:, me].sum()),), np.int32)
    comm.all_to_all_v(out, x, sends[me], sends[:, me])
    return (out == np.repeat(np.arange(n) * 1000 + me, sends[:, me])).all()


case("gather root n-1", lambda: rooted("gather", n - 1))
case("scatter root 0", lambda: rooted("scatter", 0))
case("all_to_all_v", all_to_all_v)
case("barrier", lambda: comm.barrier() or True)


def send_recv_far():
    far = (me + n // 2) % n                  # a rank on the other host of two
    x = stratacl.empty((30000,), np.float32)
    y = stratacl.empty((30000,), np.float32)
    good = True
    for rep in range(2):
        x[:] = me + 100 * rep
        if me < n // 2:
            comm.send(x, far)
            comm.recv(y, far)
        else:
            comm.recv(y, far)
            comm.send(x, far)
        good &= bool((y == far + 100 * rep).all())
    return good


def sendrecv_ring(plain):
    right, left = (me + 1) % n, (me - 1) % n
    x = (np.arange(777, dtype=np.float64) if plain else stratacl.empty((777,), np.float64))
    x[:] = np.arange(777) * n + me
    y = np.zeros(777) if plain else stratacl.empty((777,), np.float64)
    comm.sendrecv(x, right, y, left)
    return (y == np.arange(777) * n + left).all()


def split_across_hosts():
    sub = comm.split(me % 2)                # every other rank: spans the hosts
    x = stratacl.empty((3000,), np.float32)
    x[:] = me
    sub.all_reduce(x)
    same = [r for r in range(n) if r % 2 == me % 2]
    out = stratacl.empty((sub.size * 7,), np.int64)
    y = stratacl.empty((7,), np.int64)
    y[:] = me
    sub.all_gather(out, y)
    again = comm.split(0)                   # every rank, in slots of its own
    z = stratacl.empty((5,), np.float64)
    z[:] = me
    again.all_reduce(z)
    return ((x == sum(same)).all() and (out.reshape(sub.size, 7) == np.array(same)[:, None]).all()
            and (z == n * (n - 1) / 2).all())


def p2p_on_a_split(plain):
    # a new communicator's first call is a send across hosts: nothing on it before
    half = comm.split(me % 2)               # ranks r, r + 2, ...: half.rank + 2 is on the other host of two
    peer = (half.rank + half.size // 2) % half.size
    x = (np.zeros if plain else stratacl.empty)((1000,), np.int32)
    x[:] = np.arange(1000) + 1000 * me
    y = (np.zeros if plain else stratacl.empty)((1000,), np.int32)
    if half.rank < half.size // 2:
        half.send(x, peer)
        half.recv(y, peer)
    else:
        half.recv(y, peer)
        half.send(x, peer)
    right, left = (half.rank + 1) % half.size, (half.rank - 1) % half.size
    z = (np.zeros if plain else stratacl.empty)((1000,), np.int32)
    half.sendrecv(x, right, z, left)
    return ((y == np.arange(1000) + 1000 * half.members[peer]).all()
            and (z == np.arange(1000) + 1000 * half.members[left]).all())


def user_slice_map():
    # a one-shot all_reduce of the user's own (stratacl.fabric): every peer's src reduced;
    # under a modeled clock every member's traffic block is read too
    x = stratacl.empty((3000,), np.float32)
    x[:] = np.arange(3000) % 5 + me
    out = stratacl.empty((3000,), np.float32)
    smap = fabric.SliceMap()
    for p in range(n):
        smap.reduce(p, x.nbytes)
    fabric.run(comm, smap, src=x, dst=out)
    return (out == (np.arange(3000) % 5) * n + n * (n - 1) / 2).all()


def user_slice_map_stores():
    # push mode (stratacl.fabric stores): phase 0 an all_gather, each rank storing its chunk into
    # every rank's dst, phase 1 an all_to_all, each storing block p of its src into rank p's;
    # across hosts half the stores land in mirrors, which the carrier puts back. dst spans
    # more than one 2 MiB chunk, and its tail is stored into by nobody: it must stay as it was
    c = 40960
    src = stratacl.empty(((1 + n) * c,), np.int32)
    src[:c] = me * 10**6 + np.arange(c)
    src[c:] = ((me * n + np.arange(n)[:, None]) * 100000 + np.arange(c)).reshape(-1)
    dst = stratacl.empty((2 * n * c + 1024,), np.int32)
    dst[:] = -1
    smap = fabric.SliceMap()
    for p in range(n):
        smap.store(p, 4 * c, src_offset=0, dst_offset=4 * me * c)
    smap.barrier()
    for p in range(n):
        smap.store(p, 4 * c, src_offset=4 * (1 + p) * c, dst_offset=4 * (n + me) * c)
    fabric.run(comm, smap, src=src, dst=dst)
    return ((dst[:n * c].reshape(n, c) == np.arange(n)[:, None] * 10**6 + np.arange(c)).all()
            and (dst[n * c:2 * n * c].reshape(n, c)
                 == (np.arange(n)[:, None] * n + me) * 100000 + np.arange(c)).all()
            and (dst[2 * n * c:] == -1).all())


case("user slice map (one-shot all_reduce)", user_slice_map)
case("user slice map storing into every rank (push all_gather, then all_to_all)", user_slice_map_stores)
case("send/recv with the other host", send_recv_far)
case("split across hosts", split_across_hosts)
case("send/recv on a split across hosts (HBM)", lambda: p2p_on_a_split(False))
case("send/recv on a split across hosts (numpy)", lambda: p2p_on_a_split(True))
case("sendrecv ring (HBM)", lambda: sendrecv_ring(False))
case("sendrecv ring (numpy)", lambda: sendrecv_ring(True))
case("all_reduce 256 KiB again", all_reduce_large)


def refused(run):
    try:
        run()
    except NotImplementedError as e:
        return str(e)
    except Exception as e:          # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


far = (me + n // 2) % n                      # a rank on the other host of two
refusals = {"peer_view": refused(lambda: shmem.peer_view(sym, far))}
comm.barrier()

rt = _world.runtime()
job = rt.job_id                         # this host's part of the job
# registration messages ever posted on this host to a rank of another host (by a rank here, or
# by this host's daemon relaying): they map mirrors, so none should be; nobody would read them
lay = rt.ctl.layout
metadata_to_far = sum(int(rt.ctl.u64[lay.ring(q, p) // 8]) for q in rt.hosts.remote() for p in range(n + 1))
mapped, own = set(), None               # the shared-memory files this rank mapped (their inodes), its HBM's
with open("/proc/self/maps") as f:     # a segment is a /dev/shm name, or a memfd when /dev/shm is too small
    for line in f:
        where = next((w for w in ("/dev/shm/", "/memfd:") if w + "stratacl-" in line), None)
        if where is None:
            continue
        inode, name = int(line.split()[4]), line.split(where, 1)[1].split()[0]
        mapped.add(inode)
        if name == f"stratacl-{job}-hbm-{me}":
            own = inode
emit(rank=me, checks=checks, clocks=clocks, refusals=refusals, mapped=sorted(mapped), own=own,
     metadata_to_far=metadata_to_far)
stratacl.finalize()
