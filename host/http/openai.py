"""An OpenAI-compatible API on the HTTP port, over any model that takes `text_input` and gives
`text_output` (the "inflight" backend with a tokenizer: docs/llm.md).

    GET  /v1/models              the text models (ready ones)
    GET  /v1/models/{model}
    POST /v1/completions         prompt (text, a list of texts, or token ids) -> text
    POST /v1/chat/completions    messages -> the assistant's message (the checkpoint's template)

Both POSTs stream with `"stream": true` (server-sent events, `data: [DONE]` last; usage in a
last chunk with `stream_options.include_usage`). Each request becomes one host request per
choice (`n`), through the same stages as any client's request (statistics, cancellation); a
client that goes away cancels them. Errors are OpenAI's objects:
`{"error": {"message", "type", "param", "code"}}`, 400 naming the parameter for a bad value.

Sampling follows OpenAI: a temperature alone samples (top_p 1.0 is sent unless given), 0 is greedy.
"""

from __future__ import annotations

import json
import math
import queue
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import falcon
import numpy as np
import orjson

from host.core import Host
from host.errors import Code, HostError
from host.http.generate import CLIENT_POLL_S, CONTENT_TYPE_SSE
from host.http.server import CLIENT_GONE
from host.http.status import http_status
from host.inference import InferenceRequest, InferenceResponse, Tensor

_TYPES = {400: "invalid_request_error", 404: "not_found_error", 501: "invalid_request_error",
          503: "service_unavailable_error", 500: "internal_server_error"}
MAX_N = 16


class OpenAIError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def _from_host(exc: HostError) -> OpenAIError:
    status = http_status(exc.code)
    return OpenAIError(exc.message, status=status,
                       code="model_not_found" if exc.code is Code.NOT_FOUND else None)


# --- parameters ---------------------------------------------------------------------------------
def _number(doc: dict, name: str, low: float | None = None, high: float | None = None,
            integer: bool = False, low_open: bool = False) -> Any:
    value = doc.get(name)
    if value is None:
        return None
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or \
            (isinstance(value, float) and not math.isfinite(value)):
        raise OpenAIError(f"'{name}' must be {kind}, got {value!r}", name)
    if (low is not None and (value <= low if low_open else value < low)) or \
            (high is not None and value > high):
        span = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}]"
        raise OpenAIError(f"'{name}' must be in {span}, got {value!r}", name)
    return value


def _flag(doc: dict, name: str) -> bool:
    value = doc.get(name, False)
    if value is None:
        return False
    if type(value) is not bool:
        raise OpenAIError(f"'{name}' must be a boolean, got {value!r}", name)
    return value


_UNSUPPORTED = ("suffix", "logit_bias", "tools", "tool_choice", "functions", "function_call")


@dataclass
class Plan:
    """One OpenAI request, checked: the host requests to make and how to answer."""

    model: str
    chat: bool
    prompts: list[Any]  # text, token ids, or (chat) the messages
    n: int
    stream: bool
    include_usage: bool
    echo: bool
    logprobs: int | None  # completions: top-k count; chat: top_logprobs (0 = just the token's)
    parameters: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None


def parse(doc: Any, chat: bool) -> Plan:
    if not isinstance(doc, dict):
        raise OpenAIError("the request body must be a JSON object")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError("'model' is required and must be a string", "model")
    for name in _UNSUPPORTED:
        if doc.get(name) not in (None, [], {}):
            raise OpenAIError(f"'{name}' is not supported", name)
    fmt = doc.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise OpenAIError("'response_format' other than text is not supported", "response_format")
    if chat:
        prompts = [_messages(doc.get("messages"))]
    else:
        prompts = _prompts(doc.get("prompt"))
    p: dict[str, Any] = {}
    max_tokens = _number(doc, "max_completion_tokens" if chat and "max_completion_tokens" in doc
                         else "max_tokens", 1, integer=True)
    if max_tokens is None and not chat:
        max_tokens = 16  # OpenAI's default for completions
    if max_tokens is None:
        p["max_tokens_auto"] = True
    else:
        p["max_tokens"] = max_tokens
    temperature = _number(doc, "temperature", 0, 2)
    p["temperature"] = 1.0 if temperature is None else float(temperature)
    top_p = _number(doc, "top_p", 0, 1, low_open=True)
    p["top_p"] = 1.0 if top_p is None else float(top_p)  # OpenAI's convention: temperature alone samples
    top_k = _number(doc, "top_k", -1, integer=True)
    if top_k:
        p["top_k"] = 0 if top_k == -1 else top_k
    for name, low, high in (("presence_penalty", -2, 2), ("frequency_penalty", -2, 2)):
        value = _number(doc, name, low, high)
        if value is not None:
            p[name] = float(value)
    rep = _number(doc, "repetition_penalty", 0, low_open=True)
    if rep is not None:
        p["repetition_penalty"] = float(rep)
    min_tokens = _number(doc, "min_tokens", 0, integer=True)
    if min_tokens:
        if max_tokens is not None and min_tokens > max_tokens:
            raise OpenAIError(f"'min_tokens' ({min_tokens}) must not exceed 'max_tokens' ({max_tokens})",
                              "min_tokens")
        p["min_tokens"] = min_tokens
    seed = _number(doc, "seed", -(2 ** 63), 2 ** 64 - 1, integer=True)
    n = _number(doc, "n", 1, MAX_N, integer=True) or 1
    best_of = _number(doc, "best_of", 1, MAX_N, integer=True)
    if best_of is not None and best_of != n:
        raise OpenAIError("'best_of' different from 'n' is not supported", "best_of")
    stop = doc.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise OpenAIError("'stop' must be a non-empty string or a list of them", "stop")
        if stops:
            p["stop"] = json.dumps(stops)
    if _flag(doc, "ignore_eos"):
        p["ignore_eos"] = True
    logprobs: int | None = None
    if chat:
        if _flag(doc, "logprobs"):
            logprobs = _number(doc, "top_logprobs", 0, 20, integer=True) or 0
        elif doc.get("top_logprobs") is not None:
            raise OpenAIError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    else:
        logprobs = _number(doc, "logprobs", 0, 20, integer=True)
    if logprobs is not None:
        p["return_log_probs"] = True
        if logprobs:
            p["top_logprobs"] = logprobs
    stream = _flag(doc, "stream")
    options = doc.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise OpenAIError("'stream_options' needs 'stream': true and must be an object", "stream_options")
    include_usage = bool(options and _flag(options, "include_usage"))
    echo = False if chat else _flag(doc, "echo")
    if echo and logprobs is not None:
        raise OpenAIError("'echo' with 'logprobs' is not supported", "echo")
    return Plan(model, chat, prompts, n, stream, include_usage, echo, logprobs, p,
                None if seed is None else seed % 2 ** 64)


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise OpenAIError("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise OpenAIError(f"'messages[{i}]' must be an object with a 'role'", "messages")
        content = m.get("content", "")
        if isinstance(content, list):  # content parts: the text ones
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or \
                        not isinstance(part.get("text"), str):
                    raise OpenAIError(f"'messages[{i}].content': only text parts are supported",
                                      "messages")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise OpenAIError(f"'messages[{i}].content' must be text", "messages")
        out.append({**m, "content": content})
    return out


def _prompts(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return value
        if all(type(v) is int for v in value):
            return [value]
        if all(isinstance(v, list) and v and all(type(t) is int for t in v) for v in value):
            return value
    raise OpenAIError("'prompt' must be a string, a list of strings, or token ids", "prompt")


# --- running -------------------------------------------------------------------------------------
@dataclass
class Choice:
    index: int
    request: InferenceRequest
    text: list[str] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    top: list[list[tuple[str, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    done: bool = False


def _requests(plan: Plan) -> list[Choice]:
    choices = []
    base_seed = plan.seed if plan.seed is not None else int.from_bytes(uuid.uuid4().bytes[:4], "little")
    for p_index, prompt in enumerate(plan.prompts):
        for j in range(plan.n):
            params = dict(plan.parameters, stream=plan.stream, random_seed=(base_seed + j) % 2 ** 64)
            inputs: dict[str, Tensor] = {}
            if plan.chat:
                params["messages"] = json.dumps(prompt)
            elif isinstance(prompt, str):
                params["text_input"] = prompt
            else:
                ids = np.asarray(prompt, np.int32)
                inputs["input_ids"] = Tensor("input_ids", "INT32", [1, ids.size], ids.reshape(1, -1))
            request = InferenceRequest(model_name=plan.model, inputs=inputs, parameters=params)
            choices.append(Choice(p_index * plan.n + j, request))
    return choices


def _absorb(choice: Choice, response: InferenceResponse) -> str:
    """Take one response into its choice; the new text."""
    out = {t.name: t.data for t in response.outputs}
    piece = ""
    if "text_output" in out:
        piece = "".join(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                        for v in np.asarray(out["text_output"]).reshape(-1))
        choice.text.append(piece)
    if "output_tokens" in out:
        toks = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                for v in np.asarray(out["output_tokens"]).reshape(-1)]
        lps = np.asarray(out.get("output_log_probs", np.zeros(len(toks)))).reshape(-1).tolist()
        choice.tokens += toks
        choice.log_probs += lps[-len(toks):] if toks else []
        if "top_tokens" in out:
            names = np.asarray(out["top_tokens"])
            values = np.asarray(out["top_log_probs"]).reshape(names.shape)
            for row_n, row_v in zip(names, values):
                choice.top.append([(n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n),
                                    float(v)) for n, v in zip(row_n, row_v)])
    params = response.parameters
    if "finish_reason" in params:
        choice.finish_reason = params["finish_reason"]
        choice.prompt_tokens = int(params.get("prompt_tokens", 0))
        choice.completion_tokens = int(params.get("completion_tokens", 0))
    return piece


class _Run:
    """The host requests of one OpenAI request and their responses, in arrival order."""

    def __init__(self, host: Host, choices: list[Choice]) -> None:
        self.choices = choices
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.pending = len(choices)
        for c in choices:
            host.submit(c.request, self._callback(c))

    def _callback(self, choice: Choice) -> Callable[[InferenceResponse | None, bool], None]:
        def put(response: InferenceResponse | None, final: bool) -> None:
            self.events.put((choice, response, final))
        return put

    def cancel(self) -> None:
        for c in self.choices:
            c.request.cancel()

    def next(self, client_gone: Callable[[], bool] | None) -> tuple[Choice, InferenceResponse | None, bool]:
        while True:
            try:
                return self.events.get(timeout=CLIENT_POLL_S)
            except queue.Empty:
                if client_gone is not None and client_gone():
                    self.cancel()
                    raise OpenAIError("the client closed the connection", status=499) from None


def _logprobs_completion(c: Choice) -> dict[str, Any]:
    offsets, at = [], 0
    for t in c.tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": c.tokens, "token_logprobs": c.log_probs,
            "top_logprobs": [dict(row) for row in c.top] if c.top else None, "text_offset": offsets}


def _logprobs_chat(c: Choice, start: int = 0) -> dict[str, Any]:
    content = []
    for i in range(start, len(c.tokens)):
        t = c.tokens[i]
        entry = {"token": t, "logprob": c.log_probs[i], "bytes": list(t.encode()),
                 "top_logprobs": [{"token": n, "logprob": v, "bytes": list(n.encode())}
                                  for n, v in (c.top[i] if i < len(c.top) else [])]}
        content.append(entry)
    return {"content": content}


class OpenAIResource:
    def __init__(self, host: Host, body: Callable[[falcon.Request], bytes]) -> None:
        self.host = host
        self._body = body

    # --- models ----------------------------------------------------------------------------------
    def _text_models(self) -> list[str]:
        names = []
        for row in self.host.repository_index(ready_only=True):
            name = row.get("name")
            if name and name not in names and self._is_text(name):
                names.append(name)
        return names

    def _is_text(self, name: str) -> bool:
        try:
            meta = self.host.model_metadata(name)
        except HostError:
            return False
        return (any(t["name"] == "text_input" for t in meta.get("inputs", ()))
                and any(t["name"] == "text_output" for t in meta.get("outputs", ())))

    @staticmethod
    def _model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "modelhost"}

    def on_get_models(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._json(resp, {"object": "list", "data": [self._model_card(n) for n in self._text_models()]})

    def on_get_model(self, req: falcon.Request, resp: falcon.Response, model: str) -> None:
        if not self._is_text(model):
            return self._error(resp, OpenAIError(f"The model '{model}' does not exist", "model", 404,
                                                 "model_not_found"))
        self._json(resp, self._model_card(model))

    # --- generation ------------------------------------------------------------------------------
    def on_post_completions(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._generate(req, resp, chat=False)

    def on_post_chat(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._generate(req, resp, chat=True)

    def _generate(self, req: falcon.Request, resp: falcon.Response, chat: bool) -> None:
        try:
            try:
                doc = orjson.loads(self._body(req) or b"null")
            except orjson.JSONDecodeError as exc:
                raise OpenAIError(f"the request body is not valid JSON: {exc}") from None
            plan = parse(doc, chat)
            if not self._is_text(plan.model):
                try:
                    self.host.model_metadata(plan.model)
                except HostError as exc:
                    raise OpenAIError(f"The model '{plan.model}' does not exist", "model", 404,
                                      "model_not_found") from exc
                raise OpenAIError(f"model '{plan.model}' does not take text (text_input / text_output)",
                                  "model")
            run = _Run(self.host, _requests(plan))
            gone = req.env.get(CLIENT_GONE)
            if plan.stream:
                first = self._first_event(run, gone)  # errors before any token answer as errors
                resp.content_type = CONTENT_TYPE_SSE
                resp.stream = _sse(plan, run, first, gone)
                return
            self._json(resp, _complete(plan, run, gone))
        except OpenAIError as exc:
            self._error(resp, exc)
        except HostError as exc:
            self._error(resp, _from_host(exc))

    @staticmethod
    def _first_event(run: _Run, gone: Callable[[], bool] | None) -> tuple[Choice, InferenceResponse | None, bool]:
        event = run.next(gone)
        response = event[1]
        if response is not None and response.error is not None:
            run.cancel()
            raise response.error
        return event

    @staticmethod
    def _json(resp: falcon.Response, doc: Any) -> None:
        resp.content_type = "application/json"
        resp.data = orjson.dumps(doc)

    def _error(self, resp: falcon.Response, exc: OpenAIError) -> None:
        resp.status = falcon.code_to_http_status(exc.status if exc.status != 499 else 400)
        self._json(resp, exc.body())


def _complete(plan: Plan, run: _Run, gone: Callable[[], bool] | None) -> dict[str, Any]:
    while run.pending:
        choice, response, final = run.next(gone)
        if response is not None:
            if response.error is not None:
                run.cancel()
                raise response.error
            _absorb(choice, response)
        if final:
            run.pending -= 1
    kind = "chatcmpl" if plan.chat else "cmpl"
    choices = []
    for c in run.choices:
        text = "".join(c.text)
        if plan.chat:
            item: dict[str, Any] = {"index": c.index, "message": {"role": "assistant", "content": text},
                                    "logprobs": _logprobs_chat(c) if plan.logprobs is not None else None,
                                    "finish_reason": c.finish_reason}
        else:
            prompt = plan.prompts[c.index // plan.n]
            if plan.echo and isinstance(prompt, str):
                text = prompt + text
            item = {"index": c.index, "text": text,
                    "logprobs": _logprobs_completion(c) if plan.logprobs is not None else None,
                    "finish_reason": c.finish_reason}
        choices.append(item)
    return {"id": f"{kind}-{uuid.uuid4().hex}", "object": "chat.completion" if plan.chat else "text_completion",
            "created": int(time.time()), "model": plan.model, "choices": choices, "usage": _usage(plan, run)}


def _usage(plan: Plan, run: _Run) -> dict[str, int]:
    prompts = {c.index // plan.n: c.prompt_tokens for c in run.choices}  # a prompt counts once
    prompt = sum(prompts.values())
    completion = sum(c.completion_tokens for c in run.choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _sse(plan: Plan, run: _Run, first: tuple, gone: Callable[[], bool] | None) -> Iterator[bytes]:
    rid = f"{'chatcmpl' if plan.chat else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    obj = "chat.completion.chunk" if plan.chat else "text_completion"

    def chunk(choices: list[dict[str, Any]], usage: dict | None = None) -> bytes:
        doc: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": plan.model,
                               "choices": choices}
        if plan.include_usage:
            doc["usage"] = usage
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    finished = False
    try:
        if plan.chat:
            for c in run.choices:
                yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}])
        event: tuple | None = first
        while run.pending:
            choice, response, final = event if event is not None else run.next(gone)
            event = None
            if response is not None:
                if response.error is not None:
                    run.cancel()
                    yield b"data: " + orjson.dumps(_from_host(response.error).body()) + b"\n\n"
                    finished = True
                    return
                seen = len(choice.tokens)
                piece = _absorb(choice, response)
                logprobs = None
                if plan.logprobs is not None:
                    logprobs = (_logprobs_chat(choice, seen) if plan.chat else
                                {"tokens": choice.tokens[seen:], "token_logprobs": choice.log_probs[seen:],
                                 "top_logprobs": [dict(r) for r in choice.top[seen:]] if choice.top else None,
                                 "text_offset": []})
                reason = choice.finish_reason if final else None
                if piece or reason or logprobs:
                    item: dict[str, Any] = {"index": choice.index, "logprobs": logprobs,
                                            "finish_reason": reason}
                    if plan.chat:
                        item["delta"] = {"content": piece} if piece or not reason else {}
                    else:
                        item["text"] = piece
                    yield chunk([item])
            if final:
                run.pending -= 1
        if plan.include_usage:
            yield chunk([], _usage(plan, run))
        yield b"data: [DONE]\n\n"
        finished = True
    except OpenAIError:
        return
    finally:
        if not finished:
            run.cancel()


def add_routes(app: falcon.App, host: Host, body: Callable[[falcon.Request], bytes]) -> None:
    resource = OpenAIResource(host, body)
    app.add_route("/v1/models", resource, suffix="models")
    app.add_route("/v1/models/{model}", resource, suffix="model")
    app.add_route("/v1/completions", resource, suffix="completions")
    app.add_route("/v1/chat/completions", resource, suffix="chat")
