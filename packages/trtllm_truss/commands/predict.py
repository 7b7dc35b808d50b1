"""`trtllm-truss predict`: bring the whole stack up, stream one answer to the terminal, stop the stack.

The request goes through the same `LLMService.predict` that truss's server calls (validation,
gRPC stream to the ensemble, stream formatting), only without HTTP in between.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

HELP = "bring the stack up, stream one completion to the terminal, stop"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("truss_dir", nargs="?", default=".", type=Path, help="truss directory (default: .)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="text to complete")
    what.add_argument(
        "--json",
        dest="json_request",
        metavar="JSON",
        help='a full request body, e.g. \'{"prompt": "Hi", "max_tokens": 20}\'',
    )
    parser.add_argument("--max-tokens", type=int, help="tokens to generate (with --prompt)")
    parser.add_argument(
        "--verbose", action="store_true", help="show the stack's logs (tritonserver, build) while loading"
    )


def request_from_args(args: argparse.Namespace) -> dict[str, Any]:
    if args.json_request is not None:
        try:
            body = json.loads(args.json_request)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--json: not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise SystemExit("--json: expected a JSON object")
        return body
    body: dict[str, Any] = {"prompt": args.prompt}
    if args.max_tokens is not None:
        body["max_tokens"] = args.max_tokens
    return body


async def _answer(service: Any, body: dict[str, Any]) -> int:
    """Prints the answer; 0, or 2 when the request was refused (the error printed on stderr)."""
    from fastapi.responses import JSONResponse, StreamingResponse

    result = await service.predict(body, None)
    if isinstance(result, StreamingResponse):
        async for chunk in result.body_iterator:
            sys.stdout.write(chunk.decode() if isinstance(chunk, bytes) else str(chunk))
            sys.stdout.flush()
        sys.stdout.write("\n")
    elif isinstance(result, JSONResponse):
        sys.stderr.write(f"request rejected ({result.status_code}): {json.loads(result.body)['error']}\n")
        return 2
    else:
        sys.stdout.write(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    from fastapi import HTTPException
    from rich.console import Console

    from trtllm_truss.api.native import PredictRequest
    from trtllm_truss.fronts.service import LLMService
    from trtllm_truss.serving.core import parse_request
    from trtllm_truss.serving.native import StreamFailed

    console = Console(stderr=True)
    body = request_from_args(args)
    try:  # the schema needs no running stack: a typo fails in a second, not after loading
        parse_request(PredictRequest, body)
    except HTTPException as exc:
        console.print(f"[red]request rejected ({exc.status_code}):[/red] {exc.detail}", highlight=False)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not args.verbose:  # tritonserver's own warnings (pinned memory, NVML) are noise here
        logging.getLogger("trtllm_truss.tritonserver").setLevel(logging.ERROR)
    service = LLMService(args.truss_dir.resolve())
    try:
        started = time.monotonic()
        try:
            with console.status("loading ...") as status:
                service.load(progress=lambda stage: status.update(f"{stage} ..."))
        except (HTTPException, KeyboardInterrupt):
            raise
        except Exception as exc:  # configuration, download, build or startup: the message says what
            console.print(f"[red]could not start the stack:[/red] {exc}", highlight=False)
            return 1
        console.print(f"[green]ready[/green] in {time.monotonic() - started:.1f} s", highlight=False)
        if isinstance(body.get("prompt"), str) and body.get("stream", True):
            # The prompt on stderr, the completion on stdout: on a terminal they read as one text,
            # piped, stdout holds only what the model wrote.
            console.print(body["prompt"], style="bold", end="", markup=False, highlight=False)
            console.file.flush()
        return asyncio.run(_answer(service, body))
    except HTTPException as exc:
        console.print(f"[red]request rejected ({exc.status_code}):[/red] {exc.detail}", highlight=False)
        return 2
    except StreamFailed as exc:
        console.print(f"[red]generation failed:[/red] {exc}", highlight=False)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        with console.status("Stopping tritonserver ..."):
            service.shutdown()
