"""The launcher's side of a job split over emulated hosts (``stratacl-launch --emulate-hosts K``).

One machine plays K hosts. Every host gets its own copy of the control segment, and for each
rank of another host a mirror segment that stands for that rank's HBM on this host; a rank is
handed its host's copy, its own host's HBM segments and those mirrors, so it never maps a
segment of another host. One carrier process per host (jobs/_carrier.py), started through the
Open MPI wheel's mpirun, carries what crosses hosts at the world communicator's barriers.

The launcher stays the one supervisor of every rank, as on one host: a rank's death and the
job's failure it records in the rank's host's copy, from which that host's carrier tells the
others; a shutdown of the whole job (a signal, the deadline) it writes into every copy; a
rank's own words (its flight recorder) it reads from its host's copy (``HostControls``).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

from stratacl.runtime._control import Control
from stratacl.runtime._segments import create_named

from ._carrier import control_name, hosts_of, mirror_name

MPIRUN_FLAGS = ("--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,tcp", "--mca", "pml", "ob1",
                "--mca", "osc", "rdma")


def refusal(n: int, config) -> str | None:
    """Why a job of ``n`` ranks cannot run on ``config.emulate_hosts`` emulated hosts, or None."""
    k = config.emulate_hosts
    if k <= 1:
        return None
    if k > n:
        return f"--emulate-hosts {k}: more hosts than ranks ({n})"
    why = []
    if config.algo != "mesh":
        why.append(f"--algo {config.algo} (ring steps are not carried across hosts yet; use mesh)")
    if config.registration == "pool":
        why.append("--registration pool (a pool is mapped whole, too large to carry at every barrier)")
    if config.metadata_path != "direct":
        why.append("--metadata-path relay (one daemon cannot relay to several hosts' copies)")
    if why:
        return f"--emulate-hosts {k} does not run with " + "; ".join(why)
    if _mpirun() is None:
        return (f"--emulate-hosts {k} needs mpirun and mpi4py beside this Python "
                f"(pip install 'stratacl-emu[cluster]')")
    return None


def _mpirun() -> str | None:
    return shutil.which("mpirun", path=os.path.dirname(sys.executable))


class HostControls:
    """Every host's copy of the control segment, as one: writes go to every copy, a rank's own
    words are read from its host's copy, the header from host 0's."""

    def __init__(self, copies: list[Control], host_of: list[int]):
        self.copies, self.host_of = copies, host_of
        self.world, self.layout = copies[0].world, copies[0].layout

    def of(self, rank: int) -> Control:
        return self.copies[self.host_of[rank]]

    def set_pid(self, rank: int, pid: int) -> None:
        for c in self.copies:
            c.set_pid(rank, pid)

    def set_state(self, rank: int, state: int) -> None:
        self.of(rank).set_state(rank, state)

    def state(self, rank: int) -> int:
        return self.of(rank).state(rank)

    def record_failure(self, rank: int, kind: int, value: int) -> bool:
        # on the rank's host only: its carrier tells the others (jobs/_carrier.py, serve), as
        # it must between real hosts, where no launcher writes another host's copy
        return self.of(rank).record_failure(rank, kind, value)

    def record_shutdown(self, signum: int, kind: int | None = None) -> None:
        for c in self.copies:
            c.record_shutdown(signum) if kind is None else c.record_shutdown(signum, kind)

    def close(self) -> None:
        for c in self.copies[1:]:
            c.close()
        self.copies[0].close()


class EmulatedHosts:
    """The segments, descriptors and carriers of a job of ``n`` ranks on ``config.emulate_hosts``
    hosts, around host 0's control segment and the ranks' HBM segments (``create``)."""

    def __init__(self, job_id: str, n: int, config):
        self.job_id, self.n, self.config = job_id, n, config
        self.k = config.emulate_hosts
        self.host_of = hosts_of(n, self.k)
        self.ctl_fds: list[int] = []
        self.mirror_fds: dict[tuple[int, int], int] = {}
        self.hbm_fds: list[int] = []
        self.carriers: subprocess.Popen | None = None
        self._log = None

    def create(self, ctl_fd: int, hbm_fds: list[int]) -> HostControls:
        """Make the other hosts' control copies (headers as host 0's) and every mirror, all
        named for the carriers to open (the job's names go when it ends: resources.sweep)."""
        self.hbm_fds = hbm_fds
        self.ctl_fds = [ctl_fd]
        first = Control(ctl_fd, self.n)
        copies = [first]
        for g in range(1, self.k):
            fd = create_named(self.job_id, control_name(g), Control.size_for(self.n))
            self.ctl_fds.append(fd)
            c = Control(fd, self.n)
            c.u8[:4096] = first.u8[:4096]                # the header: job facts, written once
            copies.append(c)
        for g in range(self.k):
            for r in range(self.n):
                if self.host_of[r] != g:
                    self.mirror_fds[g, r] = create_named(self.job_id, mirror_name(g, r), self.config.hbm_size)
        return HostControls(copies, self.host_of)

    def fds(self) -> list[int]:
        """Every descriptor the ranks may be handed, besides host 0's control and the HBM."""
        return [*self.ctl_fds[1:], *self.mirror_fds.values()]

    def boot(self, rank: int) -> dict:
        """What rank ``rank``'s boot record names: its host's control copy, and for each rank the
        HBM segment (its own host's) or this host's mirror of it."""
        g = self.host_of[rank]
        return {"ctl": self.ctl_fds[g], "hosts": self.host_of,
                "hbm": [self.hbm_fds[r] if self.host_of[r] == g else self.mirror_fds[g, r] for r in range(self.n)]}

    def start_carriers(self, env: dict[str, str]) -> None:
        """One carrier per host, under mpirun (its output kept for a failure's report)."""
        chunk = self.config.chunk_size if self.config.allocator == "expandable" else 0
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        self._log = tempfile.TemporaryFile()
        env = {k: v for k, v in env.items() if not k.startswith(("OMPI_", "PMIX_"))}
        self.carriers = subprocess.Popen(
            [_mpirun(), *root, *MPIRUN_FLAGS, "-n", str(self.k), sys.executable, "-P", "-m", "stratacl.jobs._carrier",
             self.job_id, str(self.n), str(self.k), str(chunk)],
            env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def failed(self) -> str | None:
        """What the carriers printed, if they ended while the job runs; None while they run."""
        if self.carriers is None or self.carriers.poll() is None:
            return None
        self._log.seek(0)
        tail = self._log.read()[-1500:].decode(errors="replace").strip()
        return f"the hosts' carriers ended (mpirun exit {self.carriers.returncode}): {tail}"

    def close(self) -> None:
        if self.carriers is not None and self.carriers.poll() is None:
            os.killpg(self.carriers.pid, signal.SIGTERM)
            try:
                self.carriers.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.carriers.pid, signal.SIGKILL)
                self.carriers.wait()
        if self._log is not None:
            self._log.close()
        for fd in [*self.ctl_fds[1:], *self.mirror_fds.values()]:
            os.close(fd)
        self.ctl_fds, self.mirror_fds = self.ctl_fds[:1], {}
