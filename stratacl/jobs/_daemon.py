"""The bootstrap daemon: relays registration metadata and cleans up after the launcher.

    rank --ring--> daemon --ring--> every other rank        (metadata_path = relay)

It holds the read end of a pipe from the launcher. EOF on that pipe means the launcher is
gone (finished, or killed even by SIGKILL): the daemon then kills any rank still alive,
removes every leftover name of the job from /dev/shm and exits.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

from stratacl.runtime._control import STATE_DEAD, STATE_FINALIZED, Control
from stratacl.runtime._mailbox import BROADCAST, Mailbox, unpack_header


def _relay(ctl: Control, stop: threading.Event) -> None:
    world = ctl.world
    box = Mailbox(ctl, world)

    def alive(dst: int) -> bool:
        return ctl.state(dst) not in (STATE_FINALIZED, STATE_DEAD)

    while not stop.is_set():
        seen = box.doorbell_value()
        msgs = box.drain()
        for row in msgs.tolist():
            kind, src, dst = unpack_header(row[0])
            targets = [r for r in range(world) if r != src] if dst == BROADCAST else [dst]
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


def main() -> None:
    job_id, world, ctl_fd, pipe_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctl = Control(ctl_fd, world)
    stop = threading.Event()
    relay = threading.Thread(target=_relay, args=(ctl, stop), daemon=True, name="stratacl-relay")
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


if __name__ == "__main__":
    main()
