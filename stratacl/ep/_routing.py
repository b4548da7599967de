"""Seeded expert routing for benchmarks, examples and trace extrapolation: what a gate would
pick, without a model.

    routing(tokens, experts, topk, nranks, skew, seed, shared=False)  -> one topk_idx [T, K] per rank
    skew_for(imbalance, experts, topk)  -> the skew whose expert loads have that max / mean

Every token picks ``topk`` distinct experts, drawn without replacement with probabilities
proportional to the experts' popularity (Gumbel top-k). ``skew`` = 0: every expert equally
popular (uniform routing). ``skew`` = s > 0: the popularity of the expert of popularity rank
q is (q + 1) ** -s, a Zipf law over a seeded order of the experts, and every source rank has
its own order: tokens of one rank's batch share a domain, so they favour the same few
experts, and which experts are hot differs between batches. The receiving ranks then get
uneven shares from their sources, the imbalance that workload-balanced partitioning is for
(the paper's section 6.2, "uneven traffic", and its Appendix D). Measured expert loads of
deployed MoE models are far from uniform, so benchmarks report the skew they assume.

``shared=True``: one order of the experts, drawn from ``seed`` alone, for every source rank: the
same experts are hot on every rank, so the load on the experts (summed over the sources) keeps
the Zipf law's skew, as a deployment's expert-load statistics show it (DeepSeek's EPLB balances
such loads; its example has max / mean 2.13 and 2.05). With one order a rank, the sum over many
sources flattens instead. Each rank's tokens still draw their experts from their own stream.
"""
from __future__ import annotations

import functools

import numpy as np


def popularity(experts: int, skew: float, rng: np.random.Generator) -> np.ndarray:
    """Relative popularity of each expert: a Zipf law of exponent ``skew`` over a random order."""
    if skew <= 0:
        return np.full(experts, 1.0 / experts)
    p = (np.arange(experts) + 1.0) ** -float(skew)
    p = p[rng.permutation(experts)]
    return p / p.sum()


def routing(tokens, experts: int, topk: int, nranks: int, skew: float = 0.0, seed: int = 0,
            shared: bool = False) -> list[np.ndarray]:
    """One ``topk_idx`` [T_r, K] (int64, distinct experts per token) per rank r; ``tokens`` an
    int for every rank, or one per rank. Reproducible from ``seed``. ``shared``: the experts'
    popularity order is the same on every rank (drawn from ``seed`` alone)."""
    if not 0 < topk <= experts:
        raise ValueError(f"routing: topk must be in 1..{experts}, got {topk}")
    counts = [int(tokens)] * nranks if np.isscalar(tokens) else [int(t) for t in tokens]
    out = []
    common = popularity(experts, skew, np.random.default_rng([seed, 1 << 20])) if shared else None
    for r, t in enumerate(counts):
        rng = np.random.default_rng([seed, r])
        logp = np.log(common if shared else popularity(experts, skew, rng))
        keys = logp[None, :] + rng.gumbel(size=(t, experts))
        out.append(_top(keys, topk).astype(np.int64))
    return out


def _top(keys: np.ndarray, topk: int) -> np.ndarray:
    """Each row's ``topk`` largest keys' columns, in increasing order. With no tie at the k-th
    key the set is unique: the keys at least the k-th largest (``np.partition``, which carries
    no indices, three times faster than ``argpartition`` at 256 experts); a row with a tie there
    (never seen in practice) takes argpartition's choice, as this function always did."""
    t, experts = keys.shape
    if topk >= experts:
        return np.tile(np.arange(experts), (t, 1))
    kth = np.partition(keys, experts - topk, axis=1)[:, experts - topk]
    top = keys >= kth[:, None]
    if (top.sum(axis=1) == topk).all():
        return np.nonzero(top)[1].reshape(t, topk)
    return np.sort(np.argpartition(-keys, topk - 1, axis=1)[:, :topk], axis=1)


def _imbalance(experts: int, topk: int, skew: float) -> float:
    """max / mean of the experts' expected loads when every token draws ``topk`` of them by
    Zipf popularity of exponent ``skew`` (Gumbel top-k, without replacement). The mean load is
    topk / experts a token; the most popular expert's is the chance it is among the top k: its
    key g = log p_0 + a Gumbel variable, and it is picked when fewer than k of the others'
    keys exceed g, each independently with chance 1 - exp(-p_j e^-g); integrated over g on a
    grid (a count distribution truncated at k, built expert by expert)."""
    if skew <= 0 or topk >= experts:
        return 1.0
    logp = -float(skew) * np.log(np.arange(experts) + 1.0)
    x = np.linspace(-4.0, 25.0, 4001)                     # the Gumbel variable of expert 0's key
    dens = np.exp(-(x + np.exp(-x)))
    g = logp[0] + x
    count = np.zeros((x.size, topk))                      # P(j of the others above g), j < k
    count[:, 0] = 1.0
    stay, move = np.empty((x.size, topk - 1)), np.empty((x.size, topk - 1))   # no arrays made per expert
    for lp in logp[1:]:
        above = -np.expm1(-np.exp(lp - g))
        keep = 1 - above
        np.multiply(count[:, 1:], keep[:, None], out=stay)
        np.multiply(count[:, :-1], above[:, None], out=move)
        np.add(stay, move, out=count[:, 1:])
        count[:, 0] *= keep
    picked = float(np.sum(count.sum(1) * dens) * (x[1] - x[0]))
    return picked * experts / topk


@functools.lru_cache(maxsize=256)
def skew_for(imbalance: float, experts: int, topk: int) -> float:
    """The Zipf exponent at which ``routing(..., shared=True)``'s expected expert loads have a
    max / mean of ``imbalance`` (>= 1; 1 is uniform), for ``experts`` experts and top-``topk``.
    The same imbalance needs a different exponent at every expert count, so a workload that
    states its imbalance keeps it as the experts grow with N. Bisection to 1e-4 over [0, 8];
    an imbalance no exponent reaches (top-k of few experts caps it at experts / topk) is an error."""
    if imbalance < 1:
        raise ValueError(f"skew_for: an imbalance (max / mean load) is at least 1, got {imbalance}")
    if imbalance == 1 or topk >= experts:
        if imbalance > 1:
            raise ValueError(f"skew_for: top-{topk} of {experts} experts picks every expert: no imbalance")
        return 0.0
    lo, hi = 0.0, 8.0
    if _imbalance(experts, topk, hi) < imbalance:
        raise ValueError(f"skew_for: top-{topk} of {experts} experts cannot reach max / mean {imbalance} "
                         f"(at most {_imbalance(experts, topk, hi):.3f})")
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _imbalance(experts, topk, mid) < imbalance else (lo, mid)
    return (lo + hi) / 2
