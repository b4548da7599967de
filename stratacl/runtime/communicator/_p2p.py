"""Point-to-point transfers: pull-mode send/recv between two ranks of a communicator.

    sender                                         receiver
    publish descriptor {dtype, count, address, segment} in its slot for the receiver
    bump send_seq[receiver] (futex word) -------> wait for send_seq >= expected
                                                   check dtype/count, readiness, pull the bytes
    wait for recv_done[sender] <------------------ write status, bump recv_done[sender]
    (a mismatch is reported to both sides through the status word; a side that rejects its
    own arguments flags it and writes why in its slot, Layout.slot_reason, which the other
    side quotes in its CollectiveMismatch)

``sendrecv`` posts the send before pulling the receive, so a ring of them cannot deadlock.
The common case of a call runs in one native call (``_native.p2p``), which hands the rest back
to this module wherever a wait needs health checks or a descriptor needs checking; the receive's
copy is its compiled plan (collectives/_backend.py), run by the same executor as every
operator's phases.
"""
from __future__ import annotations

import numpy as np

from ..._errors import CollectiveMismatch
from ...collectives import BUFFERS, DTYPE_BY_CODE, IN, OUT, dtype_code, slices
from ...ub import to_bits, us_from_bits
from .. import _native
from .._native import P2P_DONE, P2P_RECV_CHECK, P2P_RECV_WAIT, P2P_SEND_WAIT  # _native.p2p's stages
from ..pipeline import RankServices, agreed, aliased, as_flat, dtype_of, fixed_address, fixed_table
from ..services import (
    DESC_FIXED, F_ADDR, F_AUX0, F_AUX1, F_COUNT, F_DTYPE, F_EPOCH, F_FLAGS, F_SEG_OFF, F_SEG_SIZE, F_SEG_VA,
    FLAG_REJECTED, P2P_DESC, SLICE, SPIN_POLLS, Layout, wait_until,
)

_NO_RECV = (0, 0, 0, 0, None)
# a send descriptor's F_OP, and the flight recorder's codes of the three calls (_native.h, OP_*)
OP_SEND = _native.OP_SEND
_FLIGHT_OPS = {"send": _native.OP_SEND, "recv": _native.OP_RECV, "sendrecv": _native.OP_SENDRECV}
# a receive's status word, read by its sender (native code only tests for 0)
RECV_OK, RECV_MISMATCH, RECV_REJECTED, RECV_FAILED = 0, 1, 2, 3


def _send_descriptor(code: int, count: int, inp, rejected: bool, aux0: int, seq: int) -> tuple:
    """A send's descriptor in F_* order (runtime/services/_control.py): op, dtype, count, root, redop,
    flags, addr, nbytes, seg va, seg size, seg offset, epoch, aux0, aux1, aux2, call (here
    the send's sequence number). ``inp`` None: nothing is sent (a rejected send)."""
    seg = inp.seg if inp is not None else None
    if seg is not None:
        return (OP_SEND, code, count, 0, 0, 0, inp.addr, inp.nbytes, seg.va, seg.size, seg.hbm_offset, seg.epoch,
                aux0, 0, 0, seq)
    addr, nbytes = (inp.addr, inp.nbytes) if inp is not None else (0, 0)
    return (OP_SEND, code, count if inp is not None else 0, 0, 0, FLAG_REJECTED if rejected else 0, addr, nbytes,
            0, 0, 0, 0, aux0, 0, 0, seq)


class PointToPoint:
    """A communicator's point-to-point half: every peer's send and receive words in the
    members' slots, the descriptor being sent, and the calls. Given the runtime, the
    members, the slot protocol (slot offsets, sequence numbers in ``cx``, reasons), the
    executor (buffer table, readiness, the receive's plan), the communication buffers, the
    modeled clock and the communicator's prepared calls (runtime/communicator/_prepared.py)."""

    def __init__(self, rt: RankServices, members: list[int], rank: int, protocol, executor, buffers, modeling, prepared):
        self._rt, self._protocol, self._executor, self._buffers = rt, protocol, executor, buffers
        self._modeling, self._prepared = modeling, prepared
        self._members, self._rank, self._size = members, rank, len(members)
        self._cx, self._bases, self._ready = protocol.cx, executor.bases, executor.ready
        self._default_path = executor.default_path
        me, peers = rank, range(self._size)
        self._send_flag = [self._p2p_addr(me, 0, p) for p in peers]      # my send_seq for p
        self._recv_flag = [self._p2p_addr(p, 0, me) for p in peers]      # p's send_seq for me
        self._sent_done = [self._p2p_addr(p, 1, me) for p in peers]      # p's recv_done for me
        self._recv_done = [self._p2p_addr(me, 1, p) for p in peers]      # my recv_done for p
        self._sent_status = [self._p2p_addr(p, 2, me) for p in peers]
        self._recv_status = [self._p2p_addr(me, 2, p) for p in peers]
        self._send_desc = [self._p2p_desc_off(me, p) for p in peers]     # int64 index of my descriptor for p
        self._recv_desc = [self._p2p_desc_off(p, me) for p in peers]
        # what _native.p2p reads, per peer: the addresses of its words, named by _native.h's PX_*
        base = rt.ctl.base
        px = self._px = np.zeros((self._size, _native.PX_WORDS), dtype=np.int64)
        px[:, _native.PX_SEND_DESC] = [base + 8 * self._send_desc[p] for p in peers]
        px[:, _native.PX_SEND_FLAG] = self._send_flag
        px[:, _native.PX_RECV_FLAG] = self._recv_flag
        px[:, _native.PX_RECV_DESC] = [base + 8 * self._recv_desc[p] for p in peers]
        px[:, _native.PX_RECV_STATUS] = self._recv_status
        px[:, _native.PX_RECV_DONE] = self._recv_done
        px[:, _native.PX_SENT_DONE] = self._sent_done
        px[:, _native.PX_SENT_STATUS] = self._sent_status
        self._send_fields = (0,) * P2P_DESC     # the descriptor being sent (a tuple: _native.read_fields)

    def _p2p_addr(self, owner_idx: int, which: int, peer_idx: int) -> int:
        """which: 0 send_seq, 1 recv_done, 2 recv_status (u32 words)."""
        lay = self._protocol.lay
        off = (Layout.SLOT_SEND_SEQ, lay.slot_recv_done(), lay.slot_recv_status())[which]
        return self._rt.ctl.base + self._protocol.slot_offs[owner_idx] + off + 4 * peer_idx

    def _p2p_desc_off(self, owner_idx: int, peer_idx: int) -> int:
        return (self._protocol.slot_offs[owner_idx] + self._protocol.lay.slot_p2p_desc()) // 8 + peer_idx * P2P_DESC

    def replayed(self, call: tuple, r: tuple, x: np.ndarray, dst: int, out: np.ndarray, src: int) -> None:
        """A prepared sendrecv on from where _native.p2p_replay stopped (``r``), as ``call``
        would (``Communicator._p2p_replayed``; on the default path, where prepared calls run)."""
        stage, send_seq, recv_seq, entry = r
        self._send_fields = (*call[0][:P2P_DESC - 1].tolist(), send_seq)
        send = (dst, send_seq, None, x, None)
        if stage == P2P_RECV_WAIT or stage == P2P_RECV_CHECK:
            try:
                self._recv(out, src, recv_seq, stage == P2P_RECV_CHECK, None, self._default_path)
            except BaseException:
                self._abandon(send)
                raise
        self._complete_send(send)
        _native.flight_close(self._cx, entry)

    def check_sendrecv(self, x: np.ndarray, dst: int, out: np.ndarray, src: int,
                       path: str) -> tuple[tuple | None, bool]:
        """A sendrecv's checks, for _native.p2p_replay (runtime/communicator/_prepared.py): its arguments
        as one tuple, or None where the common case does not apply (no modeled clock, the
        cores' path, both halves' checks passed, zero copy from HBM, the output written in
        place), which leaves the call to ``call`` and its checks."""
        peers = range(self._size)
        if (self._rt.clock is not None or path != "mte" or dst not in peers or src not in peers
                or dst == self._rank or src == self._rank
                or not isinstance(x, np.ndarray) or not isinstance(out, np.ndarray)):
            return None, False
        if aliased(out, x):
            return None, False              # the send is staged per call (``call``)
        (code, inp, error), held = self._check_send(x)
        (native, plan), in_place = self._check_recv(out, src)
        if not (held and in_place) or error is not None:
            return None, False
        fields = _send_descriptor(code, x.size, inp, False, 0, 0)
        dtype, count, itemsize, out_addr, table = native
        moved = (plan.local, plan.remote, plan.written) if plan is not None else (0, 0, 0)
        n = self._size
        arrays = [fixed_address(self._cx, (None,)), fixed_address(self._px, (n, None)),
                  fixed_address(self._bases, (BUFFERS, n)), fixed_address(self._ready, (n, 2)), *fixed_table(table)]
        params = np.zeros(_native.PP_LEN, dtype=np.int64)       # named by _native.h's PP_*
        params[:DESC_FIXED] = fields
        params[_native.PP_ME:_native.PP_CX] = (self._rank, dst, src, dtype, count, itemsize, out_addr, self._size,
                                                self._rt.native_call_word("send"), self._rt.native_call_word("recv"))
        params[_native.PP_CX:_native.PP_BYTES] = arrays
        params[_native.PP_BYTES:_native.PP_LEN] = moved
        call = [None] * _native.Q_LEN
        call[_native.Q_PARAMS], call[_native.Q_CX], call[_native.Q_PX] = params, self._cx, self._px
        call[_native.Q_BASES], call[_native.Q_READY], call[_native.Q_PLAN] = self._bases, self._ready, table
        call[_native.Q_PARAMS_ADDR] = _native.data_address(params)
        return tuple(call), True

    def call(self, op: str, x: np.ndarray | None, dst: int, out: np.ndarray | None, src: int, path: str) -> None:
        """One call: post the send, pull the receive, wait for the send's receiver.

        The common case (no modeled clock, the cores' path, valid arguments, a receive buffer
        the rank writes directly, a sender's buffer already checked) is one native call,
        ``_native.p2p``; it returns the stage at which the rest continues here: a wait that
        needs health checks, or a descriptor to check (mismatch, new buffer)."""
        t0 = self._modeling.entering_us() if self._rt.clock is not None else None
        # the halves by operation, not by argument: a None buffer is a bad argument, rejected
        # by its checks and reported to the peer, not a half left out
        stage = op == "sendrecv" and isinstance(x, np.ndarray) and isinstance(out, np.ndarray) and aliased(out, x)
        send = self._prepare_send(x, dst, t0, path, stage) if op != "recv" else None
        stage, recv = P2P_SEND_WAIT, None
        if op != "send":
            try:
                recv = self._prepare_recv(out, src, path)
            except BaseException:
                if send is not None:
                    self._abandon(send)
                raise
            stage = P2P_RECV_WAIT
        shown = x if send is not None else out
        size, nbytes = (shown.size, shown.nbytes) if isinstance(shown, np.ndarray) else (0, 0)
        entry = _native.flight_p2p(self._cx, _FLIGHT_OPS[op], dst if send is not None else -1, send[1] if send else 0,
                                   src if recv is not None else -1, recv[1] if recv else 0, size, nbytes)
        fast = (self._rt.clock is None and path == "mte" and (send is None or send[2] is None)
                and (recv is None or recv[2] is not None))
        if fast:
            r = recv[2] if recv is not None else _NO_RECV
            stage = _native.p2p(self._px, self._rank, dst if send is not None else -1, send[1] if send else 0,
                                self._send_fields, src if recv is not None else -1, recv[1] if recv else 0,
                                *r, self._bases, self._ready, SPIN_POLLS, SLICE)
        elif send is not None:
            _native.post(self._rt.ctl.base + 8 * self._send_desc[dst], self._send_fields, self._send_flag[dst],
                         send[1])
        received = None
        if recv is not None:
            if stage == P2P_SEND_WAIT or stage == P2P_DONE:      # received in the native call
                self._received_stats(recv[3])
            else:
                try:
                    received = self._recv(out, src, recv[1], stage == P2P_RECV_CHECK, t0, path)
                except BaseException:
                    if send is not None:
                        self._abandon(send)
                    raise
        sent = None
        if send is not None:
            if stage == P2P_DONE:
                s = self._rt.stats
                s["calls"]["send"] = s["calls"].get("send", 0) + 1
            else:
                sent = self._complete_send(send)
        if t0 is not None:
            self._modeling.ended(op, t0, max(t for t in (sent, received) if t is not None))
        _native.flight_close(self._cx, entry)

    def _prepare_send(self, x: np.ndarray, dst: int, t_send: float | None, path: str, stage: bool = False) -> tuple:
        """Check a send's arguments and fill ``self._send_fields`` with its descriptor (an
        argument the rank rejects is flagged in it, so the receiver raises too); returns what
        ``_complete_send`` waits on. ``stage``: copy ``x`` first (the call's receive writes
        over it)."""
        if not (isinstance(dst, (int, np.integer)) and 0 <= dst < self._size and dst != self._rank):
            raise ValueError(f"send: destination {dst!r} is not another rank of this communicator (size {self._size})")
        if stage:
            code, inp, error = self._check_send(x, True)[0]
        else:
            key = ("send", id(x)) if path is self._default_path else None
            code, inp, error = self._prepared.get(key, (x,), self._check_send, x)
        seq = _native.next_seq(self._cx, _native.CX_SENT, dst)
        if error is not None:        # the receiver quotes it (posted below, with the flag)
            self._protocol.put_reason(2 + dst, error)
        aux0 = to_bits(t_send) if t_send is not None else 0
        self._send_fields = _send_descriptor(code, x.size if error is None else 0, inp, error is not None, aux0, seq)
        return dst, seq, error, x, t_send

    def _check_send(self, x: np.ndarray, stage: bool = False) -> tuple[tuple, bool]:
        """A send's checks and what they decided (runtime/communicator/_prepared.py): dtype code, the input,
        the error that rejects the send (reported to both sides after the handshake)."""
        try:
            code = dtype_code(dtype_of(x, "send", "input"), "send")
            inp = self._buffers.as_input(x, "send", stage)
        except Exception as e:
            return (0, None, e), False
        held = None if stage else inp.in_place_of(x)
        return (code, inp if held is None else held, None), held is not None

    def _abandon(self, send: tuple) -> None:
        """The receive half failed: still post the send (if not yet) and see it through, so the
        peer is not left waiting; the receive's error is the one to report."""
        dst, seq = send[0], send[1]
        if not _native.seq_reached(_native.load_u32(self._send_flag[dst]), seq):
            _native.post(self._rt.ctl.base + 8 * self._send_desc[dst], self._send_fields, self._send_flag[dst], seq)
        try:
            self._complete_send(send)
        except Exception:
            pass

    def _complete_send(self, posted: tuple) -> float | None:
        """Wait for the receiver; under a modeled clock, return the sender's modeled exit time."""
        dst, seq, error, x, t_send = posted
        done = self._sent_done[dst]
        if not _native.wait_seq_u32(done, seq, SPIN_POLLS, SLICE):
            wait_until(lambda: _native.seq_reached(_native.load_u32(done), seq), done, self._rt.health, f"send to {dst}",
                       self._rt.config.timeout, lambda: [self._members[dst]],
                       f"rank {self._members[dst]} to receive")
        if error is not None:
            raise agreed(error)
        status = _native.load_u32(self._sent_status[dst])
        if status:
            if status == RECV_MISMATCH:
                raise CollectiveMismatch(f"send: rank {self._members[dst]} posted a recv that does not match this "
                                         f"send ({x.size} x {x.dtype}); no data was moved")
            reason = self._protocol.reason(dst, 2 + self._protocol.lay.world + self._rank)
            if status == RECV_REJECTED:
                raise CollectiveMismatch(f"send: rank {self._members[dst]} rejected its recv arguments: {reason}; "
                                         f"no data was moved", (self._members[dst],))
            raise CollectiveMismatch(f"send: rank {self._members[dst]} failed its recv of this send: {reason}")
        s = self._rt.stats
        s["calls"]["send"] = s["calls"].get("send", 0) + 1
        if t_send is None:
            return None
        received = us_from_bits(self._rt.ctl.i64[self._send_desc[dst] + F_AUX1])
        return self._rt.clock.sent(self._members[self._rank], self._members[dst], t_send, received)

    def _prepare_recv(self, x: np.ndarray, src: int, path: str) -> tuple:
        """Check the receive's source (a bad one raises at once) and take its sequence number;
        returns (src, seq, the native call's receive arguments or None when the common case
        does not apply, the receive's plan)."""
        if not (isinstance(src, (int, np.integer)) and 0 <= src < self._size and src != self._rank):
            raise ValueError(f"recv: source {src!r} is not another rank of this communicator (size {self._size})")
        seq = _native.next_seq(self._cx, _native.CX_RECEIVED, src)
        key = ("recv", id(x), src) if path is self._default_path else None
        native, plan = self._prepared.get(key, (x,), self._check_recv, x, src)
        return src, seq, native, plan

    def _check_recv(self, x: np.ndarray, src: int) -> tuple[tuple, bool]:
        """What a receive's checks decided (runtime/communicator/_prepared.py): the native call's receive
        arguments and the plan, or (None, None) when the common case does not apply (a bad
        argument, which _recv raises after telling the sender; an output not written in place)."""
        try:
            xf = as_flat(x, "recv", "buffer", writable=True)
            code = dtype_code(xf.dtype, "recv")
            self._buffers.check_mapped(xf, "recv", "buffer")
            if self._buffers.output(xf) is not xf:
                return (None, None), False
        except Exception:
            return (None, None), False
        nb = x.nbytes
        plan = None
        if nb:
            me = self._rank
            plan = self._executor.phase(("recv", src, nb), lambda: slices.recv(me, src, nb))
        return ((code, x.size, x.itemsize, _native.data_address(xf) if nb else 0,
                 plan.table if plan is not None else None), plan), True

    def _received_stats(self, plan) -> None:
        if plan is not None:
            _native.count(self._cx, plan.local, plan.remote, plan.written, 0)
        s = self._rt.stats
        s["calls"]["recv"] = s["calls"].get("recv", 0) + 1

    def _recv(self, x: np.ndarray, src: int, seq: int, arrived: bool, t_recv: float | None,
              path: str) -> float | None:
        """The receive from its wait (or, ``arrived``, from the descriptor's checks); under a
        modeled clock, returns when the pull completes (modeled), having told the sender in
        its descriptor (F_AUX1)."""
        op = "recv"
        flag = self._recv_flag[src]
        if not arrived and not _native.wait_seq_u32(flag, seq, SPIN_POLLS, SLICE):
            wait_until(lambda: _native.seq_reached(_native.load_u32(flag), seq), flag, self._rt.health, f"recv from {src}",
                       self._rt.config.timeout, lambda: [self._members[src]], f"rank {self._members[src]} to send")
        off = self._recv_desc[src]
        d = self._rt.ctl.i64[off:off + P2P_DESC].tolist()
        status, error = 0, None
        try:
            xf = as_flat(x, "recv", "buffer", writable=True)
            code = dtype_code(xf.dtype, "recv")
            self._buffers.check_mapped(xf, "recv", "buffer")
            if path is not self._default_path:
                self._executor.check_path(op, path)
            if d[F_FLAGS] & FLAG_REJECTED:
                reason = self._protocol.reason(src, 2 + self._rank)
                error = CollectiveMismatch(f"recv: rank {self._members[src]} rejected its send arguments: {reason}; "
                                           f"no data was moved", (self._members[src],))
            elif d[F_DTYPE] != code or d[F_COUNT] != x.size:
                status = RECV_MISMATCH
                error = CollectiveMismatch(
                    f"recv: rank {self._members[src]} sends {d[F_COUNT]} x "
                    f"{DTYPE_BY_CODE.get(d[F_DTYPE], '?')}, this rank expects {x.size} x {x.dtype}; "
                    f"no data was moved")
            elif x.nbytes:
                ready = self._ready[src]
                if ready[0] != d[F_SEG_VA] or ready[1] != d[F_EPOCH]:
                    self._rt.reg.ensure_ready(self._members[src], d[F_SEG_VA], d[F_SEG_SIZE], d[F_SEG_OFF],
                                              d[F_EPOCH], op)
                    ready[0], ready[1] = d[F_SEG_VA], d[F_EPOCH]
                target = self._buffers.output(xf)
                me, nb = self._rank, x.nbytes
                self._bases[IN, src] = d[F_ADDR]
                self._bases[OUT, me] = _native.data_address(target)
                for plan in self._executor.phases(("recv", src, nb), lambda: slices.recv(me, src, nb)):
                    self._executor.run(op, plan, path)
                self._buffers.output_done(x, target)
        except Exception as e:
            # the sender quotes it (published below, with the status and the done word)
            status, error = RECV_REJECTED if isinstance(e, (ValueError, TypeError)) else RECV_FAILED, e
            self._protocol.put_reason(2 + self._protocol.lay.world + src, e)
        received = None
        if t_recv is not None:
            received = self._rt.clock.received(self._members[src], self._members[self._rank],
                                               x.nbytes if isinstance(x, np.ndarray) else 0,
                                               us_from_bits(d[F_AUX0]), t_recv)
            self._rt.ctl.i64[off + F_AUX1] = to_bits(received)
        _native.received(self._recv_status[src], status, self._recv_done[src], seq)
        if error is not None:
            raise agreed(error)
        s = self._rt.stats
        s["calls"]["recv"] = s["calls"].get("recv", 0) + 1
        return received
