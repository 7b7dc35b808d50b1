"""An aborted native stream is one line in the log, not uvicorn's traceback (`serving.native.AbortedStreamLog`)."""

from __future__ import annotations

import logging
import sys

import pytest
from trtllm_truss.serving.native import AbortedStreamLog, StreamFailed, quiet_aborted_streams


class _Group(Exception):
    """An exception group's shape (anyio's task group wraps the body's exception in one) on every Python."""

    def __init__(self, *exceptions: BaseException) -> None:
        super().__init__("unhandled errors in a TaskGroup")
        self.exceptions = exceptions


def _record(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        info = sys.exc_info()
    return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application\n", None, info)


@pytest.mark.parametrize("wrap", [lambda e: e, lambda e: _Group(ValueError("other"), e)], ids=["bare", "in a group"])
def test_an_aborted_native_stream_is_one_line(wrap):
    record = _record(wrap(StreamFailed("the engine is unavailable (UNAVAILABLE)")))
    assert AbortedStreamLog().filter(record)
    assert record.getMessage() == "native stream aborted mid-body: the engine is unavailable (UNAVAILABLE)"
    assert record.exc_info is None and logging.Formatter().format(record).count("\n") == 0


def test_any_other_exception_keeps_its_traceback():
    record = _record(RuntimeError("a bug"))
    assert AbortedStreamLog().filter(record)
    assert record.exc_info is not None and "Traceback" in logging.Formatter().format(record)


def test_installed_once_on_uvicorns_logger():
    quiet_aborted_streams()
    quiet_aborted_streams()
    assert sum(isinstance(f, AbortedStreamLog) for f in logging.getLogger("uvicorn.error").filters) == 1
