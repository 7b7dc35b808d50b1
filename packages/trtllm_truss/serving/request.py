"""The one internal request every dialect's request becomes, and the events the core yields for it.

A dialect (native, chat, completions, responses, messages) validates its own body, builds a
`GenerationRequest` and hands it to `serving.core.RequestCore`; the core runs it on the stream
workers and yields `Event`s, which the dialect turns into its wire format. Nothing here knows a
dialect's field names beyond the ones a request carries for its error messages (`*_field`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from trtllm_truss.api.openai import LogProbEntry
from trtllm_truss.api.sampling import SamplingFields
from trtllm_truss.api.structured import Guide  # noqa: F401  (defined with its checks; the dialects take it from here)

# "none": no tool is offered to the model; "auto": the model may call tools (parsed from its text);
# "required": it must call at least one; a function name: it must call that one (both guided).
ToolChoice = Union[Literal["none", "auto", "required"], str]


@dataclass(frozen=True)
class GenerationRequest:
    """What any dialect asks of the engine, validated against the dialect's schema (not yet against
    the deployment's limits: the core does that, naming the dialect's fields).

    Exactly one of `prompt`, `prompt_ids`, `messages`. `messages` are OpenAI chat turns as dicts:
    `{"role", "content": str, "name"?, "tool_calls"?: [{"id", "type": "function", "function":
    {"name", "arguments": str (JSON)}}], "tool_call_id"?}`; the core hands them to the model's chat
    template (arguments parsed into objects, as Hugging Face templates expect)."""

    sampling: SamplingFields  # temperature, top_p, top_k, seed, penalties, min_tokens, end_id, ignore_eos
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    prompt_field: str = "prompt"  # the dialect's name for the prompt, in errors
    max_tokens: int | None = None  # None: `default_max_tokens`
    max_tokens_field: str = "max_tokens"
    default_max_tokens: int | None = None  # None: the deployment's max_output_len
    stop: tuple[str, ...] = ()
    keep_stop_text: bool = False  # the stop string stays in the text (native API)
    bad_words: tuple[str, ...] = ()
    beam_width: int | None = None
    default_top_p: float | None = None  # sent when neither top_p nor top_k is (OpenAI dialects: 1.0)
    literal_special_tokens: bool = True
    # Function tools in OpenAI chat's shape ({"type": "function", "function": {"name", "description",
    # "parameters"}}), validated by `api.tools.check_tools`; `tool_choice` as above.
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    tools_field: str = "tools"
    tool_choice_field: str = "tool_choice"
    strict_tools: tuple[int, ...] = ()  # positions in `tools` of strict tools whose calls are guided
    guide: Guide | None = None  # a response-format constraint (api.structured); tool_choice adds its own
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # e.g. enable_thinking
    parse_reasoning: bool = True  # run the deployment's reasoning parser on chat output
    model: str | None = None  # the client's `model`: echoed, and names a LoRA adapter where one is served
    n: int = 1  # choices (one engine request each)
    logprobs: bool = False
    top_logprobs: int = 0  # most likely tokens per position (OpenAI's top_logprobs / completions logprobs)


# --- events ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class TextDelta:
    """Answer text; `logprobs`: the entries of its tokens when the request asked for them."""

    text: str
    logprobs: list[LogProbEntry] | None = None


@dataclass(slots=True)
class ReasoningDelta:
    """The model's thinking (before its answer), split off by the reasoning parser."""

    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of tool call `index` (0, 1, ... in the answer): its first delta has `id` and `name`,
    later ones only `arguments` text; a call's argument fragments concatenate to its JSON arguments."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(slots=True)
class Finish:
    """The end of a generation: "stop", "length" or "tool_calls", its token counts, and the stop
    string that ended it, if one did."""

    reason: str
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None
    cached_tokens: int = 0  # prompt tokens whose KV the engine reused from its cache


@dataclass(slots=True)
class Failure:
    """The generation failed after output was sent (a failure before it is `core.Refused`)."""

    message: str
    status: int


Event = Union[TextDelta, ReasoningDelta, ToolCallDelta, Finish, Failure]


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class Answer:
    """A whole generation, collected from its events (non-streamed answers)."""

    text: str
    reasoning: str | None
    tool_calls: list[ToolCall]
    logprobs: list[LogProbEntry]
    finish: Finish
