"""The http target's client side against a real aiohttp server on loopback that speaks truss's
native predict route (streamed text body), to check the request body and the stream decoding."""

from __future__ import annotations

import pytest
from aiohttp import web

from trtllm_truss.bench.targets import TargetError, make_target
from trtllm_truss.bench.workload import BenchRequest

TEXT = "héllo wörld 🙂 done"


@pytest.fixture
async def predict_server():
    bodies: list[dict] = []

    async def ready(_request):
        return web.json_response({})

    async def predict(request):
        bodies.append(await request.json())
        if bodies[-1]["prompt"] == "reject":
            return web.Response(status=422, text='{"detail": "max_tokens: 9999 is above 256"}')
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        raw = TEXT.encode("utf-8")
        # split every 3 bytes: multi-byte characters are cut across chunks
        for i in range(0, len(raw), 3):
            await response.write(raw[i:i + 3])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models/model", ready)
    app.router.add_post("/v1/models/model:predict", predict)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", bodies, app
    await runner.cleanup()


async def test_streamed_text_is_decoded_across_split_characters(predict_server):
    url, bodies, _ = predict_server
    target = make_target("http", url, "min_length")
    await target.open()
    try:
        chunks = [c async for c in target.stream(BenchRequest(0, "a prompt", (1, 2), 7))]
    finally:
        await target.close()
    assert "".join(c.text for c in chunks) == TEXT
    assert all(c.token_count is None for c in chunks)
    assert bodies == [{"prompt": "a prompt", "max_tokens": 7, "stream": True, "min_tokens": 7}]


@pytest.mark.parametrize("mode, extra", [("end_id", {"ignore_eos": True}), ("none", {})])
async def test_ignore_eos_modes_shape_the_body(predict_server, mode, extra):
    url, bodies, _ = predict_server
    target = make_target("http", url, mode)
    await target.open()
    try:
        [c async for c in target.stream(BenchRequest(0, "p", (1,), 3))]
    finally:
        await target.close()
    assert bodies == [{"prompt": "p", "max_tokens": 3, "stream": True, **extra}]


async def test_an_error_status_fails_the_request_with_its_detail(predict_server):
    url, _, _ = predict_server
    target = make_target("http", url, "none")
    await target.open()
    try:
        with pytest.raises(RuntimeError, match=r"HTTP 422 .*max_tokens: 9999 is above 256"):
            [c async for c in target.stream(BenchRequest(0, "reject", (1,), 9999))]
    finally:
        await target.close()


async def test_a_server_that_is_not_ready_is_a_target_error(predict_server):
    url, _, _ = predict_server
    target = make_target("http", url + "/nothing-here", "none")
    with pytest.raises(TargetError, match="answered 404"):
        await target.open()


async def test_an_unreachable_server_is_a_target_error():
    target = make_target("http", "http://127.0.0.1:9", "none")
    with pytest.raises(TargetError, match="not reachable"):
        await target.open()
