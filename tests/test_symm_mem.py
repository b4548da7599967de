"""``stratacl.torch.symm_mem`` (torch's symmetric-memory names over HBM) at N in {2, 3, 8, 32}:
exact bytes through ``get_buffer`` views and timed gets and puts, a custom all-gather against
``dist.all_gather_into_tensor``, stores into peers ordered by ``put_signal``/``wait_signal``
under racing ranks, and the errors."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="the torch backend's tests need torch (the test extra)")
import torch.distributed as dist  # noqa: E402

import stratacl  # noqa: E402
from helpers import ranks

NS = ranks(2, 3, 8, 32, slow_from=8)
TIMEOUT = {2: 120, 3: 120, 8: 200, 32: 400}


def _init():
    import stratacl.torch  # noqa: F401  (registers the backend)
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    dist.init_process_group("stratacl")


def _data(rank: int, count: int, rnd: int = 0) -> torch.Tensor:
    return (torch.arange(count, dtype=torch.float32) * 0.25 + rank * 1000.5 + rnd * 7.0)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))


def _exact(comm, count, rounds, errors=False):
    _init()
    from stratacl.torch import symm_mem
    n, me = dist.get_world_size(), dist.get_rank()
    bad = []
    # ranks whose HBM allocations differ (torch does not require them alike)
    extra = stratacl.torch.empty(1000 * (me + 1))         # noqa: F841  (held until the end)
    t = symm_mem.empty(count, dtype=torch.float32)
    t.copy_(_data(me, count))
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)
    if symm_mem.rendezvous(t, dist.group.WORLD) is not hdl:
        bad.append("rendezvous of the same storage made a new handle")
    if (hdl.rank, hdl.world_size, hdl.buffer_size) != (me, n, 4 * count) or len(hdl.buffer_ptrs) != n:
        bad.append(f"handle: {(hdl.rank, hdl.world_size, hdl.buffer_size, len(hdl.buffer_ptrs))}")
    hdl.barrier()
    # get_buffer: a view of every peer's HBM, in two dtypes
    for p in range(n):
        if not _same(hdl.get_buffer(p, (count,), torch.float32), _data(p, count)):
            bad.append(f"get_buffer float32 of {p}")
        half = hdl.get_buffer(p, (count // 2,), torch.bfloat16, storage_offset=count)     # the second half's bytes
        if not _same(half, _data(p, count)[count // 2:].contiguous().view(torch.bfloat16)[:count // 2]):
            bad.append(f"get_buffer bfloat16 at an offset of {p}")
    # a custom all-gather, exact against the built-in one
    ref = stratacl.torch.empty(n * count, dtype=torch.float32)
    dist.all_gather_into_tensor(ref, t)
    out, timed = torch.empty(n * count), torch.empty(n * count)
    for p in range(n):
        out[p * count:(p + 1) * count].copy_(hdl.get_buffer(p, (count,), torch.float32))
        hdl.get(p, timed[p * count:(p + 1) * count])
    if not (_same(out, ref) and _same(timed, ref)):
        bad.append("all-gather through get_buffer / get differs from dist.all_gather_into_tensor")
    hdl.barrier()
    # stores into a peer, ordered by the signal: rounds of writes into the right neighbour's buffer
    right, left = (me + 1) % n, (me - 1) % n
    peer = hdl.get_buffer(right, (count,), torch.float32)
    for r in range(1, rounds + 1):
        peer.copy_(_data(me, count, r))            # plain stores into the neighbour's HBM
        hdl.put_signal(right, channel=1)           # ... visible before the signal
        hdl.wait_signal(left, channel=1)
        if not _same(t, _data(left, count, r)):
            bad.append(f"round {r}: stores of {left} not visible with its signal")
        hdl.put_signal(left, channel=2)            # the buffer may be written again
        hdl.wait_signal(right, channel=2)
    hdl.put(right, _data(me, count, 99))           # a timed put, then the pad's barrier
    stratacl.shmem.quiet()
    hdl.barrier()
    if not _same(t, _data(left, count, 99)):
        bad.append("put")
    pad = hdl.get_signal_pad(me)
    if pad.dtype != torch.uint64 or int(pad.sum()) != 0:
        bad.append(f"signal pad not back to 0: {int(pad.sum())} (dtype {pad.dtype})")
    if errors:
        bad += _error_cases()
    dist.destroy_process_group()
    return bad


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", NS)
def test_symm_mem_exact_bytes_all_gather_and_signals(n):
    # at 32 ranks the error cases run in the same job (32 processes importing torch is most of its time)
    count, rounds = (4096, 30) if n <= 8 else (256, 3)
    assert stratacl.spawn(_exact, n, args=(count, rounds, n == 32), timeout=TIMEOUT[n]) == [[]] * n


def _errors(comm):
    _init()
    bad = _error_cases()
    dist.destroy_process_group()
    return bad


def _error_cases():
    from stratacl.torch import symm_mem
    n, me = dist.get_world_size(), dist.get_rank()
    bad = []
    t = symm_mem.empty(64, dtype=torch.float32)
    hdl = symm_mem.rendezvous(t)

    def expect(fn, kind, *parts):
        try:
            fn()
        except kind as e:
            if any(p not in str(e) for p in parts):
                bad.append(f"{kind.__name__}: {e} lacks {parts}")
            return e
        except Exception as e:  # noqa: BLE001
            bad.append(f"expected {kind.__name__}, got {type(e).__name__}: {e}")
        else:
            bad.append(f"expected {kind.__name__}, nothing raised")

    e = expect(lambda: hdl.get_buffer(n, (4,), torch.float32), stratacl.OneSidedError, f"peer {n}", "out of range")
    if e is not None and e.peer != n:
        bad.append(f"peer attribute {e.peer}")
    expect(lambda: hdl.get_buffer(0, (65,), torch.float32), ValueError, "the buffer has 256")
    expect(lambda: hdl.put_signal(-1), stratacl.OneSidedError, "peer -1")
    expect(lambda: hdl.wait_signal((me + 1) % n, timeout_ms=200), stratacl.SignalTimeout, "never updated")
    expect(lambda: symm_mem.rendezvous(torch.zeros(4)), ValueError, "not in HBM")
    odd = symm_mem.empty(8 if me == 0 else 16)       # sizes that differ: refused on every rank
    expect(lambda: symm_mem.rendezvous(odd), stratacl.OneSidedError, "differ in size")
    return bad


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", ranks(2, 3, 8, slow_from=8))          # and 32: in test_symm_mem_exact_bytes_all_gather_and_signals
def test_symm_mem_errors(n):
    assert stratacl.spawn(_errors, n, timeout=TIMEOUT[n]) == [[]] * n


@pytest.mark.timeout(60)
def test_symm_mem_imports_as_a_module_as_torch_users_write_it():
    # torch users write `import torch.distributed._symmetric_memory as symm_mem`
    import importlib

    import stratacl.torch
    import stratacl.torch.symm_mem as symm_mem
    assert importlib.import_module("stratacl.torch.symm_mem") is symm_mem
    assert stratacl.torch.symm_mem is symm_mem          # the attribute of the package, as before
    assert callable(symm_mem.empty) and callable(symm_mem.rendezvous)
