"""Point-to-point transfers: pull-mode send/recv between two ranks of a communicator.

    sender                                         receiver
    publish descriptor {dtype, count, address, segment} in its slot for the receiver
    bump send_seq[receiver] (futex word) -------> wait for send_seq >= expected
                                                   check dtype/count, readiness, pull the bytes
    wait for recv_done[sender] <------------------ write status, bump recv_done[sender]
    (a mismatch is reported to both sides through the status word)

``sendrecv`` posts the send before pulling the receive, so a ring of them cannot deadlock.
"""
from __future__ import annotations

import array

import numpy as np

from .._errors import CollectiveMismatch
from ..collectives import _reduce, _slices
from ..collectives._slices import IN, OUT
from ..ub._rankclock import to_bits, us_from_bits
from . import _native
from ._args import _expect, _flat
from ._control import (F_ADDR, F_AUX0, F_AUX1, F_CALL, F_COUNT, F_DTYPE, F_EPOCH, F_FLAGS, F_NBYTES, F_OP,
                       F_SEG_OFF, F_SEG_SIZE, F_SEG_VA, FLAG_REJECTED, P2P_DESC, Layout)
from ._sync import SLICE, SPIN_POLLS, WAKE_ALL, seq_reached, wait_until
from ._work import agreed, collective


class PointToPoint:
    """The send/recv half of ``Communicator`` (a mixin: it uses the communicator's slots)."""

    def _p2p_addr(self, owner_idx: int, which: int, peer_idx: int) -> int:
        """which: 0 send_seq, 1 recv_done, 2 recv_status (u32 words)."""
        off = (Layout.SLOT_SEND_SEQ, self._lay.slot_recv_done(), self._lay.slot_recv_status())[which]
        return self._rt.ctl.base + self._slot_offs[owner_idx] + off + 4 * peer_idx

    def _p2p_desc_off(self, owner_idx: int, peer_idx: int) -> int:
        return (self._slot_offs[owner_idx] + self._lay.slot_p2p_desc()) // 8 + peer_idx * P2P_DESC

    def _init_p2p(self) -> None:
        """Per-peer addresses, computed once: what this rank posts to and waits on."""
        me, peers = self.rank, range(self.size)
        self._send_flag = [self._p2p_addr(me, 0, p) for p in peers]      # my send_seq for p
        self._recv_flag = [self._p2p_addr(p, 0, me) for p in peers]      # p's send_seq for me
        self._sent_done = [self._p2p_addr(p, 1, me) for p in peers]      # p's recv_done for me
        self._recv_done = [self._p2p_addr(me, 1, p) for p in peers]      # my recv_done for p
        self._sent_status = [self._p2p_addr(p, 2, me) for p in peers]
        self._recv_status = [self._p2p_addr(me, 2, p) for p in peers]
        self._send_desc = [self._p2p_desc_off(me, p) for p in peers]     # int64 index of my descriptor for p
        self._recv_desc = [self._p2p_desc_off(p, me) for p in peers]

    @collective
    def send(self, x: np.ndarray, dst: int) -> None:
        """Blocking send: returns once rank ``dst`` has pulled ``x`` with a matching ``recv``."""
        posted = self._post_send(x, dst)
        t = self._complete_send(posted)
        if t is not None:
            self._ended("send", posted[5], t)

    @collective
    def sendrecv(self, x: np.ndarray, dst: int, out: np.ndarray, src: int) -> None:
        """Send ``x`` to ``dst`` while receiving into ``out`` from ``src`` (MPI_Sendrecv).

        Both halves proceed at once, so a ring of sendrecv calls cannot deadlock.
        """
        posted = self._post_send(x, dst)
        try:
            received = self._recv(out, src, posted[5])
        except BaseException:
            try:
                self._complete_send(posted)
            except Exception:   # the receive's error is the one to report
                pass
            raise
        sent = self._complete_send(posted)
        if sent is not None:
            self._ended("sendrecv", posted[5], max(sent, received))

    def _post_send(self, x: np.ndarray, dst: int) -> tuple:
        """Publish ``x`` for rank ``dst`` to pull; returns what ``_complete_send`` waits on."""
        _expect(isinstance(dst, (int, np.integer)) and 0 <= dst < self.size and dst != self.rank,
                lambda: f"send: destination {dst!r} is not another rank of this communicator (size {self.size})")
        error = None
        try:
            code = _reduce.dtype_code(x.dtype, "send")
            inp = self._as_input(x, "send")
        except Exception as e:
            error, code, inp = e, 0, None
        self._sent[dst] += 1
        seq = self._sent[dst] & 0xFFFFFFFF
        seg = inp.seg if inp is not None else None
        fields = array.array("q", bytes(8 * P2P_DESC))
        fields[F_OP], fields[F_DTYPE], fields[F_CALL] = 100, code, seq
        if inp is not None:
            fields[F_COUNT], fields[F_ADDR], fields[F_NBYTES] = x.size, inp.addr, inp.flat.nbytes
        if seg is not None:
            fields[F_SEG_VA], fields[F_SEG_SIZE], fields[F_SEG_OFF], fields[F_EPOCH] = (
                seg.va, seg.size, seg.hbm_offset, seg.epoch)
        if error is not None:
            fields[F_FLAGS] = FLAG_REJECTED
        t_send = self._entering_us() if self._rt.clock is not None else None
        if t_send is not None:
            fields[F_AUX0] = to_bits(t_send)
        _native.post(self._rt.ctl.base + 8 * self._send_desc[dst], fields, self._send_flag[dst], seq)
        return dst, seq, error, inp, x, t_send

    def _complete_send(self, posted: tuple) -> float | None:
        """Wait for the receiver; under a modeled clock, return the sender's modeled exit time."""
        dst, seq, error, inp, x, t_send = posted
        done = self._sent_done[dst]
        if not _native.wait_seq_u32(done, seq, SPIN_POLLS, SLICE):
            wait_until(lambda: seq_reached(_native.load_u32(done), seq), done, self._rt.health, f"send to {dst}",
                       self._rt.config.timeout, lambda: [self.members[dst]],
                       f"rank {self.members[dst]} to receive")
        if error is not None:
            raise agreed(error)
        status = _native.load_u32(self._sent_status[dst])
        if status:
            raise CollectiveMismatch(f"send: rank {self.members[dst]} posted a recv that does not match this "
                                     f"send ({x.size} x {x.dtype}); no data was moved")
        s = self._rt.stats
        s["calls"]["send"] = s["calls"].get("send", 0) + 1
        if t_send is None:
            return None
        received = us_from_bits(self._rt.ctl.i64[self._send_desc[dst] + F_AUX1])
        return self._rt.clock.sent(self.members[self.rank], self.members[dst], t_send, received)

    @collective
    def recv(self, x: np.ndarray, src: int) -> None:
        """Blocking receive into ``x`` from rank ``src``; sizes and dtypes must match the send."""
        t_recv = self._entering_us() if self._rt.clock is not None else None
        t = self._recv(x, src, t_recv)
        if t is not None:
            self._ended("recv", t_recv, t)

    def _recv(self, x: np.ndarray, src: int, t_recv: float | None) -> float | None:
        """The receive; under a modeled clock, returns when the pull completes (modeled), having
        told the sender in its descriptor (F_AUX1)."""
        op = "recv"
        _expect(isinstance(src, (int, np.integer)) and 0 <= src < self.size and src != self.rank,
                lambda: f"recv: source {src!r} is not another rank of this communicator (size {self.size})")
        self._received[src] += 1
        seq = self._received[src] & 0xFFFFFFFF
        flag = self._recv_flag[src]
        if not _native.wait_seq_u32(flag, seq, SPIN_POLLS, SLICE):
            wait_until(lambda: seq_reached(_native.load_u32(flag), seq), flag, self._rt.health, f"recv from {src}",
                       self._rt.config.timeout, lambda: [self.members[src]], f"rank {self.members[src]} to send")
        off = self._recv_desc[src]
        d = self._rt.ctl.i64[off:off + P2P_DESC].tolist()
        status, error = 0, None
        try:
            code = _reduce.dtype_code(x.dtype, "recv")
            xf = _flat(x, "recv", "buffer", writable=True)
            if self._path is not self._default_path:
                self._check_path(op)
            if d[F_FLAGS] & FLAG_REJECTED:
                error = CollectiveMismatch(f"recv: rank {self.members[src]} rejected its send arguments; "
                                           f"no data was moved")
            elif d[F_DTYPE] != code or d[F_COUNT] != x.size:
                status = 1
                error = CollectiveMismatch(
                    f"recv: rank {self.members[src]} sends {d[F_COUNT]} x "
                    f"{_reduce.DTYPE_BY_CODE.get(d[F_DTYPE], '?')}, this rank expects {x.size} x {x.dtype}; "
                    f"no data was moved")
            elif x.nbytes:
                ready = self._ready[src]
                if ready[0] != d[F_SEG_VA] or ready[1] != d[F_EPOCH]:
                    self._rt.reg.ensure_ready(self.members[src], d[F_SEG_VA], d[F_SEG_SIZE], d[F_SEG_OFF],
                                              d[F_EPOCH], op)
                    ready[0], ready[1] = d[F_SEG_VA], d[F_EPOCH]
                target = self._output(xf)
                me, nb = self.rank, x.nbytes
                self._bases[IN, src] = d[F_ADDR]
                self._bases[OUT, me] = _native.data_address(target)
                for plan in self._phases(("recv", src, nb), lambda: _slices.recv(me, src, nb)):
                    self._run(op, plan)
                self._output_done(x, target)
        except Exception as e:
            status, error = 1, e
        received = None
        if t_recv is not None:
            received = self._rt.clock.received(self.members[src], self.members[self.rank], x.nbytes,
                                               us_from_bits(d[F_AUX0]), t_recv)
            self._rt.ctl.i64[off + F_AUX1] = to_bits(received)
        _native.store_u32(self._recv_status[src], status)
        done = self._recv_done[src]
        _native.store_u32(done, seq)
        _native.futex_wake(done, WAKE_ALL)
        if error is not None:
            raise agreed(error)
        s = self._rt.stats
        s["calls"]["recv"] = s["calls"].get("recv", 0) + 1
        return received
