"""OpenAI's `stop` semantics on top of the engine's stop words.

The engine ends a request once a stop word's tokens are generated and returns them as part of the
output; OpenAI clients expect the stop sequence left out. While streaming, text that could still
turn out to be the start of a stop sequence is held back until it is decided.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopSequenceTrimmer:
    def __init__(self, stop_words: Sequence[str]) -> None:
        self._stops = tuple(word for word in stop_words if word)
        self._held = ""
        self.stopped = False  # a stop sequence was found and removed

    def feed(self, text: str) -> str:
        """The part of `text` (plus earlier held-back text) that is certainly output."""
        if not self._stops or self.stopped:
            return "" if self.stopped else text
        pending = self._held + text
        cut = min((i for i in (pending.find(w) for w in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            self.stopped = True
            return pending[:cut]
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
