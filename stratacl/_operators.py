"""Every operator the library runs, declared once.

Each row says what the rest of the library needs to know about an operator; the lists that
used to be kept by hand are read off this table:

    runtime/pipeline/_protocol.py   OPS: the descriptor's operation code (F_OP), compared on entry
    runtime/communicator/_p2p.py        the point-to-point codes, owned by the native layer (_native.h
                           OP_SEND...); tests/test_constants.py checks the rows against it
    runtime/_world.py      NATIVE_CALLS: the calls the native methods count
    collectives/_schedule  OPS, RING_OPS: the operators the fabric model times from a schedule
    _sizes.py              OPS: their nccl-tests size conventions and bus bandwidth factor

An operator without a schedule (``all_to_all_v``, ``gather``, ``scatter``, the MoE calls) is
timed from the traffic matrices of its slice map (runtime/pipeline/_call.py, ``Pipeline.tick``).
Adding an operator: a row here, its slice map (collectives/_slices.py), and its front end
written on the call pipeline (runtime/communicator/_comm.py); docs/architecture.md walks through one.

``sizes`` gives a scheduled operator's buffers at an nccl-tests size S on N ranks: ``per``
elements are S / N (whole chunks), ``total`` N x per, ``count`` S, ``-`` none (in place).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Operator:
    name: str
    code: int                         # F_OP of its descriptors
    family: str                       # collective, p2p, ep (stratacl.ep), group (communicator making)
    sizes: tuple[str, str] | None = None   # (input, output) element counts, see the module docstring
    bus: str | None = None            # bus bandwidth factor: "2(N-1)/N", "(N-1)/N" or "1"
    schedule: bool = False            # collectives/_schedule.py has its schedule
    ring: bool = False                # it also runs as a ring (algo="ring")
    native: bool = False              # its common case is a native method, which counts its calls
    # a second buffer peers read, named in the descriptor's extension words by its block
    # (address, segment address, size, offset, epoch) at word a * N + b (N: the members), or
    # None: across hosts the carriers read it with the input (runtime/hosts/_reads.py)
    read_block: tuple[int, int] | None = None
    # a buffer peers store into, named in the extension words as read_block names its own, or
    # None: across hosts a store lands in this host's mirror of the peer, and the storing host's
    # carrier puts the stored ranges back into the peer's segment (runtime/hosts/_reads.py)
    write_block: tuple[int, int] | None = None


OPERATORS: tuple[Operator, ...] = (
    Operator("barrier", 1, "collective", ("-", "-"), None, schedule=True, native=True),
    Operator("all_gather", 2, "collective", ("per", "total"), "(N-1)/N", schedule=True, ring=True, native=True),
    Operator("all_reduce", 3, "collective", ("count", "-"), "2(N-1)/N", schedule=True, ring=True, native=True),
    Operator("reduce_scatter", 4, "collective", ("total", "per"), "(N-1)/N", schedule=True, ring=True,
             native=True),
    Operator("all_to_all", 5, "collective", ("total", "total"), "(N-1)/N", schedule=True, native=True),
    Operator("all_to_all_v", 6, "collective"),
    Operator("broadcast", 7, "collective", ("count", "-"), "1", schedule=True, native=True),
    Operator("split", 8, "group"),
    Operator("dispatch", 9, "ep", read_block=(0, 0)),            # the routing block (ep/_buffer.py, E_ADDR)
    Operator("combine", 10, "ep", read_block=(0, 0)),
    Operator("low_latency_dispatch", 11, "ep", read_block=(0, 0)),
    Operator("low_latency_combine", 12, "ep", read_block=(0, 0)),
    Operator("gather", 13, "collective"),
    Operator("scatter", 14, "collective"),
    # a user's slice map run as an operator (stratacl.fabric), whatever its name
    # the traffic block, and its dst (fabric/_usermap.py)
    Operator("slice_map", 15, "fabric", read_block=(2, 7), write_block=(2, 0)),
    Operator("reduce", 16, "collective", native=True),
    # point to point: codes owned by the native layer (_native.h, OP_SEND = 100, ...)
    Operator("send", 100, "p2p", native=True),
    Operator("recv", 101, "p2p", native=True),
    Operator("sendrecv", 102, "p2p", ("count", "count"), "1", schedule=True),
)

BY_NAME: dict[str, Operator] = {op.name: op for op in OPERATORS}
assert len(BY_NAME) == len(OPERATORS) and len({op.code for op in OPERATORS}) == len(OPERATORS)


def names(**want) -> tuple[str, ...]:
    """The operators whose fields equal ``want`` (e.g. ``schedule=True``), in table order."""
    return tuple(op.name for op in OPERATORS if all(getattr(op, k) == v for k, v in want.items()))
