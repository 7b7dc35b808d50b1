"""NVIDIA's clients' flows against the rendered repository, on the real tritonserver.

Written from tensorrtllm_backend v0.19.0's `tools/inflight_batcher_llm/end_to_end_test.py` (unary
calls to preprocessing -> tensorrt_llm -> postprocessing, then the ensemble, compared),
`inflight_batcher_llm/client/end_to_end_grpc_client.py` (streams `ensemble`, reads
`text_output[0].decode()`) and NVIDIA's models' output shapes (preprocessing/1/model.py,
postprocessing/1/model.py, model_instance_state.cc fillTritonResponse): every output these clients
read is pinned by shape and dtype, over HTTP and gRPC, with `runtime.decoupled_mode` false (NVIDIA's
CI) and true (streaming). The engine is the synthetic stand-in (deterministic per prompt), and for
`inflight_batcher_llm_client.py`'s token-id stream also backend `llmapi` (our LLM-API model on the LLM-API
double, the embedded default's real model).
"""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import _plan, _serve
from trtllm_truss.config.runtime import RuntimeConfig
from trtllm_truss.repository import render_repository

pytestmark = [pytest.mark.triton, pytest.mark.torch, pytest.mark.timeout(300)]

PROMPT = "The module"
OUTPUT_LEN = 8


def _repository(tmp_path_factory: pytest.TempPathFactory, *, decoupled: bool, window_relay: bool | None = None) -> Iterator[object]:
    runtime = RuntimeConfig(
        preprocessing_instance_count=1,
        postprocessing_instance_count=1,
        decoupled_mode=decoupled,
        # 5 ms steps: a 250-token request runs long enough for a stop request to catch it.
        pytorch={"device": "cpu", "num_threads": 1, "synthetic": {"step_time_ms": 5.0}, "instance_count": 1},
    )
    name = "decoupled" if decoupled else "unary"
    repository = render_repository(
        _plan(runtime, max_batch_size=4), tmp_path_factory.mktemp(name) / "model_repository", window_relay=window_relay
    )
    yield from _serve(repository)


@pytest.fixture(scope="module")
def unary_triton(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    yield from _repository(tmp_path_factory, decoupled=False)


@pytest.fixture(scope="module")
def decoupled_triton(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    yield from _repository(tmp_path_factory, decoupled=True)


@pytest.fixture(scope="module")
def llmapi_triton(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The embedded default's repository with `runtime.backend: llmapi`, as `serve` renders it here: our
    llmapi model on the LLM-API double (TensorRT-LLM cannot run on this machine)."""
    from trtllm_truss.config import load_config
    from trtllm_truss.planning.plan import make_plan
    from trtllm_truss.planning.probe import RuntimeFacts

    config = load_config(embedded_model_dir.parents[1], environ={"TRTLLM_RUNTIME__BACKEND": "llmapi"})
    base = tmp_path_factory.mktemp("llmapi")
    plan = make_plan(config, RuntimeFacts(), artifacts_dir=base / "artifacts")
    assert plan.backend == "llmapi" and plan.llm_api_double and plan.runtime.decoupled_mode
    yield from _serve(render_repository(plan, base / "model_repository"))


@pytest.fixture(scope="module")
def relayed_triton(embedded_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The GPU path's layout (ensemble -> tensorrt_llm_window relay -> engine), the stand-in as engine."""
    yield from _repository(tmp_path_factory, decoupled=True, window_relay=True)


def _tensor(module, name: str, array: np.ndarray):
    datatype = {np.object_: "BYTES", np.int32: "INT32", np.bool_: "BOOL", np.float32: "FP32", np.uint64: "UINT64"}[array.dtype.type]
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _client(module, server):
    return module.InferenceServerClient(server.http_url.split("://", 1)[-1] if module is httpclient else server.grpc_url)


def _shape_dtype(result, name: str) -> tuple[tuple[int, ...], str]:
    array = result.as_numpy(name)
    assert array is not None, f"{name}: missing"
    return array.shape, array.dtype.kind


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_end_to_end_test_flow_unary(unary_triton, module) -> None:
    """end_to_end_test.py: the three steps by hand (word lists [[""]], as NVIDIA's test sends them)
    give the same text as the ensemble; all tensors in NVIDIA's shapes."""
    client = _client(module, unary_triton)
    pre = client.infer(
        "preprocessing",
        [
            _tensor(module, "QUERY", np.array([[PROMPT]], dtype=object)),
            _tensor(module, "BAD_WORDS_DICT", np.array([[""]], dtype=object)),
            _tensor(module, "STOP_WORDS_DICT", np.array([[""]], dtype=object)),
            _tensor(module, "REQUEST_OUTPUT_LEN", np.array([[OUTPUT_LEN]], dtype=np.int32)),
        ],
        request_id="1",
    )
    input_ids = pre.as_numpy("INPUT_ID")
    assert input_ids.ndim == 2 and input_ids.shape[0] == 1 and input_ids.dtype == np.int32
    for name in ("REQUEST_INPUT_LEN", "REQUEST_OUTPUT_LEN", "DECODER_INPUT_ID", "REQUEST_DECODER_INPUT_LEN", "OUT_END_ID", "OUT_PAD_ID"):
        assert _shape_dtype(pre, name) == ((1, 1), "i"), name
    assert pre.as_numpy("DECODER_INPUT_ID").tolist() == pre.as_numpy("OUT_PAD_ID").tolist()
    assert pre.as_numpy("BAD_WORDS_IDS").tolist() == [[[0], [-1]]]  # NVIDIA's empty list
    assert _shape_dtype(pre, "EMBEDDING_BIAS") == ((1, 0), "f")

    engine = client.infer(
        "tensorrt_llm",
        [
            _tensor(module, "input_ids", input_ids),
            _tensor(module, "decoder_input_ids", pre.as_numpy("DECODER_INPUT_ID")),
            _tensor(module, "input_lengths", pre.as_numpy("REQUEST_INPUT_LEN")),
            _tensor(module, "request_output_len", pre.as_numpy("REQUEST_OUTPUT_LEN")),
            _tensor(module, "end_id", pre.as_numpy("OUT_END_ID")),
            _tensor(module, "pad_id", pre.as_numpy("OUT_PAD_ID")),
            _tensor(module, "return_log_probs", np.array([[True]], dtype=np.bool_)),
        ],
        request_id="1",
    )
    output_ids = engine.as_numpy("output_ids")
    prompt_len = input_ids.shape[1]
    # NVIDIA's default exclude_input_in_output is false: the prompt comes first.
    assert output_ids.shape == (1, 1, prompt_len + OUTPUT_LEN) and output_ids.dtype == np.int32
    assert output_ids[0, 0, :prompt_len].tolist() == input_ids[0].tolist()
    assert engine.as_numpy("sequence_length").tolist() == [[prompt_len + OUTPUT_LEN]]
    assert _shape_dtype(engine, "cum_log_probs") == ((1, 1), "f")
    assert _shape_dtype(engine, "output_log_probs") == ((1, 1, OUTPUT_LEN), "f")

    post = client.infer(
        "postprocessing",
        [
            _tensor(module, "TOKENS_BATCH", output_ids),
            _tensor(module, "SEQUENCE_LENGTH", engine.as_numpy("sequence_length")),
        ],
        request_id="1",
    )
    manual = post.as_numpy("OUTPUT")
    assert manual.shape == (1,)  # one text per beam, 1-D as NVIDIA's postprocessing returns it

    ensemble = client.infer(
        "ensemble",
        [
            _tensor(module, "text_input", np.array([[PROMPT]], dtype=object)),
            _tensor(module, "max_tokens", np.array([[OUTPUT_LEN]], dtype=np.int32)),
            _tensor(module, "bad_words", np.array([[""]], dtype=object)),
            _tensor(module, "stop_words", np.array([[""]], dtype=object)),
        ],
        request_id="2",
    )
    text = ensemble.as_numpy("text_output")
    assert text.shape == (1,)
    assert text[0].decode("utf-8") == manual[0].decode("utf-8")
    assert text[0].decode("utf-8").startswith(PROMPT)


def test_unary_engine_refuses_streaming_with_nvidias_message(unary_triton) -> None:
    client = _client(grpcclient, unary_triton)
    with pytest.raises(Exception, match="Streaming is only supported if model is deployed using decoupled mode"):
        client.infer(
            "tensorrt_llm",
            [
                _tensor(grpcclient, "input_ids", np.array([[300, 301]], dtype=np.int32)),
                _tensor(grpcclient, "input_lengths", np.array([[2]], dtype=np.int32)),
                _tensor(grpcclient, "request_output_len", np.array([[2]], dtype=np.int32)),
                _tensor(grpcclient, "streaming", np.array([[True]], dtype=np.bool_)),
            ],
        )


def test_end_to_end_grpc_client_flow_streaming(decoupled_triton) -> None:
    """end_to_end_grpc_client.py --streaming: each response's text_output[0].decode() is a piece;
    the pieces join to the non-streamed text (exclude_input_in_output true, as the client sends)."""
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(decoupled_triton.grpc_url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))

    def run(stream: bool, request_id: str) -> list:
        inputs = [
            _tensor(grpcclient, "text_input", np.array([[PROMPT]], dtype=object)),
            _tensor(grpcclient, "max_tokens", np.array([[OUTPUT_LEN]], dtype=np.int32)),
            _tensor(grpcclient, "stream", np.array([[stream]], dtype=np.bool_)),
            _tensor(grpcclient, "exclude_input_in_output", np.array([[True]], dtype=np.bool_)),
        ]
        client.async_stream_infer("ensemble", inputs, request_id=request_id, enable_empty_final_response=True)
        pieces = []
        while True:
            result, error = events.get(timeout=60)
            assert error is None, error
            output = result.as_numpy("text_output")
            if output is not None:
                assert output.ndim == 1 and output.dtype == np.object_
                pieces.append(output[0].decode("utf-8"))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return pieces

    try:
        streamed = run(True, "s")
        whole = run(False, "w")
    finally:
        client.stop_stream()
        client.close()
    assert len(streamed) == OUTPUT_LEN  # one response per token
    assert "".join(streamed) == "".join(whole) and len(whole) == 1


def _failures(server) -> float:
    import urllib.request

    with urllib.request.urlopen(server.metrics_url, timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("nv_inference_request_failure{") and 'model="tensorrt_llm"' in line
    )


def test_a_refused_request_counts_as_a_failure_when_not_decoupled(unary_triton) -> None:
    import time

    before = _failures(unary_triton)
    client = _client(grpcclient, unary_triton)
    with pytest.raises(Exception, match="request_output_len"):
        client.infer(
            "tensorrt_llm",
            [
                _tensor(grpcclient, "input_ids", np.array([[300, 301]], dtype=np.int32)),
                _tensor(grpcclient, "input_lengths", np.array([[2]], dtype=np.int32)),
                _tensor(grpcclient, "request_output_len", np.array([[100_000]], dtype=np.int32)),
            ],
        )
    deadline = time.monotonic() + 10
    while _failures(unary_triton) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _failures(unary_triton) == before + 1


# ------------------------------------------------------------------ every output's shape and dtype
# From NVIDIA's v0.19.0 sources: model_instance_state.cc fillTritonResponse (each response is one
# batch item x one sequence: [1, ...]; batch_index / sequence_index / perf metrics [1, 1]; logits
# [1, prompt_len, vocab] and [1, beams, tokens, vocab]), postprocessing/1/model.py (OUTPUT 1-D, one
# text per batch item x beam of its input), end_to_end_grpc_client.py (reads text_output[0],
# batch_index[0][0], sequence_index[0][0], perf metric [0][0]).
VOCAB = json.loads((Path(__file__).resolve().parents[2] / "data" / "embedded-llama" / "config.json").read_text())["vocab_size"]
PERF_DTYPES = {
    "kv_cache_alloc_new_blocks": np.int32,
    "kv_cache_reused_blocks": np.int32,
    "kv_cache_alloc_total_blocks": np.int32,
    "arrival_time_ns": np.int64,
    "first_scheduled_time_ns": np.int64,
    "first_token_time_ns": np.int64,
    "last_token_time_ns": np.int64,
    "acceptance_rate": np.float32,
    "total_accepted_draft_tokens": np.int32,
    "total_draft_tokens": np.int32,
}


def _client_inputs(module, prompts: list[str], *, stream: bool, n: int | None, extras: bool) -> list:
    """end_to_end_grpc_client.py's prepare_inputs for each prompt, stacked on axis 0 (--batch-inputs)."""
    rows = len(prompts)
    arrays = {
        "text_input": np.array([[p] for p in prompts], dtype=object),
        "max_tokens": np.full((rows, 1), OUTPUT_LEN, dtype=np.int32),
        "stream": np.full((rows, 1), stream, dtype=np.bool_),
        "beam_width": np.ones((rows, 1), dtype=np.int32),
        "temperature": np.ones((rows, 1), dtype=np.float32),
        "exclude_input_in_output": np.full((rows, 1), False, dtype=np.bool_),
    }
    if n is not None:
        arrays["num_return_sequences"] = np.full((rows, 1), n, dtype=np.int32)
    if extras:
        for name in ("return_log_probs", "return_context_logits", "return_generation_logits", "return_perf_metrics"):
            arrays[name] = np.ones((rows, 1), dtype=np.bool_)
    return [_tensor(module, name, array) for name, array in arrays.items()]


def _requested(module, *, batch: bool, n: int | None, extras: bool) -> list:
    """The outputs end_to_end_grpc_client.py asks for with these flags."""
    names = ["text_output"]
    if extras:
        names += ["cum_log_probs", "output_log_probs", "context_logits", "generation_logits", *PERF_DTYPES]
    if n is not None and n > 1:
        names.append("sequence_index")
    if batch:
        names.append("batch_index")
    return [module.InferRequestedOutput(name) for name in names]


def _prompt_len(client, module, prompt: str) -> int:
    pre = client.infer(
        "preprocessing",
        [
            _tensor(module, "QUERY", np.array([[prompt]], dtype=object)),
            _tensor(module, "REQUEST_OUTPUT_LEN", np.array([[OUTPUT_LEN]], dtype=np.int32)),
        ],
    )
    return int(pre.as_numpy("REQUEST_INPUT_LEN")[0, 0])


def _check_extras(result, *, prompt_len: int, generated_shape: tuple[int, ...]) -> None:
    assert _shape_dtype(result, "cum_log_probs") == ((1, 1), "f")
    logits = result.as_numpy("context_logits")
    assert logits.shape == (1, prompt_len, VOCAB) and logits.dtype == np.float32
    generation = result.as_numpy("generation_logits")
    assert generation.shape == generated_shape and generation.dtype == np.float32
    for name, dtype in PERF_DTYPES.items():
        array = result.as_numpy(name)
        assert array is not None and array.shape == (1, 1) and array.dtype == dtype, name
    times = [int(result.as_numpy(f"{t}_time_ns")[0][0]) for t in ("arrival", "first_scheduled", "first_token", "last_token")]
    assert times == sorted(times) and times[0] > 0  # steady-clock nanoseconds, in NVIDIA's order


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_every_output_shape_and_dtype_unary(unary_triton, module) -> None:
    """decoupled_mode false (NVIDIA's CI): batch 1 with every return_* flag; batch 2 refused with
    NVIDIA's message (its backend needs the decoupled policy for batches)."""
    client = _client(module, unary_triton)
    prompt_len = _prompt_len(client, module, PROMPT)
    result = client.infer(
        "ensemble", _client_inputs(module, [PROMPT], stream=False, n=None, extras=True), outputs=_requested(module, batch=False, n=None, extras=True)
    )
    text = result.as_numpy("text_output")
    assert text.shape == (1,) and text.dtype == np.object_ and text[0].decode().startswith(PROMPT)
    # Not streaming and the prompt not excluded: log probs cover the generated tokens, the
    # generation logits the request's max new tokens (TensorRT-LLM's buffer).
    assert _shape_dtype(result, "output_log_probs") == ((1, 1, OUTPUT_LEN), "f")
    _check_extras(result, prompt_len=prompt_len, generated_shape=(1, 1, OUTPUT_LEN, VOCAB))
    assert result.as_numpy("batch_index") is None and result.as_numpy("sequence_index") is None
    with pytest.raises(Exception, match="Batch size > 1 requires the tensorrt_llm backend to be using decoupled"):
        client.infer("ensemble", _client_inputs(module, [PROMPT, "Another"], stream=False, n=None, extras=False))


def _stream_all(server, inputs: list, outputs: list | None) -> list:
    """One request on a gRPC stream (as end_to_end_grpc_client.py sends it); every response to it."""
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer("ensemble", inputs, outputs=outputs, request_id="b", enable_empty_final_response=True)
        results = []
        while True:
            result, error = events.get(timeout=60)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            if result.as_numpy("text_output") is not None:
                results.append(result)
            if final:
                return results
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("layout", ["decoupled_triton", "relayed_triton"])
def test_every_output_shape_and_dtype_decoupled_batch_and_sequences(layout: str, stream: bool, request) -> None:
    """--batch-inputs -n 2 with every return_* flag: each response is one batch item x sequence,
    tagged with batch_index and sequence_index; texts join per (item, sequence) as the client does.
    Also through the GPU path's window relay (it keeps a prefix window per item and sequence)."""
    decoupled_triton = request.getfixturevalue(layout)
    prompts = [PROMPT, "Another prompt"]
    client = _client(grpcclient, decoupled_triton)
    prompt_lens = [_prompt_len(client, grpcclient, p) for p in prompts]
    results = _stream_all(
        decoupled_triton,
        _client_inputs(grpcclient, prompts, stream=stream, n=2, extras=True),
        _requested(grpcclient, batch=True, n=2, extras=True),
    )
    texts: dict[tuple[int, int], str] = {}
    counts: dict[tuple[int, int], int] = {}
    for result in results:
        text = result.as_numpy("text_output")
        assert text.shape == (1,) and text.dtype == np.object_
        assert _shape_dtype(result, "batch_index") == ((1, 1), "i") and result.as_numpy("batch_index").dtype == np.int32
        assert _shape_dtype(result, "sequence_index") == ((1, 1), "i") and result.as_numpy("sequence_index").dtype == np.int32
        key = (int(result.as_numpy("batch_index")[0][0]), int(result.as_numpy("sequence_index")[0][0]))
        tokens = 1 if stream else OUTPUT_LEN
        assert _shape_dtype(result, "output_log_probs") == ((1, 1, tokens), "f")
        generated = (1, 1, 1, VOCAB) if stream else (1, 1, OUTPUT_LEN, VOCAB)
        _check_extras(result, prompt_len=prompt_lens[key[0]], generated_shape=generated)
        texts[key] = texts.get(key, "") + text[0].decode("utf-8")
        counts[key] = counts.get(key, 0) + 1
    assert set(texts) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert set(counts.values()) == {OUTPUT_LEN if stream else 1}
    if not stream:  # the prompt comes first (exclude_input_in_output false)
        assert all(texts[(b, s)].startswith(prompts[b]) for b, s in texts)
    # Each (item, sequence) reads as that prompt's own request would (the synthetic engine is
    # deterministic per prompt): no piece of one stream is decoded in another's context.
    for b, prompt in enumerate(prompts):
        alone = _stream_all(decoupled_triton, _client_inputs(grpcclient, [prompt], stream=stream, n=None, extras=False), None)
        assert texts[(b, 0)] == texts[(b, 1)] == "".join(r.as_numpy("text_output")[0].decode("utf-8") for r in alone)


def test_batch_one_has_no_batch_or_sequence_index_decoupled(decoupled_triton) -> None:
    """NVIDIA's backend sends batch_index only for batch > 1 and sequence_index only for n > 1."""
    results = _stream_all(
        decoupled_triton, _client_inputs(grpcclient, [PROMPT], stream=True, n=1, extras=False), None
    )
    assert len(results) == OUTPUT_LEN
    for result in results:
        assert result.as_numpy("text_output").shape == (1,)
        assert result.as_numpy("batch_index") is None and result.as_numpy("sequence_index") is None
        assert result.as_numpy("context_logits") is None and result.as_numpy("arrival_time_ns") is None


def test_core_model_with_n_sequences_and_batch(decoupled_triton) -> None:
    """inflight_batcher_llm_client.py against tensorrt_llm: -n 2 on a batch of 2 rows (padded ids,
    input_lengths per row); output_ids [1, 1, tokens] per response with batch/sequence index."""
    inputs = [
        _tensor(grpcclient, "input_ids", np.array([[300, 301, 302], [400, 401, 0]], dtype=np.int32)),
        _tensor(grpcclient, "input_lengths", np.array([[3], [2]], dtype=np.int32)),
        _tensor(grpcclient, "request_output_len", np.array([[4], [4]], dtype=np.int32)),
        _tensor(grpcclient, "num_return_sequences", np.array([[2], [2]], dtype=np.int32)),
        _tensor(grpcclient, "streaming", np.array([[False], [False]], dtype=np.bool_)),
        _tensor(grpcclient, "exclude_input_in_output", np.array([[True], [True]], dtype=np.bool_)),
    ]
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(decoupled_triton.grpc_url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
        seen = set()
        while True:
            result, error = events.get(timeout=60)
            assert error is None, error
            ids = result.as_numpy("output_ids")
            if ids is not None:
                assert ids.shape == (1, 1, 4) and ids.dtype == np.int32
                assert result.as_numpy("sequence_length").tolist() == [[4]]
                seen.add((int(result.as_numpy("batch_index")[0][0]), int(result.as_numpy("sequence_index")[0][0])))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    assert seen == {(0, 0), (0, 1), (1, 0), (1, 1)}


def test_a_refused_request_counts_as_a_failure_when_decoupled(decoupled_triton) -> None:
    """The default (decoupled) layout, as the truss proxy calls it (ensemble_ids, gRPC stream): a
    request the engine refuses moves nv_inference_request_failure of tensorrt_llm (NVIDIA's
    dashboards and its CI's metrics check read it per model) and of the ensemble."""
    import time

    def failures(model: str) -> float:
        import urllib.request

        with urllib.request.urlopen(decoupled_triton.metrics_url, timeout=5) as response:
            text = response.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("nv_inference_request_failure{") and f'model="{model}"' in line
        )

    before = {model: failures(model) for model in ("tensorrt_llm", "ensemble_ids")}
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(decoupled_triton.grpc_url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        bad = [
            _tensor(grpcclient, "text_input", np.array([[PROMPT]], dtype=object)),
            _tensor(grpcclient, "max_tokens", np.array([[4]], dtype=np.int32)),
            _tensor(grpcclient, "top_p", np.array([[5.0]], dtype=np.float32)),  # outside [0, 1]
        ]
        client.async_stream_infer("ensemble_ids", bad, enable_empty_final_response=True)
        _, error = events.get(timeout=60)
        assert error is not None and "runtime_top_p" in str(error)
        # What our clients show of it: the model's message alone, no Triton wrapper or traceback.
        from trtllm_truss.engine.rpc_errors import engine_message

        shown = engine_message(error.message())
        assert "runtime_top_p" in shown and "At:" not in shown and "Failed to process" not in shown, (error.message(), shown)
    finally:
        client.stop_stream()
        client.close()
    deadline = time.monotonic() + 10
    while failures("tensorrt_llm") < before["tensorrt_llm"] + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert failures("tensorrt_llm") == before["tensorrt_llm"] + 1
    assert failures("ensemble_ids") > before["ensemble_ids"]  # Triton 2.51 counts an ensemble's failure twice


def test_generate_stream_over_http_decoupled_carries_the_extras(decoupled_triton) -> None:
    """HTTP on the decoupled layout (Triton's generate_stream, as genai-perf uses it): one event per
    token, each with its text and, when asked, the perf metrics and logits of that response."""
    import urllib.request

    body = {
        "text_input": PROMPT,
        "max_tokens": OUTPUT_LEN,
        "stream": True,
        "return_perf_metrics": True,
        "return_generation_logits": True,
    }
    request = urllib.request.Request(
        f"{decoupled_triton.http_url}/v2/models/ensemble/generate_stream",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        events = [json.loads(line[len(b"data: "):]) for line in response.read().splitlines() if line.startswith(b"data: ")]
    assert len(events) == OUTPUT_LEN
    for event in events:
        assert "error" not in event, event
        assert isinstance(event["text_output"], str)
        assert isinstance(event["arrival_time_ns"], int) and event["arrival_time_ns"] <= event["last_token_time_ns"]
        assert isinstance(event["acceptance_rate"], float)
        assert len(event["generation_logits"]) == VOCAB  # [1, 1, 1, vocab], flattened by Triton
        assert "batch_index" not in event and "sequence_index" not in event


def test_stop_by_request_id_ends_every_row_of_a_batched_request(decoupled_triton) -> None:
    """inflight_batcher_llm_client.py --stop-after-ms with a request id, on a request of 2 rows:
    NVIDIA's backend cancels every generation of that id; the request still ends with its final flag."""
    long_rows = [
        _tensor(grpcclient, "input_ids", np.array([[300, 301], [400, 401]], dtype=np.int32)),
        _tensor(grpcclient, "input_lengths", np.array([[2], [2]], dtype=np.int32)),
        _tensor(grpcclient, "request_output_len", np.array([[250], [250]], dtype=np.int32)),
        _tensor(grpcclient, "streaming", np.array([[True], [True]], dtype=np.bool_)),
    ]
    stop = [
        _tensor(grpcclient, "input_ids", np.array([[1]], dtype=np.int32)),
        _tensor(grpcclient, "input_lengths", np.array([[1]], dtype=np.int32)),
        _tensor(grpcclient, "request_output_len", np.array([[1]], dtype=np.int32)),
        _tensor(grpcclient, "stop", np.array([[True]], dtype=np.bool_)),
    ]
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(decoupled_triton.grpc_url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    stopper = grpcclient.InferenceServerClient(decoupled_triton.grpc_url)
    stop_events: queue.Queue = queue.Queue()
    stopper.start_stream(callback=lambda result, error: stop_events.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", long_rows, request_id="batch-stop", enable_empty_final_response=True)
        tokens = {0: 0, 1: 0}
        stopped = False
        while True:
            result, error = events.get(timeout=60)
            assert error is None, error
            if result.as_numpy("output_ids") is not None:
                tokens[int(result.as_numpy("batch_index")[0][0])] += result.as_numpy("output_ids").shape[-1]
            if not stopped and min(tokens.values()) >= 2:
                stopper.async_stream_infer("tensorrt_llm", stop, request_id="batch-stop")
                stopped = True
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        _, stop_error = stop_events.get(timeout=30)
        assert stop_error is None
    finally:
        for c in (client, stopper):
            c.stop_stream()
            c.close()
    assert stopped and all(2 <= count < 250 for count in tokens.values()), tokens


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_preprocessing_and_postprocessing_with_batch_two(unary_triton, module) -> None:
    """NVIDIA's preprocessing/postprocessing take a request of N rows (they are not decoupled):
    INPUT_ID [N, longest] right-padded, every other output [N, ...]; OUTPUT one text per row x beam."""
    client = _client(module, unary_triton)
    pre = client.infer(
        "preprocessing",
        [
            _tensor(module, "QUERY", np.array([[PROMPT], ["A longer second prompt"]], dtype=object)),
            _tensor(module, "REQUEST_OUTPUT_LEN", np.array([[4], [6]], dtype=np.int32)),
            _tensor(module, "STOP_WORDS_DICT", np.array([["a"], ["b c"]], dtype=object)),
        ],
    )
    input_ids, lengths = pre.as_numpy("INPUT_ID"), pre.as_numpy("REQUEST_INPUT_LEN")
    assert input_ids.shape == (2, int(lengths.max())) and input_ids.dtype == np.int32
    assert lengths.shape == (2, 1) and lengths[0, 0] < lengths[1, 0]
    assert set(input_ids[0, lengths[0, 0] :].tolist()) == {int(pre.as_numpy("OUT_PAD_ID")[0, 0])}
    assert pre.as_numpy("REQUEST_OUTPUT_LEN").tolist() == [[4], [6]]
    for name in ("DECODER_INPUT_ID", "REQUEST_DECODER_INPUT_LEN", "OUT_END_ID", "OUT_PAD_ID"):
        assert _shape_dtype(pre, name) == ((2, 1), "i"), name
    stop = pre.as_numpy("STOP_WORDS_IDS")
    assert stop.shape[:2] == (2, 2) and stop.dtype == np.int32
    assert _shape_dtype(pre, "BAD_WORDS_IDS") == ((2, 2, 0), "i")
    assert _shape_dtype(pre, "EMBEDDING_BIAS") == ((2, 0), "f")
    post = client.infer(
        "postprocessing",
        [
            _tensor(module, "TOKENS_BATCH", input_ids.reshape(2, 1, -1)),
            _tensor(module, "SEQUENCE_LENGTH", lengths.astype(np.int32)),
        ],
    )
    texts = post.as_numpy("OUTPUT")
    assert texts.shape == (2,) and [t.decode() for t in texts] == [PROMPT, "A longer second prompt"]


def _greedy_reference(model_dir: Path, input_ids: list[int], max_new_tokens: int, end_id: int) -> list[int]:
    """What the checkpoint generates greedily, by transformers itself (not through the stand-in's code)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([input_ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=end_id, pad_token_id=end_id
        )
    return out[0, len(input_ids) :].tolist()


def test_inflight_batcher_llm_client_streams_token_ids_from_llmapi(llmapi_triton, embedded_model_dir: Path) -> None:
    """inflight_batcher_llm_client.py (v0.19.0) --streaming -n 2 with its defaults (its text, 16 tokens,
    top_k 1, top_p 0, temperature 1, end/pad id from the tokenizer, prompt kept in the output) against
    backend llmapi: each response is output_ids [1, 1, tokens] of one sequence; the ids the client joins per
    sequence are the checkpoint's greedy continuation, and decode to its text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir, legacy=False, padding_side="left")
    if not tokenizer.pad_token:
        tokenizer.pad_token = tokenizer.eos_token
    pad_id = tokenizer.encode(tokenizer.pad_token, add_special_tokens=False)[0]
    end_id = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)[0]
    text, output_len = "Born in north-east France, Soyer trained as a", 16
    input_ids = tokenizer.encode(text)
    arrays = {
        "input_ids": np.array([input_ids], dtype=np.int32),
        "input_lengths": np.array([[len(input_ids)]], dtype=np.int32),
        "request_output_len": np.array([[output_len]], dtype=np.int32),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[1.0]], dtype=np.float32),
        "streaming": np.array([[True]], dtype=np.bool_),
        "end_id": np.array([[end_id]], dtype=np.int32),
        "pad_id": np.array([[pad_id]], dtype=np.int32),
        "runtime_top_k": np.array([[1]], dtype=np.int32),
        "runtime_top_p": np.array([[0.0]], dtype=np.float32),
        "num_return_sequences": np.array([[2]], dtype=np.int32),
    }
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(llmapi_triton.grpc_url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    sequences = {0: list(input_ids), 1: list(input_ids)}  # the client starts each sequence with the prompt
    responses = 0
    try:
        client.async_stream_infer(
            "tensorrt_llm", [_tensor(grpcclient, n, a) for n, a in arrays.items()], request_id="12345", enable_empty_final_response=True
        )
        while True:
            result, error = events.get(timeout=120)
            assert error is None, error
            output_ids = result.as_numpy("output_ids")
            if output_ids is not None:
                # [1, 1, tokens]: the client takes every token of a response (the LLM-API double may
                # hand over two steps at once when its event loop lags behind the engine thread).
                assert output_ids.shape[:2] == (1, 1) and output_ids.shape[2] >= 1 and output_ids.dtype == np.int32
                sequences[int(result.as_numpy("sequence_index")[0][0])].extend(output_ids[0][0].tolist())
                responses += 1
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    expected = _greedy_reference(embedded_model_dir, input_ids, output_len, end_id)
    assert len(expected) == output_len  # no early end: every one of the 16 steps is compared
    assert 2 < responses <= 2 * output_len  # streamed: more than one response per sequence
    for sequence in sequences.values():
        assert sequence == input_ids + expected
        assert tokenizer.decode(sequence[len(input_ids) :]) == tokenizer.decode(expected)
