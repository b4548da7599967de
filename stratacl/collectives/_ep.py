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

The frontends return one ``Slices`` per phase (IN: the sender's token rows or the
destination's outputs; SCRATCH: every member's routing block; OUT: this rank's destination
buffer of the phase). Rows are transfer units of ``row`` bytes; runs of consecutive rows from
one member are merged into one slice (the partitioner cuts slices back into units).

``traffic`` gives a whole call's matrices from every member's routing at once: the model's view
of a call, for ``ep.estimate`` and for ``ub.extrapolate``, which draws routings anew.

What the model sees of the two modes (docs/model.md, "HT and LL"):

    high-throughput   after the count exchange (phases A, B) each receiver knows every sender's
                      block exactly, so a sender's rows reach it as one bulk stream: the
                      partitioner's units, whose setup and latency hide behind their bytes
    low-latency       a row per (token, expert), each its own transfer into a fixed slot of a
                      receive buffer sized for the worst case (DeepEP's low-latency layout), so
                      each row pays its own per-transfer cost: the phase's kind carries the row
                      size (``rows_kind``), and the fabric model (ub/_clock.py) charges every row
                      its tier latency and ``cores.transfer_us``. Staged, the copies between the
                      user's rows and the communication buffer's slots go row by row as well

The per-call passes over the routing (checking and counting it, writing the routing block,
reading the records received, the row slices, the low-latency slots) are native
(``_eproute.c``): one loop each, where numpy needed a dozen passes and two sorts.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import _eproute
from ._schedule import LOAD as T_LOAD
from ._schedule import LOAD_REDUCE as T_LOAD_REDUCE
from ._slices import IN, LOAD, OUT, SCRATCH, Slices, make

WEIGHT_WORDS = _eproute.WEIGHT_WORDS     # float32 weights per int64 word of a record (owned by _eproute.c)
KIND_CODES = 16         # transfer kinds are below this; a row-granular phase adds KIND_CODES x row bytes


def rows_kind(kind: int, row: int) -> int:
    """The kind code of a phase whose transfers are rows of ``row`` bytes, each its own transfer
    (low-latency mode): ``kind`` + KIND_CODES x ``row``. The code stays one int, so the traces
    record it and ``ub.extrapolate_dimension`` fits it with the row size, linearly."""
    return int(kind) + KIND_CODES * int(row)


def split_kind(kind: int) -> tuple[int, int]:
    """(transfer kind, row bytes of each transfer: 0 for a bulk phase) of a phase's kind code."""
    kind = int(kind)
    return kind % KIND_CODES, kind // KIND_CODES


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


def header(topk_idx: np.ndarray, n: int, experts: int) -> np.ndarray:
    """The routing block's header of ``topk_idx`` [T, K] (int64, C-contiguous): tokens to each
    member [n], then to each expert [experts]. ValueError (without the operation's name) for an
    entry outside [-1, experts) or an expert picked twice by one token."""
    head = np.empty(n + experts, dtype=np.int64)
    _eproute.count(topk_idx, experts, n, head[:n], head[n:])
    return head


def block_words(head: np.ndarray, n: int, k: int) -> int:
    """int64 words of the routing block whose header is ``head``."""
    return head.size + int(head[:n].sum()) * record_words(k)


def write_block(words: np.ndarray, head: np.ndarray, topk_idx: np.ndarray, weights: np.ndarray,
                n: int) -> np.ndarray:
    """Write the routing block (module docstring) into ``words``; returns each record's token
    (destination by destination, each destination's tokens ascending)."""
    sent = np.empty(int(head[:n].sum()), dtype=np.int64)
    _eproute.block(words, topk_idx, weights, head, n, head.size - n, sent)
    return sent


def received(me: int, rec: np.ndarray, sources: np.ndarray, k: int, local: int, row: int, cap: int = -1):
    """A receiver's records (``sources[p]``: records from member p, packed p ascending), as
    ``(tokens [R], idx [R, K], weights [R, K], per_expert [local], rows)``.

    High-throughput (``cap`` < 0): ``idx`` the local expert ids (-1 where the expert is on
    another member), ``weights`` theirs (0 there), ``per_expert`` the tokens each local expert
    got; ``rows`` copies source p's row ``tokens[r]`` to row r. Low-latency (``cap`` = rows per
    local expert): ``idx`` each (record, k)'s row ``e * cap + slot`` in the receive buffer
    (slots counted sources ascending, records in order; -1 elsewhere), ``per_expert`` the rows
    each local expert got; ``rows`` copies the (record, k) rows. ``rows`` lists members after
    me first, runs merged, as ``rows()``."""
    total = int(sources.sum())
    tokens = np.empty(total, dtype=np.int64)
    idx = np.empty((total, k), dtype=np.int64)
    weights = np.empty((total, k), dtype=np.float32)
    per_expert = np.empty(local, dtype=np.int64)
    out = np.empty((total * (1 if cap < 0 else k), 4), dtype=np.int64)
    count = _eproute.received(rec, np.ascontiguousarray(sources, dtype=np.int64), k, me, local, cap, row,
                              tokens, idx, weights, per_expert, out)
    return tokens, idx, weights, per_expert, _row_map(me, out[:count] if row else out[:0])


def _row_map(me: int, slices: np.ndarray) -> Slices:
    """LOAD slices IN -> OUT from ``slices`` [S, 4]: (peer, src, dst, bytes)."""
    s = len(slices)
    peer, src, dst, nbytes = (np.ascontiguousarray(slices[:, c]) for c in range(4))
    return Slices(me, peer, np.full(s, IN, dtype=np.int64), src, np.full(s, OUT, dtype=np.int64), dst, nbytes,
                    np.full(s, LOAD, dtype=np.int64), np.full(s, -1, dtype=np.int64))


def _order(me: int, n: int) -> np.ndarray:
    # members after me first, as the collectives' frontends: readers spread over owners
    return (me + 1 + np.arange(n)) % n


def headers(me: int, n: int, words: int) -> Slices:
    """Phase A: member p's header (``words`` int64 at the start of its routing block) -> OUT
    row p."""
    p = _order(me, n)
    nb = words * 8
    return make(me, p, SCRATCH, 0, OUT, p * nb, nb, LOAD)


def records(me: int, counts: np.ndarray, head: int, words: int) -> Slices:
    """Phase B: from each member p the records it addressed to this rank (``counts[p, d]``:
    tokens p sends to d; ``head``: header words), packed by p ascending into OUT."""
    n = counts.shape[0]
    rec = words * 8
    src = (head + (np.cumsum(counts, axis=1) - counts)[:, me] * words) * 8
    dst = (np.cumsum(counts[:, me]) - counts[:, me]) * rec
    p = _order(me, n)
    return make(me, p, SCRATCH, src[p], OUT, dst[p], counts[p, me] * rec, LOAD)


def rows(me: int, n: int, peer: np.ndarray, src_row: np.ndarray, dst_row: np.ndarray, row: int) -> Slices:
    """Row copies ``peer[j]``'s row ``src_row[j]`` (IN) -> this rank's row ``dst_row[j]``
    (OUT), rows of ``row`` bytes, runs of consecutive rows of one member merged; listed
    members after me first, each member's rows in the order given."""
    peer, src_row, dst_row = (np.ascontiguousarray(a, dtype=np.int64) for a in (peer, src_row, dst_row))
    out = np.empty((peer.size, 4), dtype=np.int64)
    count = _eproute.row_slices(me, n, peer, src_row, dst_row, row, out) if row else 0
    return _row_map(me, out[:count])


def combine_blocks(me: int, counts: np.ndarray, row: int) -> Slices:
    """High-throughput combine at token owner ``me``: from each destination d the block of
    rows it received from me (after those of members before me), into OUT grouped by d."""
    before = np.cumsum(counts, axis=0) - counts          # [p, d]: rows d received before p's
    n = counts.shape[0]
    mine = counts[me]
    dst = np.cumsum(mine) - mine
    d = _order(me, n)
    return make(me, d, IN, before[me, d] * row, OUT, dst[d] * row, mine[d] * row, LOAD)


def expert_slots(counts_expert: np.ndarray, me: int, topk_idx: np.ndarray) -> np.ndarray:
    """Low-latency layout: the slot of each of this rank's (token, k) in its expert's receive
    rows (tokens of members before me first, then mine in token order); -1 where no expert.
    ``counts_expert[p, e]``: tokens member p sent to expert e."""
    before = np.ascontiguousarray(counts_expert[:me].sum(axis=0, dtype=np.int64))
    slots = np.empty(topk_idx.shape, dtype=np.int64)
    _eproute.slots(np.ascontiguousarray(topk_idx), before, slots)
    return slots


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
    if low_latency:
        return [(head, T_LOAD), (rec, T_LOAD), (rows_to_members(per_expert, n).T * row, rows_kind(T_LOAD, row))]
    return [(head, T_LOAD), (rec, T_LOAD), (counts.T * row, T_LOAD)]


def combine_traffic(sent: np.ndarray, row: int, low_latency: bool = False) -> list[tuple[np.ndarray, int]]:
    """The one phase of a combine: each token owner pulls, and accumulates on chip, the rows
    its tokens' destinations return (``sent[owner, destination]``: rows the owner sent there
    in the dispatch); low-latency: each row from its slot, its own transfer."""
    kind = rows_kind(T_LOAD_REDUCE, row) if low_latency else T_LOAD_REDUCE
    return [(np.asarray(sent, dtype=np.int64) * row, kind)]


def staging(op: str, tokens: np.ndarray, received: np.ndarray, row: int) -> tuple[np.ndarray, ...]:
    """Bytes each member copies into its communication buffer and out of it when the call is
    staged (registration ``staged``, the buffer-centric baseline): its input and its output.
    ``tokens``: each member's tokens; ``received``: the rows each received in the dispatch.
    Low-latency (``op`` low_latency_*): also the row size of each copy's transfers, row by row:
    a low-latency communication buffer is slots, one message per row (DeepEP's layout: a
    sender copies each token into its send slot, a receiver each row out of its receive slot;
    the combine the other way round)."""
    tokens, received = (np.asarray(a, dtype=np.int64) * row for a in (tokens, received))
    copies = (tokens, received) if op.endswith("dispatch") else (received, tokens)
    if not op.startswith("low_latency"):
        return copies
    grain = np.full(tokens.shape, row, dtype=np.int64)
    return copies + (grain, grain.copy())


def traffic(op: str, mode: str, topk_idx: list[np.ndarray], experts: int, row: int) -> tuple[list, np.ndarray, tuple]:
    """The call's phases (traffic matrices) for the ranks' ``topk_idx``, the rows each rank
    receives in the dispatch, and the bytes each copies in and out when staged."""
    n = len(topk_idx)
    routes = [route(idx, n, experts) for idx in topk_idx]
    counts = np.stack([r.per_rank for r in routes])
    per_expert = np.stack([r.per_expert for r in routes])
    low_latency = mode == "ll"
    sent = rows_to_members(per_expert, n) if low_latency else counts
    k = topk_idx[0].shape[1] if topk_idx else 0
    if op == "dispatch":
        phases = dispatch_traffic(counts, per_expert, k, row, low_latency)
    else:
        phases = combine_traffic(sent, row, low_latency)
    received = sent.sum(axis=0)
    name = "low_latency_" + op if low_latency else op
    return phases, received, staging(name, [idx.shape[0] for idx in topk_idx], received, row)
