"""torch.distributed backend "stratacl": every operation x dtype, exact bits, at N in {1, 2, 3}.

Each rank computes every peer's tensors (seeded per rank and case), so it checks its own
outputs byte for byte; reductions against torch's own elementwise op folded in rank order
(``acc = x_0; acc = op(acc, x_1); ...``; AVG: that sum divided by N). Inputs alternate between
tensors in HBM (``stratacl.torch.empty``: zero copy) and ordinary tensors (the staged path).
"""
from __future__ import annotations

import json
import os
import zlib

import pytest

torch = pytest.importorskip("torch", reason="the torch backend's tests need torch (the test extra)")
import torch.distributed as dist  # noqa: E402

import stratacl  # noqa: E402
from helpers import after_peer_gave_up, ranks  # noqa: E402

pytestmark = pytest.mark.timeout(240)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool]
SIZES = [0, 1, 7, 1000, 40001]
R = dist.ReduceOp
STEP = {R.SUM: torch.add, R.AVG: torch.add, R.PRODUCT: torch.mul, R.MIN: torch.minimum, R.MAX: torch.maximum,
        R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}


def _init():
    import stratacl.torch  # noqa: F401  (registers the backend)
    dist.init_process_group("stratacl")


def ops_for(dtype: torch.dtype) -> list:
    if dtype.is_floating_point:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG]
    return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]


def data(rank: int, shape, dtype: torch.dtype, tag: str, op=None) -> torch.Tensor:
    """Rank ``rank``'s tensor for case ``tag``: floats near 1 for PRODUCT (no overflow), in [-4, 4)
    otherwise, with a few NaN-free exact halves; integers over their whole range; bools."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{tag}/{rank}".encode()))
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)
    if op == R.PRODUCT:
        return (1 + (torch.rand(shape, generator=g, dtype=torch.float64) - 0.5) / 8).to(dtype)
    return ((torch.rand(shape, generator=g, dtype=torch.float64) * 8 - 4)).to(dtype)


def fold(op, parts: list[torch.Tensor]) -> torch.Tensor:
    acc = parts[0].clone()
    for p in parts[1:]:
        acc = STEP[op](acc, p)
    if op == R.AVG:
        acc = acc / len(parts)
    return acc


def place(t: torch.Tensor, hbm: bool) -> torch.Tensor:
    if not hbm:
        return t.clone()
    import stratacl.torch as st
    h = st.empty(tuple(t.shape), dtype=t.dtype)
    h.copy_(t)
    return h


def same(name: str, got: torch.Tensor, want: torch.Tensor, bad: list) -> None:
    g, w = got.detach().reshape(-1), want.detach().reshape(-1)
    if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g.view(torch.uint8), w.view(torch.uint8)):
        bad.append(f"{name}: got {g[:4].tolist()}..., want {w[:4].tolist()}...")


def matrix(comm, dtypes, sizes):
    _init()
    n, me = dist.get_world_size(), dist.get_rank()
    bad, cases = [], 0
    for di, dt in enumerate(dtypes):
        for si, c in enumerate(sizes):
            hbm = (di + si) % 2 == 0
            tag = f"{dt}/{c}"
            for op in ops_for(dt):
                parts = [data(p, (c,), dt, f"ar{op}{tag}", op) for p in range(n)]
                x = place(parts[me], hbm)
                asy = c % 2 == 1
                w = dist.all_reduce(x, op=op, async_op=asy)
                if asy:
                    w.wait()
                same(f"all_reduce {op} {tag}", x, fold(op, parts), bad)
                full = [data(p, (n * c,), dt, f"rs{op}{tag}", op) for p in range(n)]
                out = place(torch.zeros(c, dtype=dt), not hbm)
                dist.reduce_scatter_tensor(out, place(full[me], hbm), op=op)
                same(f"reduce_scatter_tensor {op} {tag}", out, fold(op, [f[me * c:(me + 1) * c] for f in full]), bad)
                outs = [torch.zeros(c, dtype=dt) for _ in range(n)]
                dist.reduce_scatter(outs[0], [place(f[j * c:(j + 1) * c], hbm) for j, f in enumerate([full[me]] * n)],
                                    op=op)
                same(f"reduce_scatter {op} {tag}", outs[0], fold(op, [f[me * c:(me + 1) * c] for f in full]), bad)
                root = (c + 1) % n
                y = place(parts[me], hbm)
                dist.reduce(y, dst=root, op=op)
                same(f"reduce {op} {tag}", y, fold(op, parts) if me == root else parts[me], bad)
                cases += 4
            mine = [data(p, (c,), dt, "ag" + tag) for p in range(n)]
            out = place(torch.zeros(n * c, dtype=dt), hbm)
            dist.all_gather_into_tensor(out, place(mine[me], not hbm))
            same(f"all_gather_into_tensor {tag}", out, torch.cat(mine), bad)
            lst = [torch.zeros(c, dtype=dt) for _ in range(n)]
            dist.all_gather(lst, place(mine[me], hbm))
            same(f"all_gather {tag}", torch.cat(lst), torch.cat(mine), bad)
            # all_gather_coalesced: one list per rank, each with one tensor per input (gloo's layout)
            two = [data(p, (c + 1,), dt, "agc" + tag) for p in range(n)]
            lists = [[torch.zeros(c, dtype=dt), torch.zeros(c + 1, dtype=dt)] for _ in range(n)]
            dist.all_gather_coalesced(lists, [place(mine[me], hbm), place(two[me], not hbm)])
            same(f"all_gather_coalesced {tag}", torch.cat([t for lst in lists for t in lst]),
                 torch.cat([t for p in range(n) for t in (mine[p], two[p])]), bad)
            # all_to_all_single, equal splits and uneven ones along dim 0 of a 2-D tensor
            src = [data(p, (n * c,), dt, "a2a" + tag) for p in range(n)]
            out = place(torch.zeros(n * c, dtype=dt), not hbm)
            dist.all_to_all_single(out, place(src[me], hbm))
            same(f"all_to_all_single {tag}", out, torch.cat([s[me * c:(me + 1) * c] for s in src]), bad)
            split = [[(i + 2 * j + c) % 3 for j in range(n)] for i in range(n)]      # rows i sends to j
            rows = [data(p, (sum(split[p]), 3), dt, "a2av" + tag) for p in range(n)]
            got = torch.zeros(sum(split[p][me] for p in range(n)), 3, dtype=dt)
            dist.all_to_all_single(got, place(rows[me], hbm), [split[p][me] for p in range(n)], split[me])
            want = torch.cat([rows[p][sum(split[p][:me]):sum(split[p][:me + 1])] for p in range(n)])
            same(f"all_to_all_single uneven {tag}", got, want, bad)
            ins = [place(rows[me][sum(split[me][:j]):sum(split[me][:j + 1])], hbm) for j in range(n)]
            outs = [torch.zeros(split[p][me], 3, dtype=dt) for p in range(n)]
            dist.all_to_all(outs, ins)
            same(f"all_to_all {tag}", torch.cat(outs), want, bad)
            for root in sorted({0, n - 1}):
                b = place(mine[me] if me == root else torch.zeros(c, dtype=dt), hbm)
                dist.broadcast(b, src=root)
                same(f"broadcast {root} {tag}", b, mine[root], bad)
                gl = [torch.zeros(c, dtype=dt) for _ in range(n)] if me == root else None
                dist.gather(place(mine[me], hbm), gl, dst=root)
                if me == root:
                    same(f"gather {root} {tag}", torch.cat(gl), torch.cat(mine), bad)
                s = torch.zeros(c, dtype=dt)
                dist.scatter(s, [place(m, hbm) for m in mine] if me == root else None, src=root)
                same(f"scatter {root} {tag}", s, mine[me], bad)
            if n > 1:
                nxt, prv = (me + 1) % n, (me - 1) % n
                r = torch.zeros(c, dtype=dt)
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, place(mine[me], hbm), nxt),
                                               dist.P2POp(dist.irecv, r, prv)])
                for q in reqs:
                    q.wait()
                same(f"batch_isend_irecv {tag}", r, mine[prv], bad)
                r2 = torch.zeros(c, dtype=dt)
                if me == 0:
                    dist.send(place(mine[me], hbm), 1)
                elif me == 1:
                    dist.recv(r2, 0)
                    same(f"send/recv {tag}", r2, mine[0], bad)
            cases += 1
            dist.barrier()
    dist.destroy_process_group()
    return bad, cases, stratacl.stats()["bytes_staged"]


@pytest.mark.parametrize("n", ranks(1, 2, 3, slow_from=3))
def test_every_operation_and_dtype_gives_torchs_bits(n):
    results = stratacl.spawn(matrix, n, args=(DTYPES, SIZES), hbm_size="1G", timeout=120)
    for rank, (bad, cases, _) in enumerate(results):
        assert bad == [], f"rank {rank}: {bad[:6]}"
        assert cases == sum(len(SIZES) * (4 * len(ops_for(dt)) + 1) for dt in DTYPES)


def complex_and_zero_copy(comm):
    _init()
    import stratacl.torch as st
    n, me = dist.get_world_size(), dist.get_rank()
    z = torch.tensor([complex(me, -me), complex(1, 2)], dtype=torch.complex64)
    dist.all_reduce(z)
    before = stratacl.stats()["bytes_staged"]
    x = st.zeros(1 << 16, dtype=torch.float32)
    x += me
    out = st.empty(n << 16, dtype=torch.float32)
    for _ in range(3):
        dist.all_reduce(x)
        dist.all_gather_into_tensor(out, x)
    hbm_staged = stratacl.stats()["bytes_staged"] - before
    y = torch.zeros(1 << 16)
    dist.all_reduce(y)
    plain_staged = stratacl.stats()["bytes_staged"] - before - hbm_staged
    dist.destroy_process_group()
    return z.tolist(), hbm_staged, plain_staged


def test_complex_sums_and_hbm_tensors_move_with_zero_copy():
    for z, hbm_staged, plain_staged in stratacl.spawn(complex_and_zero_copy, 2, timeout=60):
        assert z == [complex(1, -1), complex(2, 4)]
        assert hbm_staged == 0            # peers read stratacl.torch tensors in place
        # an ordinary tensor is staged: copied into a communication buffer, and the sum back out
        assert plain_staged == 2 * (1 << 16) * 4, plain_staged


def empty_like_in_hbm(comm):
    _init()
    import stratacl.torch as st
    me = dist.get_rank()
    src = torch.zeros(128, 128, dtype=torch.float64)     # both above the eager size (16 KiB): staged if not HBM
    before = stratacl.stats()["bytes_staged"]
    like = st.empty_like(src)
    like.fill_(me + 1)
    dist.all_reduce(like)
    half = st.empty_like(src, dtype=torch.bfloat16)
    half.fill_(0.5 * (me + 1))
    dist.all_reduce(half)
    staged = stratacl.stats()["bytes_staged"] - before
    dist.destroy_process_group()
    return ((tuple(like.shape), like.dtype, sorted(set(like.reshape(-1).tolist()))),
            (tuple(half.shape), half.dtype, sorted(set(half.reshape(-1).tolist()))), staged)


def test_empty_like_gives_hbm_tensors_of_the_shape_and_dtype():
    for like, half, staged in stratacl.spawn(empty_like_in_hbm, 2, timeout=60):
        assert like == ((128, 128), torch.float64, [3.0])           # every element 1 + 2
        assert half == ((128, 128), torch.bfloat16, [1.5])          # the dtype given: 0.5 + 1.0
        assert staged == 0                # peers read them in place: their storage is HBM


def futures_and_groups(comm):
    _init()
    n, me = dist.get_world_size(), dist.get_rank()
    x = torch.full((8,), float(me + 1))
    work = dist.all_reduce(x, async_op=True)
    chained = work.get_future().then(lambda f: f.value()[0] * 2)
    work.wait()
    res = {"completed": work.is_completed(), "chained": chained.wait().tolist()}
    evens = dist.new_group([r for r in range(n) if r % 2 == 0])
    odds = dist.new_group([r for r in range(n) if r % 2 == 1])
    g = evens if me % 2 == 0 else odds
    y = torch.tensor([float(me)])
    dist.all_reduce(y, group=g)
    res["group"] = y.item()
    res["group_size"] = dist.get_world_size(g)
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("dp", "tp"))
    t = torch.tensor([float(me)])
    dist.all_reduce(t, group=mesh.get_group("tp"))
    res["tp"] = t.item()
    objs = [{"from": me}]
    dist.broadcast_object_list(objs, src=n - 1)
    gathered = [None] * n
    dist.all_gather_object(gathered, me * 10)
    res["objects"] = (objs[0], gathered)
    dist.destroy_process_group()
    return res


def test_futures_new_group_device_mesh_and_objects():
    n = 4
    for me, res in enumerate(stratacl.spawn(futures_and_groups, n, timeout=90)):
        total = n * (n + 1) / 2
        assert res["completed"] and res["chained"] == [2 * total] * 8
        assert res["group"] == sum(r for r in range(n) if r % 2 == me % 2) and res["group_size"] == n // 2
        assert res["tp"] == sum(range(me - me % 2, me - me % 2 + 2))
        assert res["objects"] == ({"from": n - 1}, [r * 10 for r in range(n)])


def _attempt(fn):
    try:
        fn()
    except Exception as e:
        cause = e.__cause__
        return type(e).__name__, type(cause).__name__ if cause is not None else None, str(e)
    return None


def errors(comm):
    _init()
    me = dist.get_rank()
    got = {}
    got["mismatch"] = _attempt(lambda: dist.all_reduce(torch.zeros(4 + me)))
    nc = torch.zeros(4, 4).t()
    got["non_contiguous"] = _attempt(lambda: dist.all_reduce(nc))
    got["bitwise_float"] = _attempt(lambda: dist.all_reduce(torch.zeros(4), op=R.BAND))
    got["avg_int"] = _attempt(lambda: dist.all_reduce(torch.zeros(4, dtype=torch.int32), op=R.AVG))
    w = dist.all_reduce(torch.zeros(3 + me), async_op=True)
    got["async_mismatch"] = _attempt(w.wait)
    future = w.get_future()
    got["future"] = (future.done(), _attempt(future.wait))     # the future holds the same error
    # both sides of a tagged exchange are refused at once: no peer is left waiting
    got["tag"] = _attempt(lambda: dist.send(torch.ones(4), 1, tag=5) if me == 0
                          else dist.recv(torch.zeros(4), 0, tag=5))
    x = torch.ones(4)
    dist.all_reduce(x)                       # still in step after errors every rank saw
    got["after"] = x.tolist()
    return got


def test_errors_reach_torch_as_dist_backend_error():
    res = stratacl.spawn(errors, 2, timeout=60)
    for me, got in enumerate(res):
        assert got["mismatch"][:2] == ("DistBackendError", "CollectiveMismatch"), got["mismatch"]
        assert "all_reduce" in got["mismatch"][2]
        assert got["non_contiguous"][:2] == ("ValueError", None) and "not contiguous" in got["non_contiguous"][2]
        assert got["bitwise_float"][0] == "TypeError" and got["avg_int"][0] == "TypeError"
        assert got["async_mismatch"][:2] == ("DistBackendError", "CollectiveMismatch")
        done, err = got["future"]
        assert done and err is not None and err[:2] == ("DistBackendError", "CollectiveMismatch"), got["future"]
        assert "all_reduce" in err[2] and "element count" in err[2], err
        side = ("send", "recv")[me]
        assert got["tag"][0] == "ValueError" and f"stratacl {side}: tag 5 is not supported" in got["tag"][2], got
        assert got["after"] == [2.0] * 4


def late_barrier(comm, flag):
    """Rank 1 comes to the barrier only once rank 0 has given up on it (a file rank 0 writes),
    so rank 0's timeout is certain whatever the host's load, and no sleep sets the pace."""
    _init()
    if dist.get_rank() == 0:
        err = _attempt(dist.barrier)
        flag.write_text("timed out")
        return err
    after_peer_gave_up(flag)
    dist.barrier()                           # completes with rank 0's earlier arrival
    return None


@pytest.mark.slow
def test_a_timeout_reaches_torch_as_dist_backend_error(tmp_path):
    # the communication timeout is the feature here: short, in a job that does nothing else
    err, _ = stratacl.spawn(late_barrier, 2, args=(tmp_path / "rank0-timed-out",), timeout=3.0)
    assert err[:2] == ("DistBackendError", "CommTimeout"), err
    assert "barrier" in err[2] and "rank 0 waited 3 s" in err[2] and "still missing: [1]" in err[2], err


def dies(comm, outdir):
    _init()
    if dist.get_rank() == 1:
        os._exit(3)
    err = _attempt(lambda: dist.all_reduce(torch.ones(1000)))
    (outdir / "rank0.json").write_text(json.dumps(err))


@pytest.mark.slow
def test_a_dead_peer_is_a_dist_backend_error_naming_it(tmp_path):
    with pytest.raises(stratacl.RankFailure):
        stratacl.spawn(dies, 2, args=(tmp_path,), timeout=30)
    kind, cause, message = json.loads((tmp_path / "rank0.json").read_text())
    assert (kind, cause) == ("DistBackendError", "PeerFailure")
    assert "peer rank 1" in message


def script_program(tmp_path):
    p = tmp_path / "prog.py"
    p.write_text("import torch, torch.distributed as dist\nimport stratacl.torch\n"
                 "dist.init_process_group('stratacl')\n"
                 "x = torch.ones(3) * dist.get_rank()\ndist.all_reduce(x)\n"
                 "print('rank', dist.get_rank(), x.tolist())\ndist.destroy_process_group()\n")
    return p


def test_unmodified_program_under_the_launcher(tmp_path):
    import subprocess
    import sys
    prog = script_program(tmp_path)
    launch = os.path.join(os.path.dirname(sys.executable), "stratacl-launch")
    # --tag-output: one whole line per print, however the ranks interleave
    run = subprocess.run([launch, "-n", "3", "--tag-output", str(prog)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    for r in range(3):
        assert f"rank {r} [3.0, 3.0, 3.0]" in run.stdout, run.stdout


def modeled_overlap(comm):
    """Modeled time of an asynchronous torch all_reduce overlapping charged compute, with and
    without giving the group's worker time to run it first; the numpy API's own, alike."""
    import time

    _init()
    x = stratacl.torch.zeros(1 << 18)
    y = stratacl.zeros((1 << 18,), "float32")
    got = {}
    # (a first round, not compared, warms the communicator: its first overlap differs by ~4 ns)
    for name, delay in (("first", 0.0), ("torch", 0.0), ("torch after a delay", 0.05), ("numpy", 0.0)):
        dist.barrier()
        t0 = comm.clock()
        work = comm.all_reduce(y, async_op=True) if name in ("numpy", "first") else dist.all_reduce(x, async_op=True)
        time.sleep(delay)
        comm.charge_compute(200.0)
        work.wait()
        got[name] = comm.clock() - t0
    dist.barrier()
    t0 = comm.clock()
    dist.all_reduce(x)
    got["alone"] = comm.clock() - t0
    dist.destroy_process_group()
    return got


@pytest.mark.slow
def test_an_async_torch_operation_overlaps_charged_compute_in_modeled_time():
    # The group's worker runs the all_reduce when it likes; its modeled place is where the
    # program issued it: it overlaps the 200 us kernel (sharing the cores) exactly as the
    # communicator's own async_op=True, whatever the thread timing
    for got in stratacl.spawn(modeled_overlap, 3, clock="virtual", timeout=60):
        # (the same durations, measured from different clock values: equal but for rounding)
        assert got["torch"] == pytest.approx(got["numpy"], rel=1e-9, abs=0), got
        assert got["torch after a delay"] == pytest.approx(got["numpy"], rel=1e-9, abs=0), got
        assert 200e-6 < got["torch"] < 200e-6 + got["alone"], got


def _torch_threads() -> list[str]:
    import threading
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("stratacl-torch-"))


def worker_ends_at_destroy(comm):
    import time

    _init()
    x = torch.ones(4)
    work = dist.all_reduce(x, async_op=True)            # queued: the group's worker runs it
    slow = work.get_future().then(lambda f: time.sleep(0.2))
    work.wait()
    before = _torch_threads()
    dist.destroy_process_group()
    return before, _torch_threads(), slow.done()


@pytest.mark.slow
def test_the_groups_worker_thread_ends_at_destroy_process_group():
    # A waiter sees its Work done while the worker may still be inside torch completing its
    # Future (a callback here, sleeping); destroy_process_group lets it finish and joins it
    for before, after, callback_ran in stratacl.spawn(worker_ends_at_destroy, 2, timeout=60):
        assert len(before) == 1 and before[0].startswith("stratacl-torch-"), before
        assert after == [] and callback_ran

