"""An unmodified torch program on backend "stratacl": functional collectives, DTensor, DDP.

    python -m torch.distributed.run --standalone --nproc-per-node 4 tests/scripts/torch_unmodified.py
    stratacl-launch -n 4 tests/scripts/torch_unmodified.py

Nothing in it knows which launcher started it: ``init_process_group("stratacl")`` reads RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT (env://). Every result is checked exactly on every
rank against a computation done here in one process: DDP's parameters after a few steps
against per-rank gradients divided by N and summed in rank order (the backend's order).
Each rank prints ``@@ {"rank": r, "size": n, "pid": p, "bad": [...]}`` and exits 1 if anything differs.
"""
import json
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import stratacl.torch  # noqa: F401  (registers the backend)

STEPS, BATCH = 3, 8


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)


def reference(n: int) -> list:
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
    return [p.detach() for p in m.parameters()]


def main() -> None:
    dist.init_process_group("stratacl")
    me, n = dist.get_rank(), dist.get_world_size()
    world = dist.group.WORLD
    bad = []

    def same(name, got, want):
        if not torch.equal(got, want):
            bad.append(f"{name}: {got.flatten()[:8].tolist()} != {want.flatten()[:8].tolist()}")

    # functional collectives (the ops DTensor and torch.compile use)
    x = torch.arange(6, dtype=torch.float32) + me
    same("funcol.all_reduce", funcol.all_reduce(x, "sum", world).wait(),
         torch.arange(6, dtype=torch.float32) * n + n * (n - 1) // 2)
    same("funcol.all_gather_single", funcol.all_gather_single(x, 0, world).wait(),
         torch.cat([torch.arange(6, dtype=torch.float32) + r for r in range(n)]))
    y = torch.arange(2 * n, dtype=torch.float32) * (me + 1)
    same("funcol.reduce_scatter_single", funcol.reduce_scatter_single(y, "sum", 0, world).wait(),
         torch.arange(2 * me, 2 * me + 2, dtype=torch.float32) * (n * (n + 1) // 2))

    # DTensor on a 1-D mesh: shard, gather back, a partial sum, a sharded matmul
    mesh = init_device_mesh("cpu", (n,))
    full = torch.arange(4 * n * 3, dtype=torch.float32).reshape(4 * n, 3)
    d = distribute_tensor(full, mesh, [Shard(0)])
    same("DTensor shard", d.to_local(), full[4 * me:4 * me + 4])
    same("DTensor redistribute Shard->Replicate", d.redistribute(mesh, [Replicate()]).to_local(), full)
    same("DTensor sum", d.sum().full_tensor(), full.sum())
    w = distribute_tensor(torch.ones(3, 2), mesh, [Replicate()])
    same("DTensor matmul", (d @ w).full_tensor(), full @ torch.ones(3, 2))

    # DDP, several buckets
    m = nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=0.001)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        xb, yb = batch(me, step)
        nn.functional.mse_loss(m(xb), yb).backward()
        opt.step()
    for i, (got, want) in enumerate(zip(m.parameters(), reference(n))):
        same(f"DDP parameter {i}", got.detach(), want)

    os.write(1, ("@@ " + json.dumps({"rank": me, "size": n, "pid": os.getpid(), "bad": bad}) + "\n").encode())   # one write: ranks share the pipe
    dist.destroy_process_group()
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
