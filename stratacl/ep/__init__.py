"""Expert parallelism: MoE dispatch and combine, DeepEP's names and return order.

    buf = stratacl.ep.Buffer(comm, num_experts)     # experts [r*E/N, (r+1)*E/N) on rank r
    ntok_rank, ntok_expert, in_rank = buf.get_dispatch_layout(topk_idx)
    recv_x, recv_topk_idx, recv_topk_weights, recv_per_expert, handle = buf.dispatch(x, topk_idx, topk_weights)
    combined_x, combined_topk_weights = buf.combine(y, handle)
    recv_x, recv_count, handle = buf.low_latency_dispatch(x, topk_idx, max_tokens_per_rank)
    combined_x = buf.low_latency_combine(y, topk_idx, topk_weights, handle)
    stratacl.ep.routing(tokens, experts, topk, nranks, skew, seed)    # seeded gate-like routing
    stratacl.ep.skew_for(2.0, 256, 8)      # the skew whose shared routing's expert loads have max / mean 2
    stratacl.ep.estimate("dispatch", 32, 4096, 7168, 8, 256, mode="ht")  # modeled, no ranks

Pull mode and zero copy, on the collectives' data path: token rows are remote slices that
their consumers read straight from the producer's HBM (ep/_buffer.py, collectives/_ep.py).
"""
from ._buffer import Buffer as Buffer
from ._buffer import Handle as Handle
from ._model import MoeEstimate as MoeEstimate
from ._model import estimate as estimate
from ._routing import routing as routing
from ._routing import skew_for as skew_for

__all__ = ["Buffer", "Handle", "MoeEstimate", "estimate", "routing", "skew_for"]
