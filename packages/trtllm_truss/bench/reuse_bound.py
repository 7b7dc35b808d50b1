"""A trace's own upper bound on KV cache reuse, and the reuse a finite LRU pool would get.

A prompt is a sequence of blocks; only full blocks are reusable (paged KV caches reuse whole blocks, and
a block's identity chains its parents': the same block after another prefix is another block). Blocks
are given per prompt as a sequence of keys (a trace's hash ids, or the token ids of each block of the
prompts actually sent), each key standing for `block_tokens` tokens; a prompt lists only its full blocks.

- infinite cache: every full block is found wherever it was computed before. For each request the
  longest prefix of its blocks that some earlier request also had, in tokens. This is the upper bound
  for any number of replicas too: an ideal router sends each request where its prefix is, and a
  replica with an unbounded pool keeps everything.
- finite pool: one pool of `pool_blocks` blocks shared by every request, least recently used evicted
  first. Requests are taken one at a time in trace order; a request's blocks are touched from its last to
  its first (the order paged caches free them in), so a chain's tail leaves before its head. Not a strict
  bound (LRU is not the optimal policy), a reference for a fleet whose pools add up to `pool_blocks`.

Only prompt blocks count: the blocks an engine stores for the tokens it generates are not in a trace.
With the prompts' lengths (`input_tokens`), a hit also stops before the block that holds a prompt's last
token: engines always compute that token (its logits give the first output token), so TensorRT-LLM and
vLLM never report it cached, though the block, once computed, serves later requests.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable, Sequence

BlockKeys = Sequence[Hashable]


@dataclass
class ReuseBound:
    """Reusable prompt tokens per request and in total."""

    block_tokens: int
    per_request: list[int] = field(default_factory=list)  # reusable tokens of request i
    pool_blocks: int | None = None  # None: an infinite cache

    @property
    def cached_tokens(self) -> int:
        return sum(self.per_request)

    def as_dict(self, input_tokens: int | None = None) -> dict:
        summary: dict = {
            "cache": "infinite" if self.pool_blocks is None else "lru",
            "pool_blocks": self.pool_blocks,
            "block_tokens": self.block_tokens,
            "requests": len(self.per_request),
            "cached_tokens": self.cached_tokens,
        }
        if input_tokens is not None:
            summary["input_tokens"] = input_tokens
            summary["cached_fraction"] = self.cached_tokens / input_tokens if input_tokens else None
        return summary


class _Chains:
    """Numbers each (parent chain, block key) once, so that a block's identity includes its prefix."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, Hashable], int] = {}

    def of(self, blocks: BlockKeys) -> list[int]:
        chain, parent = [], -1
        for key in blocks:
            parent = self._ids.setdefault((parent, key), len(self._ids))
            chain.append(parent)
        return chain


def _reusable(chain: list[int], input_tokens: Sequence[int] | None, i: int, block_tokens: int) -> int:
    """Blocks of request i that may be hits: all its full blocks, or those before its last token's."""
    return len(chain) if input_tokens is None else min(len(chain), (input_tokens[i] - 1) // block_tokens)


def infinite_cache_reuse(
    prompts: Sequence[BlockKeys], block_tokens: int, input_tokens: Sequence[int] | None = None
) -> ReuseBound:
    """The trace's upper bound: each request's longest prefix of full blocks seen in any earlier request."""
    chains = _Chains()
    seen: set[int] = set()
    bound = ReuseBound(block_tokens=block_tokens)
    for i, blocks in enumerate(prompts):
        chain = chains.of(blocks)
        hit, reusable = 0, _reusable(chain, input_tokens, i, block_tokens)
        while hit < reusable and chain[hit] in seen:
            hit += 1
        bound.per_request.append(hit * block_tokens)
        seen.update(chain)
    return bound


def lru_pool_reuse(
    prompts: Sequence[BlockKeys], block_tokens: int, pool_blocks: int, input_tokens: Sequence[int] | None = None
) -> ReuseBound:
    """Reuse with one shared pool of `pool_blocks` blocks, least recently used evicted first."""
    if pool_blocks < 1:
        raise ValueError(f"pool_blocks: expected a positive number of blocks, got {pool_blocks}")
    chains = _Chains()
    pool: OrderedDict[int, None] = OrderedDict()  # oldest first
    bound = ReuseBound(block_tokens=block_tokens, pool_blocks=pool_blocks)
    for i, blocks in enumerate(prompts):
        chain = chains.of(blocks)
        hit, reusable = 0, _reusable(chain, input_tokens, i, block_tokens)
        while hit < reusable and chain[hit] in pool:
            hit += 1
        bound.per_request.append(hit * block_tokens)
        for block in reversed(chain):
            pool[block] = None
            pool.move_to_end(block)
        while len(pool) > pool_blocks:
            pool.popitem(last=False)
    return bound


def trace_blocks(hash_ids: Sequence[int], input_tokens: int, block_tokens: int) -> list[int]:
    """The hash ids of a trace request's full blocks (its last block is partial unless the prompt fills it)."""
    return list(hash_ids[: min(len(hash_ids), input_tokens // block_tokens)])


def token_blocks(input_ids: Sequence[int], block_tokens: int) -> list[tuple[int, ...]]:
    """The full blocks of a prompt as sent, keyed by their token ids (an engine's own view)."""
    full = len(input_ids) // block_tokens
    return [tuple(input_ids[i * block_tokens:(i + 1) * block_tokens]) for i in range(full)]
