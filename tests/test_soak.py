"""The randomized soak (benchmarks/soak.py), short: every settings combination once, every
byte of every result exact, memory stable, nothing left behind. The long runs are recorded
in docs/reliability.md."""
from __future__ import annotations

import io

import pytest

from benchmarks import soak  # noqa: E402  (the ranks import it too: spawn gives them this sys.path)


pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]      # a seeded soak: the jobs tier


def test_short_soak_is_exact_and_leaves_nothing():
    text = io.StringIO()
    total = soak.run(nranks=4, calls=300, seed=23, jobs=len(soak.SETTINGS), timeout=60, out=text)
    report = text.getvalue()
    assert total["ok"], report
    assert total["calls"] >= 300 and total["wrong_bytes"] == 0 and total["bytes_checked"] > 10**6, report
    ran = set()
    for job in total["jobs"]:
        ran.update(job["settings"].items())
        assert job["leftovers"] == [] and not job["leaked"], report
    assert ("registration", "pool") in ran and ("algo", "ring") in ran and ("clock", "virtual") in ran
    # every operator was drawn, the MoE calls included
    ops = set()
    for job in total["jobs"]:
        for rank_ops in job["ops"]:
            ops.update(rank_ops)
    assert {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v", "broadcast", "sendrecv",
            "send_recv", "barrier", "ep", "ep_ll"} <= ops, ops
