"""PyTorch's own generic distributed tests (``DistributedTest._DistTestBase``, shipped in the
torch wheel) against backend "stratacl", through ``stratacl-launch``.

tests/scripts/torch_suite.py runs the methods in every rank of one job and reports each
method's outcome per rank; here every selected method must pass on every rank (or be skipped
by torch itself on every rank: CUDA, NCCL, world size, ...), and the methods that pass must be
exactly the ones pinned in ``torch_suite_passed.txt`` (name, and how torch's decorators select
it: ``gloo``, ``mpi`` or ``gloo/mpi-env``, see the script), as seen with torch 2.13.0: a pass
that turns into a skip, or a method selected another way, shows by name. The methods that do
not apply to this backend are excluded by name (``NOT_APPLICABLE``, the reasons in
docs/torch.md); ``test_not_applicable_ones_fail_for_the_documented_reason`` keeps those
reasons true for the cheap ones.
"""
from __future__ import annotations

import collections
from pathlib import Path

import pytest

from launch_helpers import launch, script

pytestmark = pytest.mark.slow      # torch's own distributed tests: the jobs tier (docs/testing.md)

# method name patterns that do not apply, with the reason (docs/torch.md has the full account)
NOT_APPLICABLE = {
    "*any_source*": "recv from any source is refused by the backend",
    "test_barrier_timeout*": "the group's timeout= is not used (STRATACL_TIMEOUT is)",
    "*monitored_barrier*": "monitored_barrier is gloo's own (torch refuses it for other backends)",
    "test_sparse*": "sparse tensors are refused",
    "test_send_recv_with_tag*": "tags are refused: messages between two ranks match in posting order, not by tag",
    "test_batch_isend_irecv_gloo_tags": "tags are refused: messages between two ranks match in posting order",
}
# methods that passed on every rank with torch 2.13.0 (CPU) at N = 3, each with how it is selected
PINNED = Path(__file__).resolve().parent / "torch_suite_passed.txt"


def pinned() -> dict[str, str]:
    """``torch_suite_passed.txt``: name -> flavour (``#`` starts a comment)."""
    lines = (ln.split("#")[0].split() for ln in PINNED.read_text().splitlines())
    return {f[0]: f[1] for f in lines if f}

def outcomes(run) -> dict[str, dict[int, dict]]:
    by: dict[str, dict[int, dict]] = collections.defaultdict(dict)
    for r in run.records:
        if r.get("kind") == "test":
            by[r["name"]][r["rank"]] = r
    return by


@pytest.mark.timeout(240)
def test_torchs_generic_distributed_tests_pass(tmp_path):
    n = 3
    excludes = [a for p in NOT_APPLICABLE for a in ("--exclude", p)]
    run = launch("-n", str(n), "--timeout", "60", "--deadline", "200", script("torch_suite.py"), *excludes,
                 "--temp-dir", str(tmp_path / "suite"), timeout=220)
    assert run.returncode == 0, run.explain()
    assert sorted(run.by_rank("done")) == list(range(n)), run.explain()
    by = outcomes(run)
    bad, uneven = [], []
    for name, ranks in sorted(by.items()):
        assert sorted(ranks) == list(range(n)), f"{name}: reported by ranks {sorted(ranks)}"
        seen = {r["outcome"] for r in ranks.values()}
        if seen & {"fail", "error"}:
            bad.append(f"{name}: " + "; ".join(f"rank {k}: {r['outcome']} {r['why'][:300]}"
                                                 for k, r in sorted(ranks.items()) if r["outcome"] != "pass"))
        elif len(seen) > 1:
            uneven.append(f"{name}: {sorted((k, r['outcome']) for k, r in ranks.items())}")
    assert not bad, "\n".join(bad)
    assert not uneven, "\n".join(uneven)
    passed = {name: ranks[0]["flavour"] for name, ranks in by.items() if ranks[0]["outcome"] == "pass"}
    want = pinned()
    lost = {name: (by[name][0]["outcome"], by[name][0]["why"][:200]) if name in by else "not run"
            for name in sorted(set(want) - set(passed))}
    assert not lost, f"pinned passes that no longer pass: {lost}"
    assert sorted(set(passed) - set(want)) == [], "new passes: pin them in torch_suite_passed.txt"
    assert passed == want, "selected another way: " + str({k: (want[k], v) for k, v in passed.items() if want[k] != v})


@pytest.mark.timeout(120)
def test_not_applicable_ones_fail_for_the_documented_reason(tmp_path):
    """The cheap ones: each fails on the rank that uses the missing feature, with its message."""
    run = launch("-n", "3", "--timeout", "3", "--deadline", "100", script("torch_suite.py"),
                 "test_monitored_barrier_gloo", "test_sparse_all_reduce_sum", "test_send_recv_any_source",
                 "--temp-dir", str(tmp_path / "suite"), timeout=110)
    assert run.returncode == 0, run.explain()
    by = outcomes(run)
    why = {name: " ".join(r["why"] for r in ranks.values()) for name, ranks in by.items()}
    assert "only implemented for GLOO" in why["test_monitored_barrier_gloo"]
    assert "layout torch.sparse_coo" in why["test_sparse_all_reduce_sum"]
    assert "any source is not supported" in why["test_send_recv_any_source"]
    for name, ranks in by.items():
        assert {r["outcome"] for r in ranks.values()} & {"fail", "error"}, (name, ranks)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["test_send_recv_with_tag", "test_batch_isend_irecv_gloo_tags"])
def test_tagged_point_to_point_is_refused_so_the_tag_tests_do_not_apply(tmp_path, name):
    """The backend matches a pair's messages in posting order, never by tag: a tag other than 0
    is refused on the rank that passes it (each test in a job of its own: the refused rank's
    peer is left waiting until its timeout)."""
    run = launch("-n", "3", "--timeout", "3", "--deadline", "100", script("torch_suite.py"), name,
                 "--temp-dir", str(tmp_path / "suite"), timeout=110)
    assert run.returncode == 0, run.explain()
    ranks = outcomes(run)[name]
    refused = [r for r in ranks.values() if "is not supported: messages between two ranks are matched in the order "
               "they were posted, not by tag" in r["why"]]
    assert refused and {r["outcome"] for r in refused} == {"error"}, ranks
