"""What an engine stand-in request sends to its output callback, collected for the tests that drive
the engine directly (tests/unit/test_standin_*.py)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

TIMEOUT_S = 120.0


@dataclass
class Collected:
    """An output callback: every output, the tokens in order and when each output arrived."""

    tokens: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def __call__(self, output) -> None:
        self.outputs.append(output)
        self.tokens.extend(output.token_ids)
        self.arrivals.append(time.monotonic())
        if output.finished:
            self.done.set()

    def finish(self, timeout_s: float = TIMEOUT_S):
        """Wait for the final output and return it."""
        assert self.done.wait(timeout_s), "request did not finish in time"
        return self.outputs[-1]

    @property
    def error(self) -> str | None:
        return next((output.error for output in reversed(self.outputs) if output.error), None)
