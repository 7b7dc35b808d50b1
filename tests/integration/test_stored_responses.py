"""Responses with state through the direct front with 4 processes (each request on whichever process
takes it: connections spread by the kernel), with the official openai SDK: turns chained by
`previous_response_id` (each turn's input tokens counted beforehand by `/v1/responses/input_tokens`, stored history
included), also across a restart of the server (the SQLite store file persists); each
response its own API key's (404 for another); GET / DELETE / input_items; background responses polled
to their end, some cancelled; the store's size on /metrics.

One server for the module (restarted once, on the same store file, by the restart test).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from truss_serving import RestartableDirectFront, poll

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(900)]

KEY_A, KEY_B = "sk-store-alice-1", "sk-store-bob-2"
GREEDY = {"temperature": 0.0, "max_output_tokens": 12}
USER_TURNS = ["My name is Ada.", "What is my name?", "Say it again.", "Spell it.", "Thanks, bye."]


class Served(RestartableDirectFront):
    """The direct front with 4 processes on one store file."""

    def __init__(self, work: Path) -> None:
        super().__init__(work, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                                "TRTLLM_RUNTIME__DIRECT_FRONT__PROCESSES": "4",
                                "TRTLLM_RUNTIME__DIRECT_FRONT__FILL_CONNECTIONS": "0",  # the kernel spreads connections
                                "TRTLLM_RUNTIME__STORE__PATH": str(work / "store.sqlite3")})

    def client(self, key: str = KEY_A) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    server = Served(tmp_path_factory.mktemp("stored_responses"))
    try:
        yield server
    finally:
        server.proc.stop()


def _explicit_items(turns: list[tuple[str, object]], question: str) -> list[dict]:
    """The conversation as a client would send it whole: each user turn and the output items answering it."""
    items: list[dict] = []
    for user, response in turns:
        items.append({"role": "user", "content": user})
        items.extend(item.model_dump(exclude_none=True) for item in response.output)
    return [*items, {"role": "user", "content": question}]


def _chain(served: Served, count: int, start: list[tuple[str, object]] | None = None) -> list[tuple[str, object]]:
    """`count` more turns, each continuing the last by previous_response_id; each checked against the same
    conversation sent whole (store: false): the stored history is rendered as a new request would be."""
    client = served.client()
    turns = list(start or [])
    for _ in range(count):
        question = USER_TURNS[len(turns)]
        previous = turns[-1][1].id if turns else None
        counted = client.responses.input_tokens.count(model="embedded", input=question, previous_response_id=previous)
        response = client.responses.create(model="embedded", input=question, previous_response_id=previous, **GREEDY)
        assert response.status in ("completed", "incomplete") and response.store is True
        assert counted.input_tokens == response.usage.input_tokens  # the count renders the stored history too
        assert response.previous_response_id == previous
        whole = client.responses.create(model="embedded", input=_explicit_items(turns, question), store=False, **GREEDY)
        assert response.usage.input_tokens == whole.usage.input_tokens, len(turns)
        assert response.output_text == whole.output_text
        if turns:
            assert response.usage.input_tokens > turns[-1][1].usage.input_tokens
        turns.append((question, response))
    return turns


def test_five_turns_chained_by_previous_response_id(served: Served):
    turns = _chain(served, 5)
    client = served.client()
    last = client.responses.retrieve(turns[-1][1].id)
    assert last.id == turns[-1][1].id and last.output_text == turns[-1][1].output_text
    items = client.responses.input_items.list(turns[-1][1].id)
    assert [item.content[0].text for item in items.data] == [USER_TURNS[4]]  # only that turn's input


def test_a_chain_goes_on_after_a_restart(served: Served):
    turns = _chain(served, 3)
    served.restart()  # same store file, new processes
    turns = _chain(served, 2, start=turns)
    assert len(turns) == 5
    again = served.client().responses.retrieve(turns[2][1].id)  # stored before the restart
    assert again.output_text == turns[2][1].output_text


def test_a_response_is_its_own_keys_alone(served: Served):
    mine = served.client(KEY_A).responses.create(model="embedded", input="hello", **GREEDY)
    theirs = served.client(KEY_B)
    with pytest.raises(openai.NotFoundError) as missing:
        theirs.responses.retrieve(mine.id)
    assert missing.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError) as missing:
        theirs.responses.create(model="embedded", input="go on", previous_response_id=mine.id, **GREEDY)
    assert missing.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        theirs.responses.input_items.list(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.delete(mine.id)
    no_key = httpx.get(f"{served.url}/v1/responses/{mine.id}", timeout=30)
    assert no_key.status_code == 404 and no_key.json()["error"]["param"] == "response_id"
    assert served.client(KEY_A).responses.retrieve(mine.id).id == mine.id


def test_get_delete_and_input_items_pages(served: Served):
    client = served.client()
    inputs = [{"role": "user", "content": f"line {i}"} for i in range(5)]
    response = client.responses.create(model="embedded", input=inputs, instructions="Be brief.", **GREEDY)
    page = client.responses.input_items.list(response.id, limit=2, order="asc")
    assert [item.content[0].text for item in page.data] == ["line 0", "line 1"] and page.has_more
    rest = client.responses.input_items.list(response.id, limit=10, order="asc", after=page.data[-1].id)
    assert [item.content[0].text for item in rest.data] == ["line 2", "line 3", "line 4"] and not rest.has_more
    newest = client.responses.input_items.list(response.id, limit=1)  # desc by default
    assert newest.data[0].content[0].text == "line 4"
    every = [item.content[0].text for item in client.responses.input_items.list(response.id, limit=1, order="asc")]
    assert every == [f"line {i}" for i in range(5)]  # the SDK follows the pages
    bad = httpx.get(f"{served.url}/v1/responses/{response.id}/input_items?limit=500", headers=_auth(), timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
    assert client.responses.retrieve(response.id).instructions == "Be brief."
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    unstored = client.responses.create(model="embedded", input="not kept", store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def _auth(key: str = KEY_A) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_sixteen_background_responses_polled_to_their_end_four_cancelled(served: Served):
    client = served.client()
    long = {"temperature": 0.0, "max_output_tokens": 500, "extra_body": {"ignore_eos": True}}

    def create(i: int):
        settings = long if i % 4 == 0 else GREEDY
        return client.responses.create(model="embedded", input=f"Count to {i}.", background=True, **settings)

    with ThreadPoolExecutor(16) as pool:
        created = list(pool.map(create, range(16)))
    assert all(r.status in ("queued", "in_progress") and r.background for r in created)
    to_cancel = [r.id for i, r in enumerate(created) if i % 4 == 0]
    for response_id in to_cancel:
        assert client.responses.cancel(response_id).status == "cancelled"
    final: dict[str, object] = {}

    def ended() -> bool:
        for r in created:
            if r.id not in final:
                now = client.responses.retrieve(r.id)
                if now.status not in ("queued", "in_progress"):
                    final[r.id] = now
        return len(final) == len(created)

    poll(ended, 600, what="every background response ended")
    statuses = {rid: r.status for rid, r in final.items()}
    assert all(statuses[rid] == "cancelled" for rid in to_cancel), statuses
    others = [r for rid, r in final.items() if rid not in to_cancel]
    assert all(r.status in ("completed", "incomplete") and r.output_text for r in others), statuses
    assert client.responses.cancel(to_cancel[0]).status == "cancelled"  # idempotent
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(client.responses.create(model="embedded", input="hi", **GREEDY).id)  # not background


def test_the_store_size_is_on_metrics(served: Served):
    served.client().responses.create(model="embedded", input="counted", **GREEDY)
    text = httpx.get(served.url + "/metrics", timeout=30).text
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("trtllm_store_")}
    assert values["trtllm_store_objects"] >= 1 and values["trtllm_store_bytes"] > 0
    assert values["trtllm_store_max_bytes"] == 1 << 30
    assert "trtllm_store_evictions_total" in values


def test_a_conversation_gathers_the_turns_of_its_responses(served: Served):
    client = served.client()
    conversation = client.conversations.create(items=[{"role": "user", "content": "My name is Ada."}],
                                               metadata={"topic": "names"})
    assert conversation.id.startswith("conv_") and conversation.metadata == {"topic": "names"}
    first = client.responses.create(model="embedded", input="What is my name?", conversation=conversation.id, **GREEDY)
    assert first.conversation.id == conversation.id
    seeded = [{"role": "user", "content": "My name is Ada."}, {"role": "user", "content": "What is my name?"}]
    whole = client.responses.create(model="embedded", input=seeded, store=False, **GREEDY)
    assert first.usage.input_tokens == whole.usage.input_tokens  # rendered after the conversation's items
    second = client.responses.create(model="embedded", input="Again?", conversation={"id": conversation.id}, **GREEDY)
    assert second.usage.input_tokens > first.usage.input_tokens
    items = list(client.conversations.items.list(conversation.id, order="asc", limit=2))  # the SDK follows the pages
    assert [item.type for item in items] == ["message"] * len(items) and len(items) == 5
    assert [item.role for item in items] == ["user", "user", "assistant", "user", "assistant"]
    assert items[2].content[0].text == first.output_text
    added = client.conversations.items.create(conversation.id, items=[{"role": "user", "content": "One more."}])
    one = client.conversations.items.retrieve(added.data[0].id, conversation_id=conversation.id)
    assert one.content[0].text == "One more."
    client.conversations.items.delete(added.data[0].id, conversation_id=conversation.id)
    assert len(list(client.conversations.items.list(conversation.id))) == 5
    updated = client.conversations.update(conversation.id, metadata={"topic": "greetings"})
    assert updated.metadata == {"topic": "greetings"}
    with pytest.raises(openai.NotFoundError):
        served.client(KEY_B).conversations.retrieve(conversation.id)  # another key's
    with pytest.raises(openai.NotFoundError) as missing:
        served.client(KEY_B).responses.create(model="embedded", input="hi", conversation=conversation.id, **GREEDY)
    assert missing.value.body["param"] == "conversation"
    with pytest.raises(openai.BadRequestError) as both:
        client.responses.create(model="embedded", input="hi", conversation=conversation.id, previous_response_id=first.id)
    assert "conversation" in both.value.body["message"]
    assert client.conversations.delete(conversation.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)


def test_turns_answered_by_several_processes_at_once_all_join_the_conversation(served: Served):
    client = served.client()
    conversation = client.conversations.create()

    def turn(i: int):
        return client.responses.create(model="embedded", input=f"Turn {i}.", conversation=conversation.id, store=False, **GREEDY)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(turn, range(8)))
    items = list(client.conversations.items.list(conversation.id, limit=100, order="asc"))
    inputs = sorted(item.content[0].text for item in items if item.role == "user")
    assert inputs == sorted(f"Turn {i}." for i in range(8))  # none lost to another process's write
    assert sum(item.role == "assistant" for item in items) == len(answers)
