"""What a client may read of the errors Triton and gRPC report: the engine's own words without the
python backend's wrapper, and never an internal address or path."""

from __future__ import annotations

import logging
import re

import grpc

logger = logging.getLogger("trtllm_truss.engine.client")

# What gRPC and the python backend put in error details that a client must not see: addresses
# (`ipv4:127.0.0.1:41719`, `[::1]:8001`, `unix:/path`) and absolute paths (a model.py in a traceback).
_INTERNAL_DETAIL = re.compile(
    r"(?:ipv[46]:)?(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9A-Fa-f:.]+\]|localhost)(?::\d+)?"
    r"|unix:\S+"
    r"|(?<![\w.~])/(?:[^/\s\"']+/)+[^/\s\"':,]*"
)


def client_safe(text: str) -> str:
    """`text` without internal addresses or paths, for messages that can reach an HTTP client."""
    return _INTERNAL_DETAIL.sub("<internal>", text)


# How Triton's python backend wraps an exception a model raised from execute() (after "in ensemble
# 'NAME', " when an ensemble ran it): the model's own message sits between this prefix and the
# traceback ("At:" and the stack frames).
_PYTHON_BACKEND_WRAPPER = re.compile(
    r"Failed to process the request\(s\) for model '[^']*', message: (?:TritonModelException: )?(?P<message>.*?)"
    r"(?:\s+At:\s.*)?$",
    re.DOTALL,
)


# What Triton's python backend answers while a model's stub process is dead (or its health mutex stuck): the
# server's outage, not the request's fault. Triton starts no stub again; the supervisor restarts tritonserver
# (runtime.stub_health).
_STUB_DOWN = re.compile(r"Stub process (?:'[^']*' )?is not healthy|Failed to obtain the health mutex")
STUB_DOWN_MESSAGE = "the engine is unavailable (a process of the inference server died; it is being restarted)"


def stub_down(error_message: str) -> bool:
    """Whether Triton's error says a python-backend stub is dead (503), rather than refusing the request (400)."""
    return _STUB_DOWN.search(error_message) is not None


def engine_message(error_message: str) -> str:
    """The engine's refusal as a client should read it: the model's message, without Triton's
    wrapper, the traceback, addresses or paths."""
    match = _PYTHON_BACKEND_WRAPPER.search(error_message)
    return client_safe((match.group("message") if match else error_message).strip())


def describe_rpc_error(url: str, exc: grpc.aio.AioRpcError) -> str:
    """The message for the client (no address, no path); the full details go to the log with `url`."""
    code = exc.code()
    logger.warning("Triton at %s: %s: %s", url, code.name, exc.details())
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return f"the engine is unavailable ({code.name})"
    return f"Triton error {code.name}: {client_safe(exc.details() or '')}"
