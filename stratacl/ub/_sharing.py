"""The fabric cost model: how long one phase of concurrent transfers takes on a topology.

A phase is a set of transfers that run at the same time (one full-mesh step, one ring step),
given as arrays: reader and owner (global ranks: the tiers depend on where ranks sit), bytes,
and kind (a remote ``LOAD``, a remote ``LOAD_REDUCE`` into the reader's SRAM, priced like a load
since the accumulation happens on chip, a ``LOCAL_COPY`` inside the reader's HBM, or a
``HOST_LOAD`` / ``HOST_STORE`` between the reader's HBM and its host's DRAM over the topology's
``host`` tier, whose owner is the reader itself). Pull mode: bytes flow owner -> reader, except
for a host store (reader's HBM -> its host DRAM).

    transfers --route--> resources each one crosses, with a weight per byte/us
        |                  reader's HBM (writes) and owner's HBM (reads)      [local tier bandwidth]
        |                  reader's port in, owner's port out                  [unless the tier is dedicated]
        |                  (host transfers: the reader's HBM and its port in for a load, out
        |                   for a store; the host DRAM is capped by the host tier alone)
        |                  for each level with an uplink the pair straddles:
        |                      owner's unit uplink out, reader's unit uplink in
        |              and a cap: the tier's bandwidth (what one pair achieves, Table 1)
        v
    max-min fair rates by progressive filling (water-filling over all resources at once)
        |
    advance to the next transfer that finishes; its capacity is shared again among the rest
        v
    completion of transfer f = alpha(tier of f) + the time its bytes took under that sharing

Ports. A rank's port has a line rate per direction (``port.gbps``; cm384: a die's share of its
NPU's UB bandwidth); a single transfer is further capped by its tier's bandwidth (Table 1: what
one pair achieves). Without ``port.gbps`` a port streams each tier's traffic at that tier's
bandwidth, so a byte from tier t occupies 1/beta_t of the port's time. A port carrying k
concurrent flows keeps only ``e + (1 - e) / k`` of its rate (``e`` = ``port.fan_in_efficiency``):
interleaving many senders into one port (or one owner serving many readers) costs arbitration
and head-of-line stalls in the switches that a single stream does not see. One flow loses
nothing, two lose (1 - e) / 2, many lose (1 - e). This is the only term that depends on
concurrency rather than capacity; the paper names it as why the full mesh trails multi-step
algorithms at large payloads (sections 3.2, 8.1, 9.2).

Uplinks, HBM and the dedicated links carry plain byte rates. Capacity is divided max-min fairly
(progressive filling): all unfinished transfers' rates rise together until a resource fills or a
transfer reaches its tier cap; those freeze, the rest keep rising. When a transfer finishes the
rest are filled again, so late finishers inherit the capacity early ones leave.

Approximation, stated: every transfer of a phase is taken to start together; readers that enter
the phase later (the clock module adds each reader's own start time) do not change the sharing.
Pure numpy, deterministic: the same arrays give bit-identical results.
"""
from __future__ import annotations

import numpy as np

from .._errors import ConfigError
from ._fill import fill as _native_fill
from ._topology import Topology

LOAD, LOAD_REDUCE, LOCAL_COPY, HOST_LOAD, HOST_STORE = 0, 1, 2, 3, 4

_GBPS = 1e3          # 1 GB/s in bytes per microsecond
_SAME = 1e-9         # relative tolerance: transfers finishing this close together finish together


class BandwidthSharing:
    """A topology turned into arrays the cost model indexes by global rank."""

    def __init__(self, topology: Topology):
        self.topology = topology
        names = list(topology.tiers)
        self._tier_id = {n: i for i, n in enumerate(names)}
        tiers = [topology.tiers[n] for n in names]
        self.tier_names = names
        self.latency = np.array([t.latency_us for t in tiers])
        self.bandwidth = np.array([t.bandwidth_gbps for t in tiers]) * _GBPS
        self.dedicated = np.array([t.dedicated for t in tiers])
        c = topology.contention
        # the rate at which a port streams each tier's traffic: its line rate, or the tier's own
        self.port_rate = self.bandwidth.copy() if c.port_gbps is None else np.full(len(tiers), c.port_gbps * _GBPS)
        self.fan_in = c.fan_in_efficiency
        self.flag_extra = c.flag_us
        self.spans = np.array(topology.spans, dtype=np.int64)
        self.level_tier = np.array([self._tier_id[lv.tier] for lv in topology.levels])
        self.beyond = self._tier_id[topology.beyond]
        self.local_tier = int(self.level_tier[0])
        self.hbm = self.bandwidth[self.local_tier]
        # what of a die's HBM communication may use: all of it, unless a kernel beside the call
        # holds part of it (``FabricModel.with_hbm``: the die's HBM as a shared resource)
        self.hbm_for_comm = self.hbm
        self.uplinks = [(i, lv.uplink_gbps * _GBPS) for i, lv in enumerate(topology.levels) if lv.uplink_gbps]
        self.host_tier = self._tier_id[topology.host] if topology.host else -1

    # --- tiers ------------------------------------------------------------------------------
    def tier_of(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Tier index between global ranks a and b (element-wise): the innermost shared level's."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        out = np.full(np.broadcast(a, b).shape, self.beyond, dtype=np.int64)
        todo = np.ones(out.shape, dtype=bool)
        for span, tier in zip(self.spans, self.level_tier):
            same = todo & (a // span == b // span)
            out[same] = tier
            todo &= ~same
        return out

    def tier_by_kind(self, reader: np.ndarray, owner: np.ndarray, kind: np.ndarray) -> np.ndarray:
        """Tier index of each transfer: between reader and owner, the local tier for a local
        copy, the host tier for a host load or store."""
        tier = self.tier_of(reader, owner)
        kind = np.broadcast_to(np.asarray(kind, dtype=np.int64), tier.shape)
        tier[kind == LOCAL_COPY] = self.local_tier
        host = kind >= HOST_LOAD
        if host.any():
            if self.host_tier < 0:
                raise ConfigError(f"topology {self.topology.name}: no 'host' tier, so transfers to and from "
                                  "host memory cannot be timed; name one (see ub/_topology.py)")
            tier[host] = self.host_tier
        return tier

    def flag_us(self, signaller: np.ndarray, waiter: np.ndarray) -> np.ndarray:
        """Time from a flag's store to its waiter seeing it: the tier latency plus ``sync.flag_us``."""
        return self.latency[self.tier_of(signaller, waiter)] + self.flag_extra

    # --- routing ----------------------------------------------------------------------------
    def _route(self, reader: np.ndarray, owner: np.ndarray, kind: np.ndarray):
        """Resources (ids, weights) each transfer crosses, its tier cap and its alpha, and the
        capacity of every resource. Ports are marked: their capacity depends on their load."""
        f = reader.size
        world = int(max(reader.max(initial=0), owner.max(initial=0))) + 1
        tier = self.tier_by_kind(reader, owner, kind)
        local = kind == LOCAL_COPY
        host = kind >= HOST_LOAD
        remote = ~local
        via_port = remote & ~self.dedicated[tier]
        nlev = len(self.uplinks)
        res = np.zeros((f, 4 + 2 * nlev), dtype=np.int64)      # 0: a dummy of infinite capacity
        w = np.zeros(res.shape)
        hbm0, pin0, pout0 = 1, 1 + world, 1 + 2 * world
        caps = [np.full(1, np.inf), np.full(world, self.hbm_for_comm), np.ones(world), np.ones(world)]
        res[:, 0], w[:, 0] = hbm0 + reader, np.where(local, 2.0, 1.0)   # a copy reads and writes
        peer = remote & ~host          # a host transfer's other end is host DRAM, not an HBM
        res[peer, 1], w[peer, 1] = hbm0 + owner[peer], 1.0
        rate = self.port_rate[tier]
        port_in = via_port & (kind != HOST_STORE)
        port_out = via_port & (kind != HOST_LOAD)
        res[port_in, 2], w[port_in, 2] = pin0 + reader[port_in], 1.0 / rate[port_in]
        res[port_out, 3], w[port_out, 3] = pout0 + owner[port_out], 1.0 / rate[port_out]
        base = 1 + 3 * world
        for j, (lvl, cap) in enumerate(self.uplinks):
            span = self.spans[lvl]
            units = world // span + 1
            ru, ou = reader // span, owner // span
            cross = remote & (ru != ou)
            res[cross, 4 + 2 * j], w[cross, 4 + 2 * j] = base + ou[cross], 1.0
            res[cross, 5 + 2 * j], w[cross, 5 + 2 * j] = base + units + ru[cross], 1.0
            caps += [np.full(units, cap), np.full(units, cap)]
            base += 2 * units
        cap = np.concatenate(caps)
        is_port = np.zeros(cap.size, dtype=bool)
        is_port[pin0:pout0 + world] = True
        tier_cap = np.where(local, np.inf, self.bandwidth[tier])
        alpha = self.latency[tier]
        return res, w, cap, is_port, tier_cap, alpha

    def hbm_bytes(self, reader, owner, nbytes, kind, n: int) -> np.ndarray:
        """Bytes each of ranks 0..n-1 reads and writes in its own HBM for these transfers, as
        ``_route`` charges them: a reader writes what it pulls (a local copy reads and writes
        it), an owner is read for a peer's load, a host load writes and a host store reads the
        reader's HBM."""
        reader, owner, nbytes, kind = _arrays(reader, owner, nbytes, kind)
        nb = nbytes.astype(np.float64)
        local, host = kind == LOCAL_COPY, kind >= HOST_LOAD
        out = np.bincount(reader, weights=np.where(local, 2.0, 1.0) * nb, minlength=n)
        peer = ~local & ~host
        out += np.bincount(owner[peer], weights=nb[peer], minlength=n)
        return out[:n]

    # --- sharing ----------------------------------------------------------------------------
    def _port_capacity(self, res, w, active, cap, is_port):
        """A port carrying k flows keeps e + (1 - e)/k of its time."""
        if self.fan_in >= 1.0:
            return cap
        used = (w[active] > 0) & is_port[res[active]]
        k = np.bincount(res[active][used], minlength=cap.size)
        out = cap.copy()
        busy = is_port & (k > 0)
        out[busy] = self.fan_in + (1.0 - self.fan_in) / k[busy]
        return out

    @staticmethod
    def _fill(res, w, cap, tier_cap, active) -> np.ndarray:
        """Max-min fair rates (bytes/us) of the active transfers by progressive filling: all
        unfrozen transfers' rates rise together; a resource that fills freezes the transfers on
        it, a transfer stops at its tier cap (native: ``_fill.c``)."""
        x = np.empty(len(active))
        _native_fill(np.ascontiguousarray(res, dtype=np.int64), np.ascontiguousarray(w, dtype=np.float64),
                     res.shape[1], np.ascontiguousarray(cap, dtype=np.float64),
                     np.ascontiguousarray(tier_cap, dtype=np.float64), np.ascontiguousarray(active, dtype=bool), x)
        return x

    def rates(self, reader, owner, nbytes, kind) -> tuple[np.ndarray, np.ndarray]:
        """Rates (bytes/us) the transfers get while all of them run, and their alphas (us).
        A ring step uses this: its transfers are taken to share capacity for their whole length."""
        reader, owner, nbytes, kind = _arrays(reader, owner, nbytes, kind)
        res, w, cap, is_port, tier_cap, alpha = self._route(reader, owner, kind)
        active = nbytes > 0
        cap = self._port_capacity(res, w, active, cap, is_port)
        return self._fill(res, w, cap, tier_cap, active), alpha

    def phase(self, reader, owner, nbytes, kind) -> np.ndarray:
        """Completion time (us, from the phase's start) of every transfer of one phase.

        Contention as described in the module docstring; a zero-byte transfer costs nothing."""
        reader, owner, nbytes, kind = _arrays(reader, owner, nbytes, kind)
        done = np.zeros(reader.size)
        if reader.size == 0:
            return done
        res, w, cap0, is_port, tier_cap, alpha = self._route(reader, owner, kind)
        left = nbytes.astype(np.float64)
        active = left > 0
        t = 0.0
        while active.any():
            cap = self._port_capacity(res, w, active, cap0, is_port)
            x = self._fill(res, w, cap, tier_cap, active)
            need = np.full(left.size, np.inf)
            need[active] = left[active] / x[active]
            dt = need.min()
            finished = active & (need <= dt * (1 + _SAME))
            t += dt
            done[finished] = t
            left[active] -= x[active] * dt
            left[finished] = 0.0
            active &= ~finished
        return np.where(nbytes > 0, alpha + done, 0.0)


def _arrays(reader, owner, nbytes, kind):
    reader = np.asarray(reader, dtype=np.int64).reshape(-1)
    owner = np.asarray(owner, dtype=np.int64).reshape(-1)
    nbytes = np.asarray(nbytes, dtype=np.int64).reshape(-1)
    kind = np.broadcast_to(np.asarray(kind, dtype=np.int64), reader.shape)
    return reader, owner, np.broadcast_to(nbytes, reader.shape), kind
