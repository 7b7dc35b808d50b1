"""Readiness follows the front's refusals (serving.availability): a request refused for an unavailable
engine makes readiness 503 at once, in every process of the direct front, until a request is served or
`HOLD_S` passes without another refusal; a stale refusal (a request sent before the last one served)
counts for nothing."""

from __future__ import annotations

import time

import pytest
from trtllm_truss.fronts.replica_state import ReplicaState
from trtllm_truss.serving import availability
from trtllm_truss.serving.availability import HOLD_S, Availability


def test_a_refusal_counts_until_a_request_is_served_or_the_hold_passes():
    second = 10**9
    assert not availability.refusing(0, 0, 100 * second)  # nothing refused yet
    assert availability.refusing(100 * second, 50 * second, 100 * second)
    assert availability.refusing(100 * second, 50 * second, 100 * second + int(HOLD_S * second) - 1)
    assert not availability.refusing(100 * second, 50 * second, 100 * second + int(HOLD_S * second))
    assert not availability.refusing(100 * second, 101 * second, 101 * second)  # served since


@pytest.fixture(params=["in_process", "shared"])
def pair(request, tmp_path):
    """Two views of one availability: one process's twice, or two frontends' of the replica's file."""
    if request.param == "in_process":
        one = Availability()
        yield one, one
        return
    state = ReplicaState.create(tmp_path / "replica", frontends=2, max_in_flight=8)
    other = ReplicaState.open(tmp_path / "replica")
    yield state.availability(), other.availability()
    other.close()
    state.close()


def test_a_refusal_anywhere_is_read_everywhere_and_a_request_served_clears_it(pair):
    first, second = pair
    assert not first.refusing() and not second.refusing()
    sent = time.monotonic_ns()
    first.refused(sent)
    assert first.refusing() and second.refusing()
    second.served()
    assert not first.refusing() and not second.refusing()
    first.refused(sent)  # sent before the request served since: stale
    assert not second.refusing()
    first.refused(time.monotonic_ns())
    assert second.refusing()


def test_the_replica_header_keeps_its_other_fields(tmp_path):
    state = ReplicaState.create(tmp_path / "replica", frontends=3, max_in_flight=7)
    state.availability().refused(time.monotonic_ns())
    other = ReplicaState.open(tmp_path / "replica")
    assert (other.frontends, other.max_in_flight, other.stack_ready, other.stack_failed) == (3, 7, False, False)
    other.close()
    state.close()
