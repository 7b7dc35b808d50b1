"""Tokenizer directories written at test time (no downloads): a Llama-3-style byte-level BPE with
Llama-3's special tokens and chat template, a Mistral-style sentencepiece `tokenizer.model` (trained
here with sentencepiece's own trainer) with Mistral's v1 template, and a remote-code variant of it
whose tokenizer class ships with the "model" and has no fast version.

The chat templates are written from the published Llama-3-Instruct and Mistral-Instruct-v0.1
templates (they put `bos_token` in the text, which is what makes a second BOS possible).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, processors

REPO_ROOT = Path(__file__).resolve().parents[1]
EMBEDDED_TOKENIZER_DIR = REPO_ROOT / "data" / "embedded-llama"

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

_SPM_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello there, how are you today? I am fine, thank you.",
    "Tokenizers turn text into token ids and back into text.",
    "Special tokens such as the beginning of a sequence mark structure.",
    "café naïve résumé — déjà vu",
    "你好，世界。这是一个测试。",
    "Numbers: 12345 67890, symbols: [INST] [/INST] <> {} ()",
] * 20


def llama3_dir(tmp_path: Path) -> Path:
    """The embedded model's byte-level BPE with Llama-3's special tokens, BOS post-processor and template."""
    out = tmp_path / "llama3-style"
    out.mkdir()
    tokenizer = Tokenizer.from_file(str(EMBEDDED_TOKENIZER_DIR / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIALS])
    bos_id = tokenizer.token_to_id("<|begin_of_text|>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos_id)],
    )
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "clean_up_tokenization_spaces": False,
        "chat_template": LLAMA3_TEMPLATE,
    }))
    return out


def train_sentencepiece() -> bytes:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_SPM_CORPUS), model_writer=model, vocab_size=400, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        pad_piece="<pad>", minloglevel=2,
        # as Llama/Mistral models: no NFKC, whitespace kept (what transformers' converter reproduces)
        normalization_rule_name="identity", remove_extra_whitespaces=False,
    )
    return model.getvalue()


def mistral_dir(tmp_path: Path, name: str = "mistral-style") -> Path:
    """A sentencepiece `tokenizer.model` only (no tokenizer.json), Llama/Mistral tokenizer class."""
    out = tmp_path / name
    out.mkdir()
    (out / "tokenizer.model").write_bytes(train_sentencepiece())
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
        "add_bos_token": True, "add_eos_token": False, "legacy": False,
        "chat_template": MISTRAL_TEMPLATE,
    }))
    return out


REMOTE_TOKENIZER_CODE = '''
from transformers.tokenization_utils_sentencepiece import SentencePieceBackend


class RemoteSpmTokenizer(SentencePieceBackend):
    """A slow-only tokenizer shipped with a model's files (as ChatGLM's or Baichuan's)."""

    model_input_names = ["input_ids", "attention_mask"]

    def convert_tokens_to_string(self, tokens):
        # sentencepiece's own decoding: byte-fallback pieces become bytes, an incomplete
        # character U+FFFD (as the slow Llama tokenizer of transformers 4 decoded).
        return self.sp_model.decode_pieces(tokens)

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        ids = [self.bos_token_id] + token_ids_0
        return ids if token_ids_1 is None else ids + [self.bos_token_id] + token_ids_1
'''


def remote_code_dir(tmp_path: Path) -> Path:
    out = mistral_dir(tmp_path, "remote-code")
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "RemoteSpmTokenizer"
    config["auto_map"] = {"AutoTokenizer": ["tokenization_remote.RemoteSpmTokenizer", None]}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "tokenization_remote.py").write_text(REMOTE_TOKENIZER_CODE)
    return out
