"""The bootstrap daemon: relays registration metadata and cleans up after the launcher.

    rank --ring--> daemon --ring--> every other rank        (metadata_path = relay)
                                    of its host              (a job over hosts: one daemon a host)

It holds the read end of a pipe from the launcher. EOF on that pipe means the launcher is
gone (finished, or killed even by SIGKILL): the daemon then kills any rank still alive,
removes every leftover name of the job from /dev/shm and exits.

Started with ``--watch`` by the first rank of a job that another launcher (torchrun, mpirun)
started (runtime/hosts/_foreign.py; over hosts, by the first rank of each host, for that host's
ranks), it has no launcher to follow: it watches every rank itself,
with a pidfd from the moment the rank writes its pid to the control segment. A rank that ends
unfinalized is recorded as the job's failure (its peers raise PeerFailure naming it); once
every rank has ended, the daemon sweeps the job's names from /dev/shm and exits. Ending the
other ranks stays the job launcher's part, as it is for any of its jobs. Under torchrun over
hosts it watches the host's carrier process too (``carrier``, once it wrote its pid in the
control segment): if it ends while ranks run, the daemon records the shutdown
(FAILED_CARRIER), and the ranks raise instead of waiting out their timeout.
"""
from __future__ import annotations

import os
import selectors
import signal
import sys
import threading
import time

from stratacl.runtime.services import (
    BROADCAST, FAILED_CARRIER, FAILED_EXIT, FAILED_GONE, FAILED_SIGNAL, H_CARRIER_PID, STATE_DEAD, STATE_FINALIZED,
    Control, Mailbox, unpack_header,
)


def _relay(ctl: Control, stop: threading.Event, ranks: list[int]) -> None:
    """Relay what ``ranks`` (the host's: the job's, on one host) post to the daemon: a
    broadcast to each of them but its sender. The ranks of other hosts map this host's mirrors,
    which their carriers fill, and are sent no metadata (runtime/memory/_registration.py)."""
    world = ctl.world
    box = Mailbox(ctl, world)

    def alive(dst: int) -> bool:
        return ctl.state(dst) not in (STATE_FINALIZED, STATE_DEAD)

    while not stop.is_set():
        seen = box.doorbell_value()
        msgs = box.drain()
        for row in msgs.tolist():
            kind, src, dst = unpack_header(row[0])
            targets = [r for r in ranks if r != src] if dst == BROADCAST else [dst]
            for r in targets:
                box.post(r, tuple(row))
        left = box.flush(alive)
        if not len(msgs):
            box.wait(seen, 0.05 if left else 0.2)     # consumers ring when a full ring drains


def _is_rank(pid: int, job_id: str) -> bool:
    """Guard against pid reuse: only kill a process that belongs to this job."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"STRATACL_JOB_ID={job_id}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _exit_status(pid: int) -> tuple[int, int]:
    """(kind, value) for the failure record of rank process ``pid``, which has ended: its exit
    status while it waits as a zombie for its launcher to reap it (/proc/<pid>/stat, field 52;
    FAILED_EXIT with 0 when it exited cleanly but unfinalized), else FAILED_GONE (the launcher
    has already taken it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            status = int(f.read().rsplit(b")", 1)[1].split()[49])
    except (OSError, ValueError, IndexError):
        return FAILED_GONE, 0
    if status & 0x7F:
        return FAILED_SIGNAL, status & 0x7F
    return FAILED_EXIT, status >> 8         # 0: exited cleanly, but without finalizing


def _watch_ranks(ctl: Control, ranks: list[int], timeout: float, carrier_process: bool = False) -> None:
    """Return once every rank of ``ranks`` (the host's) has ended, or once none is left to watch and the job has failed
    or the others did not show up within ``timeout`` s. Sleeps in the kernel on the pidfds;
    while some rank has not written its pid yet, it looks for new pids five times a second. A
    rank already finalized is not watched: its pid may be another process's by now."""
    sel = selectors.DefaultSelector()
    watched: dict[int, int] = {}         # rank -> pidfd
    carrier = None                       # the host's carrier process, once it said where it is
    ended: set[int] = set()
    started = time.monotonic()

    def end(r: int, pid: int) -> None:
        ended.add(r)
        if ctl.state(r) in (STATE_FINALIZED, STATE_DEAD):
            return
        kind, value = _exit_status(pid)
        ctl.set_state(r, STATE_DEAD)
        ctl.record_failure(r, kind, value)

    while len(ended) < len(ranks):
        for r in ranks:
            if r in watched or r in ended:
                continue
            pid = ctl.pid(r)
            if pid <= 0:
                continue
            if ctl.state(r) == STATE_FINALIZED:
                ended.add(r)
                continue
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                end(r, pid)
                continue
            watched[r] = fd
            sel.register(fd, selectors.EVENT_READ, (r, pid))
        word = ctl.header(H_CARRIER_PID)
        if carrier is None and word:
            # a carrier in a process of its own (torchrun over hosts): if it ends while ranks
            # of the host still run, no call across hosts can complete; they are told
            carrier = word
            try:
                sel.register(os.pidfd_open(word & 0xFFFFFFFF), selectors.EVENT_READ, None)
            except ProcessLookupError:
                ctl.record_shutdown(word >> 32, FAILED_CARRIER)
        unseen = len(ranks) - len(watched) - len(ended)
        # nobody left to watch: every rank ended, or the job failed (a rank that has not
        # joined yet cannot complete it and finds the names gone), or ranks never came
        if not watched and (not unseen or ctl.failure() is not None or time.monotonic() - started > timeout):
            return
        for key, _ in sel.select(timeout=0.2 if unseen or (carrier_process and carrier is None) else None):
            if key.data is None:                 # the carrier ended
                sel.unregister(key.fd)
                os.close(key.fd)
                if len(ended) < len(ranks):
                    ctl.record_shutdown(carrier >> 32, FAILED_CARRIER)
                continue
            r, pid = key.data
            sel.unregister(key.fd)
            os.close(watched.pop(r))
            end(r, pid)


def main() -> None:
    if sys.argv[1] == "--watch":
        return main_watch()
    job_id, world, ctl_fd, pipe_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    # a job over hosts: this host's ranks (its launcher's part of the job)
    ranks = [int(r) for r in sys.argv[5].split(",")] if len(sys.argv) > 5 else list(range(world))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctl = Control(ctl_fd, world)
    stop = threading.Event()
    relay = threading.Thread(target=_relay, args=(ctl, stop, ranks), daemon=True, name="stratacl-relay")
    relay.start()
    while os.read(pipe_fd, 4096):
        pass
    stop.set()
    for r in range(world):
        pid = ctl.pid(r)
        if pid > 0 and ctl.state(r) not in (STATE_FINALIZED, STATE_DEAD) and _is_rank(pid, job_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    from stratacl.jobs._resources import sweep
    sweep(job_id)
    os._exit(0)


def main_watch() -> None:
    job_id, world, ctl_fd, timeout = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    # a job spanning hosts: this host's ranks (the others are watched by their hosts' daemons)
    ranks = [int(r) for r in sys.argv[6].split(",")] if len(sys.argv) > 6 else list(range(world))
    carrier_process = sys.argv[7:8] == ["carrier"]      # the host's carrier runs in a process of its own
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    ctl = Control(ctl_fd, world)
    stop = threading.Event()
    threading.Thread(target=_relay, args=(ctl, stop, ranks), daemon=True, name="stratacl-relay").start()
    try:
        # the ranks join once this is posted (runtime/hosts/_foreign.py): none is left unwatched
        import posix_ipc

        from stratacl.runtime.memory import prefix
        ready = posix_ipc.Semaphore(f"/{prefix(job_id)}ready")
        ready.release()
        ready.close()
        _watch_ranks(ctl, ranks, timeout, carrier_process)
    finally:
        stop.set()
        from stratacl.jobs._resources import sweep
        sweep(job_id)
    os._exit(0)


if __name__ == "__main__":
    main()
