"""What batches add to the store's contract, against each backend (the fixtures of test_store): an insert
that keeps the first of two (a batch line's answer is its done mark), finding by id prefix, and an update
that fails if someone wrote since the read (a runner's lease)."""

from __future__ import annotations

from test_store import ALICE, BOB, Backend, backend, postgres_url  # noqa: F401 - fixtures
from trtllm_truss.store import StoredObject


def _line(id: str, owner: str = ALICE, status: str = "succeeded", text: str = "x") -> StoredObject:
    return StoredObject("batch_answer", id, owner, status, {"text": text})


def test_add_keeps_the_first_of_two(backend: Backend):
    store = backend.open()
    assert store.add(_line("batch_1/0000001", text="first"))
    assert not store.add(_line("batch_1/0000001", text="second"))
    assert not store.add(_line("batch_1/0000001", owner=BOB, text="another owner's"))
    assert store.get("batch_answer", "batch_1/0000001", ALICE).body == {"text": "first"}
    assert store.stats().objects == 1


def test_find_by_id_prefix(backend: Backend):
    store = backend.open()
    for i in range(3):
        assert store.add(_line(f"batch_1/{i:07d}", status="succeeded" if i != 1 else "errored"))
    assert store.add(_line("batch_10/0000000"))  # a longer id with the same characters first: not batch_1's
    assert store.add(_line("batchX1/0000000"))  # '_' is no wildcard
    assert store.add(_line("batch_1/0000009", owner=BOB))
    ids = [o.id for o in store.find("batch_answer", owner=ALICE, id_prefix="batch_1/")]
    assert ids == ["batch_1/0000000", "batch_1/0000001", "batch_1/0000002"]
    assert [o.id for o in store.find("batch_answer", owner=ALICE, statuses=["errored"])] == ["batch_1/0000001"]
    assert len(store.find("batch_answer", id_prefix="batch_1/")) == 4  # every owner's
    assert store.find("batch_answer", owner=ALICE, statuses=[]) == []
    assert store.find("response", owner=ALICE) == []


def test_an_update_may_be_conditional_on_no_write_since_a_read(backend: Backend):
    store = backend.open()
    assert store.put(StoredObject("batch", "batch_1", ALICE, "in_progress", {"runner": None}))
    seen = store.get("batch", "batch_1", ALICE)
    mine = StoredObject("batch", "batch_1", ALICE, "in_progress", {"runner": "a"})
    theirs = StoredObject("batch", "batch_1", ALICE, "in_progress", {"runner": "b"})
    assert store.update(mine, if_updated_at=seen.updated_at)
    assert not store.update(theirs, if_updated_at=seen.updated_at)  # b read before a's write
    again = store.get("batch", "batch_1", ALICE)
    assert again.body == {"runner": "a"}
    assert store.update(theirs, if_updated_at=again.updated_at)
