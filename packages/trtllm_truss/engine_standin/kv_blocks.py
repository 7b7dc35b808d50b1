"""A paged KV block pool with prefix reuse, as TensorRT-LLM's KV cache manager keeps it.

A prompt is cut into blocks of `tokens_per_block` tokens. A *full* block is known by a key that chains
its parent's key, its own tokens and the request's LoRA task id, so a block is found again only after
the very same prefix under the same adapter (TensorRT-LLM's block key: tokens + LoRA task id, under its
parent in the radix tree). A new request reuses the longest run of cached full blocks from the start of
its prompt, and never its last prompt token (that one is computed to produce the first token's logits,
as TensorRT-LLM does). Partial blocks are not kept for reuse.

The pool is finite (`max_blocks`). Blocks a running request holds are referenced and never evicted;
once no request holds a block it stays cached, and the least recently used free blocks are evicted when
a new block needs room (leaves before their parents: a chain is released last block first). When every
block is held, the rest of a new prompt is simply not cached (it still runs: the stand-in's running
batch keeps its own KV apart from the pool); `store_misses` counts those blocks.

With reuse off (`enable_kv_cache_reuse: false`) nothing is matched or kept; the block counts of a
request are still reported (all new). Events go to a `KVEventBuffer` ("stored" when blocks enter the
cache, "removed" when they are evicted).

Each block's payload is what the engine keeps of it: the model engine's per-layer KV tensors of those
tokens, nothing for the synthetic engine.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trtllm_truss.engine_standin.kv_events import KVEventBuffer

_NO_PARENT = 0xFFFFFFFFFFFFFFFF
_NO_LORA = -1


def block_key(parent: int | None, tokens: Sequence[int], lora_task_id: int | None) -> int:
    """The unsigned 64-bit key of a full block: its parent's key, its LoRA task id and its tokens."""
    header = struct.pack("<Qq", _NO_PARENT if parent is None else parent, _NO_LORA if lora_task_id is None else lora_task_id)
    body = struct.pack(f"<{len(tokens)}q", *tokens)
    return int.from_bytes(hashlib.blake2b(header + body, digest_size=8).digest(), "little")


@dataclass(eq=False)
class Block:
    key: int
    parent: Block | None
    tokens: tuple[int, ...]
    payload: object = None
    refs: int = 0
    children: set[int] = field(default_factory=set)


@dataclass
class Lease:
    """The blocks one request holds, and its block counts (NVIDIA's per-request KV cache metrics)."""

    lora_task_id: int | None
    blocks: list[Block]  # held, in prefix order: the reused ones first, then those this request stored
    reused_blocks: int
    total_blocks: int  # blocks of the prompt (the last, partial one included)
    tokens_per_block: int

    @property
    def reused_tokens(self) -> int:
        return self.reused_blocks * self.tokens_per_block

    @property
    def new_blocks(self) -> int:
        return self.total_blocks - self.reused_blocks

    @property
    def reused_payloads(self) -> list[object]:
        return [block.payload for block in self.blocks[: self.reused_blocks]]


class BlockPool:
    """See the module docstring. Thread-safe (the engine thread uses it; stats are read elsewhere)."""

    def __init__(
        self, tokens_per_block: int, max_blocks: int, *, reuse: bool = True, events: KVEventBuffer | None = None
    ) -> None:
        if tokens_per_block < 1:
            raise ValueError(f"tokens_per_block: must be >= 1, got {tokens_per_block}")
        if max_blocks < 1:
            raise ValueError(f"max_blocks: must be >= 1, got {max_blocks}")
        self.tokens_per_block = tokens_per_block
        self.max_blocks = max_blocks
        self.reuse = reuse
        self.events = events
        self._blocks: dict[int, Block] = {}
        self._free: OrderedDict[int, Block] = OrderedDict()  # unreferenced cached blocks, least recent first
        self._lock = threading.Lock()
        self.store_misses = 0  # full prompt blocks not cached because every block was held
        self.reused_blocks_total = 0
        self.missed_blocks_total = 0
        if events is not None:
            events.created(max_blocks)

    # ----------------------------------------------------------------- state
    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)

    @property
    def free_blocks(self) -> int:
        """Blocks not held by a request: never used, or cached and evictable."""
        with self._lock:
            return self.max_blocks - len(self._blocks) + len(self._free)

    def __contains__(self, key: int) -> bool:
        return key in self._blocks

    # ----------------------------------------------------------- a request
    def acquire(self, input_ids: Sequence[int], lora_task_id: int | None = None, *, match: bool = True) -> Lease:
        """Match and hold the cached full blocks that prefix `input_ids` (at most all but its last token);
        `match` false: none (the request computes its whole prompt, and may still store its blocks)."""
        size = self.tokens_per_block
        total = -(-len(input_ids) // size)
        matched: list[Block] = []
        if self.reuse and match:
            with self._lock:
                parent: Block | None = None
                for index in range(max(len(input_ids) - 1, 0) // size):
                    tokens = tuple(input_ids[index * size : (index + 1) * size])
                    block = self._blocks.get(block_key(parent.key if parent else None, tokens, lora_task_id))
                    if block is None or block.tokens != tokens:
                        break
                    self._hold(block)
                    matched.append(block)
                    parent = block
                self.reused_blocks_total += len(matched)
                self.missed_blocks_total += total - len(matched)
        return Lease(lora_task_id, matched, len(matched), total, size)

    def store(self, lease: Lease, input_ids: Sequence[int], payload: Callable[[int], object] | None = None) -> int:
        """Cache the full blocks of `input_ids` after the lease's own, held by it; `payload(i)` gives block
        i's payload. Returns how many blocks were stored (fewer when every block is held)."""
        if not self.reuse:
            return 0
        size = self.tokens_per_block
        full = len(input_ids) // size
        stored: list[Block] = []
        removed: list[int] = []
        with self._lock:
            parent = lease.blocks[-1] if lease.blocks else None
            for index in range(len(lease.blocks), full):
                tokens = tuple(input_ids[index * size : (index + 1) * size])
                key = block_key(parent.key if parent else None, tokens, lease.lora_task_id)
                block = self._blocks.get(key)
                if block is None:
                    if len(self._blocks) >= self.max_blocks and not self._evict_one(removed):
                        self.store_misses += full - index
                        break
                    block = Block(key, parent, tokens, payload(index) if payload else None)
                    self._blocks[key] = block
                    if parent is not None:
                        parent.children.add(key)
                    stored.append(block)
                # else: another request stored the same block meanwhile: share it.
                self._hold(block)
                lease.blocks.append(block)
                parent = block
        if self.events is not None:
            self.events.removed(removed)
            if stored:
                first_parent = stored[0].parent
                self.events.stored(first_parent.key if first_parent else None, [(b.key, b.tokens) for b in stored])
        return len(stored)

    def release(self, lease: Lease) -> None:
        """The request is done with its blocks: they stay cached, evictable (last block first)."""
        with self._lock:
            for block in reversed(lease.blocks):
                block.refs -= 1
                if block.refs == 0:
                    self._free[block.key] = block
            lease.blocks = []

    # --------------------------------------------------------------- inside
    def _hold(self, block: Block) -> None:
        if block.refs == 0:
            self._free.pop(block.key, None)
        block.refs += 1

    def _evict_one(self, removed: list[int]) -> bool:
        """Evict the least recently used free block (and its cached descendants, unreachable without it)."""
        if not self._free:
            return False
        _, block = self._free.popitem(last=False)
        stack = [block]
        while stack:
            victim = stack.pop()
            self._blocks.pop(victim.key, None)
            self._free.pop(victim.key, None)
            removed.append(victim.key)
            stack.extend(self._blocks[key] for key in victim.children if key in self._blocks)
            if victim.parent is not None:
                victim.parent.children.discard(victim.key)
            victim.payload = None
        return True
