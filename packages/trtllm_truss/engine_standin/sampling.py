"""Turning one decode step's logits into the next token of every running sequence.

Order and semantics follow TensorRT-LLM's `batchApplyPenalty` kernel and sampling layers:
the embedding bias (added to the logits), temperature (logits / T), then for every token already present in the sequence (prompt included)
the repetition penalty (logit < 0 ? logit * p : logit / p), the presence penalty (- p) and the
frequency penalty (- p * count); the end token is masked until `min_length` tokens are generated;
bad words are masked; then greedy (top_k == 1, or top_k == 0 and top_p == 0) or top-k then top-p
sampling. Each request owns a seeded `torch.Generator` and draws exactly one number per step, so its
output does not depend on which other requests share the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trtllm_truss.engine_standin.types import GenerationRequest
from trtllm_truss.engine_standin.words import banned_next_tokens


@dataclass
class SequenceSamplingState:
    """Per-request state the sampler needs between steps."""

    request: GenerationRequest
    tokens: list[int]  # prompt + generated so far
    vocab_size: int
    generated: int = 0
    generator: torch.Generator | None = None
    counts: torch.Tensor | None = None  # occurrences of each token, only when penalties are used

    def __post_init__(self) -> None:
        sampling = self.request.sampling
        if not sampling.greedy:
            self.generator = torch.Generator().manual_seed(int(sampling.random_seed) & 0xFFFF_FFFF_FFFF_FFFF)
        if sampling.has_penalties:
            self.counts = torch.zeros(self.vocab_size, dtype=torch.float32)
            ids = torch.tensor([t for t in self.tokens if 0 <= t < self.vocab_size], dtype=torch.long)
            self.counts.index_add_(0, ids, torch.ones(len(ids)))

    def append(self, token: int) -> None:
        self.tokens.append(token)
        self.generated += 1
        if self.counts is not None and 0 <= token < self.vocab_size:
            self.counts[token] += 1


NEG_INF = float("-inf")


def _top_k_top_p_filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) what top-k then top-p excludes; `logits` is one row."""
    if top_k > 0 and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # probability mass ranked above each token
        drop = before >= top_p
        drop[0] = False  # the most likely token always stays
        logits = logits.clone()
        logits[order[drop]] = NEG_INF
    return logits


def process_logits(logits: torch.Tensor, states: list[SequenceSamplingState]) -> torch.Tensor:
    """Temperature, penalties, min_length and bad words applied to [batch, vocab] logits (a new tensor)."""
    logits = logits.float().clone()
    rows = range(len(states))
    for i in rows:
        bias = states[i].request.embedding_bias
        if bias is not None:
            n = min(len(bias), logits.shape[1])
            logits[i, :n] += torch.tensor(bias[:n], dtype=torch.float32)

    temperatures = [s.request.sampling.temperature for s in states]
    if any(t != 1.0 for t in temperatures):
        inv = torch.tensor([1.0 / (t + 1e-6) if t != 1.0 else 1.0 for t in temperatures])
        logits = logits * inv[:, None]

    penalized = [i for i in rows if states[i].counts is not None]
    if penalized:
        index = torch.tensor(penalized)
        sub = logits[index]
        counts = torch.stack([states[i].counts for i in penalized])
        present = counts > 0
        rep = torch.tensor([states[i].request.sampling.repetition_penalty for i in penalized])[:, None]
        pres = torch.tensor([states[i].request.sampling.presence_penalty for i in penalized])[:, None]
        freq = torch.tensor([states[i].request.sampling.frequency_penalty for i in penalized])[:, None]
        penalized_logits = torch.where(sub < 0, sub * rep, sub / rep) - pres - freq * counts
        logits[index] = torch.where(present, penalized_logits, sub)

    for i in rows:
        state = states[i]
        request = state.request
        end_id = request.end_id
        if end_id is not None and state.generated < request.sampling.min_length and 0 <= end_id < logits.shape[1]:
            logits[i, end_id] = NEG_INF
        if request.bad_words:
            banned = [t for t in banned_next_tokens(state.tokens, request.bad_words) if 0 <= t < logits.shape[1]]
            if banned:
                logits[i, banned] = NEG_INF
    return logits


def select_next_tokens(
    logits: torch.Tensor,
    states: list[SequenceSamplingState],
    want_log_probs: bool,
    constrain: Callable[[torch.Tensor], None] | None = None,
    top_counts: list[int] | None = None,
) -> tuple[list[int], list[float] | None, list | None]:
    """`logits`: [batch, vocab] for the last position of each sequence in `states` order.
    `constrain` masks the processed logits in place (guided decoding) before anything is chosen, so
    log probabilities are those of the masked distribution (renormalised over the allowed tokens),
    after temperature and penalties and before top-k / top-p, as for unguided rows. `top_counts`: per
    row, how many most likely tokens of that distribution to return (num_top_log_probs) besides the
    chosen one's log prob."""
    logits = process_logits(logits, states)
    if constrain is not None:
        constrain(logits)
    rows = range(len(states))
    chosen = torch.argmax(logits, dim=-1).tolist()
    for i in rows:
        state = states[i]
        if state.generator is None:
            continue
        sampling = state.request.sampling
        row = _top_k_top_p_filter(logits[i], sampling.top_k, sampling.top_p)
        probs = torch.softmax(row, dim=-1)
        chosen[i] = int(torch.multinomial(probs, 1, generator=state.generator).item())

    log_probs: list[float] | None = None
    tops: list | None = None
    if want_log_probs:
        log_softmax = torch.log_softmax(logits, dim=-1)
        log_probs = log_softmax[torch.arange(len(states)), torch.tensor(chosen)].tolist()
        k = max(top_counts or [0])
        if k:  # the k most likely of the same distribution, per row: (ids, log probs), largest first
            values, ids = torch.topk(log_softmax, min(k, log_softmax.shape[-1]), dim=-1)
            tops = [
                (ids[i, :n].tolist(), values[i, :n].tolist()) if (n := top_counts[i]) else None
                for i in rows
            ]
    return chosen, log_probs, tops
