"""``stratacl-launch`` basics: what each rank sees, output tagging, ``-m``, and bad settings.

The rank script (``scripts/rank_info.py``) reports its identity, its sys.argv and the result of
one all_gather as an ``@@ {json}`` line; tests compare that with what was asked for.
"""
from __future__ import annotations

import json
import os
import pty
import re
import resource
import shutil
import subprocess

import pytest

import stratacl
from stratacl.jobs._supervisor import RANK_THREAD_VARS

from launch_helpers import SCRIPTS, Run, clean_env, launch, launcher_command, script


def _check_info(run, n: int, argv: list[str]) -> None:
    info = run.by_rank("info")
    assert sorted(info) == list(range(n)), run.explain()
    jobs = {rec["env"]["STRATACL_JOB_ID"] for rec in info.values()}
    # the test's tag (tests/conftest.py), then 64 random bits (stratacl/runtime/memory/_names.py)
    tag = os.environ.get("STRATACL_TEST_JOB_TAG", "")
    assert len(jobs) == 1 and re.fullmatch(re.escape(tag) + r"[0-9a-f]{16}", jobs.pop())
    # torch's env:// rendezvous: one TCPStore port for the whole job, a real port number
    ports = {rec["env"]["MASTER_PORT"] for rec in info.values()}
    assert len(ports) == 1 and re.fullmatch(r"[1-9][0-9]*", port := ports.pop()) and 0 < int(port) < 65536, ports
    for r, rec in info.items():
        assert (rec["comm_rank"], rec["comm_size"]) == (r, n)
        assert rec["env"] | {"STRATACL_JOB_ID": None} == {
            "STRATACL_RANK": str(r), "STRATACL_WORLD_SIZE": str(n), "RANK": str(r), "WORLD_SIZE": str(n),
            "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
            "STRATACL_JOB_ID": None}, rec
        assert rec["argv"] == argv, rec
        assert rec["gather_ok"], rec
    assert len({rec["pid"] for rec in info.values()}) == n
    # ranks share the launcher's session (one scheduling group under autogroup, where a yielding
    # wait hands the core to a peer) and each lead a process group (a terminal's Ctrl-C misses them)
    assert {rec["session"] for rec in info.values()} == {os.getsid(0)}, info
    assert all(rec["group"] == rec["pid"] for rec in info.values()), info


def test_32_ranks_each_see_their_rank_and_world():
    n = 32
    run = launch("-n", str(n), "--timeout", "120", script("rank_info.py"), "alpha", "--beta", "3",
                 timeout=280)
    assert run.returncode == 0, run.explain()
    _check_info(run, n, ["alpha", "--beta", "3"])
    assert run.stderr.count("stderr line from rank") == n
    assert "failed" not in run.stderr


def test_ranks_do_not_read_a_terminal_stdin():
    # a rank outside the terminal's foreground group that read it would be stopped by SIGTTIN
    parent, child = pty.openpty()
    try:
        p = subprocess.run(launcher_command() + ["-n", "2", script("rank_info.py")], stdin=child,
                           capture_output=True, text=True, timeout=120, env=clean_env())
    finally:
        os.close(parent)
        os.close(child)
    run = Run(p.returncode, p.stdout, p.stderr, 0.0)
    assert run.returncode == 0, run.explain()
    info = run.by_rank("info")
    assert sorted(info) == [0, 1] and not any(rec["stdin_is_terminal"] for rec in info.values()), info


def test_tag_output_prefixes_every_line_with_its_rank():
    n = 4
    run = launch("-n", str(n), "--tag-output", script("rank_info.py"), timeout=120)
    assert run.returncode == 0, run.explain()
    for stream, what in ((run.stdout, "stdout"), (run.stderr, "stderr")):
        lines = stream.splitlines()
        assert lines, what
        seen = set()
        for line in lines:
            m = re.fullmatch(r"\[(\d+)\]: (.*)", line)
            assert m, f"untagged {what} line: {line!r}"
            rank, text = int(m.group(1)), m.group(2)
            if text.startswith(f"{what} line from rank "):
                assert text == f"{what} line from rank {rank}"
                seen.add(rank)
        assert seen == set(range(n)), (what, stream)
    # the JSON records are tagged too; strip the tag and check them
    records = [re.sub(r"^\[\d+\]: ", "", ln) for ln in run.stdout.splitlines()]
    run.stdout = "\n".join(records)
    _check_info(run, n, [])


def test_tag_output_forwards_every_line_before_the_launcher_exits():
    n, count = 4, 20000
    run = launch("-n", str(n), "--tag-output", script("print_lines.py"), str(count), timeout=120)
    assert run.returncode == 0, run.explain()
    per_rank: dict[int, list[str]] = {r: [] for r in range(n)}
    for line in run.stdout.splitlines():
        m = re.fullmatch(r"\[(\d+)\]: (.*)", line)
        assert m, line
        per_rank[int(m.group(1))].append(m.group(2))
    for r in range(n):
        assert per_rank[r] == [f"r{r} line {i}" for i in range(count)], \
            f"rank {r}: {len(per_rank[r])} of {count} lines arrived"


def _lines_by_rank(text: str, stream: str, tagged: bool) -> dict[int, list[int]]:
    """Line numbers each rank's ``print_pieces.py`` lines carry; a line that is not one whole
    line of that script (cut, merged with another, tagged with another rank) fails."""
    pattern = (r"\[(\d+)\]: r\1 " if tagged else r"r(\d+) ") + stream + r" (\d+) \.{40}"
    seen: dict[int, list[int]] = {}
    for line in text.splitlines():
        m = re.fullmatch(pattern, line)
        assert m, f"not a whole {stream} line: {line!r}"
        seen.setdefault(int(m.group(1)), []).append(int(m.group(2)))
    return seen


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_every_line_of_every_rank_arrives_whole_when_ranks_write_in_pieces(tagged):
    # unbuffered Python writes a print's text and its newline in two writes: 32 ranks sharing
    # one pipe cut each other's lines; each rank's output must come through line by line
    n, count = 32, 1000
    run = launch("-n", str(n), *(["--tag-output"] if tagged else []), script("print_pieces.py"), str(count),
                 env=clean_env(PYTHONUNBUFFERED="1"), timeout=200)
    assert run.returncode == 0, run.explain()
    for text, stream in ((run.stdout, "out"), (run.stderr, "err")):
        seen = _lines_by_rank(text, stream, tagged)
        assert sorted(seen) == list(range(n)), (stream, sorted(seen))
        for r, numbers in seen.items():
            assert numbers == list(range(count)), f"rank {r} {stream}: {len(numbers)} of {count} lines, in order?"


def test_a_partial_last_line_is_forwarded_as_a_line_of_its_own(tmp_path):
    # a rank ending without a newline must not glue its text to another rank's next line
    body = "import os, sys\nsys.stdout.write('tail of ' + os.environ['STRATACL_RANK'])\n"
    (tmp_path / "tail.py").write_text(body)
    run = launch("-n", "3", str(tmp_path / "tail.py"), timeout=120)
    assert run.returncode == 0, run.explain()
    assert sorted(run.stdout.splitlines()) == ["tail of 0", "tail of 1", "tail of 2"], run.explain()


@pytest.mark.parametrize("stdout, tag, expected", [("terminal", False, "1"), ("pipe", True, "1"),
                                                     ("pipe", False, None)])
def test_ranks_run_unbuffered_when_their_lines_should_show_at_once(tmp_path, stdout, tag, expected):
    # a rank's stdout is a pipe, which Python would buffer in blocks; a terminal (or the tagged
    # stream) should see each line when printed, as it would with the terminal's line buffering
    (tmp_path / "env.py").write_text("import json, os, sys\nopen(sys.argv[1] + os.environ['STRATACL_RANK'], 'w')"
                                     ".write(json.dumps(os.environ.get('PYTHONUNBUFFERED')))\n")
    parent, child = pty.openpty() if stdout == "terminal" else (None, subprocess.PIPE)
    env = clean_env()
    env.pop("PYTHONUNBUFFERED", None)
    try:
        p = subprocess.run(launcher_command() + ["-n", "2", *(["--tag-output"] if tag else []),
                                                 str(tmp_path / "env.py"), str(tmp_path / "rank")],
                           stdout=child, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    finally:
        if parent is not None:
            os.close(parent)
            os.close(child)
    assert p.returncode == 0, p.stderr
    seen = [json.loads((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    assert seen == [expected] * 2


def test_the_launcher_makes_room_for_its_descriptors_under_a_low_limit():
    # 4 descriptors a rank (HBM segment, report socket, two output pipes): 12 ranks under a soft
    # limit of 40 need the launcher to raise it, as 300 ranks would under the common 1024
    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 200:
        pytest.skip("the hard descriptor limit is too low to raise the soft one")
    p = subprocess.run(launcher_command() + ["-n", "12", script("print_pieces.py"), "2"], preexec_fn=low_limit,
                       capture_output=True, text=True, timeout=120, env=clean_env())
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(p.stdout.splitlines()) == 24 and len(p.stderr.splitlines()) == 24, p.stderr[-3000:]


def test_module_mode_runs_the_module_in_every_rank_with_its_args():
    n = 3
    run = launch("-n", str(n), "-m", "rank_info", "x", "-y", cwd=SCRIPTS, timeout=120)
    assert run.returncode == 0, run.explain()
    _check_info(run, n, ["x", "-y"])


@pytest.mark.parametrize("mode", ["script", "module"])
def test_a_stratacl_folder_in_the_working_directory_does_not_shadow_the_library(tmp_path, mode):
    # like a source checkout without built extensions, where a user runs the README's command
    (tmp_path / "stratacl").mkdir()
    (tmp_path / "stratacl" / "__init__.py").write_text("raise ImportError('the shadow package was imported')\n")
    for name in ("rank_info.py", "_report.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    target = ["-m", "rank_info"] if mode == "module" else [str(tmp_path / "rank_info.py")]
    run = launch("-n", "2", *target, "z", cwd=tmp_path, timeout=120)
    assert "shadow" not in run.stderr, run.explain()
    assert run.returncode == 0, run.explain()
    _check_info(run, 2, ["z"])


def test_nprocs_from_the_environment():
    run = launch(script("rank_info.py"), env=clean_env(STRATACL_NPROCS="3"), timeout=120)
    assert run.returncode == 0, run.explain()
    _check_info(run, 3, [])


def _thread_settings(comm):
    return [os.environ.get(v) for v in RANK_THREAD_VARS]


def test_ranks_run_numeric_libraries_on_one_thread_unless_told_otherwise(monkeypatch):
    for v in RANK_THREAD_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(RANK_THREAD_VARS[0], "3")
    expected = ["3"] + ["1"] * (len(RANK_THREAD_VARS) - 1)
    assert stratacl.spawn(_thread_settings, 2, timeout=60) == [expected, expected]


def test_the_rank_template_imports_torch_for_a_script_that_imports_it_at_its_top(tmp_path):
    # a rank of a torch script starts with torch imported (the template's, shared), on one
    # thread as before; a script that imports torch only inside a branch gets no torch from it
    run = launch("-n", "2", script("torch_preloaded.py"), env=clean_env(), timeout=60)
    assert run.returncode == 0, run.explain()
    assert sorted(ln for ln in run.stdout.splitlines() if ln.startswith("@@")) == [
        "@@ rank 0 torch before True threads 1", "@@ rank 1 torch before True threads 1"], run.explain()
    assert "spawned, not forked" not in run.stderr, run.explain()
    lazy = tmp_path / "lazy_torch.py"
    lazy.write_text("import sys\nif len(sys.argv) > 5:\n    import torch\nprint('@@', 'torch' in sys.modules)\n")
    run = launch("-n", "2", str(lazy), env=clean_env(), timeout=60)
    assert run.returncode == 0, run.explain()
    assert run.stdout.splitlines() == ["@@ False", "@@ False"], run.explain()


def test_unknown_stratacl_environment_variable_is_an_error():
    run = launch("-n", "2", script("rank_info.py"), env=clean_env(STRATACL_TIMEOUTT="3"), timeout=60)
    assert run.returncode == 2, run.explain()
    assert "unknown environment variable STRATACL_TIMEOUTT" in run.stderr
    assert "did you mean STRATACL_TIMEOUT?" in run.stderr
    assert run.stdout == ""                    # no rank was started


@pytest.mark.parametrize("flag, value, expected", [
    ("--registration", "foo", "expected one of roa, jit, pool, staged, got 'foo'"),
    ("--timeout", "soon", "expected a number, got 'soon'"),
    ("--hbm-size", "lots", "not a size: 'lots' (examples: 4096, 64K, 512M, 4G)"),
    ("--metadata-path", "carrier-pigeon", "expected one of direct, relay, got 'carrier-pigeon'"),
    ("--timeout", "-1", "expected a number > 0, got '-1'"),
    ("--grace", "-2", "expected a number >= 0, got '-2'"),
])
def test_bad_flag_value_exits_2_naming_the_flag(flag, value, expected):
    run = launch("-n", "2", flag, value, script("rank_info.py"), timeout=60)
    assert run.returncode == 2, run.explain()
    assert run.stderr == f"stratacl-launch: {flag} {value}: {expected}\n", run.stderr
    assert run.stdout == ""


_TOPOLOGY = ('{"name": "t", "levels": [{"name": "gpu", "size": 1, "tier": "local"}, '
             '{"name": "rack", "size": SIZE, "tier": "nv"}], "tiers": {"local": {"latency_us": 0.1, '
             '"bandwidth_gbps": 2000}, "nv": {"latency_us": 1.0, "bandwidth_gbps": BW}}, "beyond": "nv"}')


@pytest.mark.parametrize("size, bw, expected", [
    ("72", "NaN", "field tiers.nv.'bandwidth_gbps' must be a finite number of at most 1e+12, got nan"),
    ("72", "1e308", "field tiers.nv.'bandwidth_gbps' must be a finite number of at most 1e+12, got 1e+308"),
    ("1" + "0" * 30, "900", "field levels[1].'size' must be at most 1099511627776 (2**40), got 1" + "0" * 30),
    ("1048576", "900", "fields levels[*].'size' multiply to 1099511627776 ranks per outermost unit; at most "
                       "2147483648 (2**31)"),
    (None, None, "not UTF-8 text (byte 0xff at offset 10); a topology is a JSON file"),
])
def test_a_bad_topology_file_exits_2_naming_the_field_before_any_rank_starts(tmp_path, size, bw, expected):
    path = tmp_path / "topo.json"
    if size is None:
        path.write_bytes(b'{"name": "\xff\xfe"}')
    else:
        text = _TOPOLOGY.replace("SIZE", size).replace("BW", bw)
        if size == "1048576":
            text = text.replace('"size": 1,', '"size": 1048576,')
        path.write_text(text)
    run = launch("-n", "2", "--clock", "virtual", "--topology", str(path), script("rank_info.py"), timeout=60)
    assert run.returncode == 2, run.explain()
    assert run.stderr == f"stratacl-launch: topology file {path}: {expected}\n", run.stderr
    assert run.stdout == ""                    # no rank was started


@pytest.mark.parametrize("value, size", [("100T", "109951162777600 (100 TiB)"),
                                         ("99999999999999999999999", "99999999999999991611392 (9.095e+10 TiB)")])
def test_an_hbm_size_past_the_address_space_exits_2_naming_hbm_size(value, size):
    run = launch("-n", "2", "--hbm-size", value, script("rank_info.py"), timeout=60)
    assert run.returncode == 2, run.explain()
    assert run.stderr.startswith(f"stratacl-launch: hbm_size={size}: 2 rank(s) need a shared address window of "), \
        run.stderr
    assert run.stderr.endswith("at most 14 TiB per rank fits at 2 rank(s): lower --hbm-size (STRATACL_HBM_SIZE)\n"), \
        run.stderr
    assert run.stderr.count("\n") == 1 and "VA_BASE" not in run.stderr and run.stdout == ""


def test_spawn_refuses_a_bad_topology_in_the_caller(tmp_path):
    path = tmp_path / "topo.json"
    path.write_text(_TOPOLOGY.replace("SIZE", "72").replace("BW", "NaN"))
    with pytest.raises(stratacl.ConfigError, match=r"field tiers\.nv\.'bandwidth_gbps' must be a finite number"):
        stratacl.spawn(_thread_settings, 2, topology=str(path), clock="virtual", timeout=60)


def test_bad_setting_in_the_environment_names_the_variable():
    run = launch("-n", "2", script("rank_info.py"), env=clean_env(STRATACL_REGISTRATION="foo"), timeout=60)
    assert run.returncode == 2, run.explain()
    assert "STRATACL_REGISTRATION='foo'" in run.stderr and "expected one of roa, jit, pool" in run.stderr


@pytest.mark.parametrize("args", [["-n", "0", "x.py"], ["-n", "2"], ["-n", "two", "x.py"]])
def test_bad_command_line_exits_2(args):
    run = launch(*args, timeout=60)
    assert run.returncode == 2, run.explain()
    assert run.stdout == "" and run.stderr.strip()
