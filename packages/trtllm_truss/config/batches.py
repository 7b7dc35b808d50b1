"""`model_metadata.trt_llm.runtime.batches`: OpenAI's Batch API (`/v1/files`, `/v1/batches`) and Anthropic's
Message Batches (`/v1/messages/batches`), run inside the deployment behind interactive requests, their
inputs and answers kept in the store (`runtime.store`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from trtllm_truss.config.fields import StrictModel, field_problem


class BatchesConfig(StrictModel):
    """How much of the engine batches may take, and how large a batch may be."""

    enabled: bool = Field(
        True, description="false: the batch and file routes answer 404 and no batch runs. Needs runtime.store enabled."
    )
    max_in_flight: int = Field(
        4, ge=1, le=4096,
        description="Batch lines running on the engine at once, per host, while the host has no interactive"
        " request in flight (the rest wait; interactive requests never do): the share of an idle engine a batch"
        " takes. TensorRT-LLM 1.2's LLM API and Triton's tensorrtllm backend take no request priority, so these"
        " bounds are how a batch stays behind interactive traffic.",
    )
    max_in_flight_under_load: int = Field(
        1, ge=0, le=4096,
        description="Batch lines started while interactive requests are in flight on the host (any of the"
        " direct front's processes): the runner starts no new line while this many are on the engine (lines"
        " already there finish). 0 pauses batches under interactive load. At most max_in_flight.",
    )
    max_file_bytes: int = Field(
        100 << 20, ge=1024, le=1 << 34,
        description="Largest file /v1/files takes (a batch's JSONL input); a larger one is a 413. It is kept in the store.",
    )
    max_lines: int = Field(
        50_000, ge=1, le=1_000_000, description="Most requests in one batch (OpenAI's and Anthropic's limit: 50,000)."
    )
    poll_s: float = Field(
        1.0, gt=0.0, le=60.0, description="How often the runner looks in the store for batches to run or cancel."
    )

    @model_validator(mode="after")
    def _under_load_within_the_bound(self) -> BatchesConfig:
        if self.max_in_flight_under_load > self.max_in_flight:
            raise field_problem("max_in_flight_under_load", f"{self.max_in_flight_under_load} is more than"
                                f" max_in_flight ({self.max_in_flight}); the share under load is at most the idle one")
        return self
