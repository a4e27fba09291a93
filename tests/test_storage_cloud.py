"""`gs://` and `as://` model repositories (host.storage.gcs, host.storage.azure), as Triton serves them.

Real stores on free loopback ports: gcp-storage-emulator (Google's JSON API, a thread of this
process) and Azurite (Microsoft's emulator, a node process; scripts/install_system_deps.sh installs
it), filled with the stores' own client libraries; real `modelhost serve` processes reading them
and real `tritonclient` (HTTP and gRPC) against those. The behaviours S3 repositories have too run
once per store; the units (path grammar, credentials) need no store.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from storage_models import (AZURITE_ACCOUNT, AZURITE_KEY, CLEAN_ENV, MODEL_PY, GCS, Azure, Store, config,
                            index, infer_grpc, infer_http, run_azurite, run_gcs, run_s3, start_failure,
                            write_local_model)
from tritonclient.utils import InferenceServerException

from host.errors import InvalidArgumentError, NotFoundError
from host.storage import azure, gcs, parse_root
from host.storage.mirror import Mirror
from host.testing import free_port, serve, wait_until

pytestmark = pytest.mark.modelhost_only


@pytest.fixture(scope="module")
def gcs_server() -> Iterator[GCS]:
    yield from run_gcs()


@pytest.fixture(scope="module")
def azurite() -> Iterator[Azure]:
    yield from run_azurite()


@pytest.fixture(params=["gcs_server", "azurite"], ids=["gs", "as"])
def store(request) -> Store:
    return request.getfixturevalue(request.param)


def env_of(store: Store, **extra: str) -> dict[str, str]:
    return {**CLEAN_ENV, **store.env, **extra}


# --- serving ---------------------------------------------------------------------------------------

def test_serves_repository_at_start(store, tmp_path):
    """NONE mode: every model under the path loads, over HTTP and gRPC; the copy lives in a private
    folder under the scheme's TRITON_*_MOUNT_DIRECTORY and is removed when the server stops."""
    bucket = store.bucket("start-bucket")
    store.put_model(bucket, "repo/sub", "identity")
    store.put_model(bucket, "repo/sub", "plus_two", add=2)
    store.put_model(bucket, "elsewhere", "not_served")
    mount = tmp_path / "mount"
    mount.mkdir()
    with serve(store.url(bucket, "repo//sub/"), env=env_of(store, **{store.mount_variable: str(mount)})) as server:
        assert infer_http(server.url, "identity", [1, 2]).tolist() == [1, 2]
        assert infer_grpc(server.grpc_url, "plus_two", [1, 2]).tolist() == [3, 4]
        assert {name for name, _ in index(server.url)} == {"identity", "plus_two"}
        copies = list(mount.iterdir())
        assert len(copies) == 1 and stat.S_IMODE(copies[0].stat().st_mode) == 0o700
        assert (copies[0] / "repository" / "identity" / "1" / "model.py").read_text() == MODEL_PY
        server.stop()
    assert list(mount.iterdir()) == []


def test_explicit_load_and_unload(store):
    """Explicit load and unload through both clients; a model stored after start loads (each load
    reads the store again); one removed since fails to load with Triton's poll failure."""
    bucket = store.bucket("explicit-bucket")
    store.put_model(bucket, "models", "Model_repo-1.0")
    with serve(store.url(bucket, "models"), "--model-control-mode=explicit", env=env_of(store)) as server:
        http = httpclient.InferenceServerClient(server.url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert not http.is_model_ready("Model_repo-1.0")
        http.load_model("Model_repo-1.0")
        assert grpc.is_model_ready("Model_repo-1.0")
        assert infer_grpc(server.grpc_url, "Model_repo-1.0", [5]).tolist() == [5]

        store.put_model(bucket, "models", "late", add=1)
        grpc.load_model("late")
        assert infer_http(server.url, "late", [5]).tolist() == [6]

        http.unload_model("Model_repo-1.0")
        wait_until(lambda: not http.is_model_ready("Model_repo-1.0"), timeout=30)

        store.delete_prefix(bucket, "models/late/")
        with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
            http.load_model("late")


def test_poll_mode_follows_the_store(store):
    """Poll mode: a new version replaces the old (latest 1), a changed config reloads, a removed
    model unloads, an added one loads (generous deadlines; no timed assertion)."""
    bucket = store.bucket("poll-bucket")
    for name in ("versioned", "changing", "doomed"):
        store.put_model(bucket, "repo", name)
    with serve(store.url(bucket, "repo"), "--model-control-mode=poll", "--repository-poll-secs=1",
               env=env_of(store)) as server:
        http = httpclient.InferenceServerClient(server.url)
        assert http.is_model_ready("versioned", "1") and http.is_model_ready("doomed")

        store.put(bucket, "repo/versioned/2/model.py", MODEL_PY)
        store.put(bucket, "repo/changing/config.pbtxt", config("changing", add=10))
        store.delete_prefix(bucket, "repo/doomed/")
        store.put_model(bucket, "repo", "added", add=3)

        def settled() -> bool:
            rows = index(server.url)
            return (rows.get(("versioned", "2"), {}).get("state") == "READY"
                    and rows.get(("versioned", "1"), {}).get("state") == "UNAVAILABLE"
                    and not http.is_model_ready("doomed")
                    and http.is_model_ready("added")
                    and infer_http(server.url, "changing", [1]).tolist() == [11])
        try:
            wait_until(settled, timeout=60, interval=0.5)
        except TimeoutError:
            pytest.fail(f"index: {index(server.url)}\n{server.log_text()[-4000:]}")
        assert index(server.url)[("versioned", "1")]["reason"] == "unloaded"
        assert infer_grpc(server.grpc_url, "added", [1]).tolist() == [4]


def test_local_s3_gs_and_as_repositories_together(gcs_server, azurite, tmp_path):
    """One server over a local folder and one repository in each store; a name in two of them is
    refused, and the message names the cloud paths as given, not their local copies."""
    local = tmp_path / "local"
    write_local_model(local, "from_disk", add=1)
    gs_bucket, as_container = gcs_server.bucket("mixed-bucket"), azurite.bucket("mixed-container")
    gcs_server.put_model(gs_bucket, "models", "from_gs", add=2)
    gcs_server.put_model(gs_bucket, "models", "twice")
    azurite.put_model(as_container, "models", "from_as", add=3)
    azurite.put_model(as_container, "models", "twice")
    gs_url, as_url = gcs_server.url(gs_bucket, "models"), azurite.url(as_container, "models")
    with run_s3_beside() as s3_store:
        # moto's servers in one process share their buckets: not test_storage_s3's mixed-bucket
        s3_store.put_model(s3_store.bucket("together-bucket"), "models", "from_s3", add=4)
        s3_url = s3_store.url("together-bucket", "models")
        with serve(local, "--model-repository", s3_url, "--model-repository", gs_url, "--model-repository",
                   as_url, env={**CLEAN_ENV, **gcs_server.env, **azurite.env}) as server:
            for name, add in (("from_disk", 1), ("from_gs", 2), ("from_as", 3), ("from_s3", 4)):
                assert infer_http(server.url, name, [1]).tolist() == [1 + add], name
            assert not httpclient.InferenceServerClient(server.url).is_model_ready("twice")
            assert f"exists in multiple model repositories: '{gs_url}' and '{as_url}'" in server.log_text()


def run_s3_beside():
    """moto's S3 server for one test (its module fixture lives in test_storage_s3.py)."""
    import contextlib

    pytest.importorskip("boto3")
    return contextlib.contextmanager(run_s3)()


# --- start-up failures -----------------------------------------------------------------------------

def test_missing_container_stops_start(store):
    url = store.url("no-such-bucket", "models")
    out = start_failure("--model-repository", url, env=store.env)
    word = "bucket" if store.scheme == "gs" else "container"
    assert f"failed to read model repository '{url}': {word} 'no-such-bucket' does not exist" in out
    assert len([line for line in out.splitlines() if url in line]) == 1


def test_missing_path_stops_start(store):
    bucket = store.bucket("path-bucket")
    store.put(bucket, "other/x", "x")
    out = start_failure("--model-repository", store.url(bucket, "models"), env=store.env)
    assert f"model repository '{store.url(bucket, 'models')}' does not exist: no object under 'models/'" in out


def test_endpoint_that_does_not_answer_stops_start(store):
    port = free_port()  # nothing listens there
    url, env = store.unreachable_url(port)
    out = start_failure("--model-repository", url, env=env)
    assert f"failed to read model repository '{url}': cannot reach http://127.0.0.1:{port}" in out


def test_azure_refused_key_stops_start(azurite):
    url = azurite.url(azurite.bucket("key-container"))
    out = start_failure("--model-repository", url, env={**azurite.env, "AZURE_STORAGE_KEY": "A" * 88})
    assert f"failed to read model repository '{url}': access denied (" in out
    assert "check the credentials" in out


def test_azure_credential_file_is_used_by_the_server(azurite, tmp_path):
    """The file's "as" entry (longest prefix) gives account and key; the environment has none."""
    container = azurite.bucket("cred-container")
    azurite.put_model(container, "models", "identity")
    file = tmp_path / "creds.json"
    file.write_text(json.dumps({"as": {
        "": {"account_str": "nobody", "account_key": ""},
        azurite.url(container): {"account_str": AZURITE_ACCOUNT, "account_key": AZURITE_KEY}}}))
    env = env_of(azurite, AZURE_STORAGE_ACCOUNT="", AZURE_STORAGE_KEY="", TRITON_CLOUD_CREDENTIAL_PATH=str(file))
    with serve(azurite.url(container, "models"), env=env) as server:
        assert infer_http(server.url, "identity", [1]).tolist() == [1]


def test_gcs_credential_file_is_used_by_the_server(gcs_server, tmp_path):
    """The server takes the "gs" entry of TRITON_CLOUD_CREDENTIAL_PATH (its longest match), and
    says so when none matches or the file it names cannot be used."""
    bucket = gcs_server.bucket("cred-bucket")
    gcs_server.put_model(bucket, "models", "identity")
    file = tmp_path / "creds.json"
    missing = tmp_path / "no-such-key.json"
    file.write_text(json.dumps({"gs": {"gs://other": "", gcs_server.url(bucket): str(missing)}}))
    env = {**gcs_server.env, "TRITON_CLOUD_CREDENTIAL_PATH": str(file)}
    out = start_failure("--model-repository", gcs_server.url(bucket, "models"), env=env)
    assert f"cannot use the Google credentials in '{missing}'" in out
    out = start_failure("--model-repository", "gs://third/models", env=env)
    assert "Cannot match credential for path gs://third/models in TRITON_CLOUD_CREDENTIAL_PATH" in out


@pytest.mark.parametrize("path, module", [("gs://bucket/models", "google.cloud.storage"),
                                          ("as://account/container/models", "azure.storage.blob")])
def test_without_the_library_the_error_says_what_to_install(path, module):
    code = (f"import sys; sys.modules[{module!r}] = None; from host.cli import main; "
            f"sys.exit(main(['serve', '--model-repository', {path!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **CLEAN_ENV})
    extra = "gcs" if path.startswith("gs") else "azure"
    assert result.returncode != 0
    assert f"model repositories need {module.replace('.', '-')}: pip install" in result.stderr, result.stderr
    assert f"modelhost[{extra}]" in result.stderr
    assert "Traceback" not in result.stderr


# --- the mirror ------------------------------------------------------------------------------------

# Names each emulator keeps as written that would name something outside the copy. (Neither
# stores a literal `..` part sent as such; Azurite turns backslashes into slashes, which makes them.)
HOSTILE = {"gs": ["models//abs", "models/m/./z", "models/m/1/./"],
           "as": ["models/m/1/..\\..\\..\\x", "models//abs", "models/m/1/..\\y"]}


def test_hostile_names_are_not_written_outside(store, tmp_path, caplog, monkeypatch):
    for key, value in env_of(store).items():  # the store reads them in this process
        monkeypatch.setenv(key, value)
    bucket = store.bucket("hostile-bucket")
    hostile = HOSTILE[store.scheme]
    for key in hostile:
        store.put(bucket, key, "pwned")
    store.put_model(bucket, "models", "m")
    assert len(store.keys(bucket, "models/")) == len(hostile) + 2  # the store kept them all
    mount = tmp_path / "mount" / "deep"
    mount.mkdir(parents=True)
    module = gcs if store.scheme == "gs" else azure
    copy = Mirror(module.Store(store.url(bucket, "models")), str(mount))
    try:
        copy.sync()
        written = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
        assert written == {f"mount/deep/{copy.root.parent.name}/repository/m/config.pbtxt",
                           f"mount/deep/{copy.root.parent.name}/repository/m/1/model.py"}
        skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
        assert len(skipped) == len(hostile)
        assert all(f"model repository '{store.url(bucket, 'models')}'" in m for m in skipped)
    finally:
        copy.close()
    assert not copy.root.exists()


# --- units: path grammar, credentials, endpoint ----------------------------------------------------

@pytest.mark.parametrize("given, bucket, prefix", [
    ("gs://bucket", "bucket", ""),
    ("gs://bucket/", "bucket", ""),
    ("gs://my.bucket_1-x//a///b/", "my.bucket_1-x", "a/b"),
    ("gs://bucket/path/to/repo", "bucket", "path/to/repo"),
])
def test_gs_path_grammar(given, bucket, prefix):
    parsed = gcs.parse(given)
    assert (parsed.bucket, parsed.prefix, parsed.url) == (bucket, prefix, given)
    assert parse_root(given) == given  # kept as text for the server, not turned into a Path


@pytest.mark.parametrize("given, message", [
    ("gs://", "No bucket name found in path: gs://"),
    ("gs:////", "No bucket name found in path: gs:////"),
    ("gs://Upper/x", "Invalid bucket name: 'Upper' in model repository 'gs://Upper/x'"),
    ("gs://a/x", "Invalid bucket name: 'a'"),
])
def test_gs_path_errors(given, message):
    with pytest.raises(InvalidArgumentError, match=message):
        gcs.parse(given)


@pytest.mark.parametrize("given, account, container, prefix", [
    ("as://account/container", "account", "container", ""),
    ("as://account/container/", "account", "container", ""),
    ("as://account/container/path//to/repo/", "account", "container", "path/to/repo"),
    ("as://account.blob.core.windows.net/container/p", "account", "container", "p"),
    ("as://Account-002/Container/p?sv=ignored", "Account-002", "Container", "p"),
])
def test_as_path_grammar(given, account, container, prefix):
    parsed = azure.parse(given)
    assert (parsed.account, parsed.container, parsed.prefix, parsed.url) == (account, container, prefix, given)
    assert parse_root(given) == given


@pytest.mark.parametrize("given, message", [
    ("as://", "Invalid azure storage path: as://$"),
    ("as://account", "Invalid azure storage path: as://account$"),
    ("as://account/", "Invalid azure storage path"),
    ("as:///container/x", "Invalid azure storage path"),
    ("as://account/?x", "Invalid azure storage path"),
    ("as://evil.example#/container/x", "Invalid storage account name: 'evil.example#'"),
])
def test_as_path_errors(given, message):
    with pytest.raises(InvalidArgumentError, match=message.replace("?", r"\?")):
        azure.parse(given)


def test_gs_credential_file_longest_match(tmp_path):
    file = tmp_path / "creds.json"
    file.write_text(json.dumps({"s3": {"": {}}, "gs": {
        "": "/keys/default.json", "gs://bucket-2": "/keys/two.json", "gs://bucket-2/special": ""}}))
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(file), "GOOGLE_APPLICATION_CREDENTIALS": "/keys/env.json"}
    assert gcs.credential_file("gs://bucket-1/models", env) == "/keys/default.json"
    assert gcs.credential_file("gs://bucket-2/models", env) == "/keys/two.json"
    assert gcs.credential_file("gs://bucket-2/special/m", env) == ""  # the default chain, then anonymous
    assert gcs.credential_file("gs://bucket-2/models", {"GOOGLE_APPLICATION_CREDENTIALS": "/k.json"}) == "/k.json"
    assert gcs.credential_file("gs://bucket-2/models", {}) == ""

    file.write_text(json.dumps({"s3": {"": {}}}))
    with pytest.raises(NotFoundError, match="Cannot match credential for path gs://x/m"):
        gcs.credential_file("gs://x/m", env)
    file.write_text(json.dumps({"gs": {"": {"not": "a path"}}}))
    with pytest.raises(InvalidArgumentError, match="not the path of a credentials file"):
        gcs.credential_file("gs://x/m", env)


def test_as_credential_file_longest_match(tmp_path):
    file = tmp_path / "creds.json"
    file.write_text(json.dumps({"as": {
        "": {"account_str": "acct", "account_key": "key0"},
        "as://Account-002/Container": {"account_str": "", "account_key": ""},
        "as://mi/c": {"account_str": "acct", "auth_type": "managed_identity", "client_id": "cid"},
    }}))
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(file), "AZURE_STORAGE_KEY": "ignored-with-a-file"}
    assert azure.credential("as://x/c/m", env) == azure.AzureCredential("acct", "key0", "", "")
    assert azure.credential("as://Account-002/Container/m", env) == azure.AzureCredential("", "", "", "")
    assert azure.credential("as://mi/c/m", env) == azure.AzureCredential("acct", "", "managed_identity", "cid")
    assert azure.credential("as://x/c", {"AZURE_STORAGE_ACCOUNT": "a", "AZURE_STORAGE_KEY": "k",
                                         "AZURE_STORAGE_AUTH_TYPE": "default"}) == \
        azure.AzureCredential("a", "k", "default", "")
    with pytest.raises(InvalidArgumentError, match="unknown Azure auth_type 'managed-identity'"):
        azure.credential("as://x/c", {"AZURE_STORAGE_AUTH_TYPE": "managed-identity"})
    file.write_text(json.dumps({"as": {"as://only": {}}}))
    with pytest.raises(NotFoundError, match="Cannot match credential for path as://other/c"):
        azure.credential("as://other/c", env)


def test_as_endpoint_and_account(monkeypatch):
    """The endpoint is the account's on Azure, or MODELHOST_AZURE_BLOB_ENDPOINT with {account}; a
    credential's account replaces the path's (Triton's rule). Making the client sends nothing."""
    pytest.importorskip("azure.storage.blob")
    for key in ("TRITON_CLOUD_CREDENTIAL_PATH", "AZURE_STORAGE_KEY", "AZURE_STORAGE_AUTH_TYPE",
                "MODELHOST_AZURE_BLOB_ENDPOINT", "AZURE_STORAGE_ACCOUNT"):
        monkeypatch.delenv(key, raising=False)
    store = azure.AzureStore("as://acct/container/models")
    store.client()
    assert store.endpoint == "https://acct.blob.core.windows.net"
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "other")
    monkeypatch.setenv("MODELHOST_AZURE_BLOB_ENDPOINT", "http://127.0.0.1:10000/{account}/")
    store = azure.AzureStore("as://acct/container/models")
    store.client()
    assert store.endpoint == "http://127.0.0.1:10000/other"


def test_local_paths_stay_local():
    assert parse_root("models/gs://x") == Path("models/gs://x")
    assert parse_root("as:/x") == Path("as:/x")
