"""mesh.gossip.detector: phi-accrual suspicion from heartbeat arrivals (no clocks: times are ints)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.gossip.detector import LOG10_E, FailureDetector


def fd(**kw) -> FailureDetector:
    kw.setdefault("expected_interval_ms", 200)
    return FailureDetector(**kw)


def test_unknown_peer_has_phi_zero_and_never_expires():
    d = fd()
    assert d.phi("x", 10**9) == 0.0
    assert list(d.expired(10**9)) == []
    assert "x" not in d and len(d) == 0


def test_phi_is_exponential_in_silence_with_the_prior_mean():
    d = fd()
    d.report("b", 1_000)
    # no samples yet: the mean is the expected interval
    assert d.phi("b", 1_000) == 0.0
    assert d.phi("b", 1_200) == pytest.approx(LOG10_E * 200 / 200)
    assert d.phi("b", 3_000) == pytest.approx(LOG10_E * 2_000 / 200)


def test_threshold_crossing_time_matches_expired():
    d = fd(threshold=8.0)
    d.report("b", 0)
    crossing = 8.0 / LOG10_E * 200          # ~3684 ms with a 200 ms mean
    assert list(d.expired(int(crossing) - 1)) == []
    assert list(d.expired(int(crossing) + 2)) == ["b"]
    assert d.phi("b", int(crossing) + 2) > 8.0


def test_mean_adapts_to_slower_arrivals_but_not_below_the_floor():
    d = fd(window_size=10)
    t = 0
    for _ in range(100):
        d.report("slow", t)
        t += 1_000
    assert d.mean_ms("slow") == pytest.approx(1_000, rel=0.01)
    t2 = 0
    for _ in range(100):
        d.report("fast", t2)
        t2 += 20
    assert d.mean_ms("fast") == 200          # the floor: min_mean_ms defaults to the interval


def test_one_long_gap_is_clamped_so_it_does_not_blind_the_detector():
    d = fd(window_size=10, max_sample_ms=2_000)
    d.report("b", 0)
    d.report("b", 3_600_000)                 # an hour of silence (a healed partition)
    assert d.mean_ms("b") <= 200 + (2_000 - 200) * 2 / 11 + 1


def test_suspend_restarts_every_clock_without_a_sample():
    d = fd()
    d.report("b", 0)
    d.report("c", 100)
    d.suspend(10_000)                        # our own loop was stalled for ~10 s
    assert d.phi("b", 10_000) == 0.0 and d.phi("c", 10_000) == 0.0
    assert d.mean_ms("b") == 200             # no sample was taken
    assert list(d.expired(10_000 + 3_000)) == []


def test_time_going_backwards_counts_as_no_time():
    d = fd()
    d.report("b", 5_000)
    d.report("b", 4_000)
    assert d.last_ms("b") == 5_000
    assert d.phi("b", 4_500) == 0.0


def test_forget():
    d = fd()
    d.report("b", 0)
    d.forget("b")
    assert "b" not in d and d.phi("b", 10_000) == 0.0


@pytest.mark.parametrize("kw", [dict(expected_interval_ms=0), dict(threshold=0), dict(window_size=0)])
def test_bad_parameters(kw):
    with pytest.raises(ValueError):
        fd(**kw)


@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.integers(min_value=0, max_value=5_000), min_size=1, max_size=50),
       probe=st.lists(st.integers(min_value=0, max_value=100_000), min_size=2, max_size=10))
def test_phi_never_decreases_with_silence_and_agrees_with_expired(gaps, probe):
    d = fd(threshold=8.0)
    t = 0
    for g in gaps:
        t += g
        d.report("b", t)
    last = -1.0
    for p in sorted(probe):
        phi = d.phi("b", t + p)
        assert phi >= last and math.isfinite(phi)
        last = phi
        # expired() uses an integer deadline: agree away from the exact boundary
        if abs(phi - 8.0) > 0.01:
            assert (list(d.expired(t + p)) == ["b"]) == (phi > 8.0)
