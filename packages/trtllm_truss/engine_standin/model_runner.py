"""The model half of the stand-in: a Hugging Face causal LM, prefill one request, decode a batch.

Only this module touches `transformers` models; the scheduler works on token ids and logits.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from trtllm_truss.engine_standin.kv_cache import BatchKVCache

# peft's name for "no adapter" in a mixed batch (peft.tuners.lora, `adapter_names` rows).
BASE_ADAPTER = "__base__"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class CausalLMRunner:
    def __init__(
        self,
        model_dir: Path | str,
        *,
        device: str = "cpu",
        dtype: str | None = None,
        adapters: Mapping[str, Path] | None = None,
    ) -> None:
        """`adapters`: LoRA adapter name -> peft folder, loaded into the model with peft; a batch then
        mixes them, row by row (peft's mixed-batch inference, `adapter_names` in forward)."""
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        self.model_dir = Path(model_dir)  # its tokenizer guides decoding (engine_standin/guidance.py)
        # Half precision matmuls are slow (or missing) on CPU: compute in float32 there.
        dtype_name = dtype or ("float32" if self.device.type == "cpu" else "float16")
        if dtype_name not in _DTYPES:
            raise ValueError(f"dtype: {dtype_name!r} is not one of {sorted(_DTYPES)}")
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=_DTYPES[dtype_name])
        self.vocab_size = int(self.model.config.vocab_size)
        self.adapters = frozenset(adapters or {})
        if adapters:
            from peft import PeftModel

            (first, first_dir), *others = adapters.items()
            self.model = PeftModel.from_pretrained(self.model, str(first_dir), adapter_name=first, is_trainable=False)
            for name, directory in others:
                self.model.load_adapter(str(directory), adapter_name=name, is_trainable=False)
        self.model.to(self.device).eval()

    def _adapter_args(self, adapters: list[str | None]) -> dict:
        """peft's per-row adapter names (`__base__`: no adapter) when adapters are loaded."""
        if not self.adapters:
            if any(adapters):
                raise ValueError("no LoRA adapters are loaded")
            return {}
        return {"adapter_names": [name or BASE_ADAPTER for name in adapters]}

    @torch.inference_mode()
    def prefill(
        self,
        input_ids: list[int],
        *,
        all_logits: bool = False,
        adapter: str | None = None,
        prefix: list[list[tuple[torch.Tensor, torch.Tensor]]] | None = None,
    ) -> tuple[torch.Tensor, BatchKVCache, torch.Tensor | None]:
        """Run one prompt alone (no padding), through LoRA `adapter` (None: the base model); returns the
        last position's logits [vocab], its cache and, with `all_logits`, every position's logits
        [prompt_len, vocab] (NVIDIA's context logits).

        `prefix`: the cached KV of the prompt's first blocks (per block, per layer (keys, values) of
        [heads, block tokens, head_dim], engine_standin/kv_blocks.py): only the tokens after them are
        computed, at their positions after the prefix (`all_logits` then covers those tokens only)."""
        cache = BatchKVCache()
        if prefix:
            layers = len(prefix[0])
            cache._replace([
                (
                    torch.cat([block[layer][0] for block in prefix], dim=-2)[None],
                    torch.cat([block[layer][1] for block in prefix], dim=-2)[None],
                )
                for layer in range(layers)
            ])
            input_ids = input_ids[cache.length :]
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        # logits_to_keep=0 keeps every position.
        out = self.model(
            input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=0 if all_logits else 1,
            **self._adapter_args([adapter]),
        )
        context = out.logits[0].float().cpu() if all_logits else None
        return out.logits[0, -1].float().cpu(), cache, context

    @staticmethod
    def block_kv(cache: BatchKVCache, start: int, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, copies of the (keys, values) of positions start..end of a one-row cache (a KV block)."""
        return [(k[0, :, start:end].clone(), v[0, :, start:end].clone()) for k, v in cache.layer_tensors()]

    @torch.inference_mode()
    def decode(
        self,
        cache: BatchKVCache,
        last_tokens: list[int],
        positions: list[int],
        pads: list[int],
        adapters: list[str | None] | None = None,
    ) -> torch.Tensor:
        """One step for every row of `cache`: row i has `pads[i]` masked columns on the left and runs
        through LoRA adapter `adapters[i]` (None: the base model).

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
            **self._adapter_args(adapters or [None] * len(last_tokens)),
        )
        return out.logits[:, -1].float().cpu()
