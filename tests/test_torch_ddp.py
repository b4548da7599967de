"""Unmodified torch training on the "stratacl" backend: DDP (with and without a communication
hook that uses futures) against a single-process reference, and FSDP2 against gloo.

DDP divides each rank's gradient by N and all-reduces with SUM; the reference does exactly that
in one process, summing in rank order in float32 (the backend's documented order). Parameters
after the last step must be bit-identical on every rank and to the reference. FSDP2
(``fully_shard`` on a CPU DeviceMesh, which torch 2.13 supports with gloo) must give gloo's
losses exactly.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the torch backend's tests need torch (the test extra)")
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

import stratacl  # noqa: E402
from helpers import ranks

pytestmark = pytest.mark.timeout(240)

STEPS = 4
BATCH = 8


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)


def reference(n: int) -> list[torch.Tensor]:
    """One process: per-rank gradients, each divided by n, summed in rank order, SGD."""
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(STEPS):
        grads = []
        for r in range(n):
            m.zero_grad()
            x, y = batch(r, step)
            nn.functional.mse_loss(m(x), y).backward()
            grads.append([p.grad.clone() for p in m.parameters()])
        for i, p in enumerate(m.parameters()):
            acc = grads[0][i] / n
            for r in range(1, n):
                acc = acc + grads[r][i] / n
            p.grad = acc
        opt.step()
    return [p.detach().clone() for p in m.parameters()]


def _hook(state, bucket):
    """allreduce_hook's shape: divide, all_reduce asynchronously, chain on its future (no
    annotations: DDP checks them, and this module's are strings)."""
    t = bucket.buffer().div_(dist.get_world_size())
    fut = dist.all_reduce(t, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def ddp(comm, backend: str, hook: bool):
    import stratacl.torch  # noqa: F401
    dist.init_process_group(backend)
    me = dist.get_rank()
    m = nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=0.001)   # several buckets
    if hook:
        m.register_comm_hook(None, _hook)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(me, step)
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    params = [p.detach().clone() for p in m.parameters()]
    dist.destroy_process_group()
    return params


@pytest.mark.parametrize("hook", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["builtin", "future_hook"])
@pytest.mark.parametrize("n", ranks(2, 4, slow_from=4))
def test_ddp_parameters_bit_identical_to_the_reference(n, hook):
    want = reference(n)
    for rank, params in enumerate(stratacl.spawn(ddp, n, args=("stratacl", hook), timeout=120)):
        for i, (p, w) in enumerate(zip(params, want)):
            assert torch.equal(p, w), f"rank {rank}, parameter {i}: max diff {(p - w).abs().max().item()}"


def fsdp2(comm, backend: str):
    import stratacl.torch  # noqa: F401
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group(backend)
    me = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    m = model()
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(me, step)
        loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    dist.destroy_process_group()
    return losses


@pytest.mark.slow
def test_fsdp2_losses_equal_gloos():
    n = 2
    ours = stratacl.spawn(fsdp2, n, args=("stratacl",), timeout=120)
    gloo = stratacl.spawn(fsdp2, n, args=("gloo",), timeout=120)
    assert ours == gloo
