"""The prompt side of the tokenizer: chat templates, prompt token ids and counts, loaded once.

`PromptTokenizer.chat_ids(messages)` and `prompt_ids(text)` give the token ids a request sends to the
engine. They are what the model's own template and tokenizer give (`apply_chat_template(messages,
tokenize=True, add_generation_prompt=True)`: the rendered chat is tokenized *without* adding special
tokens, so a template that writes `bos_token` yields exactly one BOS), computed with the `tokenizers`
backend directly (no `BatchEncoding` per call).

Special-token text in user input (`"</s>"`, `"<|eot_id|>"`) never becomes a control token in a chat:
message strings that contain a control token's text are tokenized by transformers'
`apply_chat_template(..., sanitize_control_tokens=True)`, which encodes those as ordinary text and
keeps the template's own control tokens. Strings without such text (nearly all) take the fast path,
whose ids are the same as both the sanitized and the plain `apply_chat_template`. For a raw prompt
the caller chooses (`literal_special_tokens`, default True: special-token text is plain text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_truss.api.errors import field_error
from trtllm_truss.api.native import ChatMessage

# transformers' private markers around user-supplied control tokens (utils/chat_template_utils.py,
# transformers 5.23.0); strings that contain them are changed by sanitizing, so they take the slow path.
_SANITIZE_MARKERS = ("\U000f0000", "\U000f0001")

ChatTurn = ChatMessage | tuple[str, str] | Mapping[str, Any]


def _turns(messages: Iterable[ChatTurn]) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, ChatMessage):
            turns.append({"role": message.role, "content": message.text()})
        elif isinstance(message, tuple):
            role, content = message
            turns.append({"role": role, "content": content})
        else:
            turns.append(dict(message))
    return turns


def _template_extra(tools: Sequence[Mapping[str, Any]] | None, template_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """apply_chat_template's keyword arguments beyond the turns: `tools` only when there are some
    (a template tells "no tools" by `tools is none`), then the request's template variables."""
    extra: dict[str, Any] = dict(template_kwargs or {})
    if tools:
        extra["tools"] = [dict(tool) for tool in tools]
    return extra


def _trie_pattern(texts: Iterable[str]) -> str:
    """A regex that finds any of `texts`, as a trie: Llama 3 has 256 added tokens, and a plain
    alternation of them costs ~4x as much per character of a message."""
    trie: dict[str, dict] = {}
    for text in texts:
        node = trie
        for char in text:
            node = node.setdefault(char, {})
        node[""] = {}

    def build(node: dict[str, dict]) -> str:
        branches = [re.escape(char) + build(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return build(trie) or "(?!)"


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for inner in value.values():
            yield from _strings(inner)
    elif isinstance(value, (list, tuple)):
        for inner in value:
            yield from _strings(inner)


_PROBE_KEY, _PROBE_VALUE = "probe_key", "probe_value"


def _probe_turns(arguments: Any) -> list[dict[str, Any]]:
    call = {"id": "probe0001", "type": "function", "function": {"name": "probe_fn", "arguments": arguments}}
    return [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "probe0001", "name": "probe_fn", "content": "b"},
        {"role": "user", "content": "c"},
    ]


_ESCAPED = ("&#34;", "&quot;", "&#39;")


def wants_text_arguments(render: Callable[[list[dict[str, Any]]], str]) -> bool:
    """Whether a chat template writes a call's arguments right only as JSON text: given an object it
    fails (DeepSeek V3.1 and R1 add `arguments` to strings), prints Python's repr of it, or
    HTML-escapes the quotes around it (mistral-common's templates join `arguments | tojson | safe`,
    a Markup, to plain strings, which Jinja then escapes), and given the text it does not.
    Templates that take an object (`arguments | tojson`, `arguments.items()`) get objects."""
    def rendered(arguments: Any) -> str | None:
        try:
            return render(_probe_turns(arguments))
        except Exception:  # noqa: BLE001 - the template refuses this shape
            return None

    as_object = rendered({_PROBE_KEY: _PROBE_VALUE})
    if as_object is not None and f"'{_PROBE_KEY}'" not in as_object and not any(e in as_object for e in _ESCAPED):
        return False
    as_text = rendered(json.dumps({_PROBE_KEY: _PROBE_VALUE}))
    return as_text is not None and f'"{_PROBE_KEY}"' in as_text and not any(e in as_text for e in _ESCAPED)


def _with_text_arguments(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The turns with every call's arguments as JSON text (for templates that take only text)."""
    out = []
    for turn in turns:
        calls = turn.get("tool_calls")
        if calls:
            turn = dict(turn)
            turn["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": _as_text(call["function"].get("arguments"))}}
                if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping)
                else call
                for call in calls
            ]
        out.append(turn)
    return out


def _as_text(arguments: Any) -> Any:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


@dataclass
class PromptTokenizer:
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    # Must match the preprocessing model's `add_special_tokens` so that counts agree.
    add_special_tokens: bool = True
    # The `tokenizers.Tokenizer` behind a fast transformers tokenizer: the same ids without
    # transformers' BatchEncoding per call. None (a slow tokenizer): transformers tokenizes.
    backend: Any = field(default=None, repr=False)
    # A copy of `backend` that encodes special-token text as plain text (`encode_special_tokens`).
    literal_backend: Any = field(default=None, repr=False)
    # Matches the text of any added token or sanitizing marker: a chat string without a match is
    # tokenized on the fast path (nothing in it can be taken for a control token).
    _control_text: re.Pattern[str] = field(default=re.compile("(?!)"), repr=False)
    # The first characters of those texts: a string without any of them (found at C speed) has no match.
    _control_starts: frozenset[str] = field(default=frozenset(), repr=False)
    # Whether the template takes a call's arguments as JSON text only (`wants_text_arguments`), probed once.
    _text_arguments: bool | None = field(default=None, repr=False)

    @classmethod
    def load(
        cls, tokenizer_dir: Path | str, *, add_special_tokens: bool = True, trust_remote_code: bool = False
    ) -> PromptTokenizer:
        from trtllm_truss.engine.tokenizer import load_transformers_tokenizer  # seconds of import: only when loading

        tokenizer = load_transformers_tokenizer(Path(tokenizer_dir), trust_remote_code=trust_remote_code)
        return cls.of(tokenizer, add_special_tokens=add_special_tokens)

    @classmethod
    def of(cls, tokenizer: Any, *, add_special_tokens: bool = True) -> PromptTokenizer:
        shared = getattr(tokenizer, "backend_tokenizer", None)
        backend = literal = None
        if shared is not None:
            from tokenizers import Tokenizer

            # Own copies: transformers sets `encode_special_tokens` on its backend per call
            # (split_special_tokens), so the shared one's setting is whatever the last call left.
            serialized = shared.to_str()
            backend = Tokenizer.from_str(serialized)
            literal = Tokenizer.from_str(serialized)
            literal.encode_special_tokens = True
        added = [str(token) for token in getattr(tokenizer, "added_tokens_encoder", {}) if token]
        texts = {*added, *_SANITIZE_MARKERS}
        return cls(tokenizer, add_special_tokens, backend, literal, re.compile(_trie_pattern(texts)),
                   frozenset(text[0] for text in texts))

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    # --- token ids for the engine -----------------------------------------------------------

    def chat_ids(
        self,
        messages: Sequence[ChatTurn],
        field: str = "messages",
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The prompt ids of chat turns, ending with the assistant's turn opened: those of
        `apply_chat_template(turns, tokenize=True, add_generation_prompt=True)`, with control-token
        text in any message string encoded as plain text (`sanitize_control_tokens=True`). `tools`
        go to the template as `tools=`, `template_kwargs` as extra template variables."""
        turns = self._template_turns(messages)
        self._require_template(field)
        extra = _template_extra(tools, template_kwargs)
        if any(self._has_control_text(text) for text in _strings([turns, extra])):
            try:
                ids = self.tokenizer.apply_chat_template(
                    turns,
                    tokenize=True,
                    add_generation_prompt=True,
                    sanitize_control_tokens=True,
                    return_dict=False,
                    **extra,
                )
            except Exception as exc:  # the template refuses the turns, or a token cannot be sanitized
                raise field_error(field, f"the chat template rejected these messages: {exc}") from exc
            return [int(i) for i in ids]
        return self._encode(self._render(turns, field, extra), add_special_tokens=False, literal=False)

    def prompt_ids(self, text: str, *, literal_special_tokens: bool = True) -> list[int]:
        """The ids of a raw prompt, with the tokenizer's special tokens added (BOS) as the
        preprocessing model adds them. `literal_special_tokens`: special-token text in `text`
        (`"</s>"`) is plain text (True) or becomes the control token (False)."""
        return self._encode(text, add_special_tokens=self.add_special_tokens, literal=literal_special_tokens)

    def _has_control_text(self, text: str) -> bool:
        return any(start in text for start in self._control_starts) and self._control_text.search(text) is not None

    def _encode(self, text: str, *, add_special_tokens: bool, literal: bool) -> list[int]:
        if self.backend is not None:
            backend = self.literal_backend if literal else self.backend
            return backend.encode(text, add_special_tokens=add_special_tokens).ids
        return list(
            self.tokenizer.encode(text, add_special_tokens=add_special_tokens, split_special_tokens=literal)
        )

    # --- counts ------------------------------------------------------------------------------

    def count(self, text: str) -> int:
        if self.backend is not None:
            return len(self.backend.encode(text, add_special_tokens=self.add_special_tokens).ids)
        return len(self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"])

    def prompt_tokens(self, text: str) -> PromptTokens:
        return PromptTokens(self, text)

    # --- chat text -----------------------------------------------------------------------------

    def render_chat(
        self,
        messages: Sequence[ChatTurn],
        field: str = "messages",
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for chat turns, ending with the assistant's turn opened. It may contain
        the template's BOS text: tokenize it with `chat_ids`, not with special tokens added."""
        self._require_template(field)
        return self._render(self._template_turns(messages), field, _template_extra(tools, template_kwargs))

    def _template_turns(self, messages: Sequence[ChatTurn]) -> list[dict[str, Any]]:
        """The turns as this template takes them: a call's arguments as objects (Hugging Face's
        convention), or as JSON text for a template that takes only text (`wants_text_arguments`)."""
        turns = _turns(messages)
        if not any(turn.get("tool_calls") for turn in turns):
            return turns
        if self._text_arguments is None:
            self._text_arguments = bool(getattr(self.tokenizer, "chat_template", None)) and wants_text_arguments(
                lambda probe: self.tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
            )
        return _with_text_arguments(turns) if self._text_arguments else turns

    def _require_template(self, field: str) -> None:
        if not getattr(self.tokenizer, "chat_template", None):
            raise field_error(field, "this model's tokenizer has no chat template; send a plain prompt instead")

    def _render(self, turns: list[dict[str, Any]], field: str, extra: Mapping[str, Any] | None = None) -> str:
        try:
            return self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True, **(extra or {}))
        except Exception as exc:  # jinja's raise_exception(): the template refuses these turns
            raise field_error(field, f"the chat template rejected these messages: {exc}") from exc


class PromptTokens:
    """A prompt's token count, computed on first use: only responses that report usage need it."""

    __slots__ = ("_tokenizer", "_text", "_count")

    def __init__(self, tokenizer: PromptTokenizer, text: str) -> None:
        self._tokenizer = tokenizer
        self._text = text
        self._count: int | None = None

    @property
    def counted(self) -> bool:
        return self._count is not None

    @property
    def value(self) -> int:
        if self._count is None:
            self._count = self._tokenizer.count(self._text)
        return self._count
