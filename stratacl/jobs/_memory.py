"""Host memory around a job: a warning before the ranks start, the ranks' footprint while they
run, and whether a rank's SIGKILL was probably the kernel's OOM killer.

    before the ranks start   short_memory_warning()   N x RANK_FOOTPRINT vs MemAvailable
    while they run           MemoryWatch.sample()     every SAMPLE_EVERY s: each rank's private
                                                      memory (/proc/PID/statm), the HBM pages the
                                                      job touched (fstat of its segments), and
                                                      MemAvailable; peaks kept
    when the job ends        MemoryWatch.report()     how far the OOM kill counters rose
    in the root-cause block  oom_verdict() + memory_lines()

The OOM killer's SIGKILL looks like any other; what tells it apart is the kernel's count of OOM
kills (``oom_kill`` in /proc/vmstat, and in the job's cgroup: ``memory.events`` under cgroup v2,
``memory.oom_control`` under v1) rising during the job, or, failing that, MemAvailable seen low.
Reading these is cheap: counters, no page-table walks, so sampling hundreds of ranks once a
second costs a few milliseconds.

Test hook: ``STRATACL_TEST_HOST_MEMORY=DIR`` makes the launcher read ``DIR/meminfo`` and
``DIR/vmstat`` instead of /proc's, and no cgroup counter, so tests can fake a short host or an
OOM kill without exhausting memory.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import time

# a rank's own memory once stratacl.init() has returned, before the program allocates anything:
# Python, numpy and the library (RssAnon 20.4 MiB, USS 23 MiB on CPython 3.12 / numpy 2, x86-64),
# rounded up. A program importing more (torch: some 300 MiB) needs more; this is the floor.
RANK_FOOTPRINT = 24 * 1024**2
SAMPLE_EVERY = 1.0          # seconds between samples of the ranks' memory
LOW_MEMORY = 0.05           # MemAvailable below this share of MemTotal: memory was short
TEST_HOOK = "STRATACL_TEST_HOST_MEMORY"

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _proc_file(name: str) -> str:
    fake = os.environ.get(TEST_HOOK)
    return os.path.join(fake, name) if fake else f"/proc/{name}"


def read_meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes: MemTotal, MemAvailable, ... ({} if unreadable)."""
    out = {}
    try:
        with open(_proc_file("meminfo")) as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return out


def _counter(path: str, key: str = "oom_kill") -> int | None:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


def _cgroup_counter_file() -> str | None:
    """The OOM kill counter of this process's memory cgroup, v2 or v1, if it can be read."""
    candidates = []
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    candidates.append(f"/sys/fs/cgroup{path.rstrip('/')}/memory.events")
                elif "memory" in controllers.split(","):
                    candidates.append(f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.oom_control")
    except (OSError, ValueError):
        pass
    # inside a container the cgroup's own directory is often mounted at the root
    candidates += ["/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"]
    return next((p for p in candidates if _counter(p) is not None), None)


def oom_counters() -> dict[str, int]:
    """The kernel's OOM kill counts: name -> count, for the ones this host exposes."""
    out = {}
    host = _counter(_proc_file("vmstat"))
    if host is not None:
        out["/proc/vmstat oom_kill"] = host
    if not os.environ.get(TEST_HOOK):
        path = _cgroup_counter_file()
        value = _counter(path) if path else None
        if value is not None:
            out[f"{path} oom_kill"] = value
    return out


def human_size(n: float) -> str:
    """Bytes as a short human size: '512 KiB', '23.4 MiB', '1.5 GiB'."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def short_memory_warning(nranks: int, meminfo: dict[str, int] | None = None) -> str | None:
    """The warning printed before starting ``nranks`` ranks that would not fit, or None."""
    meminfo = read_meminfo() if meminfo is None else meminfo
    available = meminfo.get("MemAvailable")
    need = nranks * RANK_FOOTPRINT
    if available is None or need <= available:
        return None
    return (f"stratacl-launch: warning: {nranks} ranks need at least {human_size(need)} "
            f"({nranks} x {human_size(RANK_FOOTPRINT)}, a rank's own memory after stratacl.init()), but the host "
            f"has {human_size(available)} available (MemAvailable): the kernel's OOM killer may end ranks; "
            f"run fewer ranks or free memory")


@dataclasses.dataclass
class MemoryReport:
    """What the launcher saw of memory during a job."""
    oom_kills: dict[str, int]               # counter -> how far it rose during the job
    min_available: int | None               # lowest MemAvailable sampled, bytes
    total: int | None                       # MemTotal, bytes
    peak_held: int = 0                      # highest (private of all ranks + HBM touched) sampled
    peak_private: int = 0                   # highest private of all ranks sampled
    peak_hbm: int = 0                       # most HBM touched sampled (ranks forked from the template
                                            # hold their private part from the start, their HBM later)
    last_private: dict[int, int] = dataclasses.field(default_factory=dict)   # rank -> last sample


def oom_verdict(returncode: int | None, killed_by_launcher: bool, oom_kills: dict[str, int],
                min_available: int | None, total: int | None) -> str | None:
    """Why a rank's end was probably the kernel's OOM killer, or None when it was not.

    Only a SIGKILL the launcher did not send qualifies; then a rise of an OOM kill counter
    during the job decides, or else MemAvailable seen below ``LOW_MEMORY`` of MemTotal."""
    if returncode != -signal.SIGKILL or killed_by_launcher:
        return None
    risen = {name: n for name, n in oom_kills.items() if n > 0}
    if risen:
        return "; ".join(f"the OOM kill count rose by {n} during the job ({name})"
                         for name, n in risen.items())
    if min_available is not None and total and min_available < LOW_MEMORY * total:
        return (f"memory was short: MemAvailable fell to {human_size(min_available)} of {human_size(total)} "
                f"during the job")
    return None


def memory_lines(rank: int, returncode: int | None, killed_by_launcher: bool,
                 report: MemoryReport | None) -> list[str]:
    """The root-cause block's lines on memory for the failed ``rank`` (none unless OOM is likely)."""
    if report is None:
        return []
    why = oom_verdict(returncode, killed_by_launcher, report.oom_kills, report.min_available, report.total)
    if why is None:
        return []
    lines = [f"  probably  : killed by the kernel's OOM killer: {why}"]
    if report.peak_held:
        lines.append(f"  memory    : the ranks held up to {human_size(report.peak_held)} "
                     f"(at most {human_size(report.peak_private)} private, {human_size(report.peak_hbm)} of HBM "
                     f"touched; sampled every {SAMPLE_EVERY:g} s)")
    if rank in report.last_private:
        lines.append(f"              rank {rank} held {human_size(report.last_private[rank])} private when last sampled")
    return lines


def _private(pid: int) -> int | None:
    """A process's private resident memory (RssAnon: resident - shared), None if it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class MemoryWatch:
    """Samples a job's memory at a low rate; the counters' baseline is read at construction,
    before any rank starts."""

    def __init__(self):
        self._baseline = oom_counters()
        info = read_meminfo()
        self._total = info.get("MemTotal")
        self._min_available = info.get("MemAvailable")
        self._next = 0.0
        self._report = MemoryReport({}, self._min_available, self._total)

    def due(self, now: float) -> bool:
        """Whether ``SAMPLE_EVERY`` s have passed since the last sample."""
        return now >= self._next

    def note(self, rank: int, pid: int) -> None:
        """A rank just started: its first sample, so that a rank which dies before the next
        periodic sample still has one."""
        mine = _private(pid)
        if mine is not None:
            self._report.last_private[rank] = mine

    def sample(self, pids: dict[int, int], hbm_fds: list[int]) -> None:
        """Read each live rank's private memory (rank -> pid), the HBM touched, MemAvailable."""
        self._next = time.monotonic() + SAMPLE_EVERY
        rep = self._report
        private = 0
        for rank, pid in pids.items():
            mine = _private(pid)
            if mine is None:
                continue
            rep.last_private[rank] = mine
            private += mine
        hbm = 0
        for fd in hbm_fds:
            try:
                hbm += os.fstat(fd).st_blocks * 512
            except OSError:
                pass
        rep.peak_held = max(rep.peak_held, private + hbm)
        rep.peak_private = max(rep.peak_private, private)
        rep.peak_hbm = max(rep.peak_hbm, hbm)
        available = read_meminfo().get("MemAvailable")
        if available is not None and (rep.min_available is None or available < rep.min_available):
            rep.min_available = available

    def report(self) -> MemoryReport:
        """The report, with how far each OOM kill counter rose since construction."""
        now = oom_counters()
        self._report.oom_kills = {name: now[name] - before for name, before in self._baseline.items()
                                  if name in now}
        return self._report
