"""The front's guide compile service (guides.compile_service) on the embedded model's tokenizer, with
llguidance (installed on every Python here) and, where it imports, xgrammar: a guide's cost is known before
it reaches an engine, a guide over the budget is refused at the budget (its compile process killed and
replaced) and that refusal is cached, hostile guides at once neither starve small ones nor wait forever
(busy), and the service comes back when it dies. Bounds on time are correctness bounds with generous
margins, polled, never slept on."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest
from trtllm_truss.guides.cache import BytesLRU
from trtllm_truss.guides.compile_client import (
    GuideService,
    GuideServiceClient,
    GuideServiceUnavailable,
)
from trtllm_truss.guides.compile_service import SMALL_GUIDE_BYTES, guide_key, read_stats
from trtllm_truss.guides.xgrammar_guide import module as xgrammar_module

TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "embedded-llama"
BUDGET_S = 0.5
MARGIN_S = 1.5  # scheduling on a shared 2-core machine, the kill, the answer
SMALL = '{"type":"object","properties":{"a":{"type":"integer"}}}'


def hostile(tag: str, properties: int = 10_000) -> str:
    """A schema whose check alone (meta-schema, preparation) takes seconds: over any budget here."""
    return json.dumps({"type": "object", "properties": {f"{tag}{i}": {"type": "integer"} for i in range(properties)}},
                      separators=(",", ":"))


def poll(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


@pytest.fixture(scope="module")
def service():
    service = GuideService.in_temporary_directory(engine="llguidance", tokenizer_dir=str(TOKENIZER), budget_s=BUDGET_S,
                                                  processes=2, cache_bytes=1 << 20)
    service.start()
    yield service
    service.stop()


def _run(coroutine):
    return asyncio.run(coroutine)


async def _timed(client: GuideServiceClient, guide_type: str, guide: str, strict: bool = False) -> tuple[dict, float]:
    started = time.monotonic()
    verdict = await client.check(guide_type, guide, strict)
    return verdict, time.monotonic() - started


# --- the cache ---------------------------------------------------------------------------------------


def test_bytes_lru_keeps_the_most_recent_within_its_bytes():
    cache: BytesLRU[str, int] = BytesLRU(100)
    assert cache.put("a", 1, 40) and cache.put("b", 2, 40)
    assert cache.get("a") == 1  # a is now the most recent
    assert cache.put("c", 3, 40)  # b goes
    assert "b" not in cache and cache.bytes == 80 and cache.stats().evictions == 1
    assert not cache.put("huge", 4, 101) and "huge" not in cache  # over the bound alone: not kept, nothing evicted
    assert cache.get("b") is None
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.hits, stats.misses) == (2, 80, 1, 1)


# --- the service -------------------------------------------------------------------------------------


def test_a_guide_is_compiled_over_the_tokenizer_and_then_known(service: GuideService):
    client = service.client()
    first, _ = _run(_timed(client, "json_schema", SMALL))
    assert first["accepted"]["compiled_bytes"] > 0 and first["accepted"]["compile_s"] > 0  # compiled with the tokenizer
    before = read_stats(service.settings.stats_path)
    again, _ = _run(_timed(client, "json_schema", SMALL))
    after = read_stats(service.settings.stats_path)
    assert again == {**first, "id": again["id"]}
    assert after["hits"] == before["hits"] + 1 and after["compiles"] == before["compiles"]
    refused, _ = _run(_timed(client, "regex", "(unclosed"))
    assert refused["refused"]["message"].startswith("cannot be enforced: ")
    strict, _ = _run(_timed(client, "json_schema", '{"type":"object","not":{"required":["a"]}}', True))
    assert "keyword 'not' cannot be enforced by llguidance; strict: true refuses it" in strict["refused"]["message"]


def test_a_guide_over_the_budget_is_refused_at_the_budget_and_its_refusal_is_cached(service: GuideService):
    client = service.client()
    replaced = read_stats(service.settings.stats_path)["workers_replaced"]
    verdict, took = _run(_timed(client, "json_schema", hostile("budget")))
    assert verdict["refused"]["message"].startswith(f"checking and compiling it takes longer than {BUDGET_S:g} s")
    assert "runtime.guides.compile_budget_s" in verdict["refused"]["message"]
    assert BUDGET_S <= took < BUDGET_S + MARGIN_S
    again, lookup = _run(_timed(client, "json_schema", hostile("budget")))
    assert again["refused"] == verdict["refused"] and lookup < took / 5  # a known-bad guide costs a lookup
    strict, took_strict = _run(_timed(client, "json_schema", hostile("strict"), True))  # strict and best effort alike
    assert strict["refused"]["message"] == verdict["refused"]["message"] and took_strict < BUDGET_S + MARGIN_S
    stats = poll(lambda: (s := read_stats(service.settings.stats_path))["workers"] == 2 and s, 10, "a replacement process")
    assert stats["workers_replaced"] == replaced + 2 and stats["over_budget"] >= 2


@pytest.mark.alone  # its bounds are timing bounds: under the other lane's load small ones can wait
def test_hostile_guides_at_once_neither_starve_small_ones_nor_wait_forever(service: GuideService):
    client = service.client()

    async def storm():
        same = [_timed(client, "json_schema", hostile("same")) for _ in range(16)]
        distinct = [_timed(client, "json_schema", hostile(f"d{i}x", 2_000)) for i in range(4)]
        small = [_timed(client, "json_schema", SMALL.replace('"a"', f'"s{i}"')) for i in range(4)]
        return await asyncio.gather(*same), await asyncio.gather(*distinct), await asyncio.gather(*small)

    started = time.monotonic()
    task = storm()
    same, distinct, small = _run(task)
    assert time.monotonic() - started < 2 * BUDGET_S + MARGIN_S
    for verdict, took in same:  # one compile for the 16, killed at the budget
        assert "takes longer than" in verdict["refused"]["message"] and took < BUDGET_S + MARGIN_S
    for verdict, took in distinct:  # each: over the budget, or no process free within the wait (429)
        assert ("refused" in verdict or "busy" in verdict) and took < 2 * BUDGET_S + MARGIN_S, verdict
    assert any("busy" in verdict for verdict, _ in distinct)  # large guides hold one of the two processes
    assert all(v["busy"]["retry_after"] >= 1 for v, _ in distinct if "busy" in v)
    for verdict, took in small:  # the process kept for small guides took them while the storm ran
        assert "accepted" in verdict and took < BUDGET_S, (verdict, took)


def test_guides_are_keyed_by_type_text_and_strictness():
    keys = {guide_key("json_schema", SMALL, False), guide_key("json_schema", SMALL, True), guide_key("regex", SMALL, False)}
    assert len(keys) == 3 and guide_key("json_schema", SMALL, False) == guide_key("json_schema", SMALL, False)
    assert SMALL_GUIDE_BYTES < len(hostile("x", 2_000))


def test_the_service_comes_back_when_it_dies(service: GuideService):
    client = service.client()
    _run(_timed(client, "json_schema", SMALL))
    old = service.pid
    os.kill(old, signal.SIGKILL)
    poll(lambda: service.pid not in (None, old), 10, "a new service process")

    async def ask() -> dict | None:
        try:
            return await client.check("json_schema", SMALL.replace('"a"', '"back"'), False)
        except GuideServiceUnavailable:
            return None

    verdict = poll(lambda: _run(ask()), 30, "an answer from the new service")
    assert "accepted" in verdict


def _small_then_refused(compiled_bytes_at_least: int, hostile_guide: str) -> None:
    """A one-process xgrammar service: a small schema accepted with a compiled size of at least the
    given bytes (0: nothing compiled), then `hostile_guide` refused within the budget."""
    service = GuideService.in_temporary_directory(engine="xgrammar", tokenizer_dir=str(TOKENIZER), budget_s=BUDGET_S,
                                                  processes=1, cache_bytes=1 << 20)
    service.start()
    try:
        client = service.client()
        accepted, _ = _run(_timed(client, "json_schema", SMALL))
        compiled = accepted["accepted"]["compiled_bytes"]
        assert compiled >= compiled_bytes_at_least if compiled_bytes_at_least else compiled == 0
        refused, took = _run(_timed(client, "json_schema", hostile_guide))
        assert "takes longer than" in refused["refused"]["message"] and took < BUDGET_S + MARGIN_S
    finally:
        service.stop()


@pytest.mark.skipif(xgrammar_module() is not None, reason="xgrammar is installed: the case without it is another Python's")
def test_without_xgrammar_guides_are_checked_within_the_budget_without_compiling():
    """Python 3.10/3.12/3.13 here: no torch, no xgrammar. The service still bounds the check (meta-schema,
    preparation) and compiles nothing; the engine judges the rest."""
    _small_then_refused(0, hostile("nox"))


@pytest.mark.skipif(xgrammar_module() is None, reason="xgrammar needs torch")
def test_xgrammar_compiles_over_the_tokenizer_and_reports_the_compiled_size():
    _small_then_refused(1, json.dumps({"enum": [f"v{i}" for i in range(100_000)]}))  # 88 s and 139 MB alone


def test_concurrent_checks_from_a_new_client_share_one_connection(service: GuideService):
    """Each event loop has one connection: opened once by its first caller, awaited by the others (a second
    one, dropped, had its reader task collected while requests waited on it)."""
    import gc

    client = service.client()

    async def ask_at_once() -> tuple[list[dict], set[int]]:
        verdicts = await asyncio.gather(*(client.check("regex", f"at-once-{i}[0-9]", False) for i in range(20)))
        gc.collect()
        return verdicts, {id(task.result()) for task in client._connections.values()}

    verdicts, connections = _run(ask_at_once())
    assert all("accepted" in verdict for verdict in verdicts) and len(connections) == 1
