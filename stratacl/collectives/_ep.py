"""Expert parallelism's routing and its remote slices: what dispatch and combine move, and where.

Experts ``[r * L, (r + 1) * L)`` live on member r (``L = experts / n``). A token is routed by
its ``topk_idx`` row (global expert ids, -1 for none); its *destinations* are the members
owning at least one of its experts.

Every call is pull mode, as the collectives: the consumer of a row reads it from the
producer's buffer.

    sender s (before the call)   its *routing block* in HBM, int64 words:
                                   header  [tokens to each member (n)] [tokens to each expert (E)]
                                   records for destination 0, then 1, ...: per token sent there,
                                           in token order, [token, topk_idx row (K), weights (K
                                           float32, packed two to a word)]
    receiver r, phase A          every member's header (the count matrices; r's offsets into
                                 every routing block follow from them)
                phase B          its records from every member, sources ascending
                phase C          token rows: x_s[token] -> its place in r's receive buffer,
                                 a slice per run of consecutive tokens
    combine, at the token owner  the destinations' output rows for its tokens -> a local
                                 buffer, then reduced in float32 (ep/_buffer.py)

The frontends return one ``SliceMap`` per phase (IN: the sender's token rows or the
destination's outputs; SCRATCH: every member's routing block; OUT: this rank's destination
buffer of the phase). Rows are transfer units of ``row`` bytes; runs of consecutive rows from
one member are merged into one slice (the partitioner cuts slices back into units).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ._schedule import LOAD as T_LOAD
from ._schedule import LOAD_REDUCE as T_LOAD_REDUCE
from ._slices import IN, LOAD, OUT, SCRATCH, SliceMap, make

WEIGHT_WORDS = 2        # float32 weights per int64 word of a record


@dataclasses.dataclass(frozen=True)
class Routing:
    """Where one rank's tokens go: ``dest`` [T, n] (token t goes to member d), ``per_rank`` [n]
    tokens to each member, ``per_expert`` [E] tokens to each expert."""
    dest: np.ndarray
    per_rank: np.ndarray
    per_expert: np.ndarray


def record_words(k: int) -> int:
    """int64 words of one record: the token, its K expert ids, its K float32 weights."""
    return 1 + k + (k + WEIGHT_WORDS - 1) // WEIGHT_WORDS


def header_words(n: int, experts: int) -> int:
    return n + experts


def route(topk_idx: np.ndarray, n: int, experts: int) -> Routing:
    """The routing of tokens ``topk_idx`` [T, K] (checked: int64, entries in [-1, experts),
    no expert twice in a row) over ``n`` members."""
    t, _ = topk_idx.shape
    local = experts // n
    valid = topk_idx >= 0
    rows = np.nonzero(valid)[0]
    chosen = topk_idx[valid]
    dest = np.zeros((t, n), dtype=bool)
    dest[rows, chosen // local] = True
    per_rank = dest.sum(axis=0, dtype=np.int64)
    per_expert = np.bincount(chosen, minlength=experts).astype(np.int64)
    return Routing(dest, per_rank, per_expert)


def routing_block(r: Routing, topk_idx: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The sender's routing block (module docstring): header, then records by destination."""
    t, k = topk_idx.shape
    n = r.per_rank.size
    words = record_words(k)
    head = np.concatenate([r.per_rank, r.per_expert])
    # destination-major order of (destination, token) pairs, tokens ascending within one
    d_idx, t_idx = np.nonzero(r.dest.T)
    rec = np.zeros((d_idx.size, words), dtype=np.int64)
    rec[:, 0] = t_idx
    rec[:, 1:1 + k] = topk_idx[t_idx]
    w = np.zeros((d_idx.size, (words - 1 - k) * WEIGHT_WORDS), dtype=np.float32)
    w[:, :k] = weights[t_idx]
    rec[:, 1 + k:] = w.view(np.int64)
    assert head.size == n + r.per_expert.size
    return np.concatenate([head, rec.reshape(-1)])


def parse_records(rec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token ids [R], topk_idx [R, K], weights [R, K] float32) of ``rec`` (records, int64)."""
    words = record_words(k)
    rec = rec.reshape(-1, words)
    w = np.ascontiguousarray(rec[:, 1 + k:]).view(np.float32)[:, :k]
    return rec[:, 0].copy(), rec[:, 1:1 + k].copy(), np.ascontiguousarray(w)


def _order(me: int, n: int) -> np.ndarray:
    # members after me first, as the collectives' frontends: readers spread over owners
    return (me + 1 + np.arange(n)) % n


def headers(me: int, n: int, words: int) -> SliceMap:
    """Phase A: member p's header (``words`` int64 at the start of its routing block) -> OUT
    row p."""
    p = _order(me, n)
    nb = words * 8
    return make(me, p, SCRATCH, 0, OUT, p * nb, nb, LOAD)


def records(me: int, counts: np.ndarray, head: int, words: int) -> SliceMap:
    """Phase B: from each member p the records it addressed to this rank (``counts[p, d]``:
    tokens p sends to d; ``head``: header words), packed by p ascending into OUT."""
    n = counts.shape[0]
    rec = words * 8
    src = (head + (np.cumsum(counts, axis=1) - counts)[:, me] * words) * 8
    dst = (np.cumsum(counts[:, me]) - counts[:, me]) * rec
    p = _order(me, n)
    return make(me, p, SCRATCH, src[p], OUT, dst[p], counts[p, me] * rec, LOAD)


def rows(me: int, n: int, peer: np.ndarray, src_row: np.ndarray, dst_row: np.ndarray, row: int,
         src_buf: int = IN, dst_buf: int = OUT) -> SliceMap:
    """Row copies ``peer[j]``'s row ``src_row[j]`` -> this rank's row ``dst_row[j]`` (rows of
    ``row`` bytes), runs of consecutive rows of one member merged; listed members after me
    first, each member's rows in the order given."""
    peer = np.asarray(peer, dtype=np.int64)
    src_row = np.asarray(src_row, dtype=np.int64)
    dst_row = np.asarray(dst_row, dtype=np.int64)
    if peer.size == 0 or row == 0:
        return make(me, [], src_buf, 0, dst_buf, 0, 0, LOAD)
    order = np.argsort((peer - me - 1) % n, kind="stable")
    peer, src_row, dst_row = peer[order], src_row[order], dst_row[order]
    start = np.ones(peer.size, dtype=bool)
    start[1:] = (peer[1:] != peer[:-1]) | (src_row[1:] != src_row[:-1] + 1) | (dst_row[1:] != dst_row[:-1] + 1)
    first = np.flatnonzero(start)
    length = np.diff(np.append(first, peer.size))
    return make(me, peer[first], src_buf, src_row[first] * row, dst_buf, dst_row[first] * row, length * row, LOAD)


def combine_blocks(me: int, counts: np.ndarray, row: int) -> SliceMap:
    """High-throughput combine at token owner ``me``: from each destination d the block of
    rows it received from me (after those of members before me), into OUT grouped by d."""
    before = np.cumsum(counts, axis=0) - counts          # [p, d]: rows d received before p's
    n = counts.shape[0]
    mine = counts[me]
    dst = np.cumsum(mine) - mine
    d = _order(me, n)
    return make(me, d, IN, before[me, d] * row, OUT, dst[d] * row, mine[d] * row, LOAD)


def occurrence(keys: np.ndarray) -> np.ndarray:
    """For each entry of ``keys`` (1-D; -1: none), how many entries with the same key come
    before it; -1 where the key is -1."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = sk[1:] != sk[:-1]
    idx = np.arange(order.size)
    within = idx - np.maximum.accumulate(np.where(first, idx, 0))
    out = np.empty(order.size, dtype=np.int64)
    out[order] = np.where(sk >= 0, within, -1)
    return out


def expert_slots(counts_expert: np.ndarray, me: int, topk_idx: np.ndarray) -> np.ndarray:
    """Low-latency layout: the slot of each of this rank's (token, k) in its expert's receive
    rows (tokens of members before me first, then mine in token order); -1 where no expert.
    ``counts_expert[p, e]``: tokens member p sent to expert e."""
    keys = np.where(topk_idx >= 0, topk_idx, -1).reshape(-1)
    within = occurrence(keys)
    before = (np.cumsum(counts_expert, axis=0) - counts_expert)[me]      # [E]
    slot = np.where(keys >= 0, before[np.maximum(keys, 0)] + within, -1)
    return slot.reshape(topk_idx.shape)


# --- the traffic the fabric model times (every member computes the same matrices) -----------
def rows_to_members(per_expert: np.ndarray, n: int) -> np.ndarray:
    """[p, d]: rows member p sends to member d in low-latency mode (one per token and expert):
    the sum of ``per_expert[p, e]`` over d's experts."""
    return per_expert.reshape(per_expert.shape[0], n, -1).sum(axis=2)


def dispatch_traffic(counts: np.ndarray, per_expert: np.ndarray, topk: int, row: int,
                     low_latency: bool) -> list[tuple[np.ndarray, int]]:
    """The phases of one dispatch as traffic matrices ``B[reader, owner]`` (bytes; see
    ``_schedule.exchange``): headers from everyone, the records addressed to the reader, the
    token rows (``counts[p, d]``: tokens p sends to d; ``per_expert[p, e]``: to expert e)."""
    n = counts.shape[0]
    head = np.full((n, n), header_words(n, per_expert.shape[1]) * 8, dtype=np.int64)
    rec = counts.T * (record_words(topk) * 8)
    sent = rows_to_members(per_expert, n) if low_latency else counts
    return [(head, T_LOAD), (rec, T_LOAD), (sent.T * row, T_LOAD)]


def combine_traffic(sent: np.ndarray, row: int) -> list[tuple[np.ndarray, int]]:
    """The one phase of a combine: each token owner pulls, and accumulates on chip, the rows
    its tokens' destinations return (``sent[owner, destination]``: rows the owner sent there
    in the dispatch)."""
    return [(np.asarray(sent, dtype=np.int64) * row, T_LOAD_REDUCE)]


def staging(op: str, tokens: np.ndarray, received: np.ndarray, row: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each member copies into its communication buffer and out of it when the call is
    staged (registration ``staged``, the buffer-centric baseline): its input and its output.
    ``tokens``: each member's tokens; ``received``: the rows each received in the dispatch."""
    tokens, received = (np.asarray(a, dtype=np.int64) * row for a in (tokens, received))
    return (tokens, received) if op.endswith("dispatch") else (received, tokens)
