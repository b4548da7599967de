"""A DeepSeek-V3-like training step, scaled down, through torch.distributed on the emulated supernode.

    stratacl-launch -n 8 [--clock virtual] examples/train_step.py [--steps 2] [--layers 2] [--hidden 64]
                                                                  [--tp 2] [--ep 8]
                                                                  [--routing gate|seeded] [--imbalance 1.0]
                                                                  [--no-check]

The paper trains DeepSeek V3.2 with TorchTitan on 512 dies, FSDP=128 x TP=4, EP=64 (section
9.1, "LLM training"). Here the N ranks form the same three kinds of groups, sized from N:

    TP groups     ranks [g*TP, (g+1)*TP): the dies of one NPU when TP=2 (--tp, default 2)
    FSDP groups   ranks {t, t+TP, t+2*TP, ...}: FSDP = N/TP; the TP group g is data-parallel
                  replica g and holds its own batch of --tokens tokens
    EP groups     ranks [k*EP, (k+1)*EP) (--ep, default N: the world): --experts-per-rank
                  experts on every rank, EP x experts-per-rank experts in all; each of the N/EP
                  EP groups holds a full copy of them
    expert FSDP   ranks {j, j+EP, j+2*EP, ...}: the R = N/EP ranks that hold the same experts;
                  the experts' weights are FSDP-sharded over this group (below). At EP = N the
                  group is the rank alone: its experts are local, nothing gathered or reduced

This is TorchTitan's device mesh [dp_shard_mod_ep, dp_shard_in_ep, tp] (tp innermost) with
expert tensor parallelism 1, where EP = dp_shard_in_ep x tp spans the TP groups it holds (the
TP ranks split the tokens, so each dispatches its own) and the experts are FSDP'd over
dp_shard_mod_ep = N/EP, the expert-FSDP groups above (TorchTitan's efsdp, dp_shard x tp / ep).
The paper's 512 dies are TP 4, FSDP 128, EP 64: dp_shard_in_ep 16, each expert sharded over 8.
An EP smaller than TP (allowed for small recordings) is a block of one TP group, which
TorchTitan does not build.

One layer (--layers of them) is a tensor-parallel dense block standing in for attention, then a
mixture-of-experts block, each with a residual (no norms, no embedding or output head):

    x [T, H], the same on the TP group's ranks
      dense:  p_t = relu(x @ W1[:, shard t]) @ W2[shard t, :]      column- then row-parallel
              h = x + all_reduce_TP(p_t)
      MoE:    c = h's rows of TP rank t (T/TP tokens; the TP ranks split the tokens so that no
              token is dispatched twice); gate: sigmoid(c @ Wg), top-k, weights normalised over
              the k (DeepSeek-V3's gate without the bias); stratacl.ep dispatch -> each expert a
              two-layer MLP on its rows, times the token's weight -> combine
              out = c + combine(...);   next layer's x = all_gather_TP(out)
    loss:   the squared error of the last layer's rows against a target, summed over the job
            and divided by its elements (each rank adds its own rows' share)

FSDP: a layer's dense weights (W1 and W2 of TP shard t, and the gate Wg) are one flat vector
sharded over the FSDP group t. Before a layer's forward its weights are all-gathered
(``all_gather_single``, torch 2.13's name for ``all_gather_into_tensor``; async), and the
gather of layer i+1 is issued before layer i's compute, so it overlaps it; after the forward the gathered weights are dropped, except the last
layer's, and the backward gathers them again, prefetching layer i-1 during layer i (TorchTitan
does not reshard the last block either). The backward runs the same chain in reverse:

    d out --dispatch--> the experts' rows (combine's backward); the experts' backward; their
    rows' gradients and the gradients of the token weights --combine--> the tokens' owners
    (dispatch's backward; a weight's gradient comes from its expert's rank alone); the gate's
    backward; d h = all_gather_TP(d c); the dense block's backward, its input gradient
    all_reduce_TP'd; the gate's gradient all_reduce_TP'd (Wg is the same on the TP ranks)

and each layer's flat gradient is reduce-scattered (``reduce_scatter_single``, async) over the
FSDP group onto its shard as soon as the layer's backward is done. Then SGD on the shards and
on the local experts. Every exchanged tensor lives in HBM (``stratacl.torch.empty``).

The experts, when R > 1, are FSDP units of their own, as TorchTitan's ``apply_fsdp`` wraps
each MoE block's experts on the expert-FSDP mesh: a layer's local experts are one flat vector
sharded over the R ranks of the expert-FSDP group; it is all-gathered (async) together with the
layer's dense weights and prefetched with them, one block ahead in the forward and one behind
in the backward (TorchTitan prefetches [next block, next block's experts]), and waited for
just before the experts run; its gradient is reduce-scattered (async) onto the shard as soon as
the experts' backward is done, beside the rest of that layer's backward and the layers below.

Under ``--clock virtual`` every kernel is charged its roofline time on the die
(``comm.charge_kernel``: FLOPs and HBM bytes, float32; a matmul is one kernel with its
elementwise epilogue fused; its backward two), so communication in flight shares the die's
cores with compute and the modeled step time is printed. After the steps every rank computes
the whole job alone, in this process (every rank's share, the same operations on the same
arrays, every reduction in the library's order: all_reduce and reduce_scatter in group rank
order, the combine's sum from 0 in destination-rank order) and compares bit for bit its losses,
its parameter shards and its experts. Rank 0 prints what happened; exit 1 if not exact.
"""
import argparse
import time

import torch
import torch.distributed as dist

import stratacl
import stratacl.torch
from stratacl import ep

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--ffn", type=int, default=128, help="the dense block's inner width (split over TP)")
p.add_argument("--expert-ffn", type=int, default=32, help="each expert's inner width")
p.add_argument("--experts-per-rank", type=int, default=2)
p.add_argument("--topk", type=int, default=4)
p.add_argument("--tokens", type=int, default=16, help="tokens per data-parallel replica (TP group)")
p.add_argument("--tp", type=int, default=2)
p.add_argument("--ep", type=int, default=0, help="ranks per EP group (divides the ranks; default: all of them)")
p.add_argument("--micro-batches", type=int, default=0,
               help="gradient accumulation: the replica's tokens in this many micro-batches per step "
                    "(default 1, or as many as the pool's smaller fit needs under --registration pool)")
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--routing", choices=("gate", "seeded"), default="gate",
               help="gate: each token's top-k of its gate affinities (routing follows the activations); seeded: "
                    "the experts drawn by stratacl.ep.routing, uniform, from --seed, the step, micro-batch, layer "
                    "and rank, the same at every --hidden (so the traces extrapolate in it)")
p.add_argument("--seed", type=int, default=0, help="--routing seeded draws from it")
p.add_argument("--imbalance", type=float, default=1.0,
               help="--routing seeded: the experts' load imbalance, max / mean of their expected loads (1: "
                    "uniform); the experts' popularity is then a Zipf law over one order shared by every rank "
                    "(drawn anew for each step, micro-batch and layer), its exponent stratacl.ep.skew_for(this, "
                    "experts, top-k)")
p.add_argument("--no-check", action="store_true",
               help="skip the check against the job computed in one process (N times the step's compute on "
                    "every rank); for recordings of settings already checked")
args = p.parse_args()

torch.set_num_threads(1)              # the same kernels, so the same bits, in the check below
dist.init_process_group("stratacl")
comm = stratacl.init()
n, me = dist.get_world_size(), dist.get_rank()
TP, NL, H, T = args.tp, args.layers, args.hidden, args.tokens
if n % TP or T % TP or args.ffn % TP:
    raise SystemExit(f"--tp {TP} must divide the ranks ({n}), --tokens ({T}) and --ffn ({args.ffn})")
DP = n // TP                                     # FSDP degree = data-parallel replicas
EP = args.ep or n
if EP < 1 or n % EP:
    raise SystemExit(f"--ep {EP} must divide the ranks ({n})")
if args.imbalance != 1.0 and args.routing != "seeded":
    raise SystemExit("--imbalance draws the experts: it needs --routing seeded")
cfg = stratacl.config
# HCCL-zerocopy's pre-registered pool runs on the caching (non-expandable) allocator, which
# fragments: in the training trace of docs/results/fragmentation-2026-12-02.json one die fits 17
# sequences under it ("caching (pool)", max_batch 17) where the expandable allocator fits 27
# ("expandable (roa)", max_batch 27); docs/memory.md. The replica's batch stays --tokens (the
# global batch is the job's), so under pool it runs as several smaller micro-batches whose
# gradients accumulate: the largest that fits is the largest multiple of TP (every micro-batch
# splits over the TP ranks) not above tokens x 17/27.
POOL_FITS = (17, 27)
need = 1
if cfg.registration == "pool":
    fits = max(TP, T * POOL_FITS[0] // POOL_FITS[1] // TP * TP)
    need = -(-T // fits)
MB = args.micro_batches or need
if MB < need or MB > T // TP:
    why = (f"registration pool fits {fits} of them (17/27, docs/memory.md)" if cfg.registration == "pool"
           else f"registration {cfg.registration}")
    raise SystemExit(f"--micro-batches {MB}: {T} tokens per replica need from {need} ({why}) to {T // TP} "
                     f"(one token per TP rank) micro-batches")
# equal micro-batches that cover the tokens exactly (multiples of TP, sizes differing by at most
# TP), rather than full ones and a smaller rest: each fits, and the steps are balanced
_units = [T // TP // MB + (j < T // TP % MB) for j in range(MB)]
MICRO = [(TP * sum(_units[:j]), TP * sum(_units[:j + 1])) for j in range(MB)]
tp_rank, dp_rank = me % TP, me // TP
Ft, Fe, LE = args.ffn // TP, args.expert_ffn, args.experts_per_rank
E = LE * EP                                      # the model's experts; every EP group holds them all
ep_rank = me % EP                                # this rank's place in its EP group
K = min(args.topk, E)
P = 2 * H * Ft + H * E                           # a layer's flat dense weights (one TP shard)
S = -(-P // DP)                                  # its FSDP shard
M = DP * T * H                                   # the loss's elements
R = n // EP                                      # each expert's replicas: its expert-FSDP group
Q = 2 * LE * H * Fe                              # a layer's local experts' weights, flat
SE = -(-Q // R)                                  # their shard over the expert-FSDP group
rep = me // EP                                   # this rank's place in that group
SKEW = ep.skew_for(args.imbalance, E, K) if args.imbalance != 1.0 else 0.0
modeled = cfg.clock != "off"

# every rank makes every group, in the same order (torch.distributed requires it)
tp_groups = [dist.new_group(list(range(g * TP, (g + 1) * TP))) for g in range(DP)]
fsdp_groups = [dist.new_group(list(range(t, n, TP))) for t in range(TP)]
tp_group, fsdp_group = tp_groups[dp_rank], fsdp_groups[tp_rank]
# the ranks that hold this rank's experts (its expert-FSDP group); none at EP = N
replica_groups = [dist.new_group(list(range(j, n, EP))) for j in range(EP)] if EP < n else None
replica_group = replica_groups[ep_rank] if replica_groups else None
buf = ep.Buffer(comm if EP == n else comm.split(me // EP, me), E)


charged_us = [0.0]                   # the compute charged so far, for the summary


def charge(flops: float, nbytes: float) -> None:
    """A kernel's roofline time on the modeled clock (nothing without one); its HBM bytes
    compete with the communication in flight for the die's HBM bandwidth."""
    charged_us[0] += comm.charge_kernel(flops, nbytes)


def matmul(m: int, k: int, n_: int, backward: bool = False) -> None:
    """Charge [m, k] @ [k, n]: forward one kernel; backward two (the input's and the weight's gradients)."""
    if not backward:
        charge(2 * m * k * n_, 4 * (m * k + k * n_ + m * n_))
    else:
        charge(2 * m * n_ * k, 4 * (m * n_ + k * n_ + m * k))
        charge(2 * k * m * n_, 4 * (m * k + m * n_ + k * n_))


def elementwise(elements: int, arrays: int = 3) -> None:
    charge(elements, 4 * arrays * elements)


# --- the model's weights, data and local kernels (both the job and the one-process check use them)
def dense_init(layer: int):
    g = torch.Generator().manual_seed(100 + layer)
    return (torch.randn(H, args.ffn, generator=g) / H ** 0.5, torch.randn(args.ffn, H, generator=g) / args.ffn ** 0.5,
            torch.randn(H, E, generator=g) / H ** 0.5)


def flat_init(layer: int, t: int) -> torch.Tensor:
    """Layer ``layer``'s flat dense weights as TP rank t holds them, padded to DP * S."""
    w1, w2, wg = dense_init(layer)
    parts = [w1[:, t * Ft:(t + 1) * Ft].reshape(-1), w2[t * Ft:(t + 1) * Ft].reshape(-1), wg.reshape(-1)]
    return torch.cat(parts + [torch.zeros(DP * S - P)])


def unflat(flat: torch.Tensor):
    return (flat[:H * Ft].view(H, Ft), flat[H * Ft:2 * H * Ft].view(Ft, H), flat[2 * H * Ft:P].view(H, E))


def expert_init(layer: int, expert: int):
    g = torch.Generator().manual_seed(10007 * (layer + 1) + expert)
    return [torch.randn(H, Fe, generator=g) / H ** 0.5, torch.randn(Fe, H, generator=g) / Fe ** 0.5]


def expert_flat(weights: list) -> torch.Tensor:
    """An EP rank's experts' weights (2 per expert, in order) as one flat vector, padded to R * SE."""
    return torch.cat([w.reshape(-1) for w in weights] + [torch.zeros(R * SE - Q)])


def expert_unflat(flat: torch.Tensor) -> list:
    return [flat[i * H * Fe:(i + 1) * H * Fe].view((H, Fe) if i % 2 == 0 else (Fe, H)) for i in range(2 * LE)]


def batch(step: int, replica: int):
    """Replica ``replica``'s tokens [T, H] and targets [T, H] at ``step``."""
    g = torch.Generator().manual_seed(step * 100003 + replica)
    return torch.randn(T, H, generator=g), torch.randn(T, H, generator=g)


def dense_fwd(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def drawn(step: int, micro: int, layer: int, rank: int, tokens: int):
    """``--routing seeded``: rank ``rank``'s tokens' experts [tokens, K] at this step, micro-batch
    and layer, drawn by ``ep.routing`` (its draw for a rank depends on the seed and the rank
    only); None under the gate's routing."""
    if args.routing == "gate":
        return None
    seed = ((args.seed * 1_000_003 + step) * MB + micro) * NL + layer
    return torch.from_numpy(ep.routing([0] * rank + [tokens], E, K, rank + 1, SKEW, seed, shared=SKEW > 0)[rank])


def gate_fwd(c, wg, idx=None):
    """Each token's top-k experts and their weights (sigmoid affinities normalised over the k);
    with ``idx`` (seeded routing) those experts, weighted by their affinities."""
    scores = torch.sigmoid(c @ wg)
    if idx is None:
        top, idx = torch.topk(scores, K, dim=1)
    else:
        top = torch.gather(scores, 1, idx)
    return idx, top / top.sum(1, keepdim=True)


def gate_weights(c, wg, idx=None):
    return gate_fwd(c, wg, idx)[1]


def gate_weights_at(idx):
    """The gate's weights as a function of its input and weights, for its backward: under the
    gate's routing the experts are chosen again (the same ones), under seeded routing ``idx``'s."""
    fixed = None if args.routing == "gate" else idx
    return lambda c, wg: gate_weights(c, wg, fixed)


def experts_fwd(recv_x, recv_idx, recv_w, *weights):
    """The local experts on the rows a dispatch delivered: per expert e (ascending), the rows
    that picked it, through its MLP, times their weight, added into the row's output."""
    y = torch.zeros_like(recv_x)
    for e in range(LE):
        hit = recv_idx == e
        rows = hit.any(1).nonzero().squeeze(1)
        if rows.numel():
            o = torch.relu(recv_x[rows] @ weights[2 * e]) @ weights[2 * e + 1]
            y = y.index_add(0, rows, (recv_w[rows] * hit[rows]).sum(1, keepdim=True) * o)
    return y


def loss_fwd(out, target):
    return ((out - target) ** 2).sum() / M


def vjp(fn, inputs: list, needs: list, grad_out):
    """The gradients of ``fn(*inputs)`` against ``grad_out`` for the inputs with ``needs`` (None for the others);
    zeros for an input the output does not depend on (an expert no token picked)."""
    leaves = [x.detach().requires_grad_(need) for x, need in zip(inputs, needs)]
    with torch.enable_grad():
        out = fn(*leaves)
        if not out.requires_grad:                  # a rank no token's expert is on
            return [torch.zeros_like(x) if need else None for x, need in zip(inputs, needs)]
        got = iter(torch.autograd.grad(out, [x for x, need in zip(leaves, needs) if need], grad_out,
                                       allow_unused=True, materialize_grads=True))
    return [next(got) if need else None for need in needs]


def hbm(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied into this rank's HBM: peers pull it in place."""
    out = stratacl.torch.empty(tuple(t.shape), dtype=t.dtype)
    out.copy_(t)
    return out


def rows_routed(recv_idx) -> list:
    return [int((recv_idx == e).any(1).sum()) for e in range(LE)]


# --- the step, distributed -------------------------------------------------------------------
def gather(shards: list, experts: list, layer: int):
    """Layer ``layer``'s FSDP gathers, issued (async): its dense weights over the FSDP group and,
    when they are sharded (R > 1), its experts' over the expert-FSDP group. Returns (the dense
    gather's work, the dense weights, the experts' gather's work or None, the experts' weights)."""
    full = stratacl.torch.empty((DP * S,))
    work = dist.all_gather_single(full, shards[layer], group=fsdp_group, async_op=True)
    if R == 1:
        return work, full, None, experts[layer]
    eflat = stratacl.torch.empty((R * SE,))
    ework = dist.all_gather_single(eflat, experts[layer], group=replica_group, async_op=True)
    return work, full, ework, expert_unflat(eflat)


def step_distributed(step: int, shards: list, experts: list) -> torch.Tensor:
    """One step: the replica's micro-batches one after the other, each a forward and a backward
    (FSDP gathers the weights again for each, as FSDP2 does between micro-batches), their
    gradients summed locally; the last micro-batch's backward reduce-scatters the sums (no
    reduce-scatter before: FSDP2's ``set_requires_gradient_sync(False)``) and applies SGD."""
    xs, targets = batch(step, dp_rank)
    grad_sums = ([None] * NL, [None] * NL)          # per layer: flat dense gradient, expert gradients
    loss = None
    for j, (lo, hi) in enumerate(MICRO):
        part = micro_step(step, j, xs[lo:hi], targets[lo:hi], shards, experts, grad_sums)
        loss = part if loss is None else loss + part
    return loss


def micro_step(step: int, micro: int, x, target, shards: list, experts: list, grad_sums: tuple) -> torch.Tensor:
    """Micro-batch ``micro``'s forward and backward; ``grad_sums`` holds the earlier micro-batches' gradients."""
    last = micro == MB - 1
    T = x.shape[0]
    Tc = T // TP
    x = hbm(x)
    mine = slice(tp_rank * Tc, (tp_rank + 1) * Tc)
    saved, pending = [], {0: gather(shards, experts, 0)}
    for layer in range(NL):
        work, full, ework, ew = pending.pop(layer)
        work.wait()
        if layer + 1 < NL:                         # prefetch: overlaps this layer's compute
            pending[layer + 1] = gather(shards, experts, layer + 1)
        w1, w2, wg = unflat(full)
        part = hbm(dense_fwd(x, w1, w2))
        matmul(T, H, Ft)
        matmul(T, Ft, H)
        dist.all_reduce(part, group=tp_group)
        h = x + part
        elementwise(T * H)
        c = hbm(h[mine])
        idx, w = gate_fwd(c, wg, drawn(step, micro, layer, me, Tc))
        matmul(Tc, H, E)
        recv_x, recv_idx, recv_w, _, handle = buf.dispatch(c.numpy(), idx.numpy(), w.numpy())
        rx, ri, rw = torch.from_numpy(recv_x), torch.from_numpy(recv_idx), torch.from_numpy(recv_w)
        if ework is not None:
            ework.wait()
        y = hbm(experts_fwd(rx, ri, rw, *ew))
        for rows in rows_routed(ri):
            matmul(rows, H, Fe)
            matmul(rows, Fe, H)
        moe, _ = buf.combine(y.numpy(), handle)
        out = hbm(c + torch.from_numpy(moe))
        elementwise(Tc * H)
        saved.append((x, c, idx, w, rx, ri, rw, (full, ew) if layer == NL - 1 else None))
        if layer + 1 < NL:
            x = stratacl.torch.empty((T, H))
            dist.all_gather_single(x, out, group=tp_group)
    loss = loss_fwd(out, target[mine])
    d_out = vjp(loss_fwd, [out, target[mine]], [True, False], torch.tensor(1.0))[0]
    elementwise(Tc * H, 4)

    reducing, expert_reducing = [], []
    for layer in reversed(range(NL)):
        x, c, idx, w, rx, ri, rw, kept = saved[layer]
        if kept is None:
            work, full, ework, ew = pending.pop(layer)
            work.wait()
        else:
            (full, ew), ework = kept, None
        if layer > 0:                              # prefetch the next layer of the backward
            pending[layer - 1] = gather(shards, experts, layer - 1)
        w1, w2, wg = unflat(full)
        # combine's backward: each expert row gets its token's output gradient (a dispatch)
        d_y, _, _, _, back = buf.dispatch(hbm(d_out).numpy(), idx.numpy(), w.numpy())
        if ework is not None:
            ework.wait()
        grads = vjp(experts_fwd, [rx, ri, rw, *ew], [True, False, True] + [True] * 2 * LE,
                    torch.from_numpy(d_y))
        for rows in rows_routed(ri):
            matmul(rows, Fe, H, backward=True)
            matmul(rows, H, Fe, backward=True)
        d_experts = grads[3:]
        if grad_sums[1][layer] is not None:        # accumulate: earlier micro-batches' sum + this one's
            d_experts = [a + b for a, b in zip(grad_sums[1][layer], d_experts)]
            elementwise(Q)
        if not last:
            grad_sums[1][layer] = d_experts
        elif R == 1:
            for e in range(2 * LE):
                experts[layer][e] -= args.lr * d_experts[e]
            elementwise(Q)
        else:                                      # FSDP's reduce-scatter, beside the rest of the backward
            eflat = stratacl.torch.zeros((R * SE,))
            torch.cat([d.reshape(-1) for d in d_experts], out=eflat[:Q])
            eshard = stratacl.torch.empty((SE,))
            expert_reducing.append((dist.reduce_scatter_single(eshard, eflat, group=replica_group, async_op=True),
                                    eshard, eflat, layer))
        # dispatch's backward: the rows' and the weights' gradients back to the tokens (a combine)
        d_rows = hbm(torch.cat([grads[0], grads[2]], dim=1))
        d_back, _ = buf.combine(d_rows.numpy(), back)
        d_back = torch.from_numpy(d_back)
        d_c_gate, d_wg = vjp(gate_weights_at(idx), [c, wg], [True, True], d_back[:, H:])
        matmul(Tc, H, E, backward=True)
        d_c = hbm(d_out + d_back[:, :H] + d_c_gate)
        elementwise(Tc * H, 4)
        d_h = stratacl.torch.empty((T, H))
        dist.all_gather_single(d_h, d_c, group=tp_group)
        d_x, d_w1, d_w2 = vjp(dense_fwd, [x, w1, w2], [True, True, True], d_h)
        matmul(T, Ft, H, backward=True)
        matmul(T, H, Ft, backward=True)
        d_x = hbm(d_x)
        dist.all_reduce(d_x, group=tp_group)
        d_wg = hbm(d_wg)
        dist.all_reduce(d_wg, group=tp_group)
        flat = stratacl.torch.zeros((DP * S,))
        torch.cat([d_w1.reshape(-1), d_w2.reshape(-1), d_wg.reshape(-1)], out=flat[:P])
        if grad_sums[0][layer] is not None:        # accumulate: earlier micro-batches' sum + this one's
            flat += grad_sums[0][layer]
            elementwise(DP * S)
        if last:
            shard = stratacl.torch.empty((S,))
            reducing.append((dist.reduce_scatter_single(shard, flat, group=fsdp_group, async_op=True), shard,
                             flat))
        else:
            grad_sums[0][layer] = flat
        d_out = (d_h + d_x)[mine]
        elementwise(T * H)
    for (work, grad, _), layer in zip(reducing, reversed(range(NL))):
        work.wait()
        shards[layer] -= args.lr * grad
        elementwise(2 * S)
    for work, grad, _, layer in expert_reducing:
        work.wait()
        experts[layer] -= args.lr * grad
        elementwise(2 * SE)
    return loss


# --- the same steps for the whole job in one process -----------------------------------------
def fold(parts: list) -> torch.Tensor:
    """An all_reduce's sum: in group rank order, from the first."""
    acc = parts[0].clone()
    for x in parts[1:]:
        acc += x
    return acc


def dispatch_alone(rows: list, idxs: list, ws: list):
    """Every destination's received rows, local expert ids and weights, and where each came
    from, as ``Buffer.dispatch`` delivers them: from the sources of its EP group, grouped by
    source rank ascending, token order."""
    got = []
    for d in range(n):
        xs, ids, wts, src = [], [], [], []
        for s in range(d // EP * EP, (d // EP + 1) * EP):
            here = idxs[s] // LE == d % EP
            tok = here.any(1).nonzero().squeeze(1)
            xs.append(rows[s][tok])
            ids.append(torch.where(here[tok], idxs[s][tok] - d % EP * LE, -1))
            wts.append(torch.where(here[tok], ws[s][tok], 0.0))
            src.append((s, tok))
        got.append((torch.cat(xs), torch.cat(ids), torch.cat(wts), src))
    return got


def combine_alone(ys: list, routed: list, rows: int, width: int) -> list:
    """Every source's combined rows: the rows of each destination (ascending) added into its
    tokens, in float32 from 0, as ``Buffer.combine`` sums them."""
    out = [torch.zeros(rows, width) for _ in range(n)]
    for d in range(n):
        at = 0
        for s, tok in routed[d][3]:
            out[s][tok] += ys[d][at:at + tok.numel()]
            at += tok.numel()
    return out


def step_alone(step: int, flats: list, experts: list) -> list:
    """One step of the job: every rank's share, rank r = (replica r // TP, TP rank r % TP), the
    micro-batches in order, their gradients summed as the ranks sum them."""
    data = [batch(step, g) for g in range(DP)]
    losses = None
    flat_sums, expert_sums = [None] * NL, [None] * NL     # per layer, per rank
    flat_grads = [None] * NL
    for j, (lo, hi) in enumerate(MICRO):
        last = j == MB - 1
        Tc = (hi - lo) // TP
        chunk = [slice(t * Tc, (t + 1) * Tc) for t in range(TP)]
        xs = [d[0][lo:hi] for d in data]
        saved = []
        for layer in range(NL):
            ws = [unflat(flats[layer][t]) for t in range(TP)]
            hs = [xs[g] + fold([dense_fwd(xs[g], *ws[t][:2]) for t in range(TP)]) for g in range(DP)]
            cs = [hs[r // TP][chunk[r % TP]].clone() for r in range(n)]
            gated = [gate_fwd(cs[r], ws[r % TP][2], drawn(step, j, layer, r, Tc)) for r in range(n)]
            routed = dispatch_alone(cs, [g[0] for g in gated], [g[1] for g in gated])
            ys = [experts_fwd(*routed[d][:3], *experts[layer][d]) for d in range(n)]
            moe = combine_alone(ys, routed, Tc, H)
            outs = [cs[r] + moe[r] for r in range(n)]
            saved.append((xs, ws, cs, gated, routed))
            xs = [torch.cat([outs[g * TP + t] for t in range(TP)]) for g in range(DP)]
        targets = [data[r // TP][1][lo:hi][chunk[r % TP]] for r in range(n)]
        part = [loss_fwd(outs[r], targets[r]) for r in range(n)]
        losses = part if losses is None else [a + b for a, b in zip(losses, part)]
        d_outs = [vjp(loss_fwd, [outs[r], targets[r]], [True, False], torch.tensor(1.0))[0] for r in range(n)]
        for layer in reversed(range(NL)):
            xs, ws, cs, gated, routed = saved[layer]
            back = dispatch_alone(d_outs, [g[0] for g in gated], [g[1] for g in gated])
            grads = [vjp(experts_fwd, [*routed[d][:3], *experts[layer][d]], [True, False, True] + [True] * 2 * LE,
                         back[d][0]) for d in range(n)]
            d_back = combine_alone([torch.cat([gr[0], gr[2]], dim=1) for gr in grads], back, Tc, H + K)
            gate_grads = [vjp(gate_weights_at(gated[r][0]), [cs[r], ws[r % TP][2]], [True, True], d_back[r][:, H:])
                          for r in range(n)]
            d_cs = [d_outs[r] + d_back[r][:, :H] + gate_grads[r][0] for r in range(n)]
            d_hs = [torch.cat([d_cs[g * TP + t] for t in range(TP)]) for g in range(DP)]
            dense = [vjp(dense_fwd, [xs[r // TP], *ws[r % TP][:2]], [True, True, True], d_hs[r // TP])
                     for r in range(n)]
            d_xs = [fold([dense[g * TP + t][0] for t in range(TP)]) for g in range(DP)]
            d_wgs = [fold([gate_grads[g * TP + t][1] for t in range(TP)]) for g in range(DP)]
            per_rank = [torch.cat([dense[r][1].reshape(-1), dense[r][2].reshape(-1), d_wgs[r // TP].reshape(-1),
                                   torch.zeros(DP * S - P)]) for r in range(n)]
            d_experts = [grads[d][3:] for d in range(n)]
            if flat_sums[layer] is not None:
                per_rank = [new + before for new, before in zip(per_rank, flat_sums[layer])]
                d_experts = [[a + b for a, b in zip(expert_sums[layer][d], d_experts[d])] for d in range(n)]
            if last:
                flat_grads[layer] = [fold([per_rank[g * TP + t] for g in range(DP)]) for t in range(TP)]
                if EP < n:         # each rank's experts' gradients summed over its replicas, in group order
                    d_experts = [[fold([d_experts[j][e] for j in range(d % EP, n, EP)]) for e in range(2 * LE)]
                                 for d in range(n)]
                for d in range(n):
                    for e in range(2 * LE):
                        experts[layer][d][e] -= args.lr * d_experts[d][e]
            else:
                flat_sums[layer], expert_sums[layer] = per_rank, d_experts
            d_outs = [(d_hs[r // TP] + d_xs[r // TP])[chunk[r % TP]] for r in range(n)]
    for layer in range(NL):
        for t in range(TP):
            flats[layer][t] -= args.lr * flat_grads[layer][t]
    return losses


shards = []
for layer in range(NL):
    s = stratacl.torch.empty((S,))
    s.copy_(flat_init(layer, tp_rank)[dp_rank * S:(dp_rank + 1) * S])
    shards.append(s)
experts = [[w for e in range(LE) for w in expert_init(layer, ep_rank * LE + e)] for layer in range(NL)]
if R > 1:          # each layer's experts: this rank's shard of them over the expert-FSDP group
    experts = [hbm(expert_flat(ws)[rep * SE:(rep + 1) * SE]) for ws in experts]
losses, step_us, compute_us = [], [], []
for step in range(args.steps):
    t0 = comm.clock() if modeled else 0.0
    w0, c0 = time.perf_counter(), charged_us[0]
    losses.append(step_distributed(step, shards, experts))
    step_us.append(((comm.clock() - t0) if modeled else time.perf_counter() - w0) * 1e6)
    compute_us.append(charged_us[0] - c0)

if args.no_check:
    # the job's loss without the one-process check: every rank's share, summed by the library
    ref_losses = None
    summed = torch.stack(losses).to(torch.float64)
    dist.all_reduce(summed)
    exact = True
else:
    ref_flats = [[flat_init(layer, t) for t in range(TP)] for layer in range(NL)]
    ref_experts = [[[w for e in range(LE) for w in expert_init(layer, d % EP * LE + e)] for d in range(n)]
                   for layer in range(NL)]
    ref_losses = [step_alone(step, ref_flats, ref_experts) for step in range(args.steps)]
    mine = slice(dp_rank * S, (dp_rank + 1) * S)
    if R > 1:
        experts_exact = all(torch.equal(experts[layer], expert_flat(ref_experts[layer][me])[rep * SE:(rep + 1) * SE])
                            for layer in range(NL))
    else:
        experts_exact = all(torch.equal(a, b) for layer in range(NL) for a, b in zip(experts[layer],
                                                                                     ref_experts[layer][me]))
    exact = (all(torch.equal(losses[s], ref_losses[s][me]) for s in range(args.steps))
             and all(torch.equal(shards[layer], ref_flats[layer][tp_rank][mine]) for layer in range(NL))
             and experts_exact)
verdict = torch.tensor([int(exact)], dtype=torch.int32)
dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
slowest = torch.tensor(step_us, dtype=torch.float64)
dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
most = torch.tensor(compute_us, dtype=torch.float64)
dist.all_reduce(most, op=dist.ReduceOp.MAX)
if me == 0:
    print(f"training step: {n} ranks (TP {TP} x FSDP {DP}, EP {EP}"
          f"{f' x expert FSDP {R}' if R > 1 else ''}), {NL} layers, hidden {H}, {E} experts "
          f"(top-{K}), {T} tokens per replica in {MB} micro-batch{'es' if MB > 1 else ''}"
          f"{' of ' + ', '.join(str(hi - lo) for lo, hi in MICRO) if MB > 1 else ''}; registration {cfg.registration}, partition {cfg.partition}, "
          f"path {cfg.path}, clock {cfg.clock}"
          + (f"; routing seeded (seed {args.seed}" + (f", imbalance {args.imbalance:g}" if SKEW else "") + ")"
             if args.routing == "seeded" else ""))
    print("exact against the job computed in one process, on every rank: "
          + ("not checked (--no-check)" if args.no_check else "yes" if verdict.item() else "NO"))
    what = "modeled" if modeled else "wall"
    for s in range(args.steps):
        if ref_losses is None:
            total = summed[s]
        else:
            total = ref_losses[s][0].clone()
            for x in ref_losses[s][1:]:
                total += x
        print(f"step {s + 1}: loss {total.item():.6f}   {what} {slowest[s].item():.1f} us (slowest rank)")
    print("roofline compute per step (most loaded rank): "
          + ", ".join(f"{most[s].item():.1f} us" for s in range(args.steps)))
dist.destroy_process_group()
if not verdict.item():
    raise SystemExit(1)
