"""Load levels: closed loop (a fixed number of streams, each sends its next request when the previous
one finishes) and open loop (requests arrive as a Poisson process at a given rate, whatever the server
does, which is how production traffic behaves and how queueing shows up in TTFT)."""

from __future__ import annotations

from typing import Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class ClosedLoop(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["closed"] = "closed"
    concurrency: int = Field(gt=0, description="streams kept in flight")

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}"

    @property
    def x_value(self) -> float:
        return float(self.concurrency)


class OpenLoop(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["open"] = "open"
    request_rate: float = Field(gt=0, description="mean arrivals per second (Poisson)")
    max_concurrency: int | None = Field(
        default=None, gt=0, description="cap on requests in flight; arrivals beyond it wait"
    )

    @property
    def label(self) -> str:
        return f"{self.request_rate:g} req/s"

    @property
    def x_value(self) -> float:
        return self.request_rate


LoadLevel = Union[ClosedLoop, OpenLoop]


def poisson_arrival_offsets(rate: float, count: int, seed: int) -> list[float]:
    """Send times in seconds after the start: a Poisson process of `rate` arrivals/s.

    Gaps are independent exponential draws with mean 1/rate; the first request goes at 0 so that a
    level never starts with idle time. Same (rate, count, seed) -> same offsets.
    """
    if rate <= 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    if count <= 0:
        return []
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=count - 1)
    return [0.0] + [float(v) for v in np.cumsum(gaps)]


def parse_int_list(text: str, option: str) -> list[int]:
    """`"1,8,32"` -> [1, 8, 32]; the error names the option."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option}: expected comma-separated positive integers like 1,8,32, got {text!r}")
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"{option}: expected comma-separated positive integers like 1,8,32, got {text!r}")
    return values


def parse_float_list(text: str, option: str) -> list[float]:
    """`"2,5.5"` -> [2.0, 5.5]; the error names the option."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option}: expected comma-separated positive numbers like 2,5,10, got {text!r}")
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"{option}: expected comma-separated positive numbers like 2,5,10, got {text!r}")
    return values
