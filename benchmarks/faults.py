"""The fault matrix: every fault in every phase of a job, and what the job does about it.

    python benchmarks/faults.py                      # N = 4 and 32, every cell (~20 min on 2 cores)
    python benchmarks/faults.py --ranks 4 --faults kill,hang --phases all_reduce,split
    python benchmarks/faults.py --write-docs         # and replace the table in docs/reliability.md

A cell runs one job under ``stratacl-launch`` in which one fault happens in one phase:

    faults   raise     rank V raises (a Python exception) instead of the phase's call
             kill      rank V SIGKILLs itself instead of the phase's call
             hang      rank V SIGSTOPs itself instead of the phase's call (it never arrives)
             daemon    the job's bootstrap daemon is SIGKILLed while every rank is in the phase
             launcher  the launcher is SIGKILLed while every rank is in the phase
    phases   init, allocation (the first), registration (a fresh segment being announced),
             each operator (all_reduce, all_gather, reduce_scatter, all_to_all, all_to_all_v,
             broadcast, barrier, sendrecv, dispatch, combine), async (an all_reduce with
             async_op=True, then wait), split, finalize

and, in-call cells, one fault partway through one call whose bytes are moving:

    faults   kill-in-call   rank V SIGKILLs itself inside the call
             stop-in-call   rank V SIGSTOPs itself inside the call
    phases   all_gather (64 MiB out per rank), dispatch (4096 tokens of 4096 float16 per rank,
             top-2), async (an all_reduce of 16 MiB, async_op=True, then wait)

Every rank issues the call with async_op=True; rank V's program watches its own progress
(no sleep) and fails once it sees it: a sample of its all_gather output, its all_reduce
array or its dispatch's receive buffer changing (bytes from peers landed). The receive buffer
is made inside the dispatch: rank V watches the HBM block the same dispatch just freed, which
the allocator gives it again. It records how far the call had come (the share of the samples
landed), and whether it had already finished: a draw void for the cell (its main thread, which
looks, was not scheduled during the call), run again up to 3 times; the third does not hold.

For the rank faults the other ranks are inside the phase's call (or enter it) while rank V
fails, which is what a peer sees of a rank failing inside it; for daemon and launcher every
rank loops on the phase's call until the kill. What is checked, per cell:

- every survivor raises PeerFailure or CommTimeout naming rank V (the daemon, for the daemon
  fault) and the operation, within the bound: well under the communication timeout (5 s,
  --death-bound) for a death, the timeout plus 1.5 s (--hang-slack) for a hang; a launcher's
  death leaves no survivor (tests/test_faults.py widens both bounds: there a loaded host must
  not fail a cell, and the class of the error tells a death found from one waited out);
- the launcher exits non-zero and its root-cause block names rank V (for a hang, in the
  survivors' timeouts and in the flight recorder; a rank hung after its peers finished, by the
  launcher itself) or the daemon;
- when no survivor raised (they had finished, or the launcher ended them), the job ends
  within the same bound plus the launcher's --grace, counted from the fault;
- every survivor's HBM array made before the phase (1 MiB, no part of any call) has the
  same CRC-32 after its error as before the phase;
- nothing is left: no /dev/shm name or semaphore of the job, no rank or daemon process.

Nothing here is timed by sleeping: the harness reads the ranks' records from the launcher's
stdout and acts when they arrive, each job with a deadline.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

FAULTS = ("raise", "kill", "hang", "daemon", "launcher")
IN_CALL_FAULTS = ("kill-in-call", "stop-in-call")
DRAWS = 3                   # runs of an in-call cell while its fault falls after the call (run_in_call_drawn)
IN_CALL_PHASES = ("all_gather", "dispatch", "async")
OPERATORS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v", "broadcast", "barrier",
             "sendrecv", "dispatch", "combine")
PHASES = ("init", "allocation", "registration", *OPERATORS, "async", "split", "finalize")
MARK = b"@@ "
TIMEOUT = {"hang": 3.0, "stop-in-call": 3.0}   # --timeout per fault: a hang is found by it; a death must not need it
DEFAULT_TIMEOUT = 20.0
DEATH_BOUND = 5.0               # seconds from a death to every survivor's error (--death-bound); also the
                                # launcher's --grace: a survivor still to notice is not SIGTERMed first
GRACE = DEATH_BOUND             # the launcher's --grace in a hang cell
HANG_SLACK = 1.5                # seconds past the timeout for every survivor of a hang to raise (--hang-slack)
JOB_DEADLINE = 60               # the launcher's --deadline (plus 3 s a rank: starting 32 on 2 cores is slow) ends
                                # a rank hung outside any collective
DOCS = Path(__file__).resolve().parent.parent / "docs" / "reliability.md"
BEGIN, END = "<!-- fault-matrix:begin -->", "<!-- fault-matrix:end -->"


# --- inside a rank ----------------------------------------------------------------------------
def _emit(**record) -> None:
    record.setdefault("rank", int(os.environ.get("STRATACL_RANK", "-1")))
    record.setdefault("pid", os.getpid())
    record.setdefault("job", os.environ.get("STRATACL_JOB_ID"))
    record.setdefault("t", time.monotonic())
    os.write(1, MARK + json.dumps(record).encode() + b"\n")


def _inject(fault: str, **progress) -> None:
    _emit(kind="fault", **progress)
    if fault == "raise":
        raise RuntimeError("injected fault")
    os.kill(os.getpid(), signal.SIGKILL if fault.startswith("kill") else signal.SIGSTOP)


def _in_call(fault: str, doomed: bool, start, progress) -> None:
    """An in-call cell's phase: ``start()`` issues the call (async_op=True) and returns its
    Work; rank V polls ``progress()`` (how far its own call has come, 0 before any byte moved)
    and fails at the first sign of progress, or once the call finished without one showing."""
    work = start()
    if doomed:
        seen = 0.0
        while not work.is_completed():
            seen = progress()
            if seen > 0:
                break
            os.sched_yield()        # the call's worker thread shares this rank's core
        _inject(fault, progress=round(seen, 4), completed=work.is_completed())
    work.wait()
    # a survivor can finish a call that needed nothing more of rank V (a dispatch past its
    # routing phase pulls rank V's rows from rank V's HBM, which outlives it): it then names
    # rank V at its next call
    _emit(kind="call_done")


def rank_main(fault: str, phase: str, victim: int) -> None:
    """One rank of a cell: run up to ``phase``, then fail there (rank ``victim``) or call it."""
    import numpy as np

    import stratacl
    from stratacl import ep
    import zlib
    me = int(os.environ["STRATACL_RANK"])
    external = fault in ("daemon", "launcher")
    in_call = fault in IN_CALL_FAULTS
    doomed = me == victim and not external
    kept = {}                       # an HBM array no call touches, and its CRC-32 before the phase

    def at(name: str) -> None:
        """Say this rank reached ``name``; rank ``victim`` fails here if it is the phase
        (inside the call, for an in-call fault)."""
        if name == phase:
            _emit(kind="at", phase=name, crc=kept.get("crc"))
            if doomed and not in_call:
                _inject(fault)

    def repeat(call) -> None:
        """The phase's call: once, or until the harness's kill for an external fault."""
        call()
        while external:
            call()

    def hold(comm) -> None:
        """After a phase that cannot be repeated, an external fault finds the ranks in barriers."""
        while external:
            comm.barrier()

    try:
        at("init")
        comm = stratacl.init()
        n = comm.size
        if phase == "init":
            hold(comm)
        kept["array"] = stratacl.empty((1 << 20,), np.uint8)
        kept["array"][:] = np.random.default_rng(me).integers(0, 256, 1 << 20, dtype=np.uint8)
        kept["crc"] = zlib.crc32(kept["array"])
        at("allocation")
        x = stratacl.empty((4096,), np.float32)
        x[:] = me
        if phase == "allocation":
            hold(comm)
        out = stratacl.empty((4096 * n,), np.float32)
        comm.barrier()
        if phase == "registration":
            at("registration")
            fresh = stratacl.empty((4 << 20,), np.uint8)   # a new segment, announced in the background
            fresh[:] = 1
            repeat(comm.barrier)
        buf = ep.Buffer(comm, 4 * n)
        idx = np.array([[(me + t) % (4 * n), (me + t + 1) % (4 * n)] for t in range(16)], dtype=np.int64)
        w = np.ones((16, 2), dtype=np.float32)
        tokens = stratacl.empty((16, 64), np.float16)
        tokens[:] = me
        calls = {
            "all_reduce": lambda: comm.all_reduce(x),
            "all_gather": lambda: comm.all_gather(out, x),
            "reduce_scatter": lambda: comm.reduce_scatter(x[:4096 // n], out[:4096 // n * n]),
            "all_to_all": lambda: comm.all_to_all(out, out.copy()),
            "all_to_all_v": lambda: comm.all_to_all_v(out, x, [4096 // n] * n, [4096 // n] * n),
            "broadcast": lambda: comm.broadcast(x, root=0),
            "barrier": comm.barrier,
            "sendrecv": lambda: comm.sendrecv(x, dst=(me + 1) % n, out=out[:4096], src=(me - 1) % n),
            "dispatch": lambda: buf.dispatch(tokens, idx, w),
            "async": lambda: comm.all_reduce(x, async_op=True).wait(),
            "split": lambda: comm.split(color=me % 2, key=me),
        }
        if phase == "combine":
            recv, *_, handle = buf.dispatch(tokens, idx, w)
            calls["combine"] = lambda: buf.combine(recv, handle)
        if in_call:
            calls[phase] = _in_call_phase(fault, phase, doomed, comm, buf, me, n)
        if phase in calls:
            at(phase)
            repeat(calls[phase])
        comm.barrier()
        at("finalize")
        stratacl.finalize()
        if phase == "finalize" and external:
            threading.Event().wait()      # finalized: nothing left that could notice
        _emit(kind="done")
    except Exception as e:
        _emit(kind="error", type=type(e).__name__, message=str(e), peer=getattr(e, "peer", None),
              operation=getattr(e, "operation", None),
              intact=zlib.crc32(kept["array"]) == kept["crc"] if "crc" in kept else None)
        raise


def _in_call_phase(fault: str, phase: str, doomed: bool, comm, buf, me: int, n: int):
    """The phase's call for an in-call cell (module docstring), made before it starts: its
    buffers are allocated and filled here, outside the fault's reach."""
    import ctypes

    import numpy as np

    import stratacl
    stride = 4096                       # elements between the samples rank V watches
    if phase == "all_gather":
        x = stratacl.empty(((16 << 20) // n,), np.float32)        # 64 MiB of float32 out
        x[:] = me
        out = stratacl.empty((x.size * n,), np.float32)
        out[:] = -1
        peers = np.ones(out.size, dtype=bool)
        peers[me * x.size:(me + 1) * x.size] = False
        watched = np.flatnonzero(peers[::stride]) * stride
        return lambda: _in_call(fault, doomed, lambda: comm.all_gather(out, x, async_op=True),
                                lambda: float((out[watched] != -1).mean()))
    if phase == "async":
        y = stratacl.empty((4 << 20,), np.float32)                # 16 MiB
        y[:] = 1
        return lambda: _in_call(fault, doomed, lambda: comm.all_reduce(y, async_op=True),
                                lambda: float((y[::stride] != 1).mean()))
    tokens = stratacl.empty((4096, 4096), np.float16)
    tokens[:] = me
    experts = buf.num_experts
    idx = (np.arange(4096, dtype=np.int64)[:, None] * 7 + np.arange(2) + me) % experts
    w = np.ones((4096, 2), dtype=np.float32)
    buf.dispatch(tokens, idx, w)
    # the receive buffer is made inside the call; the allocator gives the same shape the block
    # a dispatch just freed, so rank V watches that block (a view that does not keep it)
    recv = buf.dispatch(tokens, idx, w)[0]
    where = (ctypes.c_char * recv.nbytes).from_address(recv.ctypes.data)
    del recv
    rows = np.frombuffer(where, dtype=np.float16)

    def start():
        rows[:] = -1
        return buf.dispatch(tokens, idx, w, async_op=True)
    return lambda: _in_call(fault, doomed, start, lambda: float((rows[::stride] != -1).mean()))


# --- the harness ------------------------------------------------------------------------------
def _launcher() -> str:
    here = Path(sys.executable).parent / "stratacl-launch"
    return str(here) if here.exists() else shutil.which("stratacl-launch")


def _job_names(job: str) -> list[str]:
    p = f"stratacl-{job}-"
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(p) or name.startswith("sem." + p))


def _alive(pids: list[int]) -> list[int]:
    from stratacl.jobs._processes import collect, wait_gone
    return [p.pid for p in wait_gone(collect(pids), 0)]


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    from stratacl.jobs._processes import collect, wait_gone
    return [p.pid for p in wait_gone(collect(pids), seconds)]


def run_cell(fault: str, phase: str, n: int, death_bound: float = DEATH_BOUND, hang_slack: float = HANG_SLACK) -> dict:
    """Run one cell and check it (module docstring); a row of the table. ``death_bound`` and
    ``hang_slack``: the detection bounds (--death-bound, --hang-slack); ``death_bound`` is also
    the launcher's --grace except for a hang, whose survivors all time out together and whose
    hung rank the grace only delays the end of."""
    import psutil
    victim = n // 2
    timeout = TIMEOUT.get(fault, DEFAULT_TIMEOUT)
    job_deadline = JOB_DEADLINE + 3 * n
    hang = fault in ("hang", "stop-in-call")
    grace = GRACE if hang else death_bound
    cmd = [_launcher(), "-n", str(n), "--timeout", str(timeout), "--grace", str(grace), "--deadline", str(job_deadline),
           __file__,
           "--rank", fault, phase, str(victim)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATACL_")}
    deadline = job_deadline + 60
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    err_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)
    reader.start()
    records, pending, daemon_pids = [], b"", []
    killed_at = None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while True:
        if time.monotonic() - t0 > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        if not sel.select(timeout=0.5):
            continue
        data = os.read(proc.stdout.fileno(), 1 << 16)
        if not data:
            break
        lines = (pending + data).split(b"\n")
        pending = lines.pop()
        records += [json.loads(ln[len(MARK):]) for ln in lines if ln.startswith(MARK)]
        if not daemon_pids:
            try:
                daemon_pids = [c.pid for c in psutil.Process(proc.pid).children()
                               if "stratacl.jobs._daemon" in " ".join(c.cmdline())]
            except psutil.Error:
                pass
        at = {r["rank"] for r in records if r["kind"] == "at"}
        if fault in ("daemon", "launcher") and killed_at is None and len(at) == n:
            target = daemon_pids[0] if fault == "daemon" and daemon_pids else proc.pid
            killed_at = time.monotonic()
            try:
                os.kill(target, signal.SIGKILL)
            except ProcessLookupError:
                pass                   # it ended on its own first: the checks below say how
    sel.close()
    rc = proc.wait(timeout=60)
    ended = time.monotonic()
    reader.join(timeout=10)
    elapsed = time.monotonic() - t0
    stderr = b"".join(err_chunks).decode(errors="replace")
    ranks = {r["rank"]: r for r in records if r["kind"] == "at"}
    pids = [r["pid"] for r in records if r["kind"] == "at"] + daemon_pids
    jobs = {r["job"] for r in records if r.get("job")}
    left_procs = _wait_gone(pids, 10)
    names = [name for job in jobs for name in _job_names(job)]
    errors = {r["rank"]: r for r in records if r["kind"] == "error" and r["rank"] != victim}
    survivors = [r for r in range(n) if r != victim] if fault not in ("daemon", "launcher") else list(range(n))
    fault_rec = next((r for r in records if r["kind"] == "fault"), {})
    fault_t = fault_rec.get("t", killed_at)
    row = {"fault": fault, "phase": phase, "ranks": n, "exit": rc, "elapsed_s": round(elapsed, 1),
           "survivors": len(survivors), "raised": 0, "classes": [], "names_peer": True, "operations": [],
           "detect_s": None, "ended_s": None if fault_t is None else round(ended - fault_t, 2),
           "root_cause": False, "intact": None, "left_shm": len(names), "left_procs": len(left_procs),
           "notes": []}
    partway = True
    if fault in IN_CALL_FAULTS:
        partway = bool(fault_rec) and not fault_rec["completed"]
        row["after_call"] = bool(fault_rec) and fault_rec["completed"]
        if fault_rec:
            row["notes"].append(f"rank {victim} failed with its call {fault_rec['progress']:.0%} along"
                                + (" (it had finished: not inside the call)" if fault_rec["completed"] else ""))
    if fault == "launcher":
        row["raised"] = 0
        row["root_cause"] = rc == -signal.SIGKILL
        row["held"] = rc == -signal.SIGKILL and not names and not left_procs
        if len(ranks) < n:
            row["notes"].append(f"only {len(ranks)} of {n} ranks reached the phase")
        return row
    if fault == "daemon":
        errors = {r["rank"]: r for r in records if r["kind"] == "error"}
    done = {r["rank"] for r in records if r["kind"] == "done"}
    row["raised"] = len(errors)
    row["classes"] = sorted({e["type"] for e in errors.values()})
    checked = [e["intact"] for e in errors.values() if e.get("intact") is not None]
    row["intact"] = all(checked) if checked else None
    row["operations"] = sorted({str(e["operation"]) for e in errors.values()})
    # a survivor names the failed rank, or a rank that failed before it because of that rank
    # (in a ring, rank 0 waits on neither neighbour of a hung rank 2: it learns of rank 1's
    # timeout, which named 2)
    def blames(e: dict, rank: int) -> bool:
        return e["peer"] == rank or f"[{rank}]" in e["message"] or f"rank {rank} " in e["message"]

    blamed = {victim}
    for _ in range(n):
        blamed |= {r for r, e in errors.items() if any(blames(e, b) for b in blamed)}
    for r, e in errors.items():
        if fault == "daemon":
            ok = "bootstrap daemon" in e["message"]
        else:
            ok = blames(e, victim) or any(blames(e, b) for b in blamed - {r})
            if ok and not blames(e, victim):
                row["notes"].append(f"rank {r} names rank {e['peer']}, which failed first because of rank {victim}")
        row["names_peer"] &= ok and e["type"] in ("PeerFailure", "CommTimeout") and bool(e["operation"])
    if errors and fault_t is not None:
        row["detect_s"] = round(max(e["t"] for e in errors.values()) - fault_t, 2)
    bound = timeout + hang_slack if hang else death_bound
    in_time = row["detect_s"] is not None and row["detect_s"] <= bound
    if not errors:
        # no survivor raised (they finished, or the launcher ended them): the job's end is bounded
        # instead, by the same bound plus the launcher's one wait before it ends what is left
        in_time = row["ended_s"] is not None and row["ended_s"] <= bound + grace
        if not in_time:
            row["notes"].append(f"the job ended {row['ended_s']} s after the fault, past {bound + grace:g} s")
    if fault == "daemon":
        row["root_cause"] = "its bootstrap daemon ended (killed by SIGKILL)" in stderr
    else:
        block = stderr[stderr.find("Root cause"):] if "Root cause" in stderr else ""
        named = (re.search(rf"^  rank      : {victim} \(pid", block, re.M) is not None
                 or f"still missing: [{victim}]" in stderr
                 or re.search(rf"rank {victim} never entered", stderr) is not None)
        row["root_cause"] = named
    completed = sorted({r["rank"] for r in records if r["kind"] == "call_done"} - {victim})
    if completed:
        row["notes"].append(f"rank(s) {completed} completed the call and named rank {victim} at the next one")
    finished = sorted(done - {victim})
    if finished:
        row["notes"].append(f"rank(s) {finished} finished before the fault reached them")
    everyone = len(errors) + len(finished) == len(survivors)
    if phase == "finalize" and fault == "daemon":
        # finalized ranks wait on nothing that could tell them: the launcher ends them
        everyone = not errors
        row["notes"].append("the ranks had finalized: nothing in them can notice; the launcher ended them")
    if phase == "finalize" and fault == "hang" and rc == 124:
        row["notes"].append(f"the others finished; a rank hung after its last collective call is ended by the "
                            f"job's --deadline ({job_deadline} s here) alone, and nothing names it")
    row["held"] = (rc not in (0, None) and row["root_cause"] and everyone and row["names_peer"] and in_time
                   and row["intact"] is not False and partway and not names and not left_procs)
    return row


def _table(rows: list[dict]) -> str:
    head = ("| fault | phase | N | survivors raising | class | names the peer and op | operation | detected after (s) "
            "| job ended after (s) | launcher exit | root cause named | kept HBM intact | shm + sem left "
            "| processes left | held | notes |")
    lines = [head, "|" + "---|" * 16]
    for r in rows:
        lines.append(
            f"| {r['fault']} | {r['phase']} | {r['ranks']} | {r['raised']}/{r['survivors']} | "
            f"{', '.join(r['classes']) or '-'} | {'yes' if r['names_peer'] else 'no'} | "
            f"{', '.join(r['operations']) or '-'} | {'-' if r['detect_s'] is None else r['detect_s']} | "
            f"{'-' if r.get('ended_s') is None else r['ended_s']} | {r['exit']} | "
            f"{'yes' if r['root_cause'] else 'no'} | {_intact(r.get('intact'))} | "
            f"{r['left_shm']} | {r['left_procs']} | "
            f"{'yes' if r['held'] else '**no**'} | {'; '.join(r['notes'])} |")
    return "\n".join(lines)


def _intact(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "**no**"


def run_in_call_drawn(fault: str, phase: str, n: int, death_bound: float, hang_slack: float) -> dict:
    """``run_cell``, drawn again (up to ``DRAWS`` times) while an in-call fault fell after its
    call: rank V's look at its progress comes from its main thread, which a loaded host can
    leave unscheduled for the whole call, and a fault after the call tests a next-call failure,
    not the cell. Each void draw is a note of the row; the last draw is kept whatever it shows."""
    void = 0
    while True:
        row = run_cell(fault, phase, n, death_bound, hang_slack)
        if not row.pop("after_call", False) or void + 1 == DRAWS:
            break
        void += 1
    if void:
        row["notes"].append(f"{void} earlier draw(s) void: rank {n // 2}'s call finished before it looked")
    return row


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank"]:
        rank_main(argv[1], argv[2], int(argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="4,32", help="comma separated (default 4,32)")
    ap.add_argument("--faults", default=",".join(FAULTS + IN_CALL_FAULTS),
                    help="an in-call fault runs in the phases it has (%s) only" % ", ".join(IN_CALL_PHASES))
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--cells", help="fault:phase pairs, comma separated, instead of every fault x phase")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--update", help="rows of an earlier run (its --json): run only --cells again, keep the rest")
    ap.add_argument("--write-docs", action="store_true", help=f"replace the table in {DOCS.name}")
    ap.add_argument("--death-bound", type=float, default=DEATH_BOUND,
                    help=f"seconds from a death to every survivor's error, and the launcher's --grace "
                         f"(default {DEATH_BOUND:g}; the tests give a loaded host the communication timeout)")
    ap.add_argument("--hang-slack", type=float, default=HANG_SLACK,
                    help=f"seconds past the timeout for a hang's survivors (default {HANG_SLACK:g})")
    a = ap.parse_args(argv)
    rows = []
    t0 = time.monotonic()
    cells = ([tuple(c.split(":")) for c in a.cells.split(",")] if a.cells else
             [(f, p) for f in a.faults.split(",") for p in a.phases.split(",")
              if f not in IN_CALL_FAULTS or p in IN_CALL_PHASES])
    for fault, phase in cells:
        if not ((fault in FAULTS and phase in PHASES) or (fault in IN_CALL_FAULTS and phase in IN_CALL_PHASES)):
            ap.error(f"unknown cell {fault}:{phase} (faults: {', '.join(FAULTS)} in phases {', '.join(PHASES)}; "
                     f"{', '.join(IN_CALL_FAULTS)} in {', '.join(IN_CALL_PHASES)})")
    for n in (int(v) for v in a.ranks.split(",")):
        for fault, phase in cells:
            row = run_in_call_drawn(fault, phase, n, a.death_bound, a.hang_slack)
            rows.append(row)
            print(f"faults: N={n} {fault} in {phase}: {'held' if row['held'] else 'NOT HELD'} "
                  f"({row['elapsed_s']} s)", file=sys.stderr, flush=True)
    if a.update:
        fresh = {(r["fault"], r["phase"], r["ranks"]): r for r in rows}
        rows = [fresh.pop((r["fault"], r["phase"], r["ranks"]), r) for r in json.loads(Path(a.update).read_text())]
        rows += list(fresh.values())
    table = _table(rows)
    held = sum(r["held"] for r in rows)
    summary = (f"{held} of {len(rows)} cells held; `python benchmarks/faults.py --ranks {a.ranks}"
               f"{' --cells ' + a.cells if a.cells else ''}` took {time.monotonic() - t0:.0f} s")
    if a.update:
        summary += f", over the rows of an earlier run of every cell ({Path(a.update).name})"
    print(table)
    print(f"\n{summary}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if a.write_docs:
        text = DOCS.read_text()
        block = f"{BEGIN}\n{summary}\n\n{table}\n{END}"
        if BEGIN in text:
            text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
        else:
            text += f"\n{block}\n"
        DOCS.write_text(text)
    return 0 if held == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
