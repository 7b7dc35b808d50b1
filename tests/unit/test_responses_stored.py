"""What a stored response keeps and how it is read back (`api.responses_stored`): input items with ids,
the history a continued turn comes after, and OpenAI's list pages of input items."""

from __future__ import annotations

import pytest
from fastapi import HTTPException
from trtllm_truss.api import responses as rsp
from trtllm_truss.api import responses_stored as stored

ITEMS = stored.stored_input_items([{"role": "user", "content": f"line {i}"} for i in range(5)])


def _texts(page: dict) -> list[str]:
    return [item["content"][0]["text"] for item in page["data"]]


def test_input_items_get_ids_and_content_parts():
    items = stored.stored_input_items([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"type": "function_call_output", "call_id": "c1", "output": "1", "id": "fco_mine"},
    ])
    assert items[0]["type"] == "message" and items[0]["id"].startswith("msg_")
    assert items[0]["content"] == [{"type": "input_text", "text": "hi"}]
    assert items[1]["content"] == [{"type": "output_text", "text": "hello"}]
    assert items[2]["id"] == "fco_mine"
    assert len({item["id"] for item in items}) == 3


def test_pages_in_either_order_with_cursors():
    first = stored.input_item_page(ITEMS, {"limit": "2", "order": "asc"})
    assert _texts(first) == ["line 0", "line 1"] and first["has_more"] and first["first_id"] == ITEMS[0]["id"]
    rest = stored.input_item_page(ITEMS, {"order": "asc", "after": first["last_id"]})
    assert _texts(rest) == ["line 2", "line 3", "line 4"] and not rest["has_more"]
    newest = stored.input_item_page(ITEMS, {"limit": "2"})
    assert _texts(newest) == ["line 4", "line 3"]
    before = stored.input_item_page(ITEMS, {"order": "asc", "before": ITEMS[3]["id"], "limit": "2"})
    assert _texts(before) == ["line 1", "line 2"] and before["has_more"]
    empty = stored.input_item_page(ITEMS, {"order": "asc", "after": ITEMS[4]["id"]})
    assert empty["data"] == [] and empty["first_id"] is None and not empty["has_more"]


@pytest.mark.parametrize("query, name", [({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"limit": "x"}, "limit"),
                                         ({"order": "up"}, "order"), ({"after": "msg_nope"}, "after")])
def test_bad_list_parameters_are_a_400_naming_them(query, name):
    with pytest.raises(HTTPException) as refused:
        stored.input_item_page(ITEMS, query)
    assert refused.value.status_code == 400 and f"{name}: " in refused.value.detail


def test_a_continued_turn_comes_after_the_history_input_and_output():
    output = [{"type": "message", "id": "msg_out", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "Hello Ada.", "annotations": []}]},
              {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "lookup", "arguments": "{}", "status": "completed"}]
    first = stored.record({"output": output}, stored.stored_input_items([{"role": "user", "content": "I am Ada."}]), [])
    history = stored.continued_history(first)
    req = rsp.parse_responses_request({"input": [{"type": "function_call_output", "call_id": "call_1", "output": "42"}],
                                       "instructions": "Be brief."})
    messages = rsp.chat_messages(req, history)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2]["content"] == "Hello Ada." and messages[2]["tool_calls"][0]["id"] == "call_1"
    second = stored.record({"output": []}, stored.stored_input_items(rsp.input_items(req)), history)
    assert len(stored.continued_history(second)) == len(history) + 1  # the chain's history is copied along
