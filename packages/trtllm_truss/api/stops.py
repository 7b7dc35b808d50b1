"""Stop strings matched on the decoded text (never on token ids: a stop string can span token
boundaries that its own tokenization does not have).

The stream worker feeds each response's text; once a stop string appears the request ends there
(OpenAI's `stop`: left out of the text; the native `stop_words_list`: kept, as NVIDIA's engine
returns it). While streaming, text that could still turn out to be the start of a stop string is
held back until it is decided.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopSequenceTrimmer:
    """`keep_stop`: the text ends with the stop sequence instead of before it (the native API's
    `stop_words_list`, which returns the stop word as NVIDIA's engine does)."""

    def __init__(self, stop_words: Sequence[str], *, keep_stop: bool = False) -> None:
        self._stops = tuple(word for word in stop_words if word)
        self._keep_stop = keep_stop
        self._held = ""
        self.stopped = False  # a stop sequence was found (and, unless kept, removed)
        self.stopped_by: str | None = None  # which one (Anthropic's `stop_sequence` reports it)

    def feed(self, text: str) -> str:
        """The part of `text` (plus earlier held-back text) that is certainly output."""
        if not self._stops or self.stopped:
            return "" if self.stopped else text
        pending = self._held + text
        found = [(i, len(w), w) for i, w in ((pending.find(w), w) for w in self._stops) if i >= 0]
        if found:
            cut, length, self.stopped_by = min(found)
            self._held = ""
            self.stopped = True
            return pending[: cut + length] if self._keep_stop else pending[:cut]
        keep = self._longest_stop_prefix_suffix(pending)
        self._held = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]

    def flush(self) -> str:
        """At the end of the generation: held text that never completed a stop sequence."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        best = 0
        for word in self._stops:
            for length in range(min(len(word) - 1, len(text)), best, -1):
                if text.endswith(word[:length]):
                    best = length
                    break
        return best
