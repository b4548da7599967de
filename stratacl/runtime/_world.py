"""Joining a job: the per-process runtime behind ``stratacl.init()``.

``init`` reads what the launcher handed over (the job id, this rank, the control segment and
every rank's HBM segment as inherited descriptors), reserves the shared address window,
starts the registration thread and builds the world communicator. Run without the launcher it
makes a one-rank job of its own. Nothing happens at import time.
"""
from __future__ import annotations

import array
import atexit
import json
import logging
import os
import threading
import time
import weakref
from typing import Any

import numpy as np

from .._config import Config, check_environment
from .._errors import BootstrapError, CommTimeout, ConfigError, NotInitialized, OutOfMemory, TooManyCommunicators
from .._operators import names
from ..sdma import paths_of
from ..ub import FabricModel, Profiler, RankClock, activate_mappings, load_topology, write_chrome_trace
from . import _native
from .communicator import Communicator
from .hosts import HostMap, foreign
from .memory import (
    CachingAllocator, ExpandableAllocator, Hbm, RegistrationUnit, ShadowWindow, array_extent, array_from_block,
    new_job_id, round_up,
)
from .pipeline import EAGER_BYTES, SharedPlans
from .services import (
    COMM_SLOTS, FAILED_CARRIER, H_HBM_SIZE, H_MAGIC, H_SLICE, H_VA_BASE, MAGIC, SLICE, STATE_FINALIZED, STATE_RUNNING,
    Control, JobHealth, Mailbox, Trace,
)

# the operations whose completed calls the native methods count in Runtime.native_calls
NATIVE_CALLS = names(native=True)

log = logging.getLogger("stratacl")


class _RankFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


IN_FLIGHT_LIMIT = 1024      # asynchronous operations kept for charge_compute's overlap (Runtime.track)


class Runtime:
    def __init__(self, rank: int, world: int, job_id: str, config: Config, ctl: Control, hbm_fds: list[int],
                 host_of: list[int] | None = None):
        self.rank, self.world, self.job_id, self.config, self.ctl = rank, world, job_id, config, ctl
        # a job spanning hosts: hbm_fds of another host's ranks are this host's mirrors of them
        self.hosts = HostMap(rank, world, host_of, ctl.base, ctl.layout.region(rank), hbm_fds)
        if self.hosts.spanned:
            ctl.ring_carrier_on_announcements()
        if config.trace and config.clock != "virtual":
            raise ConfigError(f"trace={config.trace!r} records calls in modeled time: it needs --clock virtual "
                              f"(STRATACL_CLOCK=virtual), not {config.clock!r}")
        if _native.load_u64(ctl.base + H_MAGIC) != MAGIC:
            raise BootstrapError(f"rank {rank}: the control segment of job {job_id} is not initialised")
        self.topology = load_topology(config.topology)
        self.health = JobHealth(ctl, rank)
        ctl.count_sleepers()
        self.window = ShadowWindow(ctl.header(H_VA_BASE), world, ctl.header(H_SLICE))
        capacity = ctl.header(H_HBM_SIZE)
        # staged: communication buffers are ordinary allocations, registered on allocation
        mode = "roa" if config.registration == "staged" else config.registration
        # a pre-registered pool has static mappings: only the caching allocator fits in it
        expandable = config.allocator == "expandable" and config.registration != "pool"
        chunk = config.chunk_size if expandable else 0
        table_offset = 0
        if expandable:
            # the chunk table peers read sits at the end of the HBM segment, out of the allocator's reach
            table_offset = RegistrationUnit.table_offset(capacity, self.window.slice_bytes, chunk)
            if table_offset < chunk:
                raise BootstrapError(f"rank {rank}: HBM of {capacity} B holds no chunk of {chunk} B besides the "
                                     f"chunk table; lower STRATACL_CHUNK_SIZE or raise STRATACL_HBM_SIZE")
        self.reg = RegistrationUnit(rank, world, ctl, Mailbox(ctl, rank), self.window, hbm_fds, mode,
                                    config.metadata_path, self.health.check, config.timeout,
                                    self.own_segment, chunk, table_offset)
        self.reg.remote = self.hosts.remote()
        pool_va = None
        if config.registration == "pool":
            pool = round_up(config.pool_size or capacity)
            if pool > capacity:
                raise BootstrapError(f"pool size {pool} exceeds the HBM capacity {capacity}")
            self.reg.map_pools(pool)
            capacity, pool_va = pool, self.window.slice_start(rank)
        if expandable:
            self.hbm = Hbm(rank, hbm_fds[rank], table_offset, chunk)
            table = RegistrationUnit.table_bytes(self.window.slice_bytes, chunk)
            try:        # written as chunks are mapped: its pages too are reserved before
                self.hbm.reserve(table_offset, table, carved=False)
            except OutOfMemory as e:
                raise OutOfMemory(f"rank {rank}: out of memory reserving the chunk table ({table} B at the end "
                                  f"of the HBM segment): {e}") from None
            self.allocator = ExpandableAllocator(rank, self.window, self.hbm, self.reg, chunk)
        else:
            self.hbm = Hbm(rank, hbm_fds[rank], capacity)
            self.allocator = CachingAllocator(rank, self.window, self.hbm, self.reg, pool_va)
        self.reg.hbm = self.hbm
        self.stats: dict[str, Any] = dict(calls={}, bytes_staged=0, staged_calls=0, bytes_eager=0)
        # calls completed by the native methods, one int64 word per NATIVE_CALLS name, added to
        # stats()["calls"]: a count in the dict is a new int object per call
        self.native_calls = array.array("q", bytes(8 * len(NATIVE_CALLS)))
        self.byte_counters: list = []    # one collectives._backend.Counters per communicator
        self._model = None
        self._path_models: dict = {}
        # the modeled clock: asked for (--clock), or needed by the profiler (its timelines are
        # modeled time); comm.clock() answers only in the first case
        modeled = config.clock if config.clock != "off" else "virtual"
        self.clock = (RankClock(self.topology, config.registration, modeled, config.dilation, EAGER_BYTES)
                      if config.clock != "off" or config.profile else None)
        # the ranks of a launched job time each call's shape once between them (runtime/pipeline/_plans.py)
        self.plans = SharedPlans(job_id) if world > 1 else None
        if self.clock is not None:
            self.clock.model.shared = self.plans
        self.profiler = Profiler(rank) if config.profile else None
        # what ub.replay needs to rebuild this rank's fabric model (runtime/services/_trace.py)
        self.trace = (Trace(rank, world, dict(topology=config.topology, registration=config.registration, algo=config.algo,
                                              cores=config.cores, comm_cores=config.comm_cores,
                                              partition=config.partition, path=paths_of(config.path)[0],
                                              eager_bytes=EAGER_BYTES))
                      if config.trace else None)
        self.workers: list = []          # asynchronous-operation threads of this rank's communicators
        self.communicators: weakref.WeakSet = weakref.WeakSet()   # every one made here, for close()
        self.in_flight: list = []        # asynchronous operations under a modeled clock, for charge_compute
        self.sdma = None                 # the SDMA engine (--path sdma), started on first use
        self.host = None                 # the channel to host memory (communicator/_hostrows.py), made on first use
        self._next_slot = 1
        self._slot_lock = threading.Lock()
        ctl.set_pid(rank, os.getpid())
        self.reg.start()
        ctl.set_state(rank, STATE_RUNNING)
        self.world_comm = Communicator(self, list(range(world)), [0] * world)

    def native_call_word(self, operation: str) -> int:
        """The address of ``operation``'s word in ``native_calls``."""
        return _native.data_address(self.native_calls) + 8 * NATIVE_CALLS.index(operation)

    @property
    def model(self) -> FabricModel:
        """The fabric model (for the modeled clock and ``--algo auto``), built on first use."""
        if self.clock is not None:
            return self.clock.model
        if self._model is None:
            self._model = FabricModel(self.topology, self.config.registration, eager_bytes=EAGER_BYTES)
            self._model.shared = self.plans
        return self._model

    def model_for(self, path: str) -> FabricModel:
        """The fabric model of calls on ``path`` (mte | sdma): ``model``, or its sibling that
        differs only in the path, for calls made with a ``path=`` other than the setting."""
        m = self.model
        if path == m.path:
            return m
        got = self._path_models.get(path)
        if got is None:
            got = self._path_models[path] = m.with_path(path)
        return got

    def track(self, work) -> None:
        """Keep an asynchronous operation for ``in_flight_occupancy`` while it may still overlap compute:
        until it has completed and ended before the program's clock. A program that never waits
        nor charges compute keeps its clock still, so at most IN_FLIGHT_LIMIT are kept (the
        oldest completed ones go first)."""
        now = self.clock.now_us
        keep = [w for w in self.in_flight if not (w.is_completed() and (w.modeled is None or w.modeled[1] <= now))]
        if len(keep) >= IN_FLIGHT_LIMIT:
            done = [w for w in keep if w.is_completed()]
            drop = set(map(id, done[:len(keep) - IN_FLIGHT_LIMIT + 1]))
            keep = [w for w in keep if id(w) not in drop]
        keep.append(work)
        self.in_flight[:] = keep

    def in_flight_occupancy(self, t0: float, operation: str) -> list:
        """What this rank's asynchronous operations that end after modeled time ``t0`` do to its
        cores and HBM: their (model, timed plan, members, entering clocks, this member), as
        ub._compute.kernel_end takes them; waits until each has completed (its modeled times
        are known then), within the timeout."""
        calls, keep = [], []
        deadline = time.monotonic() + self.config.timeout
        for work in self.in_flight:
            while not work._done.wait(SLICE):
                self.health.check(operation, [])
                if time.monotonic() > deadline:
                    raise CommTimeout(f"{operation}: rank {self.rank}: {work!r} did not complete within "
                                      f"{self.config.timeout:g} s", operation)
            if work.modeled is None or work.modeled[1] <= t0:
                continue               # failed, or over before t0
            keep.append(work)
            calls += work.modeled[2]
        self.in_flight[:] = keep
        return calls

    def reserve_slot(self) -> int:
        with self._slot_lock:
            if self._next_slot >= COMM_SLOTS:
                raise TooManyCommunicators(
                    f"split: rank {self.rank} has used all {COMM_SLOTS} of its communicator slots (a "
                    f"communicator keeps its slot until the job ends); split once and reuse the "
                    f"sub-communicators rather than splitting again")
            self._next_slot += 1
            return self._next_slot - 1

    def release_slot(self, slot: int) -> None:
        """Give back a slot ``reserve_slot`` returned, for a split that failed: the last one
        reserved, as a failed split's is unless another communicator split meanwhile."""
        with self._slot_lock:
            if slot == self._next_slot - 1:
                self._next_slot -= 1

    def own_segment(self, addr: int, nbytes: int):
        """What descriptors name for [addr, addr + nbytes) of this rank's HBM (a segment, a chunk
        or a run of chunks), or None if the range is not in this rank's mapped HBM."""
        if self.window.owner(addr) != self.rank:
            return None
        return self.allocator.registration_of(addr, nbytes)

    def empty(self, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            # peers would read pointers into this process; numpy would own references it never took
            raise TypeError(f"empty: HBM arrays hold plain data, not Python objects (dtype {dtype})")
        shape, nbytes = array_extent(shape, dtype, "empty")
        block = self.allocator.malloc(nbytes)
        return array_from_block(self.allocator, block, shape, dtype)

    def close(self) -> None:
        for w in self.workers:
            w.stop(self.config.timeout)
        for comm in list(self.communicators):
            comm._shut()
        if self.sdma is not None:
            self.sdma.stop(self.config.timeout)
        if self.profiler is not None:
            path = write_chrome_trace(os.path.join(self.config.profile, f"rank{self.rank}.json"), [self.profiler])
            log.info("rank %d: profile written to %s", self.rank, path)
        if self.trace is not None:
            path = self.trace.write(self.config.trace, self.clock.now_us)
            log.info("rank %d: trace written to %s", self.rank, path)
        self.reg.stop()
        self.ctl.set_state(self.rank, STATE_FINALIZED)


_RUNTIME: Runtime | None = None
_LOCK = threading.Lock()
# this process's carrier, when it is the first rank of a host in a job mpirun started over
# hosts (runtime/hosts/_foreign.py): it ends once every rank of every host has; finalize waits for it
_CARRIER = None


def runtime() -> Runtime:
    """This process's runtime (the rank's HBM, window, registration unit, settings); raises
    NotInitialized before ``init()`` and after ``finalize()``."""
    if _RUNTIME is None:
        raise NotInitialized("stratacl is not initialised in this process: call stratacl.init() first")
    return _RUNTIME


def is_initialized() -> bool:
    """True between ``init()`` and ``finalize()`` in this process. Local, never blocks."""
    return _RUNTIME is not None


def init(**settings: Any) -> Communicator:
    """Join the job (or start a one-rank job) and return the world communicator. Idempotent."""
    global _RUNTIME
    with _LOCK:
        if _RUNTIME is not None:
            return _RUNTIME.world_comm
        check_environment()
        config = Config(**settings)
        boot = os.environ.get("STRATACL_BOOT")
        launch = None
        host_of = None
        if boot:
            info = json.loads(boot)
            rank, world = int(os.environ["STRATACL_RANK"]), int(os.environ["STRATACL_WORLD_SIZE"])
            job_id = os.environ["STRATACL_JOB_ID"]
            ctl = Control(info["ctl"], world)
            hbm_fds = list(info["hbm"])
            host_of = info.get("hosts")
        elif (launch := foreign.detect()) is not None:
            # torchrun or mpirun started this process: the ranks on the host meet by name
            rank, world = launch.rank, launch.world
            joined = foreign.join(launch, config)
            job_id, hbm_fds, host_of = joined.job_id, joined.hbm_fds, joined.host_of
            ctl = Control(joined.ctl_fd, world)
            ctl.set_pid(rank, os.getpid())      # the host's daemon watches the rank from here on
            foreign.failure_reported_by(lambda ctl=ctl: ctl.failure() is not None, config.grace)
            if joined.carriers is not None:
                # the first rank of a host under mpirun carries the host's part across hosts
                from .hosts import CarrierThread
                global _CARRIER
                try:
                    _CARRIER = CarrierThread(joined.carriers, host_of, ctl, hbm_fds, config, until_done=True)
                except BaseException:
                    # the host's other ranks wait for this carrier: they are told it failed
                    ctl.record_shutdown(host_of[rank], FAILED_CARRIER)
                    raise
        else:
            rank, world, job_id = 0, 1, new_job_id()
            ctl, hbm_fds = _standalone(job_id, config)
        _setup_logging(rank, config.debug)
        rt = Runtime(rank, world, job_id, config, ctl, hbm_fds, host_of)
        _RUNTIME = rt
        activate_mappings(rt.reg)
        atexit.register(finalize)
    log.info("rank %d of %d joined job %s (registration=%s, metadata=%s)", rank, world, job_id,
             config.registration, config.metadata_path)
    rt.world_comm.barrier()
    if launch is not None:
        foreign.joined(job_id, world, joined.created)
    if rt.clock is not None:
        rt.clock.anchor()
    return rt.world_comm


def _standalone(job_id: str, config: Config) -> tuple[Control, list[int]]:
    """A one-rank job without the launcher: same segments, unlinked as soon as they exist."""
    # imported here: a rank of a launched job inherits its segments and never needs posix_ipc
    from .memory import create_job_segments
    ctl_fd, hbm_fds = create_job_segments(job_id, 1, config)
    return Control(ctl_fd, 1), hbm_fds


def _setup_logging(rank: int, level: str) -> None:
    if level == "off":
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[rank %(rank)s] %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_RankFilter(rank))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if level == "detail" else logging.INFO)


def finalize() -> None:
    """Leave the job: stop background threads and mark this rank finalized. Not collective.

    Arrays in HBM stay readable until the process exits; no further operation may be issued:
    every communicator's operations raise NotInitialized from then on.
    """
    global _RUNTIME
    with _LOCK:
        rt, _RUNTIME = _RUNTIME, None
        activate_mappings(None)
    if rt is not None:
        rt.close()
        global _CARRIER
        carrier, _CARRIER = _CARRIER, None
        if carrier is not None and not carrier.join(rt.config.timeout + 2 * rt.config.grace + 10):
            log.warning("the host's carrier did not end within the timeout; leaving it")

