"""TensorRT-LLM's KV cache events -> the events Dynamo's `KvEventPublisher.publish_batch` takes.

What Dynamo 1.6.1's own TensorRT-LLM worker does with `LLM.get_kv_cache_events_async` (its
`dynamo/trtllm/publisher.py`, `_normalize_kv_event`), written again for our replica's worker: a
"stored" event becomes {"type": "stored", "token_ids", "num_block_tokens", "block_hashes",
"parent_hash"} of its *full* blocks (a partial block, fewer tokens than the block size, ends the event and
its hash is remembered, so that its later "removed" is not sent: the router never saw it); hashes are
TensorRT-LLM's unsigned 64-bit values made signed; "created" carries nothing the router uses here.

`LiveBlocks` also remembers which blocks the router was told are stored, so that when the engine starts
again (tritonserver restarted: its cache is empty) the worker tells the router they are all gone.
"""

from __future__ import annotations

from collections.abc import Iterable


def to_signed_i64(value: int | None) -> int | None:
    if value is None:
        return None
    value = int(value)
    return value - (1 << 64) if value >= (1 << 63) else value


class LiveBlocks:
    """The conversion's state: partial blocks (never announced) and the blocks the router holds as stored."""

    def __init__(self, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.block_size = block_size
        self.partial: set[int] = set()
        self.stored: set[int] = set()
        self.created = 0  # "created" events seen: above 1, the engine started again

    def convert(self, events: Iterable[dict]) -> list[dict]:
        out: list[dict] = []
        for event in events:
            converted = self._one(event.get("data", event))
            if converted is not None:
                out.append(converted)
        return out

    def _one(self, data: dict) -> dict | None:
        kind = data.get("type")
        if kind == "stored":
            token_ids: list[int] = []
            counts: list[int] = []
            hashes: list[int] = []
            for block in data.get("blocks", ()):
                tokens = block.get("tokens", ())
                block_hash = to_signed_i64(block.get("block_hash"))
                if block_hash is None or len(tokens) > self.block_size:
                    return None  # not a block of this size: nothing trustworthy to announce
                if len(tokens) < self.block_size:
                    self.partial.add(block_hash)
                    break
                counts.append(len(tokens))
                hashes.append(block_hash)
                token_ids.extend(int(t["token_id"]) for t in tokens)
            if not hashes:
                return None
            self.stored.update(hashes)
            event = {"type": "stored", "token_ids": token_ids, "num_block_tokens": counts, "block_hashes": hashes,
                     "parent_hash": to_signed_i64(data.get("parent_hash"))}
            if data.get("lora_name") is not None:
                event["lora_name"] = data["lora_name"]
            return event
        if kind == "removed":
            removed = []
            for raw in data.get("block_hashes", ()):
                block_hash = to_signed_i64(raw)
                if block_hash is None:
                    continue
                if block_hash in self.partial:
                    self.partial.discard(block_hash)
                    continue
                self.stored.discard(block_hash)
                removed.append(block_hash)
            return {"type": "removed", "block_hashes": removed} if removed else None
        if kind == "created":
            self.created += 1
        return None

    def forget_all(self) -> dict | None:
        """The "removed" event of every block the router holds as stored (the engine's cache is gone)."""
        hashes = sorted(self.stored)
        self.stored.clear()
        self.partial.clear()
        return {"type": "removed", "block_hashes": hashes} if hashes else None
