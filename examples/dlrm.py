"""A DLRM-like recommendation model trained through torch.distributed on the emulated supernode.

    stratacl-launch -n 8 [--clock virtual] examples/dlrm.py [--steps 3] [--batch 16] [--rows 512]
        [--cache-rows C | --miss-rate M] [--zipf A] [--prefetch] [--sparse-dist]
        [--bottom-mlp 512,256,128] [--top-mlp 1024,1024,512,256]

The embedding tables are sharded table-wise (rank r owns tables r*P .. r*P+P-1, P per rank)
and the dense MLPs are replicated (data parallel), as TorchRec deploys DLRM. One step:

    this rank's samples' bag indices --all_to_all--> the tables' owners, which look the rows
        up and sum each bag
    pooled embeddings --all_to_all--> the samples' owners: bottom MLP on the dense features,
        concatenation with the pooled embeddings, top MLP, binary cross-entropy
    backward: the MLPs' gradients --all_reduce(AVG)-- (asynchronous, overlapping the next
        exchange); the pooled embeddings' gradients --all_to_all--> the owners, which add them
        into the rows they looked up (SGD)

Embedding cache (``--cache-rows C``, paper section 9, Fig. 12b). C = 0 (default): every row
of the owner's tables is in HBM. C > 0: each owner keeps its tables' full contents in host
memory (CPU DRAM, which CloudMatrix384's dies reach over UB) and C rows of each table in an
HBM cache. Before looking rows up, the owner brings the step's missing rows into the cache
with one ``comm.host_rows`` call per table, which first writes back the dirty rows it evicts
(training updates every row it looks up, so the cache holds a row's only current copy until
it is written back: one owner, one copy, coherent). Policy: LRU over the whole cache (fully
associative), ties broken by slot number, chosen because it is deterministic, needs no
per-table tuning, and keeps the heavy tail's hot rows resident; a step's rows are pinned for
the step, so C must hold the distinct rows one step touches (checked). ``--zipf A`` draws
indices from a seeded Zipf-like law, P(k-th most popular row) ~ 1/k^A over a fixed random
order of each table's rows (this example's choice: A = 1.05 for the cache sweeps, a heavy
tail like Criteo's; 0, the default, is uniform). Rank 0 reports the hit rate: the fraction
of lookups whose row was in HBM when the step's rows were brought in.

``--miss-rate M``: the steady state of a cache over a table far larger than the host holds (the
paper's 7 TiB over 128 dies: 117M rows a die, docs/end-to-end.md "Recsys against the cache at
the paper's scale"). Of each rank's lookups into a table, round(M x batch x pooling) miss a
step, at seeded places (a count, not a coin per lookup, so that a step's misses are exactly
linear in the ranks and the batch, as ``benchmarks/paper_size.py`` fits them); the others draw
from the table's ``--rows`` hot rows (by ``--zipf``, as without it); a miss reads a row of the table's
tail that no lookup has read before, since at that size the tail's rows are nearly all
distinct. The cache (sized by the example; ``--cache-rows`` is not given) pins the hot rows,
as a cache of the most popular rows keeps them, and holds the tail's rows in a window that
starts warm and full of dirty rows, so each miss evicts a dirty row and writes it back: every
step is the steady state, the first included. The window holds every lookup of a step (two
steps' under ``--prefetch``). The kernels are charged as over the ``--rows`` hot rows (the
tail's rows exist only to be fetched and written back), so a step differs from one without
misses only by the cache's traffic.

``--prefetch`` (with a cache): the next step's rows are brought in while this step runs, as
TorchRec's prefetch pipeline does. Right after its lookups, a step sends the next step's
indices to their owners (the all_to_all the next step would have made) and each owner starts
an asynchronous ``host_rows`` for them (``async_op=True``; on SDMA under ``--path auto``),
choosing victims among slots neither step uses; the next step waits for it before its
lookups. The cache must then hold two steps' rows (checked). The same rows hit, miss and are
written back as without it whenever the LRU's choices agree; the arithmetic is the same.

``--sparse-dist``: TorchRec's ``TrainPipelineSparseDist``. Before this step's forward, the
next step's indices start towards their owners (``all_to_all_single(async_op=True)``, the same
call a step would make, on the library's one data path); this step's lookups, pooled-embedding
exchange and dense forward run beside it, and the step waits for it before its backward. The
next step then starts from indices already in place. With ``--prefetch`` too, the next step's
missing rows are brought in right after that wait (they need its indices), still while this
step's backward runs. The first step's indices are exchanged before it, as a pipeline's fill.
The arithmetic is unchanged (same rows, same order), so the run stays bit-exact.

Every exchanged tensor lives in HBM (``stratacl.torch.empty``): peers pull from it in place.
Then every rank computes the same steps for the whole job alone, in this process (every
rank's samples, the same operations in the same order) and compares bit for bit: its losses,
the MLPs, and the tables it owns. Under ``--clock virtual`` every kernel is charged its
roofline time on the die (``comm.charge_kernel``: FLOPs and HBM bytes, float32 here), so the
modeled step time is printed too. Rank 0 prints what happened.
"""
import argparse
import math
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import stratacl
import stratacl.torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--batch", type=int, default=16, help="samples per rank")
p.add_argument("--tables-per-rank", type=int, default=2)
p.add_argument("--rows", type=int, default=512, help="rows per embedding table")
p.add_argument("--dim", type=int, default=16, help="embedding dimension")
p.add_argument("--pooling", type=int, default=4, help="indices per bag")
p.add_argument("--dense", type=int, default=13, help="dense features (Criteo has 13)")
p.add_argument("--hidden", type=int, default=32, help="top MLP's hidden width")
p.add_argument("--bottom-mlp", default=None,
               help="bottom MLP's layer widths, comma-separated (default: one layer of --dim); "
                    "MLPerf's DLRM on Criteo Terabyte: 512,256,128")
p.add_argument("--top-mlp", default=None,
               help="top MLP's hidden widths before its one output, comma-separated (default: --hidden); "
                    "MLPerf's DLRM on Criteo Terabyte: 1024,1024,512,256")
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--cache-rows", type=int, default=0,
               help="HBM cache rows per table, the rest in host memory (0: every row in HBM)")
p.add_argument("--miss-rate", type=float, default=0.0,
               help="the steady state of a cache over a huge table: each lookup misses with this probability "
                    "and reads a tail row never read before (see above; not with --cache-rows)")
p.add_argument("--zipf", type=float, default=0.0,
               help="index skew: P(k-th most popular row) ~ 1/k^A (0: uniform)")
p.add_argument("--prefetch", action="store_true",
               help="bring the next step's missing rows into the cache during this step (asynchronous "
                    "host_rows), as TorchRec's prefetch pipeline does (nothing to bring without --cache-rows)")
p.add_argument("--sparse-dist", action="store_true",
               help="TorchRec's TrainPipelineSparseDist: the next step's index all_to_all starts "
                    "asynchronously before this step's forward and is waited for before its backward")
p.add_argument("--no-check", dest="check", action="store_false",
               help="skip the one-process recomputation (for sweeps at sizes where it is slow)")
args = p.parse_args()

torch.set_num_threads(1)              # the same kernels, so the same bits, in the check below
dist.init_process_group("stratacl")
comm = stratacl.init()
n, me = dist.get_world_size(), dist.get_rank()
P, B, L, D, R = args.tables_per_rank, args.batch, args.pooling, args.dim, args.rows
T, FD, H = P * n, args.dense, args.hidden
BOTTOM = [int(w) for w in args.bottom_mlp.split(",")] if args.bottom_mlp else [D]
TOP = [int(w) for w in args.top_mlp.split(",")] if args.top_mlp else [H]
# each linear layer's (inputs, outputs), bottom MLP first: the dense features in, its last
# width concatenated with the T pooled embeddings into the top MLP, one logit out
LAYERS = list(zip([FD] + BOTTOM[:-1], BOTTOM)) + list(zip([BOTTOM[-1] + T * D] + TOP, TOP + [1]))
C, MISS = args.cache_rows, args.miss_rate
if not 0 <= C <= R or args.zipf < 0 or not 0 <= MISS < 1 or (MISS and C):
    raise SystemExit(f"dlrm: --cache-rows must be in 0..{R} (--rows), --zipf >= 0 and --miss-rate in [0, 1), "
                     f"not both --cache-rows and --miss-rate; got {C}, {args.zipf}, {MISS}")
# --miss-rate: the window for the tail's rows holds every lookup of a step (two under --prefetch),
# the host table adds the window's first rows and a fresh row for every lookup of every step
# (the one after the last too, which --prefetch brings in), and the cache is the hot rows and
# the window
LOOKUPS = n * B * L                   # a table's lookups a step
WINDOW = (2 if args.prefetch else 1) * LOOKUPS if MISS else 0
TAIL0 = R + WINDOW                    # the first row no lookup has read
ROWS = TAIL0 + (args.steps + 1) * LOOKUPS if MISS else R
if MISS:
    C = R + WINDOW
modeled = stratacl.config.clock != "off"


def charge(flops: float, nbytes: float) -> None:
    """A kernel's roofline time on the modeled clock (nothing without one); its HBM bytes
    compete with the communication in flight for the die's HBM bandwidth."""
    comm.charge_kernel(flops, nbytes)


def table_init(t: int) -> torch.Tensor:
    return torch.randn(ROWS, D, generator=torch.Generator().manual_seed(1000 + t)) * 0.1


def mlp_init() -> dict:
    """Normal weights of std sqrt(2 / (fan_in + fan_out)), as the DLRM reference initialises its
    MLPs, and zero biases: a layer keeps its activations' scale at any width (a fixed std would
    grow them by sqrt(fan_in) x std a layer: at MLPerf's widths the first loss was 4.5 and the
    second 80), and the last layer starts near a logit of 0 (BCE of random labels: ln 2)."""
    g = torch.Generator().manual_seed(7)
    out = {}
    for i, (fan_in, fan_out) in enumerate(LAYERS, 1):
        out[f"w{i}"] = torch.randn(fan_in, fan_out, generator=g) * math.sqrt(2.0 / (fan_in + fan_out))
        out[f"b{i}"] = torch.zeros(fan_out)
    return out


# Zipf-like popularity: the CDF over popularity ranks, and each table's rows in popularity order
_cdf = torch.cumsum(torch.arange(1, R + 1, dtype=torch.float64) ** -args.zipf, 0)
_cdf /= _cdf[-1].clone()
_order = [torch.randperm(R, generator=torch.Generator().manual_seed(2000 + t)) for t in range(T)]


def samples(step: int, rank: int):
    """Rank ``rank``'s samples at ``step``: dense features, bag indices [T, B, L], labels."""
    g = torch.Generator().manual_seed(step * 100003 + rank)
    dense = torch.randn(B, FD, generator=g)
    if args.zipf == 0:
        idx = torch.randint(0, R, (T, B, L), generator=g)
    else:
        u = torch.rand(T, B * L, generator=g, dtype=torch.float64)
        ranks = torch.searchsorted(_cdf, u).clamp_(max=R - 1)
        idx = torch.stack([_order[t][ranks[t]] for t in range(T)]).view(T, B, L)
    labels = torch.randint(0, 2, (B,), generator=g).float()
    if MISS:
        # round(MISS x B x L) of this rank's lookups into each table miss, at seeded places drawn
        # apart so that the other draws stay as without misses; a miss reads the tail row of its
        # step, rank and place, read by no other
        gm = torch.Generator().manual_seed(step * 100003 + rank + 7919)
        miss = torch.zeros(T, B * L, dtype=torch.bool)
        for t in range(T):
            miss[t, torch.randperm(B * L, generator=gm)[:round(MISS * B * L)]] = True
        fresh = TAIL0 + (step * n + rank) * B * L + torch.arange(B * L)
        idx = torch.where(miss, fresh, idx.view(T, B * L)).view(T, B, L)
    return dense, idx, labels


def pool(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Sum of each bag's rows (idx [..., L] -> [..., D]), added in bag order."""
    rows = table[idx]
    acc = rows[..., 0, :].clone()
    for k in range(1, L):
        acc += rows[..., k, :]
    return acc


def dense_forward(params: dict, dense, pooled, labels):
    """Bottom MLP, interaction (concatenation), top MLP, loss: [B, T, D] pooled -> scalar."""
    h = dense
    for i in range(1, len(BOTTOM) + 1):
        h = torch.relu(h @ params[f"w{i}"] + params[f"b{i}"])
    h = torch.cat([h, pooled.reshape(B, T * D)], dim=1)
    for i in range(len(BOTTOM) + 1, len(LAYERS)):
        h = torch.relu(h @ params[f"w{i}"] + params[f"b{i}"])
    out = len(LAYERS)
    return F.binary_cross_entropy_with_logits((h @ params[f"w{out}"] + params[f"b{out}"]).squeeze(1), labels)


def dense_backward(params: dict, dense, pooled, labels):
    """The loss, the MLPs' gradients and the pooled embeddings' gradient [B, T, D]."""
    leaves = {k: v.detach().requires_grad_() for k, v in params.items()}
    pooled = pooled.detach().requires_grad_()
    loss = dense_forward(leaves, dense, pooled, labels)
    loss.backward()
    return loss.detach(), {k: v.grad for k, v in leaves.items()}, pooled.grad


def scatter_grads(grad: torch.Tensor, idx: torch.Tensor, g: torch.Tensor) -> None:
    """Add each bag's gradient g [B, D] into the rows it looked up (idx [B, L]), bag slot by slot."""
    for k in range(L):
        grad.index_add_(0, idx[:, k], g)


class Cache:
    """One table's HBM cache of C rows over its full contents in host memory (LRU, see above)."""

    def __init__(self, t: int):
        self.table = t
        self.host = table_init(t)                          # host memory: an ordinary tensor
        self.rows = stratacl.torch.empty((C, D))           # HBM
        self.slot_row = np.full(C, -1, dtype=np.int64)     # row held by each slot (-1: empty)
        self.row_slot = np.full(ROWS, -1, dtype=np.int64)  # slot holding each row (-1: in host memory)
        self.used = np.full(C, -1, dtype=np.int64)         # step of each slot's last use
        self.dirty = np.zeros(C, dtype=bool)
        self.pinned = np.zeros(C, dtype=bool)              # never a victim (--miss-rate: the hot rows)
        if MISS:
            # warm: the hot rows and the window's first rows resident, slot s holding row s, the
            # window's rows dirty (brought in before the first step, outside its time)
            warm = np.arange(C)
            comm.host_rows(self.rows.numpy(), self.host.numpy(), warm, warm)
            self.slot_row[:], self.row_slot[:C] = warm, warm
            self.pinned[:R], self.dirty[R:] = True, True
        # per step (and the one after the last, which --prefetch brings in too): hits, lookups,
        # rows fetched, rows written back
        self.counts = np.zeros((args.steps + 1, 4), dtype=np.int64)

    def fetch(self, step: int, idx: torch.Tensor, pinned: int | None = None):
        """Make every row of ``idx`` resident (one host_rows call); returns the slots step
        ``step`` looks its rows up in, and the call's Work. Rows used by steps from ``pinned`` on
        (default: ``step``) stay; with ``pinned`` < ``step`` (a prefetch while step ``pinned``
        runs) the rows move asynchronously: wait for the Work before the lookups (else None)."""
        ids = idx.reshape(-1).numpy()
        rows = np.unique(ids)
        pinned = step if pinned is None else pinned
        if rows.size > C:
            raise SystemExit(f"dlrm: a step touches {rows.size} distinct rows of one table; --cache-rows {C} "
                             "cannot hold them (raise it)")
        resident = self.row_slot[ids] >= 0
        self.counts[step, :2] += int(resident.sum()), ids.size
        self.used[self.row_slot[rows[self.row_slot[rows] >= 0]]] = step
        miss = rows[self.row_slot[rows] < 0]
        free = np.flatnonzero((self.used < pinned) & ~self.pinned)   # slots no running or coming step uses
        if free.size < miss.size:
            raise SystemExit(f"dlrm: table {self.table}: {miss.size} rows to bring in and {free.size} slots free; "
                             f"--cache-rows {C} cannot hold two steps' rows (raise it, or drop --prefetch)")
        victims = free[np.lexsort((free, self.used[free]))[:miss.size]]
        old = self.slot_row[victims]
        back = victims[(old >= 0) & self.dirty[victims]]
        work = comm.host_rows(self.rows.numpy(), self.host.numpy(), miss, victims, back, self.slot_row[back],
                              async_op=pinned < step)
        self.row_slot[old[old >= 0]] = -1
        self.slot_row[victims], self.row_slot[miss] = miss, victims
        self.used[victims], self.dirty[victims] = step, False
        self.counts[step, 2:] += miss.size, back.size
        return torch.from_numpy(self.row_slot[ids]).view(idx.shape), work

    def update(self, rows: np.ndarray, grad: torch.Tensor) -> None:
        """SGD on the step's rows, in the cache (the same arithmetic as on the whole table)."""
        slots = torch.from_numpy(self.row_slot[rows])
        self.rows[slots] -= args.lr * grad[torch.from_numpy(rows)]
        self.dirty[self.row_slot[rows]] = True

    def flush(self) -> torch.Tensor:
        """Write every dirty row back; the host table is then the whole table."""
        back = np.flatnonzero(self.dirty & (self.slot_row >= 0))
        comm.host_rows(self.rows.numpy(), self.host.numpy(), store_slots=back, store_rows=self.slot_row[back])
        self.dirty[back] = False
        return self.host


FLAT = sum(v.numel() for v in mlp_init().values())
dense_flops = 2 * B * sum(i * o for i, o in LAYERS)          # one forward; a backward costs twice that


def step_distributed(step: int, params: dict, tables: list, bufs: dict, ahead: list | None):
    """One step; returns its loss and what the next step finds ready (``ahead`` next time: its
    indices already in bufs["idx_next"], and per table under --prefetch its rows' slots and
    Work, else None)."""
    dense, idx, labels = samples(step, me)
    if ahead is None:
        bufs["idx_out"].copy_(idx.view(n, P, B, L))
        dist.all_to_all_single(bufs["idx_in"], bufs["idx_out"])   # [s, j]: rank s's bags for my table j
    else:
        bufs["idx_in"], bufs["idx_next"] = bufs["idx_next"], bufs["idx_in"]
    dist_next = None
    if args.sparse_dist:
        # the next step's input dist, in flight beside this step's forward (after the last step
        # too, so that every step has the same shape); idx_out is not written again until it ends
        bufs["idx_out"].copy_(samples(step + 1, me)[1].view(n, P, B, L))
        dist_next = dist.all_to_all_single(bufs["idx_next"], bufs["idx_out"], async_op=True)
    for j in range(P):
        if C:
            slots, fetching = (tables[j].fetch(step, bufs["idx_in"][:, j]) if ahead is None or ahead[j] is None
                               else ahead[j])
            if fetching is not None:
                fetching.wait()
            bufs["pooled_out"][:, j] = pool(tables[j].rows, slots)
        else:
            bufs["pooled_out"][:, j] = pool(tables[j], bufs["idx_in"][:, j])
    ahead = None
    if args.prefetch and C and not args.sparse_dist:
        # the next step's indices to their owners now, and its missing rows brought in while
        # this step runs (this step's rows stay pinned); after the last step too, as a training
        # loop's pipeline would, so that every step has the same shape
        bufs["idx_out"].copy_(samples(step + 1, me)[1].view(n, P, B, L))
        dist.all_to_all_single(bufs["idx_next"], bufs["idx_out"])
        ahead = [tables[j].fetch(step + 1, bufs["idx_next"][:, j], pinned=step) for j in range(P)]
    charge(n * P * B * (L - 1) * D, 4 * n * P * B * D * (L + 1))
    dist.all_to_all_single(bufs["pooled_in"], bufs["pooled_out"])  # [o, j]: owner o's table j, my bags
    pooled = bufs["pooled_in"].permute(2, 0, 1, 3).reshape(B, T, D)
    loss, grads, gpooled = dense_backward(params, dense, pooled, labels)
    dense_bytes = 4 * 3 * (FLAT + B * sum(i for i, _ in LAYERS))
    if dist_next is None:
        charge(3 * dense_flops, dense_bytes)
    else:
        # forward (a third of the dense work), then the next step's indices must have
        # arrived before the backward (the other two thirds), as the pipeline waits
        charge(dense_flops, dense_bytes / 3)
        dist_next.wait()
        ahead = ([tables[j].fetch(step + 1, bufs["idx_next"][:, j], pinned=step) for j in range(P)]
                 if args.prefetch and C else [None] * P)
        charge(2 * dense_flops, dense_bytes * 2 / 3)
    flat = bufs["flat"]
    torch.cat([grads[k].reshape(-1) for k in params], out=flat)
    work = dist.all_reduce(flat, op=dist.ReduceOp.AVG, async_op=True)       # overlaps the exchange below
    bufs["grad_out"].copy_((gpooled / n).permute(1, 0, 2).reshape(n, P, B, D))
    dist.all_to_all_single(bufs["grad_in"], bufs["grad_out"])      # [s, j]: rank s's gradients for my table j
    for j in range(P):
        grad = torch.zeros(ROWS, D)
        for s in range(n):
            scatter_grads(grad, bufs["idx_in"][s, j], bufs["grad_in"][s, j])
        if C:
            tables[j].update(np.unique(bufs["idx_in"][:, j].numpy()), grad)
        else:
            tables[j] -= args.lr * grad
    charge(n * P * B * L * D + 2 * P * R * D, 4 * (2 * n * P * B * L * D + 3 * P * R * D))
    work.wait()
    at = 0
    for k, v in params.items():
        v -= args.lr * flat[at:at + v.numel()].view_as(v)
        at += v.numel()
    charge(2 * FLAT, 4 * 3 * FLAT)
    return loss, ahead


def step_alone(step: int, params: dict, tables: list) -> list:
    """The same step for the whole job in one process: every rank's share, in rank order."""
    losses, grads, gpooled, idxs = [], [], [], []
    for r in range(n):
        dense, idx, labels = samples(step, r)
        pooled = torch.stack([pool(tables[t], idx[t]) for t in range(T)], dim=1)      # [B, T, D]
        loss, g, gp = dense_backward(params, dense, pooled, labels)
        losses.append(loss)
        grads.append(torch.cat([g[k].reshape(-1) for k in params]))
        gpooled.append(gp / n)
        idxs.append(idx)
    avg = grads[0].clone()
    for g in grads[1:]:
        avg += g
    avg /= n
    for t in range(T):
        grad = torch.zeros(ROWS, D)
        for r in range(n):
            scatter_grads(grad, idxs[r][t], gpooled[r][:, t])
        tables[t] -= args.lr * grad
    at = 0
    for k, v in params.items():
        v -= args.lr * avg[at:at + v.numel()].view_as(v)
        at += v.numel()
    return losses


params = mlp_init()
tables = [Cache(me * P + j) if C else table_init(me * P + j) for j in range(P)]
bufs = {"idx_out": stratacl.torch.empty((n, P, B, L), dtype=torch.int64),
        "idx_in": stratacl.torch.empty((n, P, B, L), dtype=torch.int64),
        "pooled_out": stratacl.torch.empty((n, P, B, D)), "pooled_in": stratacl.torch.empty((n, P, B, D)),
        "grad_out": stratacl.torch.empty((n, P, B, D)), "grad_in": stratacl.torch.empty((n, P, B, D)),
        "flat": stratacl.torch.empty((FLAT,))}
if (args.prefetch and C) or args.sparse_dist:
    bufs["idx_next"] = stratacl.torch.empty((n, P, B, L), dtype=torch.int64)
losses, step_us, ahead = [], [], None
for step in range(args.steps):
    t0 = comm.clock() if modeled else 0.0
    w0 = time.perf_counter()
    loss, ahead = step_distributed(step, params, tables, bufs, ahead)
    losses.append(loss)
    step_us.append(((comm.clock() - t0) if modeled else time.perf_counter() - w0) * 1e6)
for pending in ahead or ():
    if pending is not None and pending[1] is not None:
        pending[1].wait()
# this rank's cache counts (hits, lookups, fetched, written), summed over its tables: every
# step's, and the last step's own (counted when its rows were brought in)
counts = sum(c.counts[:args.steps] for c in tables) if C else np.zeros((args.steps, 4), dtype=np.int64)
total, last = counts.sum(axis=0).tolist(), counts[-1].tolist()

if C:
    tables = [c.flush() for c in tables]
exact = True
if args.check:
    ref_params, ref_tables = mlp_init(), [table_init(t) for t in range(T)]
    ref_losses = [step_alone(step, ref_params, ref_tables) for step in range(args.steps)]
    exact = (all(torch.equal(losses[s], ref_losses[s][me]) for s in range(args.steps))
             and all(torch.equal(params[k], ref_params[k]) for k in params)
             and all(torch.equal(tables[j], ref_tables[me * P + j]) for j in range(P)))
verdict = torch.tensor([int(exact)], dtype=torch.int32)
dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
slowest = torch.tensor(step_us, dtype=torch.float64)
dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
hits = torch.tensor(total + last, dtype=torch.int64)
dist.all_reduce(hits)
mean_loss = torch.stack(losses).to(torch.float64)
dist.all_reduce(mean_loss)
if me == 0:
    print(f"DLRM: {n} ranks, {T} tables of {R} x {D} ({P} per rank), {B} samples per rank, bags of {L}")
    if args.bottom_mlp or args.top_mlp:
        print(f"MLPs: bottom {'-'.join(map(str, [FD] + BOTTOM))}, top {'-'.join(map(str, [LAYERS[len(BOTTOM)][0]] + TOP + [1]))}")
    if args.check:
        print(f"exact against the job computed in one process, on every rank: {'yes' if verdict.item() else 'NO'}")
    else:
        print("exact against the job computed in one process, on every rank: not checked (--no-check)")
    if C:
        what = (f"the {R} hot rows pinned and a window of {WINDOW} for the tail, misses at {MISS:g} a lookup"
                if MISS else f"{C} of {R} rows per table in HBM (LRU)")
        print(f"embedding cache: {what}, indices Zipf {args.zipf:g}: hit rate "
              f"{hits[0].item() / max(hits[1].item(), 1):.4f} ({hits[0].item()} of {hits[1].item()} lookups); "
              f"{hits[2].item()} rows fetched from host memory, {hits[3].item()} written back on eviction")
        print(f"embedding cache, last step only: hit rate {hits[4].item() / max(hits[5].item(), 1):.4f} "
              f"({hits[4].item()} of {hits[5].item()} lookups); {hits[6].item()} rows fetched, "
              f"{hits[7].item()} written back")
    for s in range(args.steps):
        what = "modeled" if modeled else "wall"
        print(f"step {s + 1}: loss {mean_loss[s].item() / n:.6f}   {what} {slowest[s].item():.1f} us (slowest rank)")
dist.destroy_process_group()
if not verdict.item():
    raise SystemExit(1)
