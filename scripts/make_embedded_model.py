#!/usr/bin/env python
"""Produce the embedded default model: a small Llama-architecture causal LM with a real tokenizer.

Output (Hugging Face format, < 20 MB) in ``data/embedded-llama/`` by default:
config.json, generation_config.json, model.safetensors (float16), tokenizer.json,
tokenizer_config.json, special_tokens_map.json (+ chat_template.jinja when transformers writes it
separately) and embedded_model_manifest.json (how it was made: corpus hash, seed, steps, final loss).

The text is what every Debian + CPython machine already has: Python's pydoc topics, the docstrings of
a fixed list of stdlib modules and plain-text files under /usr/share/doc, read in sorted order.
Tokenizer training is deterministic for a given corpus; model training is seeded. With
``--train-steps`` the run is fully determined by the corpus; with the default time budget
(``--train-seconds``) the number of steps depends on the machine's speed (recorded in the manifest).

    .venv/bin/python scripts/make_embedded_model.py [--out data/embedded-llama] [--train-seconds 240]

The committed data/embedded-llama was trained on a GPU with the same corpus (dumped here, replayed there):

    .venv/bin/python scripts/make_embedded_model.py --dump-corpus out/corpus.json
    python3 scripts/make_embedded_model.py --corpus out/corpus.json --device cuda --train-steps 6000 \
        --batch-size 32 --seq-len 256 --lr 2e-3

(about 80 s on one H100/H200; the CPU default gives a weaker model with the same files and sizes).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import math
import random
import sys
import time
import warnings
from pathlib import Path

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
VOCAB_SIZE = 4096

# Modules whose docstrings are well written English prose; a fixed list keeps the corpus stable.
STDLIB_MODULES = ["abc", "argparse", "array", "ast", "asyncio", "base64", "bisect", "builtins", "calendar", "cmath", "collections", "colorsys", "concurrent.futures", "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "dis", "email", "enum", "fileinput", "fnmatch", "fractions", "functools", "gettext", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "http.client", "http.server", "imaplib", "importlib", "inspect", "io", "ipaddress", "itertools", "json", "logging", "lzma", "mailbox", "math", "mimetypes", "multiprocessing", "numbers", "operator", "optparse", "os", "pathlib", "pickle", "pkgutil", "platform", "plistlib", "pprint", "profile", "queue", "random", "re", "sched", "secrets", "selectors", "shelve", "shlex", "shutil", "signal", "smtplib", "socket", "socketserver", "sqlite3", "ssl", "statistics", "string", "struct", "subprocess", "symtable", "sys", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "traceback", "turtle", "types", "typing", "unittest", "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "weakref", "xml.dom.minidom", "xml.etree.ElementTree", "zipfile", "zlib"]

# A simple chat format, tools-aware in Hermes' style (tools listed in a system turn, calls as
# <tool_call>{json}</tool_call>, results as <tool_response>); the tokenizer adds <s> itself, so the
# template does not. Kept in data/embedded-llama/chat_template.jinja (read from there).
CHAT_TEMPLATE = (Path(__file__).resolve().parent.parent / "data/embedded-llama/chat_template.jinja").read_text()


def pydoc_topics() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics)]


def stdlib_docstrings() -> list[str]:
    texts: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in STDLIB_MODULES:
            try:
                module = importlib.import_module(name)
            except ImportError:  # a module missing from this build of Python is simply skipped
                continue
            seen: set[int] = set()
            for obj in [module, *(getattr(module, attr, None) for attr in sorted(dir(module)))]:
                doc = inspect.getdoc(obj) if obj is not None else None
                if doc and len(doc) > 80 and id(doc) not in seen:
                    seen.add(id(doc))
                    texts.append(doc)
    return texts


def usr_share_doc(root: Path = Path("/usr/share/doc"), max_bytes: int = 3_000_000) -> list[str]:
    """Plain-text READMEs and notes (not changelogs or licences, which are mostly lists and legalese)."""
    texts: list[str] = []
    total = 0
    if not root.is_dir():
        return texts
    for path in sorted(root.rglob("*")):
        name = path.name.lower()
        if not path.is_file() or path.is_symlink() or path.suffix in {".gz", ".bz2", ".xz", ".html"}:
            continue
        if not (name.startswith("readme") or name.endswith((".txt", ".md"))):
            continue
        try:
            text = path.read_bytes()[:200_000].decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def build_corpus(include_usr_share_doc: bool) -> list[str]:
    docs = pydoc_topics() + stdlib_docstrings()
    if include_usr_share_doc:
        docs += usr_share_doc()
    return [d.strip() for d in docs if d.strip()]


def train_tokenizer(docs: list[str]):
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    # Byte-level: every UTF-8 string (emoji, CJK) has an exact encoding and decodes back unchanged.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(docs, trainer=trainer, length=len(docs))
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def wrap_tokenizer(tokenizer):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def check_round_trip(fast) -> None:
    samples = ["Hello, world!", "  leading and trailing  ", "emoji 🦙🚀 and CJK 你好，世界 / こんにちは", "tab\tnew\nline"]
    for text in samples:
        ids = fast(text, add_special_tokens=False)["input_ids"]
        back = fast.decode(ids)
        if back != text:
            raise SystemExit(f"tokenizer round trip failed: {text!r} -> {back!r}")


def train_model(args, fast, docs: list[str]):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        rms_norm_eps=1e-5,
    )
    model = LlamaForCausalLM(config).to(args.device)

    # One token stream, documents separated by </s>; training windows are drawn from it at random.
    stream: list[int] = []
    for encoding in fast.backend_tokenizer.encode_batch(docs, add_special_tokens=False):
        stream.extend(encoding.ids)
        stream.append(fast.eos_token_id)
    data = torch.tensor(stream, dtype=torch.long, device=args.device)
    generator = torch.Generator().manual_seed(args.seed)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    model.train()
    start = time.monotonic()
    step, loss_value = 0, float("nan")
    while True:
        elapsed = time.monotonic() - start
        progress = step / args.train_steps if args.train_steps else elapsed / args.train_seconds
        if progress >= 1.0:
            break
        # Linear warm-up over the first 5 %, then cosine decay to 10 % of the peak.
        scale = min(1.0, progress / 0.05) if progress < 0.05 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = args.lr * scale
        starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch_size,), generator=generator)
        batch = data[starts[:, None].to(data.device) + torch.arange(args.seq_len, device=data.device)]
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        loss_value = loss.item()
        if step % 25 == 0:
            print(f"step {step} loss {loss_value:.3f} elapsed {elapsed:.0f}s", flush=True)
    model.eval().cpu()
    return model, {"steps": step, "final_loss": round(loss_value, 4), "train_tokens": len(stream)}


def finish_tokenizer_files(out: Path, fast) -> None:
    """Make the tokenizer loadable by older transformers and by tools that read the classic files."""
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # 5.x writes its own "TokenizersBackend"
    config["chat_template"] = CHAT_TEMPLATE
    config.pop("backend", None)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    for path in out.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; the files are committed and shared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "embedded-llama")
    parser.add_argument("--train-seconds", type=float, default=240.0, help="training time budget")
    parser.add_argument("--train-steps", type=int, default=0, help="train exactly this many steps (overrides the time budget)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the machine is shared)")
    parser.add_argument("--no-usr-share-doc", action="store_true", help="only Python's own text (portable corpus)")
    parser.add_argument("--device", default="cpu", help="torch device to train on (cpu, cuda)")
    parser.add_argument("--dump-corpus", type=Path, help="write the corpus (JSON list of documents) here and exit")
    parser.add_argument("--corpus", type=Path, help="read the corpus from a --dump-corpus file (same text on another machine)")
    args = parser.parse_args(argv)

    random.seed(args.seed)
    if args.corpus:
        docs = json.loads(args.corpus.read_text(encoding="utf-8"))
    else:
        docs = build_corpus(include_usr_share_doc=not args.no_usr_share_doc)
    if args.dump_corpus:
        args.dump_corpus.write_text(json.dumps(docs, ensure_ascii=False), encoding="utf-8")
        print(f"wrote {len(docs)} documents to {args.dump_corpus}")
        return 0
    corpus_sha = hashlib.sha256("\x00".join(docs).encode()).hexdigest()
    print(f"corpus: {len(docs)} documents, {sum(map(len, docs))} characters, sha256 {corpus_sha[:16]}", flush=True)

    fast = wrap_tokenizer(train_tokenizer(docs))
    check_round_trip(fast)
    model, stats = train_model(args, fast, docs)

    import torch
    from transformers import GenerationConfig

    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(args.out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, do_sample=False
    ).save_pretrained(args.out)
    fast.save_pretrained(args.out)
    finish_tokenizer_files(args.out, fast)
    manifest = {
        "script": "scripts/make_embedded_model.py",
        "seed": args.seed,
        "corpus_documents": len(docs),
        "corpus_sha256": corpus_sha,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "device": args.device,
        "vocab_size": len(fast),
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "lr": args.lr,
        **stats,
    }
    (args.out / "embedded_model_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    size = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(f"wrote {args.out} ({size / 1e6:.1f} MB): {stats}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
