"""The paper's serving deployment as numbers (DeepSeek V4 Flash on SGLang, 192 dies; paper
section 9, Table 3), for examples/moe_serving.py and the benchmarks that run it at that size.

Every value comes from docs/end-to-end.md, "The paper's deployments: settings and their sources"
and "Serving as the paper deploys it", where its source and derivation are written down:

    splitwise_lengths(rng, n)  input and output lengths drawn from distributions fitted to the
                               Splitwise conversation trace's mean, median and p99
    zipf_exponent(experts)     the routing skew whose expert popularity has max / mean 2 (EPLB)
    v4_attention(requests)     FLOPs and HBM bytes a layer of V4 Flash's attention takes for
                               requests' new tokens at their contexts (its KV layout)
    weights_a_die(ep)          bytes of weights one die holds in an instance of that EP size
    kv_bytes(tokens)           a request's KV cache
"""
from __future__ import annotations

import math

import numpy as np

# DeepSeek V4 Flash (transformers DeepseekV4Config; sglang's DeepSeek V4 KV pool)
HIDDEN, LAYERS, EXPERTS, TOPK, EXPERT_FFN, VOCAB, MTP_LAYERS = 4096, 43, 256, 6, 2048, 129280, 1
HEADS, HEAD_DIM, WINDOW, INDEX_TOPK, INDEX_HEADS, INDEX_DIM = 64, 512, 128, 512, 64, 128
CSA_LAYERS, HCA_LAYERS = 21, 20             # compress 4:1 with the indexer; 128:1; the other 2 window only
ENTRY_BYTES, INDEX_ENTRY_BYTES = 584, 132   # a KV entry (448 FP8 + 64 BF16 rope + scales), an indexer entry
KV_TOKEN_BYTES = 3850                       # 21 x (584 + 132) / 4 + 20 x 584 / 128, rounded
KV_REQUEST_BYTES = LAYERS * WINDOW * ENTRY_BYTES    # the windows: 3.07 MiB
PARAMETERS = 284e9                          # total (model card), the MTP layer apart
EXPERT_WEIGHTS = 3 * HIDDEN * EXPERT_FFN    # one routed expert (SwiGLU: gate, up, down)
EMBED_HEAD = 2 * VOCAB * HIDDEN
# everything of a layer but its routed experts (attention, indexer, compressors, shared expert, router)
DENSE_PER_LAYER = (PARAMETERS - LAYERS * EXPERTS * EXPERT_WEIGHTS - EMBED_HEAD) / LAYERS
WEIGHT_BYTES = 1                            # W8A8 (sgl-npu/DeepSeek-V4-Flash-W8A8)
# each expert runs as a two-matrix MLP of this width over hidden: SwiGLU's weights and FLOPs at 2048
EXPERT_WIDTH = 3 * EXPERT_FFN / 2 / HIDDEN

# Splitwise conversation trace (Azure LLM inference trace 2023): input mean 1155, median 1020,
# p99 4142; output mean 211, median 129, p99 601
INPUT_LOGNORMAL = (6.901432, 0.609636)          # mu, sigma: least squares on log(mean, median, p99)
OUTPUT_BETA = (0.291620, 0.539856, 601.6106)    # a, b, scale: mean, median and p99 exactly
MTP_ACCEPT = 0.85                               # one draft token (DeepSeek-V3 report, section 5.4.3)
SKEW_MAX_OVER_MEAN = 2.0                        # deepseek-ai/EPLB's example: 2.13 and 2.05


def splitwise_lengths(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` (input, output) lengths in tokens, each at least 1: inputs lognormal, outputs a
    scaled beta (docs/end-to-end.md, "Serving as the paper deploys it")."""
    mu, sigma = INPUT_LOGNORMAL
    a, b, scale = OUTPUT_BETA
    ins = np.maximum(1, np.rint(rng.lognormal(mu, sigma, count))).astype(int)
    outs = np.maximum(1, np.ceil(rng.beta(a, b, count) * scale)).astype(int)
    return ins, outs


def zipf_exponent(experts: int = EXPERTS, max_over_mean: float = SKEW_MAX_OVER_MEAN) -> float:
    """The exponent s of the popularity (q + 1)^-s over ``experts`` whose max / mean is
    ``max_over_mean`` (``stratacl.ep.routing``'s skew), by bisection."""
    q = np.arange(1, experts + 1, dtype=np.float64)
    lo, hi = 0.0, 8.0
    for _ in range(100):
        s = (lo + hi) / 2
        if experts / np.sum(q ** -s) < max_over_mean:
            lo = s
        else:
            hi = s
    return (lo + hi) / 2


def _entries(p: np.ndarray) -> np.ndarray:
    """KV entries a token at context ``p`` (itself included) reads in one layer, averaged over
    the layer schedule: the window, the indexer's top-k of the 4:1 entries, every 128:1 entry."""
    return (np.minimum(p, WINDOW) + CSA_LAYERS / LAYERS * np.minimum(p / 4, INDEX_TOPK)
            + HCA_LAYERS / LAYERS * p / 128)


def v4_attention(requests) -> tuple[float, float]:
    """FLOPs and HBM bytes of one layer of V4 Flash's attention (averaged over its 43 layers) for
    ``requests``, each (context before this step, tokens it adds): every new token scores and
    sums the entries it reads (64 heads of 512 over the shared KV) and its indexer scores every
    4:1 entry; a request's entries are read once for all its new tokens (the kernel batches a
    request's queries), at the last token's context, and its new tokens' entries written. The
    projections are not in it (``DENSE_PER_LAYER``)."""
    flops = nbytes = 0.0
    for ctx, new in requests:
        if new <= 0:
            continue
        p = np.arange(ctx + 1, ctx + new + 1, dtype=np.float64)
        flops += float(np.sum(4 * HEADS * HEAD_DIM * _entries(p)
                              + 2 * INDEX_HEADS * INDEX_DIM * CSA_LAYERS / LAYERS * p / 4))
        last = float(p[-1])
        nbytes += (ENTRY_BYTES * float(_entries(np.array([last]))[0])
                   + INDEX_ENTRY_BYTES * CSA_LAYERS / LAYERS * last / 4 + KV_TOKEN_BYTES / LAYERS * new)
    return flops, nbytes


def weights_a_die(ep: int) -> float:
    """Bytes of weights on one die of an instance with expert parallelism ``ep`` (attention data
    parallel, so the dense weights are on every die): the routed experts split ``ep`` ways, the
    rest whole, the MTP layer as one more layer."""
    layers = LAYERS + MTP_LAYERS
    return WEIGHT_BYTES * (layers * (EXPERTS // ep * EXPERT_WEIGHTS + DENSE_PER_LAYER) + EMBED_HEAD)


def kv_bytes(tokens) -> float:
    """A request's KV cache at ``tokens`` of context: its compressed entries and its windows."""
    return KV_TOKEN_BYTES * tokens + KV_REQUEST_BYTES


def dense_units(hidden: int = HIDDEN) -> float:
    """The per-layer dense weights in units of hidden^2 (``--attention-weights``)."""
    return DENSE_PER_LAYER / hidden ** 2


def expert_ffn(hidden: int) -> int:
    """The two-matrix expert's width at ``hidden`` (``--ffn``): 3,072 at 4096."""
    return int(math.floor(EXPERT_WIDTH * hidden + 0.5))
