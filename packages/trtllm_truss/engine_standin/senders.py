"""The response side of the `tensorrt_llm` stand-in model: sender lanes that turn engine outputs into
Triton responses.

The engine thread only queues its outputs (`Senders.on_output`); each lane's thread builds and sends the
responses of the requests pinned to it, in order, and asks their response senders whether their clients
cancelled them. `triton_models/tensorrt_llm_pytorch/model.py` owns the lanes' lifecycle and the registry
of requests in flight.

Imports without Triton: `triton_python_backend_utils` exists only in the python backend stub, so it is
passed in (`pb_utils`).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from trtllm_truss.engine_standin.responses import (
    NO_EXTRAS,
    PerfMetrics,
    ResponseExtras,
    generation_logits_array,
    kv_block_metrics,
    response_arrays,
)
from trtllm_truss.engine_standin.stream_interval import IntervalBuffer
from trtllm_truss.engine_standin.types import (
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    RequestRejected,
)

log = logging.getLogger("tensorrt_llm_pytorch")  # the model's logger: one name in tritonserver's log

# How often the sender thread asks Triton whether in-flight requests were cancelled by their clients.
CANCEL_CHECK_PERIOD_S = 0.05


def fail(pb_utils, sender, message: str, *, final: bool = True) -> None:
    # Not final: another generation of the same request is still running (batch / n > 1).
    sender.send(
        pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message)),
        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0,
    )


def accept_each(pb_utils, requests, accept: Callable[[object], None], engine: str, logger: logging.Logger = log) -> None:
    """A decoupled model's `execute`: `accept(request)` each; a refused request (RequestRejected, or any
    error, logged) fails alone, through its sender, `engine` naming who refused it.

    Except when every request was refused (the usual case: a bad request arrives alone): then this raises,
    the only way a python-backend model makes Triton count a request as failed (nv_inference_request_failure,
    reason BACKEND: the backend reports statistics per execute(), failed only when it raises, decoupled or
    not; an error sent through a sender counts as a success). The backend answers every request of this
    execute() with the error, so only then, and always before any response sender was taken (a raise after
    one was taken would let the backend delete a factory the stub still uses)."""
    rejected: list[tuple[object, str]] = []
    for request in requests:
        try:
            accept(request)
        except RequestRejected as exc:
            rejected.append((request, str(exc)))
        except Exception as exc:  # a malformed request fails alone
            logger.exception("rejected a request")
            rejected.append((request, f"{engine}: {exc}"))
    if rejected and len(rejected) == len(requests):
        raise pb_utils.TritonModelException("; ".join(dict.fromkeys(message for _, message in rejected)))
    for request, message in rejected:
        fail(pb_utils, request.get_response_sender(), message)


class Group:
    """The generations (rows x sequences) of one Triton request: they share its response sender,
    and only the last of them to finish sends the final flag (NVIDIA's pendingBatchedRequestIds).
    Touched only by the lane all of them are pinned to."""

    def __init__(self, size: int) -> None:
        self.remaining = size

    def finish_one(self) -> bool:
        """True for the generation that finishes last."""
        self.remaining -= 1
        return self.remaining == 0


@dataclass
class InFlight:
    """One Triton request being served: what its sender lane needs to build its responses."""

    engine_id: str
    # The request's Triton id, read while execute() runs: in decoupled mode the request object is
    # released once execute() returns, so the sender threads must never touch it afterwards.
    triton_id: str
    sender: object  # the response sender stays valid until the final response; it answers is_cancelled()
    lane: Lane  # every response of this request leaves from this lane's thread, in order
    streaming: bool
    exclude_input: bool
    want_log_probs: bool
    outputs: frozenset  # the requested outputs: only these are built (engine_standin/responses.py says why)
    history: deque  # the last prefix_window tokens of prompt + already-sent tokens
    group: Group = field(default_factory=lambda: Group(1))
    generation: GenerationRequest | None = None  # the engine request (perf metrics read its admission time)
    batch_index: int | None = None  # set when the Triton request has several rows
    sequence_index: int | None = None  # set when num_return_sequences > 1
    want_perf: bool = False
    arrival_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    context_logits: object = None  # numpy [prompt_len, vocab], from the first output
    generation_logits: list = field(default_factory=list)  # numpy rows not yet sent
    prompt: list[int] = field(default_factory=list)  # kept only when the prompt is echoed
    sent_tokens: list[int] = field(default_factory=list)  # non-streaming: everything, sent at the end
    sent_log_probs: list[float] = field(default_factory=list)
    sent_tops: list = field(default_factory=list)  # num_top_log_probs: per sent token, (ids, log probs)
    cum_log_prob: float = 0.0
    finished: bool = False
    interval: IntervalBuffer | None = None  # stream_interval > 1, streaming: outputs held between answers


class Lane:
    """A sender thread and its FIFO of engine outputs. `send()` is an IPC round trip to
    tritonserver that releases the GIL, so several lanes send in parallel; a request is pinned to
    one lane so its responses keep their order."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.cond = threading.Condition()
        self.outputs: deque = deque()  # (flight, GenerationOutput), in the engine's order
        # The requests pinned here (engine id -> flight). Only this lane's thread sends their
        # responses and asks their senders is_cancelled(): asking from another thread raced with the
        # final response (which frees the sender's factory) and crashed tritonserver (SIGSEGV).
        self.flights: dict[str, InFlight] = {}
        self.thread: threading.Thread | None = None


def merged(outputs) -> list[tuple[InFlight, list[int], list[float], list, GenerationOutput | None]]:
    """merge_responses: everything waiting for one request becomes one response (first-seen order)."""
    by_flight: dict[int, list] = {}
    for flight, output in outputs:
        entry = by_flight.setdefault(id(flight), [flight, [], [], [], None])
        entry[1].extend(output.token_ids)
        entry[2].extend(output.log_probs or ())
        entry[3].extend(output.top_log_probs or ())
        if output.finished:
            entry[4] = output
    return [tuple(entry) for entry in by_flight.values()]


class Senders:
    """The model's sender lanes. `lock` guards every lane's `flights` together with the model's maps of
    requests in flight; `forget(flight)` drops a finished request from them; `stopping` ends the lanes'
    threads once their queues are empty; `count_cancelled()` counts a request its client cancelled."""

    def __init__(
        self, pb_utils, engine, *, count: int, merge: bool, decoupled: bool, lock: threading.Lock,
        stopping: threading.Event, forget: Callable[[InFlight], None], count_cancelled: Callable[[], None],
    ) -> None:
        self._pb = pb_utils
        self.engine = engine
        self.merge = merge
        self.decoupled = decoupled
        self._lock = lock
        self._stopping = stopping
        self._forget = forget
        self._count_cancelled = count_cancelled
        self.lanes = [Lane(i) for i in range(count)]
        self._next_lane = itertools.count()

    def start(self) -> None:
        for lane in self.lanes:
            lane.thread = threading.Thread(target=self._send_loop, args=(lane,), name=f"tensorrt_llm-sender-{lane.index}", daemon=True)
            lane.thread.start()

    def join(self) -> None:
        """Once `stopping` is set: wakes the lanes and waits for them to send what is queued."""
        for lane in self.lanes:
            with lane.cond:
                lane.cond.notify_all()
        for lane in self.lanes:
            if lane.thread is not None:
                lane.thread.join(timeout=2)

    def next_lane(self) -> Lane:
        """Round robin: all generations of a request go to one lane (they share its sender)."""
        return self.lanes[next(self._next_lane) % len(self.lanes)]

    # ------------------------------------------------------- engine -> responses
    def on_output(self, flight: InFlight, output: GenerationOutput) -> None:
        """Engine thread: only queue; the request's lane builds and sends, one response per output."""
        if flight.want_perf and output.token_ids:
            now = time.monotonic_ns()
            flight.first_token_ns = flight.first_token_ns or now
            flight.last_token_ns = now
        if flight.interval is not None:
            output = flight.interval.admit(output)
            if output is None:
                return
        lane = flight.lane
        with lane.cond:
            lane.outputs.append((flight, output))
            lane.cond.notify()

    def _send_loop(self, lane: Lane) -> None:
        merge = self.merge
        next_check = time.monotonic() + CANCEL_CHECK_PERIOD_S
        while True:
            with lane.cond:
                while not lane.outputs and not self._stopping.is_set():
                    remaining = next_check - time.monotonic()
                    if remaining <= 0:
                        break
                    lane.cond.wait(remaining)
                if not lane.outputs and self._stopping.is_set():
                    return
                outputs, lane.outputs = lane.outputs, deque()
            # A helper's locals die when it returns: a finished request's response sender must not
            # outlive its final response (Triton unloads the model only once every sender is gone).
            if outputs:
                self._send_outputs(lane, outputs, merge)
            del outputs
            if time.monotonic() >= next_check:
                self._check_cancellations(lane)
                next_check = time.monotonic() + CANCEL_CHECK_PERIOD_S

    def _send_outputs(self, lane: Lane, outputs, merge: bool) -> None:
        if merge:
            batches = [(*entry, None) for entry in merged(outputs)]  # logits only travel unmerged
        else:
            batches = [(f, o.token_ids, o.log_probs or [], o.top_log_probs or [], o if o.finished else None, o) for f, o in outputs]
        for flight, tokens, log_probs, tops, finish, output in batches:
            if output is not None:
                if output.context_logits is not None:
                    flight.context_logits = output.context_logits
                if output.generation_logits is not None:
                    flight.generation_logits.append(output.generation_logits)
            try:
                self._respond(flight, tokens, log_probs, tops, finish)
            except Exception:
                log.exception("sending a response failed; cancelling request %s", flight.engine_id)
                self.engine.cancel(flight.engine_id)
                if finish is not None:
                    # _respond counted this generation as finished: end the request visibly.
                    try:
                        fail(self._pb, flight.sender, "tensorrt_llm (PyTorch stand-in): building the response failed", final=flight.group.remaining == 0)
                    except Exception:
                        log.exception("sending the error response failed for %s", flight.engine_id)
            if finish is not None:
                flight.finished = True
                flight.sender = None  # released: see _send_loop
                lane.flights.pop(flight.engine_id, None)
                self._forget(flight)
                if finish.finish_reason is FinishReason.CANCELLED:
                    self._count_cancelled()

    def _check_cancellations(self, lane: Lane) -> None:
        """On the lane's own thread (see Lane.flights); a helper, so no sender stays referenced."""
        with self._lock:
            watched = list(lane.flights.values())
        for flight in watched:
            sender = flight.sender
            try:
                if sender is not None and not flight.finished and sender.is_cancelled():
                    self.engine.cancel(flight.engine_id)
            except Exception:
                log.exception("checking cancellation of %s failed", flight.engine_id)

    def _extras(self, flight: InFlight, *, streaming: bool) -> ResponseExtras:
        """batch_index, sequence_index, logits and perf metrics, as far as this request has them."""
        generation = flight.generation
        if not (
            flight.batch_index is not None
            or flight.sequence_index is not None
            or flight.want_perf
            or (generation is not None and (generation.return_context_logits or generation.return_generation_logits))
        ):
            return NO_EXTRAS
        generation_logits = None
        if generation is not None and generation.return_generation_logits:
            generation_logits = generation_logits_array(
                flight.generation_logits, self.engine.vocab_size, streaming=streaming, max_new_tokens=generation.max_new_tokens
            )
            flight.generation_logits = []
        perf = None
        if flight.want_perf:
            scheduled = (generation.first_scheduled_ns if generation is not None else None) or flight.arrival_ns
            perf = PerfMetrics(
                arrival_time_ns=flight.arrival_ns,
                first_scheduled_time_ns=scheduled,
                first_token_time_ns=flight.first_token_ns or scheduled,
                last_token_time_ns=flight.last_token_ns or scheduled,
                **kv_block_metrics(generation),
            )
        return ResponseExtras(
            batch_index=flight.batch_index,
            sequence_index=flight.sequence_index,
            context_logits=flight.context_logits,
            generation_logits=generation_logits,
            perf=perf,
        )

    def _respond(
        self, flight: InFlight, tokens: list[int], log_probs: list[float], tops: list, finish: GenerationOutput | None
    ) -> None:
        pb_utils = self._pb
        # The request's last generation to finish carries the final flag (one generation: its own).
        last = finish is not None and flight.group.finish_one()
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0
        if finish is not None and finish.finish_reason is FinishReason.ERROR:
            fail(pb_utils, flight.sender, finish.error or "tensorrt_llm (PyTorch stand-in): request failed", final=last)
            return
        if not flight.want_log_probs:
            log_probs, tops = [], []
        if flight.streaming:
            if tokens:
                prefix = list(flight.history)
                flight.history.extend(tokens)
                flight.cum_log_prob += float(sum(log_probs))
                response = self._response(
                    flight.outputs, tokens, log_probs, flight.cum_log_prob, prefix, len(tokens), self._extras(flight, streaming=True),
                    tops,
                )
                flight.sender.send(response, flags=flags)
            elif last:
                flight.sender.send(flags=flags)
            elif finish is not None:
                # Another generation of the request still runs: this one's end, with no new tokens.
                response = self._response(flight.outputs, [], [], flight.cum_log_prob, [], 0, self._extras(flight, streaming=True))
                flight.sender.send(response, flags=0)
            return
        flight.sent_tokens.extend(tokens)
        flight.sent_log_probs.extend(log_probs)
        flight.sent_tops.extend(tops)
        if finish is None:
            return
        if finish.finish_reason is FinishReason.CANCELLED:
            if last:
                # Not decoupled: the one response a request must get (a bare final flag is refused).
                flight.sender.send(None if self.decoupled else pb_utils.InferenceResponse(output_tensors=[]), flags=flags)
            return
        cum = float(sum(flight.sent_log_probs))
        extras = self._extras(flight, streaming=False)
        if flight.exclude_input:
            response = self._response(
                flight.outputs, flight.sent_tokens, flight.sent_log_probs, cum, list(flight.history), len(flight.sent_tokens), extras,
                flight.sent_tops,
            )
        else:
            # Prompt first; log-probs still cover the generated tokens only.
            response = self._response(
                flight.outputs, flight.prompt + flight.sent_tokens, flight.sent_log_probs, cum, [], len(flight.sent_tokens), extras,
                flight.sent_tops,
            )
        flight.sender.send(response, flags=flags)

    def _response(self, *args):
        pb_utils = self._pb
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, array) for name, array in response_arrays(*args)]
        )
