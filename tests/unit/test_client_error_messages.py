"""Messages that can reach an HTTP client name no internal address or path; the log keeps the address."""

from __future__ import annotations

import asyncio
import logging
import socket

import grpc
import pytest
from trtllm_truss.engine.client import EnsembleClient, UpstreamError
from trtllm_truss.engine.engine_client import EngineClient
from trtllm_truss.engine.rpc_errors import describe_rpc_error, engine_message


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released): connecting is refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


@pytest.mark.parametrize("client_class", [EnsembleClient, EngineClient])
def test_unreachable_triton_error_names_no_address(client_class, caplog: pytest.LogCaptureFixture):
    port = _closed_port()
    url = f"127.0.0.1:{port}"

    async def read_interface() -> str:
        client = client_class(url, connect_timeout_s=5.0)
        try:
            with pytest.raises(UpstreamError) as info:
                await client.interface()
            return str(info.value)
        finally:
            await client.close()

    with caplog.at_level(logging.WARNING, logger="trtllm_truss.engine.client"):
        message = asyncio.run(read_interface())
    assert "unavailable" in message
    assert "127.0.0.1" not in message and str(port) not in message, message
    # The operator still learns where the proxy looked.
    assert any(url in record.getMessage() for record in caplog.records), [r.getMessage() for r in caplog.records]


def test_rpc_error_description_hides_address_and_paths(caplog: pytest.LogCaptureFixture):
    unavailable = _rpc_error(
        grpc.StatusCode.UNAVAILABLE,
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:41719: Connection refused",
    )
    with caplog.at_level(logging.WARNING, logger="trtllm_truss.engine.client"):
        message = describe_rpc_error("127.0.0.1:41719", unavailable)
    assert message == "the engine is unavailable (UNAVAILABLE)"
    assert any("127.0.0.1:41719" in record.getMessage() for record in caplog.records)

    internal = _rpc_error(
        grpc.StatusCode.INTERNAL,
        "Failed to process the request(s) for model 'tensorrt_llm', message: Traceback: "
        'File "/tmp/trtllm-truss-stack-abc/model_repository/tensorrt_llm/1/model.py", line 3: boom',
    )
    message = describe_rpc_error("127.0.0.1:41719", internal)
    assert message.startswith("Triton error INTERNAL: ") and "boom" in message
    assert "/tmp/" not in message and "model_repository" not in message, message


@pytest.mark.parametrize("prefix", ["", "in ensemble 'ensemble_ids', "])
def test_an_engine_refusal_shows_the_models_message_without_triton_wrapper_or_traceback(prefix: str):
    raw = (
        f"{prefix}Failed to process the request(s) for model 'tensorrt_llm_0_0', message: TritonModelException: "
        "runtime_top_p: must be within [0, 1], got 5.0\n\nAt:\n"
        "  /tmp/trtllm-truss-stack-abc/model_repository/tensorrt_llm/1/model.py(330): execute\n"
    )
    assert engine_message(raw) == "runtime_top_p: must be within [0, 1], got 5.0"
    assert engine_message("the engine's own words at /opt/x/y.py") == "the engine's own words at <internal>"


def test_the_engine_interface_is_read_once_for_a_burst_and_again_after_a_failure(monkeypatch):
    """The first requests of a burst on a fresh process wait for one read of the engine model's config;
    a failed read (tritonserver down) is not remembered."""
    from trtllm_truss.engine.client import EnsembleInterface

    client = EngineClient("127.0.0.1:1")
    reads: list[int] = []
    outcomes = [UpstreamError("the engine is unavailable"), None]

    async def read_interface():
        reads.append(1)
        await asyncio.sleep(0.01)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return EnsembleInterface(batched=True, inputs=frozenset({"input_ids"}), outputs=frozenset({"output_ids"}))

    monkeypatch.setattr(client._ensemble, "read_interface", read_interface)

    async def burst():
        return await asyncio.gather(*(client.interface() for _ in range(8)), return_exceptions=True)

    async def scenario():
        return await burst(), await burst()

    first, second = asyncio.run(scenario())
    assert isinstance(first[0], UpstreamError)  # the first read failed; the next caller read again
    assert all(result is first[1] for result in first[1:] + second) and first[1].batched
    assert len(reads) == 2


class _OneMessageCall:
    """A `ModelStreamInfer` call whose only message is `message` (what the aio stub returns, faked)."""

    def __init__(self, message) -> None:
        self._message = message

    async def write(self, request) -> None:
        pass

    async def read(self):
        return self._message

    async def done_writing(self) -> None:
        pass

    async def code(self):
        return grpc.StatusCode.OK

    def cancel(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("error_message", "refused"),
    [
        # python_backend while a model's stub process is dead: Triton never starts it again (runtime.stub_health)
        ("Stub process 'tensorrt_llm_0_0' is not healthy.", False),
        ("in ensemble 'ensemble', Stub process 'postprocessing_0_1' is not healthy.", False),
        ("Failed to process the request(s) for model 'tensorrt_llm_0_0', message: Stub process is not healthy.", False),
        ("Failed to obtain the health mutex.", False),
        ("Failed to process the request(s) for model 'tensorrt_llm_0_0', message: runtime_top_p: must be within [0, 1]", True),
    ],
)
def test_a_dead_stub_is_an_outage_and_a_refusal_is_the_requests_fault(error_message: str, refused: bool):
    from tritonclient.grpc import service_pb2
    from trtllm_truss.engine.client import EngineRefusedError
    from trtllm_truss.engine.rpc_errors import STUB_DOWN_MESSAGE, stub_down

    assert stub_down(error_message) is not refused
    client = EnsembleClient("127.0.0.1:1")
    message = service_pb2.ModelStreamInferResponse(error_message=error_message)

    class Stub:
        def ModelStreamInfer(self, wait_for_ready: bool = False):
            return _OneMessageCall(message)

    class Triton:
        _client_stub = Stub()

    client._client = Triton()

    async def read():
        stop = lambda: service_pb2.ModelInferRequest(model_name="tensorrt_llm", id="1")  # noqa: E731
        async for _ in client.stream_call(service_pb2.ModelInferRequest(model_name="tensorrt_llm", id="1"), stop):
            pass

    with pytest.raises(UpstreamError) as info:
        asyncio.run(read())
    assert isinstance(info.value, EngineRefusedError) is refused
    assert info.value.status == (400 if refused else 503)
    if not refused:
        assert str(info.value) == STUB_DOWN_MESSAGE
