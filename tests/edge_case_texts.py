"""Texts the older trusses garbled when streaming: leading spaces, whitespace runs, multi-byte UTF-8
(emoji incl. ZWJ, skin-tone and flag sequences, CJK), characters unseen in training (byte fallback).
Shared by the detokenizer unit tests and the end-to-end streaming tests."""

EDGE_TEXTS = [
    'Hello world',
    ' leading space',
    '  two leading spaces and trailing  ',
    'tabs\tand\nnewlines\n\n\nend',
    '你好，世界。这是一个测试。',
    '日本語のテキストと한국어',
    'emoji 😀🎉 and 👍🏽 and 👨\u200d👩\u200d👧\u200d👦 family',
    'café naïve Ünïcödé façade',
    'math ∑∫√∞ ≠ ≤ arrows → ⇒',
    'rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 🜂',
    'mixed: def f(x):\n    return x**2  # 😀 平方',
    'a',
    ' ',
    '\xa0nbsp\u2003emsp',
    'ZWJ\u200djoined and combining é (e+◌́)',
    '😀',
    '🇯🇵🇫🇷 flags',
]
