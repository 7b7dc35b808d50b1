"""Load levels: Poisson arrivals (seeded, right rate) and the option parsers."""

from __future__ import annotations

import numpy as np
import pytest

from trtllm_truss.bench.load import ClosedLoop, OpenLoop, parse_float_list, parse_int_list, poisson_arrival_offsets


def test_poisson_offsets_are_reproducible_with_a_seed():
    assert poisson_arrival_offsets(10.0, 50, seed=7) == poisson_arrival_offsets(10.0, 50, seed=7)
    assert poisson_arrival_offsets(10.0, 50, seed=7) != poisson_arrival_offsets(10.0, 50, seed=8)


def test_poisson_offsets_start_at_zero_and_increase():
    offsets = poisson_arrival_offsets(5.0, 100, seed=1)
    assert offsets[0] == 0.0
    assert all(b >= a for a, b in zip(offsets, offsets[1:]))
    assert len(offsets) == 100


def test_poisson_offsets_have_the_requested_rate_and_exponential_gaps():
    rate = 20.0
    offsets = poisson_arrival_offsets(rate, 20_001, seed=0)
    gaps = np.diff(offsets)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    # Exponential: standard deviation equals the mean (a constant spacing would have 0).
    assert gaps.std() == pytest.approx(1 / rate, rel=0.05)


def test_poisson_offsets_reject_a_non_positive_rate():
    with pytest.raises(ValueError, match="rate"):
        poisson_arrival_offsets(0.0, 10, seed=0)


def test_level_labels_and_validation():
    assert ClosedLoop(concurrency=64).label == "concurrency 64"
    assert OpenLoop(request_rate=2.5).label == "2.5 req/s"
    with pytest.raises(ValueError):
        ClosedLoop(concurrency=0)


def test_parse_lists_name_the_option():
    assert parse_int_list("1,8, 32,64", "--concurrency") == [1, 8, 32, 64]
    assert parse_float_list("0.5,2", "--request-rate") == [0.5, 2.0]
    with pytest.raises(ValueError, match="--concurrency"):
        parse_int_list("1,x", "--concurrency")
    with pytest.raises(ValueError, match="--concurrency"):
        parse_int_list("0,4", "--concurrency")
    with pytest.raises(ValueError, match="--request-rate"):
        parse_float_list("-1", "--request-rate")
