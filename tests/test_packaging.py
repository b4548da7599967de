"""The sdist and the wheel hold the whole source tree, so ``pip install .`` gives a working library.

The expected contents are read from the tree, not from setup.py: every ``.py`` file under
``stratacl/`` and ``launcher/`` (the latter installed as ``stratacl_launcher``), every native
extension (a C file that defines ``PyInit_<name>``), every C source and header. ``python -m
build`` makes the sdist and then the wheel from that sdist, so the wheel also proves the sdist
builds. It runs in this environment (``--no-isolation``; the test extra brings build,
setuptools and wheel) on a copy of the checkout, which it leaves untouched.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALLED_AS = {"stratacl": "stratacl", "launcher": "stratacl_launcher"}
_PYINIT = re.compile(rb"PyMODINIT_FUNC\s+PyInit_(\w+)\s*\(")

pytestmark = pytest.mark.timeout(600)


def _tree_files(pattern: str) -> dict[str, str]:
    """Source-tree path -> installed path, for the files of the packages matching ``pattern``."""
    found = {}
    for folder, installed in INSTALLED_AS.items():
        for path in sorted((ROOT / folder).rglob(pattern)):
            rel = path.relative_to(ROOT / folder)
            if "__pycache__" not in rel.parts:
                found[path.relative_to(ROOT).as_posix()] = f"{installed}/{rel.as_posix()}"
    return found


def _native_modules() -> list[str]:
    """Installed dotted-path stems (``stratacl/runtime/_native``) of the C files defining a module."""
    stems = []
    for source, installed in _tree_files("*.c").items():
        m = _PYINIT.search((ROOT / source).read_bytes())
        if m is not None:
            stems.append(f"{installed.rsplit('/', 1)[0]}/{m.group(1).decode()}")
    return stems


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> tuple[set[str], set[str], str]:
    tmp = tmp_path_factory.mktemp("packaging")
    src, out = tmp / "src", tmp / "dist"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".pytest_cache"))
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"python -m build failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    with tarfile.open(sdist) as tf:
        # strip the sdist's top folder (stratacl_emu-<version>/)
        sdist_names = {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
    with zipfile.ZipFile(wheel) as zf:
        wheel_names = set(zf.namelist())
        (entry_points,) = [n for n in wheel_names if n.endswith(".dist-info/entry_points.txt")]
        entry_text = zf.read(entry_points).decode()
    return sdist_names, wheel_names, entry_text


def test_the_tree_is_seen():
    # guards the checks below against passing on an empty list
    assert "stratacl/runtime/communicator/_comm.py" in _tree_files("*.py")
    assert "launcher/_cli.py" in _tree_files("*.py")
    assert sorted(_native_modules()) == sorted(
        ["stratacl/runtime/_native", "stratacl/collectives/_kernels", "stratacl/collectives/_lpt",
         "stratacl/collectives/_eproute", "stratacl/ub/_fill"])


def test_wheel_has_every_module(dists):
    _, wheel, _ = dists
    missing = sorted(src for src, installed in _tree_files("*.py").items() if installed not in wheel)
    assert not missing, f"modules of the source tree missing from the wheel: {missing}"


def test_wheel_has_every_native_extension(dists):
    _, wheel, _ = dists
    missing = [stem for stem in _native_modules()
               if not any(re.fullmatch(re.escape(stem) + r"\.[\w.-]*so", name) for name in wheel)]
    assert not missing, f"native extensions missing from the wheel: {missing}"


def test_console_scripts_point_into_the_wheel(dists):
    _, wheel, entry_text = dists
    targets = re.findall(r"^\s*(stratacl-[\w-]+)\s*=\s*([\w.]+):\w+", entry_text, re.M)
    assert {name for name, _ in targets} == {"stratacl-launch", "stratacl-bench"}
    for name, module in targets:
        path = module.replace(".", "/")
        assert f"{path}.py" in wheel or f"{path}/__init__.py" in wheel, f"{name} -> {module}, not in the wheel"


def test_sdist_has_what_the_build_needs(dists):
    sdist, _, _ = dists
    needed = [*_tree_files("*.py"), *_tree_files("*.c"), *_tree_files("*.h"),
              "pyproject.toml", "setup.py", "README.md"]
    missing = sorted(name for name in needed if name not in sdist)
    assert not missing, f"files missing from the sdist: {missing}"
