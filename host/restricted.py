"""Who may do what: Triton's `--http-restricted-api` and `--grpc-restricted-protocol`.

Endpoints fall into categories; a restricted category answers only requests that carry its
`key=value` header (gRPC: metadata `triton-grpc-protocol-<key>`, as Triton names it). The one
table below maps every endpoint of both front ends to its category: an endpoint added later is
guarded by adding its row.

Triton's answers to a request without the header: HTTP 403 `{"error": "This API is restricted,
expecting header '<key>'"}`, gRPC UNAVAILABLE "This protocol is restricted, expecting header
'<key>'".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config",
              "model-repository", "statistics", "trace", "logging")
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

_MODEL = r"/v2/models/[^/]+(?:/versions/[^/]+)?"
_SHM = r"/v2/(?:system|cuda)sharedmemory"

# category, HTTP paths (one regular expression), gRPC methods of GRPCInferenceService.
ENDPOINTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # "Check": grpc.health.v1.Health, which Triton guards as health too.
    ("health", r"/v2/health/(?:live|ready)", ("ServerLive", "ServerReady", "Check")),
    ("health", _MODEL + r"/ready", ("ModelReady",)),
    ("metadata", r"/v2/?", ("ServerMetadata",)),
    ("metadata", _MODEL + r"/?", ("ModelMetadata",)),
    ("model-config", _MODEL + r"/config", ("ModelConfig",)),
    ("statistics", r"/v2/models/stats|" + _MODEL + r"/stats", ("ModelStatistics",)),
    ("inference", _MODEL + r"/(?:infer|generate|generate_stream)", ("ModelInfer", "ModelStreamInfer")),
    ("shared-memory", _SHM + r"/.*",
     ("SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
      "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister")),
    ("model-repository", r"/v2/repository/.*",
     ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")),
    ("trace", r"/v2/trace/setting|" + _MODEL + r"/trace/setting", ("TraceSetting",)),
    # The OpenAI-compatible API (host.http.openai): modelhost's own, guarded like its V2 kin.
    ("inference", r"/v1/(?:chat/)?completions", ()),
    ("metadata", r"/v1/models(?:/[^/]+)?", ()),
    ("logging", r"/v2/logging", ("LogSettings",)),
)

GRPC_CATEGORY = {method: category for category, _, methods in ENDPOINTS for method in methods}
_HTTP = [(re.compile(pattern + r"\Z"), category) for category, pattern, _ in ENDPOINTS]


class RestrictionError(ValueError):
    """A malformed --http-restricted-api / --grpc-restricted-protocol value (Triton's texts)."""


@dataclass
class Restrictions:
    """Category -> (header, value) for one front end; empty means nothing is restricted."""

    rules: dict[str, tuple[str, str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def http_denial(self, path: str, headers: Mapping[str, str]) -> str | None:
        """The error message for an HTTP request that lacks its category's header, else None.
        `headers` is the WSGI environ (HTTP_<NAME> keys)."""
        for pattern, category in _HTTP:
            if pattern.match(path):
                return self.category_denial(category, headers)
        return None

    def category_denial(self, category: str, headers: Mapping[str, str]) -> str | None:
        """As `http_denial`, for a route whose category is known (the cloud front ends')."""
        rule = self.rules.get(category)
        if rule is None:
            return None
        key, value = rule
        if headers.get("HTTP_" + key.upper().replace("-", "_")) != value:
            return f"This API is restricted, expecting header '{key}'"
        return None

    def grpc_denial(self, method: str, metadata: Iterable[tuple[str, object]]) -> str | None:
        """The error message for a gRPC call (method name) whose metadata lacks the header."""
        rule = self.rules.get(GRPC_CATEGORY.get(method, ""))
        if rule is None:
            return None
        key, value = rule
        for name, got in metadata or ():
            if name == key:
                if isinstance(got, bytes):
                    got = got.decode("latin-1")
                if got == value:
                    return None
        return f"This protocol is restricted, expecting header '{key}'"


def parse(specs: Iterable[str], option: str, key_prefix: str = "", kind: str = "api") -> Restrictions:
    """`<category>[,<category>...]:<key>=<value>` values of one option, as Triton parses them."""
    rules: dict[str, tuple[str, str]] = {}
    for spec in specs:
        names, sep, setting = spec.partition(":")
        key, eq, value = setting.partition("=")
        if not sep or not eq or not names or not key or not value:
            raise RestrictionError(f"--{option} option format is '<config name>:<setting>=<value>'. "
                                   f"Got {spec}")
        for name in names.split(","):
            if name not in CATEGORIES:
                raise RestrictionError(f"unknown restricted {kind} '{name}'")
            if name in rules:
                raise RestrictionError(
                    f"restricted {kind} '{name}' can not be specified in multiple config groups")
            # gRPC metadata keys are lower case on the wire; HTTP header names compare without case.
            rules[name] = ((key_prefix + key).lower() if key_prefix else key, value)
    return Restrictions(rules)


def http(specs: Iterable[str]) -> Restrictions:
    return parse(specs, "http-restricted-api", kind="api")


def grpc(specs: Iterable[str]) -> Restrictions:
    return parse(specs, "grpc-restricted-protocol", GRPC_HEADER_PREFIX, kind="protocol")
