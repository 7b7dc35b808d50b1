"""What the tests that drive the engine stand-in directly (tests/unit/test_standin_*.py, torch only)
share: the embedded model, fixtures (a pytest plugin of tests/conftest.py where torch is installed) and
an output collector."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from trtllm_truss.engine_standin.model_runner import CausalLMRunner

MODEL_DIR = Path(__file__).resolve().parents[1] / "data" / "embedded-llama"
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread: the engine's outputs then do not depend on the machine's cores."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))


@pytest.fixture(scope="module")
def runner():
    return CausalLMRunner(MODEL_DIR)


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
