"""The model half of the stand-in: a Hugging Face causal LM, prefill one request, decode a batch.

Only this module touches `transformers` models; the scheduler works on token ids and logits.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trtllm_truss.engine_standin.kv_cache import BatchKVCache

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class CausalLMRunner:
    def __init__(self, model_dir: Path | str, *, device: str = "cpu", dtype: str | None = None) -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        self.model_dir = Path(model_dir)  # its tokenizer guides decoding (engine_standin/guidance.py)
        # Half precision matmuls are slow (or missing) on CPU: compute in float32 there.
        dtype_name = dtype or ("float32" if self.device.type == "cpu" else "float16")
        if dtype_name not in _DTYPES:
            raise ValueError(f"dtype: {dtype_name!r} is not one of {sorted(_DTYPES)}")
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=_DTYPES[dtype_name])
        self.model.to(self.device).eval()
        self.vocab_size = int(self.model.config.vocab_size)

    @torch.inference_mode()
    def prefill(self, input_ids: list[int], *, all_logits: bool = False) -> tuple[torch.Tensor, BatchKVCache, torch.Tensor | None]:
        """Run one prompt alone (no padding); returns the last position's logits [vocab], its cache
        and, with `all_logits`, every position's logits [prompt_len, vocab] (NVIDIA's context logits)."""
        cache = BatchKVCache()
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        # logits_to_keep=0 keeps every position.
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=0 if all_logits else 1)
        context = out.logits[0].float().cpu() if all_logits else None
        return out.logits[0, -1].float().cpu(), cache, context

    @torch.inference_mode()
    def decode(self, cache: BatchKVCache, last_tokens: list[int], positions: list[int], pads: list[int]) -> torch.Tensor:
        """One step for every row of `cache`: row i has `pads[i]` masked columns on the left.

        Returns logits [batch, vocab] (float32, on CPU).
        """
        width = cache.length + 1
        pad = torch.tensor(pads, dtype=torch.long, device=self.device)
        mask = (torch.arange(width, device=self.device)[None, :] >= pad[:, None]).long()
        out = self.model(
            input_ids=torch.tensor(last_tokens, dtype=torch.long, device=self.device)[:, None],
            position_ids=torch.tensor(positions, dtype=torch.long, device=self.device)[:, None],
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        )
        return out.logits[:, -1].float().cpu()
