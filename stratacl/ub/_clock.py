"""Modeled clocks: what a collective call does to every member's modeled time.

    model_call(model, op, algo, members, nbytes, clocks_in, extra_us)
        clocks = clocks_in + extra_us                    (e.g. jit mappings made in this call)
        plan   = the call's schedule (collectives._schedule), timed once by the fabric model
                 (ub._sharing) and cached: per-member durations of every phase, flag latencies
        for each step of the plan:
            Barrier   full mesh: every member stores its arrival flag into every other and
                      waits for all of them: t_i = max over j of (t_j + flag latency j -> i)
            Mesh      t_i += the time i's last transfer of the phase completes
            Local     t_i += its own HBM copy
            RootWait  t_root = max(t_root, max over j of (t_j + flag latency j -> root))
            Ring      step s of i starts at max(end of i's step s-1, end of i-1's step s-1) + flag
                      (i polls i-1's step counter where i-1 keeps it: one access latency)
            Shift     i pulls from i-1 after i-1's send flag, returns once i+1 flagged it done
                      (flags polled where their owner keeps them, like ring flags)
        -> clocks_out (float64, us, one per member)

Every synchronisation is max(own clock, signaller's clock + latency) (pulled flags: max(own,
signaller's) + latency), so the arithmetic is the
same whether the clocks come from an estimate (all zero) or from ranks that moved real bytes:
a data-moving rank that calls ``model_call`` with the clocks every member published (and the
extra_us every member counted) gets, by construction, the times estimate-only mode reports, and
every member computes the same vector. ``model_call`` is a pure function of its arguments (the
cache only remembers what it computed).

Baselines are variants of the model (``FabricModel.registration``):

    roa, pool   zero copy: peers read user buffers directly; nothing added
    jit         zero copy, plus the in-operator mappings the caller counted, passed as extra_us
                (``FabricModel.registration_us``: one UB registration per peer mapping, its
                four steps' costs from topology ``registration``; read off the paper's Fig. 5a)
    staged      buffer-centric: each round copies the input into the communication buffer, runs
                the algorithm between communication buffers, copies the output out (local HBM
                copies at half the HBM bandwidth); a buffer of ``staged_buffer`` bytes (HCCL's
                HCCL_BUFFSIZE default, 200 MB) forces rounds, each with its own barriers

The fabric-native backend (``collectives/_partition.py``, ``ub/_cores.py``, ``sdma/``) times every
data-moving step through the rank's cores: the fabric gives each member its share of bandwidth
for the step (as above), the member's transfers are cut into units, a partitioner (``naive`` or
``balanced``) gives every communication core its task list, and the MTE executor (cores move the
bytes, each at most ``cores.issue_gbps``) or the SDMA executor (cores post descriptors, the
engine moves the bytes) gives exact per-core timelines; the step lasts until the member's last
core (MTE) or the completion (SDMA) is done. Those runs stay attached to the plan, so
``call_cores`` and the profiler read per-core figures of any call.

``choose_algo`` is the workload-aware selection (``algo="auto"``): it times the call both ways
with the model and keeps the cheaper, cached by (op, bytes, members, root).
"""
from __future__ import annotations

import dataclasses
import pickle

import numpy as np

from ..collectives import Partitioner, cut, default_fan_out_cap, default_unit_bytes, ep_slices
from ..collectives import schedules as S
from ..sdma import COMPLETIONS, PATHS, paths_of, run_sdma
from . import _cores
from ._registration_cost import ub_registration_us
from ._sharing import BandwidthSharing
from ._topology import UNIT_US, Topology, load

REGISTRATIONS = ("roa", "jit", "pool", "staged")
STAGED_BUFFER = 200 * 1024 * 1024      # HCCL_BUFFSIZE default: 200 MB (CANN environment-variable reference)
_CACHE_LIMIT = 1024


class FabricModel:
    """A topology, a registration mode and the cached plans of the calls timed so far."""

    def __init__(self, topology: Topology | str = "cm384", registration: str = "roa",
                 staged_buffer: int | None = STAGED_BUFFER, cores: int | None = None,
                 comm_cores: int | None = None, partition: str = "balanced", path: str = "mte",
                 completion: str = "flag", *, eager_bytes: int):
        if registration not in REGISTRATIONS:
            raise ValueError(f"registration must be one of {', '.join(REGISTRATIONS)}, got {registration!r}")
        if path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
        if completion not in COMPLETIONS:
            raise ValueError(f"completion must be one of {', '.join(COMPLETIONS)}, got {completion!r}")
        self.topology = load(topology) if isinstance(topology, str) else topology
        self.fabric = BandwidthSharing(self.topology)
        self.registration = registration
        self.staged_buffer = staged_buffer
        self.eager_bytes = int(eager_bytes)  # the modeled runtime's eager threshold (its policy, given)
        tc = self.topology.cores
        self.cores = int(cores if cores else tc.count)
        self.comm_cores = int(comm_cores if comm_cores else min(tc.comm, self.cores))
        if not 1 <= self.comm_cores <= self.cores:
            raise ValueError(f"comm_cores must be in 1..cores ({self.cores}), got {self.comm_cores}")
        self.partitioner = Partitioner(partition)
        self.partition, self.path, self.completion = partition, path, completion
        f = self.fabric
        self.issue_rate = tc.issue_gbps * 1e3 if tc.issue_gbps else None      # bytes/us
        tiers = [self.topology.tiers[n] for n in f.tier_names]
        # a local copy reads and writes every byte: its tier moves at half the HBM bandwidth
        self._beta = np.where(np.arange(len(tiers)) == f.local_tier, f.hbm / 2, f.bandwidth)
        # a core's issue rate bounds its remote accesses (calibrated on filling a UB port,
        # topology cores.issue_gbps); a local copy does not cross the fabric: the HBM bounds it
        # (its tier's rate, shared by the cores), not the per-core rate of remote requests
        self._issue_cap = (np.where(np.arange(len(tiers)) == f.local_tier, np.inf, self.issue_rate)
                           if self.issue_rate else None)
        self.unit_bytes = np.array([t.unit_bytes or default_unit_bytes(b, UNIT_US) for t, b in zip(tiers, self._beta)])
        self.fan_out_cap = np.array([t.fan_out_cap or default_fan_out_cap(b, self.issue_rate, self.comm_cores)
                                     for t, b in zip(tiers, self._beta)])
        self._plans: dict = {}
        # a store the job's ranks share plans through (runtime/pipeline/_plans.py SharedPlans), or None
        self.shared = None
        self._rounds: dict = {}
        self._barriers: dict = {}
        self._auto: dict = {}
        self._runs: dict = {}

    @classmethod
    def from_settings(cls, topology: Topology | str, registration: str, eager_bytes: int) -> "FabricModel":
        """The model a rank's virtual clock uses: the backend settings (cores, comm_cores,
        partition, path) from ``stratacl.config`` (``STRATACL_*``); under ``path=auto``, a
        blocking call's path (an asynchronous call's model is its sibling, ``with_path``)."""
        from .._config import Config
        c = Config()
        return cls(topology, registration, cores=c.cores, comm_cores=c.comm_cores, partition=c.partition,
                   path=paths_of(c.path)[0], eager_bytes=eager_bytes)

    def with_path(self, path: str) -> "FabricModel":
        """The same model with another data path (mte | sdma)."""
        m = FabricModel(self.topology, self.registration, self.staged_buffer, self.cores, self.comm_cores,
                        self.partition, path, self.completion, eager_bytes=self.eager_bytes)
        m.shared = self.shared
        return m

    def with_hbm(self, gbps: float) -> "FabricModel":
        """The same model with ``gbps`` of every die's HBM left to communication (a kernel beside
        the call holds the rest: ``ub._compute.overlap`` with ``compute_first``)."""
        m = FabricModel(self.topology, self.registration, self.staged_buffer, self.cores, self.comm_cores,
                        self.partition, self.path, self.completion, eager_bytes=self.eager_bytes)
        m.fabric.hbm_for_comm = float(gbps) * 1e3
        m.shared = self.shared
        return m

    def __repr__(self) -> str:
        return (f"FabricModel({self.topology.name!r}, registration={self.registration!r}, "
                f"comm_cores={self.comm_cores}/{self.cores}, partition={self.partition!r}, path={self.path!r})")

    # --- the backend: one member's transfers of one step through its cores ------------------
    def _row_beta(self, beta: np.ndarray, grain: int) -> np.ndarray:
        """Per tier, the rate (bytes/us) one core moves rows of ``grain`` bytes at when each row is
        its own transfer. The core sets each row up (``cores.transfer_us``, its own work, so
        serial), then the row holds one of the core's two buffers from its load's issue until
        its bytes are in (its tier latency + grain / beta): with two rows in flight (the double
        buffering of ``_cores``) a row costs max(grain / beta, (latency + grain / beta) / 2), so a
        row shorter than its latency is latency-bound. A bulk phase (``grain`` 0) keeps ``beta``."""
        if not grain:
            return beta
        stream = grain / beta
        per_row = self.topology.cores.transfer_us + np.maximum(stream, (self.fabric.latency + stream) / 2)
        with np.errstate(divide="ignore"):
            return grain / per_row        # a row costing nothing (no latency, setup or rate limit): inf

    def policy(self, peers: np.ndarray, nbytes: np.ndarray, tiers: np.ndarray, path: str | None = None,
               grain: int = 0):
        """Transfer units of one member's step and the partitioner's assignment of them to its
        communication cores (cached by shape); the data path's SDMA queues use the same. On the
        SDMA path a unit becomes descriptors and a core only posts them, so small phases are not
        cut finer for the cores' balance: that would only add descriptors, each costing its core
        ``sdma.descriptor_us`` before the doorbell. ``grain``: the row size of a row-granular
        phase (each row its own transfer), 0 for a bulk one."""
        path = path or self.path
        peers, nbytes, tiers = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (peers, nbytes, tiers))
        # a unit's modeled cost on one core: alpha_t + s / beta_t, with beta_t no faster than a core issues
        # (local units too: beside remote ones they get the same share of the phase's rate)
        beta = np.minimum(self._beta, self.issue_rate) if self.issue_rate else self._beta
        if grain and path == "mte":
            beta = self._row_beta(beta, grain)
        units = cut(peers, nbytes, tiers, self.unit_bytes, self.fabric.latency, beta,
                    self.comm_cores if path == "mte" else 0)
        pol = self.partitioner.policy(units, self.comm_cores, self.fan_out_cap,
                                      key=(path, peers.tobytes(), nbytes.tobytes(), tiers.tobytes(), self.comm_cores,
                                           int(grain)))
        return units, pol

    def core_run(self, peers: np.ndarray, nbytes: np.ndarray, tiers: np.ndarray, share: float, path: str | None = None,
                 grain: int = 0):
        """Per-core run (``_cores.CoreRun`` or ``sdma.SdmaRun``) of one member's transfers of one
        step: ``peers`` (any ids: the cap counts cores per peer), ``nbytes``, ``tiers`` (tier
        index of each), the member's fabric share (bytes/us). Cached by shape.

        ``grain`` > 0: the transfers are rows of ``grain`` bytes, each its own transfer (MoE
        low-latency). MTE: a core moves them no faster than ``_row_beta`` (each row's setup on
        the core, its latency hidden only behind one other row's bytes). SDMA: each row is its
        own descriptor, so the cores build one per row (``sdma.descriptor_us`` each)."""
        path = path or self.path
        grain = int(grain)
        # members whose shares agree to 9 digits share one run (symmetric members of a phase)
        share = float(f"{share:.9g}")
        key = (path, peers.tobytes(), nbytes.tobytes(), tiers.tobytes(), share, grain)
        got = self._runs.get(key)
        if got is not None:
            return got
        f = self.fabric
        units, pol = self.policy(peers, nbytes, tiers, path, grain)
        alpha = f.latency[units.tier]
        if path == "mte":
            cap = self._issue_cap[units.tier] if self.issue_rate else None
            if grain:
                # the rows' steady state is in their rate; a core's first unit still fills the pipeline
                rate = self._issue_cap if self.issue_rate else np.full(f.latency.size, np.inf)
                cap = self._row_beta(rate, grain)[units.tier]
            run = _cores.run_mte(units.nbytes, alpha, pol.core, pol.slot, self.comm_cores, share, cap)
        else:
            sdma = self.topology.sdma
            if grain:
                sdma = dataclasses.replace(sdma, max_descriptor_bytes=min(sdma.max_descriptor_bytes, grain))
            run = run_sdma(units.nbytes, alpha, pol.core, pol.slot, self.comm_cores, share,
                           sdma, self.completion)
        run = (run, pol, units)
        if len(self._runs) >= 4 * _CACHE_LIMIT:
            self._runs.clear()
        self._runs[key] = run
        return run

    def _through_cores(self, m: np.ndarray, reader: np.ndarray, owner: np.ndarray, nbytes: np.ndarray,
                       kind: np.ndarray, done: np.ndarray, grain: int = 0) -> tuple[np.ndarray, list]:
        """Per-member duration of one phase whose transfers the fabric timed (``done``, us from
        the phase start, per transfer) once the members' cores execute them (``grain``: as
        ``core_run``'s)."""
        f, n = self.fabric, m.size
        tier = f.tier_by_kind(m[reader], m[owner], kind)
        alpha = f.latency[tier]
        dur, runs = np.zeros(n), [None] * n
        order = np.argsort(reader, kind="stable")
        bounds = np.searchsorted(reader[order], np.arange(n + 1))
        for i in range(n):
            sel = order[bounds[i]:bounds[i + 1]]
            sel = sel[nbytes[sel] > 0]
            if sel.size == 0:
                continue
            data = float((done[sel] - alpha[sel]).max())
            share = float(nbytes[sel].sum()) / data if data > 0 else 0.0
            # peers relative to the member, in that order: members alike in the topology share a policy
            rel = (owner[sel] - i) % n
            by = np.argsort(rel, kind="stable")
            run = self.core_run(rel[by].astype(np.int64), nbytes[sel][by].astype(np.int64), tier[sel][by], share,
                                grain=grain)
            runs[i] = run
            dur[i] = run[0].end
        return dur, runs

    def registration_us(self, mappings, nbytes) -> np.ndarray:
        """Modeled cost of ``mappings`` just-in-time peer registrations of ``nbytes`` buffers each
        (each its four steps, ``runtime.memory._registration_cost``)."""
        return np.asarray(mappings, dtype=np.float64) * ub_registration_us(self.topology.contention, nbytes)

    # --- plans ------------------------------------------------------------------------------
    def plan(self, op: str, algo: str, members: tuple, nbytes: int, root: int = 0, itemsize: int = 1) -> list:
        """The timed steps of one call (cached). Staged calls are a list of rounds."""
        key = (op, algo, members, int(nbytes), int(root), int(itemsize))
        got = self._plans.get(key)
        if got is None:
            if len(self._plans) >= _CACHE_LIMIT:
                self._plans.clear()
            if self.shared is not None and self.shared.wants(len(members)):
                got = self.shared.fetch(self._identity() + repr(key).encode(), lambda: self._plan(*key))
            else:
                got = self._plan(*key)
            self._plans[key] = got
        return got

    def _plan(self, op: str, algo: str, members: tuple, nbytes: int, root: int, itemsize: int) -> list:
        m = np.asarray(members, dtype=np.int64)
        if self.registration != "staged":
            return self._timed(op, algo, m, nbytes, root, itemsize)
        got = []
        for b in S.staged_rounds(op, m.size, nbytes, self.staged_buffer, itemsize):
            got += self._round(op, algo, members, m, b, root, itemsize)
        return got

    def _identity(self) -> bytes:
        """What names this model's plans apart from another's: every setting that times them."""
        return pickle.dumps(self.topology) + repr((self.registration, self.staged_buffer, self.cores, self.comm_cores,
                     self.partition, self.path, self.completion, self.eager_bytes,
                     self.fabric.hbm_for_comm)).encode()

    def plan_exchange(self, members: tuple, phases: list[tuple[np.ndarray, int]],
                      staging: tuple[np.ndarray, np.ndarray] | None = None) -> list:
        """The timed steps of a call given by its traffic matrices (``_schedule.exchange``;
        cached by the matrices). Staged: each member copies its input into the communication
        buffer before and its output out after, ``staging`` = (input, output) bytes per member
        (default: what its peers read from it in the last phase, and what it read), optionally
        followed by the row size of each copy's transfers per member (0: one bulk copy).
        A phase's kind may carry a row size (``collectives._ep.rows_kind``): its transfers are
        rows, each its own transfer (``core_run``'s ``grain``)."""
        key = ("exchange", members, tuple((np.asarray(b, dtype=np.int64).tobytes(), int(k)) for b, k in phases),
               None if staging is None else tuple(np.asarray(a, dtype=np.int64).tobytes() for a in staging))
        got = self._plans.get(key)
        if got is None:
            if len(self._plans) >= _CACHE_LIMIT:
                self._plans.clear()
            m = np.asarray(members, dtype=np.int64)
            split = [ep_slices.split_kind(k) for _, k in phases]
            # the exchange's steps: the arrival barrier, a Mesh per phase, the departure barrier
            grains = [0] + [g for _, g in split] + [0]
            got = self._timed_steps(m, S.exchange([(b, k) for (b, _), (k, _) in zip(phases, split)]), grains)
            if self.registration == "staged":
                last = np.asarray(phases[-1][0], dtype=np.int64)
                cin, cout = staging[:2] if staging is not None else (last.sum(axis=0), last.sum(axis=1))
                gin, gout = staging[2:4] if staging is not None and len(staging) > 2 else (0, 0)
                got = self._timed_local(m, cin, gin) + got + self._timed_local(m, cout, gout)
            self._plans[key] = got
        return got

    def _round(self, op, algo, members, m, nbytes, root, itemsize) -> list:
        key = (op, algo, members, nbytes, root, itemsize)
        got = self._rounds.get(key)
        if got is None:
            if len(self._rounds) >= _CACHE_LIMIT:
                self._rounds.clear()
            cin, cout = S.staging_bytes(op, m.size, nbytes, root)
            got = (self._timed_local(m, cin) + self._timed(op, algo, m, nbytes, root, itemsize)
                   + self._timed_local(m, cout))
            self._rounds[key] = got
        return got

    def _timed_local(self, m: np.ndarray, nbytes: np.ndarray, grain=0) -> list:
        """A local copy of ``nbytes`` per member; ``grain`` (per member, or one for all): the row
        size of its transfers when each row is copied on its own, 0 for one bulk copy."""
        if not np.any(nbytes):
            return []
        n = m.size
        me = np.arange(n)
        nbytes = np.asarray(nbytes, dtype=np.int64)
        done = self.fabric.phase(m, m, nbytes, S.LOCAL_COPY)
        grain = np.broadcast_to(np.asarray(grain, dtype=np.int64), (n,))
        if np.all(grain == grain[0]):
            dur, runs = self._through_cores(m, me, me, nbytes, np.full(n, S.LOCAL_COPY), done, int(grain[0]))
        else:
            dur, runs = np.zeros(n), [None] * n
            for g in np.unique(grain):
                sel = grain == g
                d, r = self._through_cores(m, me, me, np.where(sel, nbytes, 0), np.full(n, S.LOCAL_COPY), done, int(g))
                dur[sel] = d[sel]
                runs = [r[i] if sel[i] else runs[i] for i in range(n)]
        return [("add", dur, runs, 2.0 * nbytes)]

    def _timed(self, op, algo, m, nbytes, root, itemsize) -> list:
        return self._timed_steps(m, S.schedule(op, algo, m.size, nbytes, root, itemsize, eager_bytes=self.eager_bytes))

    def _timed_steps(self, m: np.ndarray, steps: list, grains: list | None = None) -> list:
        """The timed steps of a schedule; ``grains[i]``: step i's row size when its transfers are
        rows, each its own transfer (``core_run``), 0 or None for bulk."""
        f, n = self.fabric, m.size
        out = []
        for j, step in enumerate(steps):
            if isinstance(step, S.Barrier):
                if n > 1:
                    out.append(("barrier", self._barrier(m)))
            elif isinstance(step, S.Mesh):
                done = f.phase(m[step.reader], m[step.owner], step.nbytes, step.kind)
                dur, runs = self._through_cores(m, step.reader, step.owner, step.nbytes, step.kind, done,
                                                grains[j] if grains else 0)
                out.append(("add", dur, runs, f.hbm_bytes(step.reader, step.owner, step.nbytes, step.kind, n)))
            elif isinstance(step, S.Local):
                out += self._timed_local(m, step.nbytes)
            elif isinstance(step, S.Ring):
                left = np.roll(m, 1)
                x, alpha = f.rates(m, left, np.ones(n, dtype=np.int64), S.LOAD)
                tier = f.tier_of(m, left)
                runs = self._ring_runs(np.asarray(step.nbytes, dtype=np.int64), tier, x)
                dur = runs.durations()
                # step s: i writes what it pulls from i-1, i-1's HBM is read for it
                hbm = step.nbytes + np.roll(step.nbytes, -1, axis=1)
                if step.local is not None:     # the own-block copy runs beside step 0's pull, on other cores' time
                    loc = self._timed_local(m, step.local)
                    if loc:
                        dur[0] = np.maximum(dur[0], loc[0][1])
                        hbm[0] = hbm[0] + loc[0][3]
                out.append(("ring", dur, f.flag_us(left, m), runs, hbm.astype(np.float64)))
            elif isinstance(step, S.RootWait):
                if n > 1:
                    lat = f.flag_us(m, np.full(n, m[step.root]))
                    lat[step.root] = 0.0
                    out.append(("rootwait", step.root, lat))
            elif isinstance(step, S.Shift):
                left, right = np.roll(m, 1), np.roll(m, -1)
                me = np.arange(n)
                nb = np.full(n, step.nbytes, dtype=np.int64)
                done = f.phase(m, left, nb, S.LOAD)
                dur, runs = self._through_cores(m, me, np.roll(me, 1), nb, np.full(n, S.LOAD), done)
                out.append(("shift", dur, f.flag_us(left, m), f.flag_us(right, m), runs, 2.0 * nb))
        return out

    def _ring_runs(self, nbytes: np.ndarray, tier: np.ndarray, share: np.ndarray) -> "RingRuns":
        """The core runs of a ring's steps: member i pulls ``nbytes[s, i]`` from its left
        neighbour over ``tier[i]`` at ``share[i]`` in step s. Members and steps that move the
        same bytes over the same tier at the same share run alike, so each distinct triple is
        timed once (a ring of N members has 2 (N - 1) steps: N^2 cells, a handful of shapes)."""
        steps, n = nbytes.shape
        # a member's class: its (tier, share); a cell's: its member's class and its byte count
        who, member = np.unique(np.stack([tier.astype(np.int64), np.asarray(share, dtype=np.float64).view(np.int64)],
                                         axis=1), axis=0, return_inverse=True)
        sizes, size = np.unique(nbytes, return_inverse=True)
        cells, index = np.unique(member.reshape(1, n) * sizes.size + size.reshape(steps, n), return_inverse=True)
        one = np.ones(1, dtype=np.int64)
        runs = []
        for cell in cells.tolist():
            (tr, sh), nb = who[cell // sizes.size], sizes[cell % sizes.size]
            runs.append(self.core_run(one, np.array([nb], dtype=np.int64), np.array([tr], dtype=np.int64),
                                      float(np.int64(sh).view(np.float64))) if nb > 0 else None)
        return RingRuns(index.reshape(steps, n).astype(np.int32), runs)

    def _barrier(self, m: np.ndarray) -> "FlagMesh":
        """Flag latencies of the full-mesh barrier among members ``m`` (one per member set)."""
        key = m.tobytes()
        got = self._barriers.get(key)
        if got is None:
            if len(self._barriers) >= _CACHE_LIMIT:
                self._barriers.clear()
            got = self._barriers[key] = FlagMesh.of(self.fabric, m)
        return got


@dataclasses.dataclass(frozen=True, eq=False)
class FlagMesh:
    """Flag latencies among a call's members: the full-mesh barrier's t_i = max over j of
    (t_j + latency of the tier between j and i), t_i itself for j = i.

    The tier of a pair is that of the innermost topology level whose block holds both, so the
    members j at one tier from i are those in i's block of that level but not in i's block of
    the level below. Kept as each member's block at every level (a few ints a member), the
    barrier is a max over blocks: O(N) a level instead of the N x N latency matrix, which every
    member would otherwise build and reduce on every synchronising call (O(N^3) a job)."""
    blocks: np.ndarray         # (levels + 1, members) int64: block index at each level; last row: all 0 (beyond)
    latency: np.ndarray        # (levels + 1,) flag latency from a member of that level's block (BandwidthSharing.flag_us)

    @classmethod
    def of(cls, f: BandwidthSharing, m: np.ndarray) -> "FlagMesh":
        rows = [np.unique(m // span, return_inverse=True)[1].reshape(-1) for span in f.spans]
        rows.append(np.zeros(m.size, dtype=np.int64))
        lat = np.append(f.latency[f.level_tier], f.latency[f.beyond]) + f.flag_extra
        return cls(np.array(rows, dtype=np.int64), lat)

    def after(self, t: np.ndarray) -> np.ndarray:
        """Every member's clock once it has seen every other member's flag, raised at ``t``."""
        t = np.asarray(t, dtype=np.float64)
        out = t.copy()
        inner = np.arange(t.size)                  # below the first level: each member alone
        for block, lat in zip(self.blocks, self.latency):
            # the latest clock of each inner block, and the best two of them in each block
            sub = np.full(int(inner.max()) + 1, -np.inf)
            np.maximum.at(sub, inner, t)
            parent = np.zeros(sub.size, dtype=np.int64)
            parent[inner] = block
            first = np.full(int(block.max()) + 1, -np.inf)
            np.maximum.at(first, parent, sub)
            top = sub == first[parent]
            ties = np.bincount(parent, weights=top, minlength=first.size)
            second = np.full(first.size, -np.inf)
            np.maximum.at(second, parent[~top], sub[~top])
            # the latest other inner block of i's block: the best, unless it is i's own alone
            alone = (sub[inner] == first[block]) & (ties[block] == 1)
            other = np.where(alone, second[block], first[block])
            out = np.maximum(out, other + lat)
            inner = block
        return out

    def matrix(self) -> np.ndarray:
        """[i, j]: the flag latency from member j to member i (0 on the diagonal)."""
        n = self.blocks.shape[1]
        level = np.full((n, n), self.latency.size - 1)
        for k in range(self.blocks.shape[0] - 1, -1, -1):
            same = self.blocks[k][:, None] == self.blocks[k][None, :]
            level[same] = k
        lat = self.latency[level]
        np.fill_diagonal(lat, 0.0)
        return lat


@dataclasses.dataclass(frozen=True)
class RingRuns:
    """The core runs of a ring's steps: ``at(s, i)`` is member i's in step s (None when it
    moves nothing), kept as one index per cell into the distinct runs."""
    index: np.ndarray          # (steps, members) int32 into runs
    runs: list

    def at(self, s: int, i: int):
        return self.runs[self.index[s, i]]

    def durations(self) -> np.ndarray:
        ends = np.array([r[0].end if r is not None else 0.0 for r in self.runs])
        return ends[self.index]


def advance(plan: list, clocks: np.ndarray) -> np.ndarray:
    """Every member's clock after a timed plan (``FabricModel.plan``, ``plan_exchange``) that
    they entered at ``clocks``."""
    t = clocks
    for step in plan:
        kind = step[0]
        if kind == "add":
            t = t + step[1]
        elif kind == "barrier":
            t = step[1].after(t)
        elif kind == "ring":
            dur, lat = step[1], step[2]
            end = t + dur[0]
            for s in range(1, dur.shape[0]):
                # pull mode: i reads i-1's step counter where i-1 keeps it, so seeing the flag
                # costs one access latency even when it was raised long ago
                end = np.maximum(end, np.roll(end, 1)) + lat + dur[s]
            t = end
        elif kind == "rootwait":
            root, lat = step[1], step[2]
            t = t.copy()
            t[root] = (t + lat).max()
        elif kind == "shift":
            dur, lat_in, lat_back = step[1:4]
            end = np.maximum(t, np.roll(t, 1)) + lat_in + dur
            t = np.maximum(end, np.roll(end, -1)) + lat_back
    return t


def model_call(model: FabricModel, op: str, algo: str, members, nbytes: int, clocks_in,
               extra_us=None, root: int = 0, itemsize: int = 1) -> np.ndarray:
    """Every member's modeled clock (us) after one call of ``op`` that they entered at ``clocks_in``.

    ``members``: global ranks of the communicator, in communicator order. ``nbytes``: bytes of
    each member's input buffer (all_gather: x; reduce_scatter: the N-chunk input; all_to_all: the
    N-block input; all_reduce, broadcast, sendrecv: the buffer). ``algo``: mesh, ring or auto
    (``choose_algo``); operators without a ring run the mesh. ``extra_us``: per-member cost added
    before the call (jit mappings made in it). ``root``: broadcast root (communicator index).
    ``itemsize``: element size, where chunks split. Deterministic; allocates no payload."""
    members = tuple(int(r) for r in np.asarray(members).reshape(-1))
    clocks = np.array(clocks_in, dtype=np.float64).reshape(-1)
    if clocks.size != len(members):
        raise ValueError(f"model_call: {clocks.size} clocks for {len(members)} members")
    if extra_us is not None:
        clocks = clocks + np.asarray(extra_us, dtype=np.float64)
    if algo == "auto":
        algo = choose_algo(model, op, members, nbytes, root, itemsize)
    return advance(model.plan(op, algo, members, int(nbytes), root, itemsize), clocks)


def model_exchange(model: FabricModel, members, phases: list[tuple[np.ndarray, int]], clocks_in,
                   extra_us=None, staging=None) -> np.ndarray:
    """Every member's modeled clock (us) after a call given by its traffic matrices
    (``_schedule.exchange``: per phase, B[i, j] bytes member i pulls from member j, and the
    transfer kind) that they entered at ``clocks_in``; ``extra_us`` as ``model_call``'s,
    ``staging`` as ``FabricModel.plan_exchange``'s."""
    members = tuple(int(r) for r in np.asarray(members).reshape(-1))
    clocks = np.array(clocks_in, dtype=np.float64).reshape(-1)
    if extra_us is not None:
        clocks = clocks + np.asarray(extra_us, dtype=np.float64)
    return advance(model.plan_exchange(members, phases, staging), clocks)


def model_send_recv(model: FabricModel, sender: int, receiver: int, nbytes: int, t_send: float,
                    t_recv: float) -> tuple[float, float]:
    """One send/recv pair (global ranks), pull mode as runtime/communicator/_p2p.py runs it: the sender's flag
    reaches the receiver, which pulls the bytes and flags back; returns (sender's, receiver's)
    clocks after the pair. ``sendrecv`` in ``model_call`` is the ring shift built from these."""
    f = model.fabric
    start = max(t_recv, t_send + float(f.flag_us(sender, receiver)))
    pair = np.array([receiver, sender], dtype=np.int64)
    nb = np.array([nbytes], dtype=np.int64)
    fab = f.phase(pair[:1], pair[1:], nb, S.LOAD)
    # the receiver's cores pull, as in every other call (member 0 = receiver, peer 1 = sender)
    dur, _ = model._through_cores(pair, np.zeros(1, np.int64), np.ones(1, np.int64), nb, np.full(1, S.LOAD), fab)
    done = start + float(dur[0])
    return max(t_send, done + float(f.flag_us(receiver, sender))), done


def choose_algo(model: FabricModel, op: str, members, nbytes: int, root: int = 0, itemsize: int = 1) -> str:
    """``auto``: the algorithm the model says finishes the call first (mesh on a tie, and for
    operators that have no ring). Costs two model evaluations the first time, a lookup after."""
    members = tuple(int(r) for r in np.asarray(members).reshape(-1))
    if op not in S.RING_OPS or len(members) < 2:
        return "mesh"
    key = (op, int(nbytes), members, int(root), int(itemsize))
    got = model._auto.get(key)
    if got is None:
        zero = np.zeros(len(members))
        t = {a: advance(model.plan(op, a, members, int(nbytes), root, itemsize), zero).max() for a in S.ALGOS}
        got = "ring" if t["ring"] < t["mesh"] else "mesh"
        if len(model._auto) >= _CACHE_LIMIT:
            model._auto.clear()
        model._auto[key] = got
    return got
