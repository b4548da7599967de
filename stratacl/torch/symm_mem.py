"""``stratacl.torch.symm_mem``: torch.distributed._symmetric_memory's names over StrataCL's HBM.

    import stratacl.torch
    import stratacl.torch.symm_mem as symm_mem          # or: from stratacl.torch import symm_mem
    t = symm_mem.empty(4096, dtype=torch.float32)       # storage in this rank's HBM
    hdl = symm_mem.rendezvous(t, dist.group.WORLD)      # collective: every rank's buffer and signal pad
    peer = hdl.get_buffer(r, (4096,), torch.float32)    # a tensor over rank r's HBM (loads/stores go there)
    hdl.barrier(); hdl.put_signal(r); hdl.wait_signal(r)

Built on ``stratacl.shmem`` (public names only): the handle's signal pad is a shmem signal pad
of ``CHANNELS`` x world_size u64 words, slot ``channel * world_size + src`` of rank dst
counting src's signals to dst on that channel. Differences from torch (docs/one-sided.md):

- a signal pad word is 64 bits (NVSHMEM's signal type), not 32; ``get_signal_pad``'s default
  dtype is ``torch.uint64``;
- ``put_signal`` adds 1 to the peer's slot (signals are counted: it never waits for the peer to
  have consumed the previous one), ``wait_signal`` waits for the slot to be at least 1 and
  takes 1 off; so a slot reads 0 when every signal has been consumed, as in torch;
- ``timeout_ms=0`` means the communication timeout (STRATACL_TIMEOUT), not "forever";
- buffers are exchanged at ``rendezvous`` (their addresses need not be symmetric); CPU only,
  no multicast, no ``buffer_ptrs_dev``;
- a peer on another host (a job over hosts) is reached by ``put``, ``get``, ``put_signal``,
  ``wait_signal`` and ``barrier``; its ``signal_pad_ptrs`` entry is 0 (no load or store
  reaches it) and ``get_buffer``/``get_signal_pad`` refuse it with OneSidedError;
- ``get`` and ``put`` (StrataCL additions) copy to and from a peer's buffer as timed one-sided
  transfers; loads and stores through ``get_buffer`` views are plain memory accesses the
  modeled clock does not see.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist

import stratacl

from . import _tensors

CHANNELS = 32      # torch's symm_max_nblocks: the channels a signal pad holds per peer

_HANDLES: dict[tuple[int, int], "SymmetricMemory"] = {}


def empty(*size, dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
    """As ``torch.distributed._symmetric_memory.empty``: an uninitialised tensor for
    ``rendezvous``, its storage in this rank's HBM (``stratacl.torch.empty``). CPU only. Local."""
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(f"symm_mem.empty: StrataCL's HBM is CPU memory; device {device} is not supported")
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    return _tensors.empty(*size, dtype=dtype)


def is_symm_mem_tensor(tensor: torch.Tensor) -> bool:
    """True if ``tensor``'s storage is in this rank's HBM (it can be rendezvoused)."""
    return _tensors._HBM.get(tensor.untyped_storage().data_ptr()) is not None


def _comm_of(group):
    """The StrataCL communicator behind a process group (or its name)."""
    if group is None:
        group = dist.group.WORLD
    if isinstance(group, str):
        group = dist.distributed_c10d._resolve_process_group(group)
    # a group of backend "stratacl" is the process group itself (_groups.py), which holds it
    comm = getattr(group, "comm", None)
    if comm is None:
        raise ValueError(f"symm_mem.rendezvous: group {group} is not a 'stratacl' process group")
    return comm


def rendezvous(tensor: torch.Tensor, group=None) -> "SymmetricMemory":
    """As torch's: establish ``tensor``'s storage (from ``empty``) as symmetric memory of
    ``group`` (a process group of backend "stratacl", or its name; default: the world).
    Collective over the group: exchanges every member's buffer address and size and makes
    the handle's signal pad. Returns the same handle for the same storage and group."""
    comm = _comm_of(group)
    storage = tensor.untyped_storage()
    hbm = _tensors._HBM.get(storage.data_ptr())
    if hbm is None:
        raise ValueError("symm_mem.rendezvous: the tensor's storage is not in HBM; allocate it with "
                         "stratacl.torch.symm_mem.empty (or stratacl.torch.empty)")
    key = (storage.data_ptr(), id(comm))
    got = _HANDLES.get(key)
    if got is not None and got._storage_ref is hbm:
        return got
    hdl = SymmetricMemory(comm, hbm, storage.nbytes())
    _HANDLES[key] = hdl
    return hdl


class SymmetricMemory:
    """The handle ``rendezvous`` returns (torch's ``_SymmetricMemory``): ``rank``,
    ``world_size``, ``buffer_ptrs``, ``buffer_size``, ``signal_pad_ptrs``, ``signal_pad_size``,
    ``get_buffer``, ``get_signal_pad``, ``barrier``, ``put_signal``, ``wait_signal``; and
    ``get``/``put``, timed copies (StrataCL's)."""

    def __init__(self, comm, hbm: np.ndarray, nbytes: int):
        self.comm = comm
        self._storage_ref = hbm
        self.rank, self.world_size = comm.rank, comm.size
        n = comm.size
        mine = np.array([hbm.__array_interface__["data"][0], nbytes], dtype=np.int64)
        every = np.zeros(2 * n, dtype=np.int64)
        comm.all_gather(every, mine)
        sizes = every[1::2].tolist()
        if len(set(sizes)) > 1:
            raise stratacl.OneSidedError(f"symm_mem.rendezvous: the members' buffers differ in size: {sizes} bytes "
                                         f"(by rank); torch requires the same shape and dtype everywhere",
                                         "symm_mem.rendezvous")
        self.buffer_ptrs = every[0::2].tolist()
        self.buffer_size = int(nbytes)
        # members on other hosts learn where it is in this rank's HBM (nothing on one host)
        stratacl.shmem.buffer_register(hbm, comm=comm)
        # torch does not require the members' allocations to be alike: the pad's addresses are exchanged
        self._pad = stratacl.shmem.signal_pad(CHANNELS * n, comm=comm, symmetric=False)
        self.signal_pad_ptrs = [stratacl.shmem.ptr(self._pad, r, comm=comm) for r in range(n)]
        self.signal_pad_size = int(self._pad.nbytes)
        self.device = torch.device("cpu")

    def __repr__(self) -> str:
        return f"SymmetricMemory(rank={self.rank}, world_size={self.world_size}, buffer_size={self.buffer_size})"

    def _peer(self, rank: int, op: str) -> int:
        if not 0 <= int(rank) < self.world_size:
            raise stratacl.OneSidedError(f"{op}: rank {self.rank}: peer {rank} is out of range: the group has ranks "
                                         f"0..{self.world_size - 1}", op, int(rank))
        return int(rank)

    def _near(self, r: int, op: str) -> int:
        """``r``, if loads and stores reach it (on this rank's host); OneSidedError otherwise."""
        if not self.signal_pad_ptrs[r]:
            raise stratacl.OneSidedError(f"{op}: rank {self.rank}: peer {r} is on another host, and loads and stores "
                                         f"do not cross hosts; use put/get", op, r)
        return r

    def _view(self, base: int, limit: int, sizes, dtype: torch.dtype, storage_offset: int, op: str) -> torch.Tensor:
        sizes = tuple(int(s) for s in sizes)
        itemsize = torch.empty((), dtype=dtype).element_size()
        start, nbytes = int(storage_offset) * itemsize, math.prod(sizes) * itemsize
        if start < 0 or start + nbytes > limit:
            raise ValueError(f"{op}: {sizes} of {dtype} at element {storage_offset} need bytes "
                             f"[{start}, {start + nbytes}) but the buffer has {limit}")
        moved = _tensors._MOVED.get(dtype)
        if moved is None or dtype.is_complex:
            raise TypeError(f"{op}: dtype {dtype} is not supported")
        a = stratacl.ub.view(base + start, (nbytes // np.dtype(moved).itemsize,), moved)
        t = torch.from_numpy(a)
        return (t.view(torch.bfloat16) if dtype is torch.bfloat16 else t).view(sizes)

    def get_buffer(self, rank: int, sizes, dtype: torch.dtype, storage_offset: int = 0) -> torch.Tensor:
        """A tensor over ``rank``'s buffer (zero copy: loads and stores reach its HBM). Local."""
        op = "symm_mem.get_buffer"
        r = self._near(self._peer(rank, op), op)
        return self._view(self.buffer_ptrs[r], self.buffer_size, sizes, dtype, storage_offset, op)

    def get_signal_pad(self, rank: int, sizes=None, dtype: torch.dtype | None = None,
                       storage_offset: int = 0) -> torch.Tensor:
        """A tensor over ``rank``'s signal pad words (default: all of them, as ``torch.uint64``). Local."""
        op = "symm_mem.get_signal_pad"
        r = self._near(self._peer(rank, op), op)
        dtype = torch.uint64 if dtype is None else dtype
        itemsize = torch.empty((), dtype=dtype).element_size()
        sizes = (self.signal_pad_size // itemsize,) if sizes is None or len(sizes) == 0 else sizes
        return self._view(self.signal_pad_ptrs[r], self.signal_pad_size, sizes, dtype, storage_offset, op)

    def _slot(self, dst: int, src: int, channel: int, op: str) -> np.ndarray:
        if not 0 <= int(channel) < CHANNELS:
            raise ValueError(f"{op}: channel must be in 0..{CHANNELS - 1}, got {channel}")
        i = int(channel) * self.world_size + src
        return self._pad[i:i + 1]

    @staticmethod
    def _timeout(timeout_ms: int) -> float | None:
        return None if not timeout_ms else timeout_ms / 1000.0

    def put_signal(self, dst_rank: int, channel: int = 0, timeout_ms: int = 0) -> None:
        """Signal ``dst_rank`` on ``channel``, after every store this rank made (release). Local."""
        op = "symm_mem.put_signal"
        dst = self._peer(dst_rank, op)
        stratacl.shmem.put_signal(self._pad[:0], self._pad[:0], self._slot(dst, self.rank, channel, op), 1,
                                  stratacl.shmem.SIGNAL_ADD, dst, comm=self.comm)

    def wait_signal(self, src_rank: int, channel: int = 0, timeout_ms: int = 0) -> None:
        """Wait for a signal from ``src_rank`` on ``channel`` and consume it (acquire); sleeps in
        the kernel; SignalTimeout after ``timeout_ms`` (0: the communication timeout). Local."""
        op = "symm_mem.wait_signal"
        src = self._peer(src_rank, op)
        slot = self._slot(self.rank, src, channel, op)
        stratacl.shmem.wait_until(slot, stratacl.shmem.CMP_GE, 1, timeout=self._timeout(timeout_ms), comm=self.comm)
        stratacl.shmem.atomic_fetch_add(slot, (1 << 64) - 1, self.rank, comm=self.comm)

    def barrier(self, channel: int = 0, timeout_ms: int = 0) -> None:
        """Signal every peer on ``channel``, then wait for every peer's signal. Collective over the group."""
        for r in range(self.world_size):
            if r != self.rank:
                self.put_signal(r, channel, timeout_ms)
        for r in range(self.world_size):
            if r != self.rank:
                self.wait_signal(r, channel, timeout_ms)

    def get(self, rank: int, out: torch.Tensor, storage_offset: int = 0) -> None:
        """Copy ``out.numel()`` elements of ``rank``'s buffer (from element ``storage_offset``
        in ``out``'s dtype) into ``out``: a one-sided get, timed by the modeled clock. Local."""
        r, addr = self._span("symm_mem.get", rank, out, storage_offset, "output")
        stratacl.shmem.get(_tensors.array(out), addr, r, comm=self.comm)

    def put(self, rank: int, src: torch.Tensor, storage_offset: int = 0) -> None:
        """Copy ``src`` into ``rank``'s buffer from element ``storage_offset`` (in ``src``'s
        dtype): a one-sided put, timed by the modeled clock (``stratacl.shmem.quiet`` to wait
        for its landing). Local."""
        r, addr = self._span("symm_mem.put", rank, src, storage_offset, "source")
        stratacl.shmem.put(addr, _tensors.array(src), r, comm=self.comm)

    def _span(self, op: str, rank: int, t: torch.Tensor, storage_offset: int, what: str) -> tuple[int, int]:
        """``rank`` checked, and the address in its buffer of ``t``'s elements from element
        ``storage_offset`` (in ``t``'s dtype), after the check that they fit in the buffer."""
        r = self._peer(rank, op)
        _tensors.check(t, op, what)
        start = int(storage_offset) * t.element_size()
        if start < 0 or start + t.numel() * t.element_size() > self.buffer_size:
            raise ValueError(f"{op}: {t.numel()} elements at element {storage_offset} overrun the buffer "
                             f"({self.buffer_size} bytes)")
        return r, self.buffer_ptrs[r] + start
