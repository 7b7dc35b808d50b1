"""The direct front's shared state (`fronts.replica_state`): one admission bound across processes, metrics
summed over every process's array, readiness written by one and read by all. Two real processes share
the file here (a child started with multiprocessing's spawn), as the frontends do."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trtllm_truss.fronts.replica_state import ReplicaState
from trtllm_truss.serving.metrics import ServingMetrics


def _take_in_another_process(path: str, index: int, count: int, result) -> None:
    state = ReplicaState.open(Path(path))
    admission = state.admission(index)
    result.value = sum(admission.take() for _ in range(count))
    metrics = ServingMetrics(CollectorRegistry(), model_name="m", state=state.metrics_array(index))
    for _ in range(result.value):
        metrics.request_queued()
        metrics.request_started()
        metrics.request_finished("length", 3, 5)
    state.close()


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"{name} {labels} not exported")


def test_one_bound_for_every_process_and_metrics_summed(tmp_path: Path):
    state = ReplicaState.create(tmp_path / "replica", frontends=2, max_in_flight=5)
    mine = state.admission(0)
    assert all(mine.take() for _ in range(2))
    context = multiprocessing.get_context("spawn")
    taken = context.Value("i", 0)
    child = context.Process(target=_take_in_another_process, args=(str(state.path), 1, 10, taken))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert taken.value == 3  # 5 for the replica, 2 of them taken here
    assert state.admitted() == 5 and not mine.take()
    mine.give_back()
    assert mine.take() and not mine.take()

    registry = CollectorRegistry()
    metrics = ServingMetrics(registry, model_name="m", state=state.metrics_array(0), peers=state.all_metrics_arrays())
    metrics.request_queued()
    metrics.request_started()
    metrics.request_finished("stop", 1, 2)
    assert _sample(registry, "trtllm_request_success_total", finished_reason="length") == 3
    assert _sample(registry, "trtllm_request_success_total", finished_reason="stop") == 1
    assert _sample(registry, "trtllm_generation_tokens_total") == 3 * 5 + 2
    assert _sample(registry, "trtllm_num_requests_running") == 0

    # frontend 1 restarts: the slots it held are free again, its counters go on
    state.frontend_started(1, pid=12345)
    assert state.admitted() == 2 and state.frontend_pid(1) == 12345
    assert _sample(registry, "trtllm_request_success_total", finished_reason="length") == 3

    reader = ReplicaState.open(state.path)
    assert not reader.stack_ready
    state.stack_ready = True
    assert reader.stack_ready and not reader.stack_failed
    metrics.unregister()
    reader.close()
    state.close()


def test_a_dead_frontends_admitted_requests_are_freed_when_the_launcher_finds_it(tmp_path: Path):
    """Its requests died with it: their slots are free at once, not only when its successor starts."""
    state = ReplicaState.create(tmp_path / "replica", frontends=2, max_in_flight=4)
    dead, alive = state.admission(0), state.admission(1)
    state.frontend_started(0, 12345)
    assert all(dead.take() for _ in range(3))
    assert alive.take() and not alive.take()
    state.frontend_exited(0)
    assert state.admitted() == 1 and state.frontend_pid(0) == 0
    assert all(alive.take() for _ in range(3)) and not alive.take()
