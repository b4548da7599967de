"""How a job ended (``JobOutcome``, one ``RankEnd`` per rank), and the root-cause block the
launchers print when it failed (``format_failure``): jobs/_supervisor.py fills them in."""
from __future__ import annotations

import dataclasses
import signal

from stratacl.runtime.services import flight

from ._memory import MemoryReport, memory_lines


@dataclasses.dataclass
class RankEnd:
    rank: int
    pid: int
    returncode: int | None = None
    ended_at: float | None = None
    error: dict | None = None
    result: bytes | None = None
    killed_by_launcher: bool = False
    hung_at: float | None = None    # when the launcher found it hung after its peers finished (_supervise)
    hung: str = ""                  # why, in words, with its newest call
    unfinalized: bool = False       # exit code 0 after init() without finalize(): a failure

    @property
    def failed(self) -> bool:
        return (self.returncode not in (0, None) or self.error is not None or self.hung_at is not None
                or self.unfinalized)

    def how(self) -> str:
        if self.returncode is None:
            return "still running"
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"killed by {name}" + (" (sent by the launcher)" if self.killed_by_launcher else "")
        if self.unfinalized:
            return ("exit code 0 without stratacl.finalize(): the process ended in the middle of the job "
                    "(os._exit(0)?); its peers cannot complete a call with it")
        return f"exit code {self.returncode}"


@dataclasses.dataclass
class JobOutcome:
    job_id: str
    ranks: list[RankEnd]
    reason: str = ""            # '' | 'failure' | 'signal' | 'deadline' | 'daemon' | 'carrier'
    signal: int = 0             # the signal the launcher got; 'daemon': the daemon's returncode
    shutdown_at: float | None = None    # when the launcher began ending the ranks still running
    flight: dict | None = None          # a failed job's flight records, rank -> [FlightEntry] (services/_flight.py)
    flight_read_at: float = 0.0         # time.monotonic() when they were read
    memory: MemoryReport | None = None  # the ranks' memory and the OOM kill counters (_memory.py)
    part: str = ""                      # a job over hosts: which part this launcher ran (_hostjob.py)
    carrier: str = ""                   # 'carrier': how this host's carrier failed

    @property
    def ok(self) -> bool:
        return not self.reason and all(r.returncode == 0 and not r.failed for r in self.ranks)

    @property
    def root_cause(self) -> RankEnd | None:
        """The first rank that failed on its own; None when the launcher ended every failed rank
        (a signal to the launcher, or the deadline)."""
        def on_its_own(r: RankEnd) -> bool:
            # a rank that ended, or reported an error, once the launcher had begun ending the
            # job failed because of the shutdown, not before it
            t = _failed_at(r)
            return r.failed and (self.shutdown_at is None or (t is not None and t <= self.shutdown_at))

        failed = [r for r in self.ranks if on_its_own(r)]
        if not failed:
            return None
        # a rank whose error blames another rank that failed too (its peer rejected its
        # arguments, died, or never arrived) is a victim, however early it reported: the root
        # cause is the first rank that blames no other failed rank, if there is one
        ranks = {r.rank for r in failed}
        culprits = [r for r in failed if not (set((r.error or {}).get("blames", ())) - {r.rank}) & ranks]
        return min(culprits or failed, key=lambda r: _failed_at(r) or float("inf"))

    @property
    def exit_code(self) -> int:
        if self.ok:
            return 0
        if self.reason == "signal":
            return 128 + self.signal
        if self.reason == "deadline":
            return 124
        if self.reason == "carrier":        # no call across hosts could complete: the ranks'
            return 1                        # own exit codes are its consequence
        root = self.root_cause
        if root is not None and root.returncode and root.returncode > 0:
            return root.returncode
        return 1


def _failed_at(r: RankEnd) -> float | None:
    """When ``r`` failed: its error's time, the launcher's finding it hung, or its end."""
    if r.error is not None:
        return r.error.get("time", r.ended_at)
    return r.hung_at if r.hung_at is not None else r.ended_at


def format_failure(outcome: JobOutcome) -> str:
    """The root-cause block printed when a job fails."""
    bar = "=" * 72
    lines = [bar, f"stratacl-launch: job {outcome.job_id} failed"]
    if outcome.part:
        lines.append(f"  {outcome.part}")
    if outcome.reason == "signal":
        lines.append(f"  the launcher received {signal.Signals(outcome.signal).name} and shut the job down")
    elif outcome.reason == "deadline":
        lines.append("  the job ran past its deadline (--deadline / STRATACL_DEADLINE) and was ended")
    elif outcome.reason == "carrier" and outcome.carrier.startswith("HostLost: "):
        lines.append(f"  {outcome.carrier[len('HostLost: '):]}, so the job was ended on this host")
    elif outcome.reason == "carrier":
        lines.append(f"  this host's carrier (its path to the other hosts) failed, so the job was ended: "
                     f"{outcome.carrier}")
    elif outcome.reason == "daemon":
        how = RankEnd(-1, 0, outcome.signal).how()
        lines.append(f"  its bootstrap daemon ended ({how}) while the ranks ran; without it nothing cleans up "
                     f"after a launcher that dies, so the job was ended")
    root = outcome.root_cause
    if root is not None:
        lines += ["Root cause (first failure):",
                  f"  rank      : {root.rank} (pid {root.pid})",
                  f"  ended by  : {root.how()}"]
        if root.hung:
            lines.append(f"  hung      : {root.hung}")
        lines += memory_lines(root.rank, root.returncode, root.killed_by_launcher, outcome.memory)
        if root.error:
            lines.append(f"  error     : {root.error['type']}: {root.error['message']}")
            lines.append("  traceback :")
            lines += ["    " + ln for ln in root.error["traceback"].rstrip().splitlines()]
        elif root.hung:
            lines.append("  traceback : (none: the launcher ended it while it hung)")
        elif root.unfinalized:
            lines.append("  traceback : (none: it raised nothing; call stratacl.finalize() before the process ends)")
        else:
            lines.append("  traceback : (none: the process did not get to report one)")
    others = [r for r in outcome.ranks if r.failed and r is not root]
    if others:
        lines.append("Other ranks:" if root is not None else "Ranks:")
        for r in others:
            msg = f": {r.error['type']}: {r.error['message'].splitlines()[0] if r.error['message'] else ''}" \
                if r.error else ""
            lines.append(f"  rank {r.rank}: {r.how()}{msg}")
    lines += _flight_lines(outcome)
    lines.append(bar)
    return "\n".join(lines)


def _flight_lines(outcome: JobOutcome) -> list[str]:
    """The flight recorder's part of the root-cause block: each rank's newest call
    and its state, then the ranks behind the others or in another operation."""
    records = outcome.flight or {}
    if not any(records.values()):
        return []
    lines = ["Flight recorder (each rank's newest call):"]
    for rank, recs in sorted(records.items()):
        lines.append(f"  rank {rank}: " + (recs[-1].describe(outcome.flight_read_at) if recs else "no call"))
    odd = flight.stragglers(records, len(outcome.ranks))
    if odd:
        lines.append("  so:")
        lines += [f"  - {line}" for line in odd]
    return lines
