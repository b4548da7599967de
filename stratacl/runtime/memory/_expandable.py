"""The expandable allocator: each pool reserves an address range and maps HBM chunks into it as
it grows, as torch's caching allocator does with ``expandable_segments:True``.

    a pool's range (large pool: the first half of the rank's address slice; small pool: the
    second half; each twice the HBM, as torch reserves more address space than memory)
    base                                                                          base + span
    |  live  | free |  live  |  free  |                  unmapped                      |
    |<-- chunk 0 -->|<-- chunk 1 -->|<-- chunk 2 -->|<-- chunk 3 -->|  ...
      HBM @ 6 MiB     HBM @ 0         HBM @ 2 MiB     not mapped

    malloc       best-fit free block of the pool: no physical event
      miss       grow: the lowest run of free and unmapped addresses that holds the request
                 (usually the free tail and what follows it), as torch's find_expandable_block;
                 each unmapped chunk of it gets any free chunk of HBM -> every chunk mapped is
                 one registration of its own (interception.segment_mapped(chunk)), announced to
                 peers in the background (roa)
    free         the block goes back to the pool; free neighbours coalesce across chunk boundaries
    empty_cache  every chunk with no live byte is unmapped -> one deregistration per chunk

A chunk's HBM is any free chunk of the rank's HBM (contiguous runs are taken when they exist, so
peers' and the owner's mappings stay few), found by address through the chunk table the
registration unit keeps for its peers (runtime.memory._registration). An unmapped chunk's HBM and its
address are both reused only once every peer has acknowledged unmapping it
(``Hbm.release_after_acks``): so a chunk a peer has mapped is always the owner's current one.

What a live block's descriptors name (``block.seg``): its chunk when it lies in one (the chunk's
own registration), else a ``ChunkRange`` over the chunks it covers, with an epoch of its own. A
range is forgotten as soon as one of its chunks is unmapped, so a (va, epoch) pair never names
two different runs of memory. Peers map what they read chunk by chunk.
"""
from __future__ import annotations

import bisect

import numpy as np

from ..._errors import OutOfMemory
from ._allocator import BLOCK_ROUND, Block, HbmAllocator, Interception, absorb, fmt_bytes
from ._hbm import Hbm
from ._window import ShadowWindow

RUNS_KEPT = 4096        # chunk ranges remembered per pool (the same block shape reuses its range)


class Chunk:
    """Chunks of HBM mapped at ``va``: one chunk is one physical event and one registration."""

    __slots__ = ("va", "size", "hbm_offset", "epoch")

    def __init__(self, va: int, size: int, hbm_offset: int, epoch: int):
        self.va, self.size, self.hbm_offset, self.epoch = va, size, hbm_offset, epoch

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(va={self.va:#x}, size={self.size}, hbm_offset={self.hbm_offset:#x}, "
                f"epoch={self.epoch})")


class ChunkRange(Chunk):
    """Adjacent chunks named together in a descriptor, because a block straddles them; its
    ``hbm_offset`` is its first chunk's (the others are where the chunk table says)."""

    __slots__ = ()


class _Range:
    """One pool's reserved range and its chunks."""

    def __init__(self, small: bool, base: int, span: int, chunk: int):
        self.small, self.base, self.chunk = small, base, chunk
        self.nchunks = span // chunk
        self.span = self.nchunks * chunk
        # the first block stays the first: splits keep the head, merges keep the left block
        self.first = Block(None, base, self.span, small, mapped=False)
        self.ustarts: list[int] = [base]           # unmapped blocks, sorted by address
        self.ublocks: list[Block] = [self.first]
        self.chunks: dict[int, Chunk] = {}         # index -> mapped chunk
        self.mapped = np.zeros(self.nchunks, dtype=bool)
        self.live = np.zeros(self.nchunks, dtype=np.int32)   # live blocks touching each chunk
        self.free_chunks = 0                       # mapped chunks no live block touches
        self.runs: dict[tuple[int, int], ChunkRange] = {}
        self.pending: dict[int, int] = {}          # unmapped index -> its release, until acknowledged

    def index(self, va: int) -> int:
        return (va - self.base) // self.chunk

    def add_unmapped(self, b: Block) -> None:
        i = bisect.bisect_left(self.ustarts, b.va)
        self.ustarts.insert(i, b.va)
        self.ublocks.insert(i, b)

    def remove_unmapped(self, b: Block) -> None:
        i = bisect.bisect_left(self.ustarts, b.va)
        assert self.ublocks[i] is b
        del self.ustarts[i], self.ublocks[i]


class ExpandableAllocator(HbmAllocator):
    """Pools that grow and shrink by chunks of ``chunk`` bytes (see the module docstring)."""

    kind = "expandable"

    def __init__(self, rank: int, window: ShadowWindow, hbm: Hbm, interception: Interception, chunk: int):
        super().__init__(rank, window, hbm, interception)
        self.chunk = chunk
        half = window.slice_bytes // 2
        start = window.slice_start(rank)
        self._ranges = {False: _Range(False, start, half, chunk), True: _Range(True, start + half, half, chunk)}

    # --- growth -----------------------------------------------------------------------------
    def _should_split(self, block: Block, size: int) -> bool:
        return block.size - size >= BLOCK_ROUND      # torch splits any block of an expandable segment

    def _grow(self, size: int, small: bool, wait: bool = False) -> Block | None:
        r = self._ranges[small]
        place = self._place(r, size)
        if place is None and wait:
            # _wait_for_acks answers only whether ready() came true: keep what _place found
            got: list = []
            if self._wait_for_acks(lambda: got.append(self._place(r, size)) or got[-1] is not None):
                place = got[-1]
        if place is None:
            return None
        ws, pieces = place
        block = None
        for cs, ce in pieces:
            block = self._map_chunks(r, cs, ce)
        # the window's pieces, all free and mapped now, coalesced into one block
        assert block is not None and block.va <= ws and ws + size <= block.va + block.size, (block, ws, size)
        self._remove_free(block)
        return self._cut(block, ws, block.va + block.size, self._insert_free)

    def _usable(self, r: _Range) -> list[list[tuple[int, int, bool]]]:
        """Runs of addresses the pool could allocate from after mapping: maximal sequences of
        its free blocks and of unmapped chunks whose address is reusable (no release of it
        awaits a peer), as (start, end, mapped) pieces. Only runs that touch an unmapped block
        are listed (the others are free blocks as they are)."""
        self._settle(r)
        blocked = sorted(r.pending)
        out = []
        covered = r.base
        for u in list(r.ublocks):
            if u.va < covered:
                continue
            b = u
            while b.prev is not None and b.prev.free:
                b = b.prev
            run: list[tuple[int, int, bool]] = []
            while b is not None and b.free:
                end = b.va + b.size
                if b.mapped:
                    run.append((b.va, end, True))
                else:
                    pos = b.va
                    k0, k1 = r.index(b.va), r.index(end)
                    for k in blocked[bisect.bisect_left(blocked, k0):bisect.bisect_left(blocked, k1)]:
                        va = r.base + k * r.chunk
                        if va > pos:
                            run.append((pos, va, False))
                        if run:
                            out.append(run)
                            run = []
                        pos = va + r.chunk
                    if pos < end:
                        run.append((pos, end, False))
                covered = end
                b = b.next
            if run:
                out.append(run)
        return out

    def _settle(self, r: _Range) -> None:
        """Forget the releases every peer has acknowledged: their addresses are reusable."""
        for k, epoch in list(r.pending.items()):
            if not self.hbm.is_awaiting(epoch):
                del r.pending[k]

    def _place(self, r: _Range, size: int) -> tuple[int, list[tuple[int, int]]] | None:
        """Where the request goes, as torch's ``find_expandable_block`` chooses: the lowest run
        of free and unmapped addresses that holds it, from the run's start (the small pool,
        which grows down: the highest run, up to its end), with the chunk-aligned unmapped
        pieces [cs, ce) to map; None if no run holds it or HBM has too few free chunks."""
        runs = self._usable(r)
        for run in reversed(runs) if r.small else runs:
            lo, hi = run[0][0], run[-1][1]
            if hi - lo < size:
                continue
            ws = hi - size if r.small else lo
            g, base = r.chunk, r.base
            pieces = []
            for s, e, mapped in run:
                a, b = max(s, ws), min(e, ws + size)
                if not mapped and a < b:
                    pieces.append((base + (a - base) // g * g, base + -(-(b - base) // g) * g))
            if sum(ce - cs for cs, ce in pieces) > self.hbm.free_bytes:
                return None                  # as torch, when the driver has no memory left
            return ws, pieces
        return None

    def _map_chunks(self, r: _Range, cs: int, ce: int) -> Block:
        """Map the unmapped chunks [cs, ce) onto free HBM; returns the free block now holding
        them, coalesced with free neighbours (and in the free list)."""
        g, n = r.chunk, (ce - cs) // r.chunk
        offsets = self._take_hbm(n)          # first: it may raise OutOfMemory, before any change
        i = bisect.bisect_right(r.ustarts, cs) - 1
        u = r.ublocks[i]
        assert u.va <= cs and ce <= u.va + u.size, (u, cs, ce)
        r.remove_unmapped(u)
        new = self._cut(u, cs, ce, r.add_unmapped)
        k0 = r.index(cs)
        j = 0
        while j < n:                         # one mapping per physically contiguous run
            e = j + 1
            while e < n and offsets[e] == offsets[e - 1] + g:
                e += 1
            self.window.map(cs + j * g, (e - j) * g, self.hbm.fd, offsets[j])
            j = e
        new.mapped = True
        if not r.chunks:
            self.mstats.add("segment", r.small, 1)
        r.mapped[k0:k0 + n] = True
        r.free_chunks += n
        self._mapped(r.small, ce - cs, n)
        for j, k in enumerate(range(k0, k0 + n)):
            chunk = r.chunks[k] = Chunk(r.base + k * g, g, offsets[j], self._next_epoch())
            self.interception.segment_mapped(chunk)
        block = self._coalesce(new)
        self._insert_free(block)
        return block

    def _take_hbm(self, n: int) -> list[int]:
        """HBM offsets for ``n`` chunks: one contiguous run if there is one, else any chunks."""
        g = self.chunk
        start = self.hbm.alloc(n * g)
        if start is not None:
            return [start + j * g for j in range(n)]
        offsets: list[int] = []
        try:
            for _ in range(n):
                offsets.append(self.hbm.alloc(g))
                assert offsets[-1] is not None, "free HBM was counted before mapping"
        except OutOfMemory:
            for offset in offsets:
                self.hbm.release_after_acks(-1, offset, g, set())
            raise
        return offsets

    # --- live blocks ------------------------------------------------------------------------
    def _span(self, r: _Range, block: Block) -> tuple[int, int]:
        return r.index(block.va), r.index(block.va + block.size - 1)

    def _activate(self, block: Block) -> None:
        r = self._ranges[block.small]
        k0, k1 = self._span(r, block)
        if k0 == k1:                     # most blocks: one chunk, no array slicing
            r.free_chunks -= int(r.live[k0] == 0)
            r.live[k0] += 1
        else:
            live = r.live[k0:k1 + 1]
            r.free_chunks -= int(np.count_nonzero(live == 0))
            live += 1
        block.seg = self._name(r, k0, k1)

    def _deactivate(self, block: Block) -> None:
        r = self._ranges[block.small]
        k0, k1 = self._span(r, block)
        if k0 == k1:
            r.live[k0] -= 1
            r.free_chunks += int(r.live[k0] == 0)
        else:
            live = r.live[k0:k1 + 1]
            live -= 1
            r.free_chunks += int(np.count_nonzero(live == 0))

    def _name(self, r: _Range, k0: int, k1: int) -> Chunk:
        """What descriptors name for chunks k0..k1 (all mapped)."""
        if k0 == k1:
            return r.chunks[k0]
        key = (k0, k1 - k0 + 1)
        run = r.runs.get(key)
        if run is None:
            if len(r.runs) >= RUNS_KEPT:
                r.runs.clear()           # blocks keep theirs; new ones get new epochs
            g = r.chunk
            run = r.runs[key] = ChunkRange(r.base + k0 * g, key[1] * g, r.chunks[k0].hbm_offset, self._next_epoch())
        return run

    def _releasable(self, small: bool) -> int:
        return self._ranges[small].free_chunks * self.chunk

    def registration_of(self, addr: int, nbytes: int):
        with self.lock:
            for r in self._ranges.values():
                if r.base <= addr < r.base + r.span:
                    if addr + nbytes > r.base + r.span:
                        return None
                    k0, k1 = r.index(addr), r.index(addr + max(nbytes, 1) - 1)
                    if not r.mapped[k0:k1 + 1].all():
                        return None
                    return self._name(r, k0, k1)
            return None

    # --- shrinking --------------------------------------------------------------------------
    def empty_cache(self) -> int:
        released = 0
        with self.lock:
            self._reap()
            for small, r in self._ranges.items():
                g, base = r.chunk, r.base
                for _, _, _, b in list(self._free[small]):
                    lo = base + -(-(b.va - base) // g) * g
                    hi = base + (b.va + b.size - base) // g * g
                    if hi - lo < g:
                        continue
                    self._remove_free(b)
                    self._unmap_chunks(r, self._cut(b, lo, hi, self._insert_free))
                    released += hi - lo
                self._sync_inactive(small)
        return released

    def _unmap_chunks(self, r: _Range, mid: Block) -> None:
        """Unmap the wholly free chunks of ``mid`` (free, chunk-aligned, in no free list); their
        HBM and addresses come back once peers have acknowledged (see the module docstring)."""
        lo, hi, g = mid.va, mid.va + mid.size, r.chunk
        k0, n = r.index(lo), (hi - lo) // g
        self.window.unmap(lo, hi - lo)
        r.mapped[k0:k0 + n] = False
        r.free_chunks -= n
        self._mapped(r.small, -(hi - lo), -n)
        for k in range(k0, k0 + n):
            chunk = r.chunks.pop(k)
            # the release is an event with an epoch of its own, newer than every name of the chunk
            release = Chunk(chunk.va, g, chunk.hbm_offset, self._next_epoch())
            self.interception.segment_released(release)
            if self.hbm.is_awaiting(release.epoch):
                r.pending[k] = release.epoch
        if not r.chunks:
            self.mstats.add("segment", r.small, -1)
        if r.runs:
            r.runs = {key: run for key, run in r.runs.items() if key[0] + key[1] <= k0 or key[0] >= k0 + n}
        mid.mapped, mid.seg = False, None
        prv, nxt = mid.prev, mid.next
        if prv is not None and prv.free and not prv.mapped:
            r.remove_unmapped(prv)
            absorb(prv, mid)
            mid = prv
        if nxt is not None and nxt.free and not nxt.mapped:
            r.remove_unmapped(nxt)
            absorb(mid, nxt)
        r.add_unmapped(mid)

    # --- diagnostics ------------------------------------------------------------------------
    def _oom_detail(self, size: int, small: bool) -> str:
        s = self.mstats
        r = self._ranges[small]
        largest = max((run[-1][1] - run[0][0] for run in self._usable(r)), default=0)
        return (f": capacity {fmt_bytes(self.hbm.capacity)}, {fmt_bytes(s.current('allocated_bytes'))} held "
                f"by live arrays, {fmt_bytes(s.current('reserved_bytes') - s.current('allocated_bytes'))} mapped "
                f"but free in chunks that also hold live arrays, {fmt_bytes(self.hbm.free_bytes)} of HBM free, "
                f"{fmt_bytes(self.hbm.awaiting_bytes)} released and awaiting peers; largest run of addresses "
                f"the {'small' if small else 'large'} pool could use {fmt_bytes(largest)}")

    def check(self) -> None:
        """Verify the pools' invariants (tests): blocks tile each range, free blocks are in the
        free lists and coalesced, unmapped ones are chunk-aligned and recorded, counts agree,
        no two chunks share HBM."""
        with self.lock:
            offsets = []
            for small, r in self._ranges.items():
                b, pos, prev = r.first, r.base, None
                free_set = {id(e[3]) for e in self._free[small]}
                unmapped, live = [], np.zeros(r.nchunks, dtype=np.int32)
                while b is not None:
                    assert b.va == pos and b.prev is prev and b.size > 0, b
                    if b.free and b.mapped:
                        assert id(b) in free_set, b
                        assert not (prev is not None and prev.free and prev.mapped), (prev, b)
                    if not b.mapped:
                        assert b.free and (b.va - r.base) % r.chunk == 0 and b.size % r.chunk == 0, b
                        assert not (prev is not None and not prev.mapped), (prev, b)
                        assert not r.mapped[r.index(b.va):r.index(b.va + b.size - 1) + 1].any(), b
                        unmapped.append(b)
                    else:
                        assert r.mapped[r.index(b.va):r.index(b.va + b.size - 1) + 1].all(), b
                    if not b.free:
                        k0, k1 = self._span(r, b)
                        live[k0:k1 + 1] += 1
                    pos, prev, b = b.va + b.size, b, b.next
                assert pos == r.base + r.span
                assert [u.va for u in unmapped] == r.ustarts and all(x is y for x, y in zip(unmapped, r.ublocks))
                assert (live == r.live).all()
                assert r.free_chunks == int(np.count_nonzero(r.mapped & (live == 0)))
                assert sorted(r.chunks) == list(np.flatnonzero(r.mapped))
                assert not set(r.pending) & set(r.chunks)
                offsets += [c.hbm_offset for c in r.chunks.values()]
            assert len(set(offsets)) == len(offsets) and all(o % self.chunk == 0 for o in offsets)
            assert len(offsets) * self.chunk + self.hbm.awaiting_bytes + self.hbm.free_bytes == self.hbm.capacity
