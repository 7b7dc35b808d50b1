"""Triton python-backend model `tensorrt_llm` for backend `llmapi`: TensorRT-LLM's LLM API behind NVIDIA's
token-id tensor interface, served by N instances in front of one LLM.

NVIDIA's own llmapi Triton model takes text and answers text; this one takes the inputs of NVIDIA's C++
`tensorrt_llm` model (input_ids, request_output_len, streaming, end_id, sampling, stop/bad words, guided
decoding, lora_task_id, return_log_probs, num_return_sequences, stop, ...: the tensor stand-in's interface,
STANDIN_MODEL_INTERFACE in triton_models/tensorrt_llm_pytorch/model.py, read by the same reader) and answers
output_ids, sequence_length, cum_log_probs, output_log_probs and prefix_ids per response (and, ours, the k
most likely tokens of each position: num_top_log_probs in, output_top_log_probs / output_top_ids out, from
SamplingParams.logprobs=k), so the ensembles, the stream workers and NVIDIA's core-model clients work as
on every other backend.

Where things run (llm_host.py has the whole table): the LLM (`LLM(**1/model.yaml)`, TensorRT-LLM's or the
double's) lives in one process, the LLM host, which the first instance to initialize starts and every
instance connects to (host_link.py). An instance reads its requests' tensors on Triton's thread and sends
each row to the host (`generate_async` there, llm_request.py); its receive thread turns the host's updates
into Triton responses and sends them. One send is a round trip to tritonserver, so N instances send N
times as many responses a second as one (runtime.llmapi.instance_count). A request whose client goes away
(Triton cancellation, checked by the receive thread) or that NVIDIA's `stop` input names (on any instance:
the host knows them all) is aborted in the LLM. The host gone (its process killed, or the double's executor
dead) fails every request in flight and every new one, so the stack's engine probe reads it.

Parameters (string_value): llm_api (tensorrt_llm | double: the LLM-API double of
engine_standin/llmapi_double.py, only where TensorRT-LLM cannot run), tokenizer_dir, max_input_len,
max_output_len, exclude_input_in_output, prefix_window_tokens, lora_adapters (JSON {"<task id>": {"name",
"dir"}}: build.lora_adapters, each sent as a LoRARequest), guided_whitespace (compact | flexible:
runtime.pytorch.guided_whitespace, given to the double only; no LLM() argument of TensorRT-LLM's), synthetic
(true | false) and synthetic_step_time_ms (runtime.pytorch.synthetic: the double's stand-in engine emits tokens
without a model, for `trtllm-truss bench`; the double only), startup_timeout_s (how long an instance waits for
the LLM to be built).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import triton_python_backend_utils as pb_utils
import trtllm_truss
import yaml
from trtllm_truss.engine_standin.request_inputs import STOP_WITHOUT_ID_ERROR, read_generation, read_rows, request_scalar
from trtllm_truss.engine_standin.responses import ENGINE_OUTPUT_NAMES, ResponseExtras, kv_block_arrays, response_arrays
from trtllm_truss.engine_standin.senders import accept_each, fail
from trtllm_truss.engine_standin.settings import StandinSettings, checkpoint_eos_token_id
from trtllm_truss.engine_standin.types import EngineLimits, GenerationRequest, RequestRejected
from trtllm_truss.runtime.stub_watch import watch_parent
from trtllm_truss.triton_models.tensorrt_llm_llmapi.host_link import FrameReader, PendingUpdates, encode, host_address

log = logging.getLogger("tensorrt_llm_llmapi")
CANCEL_CHECK_PERIOD_S = 0.05
# is_cancelled() is an IPC round trip to tritonserver made by the thread that also sends every response:
# past this many checks a second (many requests in flight), each request is checked less often instead.
CANCEL_CHECKS_PER_S = 250
MODEL_YAML = "model.yaml"
HOST_GONE = "tensorrt_llm (LLM API): the LLM host process is gone"
_UNSUPPORTED_FLAGS = {
    "return_context_logits": "context logits are not wired through this model",
    "return_generation_logits": "generation logits are not wired through this model",
}


@dataclass
class Sequence:
    """One generated sequence of a row: what its responses need."""

    history: deque  # the last prefix_window ids before the next response's tokens
    tokens: list[int] = field(default_factory=list)  # all of them, for a non-streamed answer
    log_probs: list[float] = field(default_factory=list)
    tops: list = field(default_factory=list)
    cum: float = 0.0
    finish: str | None = None
    started: bool = False  # a response of it was sent (streaming)
    kv_blocks: tuple[int, int] | None = None  # its prompt's KV blocks (total, reused), with return_perf_metrics


@dataclass
class Flight:
    """One Triton request: its rows (one LLM generate_async each) and their sequences."""

    triton_id: str
    sender: object
    streaming: bool
    exclude_input: bool
    want_log_probs: bool
    want_perf: bool
    top_log_probs: int  # num_top_log_probs (ours): k most likely tokens per position, 0 for none
    outputs: frozenset
    prompts: list[list[int]]
    sequences: list[list[Sequence]]  # [row][sequence index]
    keys: list = field(default_factory=list)
    open: int = 0  # sequences not yet finished
    done: bool = False


class TritonPythonModel:
    def initialize(self, args) -> None:
        model_config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        parameters = {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}
        self.name = str(args.get("model_instance_name", args["model_name"]))
        self.prefix_window = int(parameters.get("prefix_window_tokens", "8") or 8)
        self.exclude_input = parameters.get("exclude_input_in_output", "false").strip().lower() == "true"
        self.limits = EngineLimits(
            max_batch_size=1,
            max_input_len=int(parameters.get("max_input_len") or 1 << 30),
            max_output_len=int(parameters.get("max_output_len") or 1 << 30),
        )
        # lora_task_id -> (name, folder): the stand-in's reader of the same parameter.
        self.adapters = StandinSettings.from_parameters(
            {"model_dir": "-", "lora_adapters": parameters.get("lora_adapters", "")}
        ).lora_adapters
        model_yaml = Path(args["model_repository"]) / str(args["model_version"]) / MODEL_YAML
        llm_args = yaml.safe_load(model_yaml.read_text(encoding="utf-8")) or {}
        self.default_end_id = checkpoint_eos_token_id(llm_args.get("model"))
        self._flights: dict[int, Flight] = {}
        self._rows: dict[tuple[int, int], tuple[Flight, int]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()  # the registry, and the socket's writes
        self.gone: str | None = None
        self._finalizing = False
        self._parent_watch = watch_parent(self.name)
        timeout_s = float(parameters.get("startup_timeout_s") or 1800)
        self._host, self._claim, self._socket = _connect(
            host_address(str(Path(args["model_repository"]).resolve()), os.getppid()), model_yaml, parameters, timeout_s
        )
        self._reader = FrameReader(self._socket)
        self._receiver = threading.Thread(target=self._receive, name=f"{self.name}-sender", daemon=True)
        self._receiver.start()
        log.info("%s: connected to the LLM host%s", self.name, " (started it)" if self._host is not None else "")

    # ------------------------------------------------------------------ requests
    def execute(self, requests):
        accept_each(pb_utils, requests, self._accept, "tensorrt_llm (LLM API)", log)

    def _validate(self, generation: GenerationRequest) -> None:
        limits = self.limits
        if generation.beam_width != 1:
            raise RequestRejected(f"beam_width={generation.beam_width}: this model streams beam width 1 only")
        if not generation.input_ids:
            raise RequestRejected("input_ids: the prompt is empty")
        if len(generation.input_ids) > limits.max_input_len:
            raise RequestRejected(f"input_lengths: {len(generation.input_ids)} tokens exceed max_input_len={limits.max_input_len}")
        if not 1 <= generation.max_new_tokens <= limits.max_output_len:
            raise RequestRejected(f"request_output_len: {generation.max_new_tokens} is not within 1..{limits.max_output_len}")
        if generation.lora_task_id is not None and generation.lora_task_id not in self.adapters:
            # NVIDIA's message (PeftCacheManager::addRequestPeft), as the C++ backend and the stand-in say it.
            raise RequestRejected(f"LoRA task {generation.lora_task_id} not found in cache. Please send LoRA weights with request")
        for name, why in _UNSUPPORTED_FLAGS.items():
            if getattr(generation, name):
                raise RequestRejected(f"{name}: {why}")

    def _send_to_host(self, messages: list) -> None:
        if self.gone is not None:
            raise RequestRejected(self.gone)
        data = encode(messages)
        with self._lock:
            self._socket.sendall(data)

    def _accept(self, request) -> None:
        triton_id = request.request_id() or ""
        if request_scalar(pb_utils, request, "stop", False):
            if not triton_id:
                raise RequestRejected(STOP_WITHOUT_ID_ERROR)
            self._send_to_host([("stop", triton_id)])
            request.get_response_sender().send(
                pb_utils.InferenceResponse(output_tensors=[]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
            return
        if self.gone is not None:
            raise RequestRejected(self.gone)
        shape = read_rows(pb_utils, request, decoupled=self.decoupled)
        rows = []
        for row in range(shape.rows):
            parsed = read_generation(
                shape, row, 0, default_end_id=self.default_end_id, default_exclude_input=self.exclude_input,
                validate=self._validate,
            )
            rows.append((parsed, shape.sequences[row]))
        first = rows[0][0]
        window = self.prefix_window
        flight = Flight(
            triton_id=triton_id,
            sender=request.get_response_sender(),
            streaming=first.streaming,
            exclude_input=first.exclude_input,
            want_log_probs=first.generation.return_log_probs,
            want_perf=first.want_perf,
            top_log_probs=first.generation.top_log_probs if first.generation.return_log_probs else 0,
            outputs=frozenset(request.requested_output_names()) or ENGINE_OUTPUT_NAMES,
            prompts=[list(parsed.prompt) for parsed, _ in rows],
            sequences=[[Sequence(deque(parsed.prompt[-window:], maxlen=window)) for _ in range(count)] for parsed, count in rows],
            open=sum(count for _, count in rows),
        )
        number = next(self._ids)
        flight.keys = [(number, row) for row in range(len(rows))]
        with self._lock:
            self._flights[number] = flight
            for row, key in enumerate(flight.keys):
                self._rows[key] = (flight, row)
        try:
            self._send_to_host(
                [
                    ("submit", key, parsed.generation, count, flight.streaming, triton_id, flight.want_perf)
                    for key, (parsed, count) in zip(flight.keys, rows)
                ]
            )
        except (OSError, RequestRejected) as exc:
            self._forget(flight)
            fail(pb_utils, flight.sender, str(exc) if isinstance(exc, RequestRejected) else HOST_GONE)

    # ------------------------------------------------------------------ the receive (and send) thread
    def _receive(self) -> None:
        """Answer the host's updates, one Triton send each, first tokens first (`PendingUpdates`): the socket
        is read again between sends, so a stream's first token waits for one send, not for every update read
        before it."""
        pending = PendingUpdates(self._unstarted)
        last_check = time.monotonic()
        while True:
            wait = 0 if pending else CANCEL_CHECK_PERIOD_S
            if self._reader.has_frame() or select.select([self._socket], [], [], wait)[0]:
                try:
                    updates = self._read_ready()
                except OSError:
                    updates = None
                if updates is None:
                    self._host_gone()
                    return
                pending.add(updates)
            if pending:
                update = pending.pop()
                try:
                    self._on_update(update)
                except Exception:
                    log.exception("%s: answering an update failed", self.name)
            now = time.monotonic()
            if now - last_check >= max(CANCEL_CHECK_PERIOD_S, len(self._flights) / CANCEL_CHECKS_PER_S):
                last_check = now
                self._check_cancellations()

    def _unstarted(self, update: tuple) -> bool:
        """A streamed sequence that has sent no response yet."""
        entry = self._rows.get(update[0])
        if entry is None or update[1] is None or not entry[0].streaming:
            return False
        return not entry[0].sequences[entry[1]][update[1]].started

    def _read_ready(self) -> list | None:
        """Every update the host has sent so far (None once it is gone)."""
        updates = self._reader.read()
        if updates is None:
            return None
        while self._reader.has_frame() or select.select([self._socket], [], [], 0)[0]:
            more = self._reader.read()
            if more is None:
                break  # seen by the next read
            updates += more
        return updates

    def _on_update(self, update: tuple) -> None:
        key, index, tokens, log_probs, tops, finish, error, *kv = update
        entry = self._rows.get(key)
        if entry is None:
            return  # its request already ended (failed, or its host gone)
        flight, row = entry
        if error is not None:
            self._end_with_error(flight, f"tensorrt_llm (LLM API): {error}")
            return
        sequence = flight.sequences[row][index]
        if kv:
            sequence.kv_blocks = kv[0]
        count = len(flight.sequences[row])
        if tokens:
            if flight.want_log_probs:
                sequence.cum += float(sum(log_probs))
            if not flight.streaming:
                sequence.tokens += tokens
                sequence.log_probs += log_probs or []
                sequence.tops += tops or []
        if finish is not None:
            sequence.finish = finish
            flight.open -= 1
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if flight.open == 0 else 0
        if flight.streaming:
            if tokens:
                prefix = list(sequence.history)
                sequence.history.extend(tokens)
                response = self._response(flight, row, index, count, tokens, log_probs, sequence.cum, prefix, len(tokens), tops)
                sequence.started = True
                flight.sender.send(response, flags=final)
            elif final:
                flight.sender.send(None if self.decoupled else pb_utils.InferenceResponse(output_tensors=[]), flags=final)
        elif final:
            self._send_whole(flight)
        if final:
            self._forget(flight)

    def _send_whole(self, flight: Flight) -> None:
        """A non-streamed request's answer: one response per sequence (prompt first unless
        exclude_input_in_output), the last one final; none for a cancelled request."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if any(s.finish == "cancelled" for row in flight.sequences for s in row):
            flight.sender.send(None if self.decoupled else pb_utils.InferenceResponse(output_tensors=[]), flags=final)
            return
        k = flight.top_log_probs
        responses = []
        for row, sequences in enumerate(flight.sequences):
            prompt = flight.prompts[row]
            for index, s in enumerate(sequences):
                ids = s.tokens if flight.exclude_input else prompt + s.tokens
                prefix = list(s.history) if flight.exclude_input else []
                tops = s.tops[: len(s.tokens)] if k else None
                responses.append(self._response(flight, row, index, len(sequences), ids, s.log_probs, s.cum, prefix, len(s.tokens), tops))
        for response in responses[:-1]:
            flight.sender.send(response, flags=0)
        flight.sender.send(responses[-1], flags=final)

    def _response(self, flight, row, index, count, tokens, log_probs, cum, prefix, generated, tops=None):
        extras = ResponseExtras(
            batch_index=row if len(flight.sequences) > 1 else None, sequence_index=index if count > 1 else None
        )
        arrays = response_arrays(
            flight.outputs, tokens, (log_probs or []) if flight.want_log_probs else [], cum, prefix, generated, extras, tops
        )
        kv = flight.sequences[row][index].kv_blocks
        if flight.want_perf and kv is not None:  # the LLM API's kv_cache_metrics, as NVIDIA's perf outputs
            arrays += kv_block_arrays(flight.outputs, *kv)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in arrays])

    def _end_with_error(self, flight: Flight, message: str) -> None:
        if flight.done:
            return
        self._forget(flight)
        if self.gone is None:
            try:
                self._send_to_host([("abort", key) for key in flight.keys])
            except (OSError, RequestRejected):
                pass
        fail(pb_utils, flight.sender, message)

    def _forget(self, flight: Flight) -> None:
        with self._lock:
            flight.done = True
            for number, _ in flight.keys[:1]:
                self._flights.pop(number, None)
            for key in flight.keys:
                self._rows.pop(key, None)

    def _check_cancellations(self) -> None:
        """Triton cancellation (the client went away): abort the LLM request, which frees its slot."""
        for flight in list(self._flights.values()):
            try:
                if not flight.done and flight.sender.is_cancelled():
                    self._send_to_host([("abort", key) for key in flight.keys])
            except Exception:
                log.exception("checking cancellation of %s failed", flight.triton_id)

    def _host_gone(self) -> None:
        """Every request in flight fails, and every new one; then, unless Triton is unloading the model, this
        stub ends: Triton starts no stub again, and the stack's supervisor restarts tritonserver when a stub of
        it dies (runtime.stub_health), which brings a new LLM host. Until then the probe reads unhealthy."""
        self.gone = HOST_GONE
        if self._host is not None:
            self._host.poll()  # reaped: this stub started it
        log.error("%s: %s; failing %d request(s) in flight", self.name, HOST_GONE, len(self._flights))
        for flight in list(self._flights.values()):
            self._end_with_error(flight, HOST_GONE)
        if not self._finalizing:
            log.error("%s: ending this stub so that tritonserver is restarted with a new LLM host", self.name)
            os._exit(1)

    def finalize(self) -> None:
        self._finalizing = True  # the host closing now is the unload, not a fault
        if self._host is not None:  # this instance started the host: it stops it
            try:
                self._send_to_host([("shutdown",)])
            except (OSError, RequestRejected):
                pass
            try:
                self._host.wait(30)
            except subprocess.TimeoutExpired:
                self._host.kill()
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._socket.close()
        self._parent_watch.finalized()


def _connect(address: str, model_yaml: Path, parameters: dict, timeout_s: float):
    """(the host process if this instance started it, else None; the starter name it holds then; a socket to
    the host, past its `ready`). The first instance to claim the starter name starts the host and holds the
    name for its life; an instance whose starter is gone before the host listens claims it in turn."""
    deadline = time.monotonic() + timeout_s
    host: subprocess.Popen | None = None
    claim: socket.socket | None = None
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(address)
            break
        except OSError:
            sock.close()
        if host is not None and host.poll() is not None:
            raise RuntimeError(f"the LLM host exited with {host.returncode} before it listened (tritonserver's log has why)")
        if claim is None:
            claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                claim.bind(address + "-starter")  # nobody else starts one while it is held
                host = _start_host(address, model_yaml, parameters)
            except OSError:
                claim.close()
                claim = None
        if time.monotonic() > deadline:
            raise RuntimeError(f"the LLM host did not listen within {timeout_s:g} s")
        time.sleep(0.05)
    sock.settimeout(max(1.0, deadline - time.monotonic()))
    first = FrameReader(sock).read()
    sock.settimeout(None)
    if not first:
        raise RuntimeError("the LLM host closed the connection before it was ready (tritonserver's log has why)")
    kind, payload = first[0]
    if kind != "ready":
        raise RuntimeError(f"the LLM host: {payload}")
    return host, claim, sock


def _start_host(address: str, model_yaml: Path, parameters: dict) -> subprocess.Popen:
    python = sys.executable if sys.executable and os.access(sys.executable, os.X_OK) else shutil.which("python3")
    env = dict(os.environ)
    # The rendered model.py put our package on sys.path; the host is a fresh interpreter.
    package_root = str(Path(trtllm_truss.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    process = subprocess.Popen(
        [python, "-m", "trtllm_truss.triton_models.tensorrt_llm_llmapi.llm_host", address.lstrip("\0"), str(model_yaml), str(os.getpid())],
        stdin=subprocess.PIPE, env=env,
    )
    assert process.stdin is not None
    process.stdin.write(json.dumps(parameters).encode())
    process.stdin.close()
    return process
