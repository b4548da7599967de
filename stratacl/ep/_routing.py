"""Seeded expert routing for benchmarks, examples and trace extrapolation: what a gate would
pick, without a model.

    routing(tokens, experts, topk, nranks, skew, seed)  -> one topk_idx [T, K] per rank

Every token picks ``topk`` distinct experts, drawn without replacement with probabilities
proportional to the experts' popularity (Gumbel top-k). ``skew`` = 0: every expert equally
popular (uniform routing). ``skew`` = s > 0: the popularity of the expert of popularity rank
q is (q + 1) ** -s, a Zipf law over a seeded order of the experts, and every source rank has
its own order: tokens of one rank's batch share a domain, so they favour the same few
experts, and which experts are hot differs between batches. The receiving ranks then get
uneven shares from their sources, the imbalance that workload-balanced partitioning is for
(the paper's section 6.2, "uneven traffic", and its Appendix D). Measured expert loads of
deployed MoE models are far from uniform, so benchmarks report the skew they assume.
"""
from __future__ import annotations

import numpy as np


def popularity(experts: int, skew: float, rng: np.random.Generator) -> np.ndarray:
    """Relative popularity of each expert: a Zipf law of exponent ``skew`` over a random order."""
    if skew <= 0:
        return np.full(experts, 1.0 / experts)
    p = (np.arange(experts) + 1.0) ** -float(skew)
    p = p[rng.permutation(experts)]
    return p / p.sum()


def routing(tokens, experts: int, topk: int, nranks: int, skew: float = 0.0, seed: int = 0) -> list[np.ndarray]:
    """One ``topk_idx`` [T_r, K] (int64, distinct experts per token) per rank r; ``tokens`` an
    int for every rank, or one per rank. Reproducible from ``seed``."""
    if not 0 < topk <= experts:
        raise ValueError(f"routing: topk must be in 1..{experts}, got {topk}")
    counts = [int(tokens)] * nranks if np.isscalar(tokens) else [int(t) for t in tokens]
    out = []
    for r, t in enumerate(counts):
        rng = np.random.default_rng([seed, r])
        logp = np.log(popularity(experts, skew, rng))
        keys = logp[None, :] + rng.gumbel(size=(t, experts))
        idx = np.argpartition(-keys, topk - 1, axis=1)[:, :topk] if topk < experts else np.tile(
            np.arange(experts), (t, 1))
        out.append(np.sort(idx, axis=1).astype(np.int64))
    return out
