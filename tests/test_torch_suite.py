"""PyTorch's own generic distributed tests (``DistributedTest._DistTestBase``, shipped in the
torch wheel) against backend "stratacl", through ``stratacl-launch``.

tests/scripts/torch_suite.py runs the methods in every rank of one job and reports each
method's outcome per rank; here every selected method must pass on every rank (or be skipped
by torch itself on every rank: CUDA, NCCL, world size, ...), and exactly as many must pass as
were seen with torch 2.13.0 (docs/torch.md, "PyTorch's own tests", lists them). The methods
that do not apply to this backend are excluded by name (``NOT_APPLICABLE``, the reasons in
the docs); ``test_not_applicable_ones_fail_for_the_documented_reason`` keeps those reasons
true for the cheap ones.
"""
from __future__ import annotations

import collections

import pytest

from launch_helpers import launch, script

# method name patterns that do not apply, with the reason (docs/torch.md has the full account)
NOT_APPLICABLE = {
    "*any_source*": "recv from any source is refused by the backend",
    "test_barrier_timeout*": "the group's timeout= is not used (STRATACL_TIMEOUT is)",
    "*monitored_barrier*": "monitored_barrier is gloo's own (torch refuses it for other backends)",
    "test_sparse*": "sparse tensors are refused",
}
# methods that passed on every rank with torch 2.13.0 (CPU), by world size
PASSED = {3: 112}
# a few that must be among them: one of each kind of operation
CORE = ["test_all_reduce_sum", "test_all_reduce_group_sum", "test_all_reduce_coalesced_max", "test_broadcast_group",
        "test_all_gather_coalesced_simple", "test_all_gather_full_group", "test_all_to_all_group",
        "test_all_to_all_single_unequal_split", "test_gather_full_group", "test_scatter_group",
        "test_reduce_group_max", "test_barrier_group", "test_send_recv", "test_send_recv_with_tag", "test_isend",
        "test_irecv", "test_batch_isend_irecv_gloo", "test_all_gather_object_subgroup", "test_scatter_object_list",
        "test_DistributedDataParallelCPU", "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
        "test_get_future"]


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
    passed = sorted(name for name, ranks in by.items() if ranks[0]["outcome"] == "pass")
    assert [c for c in CORE if c not in passed] == []
    assert len(passed) == PASSED[n], passed


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
