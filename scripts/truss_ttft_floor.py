"""What truss's own server adds to the first token, with no engine, tokenizer or worker behind it.

    .venv/bin/python scripts/truss_ttft_floor.py --wait-ms 2.5 --requests 300

Builds a throwaway truss whose `predict` reads the body, waits `--wait-ms` (standing in for the
engine's first token), then returns a StreamingResponse of one chunk, the shape our model returns.
Serves it with truss's real server and times POST -> first body byte with aiohttp (as `bench`
does), back to back and with `--gap-ms` between requests. TTFT minus the wait is truss's share of
any model's added TTFT: a floor that no code inside `predict` can go under.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "packages"))

MODEL_PY = '''
import asyncio
import fastapi
from fastapi.responses import StreamingResponse

WAIT_S = {wait_s}


class Model:
    def __init__(self, **kwargs):
        pass

    def load(self):
        pass

    async def predict(self, http_request: fastapi.Request):
        await http_request.body()
        if WAIT_S:
            await asyncio.sleep(WAIT_S)

        async def body():
            yield b"x"

        return StreamingResponse(body(), media_type="text/plain")
'''


async def _time_requests(url: str, count: int, gap_s: float) -> list[float]:
    import aiohttp

    body = json.dumps({"prompt": "hello world " * 32, "max_tokens": 4, "stream": True})
    ttfts = []
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            started = time.perf_counter()
            async with session.post(url + "/v1/models/model:predict", data=body) as response:
                first = None
                async for _chunk in response.content.iter_any():
                    if first is None:
                        first = time.perf_counter()
            ttfts.append((first - started) * 1e3)
            if gap_s:
                await asyncio.sleep(gap_s)  # idle time between requests, as a closed loop at one stream has
    return ttfts[count // 10 :]  # the first tenth warms up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wait-ms", type=float, default=2.5, help="time predict waits before its response")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=40.0, help="idle time between requests in the second run")
    args = parser.parse_args()

    from trtllm_truss.fronts.truss_server import build_server_root, start_truss_server

    with tempfile.TemporaryDirectory(prefix="truss-floor-") as tmp:
        truss_dir = Path(tmp) / "truss"
        (truss_dir / "model").mkdir(parents=True)
        (truss_dir / "config.yaml").write_text("model_name: ttft-floor\npython_version: py311\n")
        (truss_dir / "model" / "model.py").write_text(MODEL_PY.format(wait_s=args.wait_ms / 1e3))
        server = start_truss_server(build_server_root(truss_dir, Path(tmp) / "work"), Path(tmp) / "server.log")
        try:
            server.wait_ready(120)
            for label, gap_s in (("back to back", 0.0), (f"{args.gap_ms:g} ms apart", args.gap_ms / 1e3)):
                ttfts = sorted(asyncio.run(_time_requests(server.url, args.requests, gap_s)))
                p50 = statistics.median(ttfts)
                print(
                    f"{label:>14}: TTFT p50 {p50:.2f} ms, p90 {ttfts[9 * len(ttfts) // 10]:.2f} ms;"
                    f" truss's share (p50 - wait) {p50 - args.wait_ms:.2f} ms"
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
