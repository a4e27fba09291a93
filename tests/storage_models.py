"""What the cloud repository tests (test_storage_s3.py, test_storage_cloud.py) share: a python
model to store, the clients' calls, a server that must fail to start, and one interface over the
three stores' real emulators (moto's S3 server, gcp-storage-emulator, Azurite) to fill them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from host.testing import free_port

# Nothing of this machine's cloud set-up reaches a test's server (profile files, instance metadata
# lookups, a proxy for loopback, credentials in the environment).
CLEAN_ENV = {
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    "TRITON_CLOUD_CREDENTIAL_PATH": "", "TRITON_AWS_MOUNT_DIRECTORY": "",
    "TRITON_GCS_MOUNT_DIRECTORY": "", "TRITON_AZURE_MOUNT_DIRECTORY": "",
    "GOOGLE_APPLICATION_CREDENTIALS": "", "NO_GCE_CHECK": "true", "STORAGE_EMULATOR_HOST": "",
    "AZURE_STORAGE_ACCOUNT": "", "AZURE_STORAGE_KEY": "", "AZURE_STORAGE_AUTH_TYPE": "",
    "AZURE_STORAGE_CLIENT_ID": "", "MODELHOST_AZURE_BLOB_ENDPOINT": "",
    "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
}

MODEL_PY = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.add = float(params.get("ADD", {}).get("string_value", "0"))

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", (pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + self.add).astype(np.float32))])
            for r in requests]
'''


def config(name: str, add: int = 0) -> str:
    return f"""name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "ADD" value {{ string_value: "{add}" }} }}
"""


def write_local_model(root: Path, name: str, add: int = 0) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config(name, add))
    (root / name / "1" / "model.py").write_text(MODEL_PY)


def infer_http(url: str, model: str, values: list[float]) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=30)
    x = np.array(values, dtype=np.float32)
    inp = httpclient.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp]).as_numpy("OUT")


def infer_grpc(url: str, model: str, values: list[float]) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    x = np.array(values, dtype=np.float32)
    inp = grpcclient.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], client_timeout=30).as_numpy("OUT")


def index(url: str) -> dict[tuple[str, str], dict[str, Any]]:
    rows = httpclient.InferenceServerClient(url).get_model_repository_index()
    return {(r["name"], r.get("version", "")): r for r in rows}


def start_failure(*args: str, env: dict[str, str] | None = None) -> str:
    """A server expected not to start: its output, once it exited non-zero."""
    ports = []
    for flag in ("--http-port", "--grpc-port", "--metrics-port"):
        ports += [flag, str(free_port())]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MODELHOST_")}
    full_env.update(CLEAN_ENV, **(env or {}))
    result = subprocess.run([sys.executable, "-m", "host", "serve", "--http-address", "127.0.0.1",
                             "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
                             *ports, *args], capture_output=True, text=True, timeout=90, env=full_env)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "Traceback" not in out and "Listening at" not in out, out
    return out


def wait_for_port(port: int, process: subprocess.Popen | None = None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"the emulator exited ({process.returncode}) before listening") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s") from None
            time.sleep(0.1)


# --- the stores --------------------------------------------------------------------------------------

class Store(ABC):
    """One emulator, as the tests fill it: buckets (containers) of objects."""

    scheme: str
    mount_variable: str  # TRITON_*_MOUNT_DIRECTORY
    env: dict[str, str]  # what a server needs to reach the emulator

    @abstractmethod
    def bucket(self, name: str) -> str: ...

    @abstractmethod
    def put(self, bucket: str, key: str, body: bytes | str) -> None: ...

    @abstractmethod
    def keys(self, bucket: str, prefix: str = "") -> list[str]: ...

    @abstractmethod
    def delete(self, bucket: str, key: str) -> None: ...

    @abstractmethod
    def url(self, bucket: str, prefix: str = "") -> str: ...

    @abstractmethod
    def unreachable_url(self, port: int) -> tuple[str, dict[str, str]]:
        """A repository path (and the server's environment) whose endpoint is `port`."""

    def put_model(self, bucket: str, prefix: str, name: str, versions: tuple[int, ...] = (1,),
                  add: int = 0) -> None:
        self.put(bucket, f"{prefix}/{name}/config.pbtxt", config(name, add))
        for version in versions:
            self.put(bucket, f"{prefix}/{name}/{version}/model.py", MODEL_PY)

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        for key in self.keys(bucket, prefix):
            self.delete(bucket, key)


class S3(Store):
    scheme, mount_variable = "s3", "TRITON_AWS_MOUNT_DIRECTORY"

    def __init__(self, port: int) -> None:
        import boto3

        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self.env = {}
        self.client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")

    def bucket(self, name: str) -> str:
        self.client.create_bucket(Bucket=name)
        return name

    def put(self, bucket: str, key: str, body: bytes | str) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=body.encode() if isinstance(body, str) else body)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        listed = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        return [o["Key"] for o in listed]

    def delete(self, bucket: str, key: str) -> None:
        self.client.delete_object(Bucket=bucket, Key=key)

    def url(self, bucket: str, prefix: str = "", host: str = "127.0.0.1") -> str:
        return f"s3://{host}:{self.port}/{bucket}" + (f"/{prefix}" if prefix else "")

    def unreachable_url(self, port: int) -> tuple[str, dict[str, str]]:
        return f"s3://127.0.0.1:{port}/bucket/models", {}


class GCS(Store):
    scheme, mount_variable = "gs", "TRITON_GCS_MOUNT_DIRECTORY"

    def __init__(self, port: int) -> None:
        from google.cloud import storage

        self.endpoint = f"http://127.0.0.1:{port}"
        self.env = {"STORAGE_EMULATOR_HOST": self.endpoint}
        self.client = storage.Client(client_options={"api_endpoint": self.endpoint},
                                     credentials=_anonymous(), project="test")

    def bucket(self, name: str) -> str:
        self.client.create_bucket(name)
        return name

    def put(self, bucket: str, key: str, body: bytes | str) -> None:
        self.client.bucket(bucket).blob(key).upload_from_string(body)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        return [b.name for b in self.client.list_blobs(bucket, prefix=prefix)]

    def delete(self, bucket: str, key: str) -> None:
        self.client.bucket(bucket).blob(key).delete()

    def url(self, bucket: str, prefix: str = "") -> str:
        return f"gs://{bucket}" + (f"/{prefix}" if prefix else "")

    def unreachable_url(self, port: int) -> tuple[str, dict[str, str]]:
        return "gs://bucket/models", {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}


def _anonymous() -> Any:
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()


# Azurite's well-known development account (public: printed in Microsoft's documentation)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class Azure(Store):
    scheme, mount_variable = "as", "TRITON_AZURE_MOUNT_DIRECTORY"

    def __init__(self, port: int) -> None:
        from azure.storage.blob import BlobServiceClient

        self.endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
        self.env = {"AZURE_STORAGE_ACCOUNT": AZURITE_ACCOUNT, "AZURE_STORAGE_KEY": AZURITE_KEY,
                    "MODELHOST_AZURE_BLOB_ENDPOINT": f"http://127.0.0.1:{port}/{{account}}"}
        self.client = BlobServiceClient(self.endpoint, credential={"account_name": AZURITE_ACCOUNT,
                                                                   "account_key": AZURITE_KEY})

    def bucket(self, name: str) -> str:
        self.client.create_container(name)
        return name

    def put(self, bucket: str, key: str, body: bytes | str) -> None:
        self.client.get_container_client(bucket).upload_blob(key, body, overwrite=True)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        return [b.name for b in self.client.get_container_client(bucket).list_blobs(name_starts_with=prefix)]

    def delete(self, bucket: str, key: str) -> None:
        self.client.get_container_client(bucket).delete_blob(key)

    def url(self, bucket: str, prefix: str = "") -> str:
        return f"as://{AZURITE_ACCOUNT}/{bucket}" + (f"/{prefix}" if prefix else "")

    def unreachable_url(self, port: int) -> tuple[str, dict[str, str]]:
        return (f"as://{AZURITE_ACCOUNT}/container/models",
                {**self.env, "MODELHOST_AZURE_BLOB_ENDPOINT": f"http://127.0.0.1:{port}/{{account}}"})


_EMULATOR_VARIABLES = {"STORAGE_EMULATOR_HOST", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY",
                       "MODELHOST_AZURE_BLOB_ENDPOINT"}


# --- the emulators, each in a context that also sets the test process's environment -----------------

def _environment(mp: pytest.MonkeyPatch, extra: dict[str, str]) -> None:
    """This process's environment while an emulator runs: clean, and pointing at the emulator
    (another one that runs at the same time keeps its own variables)."""
    for key, value in {**CLEAN_ENV, **extra}.items():
        if key in extra or key not in _EMULATOR_VARIABLES or key not in os.environ:
            mp.setenv(key, value)
    mp.delenv("AWS_PROFILE", raising=False)  # the servers started here inherit this


def run_s3() -> Iterator[S3]:
    import logging

    moto_server = pytest.importorskip("moto.server")
    with pytest.MonkeyPatch.context() as mp:
        _environment(mp, {})
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request lines
        port = free_port()
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        try:
            yield S3(port)
        finally:
            server.stop()


def run_gcs() -> Iterator[GCS]:
    pytest.importorskip("google.cloud.storage")
    emulator = pytest.importorskip("gcp_storage_emulator.server")
    with pytest.MonkeyPatch.context() as mp:
        port = free_port()
        store = GCS(port)
        _environment(mp, store.env)
        server = emulator.create_server("127.0.0.1", port, in_memory=True)
        server.start()  # a thread of this process; stop() shuts its HTTP server down
        try:
            yield store
        finally:
            server.stop()


def azurite_command() -> str | None:
    """Azurite's blob server: on PATH, or where scripts/install_system_deps.sh installs it."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    installed = cache / "modelhost" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    return shutil.which("azurite-blob") or (str(installed) if installed.exists() else None)


def run_azurite() -> Iterator[Azure]:
    pytest.importorskip("azure.storage.blob")
    command = azurite_command()
    if command is None:
        pytest.skip("azurite-blob not found: scripts/install_system_deps.sh installs it (npm)")
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory(prefix="azurite-") as location:
        port = free_port()
        process = subprocess.Popen([command, "--blobHost", "127.0.0.1", "--blobPort", str(port),
                                    "--location", location, "--skipApiVersionCheck", "--silent",
                                    "--disableTelemetry"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(port, process)
            store = Azure(port)
            _environment(mp, store.env)
            yield store
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
