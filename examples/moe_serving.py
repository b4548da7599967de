"""A DeepSeek-like MoE model served on the emulated supernode: continuous batching, prefill and
decode steps, two-micro-batch overlap (TBO), expert parallelism through ``stratacl.ep``.

    stratacl-launch -n 8 --clock virtual examples/moe_serving.py [--rate 2000] [--requests 32]

The deployment is the paper's serving stack scaled down (SGLang, DeepSeek V4 Flash; paper §8.1,
"Workloads"): attention data-parallel (rank r serves requests r, r + N, r + 2N, ... as SGLang's
DP controller deals them round robin) and the MoE layers expert-parallel over all N ranks
(experts [r*L, (r+1)*L) on rank r). One instance here runs both phases (SGLang without
prefill/decode disaggregation; the paper's is disaggregated, see docs/end-to-end.md).

    requests: seeded Poisson arrivals (modeled time); input and output lengths lognormal with
        means in the Splitwise conversation trace's 8:1 ratio
    every iteration, all ranks agree on the time (all_reduce MAX of their modeled clocks) and
        so, from the same seeded stream, on who is in the batch: a prefill step if any rank can
        admit a waiting request (up to --max-batch running per rank and --prefill-tokens per
        step), else a decode step of every running request's next token
    a step: per layer, token mixing (a causal running mean, standing in for attention and
        charged as the attention it stands for), a top-k gate, dispatch, experts, combine
        (prefill: high-throughput ``dispatch``/``combine``; decode: ``low_latency_*``), a
        residual add; then the output head picks each request's next token (argmax)
    TBO: each rank's requests split into micro-batches A and B; A's dispatch and combine run
        asynchronously (``async_op=True``) while B's attention or experts run, and vice versa

Under ``--clock virtual`` every kernel is charged its roofline time on the die
(``Topology.kernel_us``, float32 at these dimensions; ``--weight-bytes`` reads the weights at
another width, ``--rows float16`` the activations, ``--attention-weights`` adds the attention's
projections) through ``charge_kernel``, which shares
the die's cores with the dispatches and combines in flight: MTE copies hold their cores for
the whole call, SDMA only for posting. Under ``--registration pool`` a rank admits fewer
requests at once: the pre-registered pool's caching allocator fits 359 of the 394 requests
the expandable allocator fits (docs/memory.md, docs/results/fragmentation-2026-12-02.json).

With ``--warmup W``, W requests of their own seed, all arriving at once, are served first
through the same code (so their shapes are allocated and, under ``--registration jit``, the
peers' buffers mapped, as a serving engine warms up before it takes traffic); the measured
stream's arrivals start when the warm-up is done, and only its requests count in the metrics.

With ``--per-rank``, ``--requests`` and ``--warmup`` count each rank's requests, and every rank's
k-th request has the same lengths and arrival (request k N + r is rank r's k-th): the even load a
DP balancer aims at. Its iterations then have one shape on every rank and at every N, so its
traces (``--trace``) extrapolate to the paper's scale (``ub.extrapolate``), and ``--timeline``
names the ``comm.clock()`` reads each measured request's times came from, for the metrics at
that scale (``benchmarks/e2e.py --scale``).

With ``--routing seeded``, each iteration's experts are drawn by ``stratacl.ep.routing`` (uniform
top-k, distinct experts per row, as DeepEP's tests draw random top-k) from ``--seed``, the
iteration, the layer, the micro-batch and the rank, instead of the gate's top-k of its scores
(the weights are still the softmax of the gate's scores at the drawn experts). The rows then go
to the same experts at every ``--hidden``, so the traces extrapolate in it
(``ub.extrapolate_dimension``, ``benchmarks/paper_size.py``); with the gate's routing they
follow the activations, which change with hidden, and are refused.

Then every rank computes all the iterations alone (the warm-up's too), in this process (every rank's micro-batches,
the rows each expert received in the order the dispatch documents, the combine's sums in its
documented order) and compares bit for bit: the tokens its requests generated and their states.
Rank 0 prints the metrics, from the agreed times: throughput (generated tokens per second),
normalized latency (mean of end-to-end latency / generated tokens), P99 time to first token,
P99 time per output token. ``--no-check`` skips that check (it costs N times the serving's
compute on every rank), for recordings of settings already checked.
"""
import argparse
import collections
import json
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist

import serving_deployment as deploy
import stratacl
import stratacl.torch
from stratacl import ep

p = argparse.ArgumentParser()
p.add_argument("--rate", type=float, default=2000.0, help="request arrivals per second of modeled time (0: all at once)")
p.add_argument("--requests", type=int, default=32)
p.add_argument("--warmup", type=int, default=0,
               help="requests served before the measured stream (all arriving at once, their own seed); "
                    "the metrics' clock starts when they are done")
p.add_argument("--per-rank", action="store_true",
               help="--requests and --warmup count requests per rank, and every rank's k-th request has the "
                    "same lengths and arrival (--rate: per rank): a DP balancer's even load, whose iterations "
                    "have one shape on every rank and at every N, so the traces extrapolate (ub.extrapolate)")
p.add_argument("--timeline", default=None,
               help="rank 0 writes here (JSON) which of its comm.clock() reads each measured request arrived, "
                    "got its first token and finished at: with ub.replay's clocks, the metrics at any scale")
p.add_argument("--seed", type=int, default=1)
p.add_argument("--mean-input", type=float, default=64.0, help="mean prompt length (tokens)")
p.add_argument("--ratio", type=float, default=8.0, help="mean input / mean output length (Splitwise conversation: ~8)")
p.add_argument("--max-batch", type=int, default=16, help="running requests per rank (before the pool's tax)")
p.add_argument("--prefill-tokens", type=int, default=256, help="prompt tokens per rank per prefill step")
p.add_argument("--layers", type=int, default=4)
p.add_argument("--hidden", type=int, default=512)
p.add_argument("--ffn", type=int, default=128, help="each expert's intermediate size")
p.add_argument("--experts-per-rank", type=int, default=4)
p.add_argument("--topk", type=int, default=8)
p.add_argument("--vocab", type=int, default=1024)
p.add_argument("--weight-bytes", type=int, default=4, choices=(1, 2, 4),
               help="bytes of one weight as the modeled kernels read it (gate, experts, attention, output head): "
                    "4 is the float32 the host computes with; 1 is a model served with FP8 or INT8 weights. Only "
                    "the modeled clock sees it (activations and KV cache: --rows)")
p.add_argument("--rows", choices=("float32", "float16"), default="float32",
               help="the dtype of the rows dispatch and combine carry: float16 has the paper's 2-byte rows (its "
                    "bf16); the experts compute in float32 on the rows cast back, and the modeled kernels read "
                    "activations and KV cache of that width")
p.add_argument("--attention-weights", type=float, default=0.0,
               help="the projection weights of the attention each layer's token mixing stands for, in units of "
                    "hidden^2 (DeepSeek-V3's MLA: 187.1M at hidden 7168, 3.64); the modeled clock only: read "
                    "once per micro-batch and layer at --weight-bytes each, 2 FLOPs a weight and a token")
p.add_argument("--no-check", action="store_true",
               help="skip the check against the job computed in one process (N times the serving's compute "
                    "on every rank); for recordings of a configuration already checked at these settings")
p.add_argument("--routing", choices=("gate", "seeded"), default="gate",
               help="gate: each row's top-k of its gate scores (routing follows the activations); seeded: each "
                    "iteration's experts drawn by stratacl.ep.routing, uniform, from --seed, the iteration, layer, "
                    "micro-batch and rank, the same at every --hidden (so the traces extrapolate in it)")
# the paper's deployment (docs/end-to-end.md, "Serving as the paper deploys it"; defaults keep the example's own)
p.add_argument("--lengths", choices=("lognormal", "splitwise"), default="lognormal",
               help="lognormal: the example's scaled-down lengths (--mean-input, --ratio); splitwise: drawn from the "
                    "distributions fitted to the Splitwise conversation trace (examples/serving_deployment.py)")
p.add_argument("--skew", type=float, default=0.0,
               help="--routing seeded: the experts' popularity (q + 1)^-skew over one order shared by every rank "
                    "(ep.routing(shared=True)); 0: uniform. The deployment's: serving_deployment.zipf_exponent()")
p.add_argument("--mtp", action="store_true",
               help="multi-token prediction, one draft token: a decode step runs the model on each request's last "
                    "token and its draft, keeps the draft with probability --mtp-accept (seeded) and then a bonus "
                    "token, and an MTP layer (one more layer) drafts the next from the last kept row")
p.add_argument("--mtp-accept", type=float, default=deploy.MTP_ACCEPT)
p.add_argument("--attention", choices=("mixing", "v4"), default="mixing",
               help="what the token mixing is charged as: mixing, causal attention of H-wide K and V; v4, DeepSeek "
                    "V4 Flash's compressed sparse attention over its KV layout (serving_deployment.v4_attention)")
p.add_argument("--vocab-charged", type=int, default=0,
               help="the output head's vocabulary in the modeled kernels (0: --vocab, which the host computes)")
p.add_argument("--step-table", default=None,
               help="instead of a request stream, these iterations only, e.g. 'prefill=1,4;decode=1,16': prefill "
                    "iterations of that many prompts of --prompt tokens a rank, decode iterations of that many "
                    "requests a rank at context --context (their prompts not run: seeded states stand for them); "
                    "each iteration's modeled time is printed (and, with --timeline, its clock reads written)")
p.add_argument("--prompt", type=int, default=64, help="--step-table: a prefill iteration's prompt length")
p.add_argument("--context", type=int, default=64, help="--step-table: a decode request's context on entering")
p.add_argument("--layer-clocks", action="store_true",
               help="read the clock at the top of every layer (the timeline names the reads): a layer's period")
args = p.parse_args()
if args.skew and args.routing != "seeded":
    p.error("--skew draws the experts with ep.routing: it needs --routing seeded")

torch.set_num_threads(1)              # the same kernels, so the same bits, in the check below
dist.init_process_group("stratacl")
comm = stratacl.init()                # the world group's communicator (stratacl/torch/_groups.py)
n, me = comm.size, comm.rank
NL, H, F, V = args.layers, args.hidden, args.ffn, args.vocab
LX = args.experts_per_rank
E = LX * n
K = min(args.topk, E)
WB = args.weight_bytes                # a weight's bytes in the kernels' modeled HBM traffic
ROW = getattr(torch, args.rows)       # the rows dispatch and combine carry
AB = torch.finfo(ROW).bits // 8       # an activation's bytes in the kernels' modeled HBM traffic
AW = args.attention_weights * H * H      # the attention's projection weights per layer (a polynomial in H)
modeled = stratacl.config.clock != "off"
if args.timeline and not modeled:
    raise SystemExit("moe_serving: --timeline names comm.clock() reads: launch with --clock virtual")
# the pool's tax on the batch: docs/results/fragmentation-2026-12-02.json, serving, largest batch 359
# (caching allocator, registration pool) against 394 (expandable, roa)
POOL_FITS = 359 / 394
MAX_BATCH = args.max_batch if stratacl.config.registration != "pool" else max(2, int(args.max_batch * POOL_FITS))


def step_table(spec: str) -> list:
    """``--step-table``: [(kind, requests a rank), ...] in the order given."""
    out = []
    for part in spec.split(";"):
        kind, _, counts = part.partition("=")
        if kind.strip() not in ("prefill", "decode") or not counts:
            raise SystemExit(f"moe_serving: --step-table {spec!r}: parts are prefill=... or decode=...")
        out += [(kind.strip(), int(c)) for c in counts.split(",")]
    return out


TABLE = step_table(args.step_table) if args.step_table else None
if TABLE:                             # the batches are the table's: no cap (the pool's included)
    MAX_BATCH = max(c for _, c in TABLE)
ROWS = 2 if args.mtp else 1           # rows a decode step runs per request: its token, and its draft
LL_CAP = ROWS * ((MAX_BATCH + 1) // 2)    # low-latency buffers: tokens per rank per micro-batch
VC = args.vocab_charged or V          # the head's vocabulary as the modeled kernels read it
NLM = NL + (1 if args.mtp else 0)     # layers with a state: the model's, and the MTP layer


def charge(flops: float, nbytes: float) -> None:
    """A kernel's roofline time on the modeled clock (nothing without one). A kernel with no
    work takes no time, but is charged all the same, so that every rank's trace has one shape."""
    if modeled:
        comm.charge_kernel(flops, nbytes)


# --- the request stream (the same on every rank) -------------------------------------------
def lognormal(rng, mean: float, sigma: float, size: int) -> np.ndarray:
    return rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, size)


def lengths(rng, count: int) -> tuple:
    if args.lengths == "splitwise":
        return deploy.splitwise_lengths(rng, count)
    # lognormal: positive and right-skewed, as request lengths are; sigma 0.6 is this example's
    # choice, the means are the Splitwise conversation trace's ratio (input:output ~8:1)
    ins = np.clip(np.rint(lognormal(rng, args.mean_input, 0.6, count)), 2, 4 * args.mean_input).astype(int)
    outs = np.clip(np.rint(lognormal(rng, args.mean_input / args.ratio, 0.6, count)), 1,
                   4 * args.mean_input / args.ratio).astype(int)
    return ins, outs


# requests 0 .. R-1 are the measured stream, R .. R+W-1 the warm-up (served first, all arriving
# at once, so the batch and the allocator reach the sizes a busy stream needs, and under jit the
# peers map the buffers); the warm-up has its own seed, so the measured stream is the same with
# or without it
# (--per-rank: the stream is drawn for one rank's requests and dealt to every rank alike, request
# q = k N + r being rank r's k-th)
rng = np.random.default_rng(args.seed)
R, W = args.requests, args.warmup
gaps = rng.exponential(1.0 / args.rate, R) if args.rate > 0 else np.zeros(R)
STREAM = np.cumsum(gaps) - gaps[0]                         # seconds after the origin; the first at 0
IN_LEN, OUT_LEN = lengths(rng, R)
warm_in, warm_out = lengths(np.random.default_rng([args.seed, 1]), W)
if args.per_rank:
    STREAM, IN_LEN, OUT_LEN, warm_in, warm_out = (np.repeat(v, n) for v in (STREAM, IN_LEN, OUT_LEN, warm_in,
                                                                            warm_out))
    R, W = R * n, W * n
IN_LEN, OUT_LEN = np.concatenate([IN_LEN, warm_in]), np.concatenate([OUT_LEN, warm_out])
TABLE_LOG = []             # --step-table: the iterations, [(kind, per-rank request lists)]
if TABLE:                  # dealt as --per-rank deals: request base + k N + r is rank r's k-th
    for kind, c in TABLE:
        base = sum(len(x) for _, per in TABLE_LOG for x in per)
        TABLE_LOG.append((kind, [[base + k * n + r for k in range(c)] for r in range(n)]))
    R, W = sum(c for _, c in TABLE) * n, 0
    IN_LEN = np.concatenate([np.full(c * n, args.prompt if kind == "prefill" else args.context) for kind, c in TABLE])
    OUT_LEN = np.concatenate([np.full(c * n, 1 if kind == "prefill" else 1 + ROWS) for kind, c in TABLE])
    STREAM = np.zeros(R)
SAME_EVERYWHERE = args.per_rank or bool(TABLE)     # every rank's k-th request alike
OWNER = np.concatenate([np.arange(R) % n, np.arange(W) % n])
ARRIVAL = np.zeros(R + W)                                  # absolute (the clock's seconds), set when served


def prompt(q: int) -> torch.Tensor:
    seed = [5, q] if q < R else [6, q - R]
    return torch.from_numpy(np.random.default_rng(seed).integers(0, V, IN_LEN[q]))


# --- the model (the same weights on every rank, seeded) --------------------------------------
g = torch.Generator().manual_seed(7)
EMBED = torch.randn(V, H, generator=g)
GATE = [torch.randn(H, E, generator=g) / math.sqrt(H) for _ in range(NL)]
HEAD = torch.randn(H, V, generator=g) / math.sqrt(H)
if args.mtp:                          # the MTP layer's gate (its experts: expert_weights(NL, e))
    GATE.append(torch.randn(H, E, generator=g) / math.sqrt(H))
_experts: dict = {}


def expert_weights(layer: int, e: int):
    if (layer, e) not in _experts:
        ge = torch.Generator().manual_seed(1000 * layer + e + 17)
        _experts[layer, e] = (torch.randn(H, F, generator=ge) / math.sqrt(H),
                              torch.randn(F, H, generator=ge) / math.sqrt(F))
    return _experts[layer, e]


def mlp(layer: int, e: int, rows: torch.Tensor) -> torch.Tensor:
    w1, w2 = expert_weights(layer, e)
    return torch.relu(rows @ w1) @ w2


class States:
    """Every request's token-mixing state: per layer the running sum of its inputs, the tokens
    it has seen (the KV cache's stand-in), the tokens it generated and, under --mtp, its draft
    and how many inputs its MTP layer has had."""

    def __init__(self):
        self.sums, self.seen, self.tokens = {}, collections.Counter(), collections.defaultdict(list)
        self.draft, self.mtp = {}, collections.Counter()

    def attend(self, layer: int, reqs: list, lens: list, x: torch.Tensor, prefill: bool,
               keep: list | None = None) -> torch.Tensor:
        """x [tokens, H] -> x plus the running mean of each request's inputs so far. A prompt
        starts its sums; otherwise each request's ``lens`` rows continue them, and the sum keeps
        ``keep`` of them (all when None: the KV cache keeps a rejected draft's row no longer)."""
        if prefill:
            out, at = [], 0
            for q, t in zip(reqs, lens):
                s = torch.cumsum(x[at:at + t], 0)
                self.sums.setdefault(q, torch.zeros(NLM, H))[layer] = s[-1]
                out.append(x[at:at + t] + s / torch.arange(1, t + 1, dtype=torch.float32)[:, None])
                at += t
            return torch.cat(out) if out else x.clone()
        if not reqs:
            return x.clone()
        base = [self.mtp[q] if layer == NL else self.seen[q] for q in reqs]
        if keep is None and all(t == 1 for t in lens):
            s = torch.stack([self.sums[q][layer] for q in reqs]) + x
            for i, q in enumerate(reqs):
                self.sums[q][layer] = s[i]
            return x + s / torch.tensor([b + 1 for b in base], dtype=torch.float32)[:, None]
        out, at = [], 0
        for i, (q, t) in enumerate(zip(reqs, lens)):
            s = self.sums[q][layer] + torch.cumsum(x[at:at + t], 0)
            self.sums[q][layer] = s[(t if keep is None else keep[i]) - 1]
            out.append(x[at:at + t] + s / torch.arange(base[i] + 1, base[i] + t + 1, dtype=torch.float32)[:, None])
            at += t
        return torch.cat(out)


def start(states: States) -> None:
    """--step-table: the decode iterations' requests as if their prompts of --context tokens had
    been prefilled (seeded states, a seeded last token and draft), the same on every rank."""
    for kind, per_rank in TABLE_LOG:
        for q in (q for x in per_rank for q in x if kind == "decode"):
            gq = torch.Generator().manual_seed(1_000_003 + q)
            states.sums[q] = torch.randn(NLM, H, generator=gq)
            states.seen[q], states.mtp[q] = args.context, 1
            states.tokens[q] = [int(torch.randint(0, V, (1,), generator=gq))]
            states.draft[q] = int(torch.randint(0, V, (1,), generator=gq))


def attention_cost(reqs: list, prefill: bool) -> tuple:
    """FLOPs and HBM bytes of the attention the token mixing stands for, ``reqs`` [(context
    before the step, new tokens)]. ``--attention mixing``: causal attention with K and V of H
    each per token (``AB`` bytes an element), a new token at context p attending p pairs;
    ``v4``: V4 Flash's (serving_deployment.v4_attention). Its ``AW`` projection weights
    (``--attention-weights``) are read once."""
    tokens = sum(t for _, t in reqs)
    proj = 2 * tokens * AW, WB * AW if tokens else 0
    if args.attention == "v4":
        flops, nbytes = deploy.v4_attention(reqs)
        return flops + proj[0], nbytes + proj[1]
    pairs = sum(t * c + t * (t + 1) / 2 for c, t in reqs)
    if prefill:
        return 4 * H * pairs + proj[0], AB * H * (4 * tokens) + proj[1]          # read q, write k, v, out
    return 4 * H * pairs + proj[0], AB * H * (2 * pairs + 2 * tokens) + proj[1]


def gate(layer: int, a: torch.Tensor, it: int, m: int, r: int):
    """Top-k experts of each row (int64) and their softmax weights (float32). ``--routing
    seeded``: the experts drawn by ``ep.routing`` (uniform, distinct per row) from the seed, the
    iteration ``it``, the layer, the micro-batch ``m`` and the rank ``r``, so the same rows go to
    the same experts at every hidden size; the weights are still the softmax of the row's gate
    scores at those experts."""
    scores = a @ GATE[layer]
    if args.routing == "gate":
        top, idx = torch.topk(scores, K, dim=1)
    else:
        seed = ((args.seed * 1_000_003 + it) * NLM + layer) * 2 + m
        idx = torch.from_numpy(ep.routing([0] * r + [a.shape[0]], E, K, r + 1, args.skew, seed,
                                          shared=args.skew > 0)[r])
        top = torch.gather(scores, 1, idx)
    return idx, torch.softmax(top, dim=1)


def experts_ht(layer: int, d: int, recv_x: torch.Tensor, recv_idx: torch.Tensor, recv_w: torch.Tensor):
    """Rank d's experts on the rows a high-throughput dispatch delivered: each row's outputs
    of its local experts, weighted, added expert by expert."""
    y = torch.zeros_like(recv_x)
    for e in range(LX):
        rows, ks = torch.nonzero(recv_idx == e, as_tuple=True)
        if rows.numel():
            y[rows] += recv_w[rows, ks][:, None] * mlp(layer, d * LX + e, recv_x[rows])
    return y


def experts_cost(counts) -> tuple:
    """Expert MLPs on ``counts`` rows each: FLOPs and bytes (weights, of ``WB`` bytes, read once
    per expert used; activations of ``AB``)."""
    m = sum(counts)
    used = sum(1 for c in counts if c)
    return 4 * m * H * F, WB * 2 * H * F * used + AB * m * (2 * H + F)


# --- the schedule (identical on every rank: it depends only on the agreed times) -----------
READS = 0          # this rank's comm.clock() reads so far: the same count on every rank


def clock_now() -> float:
    global READS
    READS += 1
    return comm.clock()


def agreed_now() -> float:
    """The iteration boundary's time, the same on every rank (the latest of their clocks);
    AT[-1] is the read it came from."""
    t = torch.tensor([clock_now() if modeled else time.time() - WALL0], dtype=torch.float64)
    AT.append(READS - 1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


AT: list = []


WALL0 = 0.0
if not modeled:
    w = torch.tensor([time.time()], dtype=torch.float64)
    dist.all_reduce(w, op=dist.ReduceOp.MAX)
    WALL0 = w.item()

# one buffer per micro-batch, each with its own dispatch/combine pair in flight
BUFS = [ep.Buffer(comm, E), ep.Buffer(comm, E)]


def split(reqs: list) -> list:
    half = (len(reqs) + 1) // 2
    return [reqs[:half], reqs[half:]]


def hbm(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied into this rank's HBM (peers pull from it in place)."""
    out = stratacl.torch.empty(t.shape, dtype=t.dtype)
    out.copy_(t)
    return out


ITER = 0           # iterations stepped so far (the warm-up's first): --routing seeded draws by it
LAYER_AT: list = []    # --layer-clocks: per iteration, the reads at the top of each layer


def kept(q: int, it: int) -> int:
    """The rows of request ``q``'s decode step ``it`` its KV cache keeps: its token, and under
    --mtp its draft if the seeded draw accepts it. The draw is keyed by the request's place in
    its rank's stream under --per-rank and --step-table, so it is the same on every rank, at
    every N and at every hidden size."""
    if ROWS == 1:
        return 1
    which, k = (0, q) if q < R else (1, q - R)
    if SAME_EVERYWHERE:
        k //= n
    return 1 + int(np.random.default_rng([args.seed, 11, which, k, it]).random() < args.mtp_accept)


def inputs(states: States, mb: list, prefill: bool) -> torch.Tensor:
    """A micro-batch's input rows: its prompts, or each request's last token (and its draft)."""
    if prefill and mb:
        t = torch.cat([prompt(q) for q in mb])
    else:
        t = torch.tensor([v for q in mb for v in ((states.tokens[q][-1], states.draft[q]) if ROWS == 2
                                                  else (states.tokens[q][-1],))], dtype=torch.int64)
    return EMBED[t]


def plan(states: States, mbs: list, prefill: bool, it: int) -> tuple:
    """A step's rows per request, kept rows and attention contexts [(before, new)], per micro-batch."""
    lens = [[int(IN_LEN[q]) if prefill else ROWS for q in mb] for mb in mbs]
    keep = [None if prefill or ROWS == 1 else [kept(q, it) for q in mb] for mb in mbs]
    ctx = [[(0 if prefill else states.seen[q], t) for q, t in zip(mb, ln)] for mb, ln in zip(mbs, lens)]
    return lens, keep, ctx


def last_rows(x: torch.Tensor, lens: list, keep: list | None) -> torch.Tensor:
    """Each request's row at its last kept position (the MTP layer's input)."""
    if not lens:
        return x[:0]
    ends = np.cumsum(lens) - np.asarray(lens) + np.asarray(keep if keep is not None else lens) - 1
    return x[torch.from_numpy(ends)]


def head(x: torch.Tensor, timed: bool = True) -> list:
    """The output head on rows ``x``: each row's next token (argmax); charged at --vocab-charged."""
    if not x.shape[0]:
        return []
    if timed:
        charge(2 * x.shape[0] * H * VC, WB * H * VC + AB * x.shape[0] * (H + VC))
    return torch.argmax(x @ HEAD, dim=1).tolist()


def emit(states: States, mb: list, lens: list, keep: list | None, x: torch.Tensor, prefill: bool,
         timed: bool = True) -> None:
    """A micro-batch's new tokens from its last layer's rows ``x``: a prompt's next token; a
    decode step's token or, its draft accepted, the draft and the token after it (no more than
    the request's output length). Its requests' contexts grow by the rows kept."""
    if not mb:
        return
    toks = head(x[torch.tensor(np.cumsum(lens) - 1)] if prefill else x, timed)
    for i, q in enumerate(mb):
        new = (toks[i:i + 1] if prefill or ROWS == 1 else
               [states.draft[q], toks[2 * i + 1]] if keep[i] == 2 else toks[2 * i:2 * i + 1])
        states.tokens[q] += new[:max(0, int(OUT_LEN[q]) - len(states.tokens[q]))]
        states.seen[q] += lens[i] if keep is None else keep[i]


def drafts(states: States, mb: list, x: torch.Tensor, timed: bool = True) -> None:
    """The MTP layer's rows through the head: each request's draft for its next step."""
    for q, tok in zip(mb, head(x, timed)):
        states.draft[q] = tok
        states.mtp[q] += 1


def step(states: States, kind: str, reqs: list) -> None:
    """One iteration on this rank: its requests ``reqs`` (maybe none) in two micro-batches: the
    model's layers, the head, and under --mtp the MTP layer on each request's last kept row."""
    global ITER
    it, ITER = ITER, ITER + 1
    prefill = kind == "prefill"
    mbs = split(reqs)
    LAYER_AT.append([])
    lens, keep, ctx = plan(states, mbs, prefill, it)
    # the MTP layer's input: each request's last kept row, at that row's context
    mctx = [[(c + (k or t) - 1, 1) for (c, t), k in zip(ctx[m], keep[m] or [None] * len(ctx[m]))] for m in range(2)]
    tops = [None, None]

    def done(m: int, xm: torch.Tensor) -> None:      # as each micro-batch's last combine arrives
        tops[m] = last_rows(xm, lens[m], keep[m])
        emit(states, mbs[m], lens[m], keep[m], xm, prefill)

    layers(states, range(NL), mbs, lens, keep, [inputs(states, mb, prefill) for mb in mbs], prefill, it, ctx, done)
    if args.mtp:
        layers(states, [NL], mbs, [[1] * len(mb) for mb in mbs], [None, None], tops, prefill, it, mctx,
               lambda m, xm: drafts(states, mbs[m], xm))


def layers(states: States, ids, mbs: list, lens: list, keep: list, x: list, prefill: bool, it: int,
           ctx: list, done) -> None:
    """Layers ``ids`` on this rank's two micro-batches ``x`` under two-batch overlap: one's
    dispatch and combine in flight while the other's attention or experts run; ``done(m, rows)``
    takes each micro-batch's output as its last combine arrives."""
    a, pending, disp = [None, None], [None, None], [None, None]
    route = [None, None]
    for layer in ids:
        if args.layer_clocks:
            clock_now()
            LAYER_AT[-1].append(READS - 1)
        for m in range(2):
            if pending[m] is not None:          # the previous layer's combine of this micro-batch
                x[m] = a[m] + combined(pending[m], prefill)
            a[m] = states.attend(layer, mbs[m], lens[m], x[m], prefill, keep[m])
            idx, w = gate(layer, a[m], it, m, me)
            charge(*attention_cost(ctx[m], prefill))
            charge(2 * a[m].shape[0] * H * E, AB * a[m].shape[0] * (H + E) + WB * H * E)
            rows = hbm(a[m].to(ROW))
            route[m] = (rows, idx.numpy().copy(), w.numpy().copy())
            if prefill:
                disp[m] = BUFS[m].dispatch(rows.numpy(), route[m][1], route[m][2], async_op=True)
            else:
                disp[m] = BUFS[m].low_latency_dispatch(rows.numpy(), route[m][1], LL_CAP, async_op=True)
        for m in range(2):
            got = disp[m].result()
            if prefill:
                recv_x, recv_idx, recv_w, per_expert, handle = got
                y = stratacl.torch.empty((recv_x.shape[0], H), dtype=ROW)
                y.copy_(experts_ht(layer, me, torch.from_numpy(recv_x).float(), torch.from_numpy(recv_idx),
                                   torch.from_numpy(recv_w)))
                charge(*experts_cost(per_expert.tolist()))
                pending[m] = BUFS[m].combine(y.numpy(), handle, async_op=True)
            else:
                recv_x, count, handle = got
                y = stratacl.torch.zeros((LX, n * LL_CAP, H), dtype=ROW)
                for e in range(LX):
                    c = int(count[e])
                    if c:
                        y[e, :c] = mlp(layer, me * LX + e, torch.from_numpy(recv_x[e, :c]).float())
                charge(*experts_cost(count.tolist()))
                pending[m] = BUFS[m].low_latency_combine(y.numpy(), route[m][1], route[m][2], handle,
                                                         async_op=True)
    for m in range(2):
        done(m, a[m] + combined(pending[m], prefill))


def combined(work, prefill: bool) -> torch.Tensor:
    out = work.result()
    return torch.from_numpy(np.array(out[0] if prefill else out)).float()


FIRST, FINISH = np.zeros(R + W), np.zeros(R + W)   # per request: first-token and finish times (agreed)
FIRST_AT, FINISH_AT = np.zeros(R + W, dtype=int), np.zeros(R + W, dtype=int)     # ... and their reads


def schedule_and_run(states: States, reqs: list) -> tuple:
    """Serve requests ``reqs`` (in order of ARRIVAL) to the end; fills FIRST and FINISH and
    returns the log [(kind, per-rank request lists)] and the agreed time it ended."""
    waiting = [collections.deque() for _ in range(n)]
    running = [[] for _ in range(n)]
    arrived, done = 0, 0
    first, finish, generated = FIRST, FINISH, np.zeros(R + W, dtype=int)
    log, last, it = [], None, ITER
    now = agreed_now()
    while True:
        if last is not None:                   # the previous iteration (number `it`) ended at `now`
            kind, per_rank = last
            for r in range(n):
                for q in per_rank[r]:
                    generated[q] += 1 if kind == "prefill" else min(kept(q, it), OUT_LEN[q] - generated[q])
                    if kind == "prefill":
                        first[q], FIRST_AT[q] = now, AT[-1]
                        running[r].append(q)
                    if generated[q] >= OUT_LEN[q]:
                        finish[q], FINISH_AT[q] = now, AT[-1]
                        running[r].remove(q)
                        done += 1
        if done == len(reqs):
            return log, now
        while arrived < len(reqs) and ARRIVAL[reqs[arrived]] <= now:
            waiting[OWNER[reqs[arrived]]].append(reqs[arrived])
            arrived += 1
        admit = [[] for _ in range(n)]
        for r in range(n):
            budget = args.prefill_tokens
            while (waiting[r] and len(running[r]) + len(admit[r]) < MAX_BATCH
                   and (not admit[r] or IN_LEN[waiting[r][0]] <= budget)):
                budget -= IN_LEN[waiting[r][0]]
                admit[r].append(waiting[r].popleft())
        if any(admit):
            last = ("prefill", admit)
        elif any(running):
            last = ("decode", [list(x) for x in running])
        else:                                  # nothing to do until the next arrival
            if modeled:
                comm.charge_compute(max(0.0, ARRIVAL[reqs[arrived]] - clock_now()) * 1e6, cores=1)
            else:
                time.sleep(max(0.0, ARRIVAL[reqs[arrived]] - (time.time() - WALL0)))
            now, last = agreed_now(), None
            continue
        log.append(last)
        it = ITER
        step(states, last[0], last[1][me])
        now = agreed_now()


# --- the same iterations in one process -------------------------------------------------------
def moe_alone(layer: int, prefill: bool, a: list, route: list) -> list:
    """One micro-batch's MoE on every rank (a[r] [T_r, H], route[r] = (idx, w)), as dispatch,
    the experts and combine compute it: the rows each rank receives in the documented order,
    the combine's sums in its documented order. Returns each rank's combined rows."""
    if prefill:
        ys = []
        for d in range(n):             # rank d receives, source by source, its tokens with an expert on d
            sel = [(s, torch.nonzero((route[s][0] // LX == d).any(dim=1)).flatten()) for s in range(n)]
            recv_x = torch.cat([a[s][t] for s, t in sel]).to(ROW).float()
            ridx = torch.cat([torch.where(route[s][0][t] // LX == d, route[s][0][t] - d * LX, -1) for s, t in sel])
            rw = torch.cat([torch.where(route[s][0][t] // LX == d, route[s][1][t], 0.0) for s, t in sel])
            y = experts_ht(layer, d, recv_x, ridx, rw).to(ROW).float()
            at, mine = 0, {}
            for s, t in sel:
                mine[s] = (t, y[at:at + t.numel()])
                at += t.numel()
            ys.append(mine)
        out = []
        for s in range(n):
            acc = torch.zeros(a[s].shape[0], H)
            for d in range(n):         # destination-rank order, float32 from 0
                t, rows = ys[d][s]
                acc[t] = acc[t] + rows
            out.append(acc.to(ROW).float())
        return out
    outs, base = [], 0                 # every expert's output rows, one after the other
    pos = [torch.full(route[s][0].shape, -1, dtype=torch.int64) for s in range(n)]
    for g_ in range(E):                # expert g_ receives, source by source, the tokens that picked it
        rows = []
        for s in range(n):
            hit = route[s][0] == g_
            t = torch.nonzero(hit.any(dim=1)).flatten()
            pos[s][hit] = base + torch.arange(t.numel())       # at most one k per token: token order
            base += t.numel()
            rows.append(a[s][t])
        m = torch.cat(rows).to(ROW).float()
        if m.shape[0]:
            outs.append(mlp(layer, g_, m).to(ROW).float())
    ys = torch.cat(outs) if outs else torch.zeros(0, H)
    out = []
    for s in range(n):
        w = route[s][1]
        acc = torch.zeros(a[s].shape[0], H)
        for k in range(K):             # k in order, weighted, float32 from 0
            acc = acc + w[:, k:k + 1] * ys[pos[s][:, k]]
        out.append(acc.to(ROW).float())
    return out


def layers_alone(states: States, ids, mbs: list, lens: list, keep: list, x: list, prefill: bool, it: int) -> None:
    """``layers`` for every rank at once (``x[r][m]`` replaced by each layer's output)."""
    for layer in ids:
        for m in range(2):
            a = [states.attend(layer, mbs[r][m], lens[r][m], x[r][m], prefill, keep[r][m]) for r in range(n)]
            route = [gate(layer, a[r], it, m, r) for r in range(n)]
            y = moe_alone(layer, prefill, a, route)
            for r in range(n):
                x[r][m] = a[r] + y[r]


def run_alone(log: list) -> States:
    states = States()
    start(states)
    for it, (kind, per_rank) in enumerate(log):
        prefill = kind == "prefill"
        mbs = [split(per_rank[r]) for r in range(n)]
        planned = [plan(states, mbs[r], prefill, it) for r in range(n)]
        lens, keep = [p_[0] for p_ in planned], [p_[1] for p_ in planned]
        x = [[inputs(states, mb, prefill) for mb in mbs[r]] for r in range(n)]
        layers_alone(states, range(NL), mbs, lens, keep, x, prefill, it)
        tops = [[last_rows(x[r][m], lens[r][m], keep[r][m]) for m in range(2)] for r in range(n)]
        for r in range(n):
            for m in range(2):
                emit(states, mbs[r][m], lens[r][m], keep[r][m], x[r][m], prefill, timed=False)
        if args.mtp:
            layers_alone(states, [NL], mbs, [[[1] * len(mb) for mb in mbs[r]] for r in range(n)],
                         [[None, None]] * n, tops, prefill, it)
            for r in range(n):
                for m in range(2):
                    drafts(states, mbs[r][m], tops[r][m], timed=False)
    return states


states = States()
warm_log, ORIGIN, ORIGIN_AT, log, TIMES = [], 0.0, None, [], []
if TABLE:                    # the table's iterations, each between two agreed clock reads
    start(states)
    TIMES.append(agreed_now())
    for kind, per_rank in TABLE_LOG:
        log.append((kind, per_rank))
        step(states, kind, per_rank[me])
        TIMES.append(agreed_now())
else:
    if W:                    # all at once, then the metrics' origin moves to the warm-up's end
        ARRIVAL[R:] = agreed_now()
        warm_log, ORIGIN = schedule_and_run(states, list(range(R, R + W)))
    ORIGIN_AT = AT[-1] if W else None      # the warm-up's end, read before the measured requests
    ARRIVAL[:R] = ORIGIN + STREAM
    log, _ = schedule_and_run(states, list(range(R)))
ref = None if args.no_check else run_alone(warm_log + log)     # the warm-up's iterations are checked too
mine = [q for q in range(R + W) if OWNER[q] == me]
exact = ref is None or all(states.tokens[q] == ref.tokens[q] and (TABLE or len(ref.tokens[q]) == OUT_LEN[q])
                           and torch.equal(states.sums[q], ref.sums[q]) for q in mine)
verdict = torch.tensor([int(exact)], dtype=torch.int32)
dist.all_reduce(verdict, op=dist.ReduceOp.MIN)

if TABLE:
    if me == 0 and args.timeline:
        os.makedirs(os.path.dirname(os.path.abspath(args.timeline)), exist_ok=True)
        with open(args.timeline, "w") as f:
            json.dump({"ranks": n, "table": TABLE, "bounds": AT[-len(TABLE) - 1:], "layer_reads": LAYER_AT}, f)
    if me == 0:
        print(f"MoE serving step table: {n} ranks, {E} experts (top-{K}, {LX} per rank), {NL} layers"
              f"{' + MTP' if args.mtp else ''}, hidden {H}; prompts of {args.prompt}, decode at context {args.context}")
        print(f"exact against the job computed in one process, on every rank: "
              f"{'not checked (--no-check)' if ref is None else 'yes' if verdict.item() else 'NO'}")
        for (kind, c), t0, t1 in zip(TABLE, TIMES, TIMES[1:]):
            print(f"{kind} {c} a rank: {(t1 - t0) * 1e6:.3f} us ({'modeled' if modeled else 'wall'})")
    dist.destroy_process_group()
    if not verdict.item():
        raise SystemExit(1)
    raise SystemExit(0)

if me == 0 and args.timeline:
    # the measured requests' times as reads of comm.clock(): with ub.replay's clocks (the latest of
    # the ranks' at each read, as agreed_now takes), the metrics below at any scale
    os.makedirs(os.path.dirname(os.path.abspath(args.timeline)), exist_ok=True)
    with open(args.timeline, "w") as f:
        json.dump({"ranks": n, "per_rank": args.per_rank, "origin_read": ORIGIN_AT, "stream_s": STREAM[:R].tolist(),
                   "first_read": FIRST_AT[:R].tolist(), "finish_read": FINISH_AT[:R].tolist(),
                   "out_len": OUT_LEN[:R].tolist()}, f)
if me == 0:
    first, finish, arrival, out_len = FIRST[:R], FINISH[:R], ARRIVAL[:R], OUT_LEN[:R]   # the measured stream
    end = finish.max() - ORIGIN
    tokens = int(out_len.sum())
    ttft = first - arrival
    multi = out_len > 1
    tpot = (finish[multi] - first[multi]) / (out_len[multi] - 1)
    norm = (finish - arrival) / out_len
    prefills = sum(1 for kind, _ in log if kind == "prefill")
    what = "modeled" if modeled else "wall"
    print(f"MoE serving: {n} ranks, {E} experts (top-{K}, {LX} per rank), {NL} layers, hidden {H}; "
          f"{R} requests at {args.rate:g} req/s (seed {args.seed}), max batch {MAX_BATCH} per rank"
          + (f", after a warm-up of {W} requests ({len(warm_log)} iterations)" if W else ""))
    print(f"request lengths: input mean {IN_LEN[:R].mean():.1f}, output mean {OUT_LEN[:R].mean():.1f} "
          f"(ratio {IN_LEN[:R].mean() / OUT_LEN[:R].mean():.1f}:1); {len(log)} iterations "
          f"({prefills} prefill, {len(log) - prefills} decode)")
    print(f"exact against the job computed in one process, on every rank: "
          f"{'not checked (--no-check)' if ref is None else 'yes' if verdict.item() else 'NO'}")
    print(f"throughput {tokens / end:.1f} tokens/s   normalized latency {norm.mean() * 1e6:.1f} us/token   "
          f"P99 TTFT {np.percentile(ttft, 99) * 1e6:.1f} us   "
          f"P99 TPOT {np.percentile(tpot, 99) * 1e6 if tpot.size else 0.0:.1f} us   ({what})")
dist.destroy_process_group()
if not verdict.item():
    raise SystemExit(1)
