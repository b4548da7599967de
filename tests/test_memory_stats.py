"""memory_stats(): torch's keys, their meaning here, peaks and resets; memory_summary()."""
from __future__ import annotations

import itertools
import pathlib
import re

import numpy as np
import pytest

import stratacl

ROOT = pathlib.Path(__file__).resolve().parents[1]
MiB = 1024 * 1024


def documented_keys() -> set[str]:
    """The keys docs/memory.md's table lists, braces expanded."""
    text = (ROOT / "docs" / "memory.md").read_text()
    table = text[text.index("| key | meaning |"):text.index("Every `peak`")]
    keys = set()
    for line in table.strip().splitlines()[2:]:
        first = line.split("|")[1]
        for pattern in re.findall(r"`([^`]+)`", first):
            parts = re.split(r"\{([^}]*)\}", pattern)
            choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
            keys |= {"".join(c) for c in itertools.product(*choices)}
    return keys


def semantics(comm):
    s = stratacl.memory_stats
    out = {"keys": sorted(s())}
    base = s()
    a = stratacl.empty((3 * MiB,), np.uint8)             # large pool
    b = stratacl.empty((5 * MiB,), np.uint8)
    c = stratacl.empty((1000,), np.float32)              # small pool: 4000 B -> 4096 B
    s1 = s()
    out["allocated"] = s1["allocated_bytes.all.current"] - base["allocated_bytes.all.current"]
    out["large"] = s1["allocated_bytes.large_pool.current"] - base["allocated_bytes.large_pool.current"]
    out["small"] = s1["allocated_bytes.small_pool.current"] - base["allocated_bytes.small_pool.current"]
    out["requested"] = s1["requested_bytes.all.current"] - base["requested_bytes.all.current"]
    out["active_is_allocated"] = all(s1[f"active_bytes.{p}.{f}"] == s1[f"allocated_bytes.{p}.{f}"]
                                     for p in ("all", "small_pool", "large_pool")
                                     for f in ("current", "peak", "allocated", "freed"))
    out["inactive_with_a_b"] = s1["inactive_split_bytes.large_pool.current"]
    out["mappings"] = s1["mapping.large_pool.current"]
    out["reserved"] = s1["reserved_bytes.large_pool.current"]
    out["segments"] = s1["segment.large_pool.current"]
    del b
    s2 = s()
    out["after_free"] = (s2["allocated_bytes.all.current"] - base["allocated_bytes.all.current"],
                         s2["allocated_bytes.all.peak"] - base["allocated_bytes.all.current"],
                         s2["allocated_bytes.all.freed"] - base["allocated_bytes.all.freed"])
    out["identity"] = all(s2[k] == s2[k[:-len("current")] + "allocated"] - s2[k[:-len("current")] + "freed"]
                          for k in s2 if k.endswith(".current"))
    out["peak_ge_current"] = all(s2[k] >= s2[k[:-len("peak")] + "current"] for k in s2 if k.endswith(".peak"))
    released = stratacl.empty_cache()
    s3 = s()
    out["released"] = released
    out["reserved_after_empty"] = (s3["reserved_bytes.all.current"], s3["reserved_bytes.all.peak"],
                                   s2["reserved_bytes.all.current"])
    out["registered_follow"] = (s3["registered_bytes.all.current"] == s3["reserved_bytes.all.current"],
                                s3["registered_bytes.all.peak"] == s2["reserved_bytes.all.current"],
                                s3["num_registrations"] == s3["num_device_alloc"],
                                s3["num_deregistrations"] == s3["num_device_free"])
    out["inactive_after_empty"] = s3["inactive_split_bytes.all.current"] == (s3["reserved_bytes.all.current"]
                                                                             - s3["allocated_bytes.all.current"])
    stratacl.reset_peak_memory_stats()
    s4 = s()
    out["reset_peak"] = all(s4[k] == s4[k[:-len("peak")] + "current"] for k in s4 if k.endswith(".peak"))
    try:
        stratacl.empty((65 * MiB,), np.uint8)
    except stratacl.OutOfMemory:
        pass
    s5 = s()
    out["oom"] = (s5["num_ooms"], s5["num_alloc_retries"])
    stratacl.reset_accumulated_memory_stats()
    s6 = s()
    out["reset_accumulated"] = (s6["num_ooms"], s6["num_alloc_retries"], s6["allocated_bytes.all.allocated"],
                                s6["allocated_bytes.all.freed"], s6["allocated_bytes.all.current"] > 0)
    summary = stratacl.memory_summary()
    out["summary"] = [label in summary for label in ("memory summary, rank 0", "Allocated memory",
                                                      "HBM reserved memory", "Non-releasable memory",
                                                      "HBM mappings", "registered:", "from large pool")]
    out["stats_memory"] = set(stratacl.stats()["memory"]) == set(s6)
    del a, c
    return out


@pytest.mark.parametrize("allocator", ["expandable", "caching"])
def test_memory_stats_keys_and_semantics(allocator):
    out, = stratacl.spawn(semantics, 1, allocator=allocator, hbm_size="64M")
    assert set(out["keys"]) == documented_keys()
    assert out["allocated"] == 8 * MiB + 4096 and out["large"] == 8 * MiB and out["small"] == 4096
    assert out["requested"] == 8 * MiB + 4000 and out["active_is_allocated"]
    if allocator == "expandable":
        # a: chunks 0-1 (1 MiB of chunk 1 free, shared with b), b: 1 MiB of chunk 1, chunks 2-3
        assert out["mappings"] == 4 and out["reserved"] == 8 * MiB and out["segments"] == 1
        assert out["inactive_with_a_b"] == 0
    else:
        # a: a 20 MiB segment; b: carved from the 17 MiB left in it, 12 MiB stay free and not releasable
        assert out["mappings"] == 1 and out["reserved"] == 20 * MiB and out["segments"] == 1
        assert out["inactive_with_a_b"] == 12 * MiB
    assert out["after_free"] == (3 * MiB + 4096, 8 * MiB + 4096, 5 * MiB)
    assert out["identity"] and out["peak_ge_current"]
    # expandable: b's chunks 2-3 go (chunk 1 still holds a's last MiB); caching: a holds the segment
    assert out["released"] == (4 * MiB if allocator == "expandable" else 0)
    current, peak, before = out["reserved_after_empty"]
    assert current == before - out["released"] and peak == before     # a peak stays until reset
    assert out["registered_follow"] == (True, True, True, True)
    assert out["inactive_after_empty"] and out["reset_peak"]
    assert out["oom"] == (1, 1)
    assert out["reset_accumulated"] == (0, 0, 0, 0, True)
    assert all(out["summary"]) and out["stats_memory"]


def pool_registered(comm):
    s = stratacl.memory_stats()
    return s["registered_bytes.all.current"], s["num_registrations"], s["num_chunk_registrations"]


def test_pool_registers_everything_once():
    for registered, regs, chunks in stratacl.spawn(pool_registered, 2, registration="pool", hbm_size="64M"):
        assert (registered, regs, chunks) == (64 * MiB, 1, 0)
