"""The request core (`core`: one GenerationRequest -> specs for the stream workers -> events) and one
module per API dialect over it (`native`, `completions`, `chat`, `responses`, `messages`: wire format <->
core). A dialect never imports another; what two share lives in `openai_shared`, `generation`,
`request` or `semantic_events`."""
