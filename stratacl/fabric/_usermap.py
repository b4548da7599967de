"""A user's slice map run as an operator: the paper's full-mesh abstraction (section 6.1), public.

An operator's frontend only says what moves: remote slices ``<peer, src offset, dst offset,
bytes, action>`` over two buffers every rank names, ``src`` (what peers read, and what this
rank's stores read) and ``dst`` (what this rank's loads and reductions write, and what peers
store into). The backend does the rest, as for the library's own operators:

    SliceMap (this rank's slices, phase by phase)
        |  local checks: offsets and sizes inside the buffers, dtypes
        v
    run(comm, smap, src, dst)   on the communicator's call pipeline (runtime/pipeline/_call.py):
        enter                   descriptor: dtype, phases, reduce op (every member agrees);
        |                       extension words: the dst buffer's block and both sizes, which
        |                       must be the same on every rank (symmetric buffers); a rank that
        |                       rejects its slices raises, its peers raise CollectiveMismatch
        sources, blocks ready   peers' src (loads) and dst (stores) registered here (a peer on
        |                       another host: this host's mirror of it, see "Across hosts")
        phases                  each compiled (collectives/_backend.py) and run on the cores
        |                       (balanced or naive partitioning) or the SDMA engine, with a
        |                       barrier between two phases
        finish, tick            departure barrier; under a modeled clock every member times the
                                call from every member's bytes per peer, exchanged in HBM

Actions: ``load`` (peer's src -> my dst), ``store`` (my src -> peer's dst), ``reduce`` (peer's
src loaded and accumulated into my dst: every reduce slice of a phase writing the same dst range
is one reduction, in the order the slices were added, with the atomic write-back the paper's
MTE does; list this rank itself as a peer to include its own values).

Across hosts (runtime/hosts/_reads.py) a peer on another host is this host's mirror of it: a
load reads what the carrier read into the mirror at the barrier before the phase, and a store
writes into the mirror, from which the carrier puts the stored ranges into the peer's segment
on its host before the barrier that ends the phase completes there. The carrier learns the
ranges from the block the traffic block is part of: after its [phases, N + 1] words, when the
communicator spans hosts, the number of this rank's stores into far members and one row per
store (phase, member, dst offset, bytes).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import CollectiveMismatch
from .._operators import BY_NAME
from ..collectives import dtype_code, reduce_code, schedules, slices
from ..runtime import pipeline

ACTIONS = {"load": slices.LOAD, "store": slices.STORE, "reduce": slices.LOAD_ACC}
# extension words after the 2 N words of needs (the src bytes this rank reads of each peer, the dst
# bytes it writes of each): dst's block (address, segment address, size, offset, epoch), the
# sizes of src and dst, the traffic block (timed calls, and calls storing into far members: the
# far stores follow the traffic, see the module docstring)
X_DST, X_SRC_BYTES, X_DST_BYTES, X_TRAFFIC, X_WORDS = 0, 5, 6, 7, 12
OPERATION = "slice_map"
# where the operator table tells the carriers (across hosts) peers read the traffic block
assert BY_NAME[OPERATION].read_block == (2, X_TRAFFIC)
# and where it tells them peers store into (dst's block), whose stored ranges they put back
assert BY_NAME[OPERATION].write_block == (2, X_DST)


class SliceMap:
    """This rank's slices of one operator, phase by phase (``barrier()`` starts the next)."""

    def __init__(self) -> None:
        self._phases: list[list[tuple[int, int, int, int, int]]] = [[]]

    def _add(self, action: str, peer: int, nbytes: int, src_offset: int, dst_offset: int) -> SliceMap:
        values = (peer, nbytes, src_offset, dst_offset)
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
            raise TypeError(f"SliceMap.{action}: peer, nbytes and offsets must be integers, got {values}")
        if nbytes < 0 or src_offset < 0 or dst_offset < 0:
            raise ValueError(f"SliceMap.{action}: nbytes and offsets must not be negative, got {values}")
        self._phases[-1].append((ACTIONS[action], int(peer), int(src_offset), int(dst_offset), int(nbytes)))
        return self

    def load(self, peer: int, nbytes: int, src_offset: int = 0, dst_offset: int = 0) -> SliceMap:
        """Pull ``nbytes`` of ``peer``'s src at ``src_offset`` into this rank's dst at ``dst_offset``."""
        return self._add("load", peer, nbytes, src_offset, dst_offset)

    def store(self, peer: int, nbytes: int, src_offset: int = 0, dst_offset: int = 0) -> SliceMap:
        """Push ``nbytes`` of this rank's src at ``src_offset`` into ``peer``'s dst at ``dst_offset``."""
        return self._add("store", peer, nbytes, src_offset, dst_offset)

    def reduce(self, peer: int, nbytes: int, src_offset: int = 0, dst_offset: int = 0) -> SliceMap:
        """Load ``nbytes`` of ``peer``'s src and accumulate them into this rank's dst (see the
        module docstring for the order)."""
        return self._add("reduce", peer, nbytes, src_offset, dst_offset)

    def barrier(self) -> SliceMap:
        """End the phase: the next phase's slices start once every member finished this one."""
        self._phases.append([])
        return self

    @property
    def phases(self) -> int:
        return len(self._phases)

    def __len__(self) -> int:
        return sum(len(p) for p in self._phases)

    def __repr__(self) -> str:
        return f"SliceMap({self.phases} phase(s), {len(self)} slice(s))"

    def _maps(self, me: int, n: int, src_bytes: int, dst_bytes: int, itemsize: int, name: str):
        """Each phase as the backend's slice map, after the checks of this rank's own side; the
        bytes of each peer's src it reads and of each peer's dst it writes (checked against the
        peers' sizes once they are known); its bytes per peer and transfer kind, phase by
        phase, for the modeled clock; and its stores, a row each (phase, peer, dst offset,
        bytes)."""
        maps, traffic, stores = [], np.zeros((self.phases, n + 1), dtype=np.int64), []
        need = np.zeros((2, n), dtype=np.int64)
        for k, phase in enumerate(self._phases):
            a = np.array(phase, dtype=np.int64).reshape(-1, 5)
            op, peer, src, dst, nbytes = a.T
            bad = (peer < 0) | (peer >= n)
            if bad.any():
                raise ValueError(f"{name}: phase {k}: peer {int(peer[bad][0])} is not a rank of the communicator "
                                 f"(size {n})")
            store = op == slices.STORE
            # this rank's own side: a load's or reduce's dst, a store's src
            for what, off, limit, sel in (("dst", dst, dst_bytes, ~store), ("src", src, src_bytes, store)):
                over = sel & (off + nbytes > limit)
                if over.any():
                    i = int(np.argmax(over))
                    raise ValueError(f"{name}: phase {k}: a slice with peer {int(peer[i])} touches this rank's "
                                     f"{what} bytes {int(off[i])}..{int(off[i] + nbytes[i])}, but {what} has "
                                     f"{limit} bytes")
            if ((op == slices.LOAD_ACC) & (((src | dst | nbytes) % itemsize) != 0)).any():
                raise ValueError(f"{name}: phase {k}: reduce slices must be whole elements of {itemsize} bytes")
            np.maximum.at(need[0], peer[~store], (src + nbytes)[~store])
            np.maximum.at(need[1], peer[store], (dst + nbytes)[store])
            # offsets: a load's or reduce's src is the peer's, dst this rank's; a store's the other
            # way (collectives/_slices.py)
            maps.append(slices.make(me, peer, slices.IN, src, slices.OUT, dst, nbytes, op))
            np.add.at(traffic[k], peer, nbytes)
            stores.append(np.stack([np.full(int(store.sum()), k), peer[store], dst[store], nbytes[store]], axis=1))
            traffic[k, n] = schedules.LOAD_REDUCE if (op == slices.LOAD_ACC).any() else schedules.LOAD
        return maps, need, traffic, np.concatenate(stores).astype(np.int64)


def run(comm, smap: SliceMap, src: np.ndarray, dst: np.ndarray, *, reduce: str = "sum",
        name: str = "slice_map", async_op: bool = False, path: str | None = None) -> Any:
    """Run ``smap`` as one operator over ``comm``: every rank calls it with its own slice map,
    ``src`` and ``dst`` (the same byte sizes and dtype on every rank, and the same number of
    phases). Collective and host-blocking; ``async_op=True`` returns a ``Work``; ``path``:
    ``mte``, ``sdma`` or ``auto`` as for any operator. ``reduce``: the op of reduce slices.
    Reads and writes outside the buffers are refused before any byte moves (on every rank)."""
    if not isinstance(name, str) or (name != OPERATION and name in BY_NAME):
        raise ValueError(f"stratacl.fabric.run: name {name!r} is taken by a built-in operator; name yours otherwise")
    pipe = pipeline(comm)
    return pipe.call(name, lambda: _run(comm, pipe, smap, src, dst, reduce, name), async_op, path)


def _run(comm, pipe, smap: SliceMap, src, dst, reduce: str, name: str) -> None:
    n, me = comm.size, comm.rank
    error = inp = target = flat = None
    code = rcode = phases = 0
    maps = need = traffic = far_stores = None
    spans = False
    try:
        if not isinstance(smap, SliceMap):
            raise TypeError(f"{name}: expected a stratacl.fabric.SliceMap, got {type(smap).__name__}")
        for what, a in (("src", src), ("dst", dst)):
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{name}: {what} must be a numpy array, got {type(a).__name__}")
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            raise ValueError(f"{name}: dst must be a writable C-contiguous array")
        code = dtype_code(dst.dtype, name)
        rcode = reduce_code(reduce, dst.dtype, name)
        phases = smap.phases
        maps, need, traffic, stores = smap._maps(me, n, src.nbytes, dst.nbytes, dst.itemsize, name)
        # a store into a far member writes into this host's mirror of it: the carrier puts
        # these ranges back into the member's segment (empty bytes move nothing)
        far = pipe.far_members()
        spans = bool(far.any())
        far_stores = stores[far[stores[:, 1]] & (stores[:, 3] > 0)]
        pipe.check_path(name)
        inp = pipe.input(src, name, bool(np.may_share_memory(src, dst)))
        flat = dst.reshape(-1)
        target = pipe.output(flat, hbm=True)          # peers may store into it: in HBM
        if target is not flat:
            target[...] = flat                        # bytes the operator leaves alone come back unchanged
    except Exception as e:
        error = e
    ext = np.zeros(2 * n + X_WORDS, dtype=np.int64)
    timed = pipe.timed
    block = None
    if error is None:
        ext[:2 * n] = need.reshape(-1)
        x = ext[2 * n:]
        x[X_DST:X_DST + 5] = pipe.block(target) if target.size else 0
        x[X_SRC_BYTES], x[X_DST_BYTES] = src.nbytes, dst.nbytes
        if timed or far_stores.size:
            # across hosts the far stores follow the traffic (their count first), for the carrier
            block = pipe.empty((traffic.size + (1 + far_stores.size if spans else 0),), np.int64)
            block[:traffic.size] = traffic.reshape(-1)
            if spans:
                block[traffic.size] = len(far_stores)
                block[traffic.size + 1:] = far_stores.reshape(-1)
            x[X_TRAFFIC:X_TRAFFIC + 5] = pipe.block(block)
    parity = pipe.enter(OPERATION if name == "slice_map" else name, code, inp, ext, error, count=phases, redop=rcode)
    words = pipe.extensions(parity)
    _check_needs(comm, name, words[:, :n], words[:, n:2 * n], words[:, 2 * n + X_SRC_BYTES],
                 words[:, 2 * n + X_DST_BYTES])
    every = words[:, 2 * n:2 * n + X_WORDS]
    reads = np.zeros(n, dtype=np.int64)
    writes = np.zeros(n, dtype=np.int64)
    for m in maps:
        store = m.op == slices.STORE
        reads[m.peer[~store]] = 1
        writes[m.peer[store]] = 1
    reads[me] = writes[me] = 0
    pipe.sources_ready(name, parity, inp.addr, need=reads)
    for i in np.flatnonzero(writes).tolist():
        pipe.block_ready(name, i, *(int(v) for v in every[i, X_DST + 1:X_DST + 5]))
    pipe.name_buffers(slices.OUT, every[:, X_DST].copy())
    for k, m in enumerate(maps):
        if k:
            pipe.barrier(name)
        pipe.run(name, pipe.compile(m), None, code, rcode)
    if timed:
        matrices = _every_traffic(comm, pipe, name, parity, every, traffic.shape)
    pipe.finish(name)
    pipe.output_done(flat, target)
    if timed:
        exchange = []
        for k in range(phases):
            if k:
                exchange.append((np.zeros((n, n), dtype=np.int64), schedules.BARRIER_PHASE))
            exchange.append((matrices[:, k, :n], int(matrices[:, k, n].max())))
        pipe.tick(name, parity, exchange)


def _check_needs(comm, name: str, reads: np.ndarray, writes: np.ndarray, src_bytes: np.ndarray,
                 dst_bytes: np.ndarray) -> None:
    """Every member's reads of its peers' src and writes to their dst against the peers' sizes,
    from what every member published: the same verdict on every rank, before any byte moves.
    The member at fault raises ValueError, the others CollectiveMismatch naming it."""
    for words, limit, what in ((reads, src_bytes, "src"), (writes, dst_bytes, "dst")):
        over = words > limit[None, :]
        if over.any():
            i, p = (int(v) for v in np.argwhere(over)[0])
            detail = (f"rank {comm.members[i]} reaches byte {int(words[i, p])} of rank {comm.members[p]}'s {what}, "
                      f"which has {int(limit[p])} bytes; no data was moved")
            if i == comm.rank:
                raise ValueError(f"{name}: {detail}")
            raise CollectiveMismatch(f"{name}: {detail}")


def _every_traffic(comm, pipe, name: str, parity: int, every: np.ndarray, shape: tuple) -> np.ndarray:
    """Every member's traffic block [phases, n + 1] (bytes per peer, transfer kind), pulled from
    its HBM into [n, phases, n + 1]: what each member needs to time the call as its peers do."""
    n, me = comm.size, comm.rank
    for i in range(n):
        if i != me:
            pipe.block_ready(name, i, *(int(v) for v in every[i, X_TRAFFIC + 1:X_TRAFFIC + 5]))
    got = pipe.empty((n, *shape), np.int64)
    nbytes = int(np.prod(shape)) * 8
    peers = np.arange(n)
    pipe.name_scratch(every[:, X_TRAFFIC].copy())
    pipe.set_bases(slices.OUT, me, got.ctypes.data)
    # metadata, like a collective's descriptors: moved, not counted in the byte counters
    pipe.execute(name, pipe.compile(slices.make(me, peers, slices.SCRATCH, 0, slices.OUT, peers * nbytes, nbytes,
                                                slices.LOAD)))
    return np.array(got)
