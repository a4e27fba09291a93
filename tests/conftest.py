"""Shared fixtures: one real modelhost server for the session, serving the example `model_repository/`.

Set MODELHOST_TEST_URL=HOST:PORT to run the same tests against a server that is already running
(for example real NVIDIA Triton on the same repository); tests marked `modelhost_only` are then skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from host.testing import ServerProcess, serve

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
EXTERNAL_URL = os.environ.get("MODELHOST_TEST_URL", "").strip().removeprefix("http://").rstrip("/")


@dataclass(frozen=True)
class ExternalServer:
    """A server this test session did not start (MODELHOST_TEST_URL)."""

    url: str

    @property
    def http_port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def http_url(self) -> str:
        return f"http://{self.url}"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "modelhost_only: needs a modelhost process of its own; skipped with MODELHOST_TEST_URL"
    )
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped where none is usable")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not EXTERNAL_URL:
        return
    skip = pytest.mark.skip(reason=f"MODELHOST_TEST_URL={EXTERNAL_URL}: modelhost-only test")
    for item in items:
        if "modelhost_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_repository() -> Path:
    return MODEL_REPOSITORY


@pytest.fixture(scope="session")
def external_server() -> bool:
    """True when the tests run against MODELHOST_TEST_URL instead of a modelhost they started."""
    return bool(EXTERNAL_URL)


@pytest.fixture(scope="session")
def server(model_repository: Path) -> Iterator[ServerProcess | ExternalServer]:
    """The server under test; `.url` is "127.0.0.1:PORT"."""
    if EXTERNAL_URL:
        yield ExternalServer(EXTERNAL_URL)
        return
    with serve(model_repository) as process:
        yield process


@pytest.fixture
def client(server: ServerProcess | ExternalServer) -> Iterator[object]:
    """A `tritonclient.http.InferenceServerClient` for the server, with bounded timeouts."""
    import tritonclient.http as httpclient

    triton = httpclient.InferenceServerClient(
        server.url, concurrency=8, connection_timeout=10.0, network_timeout=30.0
    )
    yield triton
    triton.close()
