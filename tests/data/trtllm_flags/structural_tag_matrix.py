"""What an older xgrammar (the one a TensorRT-LLM release pins) makes of the structural tags that
xgrammar's `get_model_structural_tag` builds for forced tool calls (trtllm_truss.guides.tool_syntax):
the record behind `<version>/structural_tag.json`'s `tags_of_0_2_8`.

Two steps, two environments (an xgrammar release per process):

    # 1. with the xgrammar whose builders trtllm_truss uses (0.2.8 here): the tags, one per case
    python structural_tag_matrix.py build > /tmp/tags.json
    # 2. with the release's xgrammar first on the path (pip install --no-deps --target DIR xgrammar==0.1.25):
    PYTHONPATH=DIR python structural_tag_matrix.py check /tmp/tags.json data/embedded-llama

`check` compiles each tag as TensorRT-LLM 1.1-1.2.1's PyTorch path does (`GrammarCompiler.compile_structural_tag(guide)`
over the tokenizer) and prints, per format, the cases it compiles and those it refuses (xgrammar's first line),
then whether the XML-style formats it compiles read their arguments as XML (as 0.2.8 does) or as JSON.
"""

from __future__ import annotations

import json
import re
import sys

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
]
CHOICES = {"required": "required", "named": {"type": "function", "function": {"name": "get_weather"}}}
MODES = ("disabled", "auto", "enabled")
# Arguments in a family's own XML style, and the same call with JSON arguments (what a reader that ignores `style` wants).
PROBES = {
    "glm_4_7": ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
                '<tool_call>get_weather{"city": "Paris"}</tool_call>'),
    "qwen_3_coder": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
                     '<tool_call>\n<function=get_weather>\n{"city": "Paris"}\n</function>\n</tool_call>'),
}


def build() -> None:
    import xgrammar
    from xgrammar.builtin_structural_tag import _structural_tag_registry

    out = {}
    for name in _structural_tag_registry:
        for choice, value in CHOICES.items():
            for mode in MODES:
                tag = xgrammar.get_model_structural_tag(name, tools=TOOLS, tool_choice=value, reasoning=mode, parallel_tool_calls=False)
                out[f"{name}|{choice}|{mode}"] = tag.model_dump_json()
    json.dump(out, sys.stdout)


def check(tags_path: str, tokenizer_dir: str) -> None:
    import xgrammar
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer), stop_token_ids=[tokenizer.eos_token_id])
    compiler = xgrammar.GrammarCompiler(info)
    result: dict[str, dict[str, list[str]]] = {}
    for key, tag in json.load(open(tags_path)).items():
        name, case = key.split("|", 1)
        try:
            compiler.compile_structural_tag(tag)
            verdict = "compiles"
        except Exception as exc:  # noqa: BLE001 - xgrammar's errors differ by release
            line = str(exc).strip().splitlines()[0]
            line = re.sub(r"^\[[0-9:]+\] \S+:\d+: ", "", line)
            verdict = "refused: " + line.split(" is false: ", 1)[-1][:160]
        result.setdefault(name, {}).setdefault(verdict, []).append(case)
    reads = {}
    for name, (xml, as_json) in PROBES.items():
        tag = json.load(open(tags_path))[f"{name}|named|disabled"]
        try:
            grammar = xgrammar.Grammar.from_structural_tag(tag)
        except Exception:  # noqa: BLE001
            reads[name] = "refused"
            continue
        from xgrammar.testing import _is_grammar_accept_string

        reads[name] = "xml" if _is_grammar_accept_string(grammar, xml) else "json" if _is_grammar_accept_string(grammar, as_json) else "neither"
    json.dump({"by_format": result, "xml_style_arguments_read_as": reads}, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build()
    else:
        check(sys.argv[2], sys.argv[3])
