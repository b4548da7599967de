"""One-sided communication (``stratacl.shmem``) at N in {2, 3, 8, 32}: exact bytes, the ordering
of data and signals under ranks racing, atomics, the modeled clock, and the errors. The
programs the ranks run are in tests/onesided_programs.py (tests/test_emulated_hosts.py runs
them across two hosts too).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stratacl
from helpers import ranks
from onesided_programs import atomics, clock, errors, exact, stress

NS = ranks(2, 3, 8, 32)
TIMEOUT = {2: 120, 3: 120, 8: 200, 32: 400}     # the communication timeout: a shared, loaded host


def _spawn(fn, n, *args, **settings):
    return stratacl.spawn(fn, n, args=args, timeout=TIMEOUT[n], **settings)


# --- the native compare-and-swap -------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.booleans())
def test_cas_u64_agrees_with_its_python_definition(initial, expected, desired, hit):
    from stratacl.runtime import _native
    expected = initial if hit else expected
    word = np.array([0, initial, 0], dtype=np.uint64)     # neighbours must stay untouched
    got = _native.cas_u64(_native.data_address(word) + 8, expected, desired)
    want_word = desired if initial == expected else initial       # the definition: swap iff equal
    assert got == initial
    assert word.tolist() == [0, want_word, 0]


# --- exact bytes ------------------------------------------------------------------------------

@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", NS)
def test_put_get_exact_bytes(n):
    assert _spawn(exact, n) == [[]] * n


# --- ordering: data before signal, ranks racing -----------------------------------------------

@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", NS)
def test_put_signal_data_is_visible_with_its_signal_under_races(n):
    rounds, slots, count, fan = {2: (400, 3, 2048, 20), 3: (300, 3, 2048, 20), 8: (60, 2, 1024, 6),
                                 32: (8, 2, 256, 2)}[n]
    out = _spawn(stress, n, rounds, slots, count, fan)
    assert [bad for bad, _ in out] == [[]] * n
    assert all(1 <= moves <= rounds for _, moves in out)


# --- atomics ----------------------------------------------------------------------------------

@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", NS)
def test_atomics_race_to_exact_counts(n):
    k = 50 if n <= 8 else 3
    out = _spawn(atomics, n, k)
    olds = sorted(v for o, _, _ in out for v in o)
    assert olds == list(range(n * k))                   # every fetch_add saw a distinct old value
    assert out[0][1] == n * k and out[n - 1][2] == n * k


# --- the modeled clock ------------------------------------------------------------------------

def _check_clock(out, fars):
    for i, far in enumerate(fars):
        s, r = out[0][i], out[far][i]
        assert s["put"] > 0
        assert s["quiet"] == pytest.approx(s["latency"], rel=1e-9)      # the bytes land a latency later
        # the waiter joins the signal's arrival: the sender's time + the flag's latency
        assert r["after"] == pytest.approx(max(r["before"], s["sent"] + s["latency"] + s["flag"]), rel=1e-12)


def test_modeled_clock_charges_the_tier_and_joins_at_the_signal():
    small, big, again = (_spawn(clock, 2, b, [1], clock="virtual") for b in (4096, 1 << 20, 1 << 20))
    _check_clock(small, [1])
    _check_clock(big, [1])
    assert big[0][0]["put"] > small[0][0]["put"]         # bandwidth: more bytes, more time
    assert again == big                                  # deterministic, whatever the host's load


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_modeled_clock_at_32_ranks_follows_the_tiers():
    out = _spawn(clock, 32, 1 << 20, [1, 16], clock="virtual")
    _check_clock(out, [1, 16])
    near, far = out[0]
    assert far["latency"] > near["latency"] and far["put"] > near["put"]   # inter-node vs die-to-die


# --- errors -----------------------------------------------------------------------------------

@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", NS)
def test_errors_name_the_peer_and_the_address_and_write_nothing(n):
    assert _spawn(errors, n) == [[]] * n
