"""Triton's cloud front ends: SageMaker (`--allow-sagemaker`) and Vertex AI (`--allow-vertex-ai`).

Each is a WSGI app served on a port of its own (8080 by default, as Triton) in front of the same
`Host` as the main HTTP app, whose handlers it reuses: a request to a cloud route is checked and
reframed here, then answered by the KServe V2 app (`host.http.app`) as if it came to that route.
What differs from the V2 HTTP API, as Triton's `sagemaker_server.cc` and `vertex_ai_server.cc`:

- the binary framing: the JSON header's length comes from the Content-Type,
  `application/vnd.sagemaker-triton.binary+json;json-header-size=N` (or `vnd.vertex-ai-triton`),
  not from `Inference-Header-Content-Length`; SageMaker also answers binary outputs with its own
  Content-Type; neither compresses requests or responses;
- a fixed default model: SageMaker's `SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`, Vertex AI's
  `--vertex-ai-default-model` or the repository's only model;
- health: SageMaker `GET /ping` (`SAGEMAKER_TRITON_PING_MODE` ready or live), Vertex AI `GET`
  on `AIP_HEALTH_ROUTE`; 200 when ready, 400 when not;
- Vertex AI's `X-Vertex-Ai-Triton-Redirect` header sends a POST on `AIP_PREDICT_ROUTE` to one of
  the read-only V2 endpoints (or infer); anything that changes state is refused with 403;
- SageMaker's multi-model endpoints (`/models`): load a model folder by path, list, get,
  invoke, unload (docs/deploy.md).

Unmatched routes answer 400 with an empty body, as Triton's do.
"""

from __future__ import annotations

import io
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import orjson

from host.errors import Code, HostError, InvalidArgumentError, UnsupportedError
from host.http import body, codec
from host.http.app import (JSON, OCTET_STREAM, FastInfer, _content_length, _error_answer,
                           _HEADER_LENGTH_KEY)
from host.http.status import error_body

log = logging.getLogger("host.http")

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]

SAGEMAKER_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
VERTEX_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT_KEY = "HTTP_X_VERTEX_AI_TRITON_REDIRECT"
TARGET_MODEL_KEY = "HTTP_X_AMZN_SAGEMAKER_TARGET_MODEL"
INFERENCE_TYPES = ("infer", "generate", "generate_stream")
# Where SageMaker puts the models of a multi-model endpoint; MODELHOST_SAGEMAKER_MODELS_ROOT
# moves it (tests, or a platform that mounts them elsewhere).
SAGEMAKER_MODELS_ROOT = "/opt/ml/models"

# Triton's route patterns (http_server.cc), matched whole.
_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?"
                    r"(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?")
_SERVER = re.compile(r"/v2(?:/health/(live|ready))?")
_SHM = re.compile(r"/v2/(system|cuda)sharedmemory(?:/region/([^/]+))?/(status|register|unregister)")
_CONTROL = re.compile(r"/v2/repository(?:/([^/]+))?/(index|models/([^/]+)/(load|unload))")
_MODELS = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?")
# Messages that mean the model ran out of memory: SageMaker is told 507 so that it unloads others.
_OOM = ("CUDA out of memory", "CUDA_OUT_OF_MEMORY", "Out of memory", "Out Of Memory",
        "out of memory", "MemoryError", "OutOfMemory", "OOM", "Dst tensor is not initialized",
        "Src tensor is not initialized", "CNMEM_STATUS_OUT_OF_MEMORY",
        "CUDNN_STATUS_NOT_INITIALIZED", "CUBLAS_STATUS_ALLOC_FAILED",
        "CUBLAS_STATUS_NOT_INITIALIZED", "Failed to allocate memory", "failed to allocate memory",
        "No space left on device")


def _reply(start_response: Callable, status: str, data: bytes = b"",
           headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    headers = list(headers or [])
    if data and not any(name == "Content-Type" for name, _ in headers):
        headers.append(("Content-Type", JSON))
    headers.append(("Content-Length", str(len(data))))
    start_response(status, headers)
    return [data]


def _route(pattern: str) -> re.Pattern:
    """An AIP_*_ROUTE: Triton matches it as a regular expression (RE2), whole."""
    try:
        return re.compile(pattern)
    except re.error:
        return re.compile(re.escape(pattern))


def mime_header_length(content_type: str | None, mime: str, body_length: int) -> int | None:
    """The JSON header's length named by a binary Content-Type, or None (a JSON-only body).
    Triton parses the number with std::stoi: leading blanks and a sign, then digits; trailing
    text is ignored."""
    if not content_type:
        return None
    pos = content_type.find(mime)
    if pos < 0:
        return None
    if pos != 0:
        raise InvalidArgumentError(
            f"expect MIME type for binary data starts with '{mime}', got: {content_type}")
    text = content_type[len(mime):]
    match = re.match(r"[ \t\n\v\f\r]*([+-]?\d+)", text)
    if match is None:
        raise InvalidArgumentError(f"Unable to parse inference header size, got: {text}")
    value = int(match.group(1))
    if not -2**31 <= value < 2**31:
        raise InvalidArgumentError(
            f"Unable to parse inference header size, value is out of range, got: {text}")
    if value < 0 or value > body_length:
        raise InvalidArgumentError(
            f"inference header size should be in range (0, {body_length}), got: {text}")
    return value


class _CloudApp:
    """What both front ends share: health, and infer with the cloud's binary framing."""

    MIME = ""
    NAME = ""

    def __call__(self, env: dict, start_response: Callable) -> Iterable[bytes]:
        try:
            return self.route(env, start_response)
        except Exception as ex:  # answered, logged, and the server keeps serving
            log.exception("unhandled error on %s %s %s", self.NAME, env.get("REQUEST_METHOD"),
                          env.get("PATH_INFO"))
            return _reply(start_response, "500 Internal Server Error",
                          error_body(f"internal error: {type(ex).__name__}: {ex}"))

    def route(self, env: dict, start_response: Callable) -> Iterable[bytes]:
        raise NotImplementedError

    def __init__(self, main: FastInfer, max_input_size: int) -> None:
        self.main = main
        self.host = main.infer.host
        self.max_input_size = max_input_size
        self.restrictions = main.restrictions

    def denied(self, category: str, env: dict, start_response: Callable) -> list[bytes] | None:
        if self.restrictions is not None:
            message = self.restrictions.category_denial(category, env)
            if message is not None:
                return _reply(start_response, "403 Forbidden", error_body(message))
        return None

    def health(self, env: dict, start_response: Callable, kind: str) -> list[bytes]:
        denied = self.denied("health", env, start_response)
        if denied is not None:
            return denied
        if env.get("REQUEST_METHOD") != "GET":
            return _reply(start_response, "405 Method Not Allowed", error_body("Method Not Allowed"))
        ready = self.host.live() if kind == "live" else self.host.ready()
        return _reply(start_response, "200 OK" if ready else "400 Bad Request")

    def forward(self, env: dict, start_response: Callable, path: str, method: str) -> Iterable[bytes]:
        """Answer as the V2 app answers `method path` (its access rules included)."""
        inner = dict(env)
        inner["PATH_INFO"], inner["REQUEST_METHOD"] = path, method
        return self.main(inner, start_response)

    def infer(self, env: dict, start_response: Callable, model: str, version: str) -> list[bytes]:
        denied = self.denied("inference", env, start_response)
        if denied is not None:
            return denied
        if env.get("REQUEST_METHOD") != "POST":
            return _reply(start_response, "405 Method Not Allowed", error_body("Method Not Allowed"))
        try:
            inner = self._reframed(env)
            headers, data = self.main.infer.answer(inner, model, version)
        except HostError as ex:
            status, headers, data = self.error_answer(ex)
            return _reply(start_response, status, data, headers)
        return _reply(start_response, "200 OK", data, self.response_headers(headers))

    def _reframed(self, env: dict) -> dict:
        """The environ with the body read, its binary framing taken from the Content-Type, and
        no compression either way (Triton's cloud front ends use none)."""
        data = self._body(env)
        header_length = mime_header_length(env.get("CONTENT_TYPE"), self.MIME, len(data))
        inner = {k: v for k, v in env.items() if k not in (
            "HTTP_CONTENT_ENCODING", "HTTP_ACCEPT_ENCODING", "HTTP_TRANSFER_ENCODING",
            _HEADER_LENGTH_KEY)}
        inner["wsgi.input"], inner["CONTENT_LENGTH"] = io.BytesIO(data), str(len(data))
        if header_length is not None:
            inner[_HEADER_LENGTH_KEY] = str(header_length)
        return inner

    def _body(self, env: dict) -> bytes:
        """The request body as sent (size-limited, never decompressed: neither cloud compresses)."""
        chunked = "chunked" in env.get("HTTP_TRANSFER_ENCODING", "").lower()
        return body.read(env["wsgi.input"], _content_length(env), chunked, self.max_input_size)

    def response_headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return headers

    def error_answer(self, ex: HostError) -> tuple[str, list[tuple[str, str]], bytes]:
        return _error_answer(ex)


class VertexAIApp(_CloudApp):
    """Vertex AI's prediction container contract (AIP_PREDICT_ROUTE, AIP_HEALTH_ROUTE)."""

    MIME = VERTEX_MIME
    NAME = "Vertex AI"

    def __init__(self, main: FastInfer, max_input_size: int, predict_route: str, health_route: str,
                 default_model: str, metrics: WSGIApp | None) -> None:
        super().__init__(main, max_input_size)
        self.predict, self.health_route = _route(predict_route), _route(health_route)
        self.default_model = default_model
        self.metrics = metrics

    def route(self, env: dict, start_response: Callable) -> Iterable[bytes]:
        path = env.get("PATH_INFO", "")
        log.debug("Vertex AI request: %s %s", env.get("REQUEST_METHOD"), path)
        if self.health_route.fullmatch(path):
            return self.health(env, start_response, "ready")
        if self.predict.fullmatch(path):
            redirect = env.get(REDIRECT_KEY)
            if redirect is None:
                return self.infer(env, start_response, self.default_model, "")
            answer = self._redirect(env, start_response, "/" + redirect)
            if answer is not None:
                return answer
        log.debug("Vertex AI error: %s %s - 400", env.get("REQUEST_METHOD"), path)
        return _reply(start_response, "400 Bad Request")

    def _redirect(self, env: dict, start_response: Callable, endpoint: str) -> Iterable[bytes] | None:
        """A POST on the predict route sent on to a V2 endpoint; None: no such endpoint."""
        log.debug("Redirecting Vertex AI request: %s", endpoint)
        if env.get("REQUEST_METHOD") != "POST":
            return _reply(start_response, "405 Method Not Allowed")
        if endpoint == "/metrics":
            if self.metrics is None:  # Triton: the metrics of a server without them are an error
                return _reply(start_response, "400 Bad Request")
            inner = dict(env, PATH_INFO="/metrics", REQUEST_METHOD="GET")
            return self.metrics(inner, start_response)
        if endpoint == "/v2/models/stats":
            return self.forward(env, start_response, endpoint, "GET")
        match = _MODEL.fullmatch(endpoint)
        if match is not None:
            model, version, kind = match.group(1), match.group(2) or "", match.group(3) or ""
            if kind == "infer":
                return self.infer(env, start_response, model, version)
            if kind in ("", "ready", "config", "stats"):
                return self.forward(env, start_response, endpoint, "GET")
        if endpoint == "/v2" or _SERVER.fullmatch(endpoint):
            return self.forward(env, start_response, endpoint, "GET")
        match = _SHM.fullmatch(endpoint)
        if match is not None:
            if match.group(3) == "status":
                return self.forward(env, start_response, endpoint, "GET")
            log.debug("Vertex AI redirect blocked: %s", endpoint)  # only read-only queries
            return _reply(start_response, "403 Forbidden")
        match = _CONTROL.fullmatch(endpoint)
        if match is not None:
            if match.group(2) == "index":
                return self.forward(env, start_response, endpoint, "POST")
            log.debug("Vertex AI redirect blocked: %s", endpoint)  # load/unload: the V2 port only
            return _reply(start_response, "403 Forbidden")
        return None


class SageMakerApp(_CloudApp):
    """SageMaker's inference container contract: /ping, /invocations, and the multi-model
    endpoint routes under /models."""

    MIME = SAGEMAKER_MIME
    NAME = "SageMaker"

    def __init__(self, main: FastInfer, max_input_size: int,
                 environ: Mapping[str, str] | None = None) -> None:
        super().__init__(main, max_input_size)
        if environ is None:
            environ = os.environ
        self.ping_mode = environ.get("SAGEMAKER_TRITON_PING_MODE", "ready")
        self.model = environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME",
                                 "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME")
        self.inference_type = environ.get("SAGEMAKER_TRITON_INFERENCE_TYPE", "infer")
        self.models_root = environ.get("MODELHOST_SAGEMAKER_MODELS_ROOT", SAGEMAKER_MODELS_ROOT)
        self.loaded: dict[str, str] = {}  # model name hash -> the folder it was loaded from
        self.lock = threading.Lock()

    def route(self, env: dict, start_response: Callable) -> Iterable[bytes]:
        path = env.get("PATH_INFO", "")
        method = env.get("REQUEST_METHOD")
        log.debug("SageMaker request: %s %s", method, path)
        if path == "/ping":
            return self.health(env, start_response, self.ping_mode)
        if path == "/invocations":
            if self.inference_type == "infer":
                return self.infer(env, start_response, self.model, "")
            return self.forward(env, start_response, f"/v2/models/{self.model}/{self.inference_type}",
                                "POST")
        match = _MODELS.fullmatch(path)
        if match is not None:
            name, invoke = match.group(1) or "", match.group(2)
            if method == "GET":
                denied = self.denied("model-repository", env, start_response)
                if denied is not None:
                    return denied
                return self._get(start_response, name) if name else self._list(start_response)
            if method == "POST" and invoke:
                return self._invoke(env, start_response, name)
            if method == "POST":
                denied = self.denied("model-repository", env, start_response)
                return denied if denied is not None else self._load(env, start_response)
            if method == "DELETE":
                denied = self.denied("model-repository", env, start_response)
                return denied if denied is not None else self._unload(env, start_response, name)
        log.debug("SageMaker error: %s %s - 400", method, path)
        return _reply(start_response, "400 Bad Request")

    # --- framing and errors -------------------------------------------------------------------
    def response_headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Binary outputs: SageMaker's Content-Type carries the JSON header's length."""
        values = dict(headers)
        length = values.get("Inference-Header-Content-Length")
        if values.get("Content-Type") == OCTET_STREAM and length is not None:
            return [("Content-Type", SAGEMAKER_MIME + length)]
        return [("Content-Type", JSON)]

    def error_answer(self, ex: HostError) -> tuple[str, list[tuple[str, str]], bytes]:
        """A model that ran out of memory answers 507, so that SageMaker unloads others first."""
        status, headers, data = _error_answer(ex)
        if any(text in ex.message for text in _OOM):
            status = "507 Insufficient Storage"
        return status, headers, data

    # --- multi-model endpoints ----------------------------------------------------------------
    def _list(self, start_response: Callable) -> list[bytes]:
        with self.lock:
            loaded = list(self.loaded.items())
        models = [{"modelName": name, "modelUrl": url} if self.host.model_ready(name) else {}
                  for name, url in loaded]
        return _reply(start_response, "200 OK", orjson.dumps({"models": models}))

    def _get(self, start_response: Callable, name: str) -> list[bytes]:
        with self.lock:
            url = self.loaded.get(name)
        if url is None:
            return _reply(start_response, "404 Not Found")
        return _reply(start_response, "200 OK", orjson.dumps({"modelName": name, "modelUrl": url}))

    def _invoke(self, env: dict, start_response: Callable, name: str) -> list[bytes]:
        with self.lock:
            known = name in self.loaded
        if not known:
            return _reply(start_response, "404 Not Found")
        target = env.get(TARGET_MODEL_KEY) or name
        log.info("Invoking SageMaker TargetModel: %s", target)
        return self.infer(env, start_response, target, "")

    def _load(self, env: dict, start_response: Callable) -> list[bytes]:
        try:
            doc = self._json(env)
            name, url = doc.get("model_name", ""), doc.get("url", "")
            if not isinstance(name, str) or not isinstance(url, str):
                raise InvalidArgumentError("attempt to access JSON non-string as string")
        except HostError as ex:
            return _reply(start_response, "400 Bad Request", error_body(ex.message))
        target = env.get(TARGET_MODEL_KEY) or name
        log.info("Loading SageMaker TargetModel: %s", target)
        folder = os.path.abspath(os.path.normpath(url or "."))
        if folder.startswith(("/dev/", "/proc/", "/sys/")):
            log.error('Invalid URL: %s. "url" property value cannot start with /dev/, /proc/, or '
                      "/sys/.", url)
            return _reply(start_response, "400 Bad Request")
        try:
            root, model_folder = self._model_folder(url, folder)
            self.host.load_model_from(target, root, model_folder)
        except HostError as ex:
            if ex.code is Code.ALREADY_EXISTS:
                return _reply(start_response, "409 Conflict", error_body(ex.message))
            status = "507 Insufficient Storage" if any(t in ex.message for t in _OOM) else "400 Bad Request"
            return _reply(start_response, status, error_body(ex.message))
        with self.lock:
            self.loaded[name] = root
        return _reply(start_response, "200 OK")

    def _model_folder(self, url: str, folder: str) -> tuple[str, str]:
        """(the repository folder, the model's subfolder in it) of a SageMaker model archive:
        `<root>/<hash>/model` holding the model itself (its config.pbtxt), or one model folder,
        or several of which the ensemble is the one served."""
        root = re.escape(self.models_root.rstrip("/"))
        match = re.fullmatch(root + r"/[0-9A-Za-z._]+/(model)/?([0-9A-Za-z._]+)?", folder)
        if match is None:
            raise InvalidArgumentError(
                f"Invalid \"url\" '{url}': expected a path of the form "
                f"{self.models_root.rstrip('/')}/<hash>/model[/<subdir>]")
        if os.path.exists(os.path.join(folder, "config.pbtxt")):
            return os.path.dirname(folder), os.path.basename(folder)
        chosen = ""
        try:
            entries = sorted((e for e in os.scandir(folder) if e.is_dir()), key=lambda e: e.name)
        except OSError:
            entries = []
        for entry in entries:
            chosen = chosen or entry.name
            try:
                text = Path(entry.path, "config.pbtxt").read_text(errors="replace")
            except OSError:
                continue
            if re.search(r'platform:\s*"ensemble"', text):
                log.info("SageMaker front-end detected an Ensemble config at path: %s",
                         os.path.join(entry.path, "config.pbtxt"))
                chosen = entry.name
                break
        if len(entries) > 5:
            log.warning("Several model directories found. If using ensemble, smaller ensembles "
                        "are recommended for better memory management.")
        return folder, chosen

    def _unload(self, env: dict, start_response: Callable, name: str) -> list[bytes]:
        target = env.get(TARGET_MODEL_KEY) or name
        with self.lock:
            if name not in self.loaded:
                log.debug("Model %s with model hash %s is not loaded.", target, name)
                return _reply(start_response, "404 Not Found")
            root = self.loaded[name]
        log.info("Unloading SageMaker TargetModel: %s", target)
        try:
            self.host.unload_model_from(target, root)
        except HostError as ex:
            log.error("Error when unloading SageMaker Model with dependents for model: %s", target)
            return _reply(start_response, "400 Bad Request", error_body(ex.message))
        finally:
            with self.lock:
                self.loaded.pop(name, None)
        return _reply(start_response, "200 OK")

    def _json(self, env: dict) -> dict[str, Any]:
        return codec.load_json_object(self._body(env))


def check_inference_type(value: str) -> None:
    """SAGEMAKER_TRITON_INFERENCE_TYPE, checked at start (Triton's serve script checks it)."""
    if value not in INFERENCE_TYPES:
        raise UnsupportedError(f"Invalid SAGEMAKER_TRITON_INFERENCE_TYPE '{value}'. Must be one "
                               "of: infer, generate, generate_stream")
