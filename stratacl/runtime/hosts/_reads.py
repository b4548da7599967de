"""What a host's carrier reads from the other hosts for a barrier of a call (``FarReads``): the
byte ranges the call's slice maps (collectives/_slices.py) have this host's members pull from
each far member's input in the phase after the barrier, and nothing else.

    barrier b of call c of a communicator spanning hosts (b counted by the carrier: 0 at the
    call's entry, 1 at its middle, ...; a departure is marked and reads nothing)
      -> every member's descriptor of c: operation, count, dtype, root, its input's address
         and segment (an all_to_all_v's counts in the extension words)
      -> phase b of the operator's slice map for each member on this host, from the frontend
         the member itself took for that call (``phases``: eager, by chunks, large)
      -> its slices that load from a far member's input (IN), merged per member into runs
         of that input (``planned``), cached per call shape
      -> one MPI_Get per run into the member's mirror (with the expandable allocator one per
         chunk a run touches, where the member's chunk table says the chunk is)

A ring call (``--algo ring``/``auto``, runtime/communicator/_ringsteps.py; its descriptor names
its extra buffer in F_AUX1, which a mesh call leaves 0) has each member pull from its left
neighbour only, step after step: its entry barrier reads what step 0 pulls from a far left
neighbour (its input), all_reduce's middle barrier what step N-1 pulls, and every later step
is read once the far neighbour's ring-step word says it finished the step before (``ring``,
from its base in the descriptor's fifth extension word): from its input, or from the output
or scratch buffer its descriptor names.

A barrier past the call's last phase reads nothing, nor does a call whose descriptors disagree
(every member raises without pulling). The operators whose slice maps depend on more than
the descriptors (expert-parallel calls, a user's slice map) are read as a whole: the input,
twice its size when it is an eager slot, and the second buffer the operator table names
(``read_block``). A far member's send is read whole too: a receive pulls all of it.

A user's slice map may also store into a far member's buffer (the operator table's
``write_block``, its dst): the store lands in this host's mirror of the member, and this host's
carrier puts it back (``stores``):

    barrier j of the call, its members here all arrived (before their words leave the host)
      -> each member here's far stores (phase, member, dst offset, bytes), after its traffic
         block (fabric/_usermap.py), read from its segment here
      -> those of phase j - 1 (the phase the barrier ends), at the far member's dst block
      -> one MPI_Put per run from the mirror into the member's segment, complete there
         before the barrier's words are sent, so before the barrier completes on its host

At the call's entry barrier the carrier reads the chunk-table entries of each far dst stored
into (``runs``), which the ranks here map the mirror by, as for a read.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

from ..._operators import OPERATORS
from ...collectives import DTYPE_BY_CODE, slices
from ..memory import RegistrationUnit, hbm_runs
from ..pipeline import EAGER_BYTES, EAGER_CHUNKS_READ
from ..services import (
    F_ADDR, F_AUX1, F_CALL, F_COUNT, F_DTYPE, F_FLAGS, F_NBYTES, F_OP, F_ROOT, F_SEG_OFF, F_SEG_SIZE, F_SEG_VA,
)
from ._carrierwords import CarrierWords

NAME = {op.code: op.name for op in OPERATORS}
READ_BLOCK = {op.code: op.read_block for op in OPERATORS if op.read_block is not None}
# the operators whose members may store into a far member's buffer: the buffer's block and the
# block whose tail lists the stores (after the traffic words, [count, phases, N + 1] words in)
STORES = {op.code: (op.write_block, op.read_block) for op in OPERATORS if op.write_block is not None}
STORE_ROW = 4                                     # phase, member, dst offset, bytes
# the operators whose slice maps follow from their descriptors (``phases``)
PLANNED = ("barrier", "split", "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "gather",
           "scatter", "reduce", "all_to_all_v")


def phases(name: str, me: int, n: int, count: int, itemsize: int, root: int,
           counts: np.ndarray | None = None) -> list:
    """The slice maps member ``me`` of ``n`` runs for a call of ``name`` whose descriptors say
    ``count`` elements of ``itemsize`` bytes (the operator's F_COUNT) and ``root``; ``counts``:
    an all_to_all_v's extension words, a row per member (what it sends to each, then what it
    receives from each). The frontend is the one the Communicator's method takes for those
    arguments (runtime/communicator/_comm.py, _pipelined.py), with the mesh algorithm (a ring
    call's steps: ``ring_steps``)."""
    nb = count * itemsize
    if name == "all_gather":
        return slices.all_gather(me, n, nb)
    if name == "reduce_scatter":                  # F_COUNT is the output's, the input n times it
        return slices.reduce_scatter(me, n, n * count, itemsize)
    if name == "all_reduce":
        if nb <= EAGER_BYTES:
            if count >= n and n * nb >= EAGER_CHUNKS_READ:
                return slices.all_reduce_eager_chunks(me, n, count, itemsize)
            return slices.all_reduce_eager(me, n, nb)
        return slices.all_reduce(me, n, count, itemsize, small=0)
    if name == "all_to_all":
        return slices.all_to_all(me, n, nb)
    if name == "broadcast":
        return slices.broadcast(me, n, nb, root)
    if name in ("gather", "reduce"):
        return getattr(slices, name)(me, n, nb, root)
    if name == "scatter":
        return slices.scatter(me, n, nb, root)
    if name == "all_to_all_v":
        return slices.all_to_all_v(me, n, counts[:, :n], counts[:, n:2 * n], itemsize)
    return []                                     # barrier, split: nothing is pulled


RING = ("all_gather", "reduce_scatter", "all_reduce")     # the operators with ring steps
U32 = 0xFFFFFFFF


@lru_cache(maxsize=64)
def ring_steps(name: str, me: int, n: int, count: int, itemsize: int) -> tuple:
    """The slice maps of member ``me``'s ring steps in a ring call of ``name`` whose descriptors
    say ``count`` elements of ``itemsize`` bytes (F_COUNT: all_gather's and all_reduce's input,
    reduce_scatter's output), one a step, as runtime/communicator/_ringsteps.py runs them."""
    if name == "all_gather":
        return tuple(m for s in range(n - 1) for m in slices.ring_all_gather_step(me, n, count * itemsize, s))
    if name == "reduce_scatter":
        return tuple(m for s in range(n - 1) for m in slices.ring_reduce_scatter_step(me, n, n * count, itemsize, s))
    return tuple(m for s in range(2 * (n - 1)) for m in slices.ring_all_reduce_step(me, n, count, itemsize, s))


def ring_step_after(name: str, n: int, barrier: int) -> int | None:
    """The ring step that starts after barrier ``barrier`` of a ring call without waiting for
    the left neighbour (the entry: step 0; all_reduce's middle: step N-1, its second chain's
    first), or None (a departure)."""
    if barrier == 0:
        return 0
    return n - 1 if name == "all_reduce" and barrier == 1 else None


def ring_step_waits(name: str, n: int, s: int) -> bool:
    """Whether ring step ``s`` waits for the left neighbour to finish step s-1 (every step but
    those ``ring_step_after`` a barrier; s past the last step: none)."""
    total = 2 * (n - 1) if name == "all_reduce" else n - 1
    return 0 < s < total and not (name == "all_reduce" and s == n - 1)


def planned(name: str, n: int, here: Sequence[int], far: Sequence[int], barrier: int, count: int, itemsize: int,
            root: int, counts: np.ndarray | None = None) -> dict[int, np.ndarray]:
    """What the members ``here`` (indices in a communicator of ``n``) pull from the members
    ``far`` in the phase after barrier ``barrier`` of a call (``phases``' arguments): for each
    far member from which they pull anything, its runs as an array of (offset from the start
    of its input, bytes), sorted, none overlapping or touching another."""
    loads = [m for me in here for m in phases(name, me, n, count, itemsize, root, counts)[barrier:barrier + 1]]
    if not loads:
        return {}
    m = slices.concat(*loads)
    far_mask = np.zeros(n, bool)
    far_mask[list(far)] = True
    keep = far_mask[m.peer] & (m.src_buf == slices.IN) & (m.op != slices.STORE)
    peer, lo, hi = m.peer[keep], m.src[keep], m.src[keep] + m.nbytes[keep]
    if not peer.size:
        return {}
    # runs of one member never merge with another's: each member's offsets are shifted apart
    shift = peer * (int(max(hi.max(), 1)) + 1)
    order = np.lexsort((lo, peer))
    peer, lo, hi = peer[order], (lo + shift)[order], (hi + shift)[order]
    reach = np.maximum.accumulate(hi)
    start = np.ones(peer.size, bool)
    start[1:] = lo[1:] > reach[:-1]
    first = np.flatnonzero(start)
    ends = np.append(first[1:], peer.size) - 1
    runs_peer, runs_lo, runs_hi = peer[first], lo[first], reach[ends]
    base = shift[order][first]
    out = {}
    for p in np.unique(runs_peer):
        sel = runs_peer == p
        out[int(p)] = np.stack([runs_lo[sel] - base[sel], runs_hi[sel] - runs_lo[sel]], axis=1)
    return out


class FarReads:
    """The reads ``serve`` (runtime/hosts/_carrier.py) makes into this host's mirrors: for a
    barrier of a communicator spanning hosts (``barrier``) and for a far member's send
    (``runs``); and what its members here stored into far members' mirrors (``stores``).
    ``read(wants)`` reads (owner, HBM offset, bytes) triples; ``segment(r)``: rank r's
    segment here, or its mirror for a rank of another host; ``chunk``: the expandable allocator's chunk (0: segments are contiguous
    in HBM), its chunk table at ``table_offset`` of every segment; ``slice_start(r)``: where
    rank r's address slice begins."""

    def __init__(self, ctl, host: int, host_of: Sequence[int], read: Callable, segment: Callable, chunk: int,
                 table_offset: int, slice_start: Callable[[int], int]):
        self.w, self.lay = CarrierWords(ctl), ctl.layout
        self.host, self.host_of = host, host_of
        self._read, self._segment, self.chunk = read, segment, chunk
        self.table_offset, self.slice_start = table_offset, slice_start
        self.table_bytes = RegistrationUnit.table_bytes(slice_start(1) - slice_start(0), chunk) if chunk else 0
        self._calls: dict[tuple, tuple[int, int]] = {}     # communicator -> (its last call, barriers of it)
        self._plans: dict[tuple, dict] = {}                # a call shape's ``planned``
        self._entered: dict[tuple, tuple[int, int]] = {}   # communicator -> (its last call, barriers entered)

    def runs(self, r: int, ranges, va: int, size: int, off: int, read_table: bool = True) -> list:
        """The reads that bring the byte ranges [addr, addr + nbytes) of rank r's segment (at
        va, size bytes, at HBM offset off) into its mirror: one a range, or with the
        expandable allocator one per chunk a range touches, where r's chunk table says the
        chunk is (its entries for the segment's chunks read first: a rank here maps the whole
        segment, chunk by chunk, runtime/memory/_registration.py; ``read_table=False``: they are
        here already, as for a rank of this host)."""
        cut = [(max(a, va), min(a + b, va + size)) for a, b in ranges]
        cut = [(lo, hi) for lo, hi in cut if hi > lo]
        if not cut or not size:
            return []
        if not self.chunk:
            return [(r, off + lo - va, hi - lo) for lo, hi in cut]
        chunk, start = self.chunk, self.slice_start(r)
        table = self._segment(r)[self.table_offset:self.table_offset + self.table_bytes].view(np.int64)
        first, last = (va - start) // chunk, (va + size - 1 - start) // chunk
        if read_table:
            self._read([(r, self.table_offset + 8 * first, 8 * (last - first + 1))])
        return [(r, o, b) for lo, hi in cut for _, o, b in hbm_runs(lo, hi, va, size, off, chunk, table, start)]

    def barrier(self, members: list[int], slots: list[int]) -> list:
        """What to read for the barrier of the communicator of ``members`` (world ranks, in
        their control-segment ``slots``) that just completed everywhere, before its members
        here go on: the runs their slice maps pull from far members in the next phase."""
        n, w, lay = len(members), self.w, self.lay
        here = tuple(i for i, m in enumerate(members) if self.host_of[m] == self.host)
        far = tuple(i for i, m in enumerate(members) if self.host_of[m] != self.host)
        # the call is the one the members here are in (they wait at this barrier); a far
        # member's newest descriptor may already be of the next call, whose words came in
        # before this barrier was handled here (an eager call has no departure): each member's
        # descriptor of this call is the one of its parity (runtime/pipeline/_protocol.py)
        mine = lay.slot(members[here[0]], slots[here[0]])
        call = max(int(w.descriptor(mine + lay.slot_desc(p))[F_CALL]) for p in (0, 1))
        at = [lay.slot(m, sl) + lay.slot_desc(call & 1) for m, sl in zip(members, slots)]
        d = np.stack([w.descriptor(a) for a in at])
        key = (members[0], slots[0])
        last = self._calls.get(key)
        b = last[1] + 1 if last is not None and last[0] == call else 0
        self._calls[key] = (call, b)
        name = NAME.get(int(d[0, F_OP]))
        if name not in PLANNED:
            wants = self._whole(members, at, d)
            if b == 0 and int(d[0, F_OP]) in STORES and not d[:, F_FLAGS].any():
                # the chunk-table entries of far buffers stored into, which the ranks here map
                # the mirrors by; the stored bytes themselves are the ranks' to write
                for _, m, args in self._far_stores(members, at, d, None):
                    self.runs(m, *args)
            return wants
        if (d[:, F_OP:F_FLAGS + 1] != d[0, F_OP:F_FLAGS + 1]).any() or d[:, F_FLAGS].any():
            return []                # every member raises without pulling (runtime/pipeline/_protocol.py)
        dtype = DTYPE_BY_CODE.get(int(d[0, F_DTYPE]))
        if name in RING and int(d[0, F_AUX1]):
            step = ring_step_after(name, n, b)
            if step is None:
                return []
            wants = []
            for j in here:
                i = (j - 1) % n
                if i in far:
                    wants += self._ring_pull(members[i], at[i], d[i], i, ring_steps(
                        name, j, n, int(d[0, F_COUNT]), dtype.itemsize if dtype is not None else 1)[step])
            return wants
        counts = np.stack([w.extension(a, 2 * n) for a in at]) if name == "all_to_all_v" else None
        shape = (name, n, here, b, int(d[0, F_COUNT]), int(d[0, F_DTYPE]), int(d[0, F_ROOT]),
                 None if counts is None else counts.tobytes())
        plan = self._plans.get(shape)
        if plan is None:
            if len(self._plans) >= 256:      # a few shapes recur; do not grow without bound
                self._plans.clear()
            plan = self._plans[shape] = planned(name, n, here, far, b, int(d[0, F_COUNT]),
                                                dtype.itemsize if dtype is not None else 1, int(d[0, F_ROOT]), counts)
        wants = []
        for i, ranges in plan.items():
            di = d[i]
            wants += self.runs(members[i], [(int(di[F_ADDR]) + int(o), int(nb)) for o, nb in ranges],
                               int(di[F_SEG_VA]), int(di[F_SEG_SIZE]), int(di[F_SEG_OFF]))
        return wants

    def ring(self, members: list[int], slots: list[int], i: int, seen: int, now: int) -> list:
        """What member i+1 (here) of the communicator of ``members`` (in their ``slots``) pulls
        from member i (far) in the steps that member i's ring-step word moving from ``seen``
        to ``now`` (u32) lets it take: for each value between, the step it finished tells
        which call (the one of i's two descriptors here whose base the value passes) and which
        step of it (the value less the base); a step that does not wait on the word (the first
        of a chain, read at a barrier) or past the call's last is not read."""
        n, lay, w = len(members), self.lay, self.w
        j = (i + 1) % n
        wants = []
        for parity in (0, 1):
            at = lay.slot(members[i], slots[i]) + lay.slot_desc(parity)
            d = w.descriptor(at)
            name = NAME.get(int(d[F_OP]))
            if name not in RING or not int(d[F_AUX1]) or int(d[F_FLAGS]):
                continue
            base = int(w.extension(at, 5)[4])
            dtype = DTYPE_BY_CODE.get(int(d[F_DTYPE]))
            steps = None
            for k in range(1, ((now - seen) & U32) + 1):
                s = (seen + k - base) & U32
                if ring_step_waits(name, n, s):
                    if steps is None:
                        steps = ring_steps(name, j, n, int(d[F_COUNT]), dtype.itemsize if dtype is not None else 1)
                    wants += self._ring_pull(members[i], at, d, i, steps[s])
        return wants

    def _ring_pull(self, member: int, at: int, d: np.ndarray, i: int, step) -> list:
        """The reads that bring what ``step`` (a slice map) loads from member ``i`` (world rank
        ``member``, its descriptor ``d`` at ``at``) into its mirror: from its input, or from
        the extra buffer a ring call names (F_AUX1; its segment in the extension words)."""
        keep = (step.peer == i) & (step.op != slices.STORE)
        wants = []
        from_input = keep & (step.src_buf == slices.IN)
        if from_input.any():
            addr = int(d[F_ADDR])
            wants += self.runs(member, [(addr + int(o), int(b)) for o, b in zip(step.src[from_input],
                                                                               step.nbytes[from_input])],
                               int(d[F_SEG_VA]), int(d[F_SEG_SIZE]), int(d[F_SEG_OFF]))
        extra = keep & (step.src_buf != slices.IN)
        if extra.any():
            addr = int(d[F_AUX1])
            va, size, off = (int(v) for v in self.w.extension(at, 3))
            wants += self.runs(member, [(addr + int(o), int(b)) for o, b in zip(step.src[extra], step.nbytes[extra])],
                               va, size, off)
        return wants

    def forget(self, members: list[int], slots: list[int]) -> None:
        """A communicator is made in these slots: its calls are numbered from the start (a
        failed split gives its slot back to the next one)."""
        self._calls.pop((members[0], slots[0]), None)
        self._entered.pop((members[0], slots[0]), None)

    def stores(self, members: list[int], slots: list[int]) -> list:
        """What to put for the barrier of the communicator of ``members`` (in their ``slots``)
        whose members here all arrived, before their words leave the host: the runs of far
        members' buffers the members here stored into (this host's mirrors of them) in the
        phase this barrier ends, as (owner, HBM offset, bytes). Counts the call's barriers as
        they are entered (0: the entry, which ends no phase; a departure ends the last)."""
        lay, w = self.lay, self.w
        here = [i for i, m in enumerate(members) if self.host_of[m] == self.host]
        mine = lay.slot(members[here[0]], slots[here[0]])
        descs = [w.descriptor(mine + lay.slot_desc(p)) for p in (0, 1)]
        call = max(int(dp[F_CALL]) for dp in descs)
        key = (members[0], slots[0])
        last = self._entered.get(key)
        j = last[1] + 1 if last is not None and last[0] == call else 0
        self._entered[key] = (call, j)
        if j == 0 or int(descs[call & 1][F_OP]) not in STORES:
            return []
        at = [lay.slot(m, sl) + lay.slot_desc(call & 1) for m, sl in zip(members, slots)]
        d = np.stack([w.descriptor(a) for a in at])
        if d[:, F_FLAGS].any() or (d[:, F_OP] != d[0, F_OP]).any():
            return []                # every member raised without storing
        wants = []
        for _, m, args in self._far_stores(members, at, d, j - 1):
            wants += self.runs(m, *args, read_table=False)      # read at the entry (``barrier``)
        return wants

    def _far_stores(self, members: list[int], at: list[int], d: np.ndarray, phase: int | None):
        """For each far member the members here store into (in ``phase``, or in any), its index,
        world rank and the arguments of ``runs`` for those stores: the ranges at its buffer's
        address (its block in its extension words, WRITE_BLOCK) and the buffer's segment."""
        n, w = len(members), self.w
        write, tail = STORES[int(d[0, F_OP])]
        rows = []
        for i, m in enumerate(members):
            if self.host_of[m] != self.host:
                continue
            block = tail[0] * n + tail[1]
            e = w.extension(at[i], block + 4)[block:]            # address, segment va, size, offset
            if not int(e[0]):
                continue                                      # no traffic block: no far stores
            words = int(d[i, F_COUNT]) * (n + 1)              # the traffic block: [phases, N + 1]
            seg = tuple(int(v) for v in e[1:4])
            count = int(self._local(m, int(e[0]) + 8 * words, 8, *seg).view(np.int64)[0])
            if count:
                rows.append(self._local(m, int(e[0]) + 8 * (words + 1), 8 * STORE_ROW * count, *seg)
                            .view(np.int64).reshape(count, STORE_ROW))
        if not rows:
            return []
        r = np.concatenate(rows)
        if phase is not None:
            r = r[r[:, 0] == phase]
        out = []
        block = write[0] * n + write[1]
        for i in np.unique(r[:, 1]).tolist():
            e = w.extension(at[i], block + 4)[block:]
            sel = r[:, 1] == i
            out.append((i, members[i], ([(int(e[0]) + int(o), int(b)) for o, b in zip(r[sel, 2], r[sel, 3])],
                                        int(e[1]), int(e[2]), int(e[3]))))
        return out

    def _local(self, r: int, addr: int, nbytes: int, va: int, size: int, off: int) -> np.ndarray:
        """The bytes [addr, addr + nbytes) of rank r's segment here (at va, size bytes, at HBM
        offset off), a copy."""
        seg = self._segment(r)
        return np.concatenate([seg[o:o + b] for _, o, b in self.runs(r, [(addr, nbytes)], va, size, off,
                                                                     read_table=False)] or [np.zeros(0, np.uint8)])

    def _whole(self, members: list[int], at: list[int], d: np.ndarray) -> list:
        """An operator read as a whole: each far member's input (an eager slot, twice its
        size: an eager all_reduce by chunks leaves its reduced chunk after the copy) and the
        second buffer its descriptor names in its extension words (READ_BLOCK)."""
        wants, n = [], len(members)
        for i, m in enumerate(members):
            if self.host_of[m] == self.host:
                continue
            di = d[i]
            nbytes = int(di[F_NBYTES])
            extent = 2 * nbytes if nbytes <= EAGER_BYTES else nbytes
            wants += self.runs(m, [(int(di[F_ADDR]), extent)], int(di[F_SEG_VA]), int(di[F_SEG_SIZE]),
                               int(di[F_SEG_OFF]))
            where = READ_BLOCK.get(int(di[F_OP]))
            if where is not None:
                block = where[0] * n + where[1]
                e = self.w.extension(at[i], block + 4)[block:]   # the block's address, its segment's va, size, offset
                if int(e[0]):
                    wants += self.runs(m, [(int(e[0]), int(e[1]) + int(e[2]) - int(e[0]))], int(e[1]), int(e[2]),
                                       int(e[3]))
        return wants
