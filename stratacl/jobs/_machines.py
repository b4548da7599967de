"""Emulated machines on one host: ``--emulate-hosts K`` runs each host in namespaces of its own.

    stratacl-launch (this machine's namespaces, untouched)
      |-- head holder   net namespace: bridge br0, 10.250.255.254/16 ---- mpirun runs here
      |-- host 0 holder net, IPC, mount, UTS namespaces: lo, eth0 10.250.0.1/16, its own /dev/shm
      |-- host 1 holder ...                           eth0 10.250.0.2/16
      (eth0 of each host is a veth pair whose other end is h<g> on the head's bridge)

A *holder* is ``unshare ... sh -c '...; exec cat'``: it makes the namespaces, mounts a private
tmpfs on ``/dev/shm`` (after making every mount private, so nothing propagates back), brings up
its loopback, and then waits on a pipe from the launcher. mpirun runs in the head's network
namespace, as on a login node, and starts each host's launcher through its remote-launch agent,
``python -m stratacl.jobs._machines agent ADDRESS=PID,... ADDRESS CMD``, which enters the
namespaces of the host at ADDRESS (PID: its holder) with ``nsenter`` as ssh would enter a machine.

Every address lives in namespaces the job made; the machine's own namespaces gain nothing. The
kernel removes a namespace, its links and its mounts when its last process ends: ``close`` ends
the holders and any process still inside a host (a pipe that reaches EOF ends them too, when
the launcher itself is killed).
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time

NETWORK = ipaddress.ip_network("10.250.0.0/16")    # inside the job's own namespaces only
_TOOLS = ("unshare", "nsenter", "ip", "mount")


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root"
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        return f"no {', '.join(missing)} on PATH"
    return None


def _holder(script: str, *flags: str) -> subprocess.Popen:
    p = subprocess.Popen(["unshare", *flags, "--", "sh", "-c", f"{script} && echo ready && exec cat"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if line.strip() != "ready":
        p.stdin.close()
        p.wait()
        raise OSError(p.stderr.read().strip() or f"unshare {' '.join(flags)} failed")
    return p


def _ip(pid: int, commands: list[str]) -> None:
    run = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-batch", "-"], input="\n".join(commands),
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise OSError(f"ip in the namespace of {pid}: {run.stderr.strip()}")


class Machines:
    """K emulated machines joined by one virtual link (a bridge in the head's namespace)."""

    def __init__(self, k: int):
        self.k = k
        self.addresses = [str(NETWORK[g + 1]) for g in range(k)]
        self.head_address = str(NETWORK[-2])
        self._holders: list[subprocess.Popen] = []
        self._inodes: set[int] = set()
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        self.head = _holder("ip link set lo up", "--net")
        self._holders.append(self.head)
        prefix = NETWORK.prefixlen
        head = ["link add br0 type bridge", f"addr add {self.head_address}/{prefix} dev br0", "link set br0 up"]
        self.hosts = []
        for g, address in enumerate(self.addresses):
            h = _holder(f"mount -t tmpfs -o mode=1777 tmpfs /dev/shm && ip link set lo up && hostname h{g}",
                        "--net", "--ipc", "--mount", "--uts", "--propagation", "private")
            self._holders.append(h)
            self.hosts.append(h)
            head += [f"link add h{g} type veth peer name eth0 netns {h.pid}", f"link set h{g} master br0",
                     f"link set h{g} up"]
        for p in self._holders:
            self._inodes.add(os.stat(f"/proc/{p.pid}/ns/net").st_ino)
        _ip(self.head.pid, head)
        for h, address in zip(self.hosts, self.addresses):
            _ip(h.pid, [f"addr add {address}/{prefix} dev eth0", "link set eth0 up"])

    def head_command(self, argv: list[str]) -> list[str]:
        """``argv`` run in the head's network namespace (where mpirun reaches every host)."""
        return ["nsenter", f"--net=/proc/{self.head.pid}/ns/net", "--", *argv]

    def mpirun_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` for mpirun: its remote-launch agent enters the machines, its daemons and the
        carriers' TCP use the link."""
        where = ",".join(f"{a}={h.pid}" for a, h in zip(self.addresses, self.hosts))
        return {**env, "PRTE_MCA_plm_ssh_agent": f"{sys.executable} -P -m stratacl.jobs._machines agent {where}",
                "PRTE_MCA_plm_ssh_no_tree_spawn": "1", "PRTE_MCA_oob_tcp_if_include": str(NETWORK),
                "OMPI_MCA_btl_tcp_if_include": str(NETWORK)}

    def namespaces(self) -> set[int]:
        """The inodes of the job's network namespaces (a test checks that no process holds one after)."""
        return set(self._inodes)

    def close(self) -> None:
        """End every process still in a host's namespaces and the holders: the kernel then
        removes the namespaces, their links and their /dev/shm mounts."""
        for p in self._holders:
            if p.stdin and not p.stdin.closed:
                p.stdin.close()
        deadline = time.monotonic() + 5
        while True:
            inside = processes_in(self._inodes)
            if not inside or time.monotonic() > deadline:
                break
            for pid in inside:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        for p in self._holders:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()
        self._holders.clear()


def processes_in(inodes: set[int]) -> list[int]:
    """The processes whose network namespace is one of ``inodes``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}/ns/net").st_ino in inodes:
                    out.append(int(name))
            except OSError:
                pass
    return out


def agent(argv: list[str]) -> int:
    """mpirun's remote-launch agent: ``agent ADDRESS=PID,... ADDRESS CMD...`` runs CMD (a shell
    command, as ssh runs it) in the namespaces of the machine at ADDRESS (PID: its holder)."""
    pids = dict(item.split("=") for item in argv[0].split(","))
    host, command = argv[1], " ".join(argv[2:])
    if host not in pids:
        print(f"stratacl machines: no emulated machine {host!r} (have {', '.join(pids)})", file=sys.stderr)
        return 255
    cwd = os.getcwd()
    os.execvp("nsenter", ["nsenter", "-t", pids[host], "-n", "-i", "-m", "-u", f"--wd={cwd}", "--",
                          "sh", "-c", command])
    return 255


if __name__ == "__main__":
    if sys.argv[1:2] == ["agent"]:
        sys.exit(agent(sys.argv[2:]))
    sys.exit("usage: python -m stratacl.jobs._machines agent ADDRESS=PID,... ADDRESS COMMAND...")
