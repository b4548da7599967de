"""Running ``stratacl-launch`` from tests: the command, its records, and leftover checks.

Rank scripts live in ``tests/scripts`` and report what they saw as ``@@ {json}`` lines on
stdout (see ``scripts/_report.py``). Every wait here has a deadline: subprocess timeouts,
``select`` on pipes, ``psutil.wait_procs``; nothing sleeps to wait for another process.
"""
from __future__ import annotations

import dataclasses
import json
import os
import selectors
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SHM = "/dev/shm"
MARK = "@@ "


def launcher_command() -> list[str]:
    """The installed console script of this interpreter (not a version-manager shim)."""
    here = Path(sys.executable).parent / "stratacl-launch"
    path = str(here) if here.exists() else shutil.which("stratacl-launch")
    assert path, "stratacl-launch is not installed (pip install -e .)"
    return [path]


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any STRATACL_* setting that could leak in, plus ``extra``."""
    # the test's job tag stays (tests/conftest.py: the leak check counts the test's own jobs)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATACL_") or k == "STRATACL_TEST_JOB_TAG"}
    env.update(extra)
    return env


@dataclasses.dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    elapsed: float

    @property
    def records(self) -> list[dict]:
        return parse_records(self.stdout)

    def by_rank(self, kind: str) -> dict[int, dict]:
        out: dict[int, dict] = {}
        for r in self.records:
            if r.get("kind") == kind:
                assert r["rank"] not in out, f"rank {r['rank']} reported {kind!r} twice"
                out[r["rank"]] = r
        return out

    def explain(self) -> str:
        return f"exit code {self.returncode}\n--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-6000:]}"


def parse_records(text: str) -> list[dict]:
    return [json.loads(line[len(MARK):]) for line in text.splitlines() if line.startswith(MARK)]


def launch(*args: str, timeout: float = 120, env: dict[str, str] | None = None, cwd: str | Path | None = None,
           wrap: list[str] = ()) -> Run:
    """Run ``stratacl-launch ARGS`` to completion (killed after ``timeout`` seconds), under the
    command ``wrap`` if given."""
    t0 = time.monotonic()
    p = subprocess.run([*wrap, *launcher_command(), *args], capture_output=True, text=True, timeout=timeout,
                       env=clean_env() if env is None else env, cwd=cwd)
    return Run(p.returncode, p.stdout, p.stderr, time.monotonic() - t0)


def script(name: str) -> str:
    return str(SCRIPTS / name)


def read_lines_until(proc: subprocess.Popen, want: int, prefix: str, timeout: float) -> list[str]:
    """Read ``proc.stdout`` (binary pipe) until ``want`` lines starting with ``prefix`` have arrived."""
    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buf, found = b"", []
    try:
        while len(found) < want:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(timeout=left):
                raise AssertionError(f"only {len(found)} of {want} {prefix!r} lines within {timeout} s: {found}")
            data = os.read(fd, 1 << 16)
            if not data:
                raise AssertionError(f"launcher stdout closed after {len(found)} of {want} {prefix!r} lines "
                                     f"(exit code {proc.wait(timeout=10)})")
            buf += data
            *lines, buf = buf.split(b"\n")
            found += [ln.decode() for ln in lines if ln.decode().startswith(prefix)]
    finally:
        sel.close()
    return found


def own_shm_names() -> list[str]:
    """The names in /dev/shm of this test's jobs (their ids start with the test's tag:
    tests/conftest.py); other jobs on the host are not this test's business."""
    return shm_names(os.environ["STRATACL_TEST_JOB_TAG"])


def shm_names(job_id: str) -> list[str]:
    p = f"stratacl-{job_id}"
    p = p if p.endswith("z") else p + "-"     # a test's tag (conftest) is a prefix of its ids
    return sorted(n for n in os.listdir(SHM) if n.startswith(p) or n.startswith("sem." + p))


def assert_all_gone(pids: list[int], timeout: float = 15) -> None:
    """Every process in ``pids`` ends within ``timeout`` s (a zombie waiting for init counts as gone)."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    still = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                still.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    for pid in still:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert not still, f"processes still running {timeout} s later: {still}"


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tagged(tag: str) -> list[psutil.Process]:
    """The processes whose environment carries ``EMU_TEST_TAG=tag`` (what a job started, in
    sessions of their own too: hosts' daemons, carriers, their mpirun)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("EMU_TEST_TAG") == tag:
                found.append(p)
        except psutil.Error:
            pass
    return found


def torchrun_nodes(nodes: int, nproc: int | list[int], *argv: str, env: dict[str, str], timeout: float = 200,
                   flags: tuple[str, ...] = (), during=None, node_env: list[dict] | None = None) -> Run:
    """``torchrun --nnodes NODES --node-rank g --nproc-per-node NPROC ARGV`` for every node g, all
    on this machine (static rendezvous on a free loopback port): a job whose ranks span
    ``nodes`` hosts as torchrun sees them (``nproc``: ranks per node, or each node's). Output
    of every node, node after node; the exit code is the first non-zero one. ``node_env[g]``:
    node g's own additions to ``env``. ``during(agents, tag)``, if given, runs once they started
    and returns the lines of node 0's stdout it read. Waits (bounded) for every process the job
    left in sessions of its own (the hosts' daemons, the carriers) to end."""
    import uuid
    tag = uuid.uuid4().hex
    env = {k: v for k, v in env.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "TORCHELASTIC_"))}
    env.update(EMU_TEST_TAG=tag)
    env.pop("PYTHONUNBUFFERED", None)    # a rank's report line reaches the shared pipe in one write
    port, t0 = free_port(), time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node-rank",
                               str(g), "--nproc-per-node", str(nproc[g] if isinstance(nproc, list) else nproc),
                               *flags, "--master-addr", "127.0.0.1",
                               "--master-port", str(port), *argv], env={**env, **(node_env or [{}] * nodes)[g]},
                              stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for g in range(nodes)]
    outs, seen = [], []
    try:
        if during is not None:
            seen = during(procs, tag)
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0))))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        _gone, alive = psutil.wait_procs(tagged(tag), timeout=30)
        assert not alive, f"left running after the job: {[(p.pid, p.name()) for p in alive]}"
    rc = next((p.returncode for p in procs if p.returncode), 0)
    stdout = "".join(line + "\n" for line in seen) + "".join(o.decode() for o, _ in outs)
    return Run(rc, stdout, "".join(e.decode() for _, e in outs), time.monotonic() - t0)
