"""Where the CPU time of a repeated call goes, over all ranks and both cores: perf samples of
the whole host, grouped by the library's native function they were taken under. A benchmark,
not a test: it prints a markdown table.

    python benchmarks/cpu_profile.py broadcast -n 32 --size 64K
    python benchmarks/cpu_profile.py sendrecv -n 32 --size 64K --seconds 3

Needs ``perf`` (Debian: ``apt-get install linux-perf``) allowed to sample every CPU (root, or
``kernel.perf_event_paranoid`` at -1). Every rank calls the operation in a loop; once the loop
is warm, rank 0 runs ``perf record -a --call-graph dwarf`` for ``--seconds``. Each sample is
then named after the innermost frame in one of the library's extension modules (``_native``,
``_kernels``, ...), with what it called from outside them (memcpy, the Python C API) counted
in it: ``mesh_advance / kernel`` is time in the kernel under mesh_advance (the full-mesh
call's waits: sched_yield, futex, the switches), ``execute_plan`` the copies,
``method_vectorcall`` the native method itself. Samples with no library frame are named after
their innermost function (the interpreter running the loop, idle, other processes).
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np

import stratacl
from stratacl._config import parse_size

OPS = ("barrier", "broadcast", "sendrecv", "all_gather", "all_reduce", "all_to_all", "reduce_scatter")


def looping(comm, op: str, size: int, seconds: float, data: str) -> None:
    n, me = comm.size, comm.rank
    count = max(size // 4, 1)
    x, y = stratacl.zeros((count,), np.float32), stratacl.zeros((count,), np.float32)
    out, whole = stratacl.zeros((n * count,), np.float32), stratacl.zeros((n * count,), np.float32)
    call = {"barrier": lambda: comm.barrier(),
            "broadcast": lambda: comm.broadcast(x, 0),
            "sendrecv": lambda: comm.sendrecv(x, (me + 1) % n, y, (me - 1) % n),
            "all_gather": lambda: comm.all_gather(out, x),
            "all_reduce": lambda: comm.all_reduce(x),
            "all_to_all": lambda: comm.all_to_all(out, whole),
            "reduce_scatter": lambda: comm.reduce_scatter(x, whole)}[op]
    for _ in range(50):
        call()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(200):
        call()
    per_call = stratacl.zeros((1,), np.float64)
    per_call[0] = (time.perf_counter() - t0) / 200
    comm.broadcast(per_call, 0)            # every rank makes the same number of calls
    calls = int(3 * seconds / per_call[0]) + 100    # outlasts perf's window, with room to spare
    perf = None
    if me == 0:
        perf = subprocess.Popen(["perf", "record", "-a", "--call-graph", "dwarf,16384", "-F", "300", "-o", data,
                                 "--", "sleep", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(calls):
        call()
    comm.barrier()
    if perf is not None:
        _, err = perf.communicate(timeout=60 + seconds)
        if perf.returncode != 0:
            raise RuntimeError(f"perf record failed: {err.decode(errors='replace').strip()}")


def samples(data: str):
    """(innermost-first frames as (symbol, object file)) for every sample of perf.data."""
    text = subprocess.run(["perf", "script", "-i", data], capture_output=True, text=True, check=True).stdout
    frames: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            if frames:
                yield frames
            frames = []
        elif line[0] in " \t":
            parts = line.split(None, 2)
            if len(parts) >= 2:
                obj = parts[2].strip("() ") if len(parts) > 2 else ""
                frames.append((parts[1].split("+")[0], obj))
    if frames:
        yield frames


def group(frames: list[tuple[str, str]], detail: bool) -> str:
    """A sample's row: the innermost library function it was taken in or under, and whether in
    the kernel (``detail``: the innermost function of all, when it is not the library's)."""
    library = os.path.dirname(stratacl.__file__)
    for i, (sym, obj) in enumerate(frames):
        if obj.startswith(library):
            if i == 0:
                return sym
            if any("kernel" in o for _, o in frames[:i]):
                return f"{sym} / kernel"
            return f"{sym} / {frames[0][0]}" if detail else sym
    return f"(no library frame) {frames[0][0]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op", choices=OPS)
    ap.add_argument("-n", type=int, default=32, help="ranks (default 32)")
    ap.add_argument("--size", default="64K", help="per-rank payload (default 64K)")
    ap.add_argument("--seconds", type=float, default=3.0, help="perf's window (default 3)")
    ap.add_argument("--top", type=int, default=25, help="rows to print")
    ap.add_argument("--detail", action="store_true", help="name the innermost function under the library's too")
    a = ap.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("cpu_profile: perf is not installed (Debian: apt-get install linux-perf)")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        stratacl.spawn(looping, a.n, args=(a.op, parse_size(a.size), a.seconds, data), timeout=300 + 3 * a.seconds)
        counts = collections.Counter(group(f, a.detail) for f in samples(data))
    total = sum(counts.values())
    print(f"{a.op} of {a.size} per rank on {a.n} ranks: {total} samples over {a.seconds:g} s, all CPUs\n")
    print("| share of samples | under |")
    print("|---|---|")
    for name, k in counts.most_common(a.top):
        print(f"| {100 * k / total:.1f}% | {name} |")


if __name__ == "__main__":
    main()
