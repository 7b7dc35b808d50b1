"""`model_metadata.trt_llm.runtime.batches`: OpenAI's Batch API (`/v1/files`, `/v1/batches`) and Anthropic's
Message Batches (`/v1/messages/batches`), run inside the deployment behind interactive requests, their
inputs and answers kept in the store (`runtime.store`)."""

from __future__ import annotations

from pydantic import Field

from trtllm_truss.config.fields import StrictModel


class BatchesConfig(StrictModel):
    """How much of the engine batches may take, and how large a batch may be."""

    enabled: bool = Field(
        True, description="false: the batch and file routes answer 404 and no batch runs. Needs runtime.store enabled."
    )
    max_in_flight: int = Field(
        4, ge=1, le=4096,
        description="Batch lines running on the engine at once, per host (the rest wait; interactive requests"
        " never do): the bounded share of the engine a batch takes. TensorRT-LLM 1.2's LLM API and Triton's"
        " tensorrtllm backend take no request priority, so this bound is how a batch stays behind interactive traffic.",
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
