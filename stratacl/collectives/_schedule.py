"""What a collective call executes, step by step: the schedules the fabric model times.

A schedule is a list of steps in communicator-local indices (member i is global rank
``members[i]``; the clock module maps them). Every collective starts with the arrival barrier
(inputs ready, descriptors agree) and, unless said otherwise, ends with the departure barrier
(nobody returns while a peer may still read its buffers), exactly as ``runtime/communicator/_comm.py`` does.

    Barrier        every member stores an arrival flag into every other and waits for all of
                   them (one full-mesh step of flags)
    Mesh           one full-mesh phase: all its transfers run at once, pull mode
    Ring           a chain of steps; member i's step s starts when its step s-1 is done AND
                   member i-1's flag says i-1's step s-1 is done; step 0 follows the barrier.
                   Flags are pulled like the data: i reads i-1's step counter in i-1's memory,
                   which costs one access latency even when the flag was raised long before
    Local          a copy inside each member's own HBM (staging, own-block copies)
    RootWait       the root waits for a done flag from every other member; the others go on
    Shift          point-to-point ring shift (sendrecv): i waits for i-1's send flag, pulls, then
                   flags i-1 done; i returns when its own receiver has flagged it done (both
                   flags read where their owner keeps them, as ring flags are)

Full mesh (``algo="mesh"``), one logical step per phase:

    all_gather      Mesh: i loads x_j (M bytes) from every j != i; copies its own x_i locally.
                    M <= eager_bytes (the eager path): Local copy into i's slot, Barrier, the
                    Mesh from the slots, no departure barrier
    reduce_scatter  Mesh: i load-reduces chunk i (M bytes) from every j != i, own chunk locally
    all_reduce      > eager_bytes: Mesh reduce-scatter of chunk i (count*i//N .. count*(i+1)//N
                    elements), Barrier, Mesh gather: i loads chunk j from j
                    <= eager_bytes: Local copy of the buffer into i's slot, Barrier, Mesh:
                    i load-reduces the whole buffer from every j's slot straight into its
                    buffer; no departure barrier (the slots stay valid until the next call)
    all_to_all      Mesh: i loads block i of x_j (M/N bytes) from every j, own block locally
    broadcast       Mesh: i != root loads the buffer from root; then RootWait instead of the
                    departure barrier (only the root's buffer was read)
    barrier         Barrier only
    sendrecv        Shift (send to i+1, receive from i-1, as stratacl-bench runs it)

Ring (``algo="ring"``; all_gather, reduce_scatter, all_reduce; the other operators run the mesh),
N-1 steps per phase, each member pulling from its left neighbour i-1 only:

    all_gather      own block copied locally during step 0; in step s = 0 .. N-2 member i pulls
                    chunk (i - s - 1) mod N from member i-1 (step 0: i-1's own input; later:
                    the chunk i-1 received in its step s-1, from i-1's output) into its output.
                    After N-1 steps i holds every chunk.
    reduce_scatter  in step s member i load-reduces chunk (i - s - 2) mod N from member i-1
                    (step 0: i-1's input chunk; later: the partial sum i-1 produced in its step
                    s-1) with its own input chunk, into its partial buffer. In step N-2 the chunk
                    is (i - N) mod N = i: member i ends with chunk i fully reduced, in its output.
    all_reduce      ring reduce_scatter over chunks of the buffer (chunk c = elements
                    count*c//N .. count*(c+1)//N) with partials in a scratch buffer (the last
                    step writes chunk i of the buffer), a Barrier, then ring all_gather of the
                    reduced chunks in place. The barrier is needed: gather step s of member i
                    overwrites chunk i-s-1 of its buffer, which i+1's reduce steps read and i
                    cannot know i+1 has finished with otherwise.

Each ring step moves one chunk per member; the flag between steps is the only synchronisation
(a flag from i-1 says "the chunk you pull next is complete"), so a ring call costs the arrival
barrier, N-1 flag waits (2(N-1) and one more barrier for all_reduce) and the departure barrier.

Staged (the buffer-centric baseline, ``staged``): each round copies (its share of) the input
into the registered communication buffer (Local), runs the algorithm between communication
buffers, and copies the output out (Local). The buffer holds at most ``buffer_bytes`` of a
round's input or output, so large payloads run as several rounds, each with its own barriers,
as HCCL does with its HCCL_BUFFSIZE communication buffer (default 200 MB).

``eager_bytes`` is the runtime's buffer policy (runtime/pipeline/_buffers.py, 16 KiB), not this
module's: whoever times a schedule passes the threshold of the runtime it models.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .._operators import names

LOAD, LOAD_REDUCE, LOCAL_COPY, HOST_LOAD, HOST_STORE = 0, 1, 2, 3, 4   # transfer kinds (same codes as ub._sharing)
BARRIER_PHASE = -1      # in an exchange's phases: a barrier between two phases (its matrix is not read)

OPS = names(schedule=True)        # the operator table (stratacl/_operators.py)
RING_OPS = names(ring=True)
ALGOS = ("mesh", "ring")


@dataclasses.dataclass(frozen=True)
class Barrier:
    pass


@dataclasses.dataclass(frozen=True)
class Mesh:
    reader: np.ndarray      # member index
    owner: np.ndarray
    nbytes: np.ndarray
    kind: np.ndarray


@dataclasses.dataclass(frozen=True)
class Ring:
    nbytes: np.ndarray      # (steps, N): bytes member i pulls from member i-1 in step s
    kind: np.ndarray        # (steps,)
    local: np.ndarray | None = None   # (N,): bytes each member copies locally during step 0


@dataclasses.dataclass(frozen=True)
class Local:
    nbytes: np.ndarray      # (N,): bytes each member copies inside its own HBM


@dataclasses.dataclass(frozen=True)
class RootWait:
    root: int               # member index that waits for every other member's done flag


@dataclasses.dataclass(frozen=True)
class Shift:
    nbytes: int             # bytes member i pulls from member i-1


def chunk_bytes(count: int, n: int, itemsize: int) -> np.ndarray:
    """Bytes of chunk c = elements [count*c//n, count*(c+1)//n) (the data path's chunk_bounds)."""
    edges = count * np.arange(n + 1, dtype=np.int64) // n
    return np.diff(edges) * itemsize


def ring_all_gather_chunk(i: int, s: int, n: int) -> int:
    """The chunk member i pulls from member i-1 in ring all_gather step s."""
    return (i - s - 1) % n


def ring_reduce_scatter_chunk(i: int, s: int, n: int) -> int:
    """The chunk member i load-reduces from member i-1 in ring reduce_scatter step s."""
    return (i - s - 2) % n


def _mesh_all_pairs(n: int, nbytes_of, kind: int, own_copy: bool) -> Mesh:
    """Member i pulls ``nbytes_of(i, j)`` from every j != i, and copies its own share locally."""
    r, o = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    off = r != o
    reader, owner = r[off], o[off]
    nb = nbytes_of(reader, owner)
    kinds = np.full(reader.size, kind)
    if own_copy:
        me = np.arange(n)
        reader, owner = np.concatenate([reader, me]), np.concatenate([owner, me])
        nb = np.concatenate([nb, nbytes_of(me, me)])
        kinds = np.concatenate([kinds, np.full(n, LOCAL_COPY)])
    keep = nb > 0
    return Mesh(reader[keep], owner[keep], nb[keep].astype(np.int64), kinds[keep])


def schedule(op: str, algo: str, n: int, nbytes: int, root: int = 0, itemsize: int = 1, *,
             eager_bytes: int) -> list:
    """The steps of one call on ``n`` members, ``nbytes`` = bytes of each member's input buffer
    (all_gather: x; reduce_scatter: the N-chunk input; all_reduce, broadcast, sendrecv: the
    buffer; all_to_all: the N-block input). ``itemsize`` sets where chunks split; inputs up to
    ``eager_bytes`` take the eager path (mesh all_gather and all_reduce)."""
    if op not in OPS:
        raise ValueError(f"unknown operator {op!r} (known: {', '.join(OPS)})")
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r} (known: {', '.join(ALGOS)})")
    nbytes, itemsize = int(nbytes), max(int(itemsize), 1)
    if op == "barrier":
        return [Barrier()]
    if op == "sendrecv":
        return [Shift(nbytes)] if n > 1 else [Local(np.full(n, nbytes))]
    ring = algo == "ring" and op in RING_OPS and n > 1
    if op == "all_gather":
        if ring:
            steps = np.full((n - 1, n), nbytes, dtype=np.int64)
            return [Barrier(), Ring(steps, np.full(n - 1, LOAD), np.full(n, nbytes)), Barrier()]
        gather = _mesh_all_pairs(n, lambda r, o: np.full(r.size, nbytes), LOAD, True)
        if nbytes <= eager_bytes:      # eager, as all_reduce: no departure barrier
            return [Local(np.full(n, nbytes)), Barrier(), gather]
        return [Barrier(), gather, Barrier()]
    if op == "reduce_scatter":
        per = chunk_bytes(nbytes // itemsize, n, itemsize)
        if ring:
            i, s = np.arange(n)[None, :], np.arange(n - 1)[:, None]
            steps = per[ring_reduce_scatter_chunk(i, s, n)]
            return [Barrier(), Ring(steps, np.full(n - 1, LOAD_REDUCE)), Barrier()]
        return [Barrier(), _mesh_all_pairs(n, lambda r, o: per[r], LOAD_REDUCE, True), Barrier()]
    if op == "all_reduce":
        per = chunk_bytes(nbytes // itemsize, n, itemsize)
        if ring:
            i, s = np.arange(n)[None, :], np.arange(n - 1)[:, None]
            # the gather overwrites chunks of the buffer that the right neighbour's reduce steps
            # may still read, so a barrier separates the two chains
            return [Barrier(), Ring(per[ring_reduce_scatter_chunk(i, s, n)], np.full(n - 1, LOAD_REDUCE)), Barrier(),
                    Ring(per[ring_all_gather_chunk(i, s, n)], np.full(n - 1, LOAD)), Barrier()]
        if nbytes <= eager_bytes:
            # eager: copy into the call's slot, then every rank reduces the whole buffer from
            # the peers' slots straight into its own; the slots outlive the call (runtime/pipeline/_buffers.py)
            whole = _mesh_all_pairs(n, lambda r, o: np.full(r.size, nbytes), LOAD_REDUCE, True)
            return [Local(np.full(n, nbytes)), Barrier(), whole]
        if nbytes // itemsize < n:
            whole = _mesh_all_pairs(n, lambda r, o: np.full(r.size, nbytes), LOAD_REDUCE, True)
            return [Barrier(), whole, Barrier(), Local(np.full(n, nbytes))]
        scatter = _mesh_all_pairs(n, lambda r, o: per[r], LOAD_REDUCE, True)
        gather = _mesh_all_pairs(n, lambda r, o: per[o], LOAD, False)
        return [Barrier(), scatter, Barrier(), gather, Barrier()]
    if op == "all_to_all":
        block = nbytes // n
        return [Barrier(), _mesh_all_pairs(n, lambda r, o: np.full(r.size, block), LOAD, True), Barrier()]
    # broadcast
    readers = np.array([i for i in range(n) if i != root], dtype=np.int64)
    mesh = Mesh(readers, np.full(readers.size, root), np.full(readers.size, nbytes, dtype=np.int64),
                np.full(readers.size, LOAD))
    return [Barrier(), mesh, RootWait(root)] if nbytes and readers.size else [Barrier(), RootWait(root)]


def exchange(phases: list[tuple[np.ndarray, int]]) -> list:
    """The steps of a call given by its traffic (all_to_all_v, MoE dispatch and combine): the
    arrival barrier, then per phase a full-mesh step in which member i pulls ``B[i, j]`` bytes
    from member j (``phases``: (B, transfer kind) pairs; B[i, i] is a local copy), then the
    departure barrier. The phases follow each other without a barrier: each reads only what
    its owners published before the arrival (runtime: ep/_buffer.py, all_to_all_v). A phase of
    kind HOST_LOAD or HOST_STORE moves B[i, i] bytes between member i's HBM and its host DRAM
    (runtime/communicator/_hostrows.py: one member, so no barrier is timed). A phase of kind BARRIER_PHASE
    is a barrier between the phases around it (a user's slice map, stratacl.fabric)."""
    steps: list = [Barrier()]
    for b, kind in phases:
        if kind == BARRIER_PHASE:
            steps.append(Barrier())
            continue
        b = np.asarray(b, dtype=np.int64)
        reader, owner = np.nonzero(b)
        kinds = np.where((reader == owner) & (kind < HOST_LOAD), LOCAL_COPY, kind)
        steps.append(Mesh(reader, owner, b[reader, owner], kinds))
    return steps + [Barrier()]


def peers_read(op: str, algo: str, n: int, root: int = 0) -> np.ndarray:
    """How many distinct peers each member reads from: the mappings jit registration makes when
    every buffer is fresh (a ring reads its left neighbour only)."""
    if n == 1 or op == "barrier":
        return np.zeros(n, dtype=np.int64)
    if op == "sendrecv" or (algo == "ring" and op in RING_OPS):
        return np.ones(n, dtype=np.int64)
    if op == "broadcast":
        return (np.arange(n) != root).astype(np.int64)
    return np.full(n, n - 1, dtype=np.int64)


def staging_bytes(op: str, n: int, nbytes: int, root: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each member copies into the communication buffer before a call and out of it after
    (the staged baseline), for a call whose input buffers hold ``nbytes``."""
    me = np.arange(n)
    full = np.full(n, nbytes, dtype=np.int64)
    if op == "all_gather":
        return full, full * n
    if op == "reduce_scatter":
        return full, full // n
    if op == "broadcast":
        return np.where(me == root, nbytes, 0), np.where(me == root, 0, nbytes)
    if op == "barrier":
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    return full, full


def staged_rounds(op: str, n: int, nbytes: int, buffer_bytes: int | None, itemsize: int = 1) -> list[int]:
    """Per-round input bytes when a communication buffer of ``buffer_bytes`` must hold a round's
    input and output (None: one round). Rounds split on element (and, where the op has chunks,
    on N-element) boundaries so every round is a valid call of its own."""
    if op == "barrier" or nbytes == 0:
        return [nbytes]
    cin, cout = staging_bytes(op, n, nbytes)
    need = int(max(cin.max(), cout.max()))
    if buffer_bytes is None or need <= buffer_bytes:
        return [nbytes]
    grain = itemsize * (n if op in ("reduce_scatter", "all_to_all") else 1)
    units = max(nbytes // grain, 1)
    rounds = -(-need // buffer_bytes)
    per = -(-units // rounds)
    out = []
    done = 0
    while done < units:
        take = min(per, units - done)
        out.append(take * grain)
        done += take
    out[-1] += nbytes - units * grain            # a ragged tail rides with the last round
    return out
