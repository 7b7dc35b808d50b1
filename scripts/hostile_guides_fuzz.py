"""Distinct large and hostile guides against a served stack, and what the stack's memory does (issue 40).

    .venv/bin/python scripts/hostile_guides_fuzz.py --front direct --engine xgrammar --runs 3 --bodies 150

Starts this repository's truss on the embedded default (`--front truss`: truss's server; `direct`: the direct
front with two front processes), sends a few small guided requests (the base), then `--runs` runs of
`--bodies` chat requests at `--concurrency`, each with a guide no earlier request had (seeded per run):
wide objects, big enums, many `anyOf` branches, long `$ref` chains, patterns with large repetition counts,
regexes and grammars of many alternatives, strict and not, from a few KB to ~1 MB. After the base and after
each run it prints the memory of every process of the stack (PSS, so pages shared between forks count
once; RSS beside it), grouped by role, and the caches' own counts from the front's and Triton's
`/metrics`. Asserted at the end: no 5xx, and the stack's PSS after the last run within the base plus the
configured bounds (`runtime.guides.cache_bytes`, `runtime.pytorch.guide_cache_bytes` of the one engine
instance, and what each compile process may hold of its own before it is replaced) plus `--slack-mb`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import string
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT / "packages"), str(REPO_ROOT / "tests" / "integration")]
MB = 1 << 20


def _name(rng: random.Random, length: int = 8) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(length))


def _wide(rng: random.Random) -> dict:
    n = rng.choice((300, 800, 2_000, 5_000, 12_000))
    types = ("integer", "string", "boolean", "number")
    return {"type": "object", "properties": {_name(rng): {"type": rng.choice(types)} for _ in range(n)},
            "required": [] if rng.random() < 0.5 else None}


def _enum(rng: random.Random) -> dict:
    return {"enum": [_name(rng, 12) for _ in range(rng.choice((500, 2_000, 8_000, 30_000)))]}


def _branches(rng: random.Random) -> dict:
    return {"anyOf": [{"type": "object", "properties": {"kind": {"const": _name(rng)}, _name(rng): {"type": "integer"}},
                       "required": ["kind"]} for _ in range(rng.choice((50, 300, 1_500)))]}


def _chain(rng: random.Random) -> dict:
    n = rng.choice((100, 600, 2_500))
    names = [_name(rng) for _ in range(n)]
    defs = {name: {"type": "object", "properties": {"next": {"$ref": f"#/$defs/{names[i + 1]}"} if i + 1 < n else {"type": "null"},
                                                    _name(rng): {"type": "string", "maxLength": rng.randint(1, 50)}}}
            for i, name in enumerate(names)}
    return {"$defs": defs, "$ref": f"#/$defs/{names[0]}"}


def _repetition(rng: random.Random) -> dict:
    a, b = rng.choice(((50, 50), (200, 300), (999, 999))), rng.randint(10, 60)
    props = {_name(rng): {"type": "string", "pattern": f"^([a-z]{{1,{a[0]}}}-){{{b}}}[0-9]{{{a[1]}}}$"} for _ in range(rng.randint(1, 20))}
    return {"type": "object", "properties": props}


SCHEMAS = (_wide, _enum, _branches, _chain, _repetition)


def _regex(rng: random.Random) -> dict:
    words = [_name(rng, rng.randint(4, 14)) for _ in range(rng.choice((200, 2_000, 20_000)))]
    return {"type": "regex", "regex": "(" + "|".join(words) + ")( (" + "|".join(words[:50]) + "))*"}


def _grammar(rng: random.Random) -> dict:
    n = rng.choice((100, 1_000, 5_000))
    rules = [f'r{i} ::= "{_name(rng)}" r{i + 1} | "{_name(rng)}"' for i in range(n)] + [f'r{n} ::= "end"']
    return {"type": "ebnf", "ebnf": 'root ::= r0\n' + "\n".join(rules)}


def body(rng: random.Random) -> dict:
    family = rng.random()
    if family < 0.15:
        response_format = _regex(rng)
    elif family < 0.25:
        response_format = _grammar(rng)
    else:
        schema = rng.choice(SCHEMAS)(rng)
        schema = {k: v for k, v in schema.items() if v is not None}
        response_format = {"type": "json_schema", "json_schema": {"name": "fuzz", "schema": schema, "strict": rng.random() < 0.3}}
    return {"model": "embedded", "messages": [{"role": "user", "content": "JSON:"}], "max_tokens": 4, "temperature": 0,
            "response_format": response_format}


# --- the stack's memory -----------------------------------------------------------------------------


def role(process) -> str:
    cmdline = " ".join(process.cmdline())
    if "triton_python_backend_stub" in cmdline:
        return "stub " + cmdline.split("/model_repository/")[1].split("/")[0] if "/model_repository/" in cmdline else "stub"
    for marker, name in (("tritonserver", "tritonserver"), ("guides.compile_worker", "guide compile processes"),
                         ("guides.compile_service", "guide compile service"), ("fronts.direct_app", "front processes"),
                         ("streaming.worker", "stream workers")):
        if marker in cmdline:
            return name
    return "front (launcher / truss server)"


def memory(root_pid: int) -> dict[str, tuple[float, float]]:
    """PSS and RSS in MB by role, over the server process and everything under it."""
    import psutil

    root = psutil.Process(root_pid)
    by_role: dict[str, list[float]] = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            info = process.memory_full_info()
            name = role(process)
        except psutil.Error:
            continue
        totals = by_role.setdefault(name, [0.0, 0.0])
        totals[0] += info.pss / MB
        totals[1] += info.rss / MB
    return {name: (pss, rss) for name, (pss, rss) in sorted(by_role.items())}


def metrics(url: str, prefix: str) -> dict[str, float]:
    """The series starting with `prefix`, keyed by name and the labels other than model / instance."""
    import re

    import httpx

    values: dict[str, float] = {}
    for line in httpx.get(url, timeout=10, follow_redirects=True).text.splitlines():
        if line.startswith(prefix):
            series, _, value = line.rpartition(" ")
            key = re.sub(r'(model_name|model|instance)="[^"]*",?', "", series).replace(",}", "}").replace("{}", "")
            values[key] = values.get(key, 0.0) + float(value)
    return values


def triton_metrics_url(root_pid: int) -> str | None:
    import psutil

    for process in psutil.Process(root_pid).children(recursive=True):
        for arg in process.cmdline():
            if arg.startswith("--metrics-port="):
                return f"http://127.0.0.1:{arg.split('=')[1]}/metrics"
    return None


def report(label: str, server, triton_url: str | None) -> tuple[float, dict[str, tuple[float, float]]]:
    usage = memory(server.process.pid)
    total = sum(pss for pss, _ in usage.values())
    print(f"\n== {label}: PSS {total:,.0f} MB (RSS {sum(rss for _, rss in usage.values()):,.0f} MB)")
    for name, (pss, rss) in usage.items():
        print(f"   {name:<34} PSS {pss:8.1f} MB   RSS {rss:8.1f} MB")
    front = metrics(server.url + "/metrics", "trtllm_guide_")
    print("   front guide cache: " + ", ".join(f"{k.removeprefix('trtllm_guide_')} {v:,.0f}" for k, v in front.items()))
    if triton_url:
        standin = metrics(triton_url, "trtllm_standin_guide_")
        print("   stand-in guide cache: " + ", ".join(f"{k.removeprefix('trtllm_standin_guide_')} {v:,.0f}" for k, v in standin.items()))
    return total, usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--front", choices=("truss", "direct"), default="direct")
    parser.add_argument("--engine", choices=("xgrammar", "llguidance"), default="xgrammar")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bodies", type=int, default=150)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--slack-mb", type=float, default=64.0, help="allowed beyond the base and the bounds")
    args = parser.parse_args()

    import httpx
    from truss_serving import serve_front

    from trtllm_truss.config.runtime import GuidesConfig, PytorchEngineConfig

    work = Path(tempfile.mkdtemp(prefix="hostile-guides-fuzz-"))
    env = {"TRTLLM_RUNTIME__GUIDED_DECODING_BACKEND": args.engine}
    from trtllm_truss.guides.compile_service import ServiceSettings

    guides = GuidesConfig()
    # the front's cache, one engine instance's, and what each compile process may hold of its own before it is
    # replaced (guides.compile_worker)
    recycle = ServiceSettings.__dataclass_fields__["recycle_bytes"].default
    bounds_mb = (guides.cache_bytes + PytorchEngineConfig().guide_cache_bytes + guides.compile_processes * recycle) / MB
    started = time.monotonic()
    serving = serve_front(args.front, work, env)
    server = next(serving)
    try:
        print(f"{args.front} front, {args.engine}, up in {time.monotonic() - started:.0f} s; log {server.log_path}")
        triton_url = triton_metrics_url(server.process.pid)
        with httpx.Client(base_url=server.url, timeout=300) as client:
            for tag in ("a", "b", "c", "d"):  # the base: what a few ordinary guided requests leave
                client.post("/v1/chat/completions", json={"model": "embedded", "messages": [{"role": "user", "content": "JSON:"}],
                                                          "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {
                                                              "name": "s", "schema": {"type": "object", "properties": {tag: {"type": "integer"}}}}}})
            base, base_usage = report("base (4 small guided requests)", server, triton_url)
            statuses: Counter = Counter()
            for run in range(args.runs):
                rng = random.Random(args.seed * 1000 + run)
                bodies = [body(rng) for _ in range(args.bodies)]
                sizes = [len(json.dumps(b)) for b in bodies]
                run_started = time.monotonic()
                with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                    codes = list(pool.map(lambda b: client.post("/v1/chat/completions", json=b).status_code, bodies))
                statuses.update(codes)
                print(f"\nrun {run + 1}: {len(bodies)} bodies ({sum(sizes) / MB:.1f} MB, largest {max(sizes) / 1024:.0f} KB)"
                      f" in {time.monotonic() - run_started:.1f} s; status {dict(sorted(Counter(codes).items()))}")
                last, last_usage = report(f"after run {run + 1}", server, triton_url)
        print(f"\nstatuses over all runs: {dict(sorted(statuses.items()))}")
        print("PSS from the base to the last run, by role: " + ", ".join(
            f"{name} {base_usage.get(name, (0.0, 0.0))[0]:,.0f} -> {pss:,.0f} MB" for name, (pss, _) in last_usage.items()))
        limit = base + bounds_mb + args.slack_mb
        print(f"after the last run: {last:,.0f} MB; base {base:,.0f} + bounds {bounds_mb:,.0f} + slack {args.slack_mb:,.0f}"
              f" = {limit:,.0f} MB: {'within' if last <= limit else 'OVER'}")
        assert not [code for code in statuses if code >= 500], statuses
        assert last <= limit, (last, limit)
    finally:
        serving.close()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
