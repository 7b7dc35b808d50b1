#!/usr/bin/env python
"""Produce the embedded LoRA adapter: a small peft LoRA for data/embedded-llama that changes its answers.

The adapter ("pirate") is trained with peft on CPU to answer any prompt (plain text or the chat
template's turns) with one fixed sentence, so its greedy output visibly differs from the base model's:

    base:    "The quick brown fox" -> (the base model's continuation)
    pirate:  "The quick brown fox" -> " Arr, matey! The sea is calm today." then </s>

Prompts are drawn with a seeded RNG from the model's own vocabulary and wrapped in the chat template
half of the time; the loss covers only the answer. Everything is seeded and the run uses one CPU thread,
so it is repeatable on a machine; the manifest records versions and the sha256 of the weights.

Output (peft format, about 130 KB) in ``data/embedded-lora/pirate/`` by default: adapter_config.json,
adapter_model.safetensors (float16) and embedded_lora_manifest.json.

    .venv/bin/python scripts/make_embedded_lora.py [--base data/embedded-llama] [--out data/embedded-lora/pirate]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSWER = " Arr, matey! The sea is calm today."
# NVIDIA's names for these Llama modules are attn_q, attn_k, attn_v, attn_dense (TensorRT-LLM lora_manager.py,
# get_default_trtllm_modules_to_hf_modules).
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _prompts(tokenizer, rng: random.Random, count: int) -> list[list[int]]:
    """Token ids of `count` prompts: 3..24 ordinary vocabulary pieces, half of them as a chat turn."""
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    prompts = []
    for _ in range(count):
        text = tokenizer.decode([rng.choice(vocab) for _ in range(rng.randint(3, 24))])
        if rng.random() < 0.5:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        else:
            ids = tokenizer(text)["input_ids"]
        prompts.append(ids)
    return prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, default=ROOT / "data" / "embedded-llama")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "embedded-lora" / "pirate")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args(argv)

    import peft
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    rng = random.Random(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(args.base))
    model = AutoModelForCausalLM.from_pretrained(str(args.base), dtype=torch.float32)
    config = LoraConfig(
        r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=TARGET_MODULES, task_type="CAUSAL_LM"
    )
    model = get_peft_model(model, config)
    answer = tokenizer(ANSWER, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    pad = tokenizer.pad_token_id
    started = time.monotonic()
    loss_value = float("nan")
    for step in range(args.steps):
        rows = [p + answer for p in _prompts(tokenizer, rng, args.batch_size)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
            labels[i, len(row) - len(answer) : len(row)] = torch.tensor(answer)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_value = float(loss.detach())
        if step % 25 == 0:
            print(f"step {step} loss {loss_value:.4f}", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.float16)
    model.save_pretrained(str(args.out))
    (args.out / "README.md").unlink(missing_ok=True)  # peft's model-card template: nothing of ours
    adapter_config = json.loads((args.out / "adapter_config.json").read_text())
    adapter_config["base_model_name_or_path"] = "data/embedded-llama"  # not this machine's absolute path
    adapter_config["target_modules"] = sorted(adapter_config["target_modules"])  # peft writes a set's order
    (args.out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    weights = (args.out / "adapter_model.safetensors").read_bytes()
    manifest = {
        "script": "scripts/make_embedded_lora.py",
        "base": "data/embedded-llama",
        "answer": ANSWER,
        "seed": args.seed,
        "rank": args.rank,
        "target_modules": TARGET_MODULES,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "final_loss": round(loss_value, 4),
        "train_seconds": round(time.monotonic() - started, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "adapter_model_sha256": hashlib.sha256(weights).hexdigest(),
    }
    (args.out / "embedded_lora_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
