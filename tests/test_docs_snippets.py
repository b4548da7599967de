"""Every Python snippet of the README and of docs/index.md runs as written.

A snippet is run the way its text says: one with a ``__main__`` guard by ``python`` (it starts
its ranks with ``spawn``), any other under ``stratacl-launch -n 4 --clock virtual`` (the tour's
command). A snippet that imports torch is skipped without torch, as the torch tests are.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from launch_helpers import clean_env, launch

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/index.md")


def snippets() -> list[tuple[str, int, str]]:
    out = []
    for page in PAGES:
        text = (ROOT / page).read_text()
        for i, m in enumerate(re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M)):
            out.append((page, i, m.group(1)))
    return out


def test_the_pages_have_the_snippets_this_file_runs():
    # the README's tour, its spawn example and its torch example: a page that lost them (or a
    # fence this file no longer reads) must not pass with nothing run
    readme = [code for page, _, code in snippets() if page == "README.md"]
    assert len(readme) == 3, readme
    assert any("__main__" in code for code in readme) and any("import torch" in code for code in readme)


@pytest.mark.parametrize("page, index, code", snippets(), ids=lambda v: v if isinstance(v, (str, int)) and len(str(v)) < 20 else "")
def test_snippet_runs_as_written(page, index, code, tmp_path):
    if re.search(r"^import torch|^from torch|\bimport torch\b", code, re.M):
        pytest.importorskip("torch")
    script = tmp_path / f"snippet{index}.py"
    script.write_text(code)
    if "__main__" in code:
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                             env=clean_env(), cwd=tmp_path)
        assert run.returncode == 0, f"{page} snippet {index}:\n{run.stdout}\n{run.stderr}"
    else:
        run = launch("-n", "4", "--clock", "virtual", "--timeout", "60", str(script), timeout=120)
        assert run.returncode == 0, f"{page} snippet {index}:\n{run.explain()}"
