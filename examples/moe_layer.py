"""A mixture-of-experts layer over expert parallelism: gate, dispatch, experts, combine.

    stratacl-launch -n 8 examples/moe_layer.py [--mode ht|ll] [--tokens 64] [--hidden 256]

Every rank holds a batch of tokens. The gate (one linear map, the same on every rank) picks
each token's top-k experts and their softmax weights; ``dispatch`` sends each token's row to
the ranks holding its experts (experts [r*E/N, (r+1)*E/N) live on rank r), each rank runs
its experts (a two-layer numpy MLP each) on the rows it received, and ``combine`` returns
the results to the tokens' owners. Every rank then computes the whole layer for its own
tokens alone, in this process, and compares: the rows dispatch delivered must be the senders'
bytes exactly, and the layer's output must agree within float32 rounding (the distributed
sum adds the experts' results in another order). Rank 0 prints what happened.
"""
import argparse
import sys

import numpy as np

import stratacl
from stratacl import ep

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=("ht", "ll"), default="ht")
p.add_argument("--tokens", type=int, default=64)
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--ffn", type=int, default=128)
p.add_argument("--experts-per-rank", type=int, default=4)
p.add_argument("--topk", type=int, default=4)
args = p.parse_args()

comm = stratacl.init()
n, me = comm.size, comm.rank
E, K, H, F = args.experts_per_rank * n, min(args.topk, args.experts_per_rank * n), args.hidden, args.ffn
L = E // n


def weights_of(expert: int):
    """Expert ``expert``'s MLP, the same on every rank (seeded by the expert)."""
    rng = np.random.default_rng([7, expert])
    return (rng.standard_normal((H, F)).astype(np.float32) / np.sqrt(H),
            rng.standard_normal((F, H)).astype(np.float32) / np.sqrt(F))


def expert_mlp(expert: int, rows: np.ndarray) -> np.ndarray:
    w1, w2 = weights_of(expert)
    return np.maximum(rows @ w1, 0) @ w2


def gate(x: np.ndarray):
    """Top-k experts of every token and their softmax weights (float32)."""
    wg = np.random.default_rng(11).standard_normal((H, E)).astype(np.float32)
    logits = x @ wg
    idx = np.argsort(-logits, axis=1, kind="stable")[:, :K]
    top = np.take_along_axis(logits, idx, axis=1)
    w = np.exp(top - top.max(axis=1, keepdims=True))
    return idx.astype(np.int64), (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


# this rank's tokens, in its HBM (zero copy: the experts' ranks pull the rows from here)
x = stratacl.empty((args.tokens, H), np.float32)
x[...] = np.random.default_rng([3, me]).standard_normal((args.tokens, H))
idx, w = gate(x)
buf = ep.Buffer(comm, E)

if args.mode == "ht":
    recv_x, recv_idx, recv_w, per_expert, handle = buf.dispatch(x, idx, w)
    y = np.zeros_like(recv_x)                    # each received row: its local experts, weighted
    for e in range(L):
        rows = np.nonzero(recv_idx == e)
        y[rows[0]] += recv_w[rows][:, None] * expert_mlp(me * L + e, recv_x[rows[0]])
    out, _ = buf.combine(y, handle)
    received = int(recv_x.shape[0])
else:
    recv_x, count, handle = buf.low_latency_dispatch(x, idx, args.tokens)
    y = np.zeros_like(recv_x)
    for e in range(L):
        y[e, :count[e]] = expert_mlp(me * L + e, recv_x[e, :count[e]])
    out = buf.low_latency_combine(y, idx, w, handle)
    received = int(count.sum())

# the same layer for this rank's tokens, in one process; and the rows dispatch delivered
want = np.zeros((args.tokens, H), dtype=np.float32)
for k in range(K):
    for e in np.unique(idx[:, k]):
        sel = idx[:, k] == e
        want[sel] += w[sel, k, None] * expert_mlp(int(e), x[sel])
all_x = [np.random.default_rng([3, r]).standard_normal((args.tokens, H)).astype(np.float32) for r in range(n)]
all_idx = [gate(a)[0] for a in all_x]
if args.mode == "ht":
    expect = [all_x[r][t] for r in range(n) for t in range(args.tokens) if (all_idx[r][t] // L == me).any()]
    rows_exact = recv_x.tobytes() == np.array(expect, dtype=np.float32).reshape(-1, H).tobytes()
else:
    rows_exact = all(recv_x[e, :count[e]].tobytes() == np.array(
        [all_x[r][t] for r in range(n) for t in range(args.tokens) if (all_idx[r][t] == me * L + e).any()],
        dtype=np.float32).reshape(-1, H).tobytes() for e in range(L))
err = float(np.abs(out - want).max() / max(np.abs(want).max(), 1e-30)) if args.tokens else 0.0
ok = np.array([rows_exact and err < 1e-5, received], dtype=np.int64)
every = np.zeros(2 * n, dtype=np.int64)
comm.all_gather(every, ok)
worst = np.array([err])
comm.all_reduce(worst, op="max")
if me == 0:
    good = bool(every[0::2].all())
    print(f"MoE layer ({args.mode}): {n} ranks, {E} experts (top-{K}), {args.tokens} tokens of {H} per rank; "
          f"rows received per rank {every[1::2].min()}..{every[1::2].max()}")
    print(f"dispatched rows exact and layer output within float32 rounding (max relative error "
          f"{worst[0]:.1e}) on every rank: {'yes' if good else 'NO'}")
stratacl.finalize()
sys.exit(0 if every[0::2].all() else 1)
