"""The HTTP/REST front end: Triton's KServe v2 HTTP API as a falcon WSGI app over a `Host`.

Thin by design: each responder turns the wire format into core types (`host.http.codec`,
`host.http.generate`), makes one call into the host, and writes the answer. Errors are the
host's `HostError`s, turned into HTTP status by the one table in `host.http.status`.
"""

from __future__ import annotations

import base64
import binascii
import logging
import sys
import time
from typing import Any, Iterator

import falcon
import orjson

from host.config import config_to_json
from host.core import Host
from host.errors import Code, HostError, InternalError, InvalidArgumentError
from host import validation
from host.headers import wsgi_headers
from host.http import body, codec, generate, openai
from host.http.server import CLIENT_GONE
from host.http.status import error_body, status_line
from host.inference import InferenceRequest, InferenceResponse
from host.restricted import Restrictions

log = logging.getLogger("host.http")

DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024
JSON = "application/json"
OCTET_STREAM = "application/octet-stream"
_HEADER_LENGTH_KEY = "HTTP_" + codec.HEADER_LENGTH.upper().replace("-", "_")  # its WSGI environ key


def _version(version: str) -> str:
    """Triton routes only numeric versions (`/versions/([0-9]+)`); anything else is 'Not Found'."""
    if version and not (version.isascii() and version.isdigit()):
        raise falcon.HTTPNotFound()
    return version


def _json(resp: falcon.Response, obj: Any) -> None:
    resp.content_type = JSON
    resp.data = orjson.dumps(obj)


class _Resource:
    def __init__(self, host: Host, max_input_size: int) -> None:
        self.host = host
        self.max_input_size = max_input_size

    def body(self, req: falcon.Request) -> bytes:
        return self.env_body(req.env)

    def env_body(self, env: dict[str, Any], json_only: bool = False, infer: bool = False) -> bytes:
        """The request body from the WSGI environ, size-limited and decompressed. `json_only`:
        a body that is JSON whatever its headers say (generate ignores the header length);
        `infer`: an infer request (see body.read_decoded)."""
        chunked = "chunked" in env.get("HTTP_TRANSFER_ENCODING", "").lower()
        header = None if json_only else env.get("HTTP_INFERENCE_HEADER_CONTENT_LENGTH")
        kind = "JSON" if header is None else "raw" if header.strip() == "0" else "body"
        return body.read_decoded(env["wsgi.input"], _content_length(env), chunked,
                                 self.max_input_size, env.get("HTTP_CONTENT_ENCODING"), kind, infer)

    def json_body(self, req: falcon.Request) -> dict[str, Any]:
        """An optional JSON object body ({} when empty)."""
        return codec.load_json_object(self.body(req))


class Server(_Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _json(resp, self.host.server_metadata())

    def on_get_live(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.status = falcon.HTTP_200 if self.host.live() else falcon.HTTP_400

    def on_get_ready(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.status = falcon.HTTP_200 if self.host.ready() else falcon.HTTP_400


class Model(_Resource):
    """Metadata, readiness, configuration and statistics of a model (version)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, model: str, version: str = "") -> None:
        _json(resp, self.host.model_metadata(model, _version(version)))

    def on_get_ready(self, req: falcon.Request, resp: falcon.Response, model: str,
                     version: str = "") -> None:
        if not self.host.model_ready(model, _version(version)):
            resp.status = falcon.HTTP_400
            resp.content_type = JSON
            resp.data = error_body("Model version not ready")

    def on_get_config(self, req: falcon.Request, resp: falcon.Response, model: str,
                      version: str = "") -> None:
        _json(resp, config_to_json(self.host.model_config(model, _version(version))))

    def on_get_stats(self, req: falcon.Request, resp: falcon.Response, model: str = "",
                     version: str = "") -> None:
        _json(resp, self.host.statistics(model, _version(version)))


class Infer(_Resource):
    def __init__(self, host: Host, max_input_size: int) -> None:
        super().__init__(host, max_input_size)
        # --http-header-forward-pattern (host.headers), or None
        self.forward = getattr(host, "http_header_forwarder", None)

    def on_post(self, req: falcon.Request, resp: falcon.Response, model: str, version: str = "") -> None:
        headers, resp.data = self.answer(req.env, model, _version(version))
        for name, value in headers:
            resp.set_header(name, value)

    def answer(self, env: dict[str, Any], model: str, version: str) -> tuple[list[tuple[str, str]], bytes]:
        """Headers and body of the answer to one infer request (the falcon responder and the
        fast path both call this, so the rules live here once)."""
        request = None
        received = time.perf_counter_ns()
        try:
            data = self.env_body(env, infer=True)
            header_length = codec.parse_header_length(env.get(_HEADER_LENGTH_KEY), len(data))
            if header_length is None and not data:
                header_length = 0  # Triton: an empty body is a raw request with no data
            request, fmt = codec.decode_infer_request(data, header_length, model,
                                                      validation.parse_version(version))
            # Triton's HTTP activities, for a trace (host.trace); the send ones are stamped
            # when the answer is ready (the worker writes it just after). Only while a trace
            # setting can sample: otherwise nothing per request (RemoteHost: always).
            if getattr(self.host, "tracing", True):
                request.frontend_trace = [("HTTP_RECV_START", received),
                                          ("HTTP_RECV_END", time.perf_counter_ns())]
            if self.forward is not None:
                self.forward.apply(request, wsgi_headers(env))
            response = self.host.infer(request)
            out, json_length = codec.encode_infer_response(response, fmt, request.id)
        except HostError as ex:  # Triton's verbose line for a failed infer request
            if log.isEnabledFor(logging.DEBUG):
                log.debug("[request id: %s] Infer failed: %s",
                          (request.id if request is not None else "") or "<id_unknown>", ex.message)
            raise
        finally:
            if request is not None and request.trace is not None:
                request.trace.frontend_done(("HTTP_SEND_START", "HTTP_SEND_END"))
        if json_length is None:
            headers = [("Content-Type", JSON)]
        else:
            headers = [("Content-Type", OCTET_STREAM), (codec.HEADER_LENGTH, str(json_length))]
        accept = env.get("HTTP_ACCEPT_ENCODING")
        if accept:
            encoding = body.response_encoding(accept)
            if encoding:
                out = body.compress(out, encoding)
                headers.append(("Content-Encoding", encoding))
        return headers, out


class FastInfer:
    """The WSGI app `create_app` returns: infer requests skip falcon's machinery, all else uses it.

    POST /v2/models/<m>[/versions/<n>]/infer is the one route on the hot path; matching it by hand
    and calling `Infer.answer` saves falcon's request/response objects and routing, a large share
    of the per-request cost for small models. Every other request, and anything this match is
    unsure of, goes to the falcon app (`.falcon`), which has the same responder behind that route.
    """

    def __init__(self, app: falcon.App, infer: Infer, restrictions: Restrictions | None = None) -> None:
        self.falcon = app
        self.infer = infer
        self.restrictions = restrictions or None  # host.restricted: None when nothing is

    def __call__(self, env: dict[str, Any], start_response: Any) -> Any:
        path = env.get("PATH_INFO", "")
        if "//" in path or not path.startswith("/"):
            # falcon's router drops leading slashes and lets a field match an empty segment, so
            # `//v2/repository/index` or `/v2/models/m/versions//infer` would reach an endpoint by
            # a spelling that the access rules (host.restricted) do not know. Triton's routes
            # match no such path either: one spelling per endpoint.
            data = error_body("Not Found")
            start_response("404 Not Found", [("Content-Type", JSON), ("Content-Length", str(len(data)))])
            return [data]
        if self.restrictions is not None:
            denial = self.restrictions.http_denial(path, env)
            if denial is not None:
                data = error_body(denial)
                start_response("403 Forbidden", [("Content-Type", JSON),
                                                 ("Content-Length", str(len(data)))])
                return [data]
        if env.get("REQUEST_METHOD") == "POST" and path.startswith("/v2/models/") and path.endswith("/infer"):
            parts = path[11:-6].split("/")
            if parts[0] and (len(parts) == 1 or (len(parts) == 3 and parts[1] == "versions"
                                                 and parts[2].isascii() and parts[2].isdigit())):
                return self._infer(env, start_response, parts[0], parts[2] if len(parts) == 3 else "")
        try:
            return self.falcon(env, start_response)
        except Exception:
            raise  # falcon's own handlers answered those already; not reached
        except BaseException as ex:  # noqa: BLE001 - falcon lets SystemExit & co. through: not here
            log.error("unhandled %s on %s %s", type(ex).__name__, env.get("REQUEST_METHOD"), path,
                      exc_info=ex)
            data = error_body(f"internal error: {type(ex).__name__}: {ex}")
            start_response("500 Internal Server Error", [("Content-Type", JSON),
                                                         ("Content-Length", str(len(data)))], sys.exc_info())
            return [data]

    def _infer(self, env: dict[str, Any], start_response: Any, model: str, version: str) -> list[bytes]:
        try:
            headers, data = self.infer.answer(env, model, version)
            status = "200 OK"
        except HostError as ex:
            status, headers, data = _error_answer(ex)
        except BaseException as ex:  # noqa: BLE001 - as falcon's catch-all handler does, SystemExit too
            if not _body_failed(env):  # a broken body: the server answers and logs it, in one line
                log.exception("unhandled error on POST %s", env.get("PATH_INFO"))
            status, headers = "500 Internal Server Error", [("Content-Type", JSON)]
            data = error_body(f"internal error: {type(ex).__name__}: {ex}")
        headers.append(("Content-Length", str(len(data))))
        start_response(status, headers)
        return [data]


def _content_length(env: dict[str, Any]) -> int | None:
    value = env.get("CONTENT_LENGTH")
    if not value:
        return None
    try:
        length = int(value)
    except ValueError:
        raise InvalidArgumentError(f"invalid Content-Length header '{value}'") from None
    if length < 0:
        raise InvalidArgumentError(f"invalid Content-Length header '{value}'")
    return length


class Generate(_Resource):
    def _request(self, req: falcon.Request, model: str, version: str) -> InferenceRequest:
        version = _version(version)
        data = self.env_body(req.env, json_only=True)
        doc = codec.load_json_object(data)
        metadata = self.host.model_metadata(model, version)
        return generate.decode_generate_request(doc, metadata, model, validation.parse_version(version),
                                                raw=data)

    def on_post(self, req: falcon.Request, resp: falcon.Response, model: str, version: str = "") -> None:
        request = self._request(req, model, version)
        responses = generate.collect(self.host, request, req.env.get(CLIENT_GONE))
        for response in responses:
            if response.error is not None:
                raise response.error
        if len(responses) != 1:
            raise InternalError(generate.SINGLE_RESPONSE)
        resp.content_type = JSON
        resp.data = generate.encode_generate_response(responses[0], request.id)

    def on_post_stream(self, req: falcon.Request, resp: falcon.Response, model: str,
                       version: str = "") -> None:
        request = self._request(req, model, version)
        stream = iter(self.host.infer_stream(request))
        try:  # errors before the first response answer as any other request's
            first = next(stream)
            while first is None:
                first = next(stream)
        except StopIteration:
            first = None
        except BaseException:
            _close(stream)
            raise
        if first is not None and first.error is not None:
            resp.status = status_line(first.error.code)
        resp.content_type = generate.CONTENT_TYPE_SSE
        resp.stream = _events(first, stream, request.id)


def _close(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        close()


def _event(response: InferenceResponse, request_id: str) -> bytes:
    if response.error is not None:
        return generate.sse_error(response.error.message)
    try:
        return generate.sse_event(generate.encode_generate_response(response, request_id))
    except HostError as exc:
        return generate.sse_error(exc.message)


def _events(first: InferenceResponse | None, stream: Iterator, request_id: str) -> Iterator[bytes]:
    """The SSE body; closing it (client gone) closes the host's stream, which cancels the request."""
    try:
        if first is not None:
            yield _event(first, request_id)
        while True:
            try:
                response = next(stream)
            except StopIteration:
                return
            except HostError as exc:
                yield generate.sse_error(exc.message)
                return
            except Exception as exc:  # noqa: BLE001 - the status line is gone; report in-band
                log.exception("generate_stream failed")
                yield generate.sse_error(f"internal error: {exc}")
                return
            if response is not None:
                yield _event(response, request_id)
    finally:
        _close(stream)


class Repository(_Resource):
    def on_post_index(self, req: falcon.Request, resp: falcon.Response) -> None:
        ready = self.json_body(req).get("ready", False)
        if type(ready) is not bool:
            raise InvalidArgumentError("Invalid value for 'ready': expected a boolean")
        _json(resp, self.host.repository_index(ready_only=ready))

    def on_post_load(self, req: falcon.Request, resp: falcon.Response, model: str) -> None:
        config, files = _load_parameters(_parameters(self.json_body(req)))
        self.host.load_model(model, config=config, files=files)
        resp.content_type = JSON

    def on_post_unload(self, req: falcon.Request, resp: falcon.Response, model: str) -> None:
        dependents = _parameters(self.json_body(req)).get("unload_dependents", False)
        if type(dependents) is not bool:
            raise validation.json_field_error("unload_dependents", "boolean")
        self.host.unload_model(model, unload_dependents=dependents)
        resp.content_type = JSON


class SharedMemory(_Resource):
    """/v2/systemsharedmemory/... and /v2/cudasharedmemory/... (one resource per kind)."""

    def __init__(self, host: Host, max_input_size: int, kind: str) -> None:
        super().__init__(host, max_input_size)
        self.kind = kind

    def on_get_status(self, req: falcon.Request, resp: falcon.Response, name: str = "") -> None:
        _json(resp, self.host.shm.status(self.kind, name))

    def on_post_register(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        doc = self.json_body(req)
        if self.kind == "system":
            self.host.shm.register_system(name, _field(doc, "key"), doc.get("offset", 0),
                                          _field(doc, "byte_size"))
        else:  # Triton's order and texts (TritonJson's for members it reads with MemberAs*)
            handle = _field(doc, "raw_handle")
            b64 = _member(handle, "b64", str, "string")
            byte_size = _member(doc, "byte_size", int, "unsigned-integer")
            device_id = _member(doc, "device_id", int, "unsigned-integer")
            self.host.shm.register_cuda(name, b64, device_id, byte_size)
        resp.content_type = JSON

    def on_post_unregister(self, req: falcon.Request, resp: falcon.Response, name: str = "") -> None:
        self.host.shm.unregister(name, self.kind)
        resp.content_type = JSON


class Trace(_Resource):
    """/v2/trace/setting and /v2/models/{model}/trace/setting (Triton's trace extension)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, model: str = "") -> None:
        _json(resp, self.host.trace_setting(model))

    def on_post(self, req: falcon.Request, resp: falcon.Response, model: str = "") -> None:
        doc = self.json_body(req)
        changes: dict[str, Any] = {}
        for key, value in doc.items():
            # TritonJson's texts (Triton answers these with 500; a client's mistake is a 400 here)
            if key == "trace_level" and value is not None:
                if not isinstance(value, list):
                    raise InvalidArgumentError("attempt to access JSON non-array as array")
                if not all(type(v) is str for v in value):
                    raise InvalidArgumentError("attempt to access JSON non-string as string")
            elif key in ("trace_rate", "trace_count", "log_frequency") and value is not None:
                if type(value) is not str:
                    raise InvalidArgumentError("attempt to access JSON non-string as string")
            changes[key] = value
        _json(resp, self.host.trace_setting(model, changes))


class Logging(_Resource):
    """/v2/logging (Triton's logging extension); a null value leaves that setting as it is."""

    _TYPES = {"log_info": bool, "log_warning": bool, "log_error": bool, "log_verbose_level": int,
              "log_format": str}
    # TritonJson's texts (Triton answers these with 500; a client's mistake is a 400 here)
    _TYPE_ERRORS = {bool: "attempt to access JSON non-boolean as boolean",
                    int: "attempt to access JSON non-unsigned-integer as unsigned-integer",
                    str: "attempt to access JSON non-string as string"}

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _json(resp, self.host.log_settings())

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        changes: dict[str, Any] = {}
        for key, value in self.json_body(req).items():
            if value is None:
                continue
            kind = self._TYPES.get(key)
            if kind is not None and (type(value) is not kind or (kind is int and value < 0)):  # type: ignore[operator]
                raise InvalidArgumentError(self._TYPE_ERRORS[kind])
            changes[key] = value
        _json(resp, self.host.log_settings(changes, format_name="--log_format"))  # Triton's HTTP text


def _field(doc: dict[str, Any], key: str) -> Any:
    if key not in doc:
        raise InvalidArgumentError(f"Shared memory register request has no '{key}' field")
    return doc[key]


def _member(doc: Any, key: str, kind: type, name: str) -> Any:
    """A member read as TritonJson's MemberAs* reads it: its texts when missing or mistyped."""
    if not isinstance(doc, dict) or key not in doc:
        raise InvalidArgumentError(validation.json_missing_text(key))
    value = doc[key]
    if type(value) is not kind:
        raise InvalidArgumentError(validation.json_type_text(name))
    return value


def _parameters(doc: dict[str, Any]) -> dict[str, Any]:
    params = doc.get("parameters", {})
    if not isinstance(params, dict):  # TritonJson's text, as Triton's load answers it
        raise InvalidArgumentError("attempt to get members for non-object")
    return params


def _load_parameters(params: dict[str, Any]) -> tuple[str | None, dict[str, bytes] | None]:
    """`config` (JSON text) and `file:<version>/<name>` (base64) -> (config, {"<version>/<name>": bytes})."""
    return validation.load_parameters(params, "http", _base64)


def _base64(key: str, value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgumentError(f"'{key}' is not valid base64 data") from None


# --- errors ----------------------------------------------------------------------------------

def _error_answer(ex: HostError) -> tuple[str, list[tuple[str, str]], bytes]:
    """Status line, headers and body for a HostError (the one mapping both paths use)."""
    headers = [("Content-Type", JSON)]
    if ex.code is Code.UNSUPPORTED and ex.message == body.UNSUPPORTED_ENCODING:
        headers.append(("Accept-Encoding", "gzip, deflate"))
    return status_line(ex.code), headers, error_body(ex.message)


def _host_error(req: falcon.Request, resp: falcon.Response, ex: HostError, params: dict) -> None:
    resp.status, headers, resp.data = _error_answer(ex)
    for name, value in headers:
        resp.set_header(name, value)


def _http_error(req: falcon.Request, resp: falcon.Response, ex: falcon.HTTPError, params: dict) -> None:
    """falcon's own errors (no route: 404, wrong method: 405, bad header: 400) as `{"error": ...}`."""
    resp.status = ex.status
    if ex.headers:
        resp.set_headers(ex.headers)
    resp.content_type = JSON
    message = ex.description or ex.title
    if message.startswith(str(ex.status_code) + " "):
        message = message[4:]  # "404 Not Found" -> "Not Found", as Triton words it
    resp.data = error_body(message)


def _body_failed(env: dict[str, Any]) -> bool:
    """Whether reading the request body failed (malformed chunks, a client gone mid-body): the
    HTTP server answers for those itself and logs one rate-limited line (host.http.server)."""
    return getattr(env.get("wsgi.input"), "failure", None) is not None


def _unexpected(req: falcon.Request, resp: falcon.Response, ex: Exception, params: dict) -> None:
    if not _body_failed(req.env):
        log.exception("unhandled error on %s %s", req.method, req.path)
    resp.status = falcon.HTTP_500
    resp.content_type = JSON
    resp.data = error_body(f"internal error: {type(ex).__name__}: {ex}")


# --- the app ---------------------------------------------------------------------------------

_VERSIONED = ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")


def create_app(host: Host, max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
               restrictions: Restrictions | None = None) -> FastInfer:
    """The WSGI app serving `host` over Triton's HTTP/REST API (its falcon app is `.falcon`)."""
    app = falcon.App(media_type=JSON)
    app.req_options.auto_parse_form_urlencoded = False
    app.add_error_handler(Exception, _unexpected)
    app.add_error_handler(falcon.HTTPError, _http_error)
    app.add_error_handler(HostError, _host_error)

    server = Server(host, max_input_size)
    model = Model(host, max_input_size)
    infer = Infer(host, max_input_size)
    gen = Generate(host, max_input_size)
    repo = Repository(host, max_input_size)

    app.add_route("/v2", server)
    app.add_route("/v2/health/live", server, suffix="live")
    app.add_route("/v2/health/ready", server, suffix="ready")
    app.add_route("/v2/models/stats", model, suffix="stats")
    for base in _VERSIONED:
        app.add_route(base, model)
        app.add_route(base + "/ready", model, suffix="ready")
        app.add_route(base + "/config", model, suffix="config")
        app.add_route(base + "/stats", model, suffix="stats")
        app.add_route(base + "/infer", infer)
        app.add_route(base + "/generate", gen)
        app.add_route(base + "/generate_stream", gen, suffix="stream")
    for kind, prefix in (("system", "/v2/systemsharedmemory"), ("cuda", "/v2/cudasharedmemory")):
        shm = SharedMemory(host, max_input_size, kind)
        app.add_route(prefix + "/status", shm, suffix="status")
        app.add_route(prefix + "/region/{name}/status", shm, suffix="status")
        app.add_route(prefix + "/region/{name}/register", shm, suffix="register")
        app.add_route(prefix + "/unregister", shm, suffix="unregister")
        app.add_route(prefix + "/region/{name}/unregister", shm, suffix="unregister")
    trace = Trace(host, max_input_size)
    app.add_route("/v2/trace/setting", trace)
    app.add_route("/v2/models/{model}/trace/setting", trace)
    app.add_route("/v2/logging", Logging(host, max_input_size))
    app.add_route("/v2/repository/index", repo, suffix="index")
    app.add_route("/v2/repository/models/{model}/load", repo, suffix="load")
    app.add_route("/v2/repository/models/{model}/unload", repo, suffix="unload", compile=True)
    openai.add_routes(app, host, repo.body)  # /v1/...: the OpenAI-compatible API (docs/llm.md)
    return FastInfer(app, infer, restrictions)
