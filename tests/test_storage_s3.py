"""`s3://` model repositories (host.storage), as Triton serves them (its QA: L0_storage_S3_local).

A real S3 API: moto's standalone server on a free loopback port, filled with boto3; real
`modelhost serve` processes reading it, real `tritonclient` (HTTP and gRPC) against them. The unit
tests (path grammar, credential file, the mirror's treatment of hostile keys) use the same server.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from storage_models import (MODEL_PY, S3, config, index, infer_grpc, infer_http, run_s3, start_failure,
                            write_local_model)
from storage_models import CLEAN_ENV as AWS_ENV
from tritonclient.utils import InferenceServerException

from host.errors import InvalidArgumentError, NotFoundError
from host.storage import mirror as mirror_mod
from host.storage import parse_root, s3
from host.testing import free_port, serve, wait_until

pytestmark = pytest.mark.modelhost_only
pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3]:
    yield from run_s3()


# --- serving ---------------------------------------------------------------------------------------

def test_serves_s3_repository_at_start(s3_server, tmp_path):
    """NONE mode: every model of the bucket's path loads, over HTTP and gRPC; the copy lives in a
    private folder under TRITON_AWS_MOUNT_DIRECTORY and is removed when the server stops."""
    bucket = s3_server.bucket("start-bucket")
    s3_server.put_model(bucket, "repo/sub", "identity")
    s3_server.put_model(bucket, "repo/sub", "plus_two", add=2)
    s3_server.put_model(bucket, "elsewhere", "not_served")
    mount = tmp_path / "mount"
    mount.mkdir()
    given = f"s3://127.0.0.1:{s3_server.port}//{bucket}//repo/sub/"  # cleaned as Triton does
    with serve(given, env={**AWS_ENV, "TRITON_AWS_MOUNT_DIRECTORY": str(mount)}) as server:
        assert infer_http(server.url, "identity", [1, 2]).tolist() == [1, 2]
        assert infer_grpc(server.grpc_url, "plus_two", [1, 2]).tolist() == [3, 4]
        assert {name for name, _ in index(server.url)} == {"identity", "plus_two"}
        copies = list(mount.iterdir())
        assert len(copies) == 1 and stat.S_IMODE(copies[0].stat().st_mode) == 0o700
        assert (copies[0] / "repository" / "identity" / "1" / "model.py").read_text() == MODEL_PY
        server.stop()
    assert list(mount.iterdir()) == []


def test_explicit_mode_localhost_dotted_bucket(s3_server):
    """Explicit load and unload through both clients: `localhost` host form, a bucket name with
    dots, Triton's QA model name `Model_repo-1.0`; a model uploaded after start loads (each load
    reads the bucket again)."""
    bucket = s3_server.bucket("demo-bucket1.0")
    s3_server.put_model(bucket, "models", "Model_repo-1.0")
    with serve(s3_server.url(bucket, "models", host="localhost"), "--model-control-mode=explicit",
               env=AWS_ENV) as server:
        http = httpclient.InferenceServerClient(server.url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert not http.is_model_ready("Model_repo-1.0")
        assert ("Model_repo-1.0", "") in index(server.url)
        http.load_model("Model_repo-1.0")
        assert grpc.is_model_ready("Model_repo-1.0")
        assert infer_grpc(server.grpc_url, "Model_repo-1.0", [5]).tolist() == [5]

        s3_server.put_model(bucket, "models", "late", add=1)
        grpc.load_model("late")
        assert infer_http(server.url, "late", [5]).tolist() == [6]

        http.unload_model("Model_repo-1.0")
        wait_until(lambda: not http.is_model_ready("Model_repo-1.0"), timeout=30)

        s3_server.delete_prefix(bucket, "models/late/")
        with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
            http.load_model("late")


def test_poll_mode_follows_the_bucket(s3_server):
    """Poll mode: a new version replaces the old (latest 1), a changed config reloads, a removed
    model unloads, an added one loads (generous deadlines; Triton's QA allows 20 s)."""
    bucket = s3_server.bucket("poll-bucket")
    s3_server.put_model(bucket, "repo", "versioned")
    s3_server.put_model(bucket, "repo", "changing")
    s3_server.put_model(bucket, "repo", "doomed")
    with serve(s3_server.url(bucket, "repo"), "--model-control-mode=poll",
               "--repository-poll-secs=1", env=AWS_ENV) as server:
        http = httpclient.InferenceServerClient(server.url)
        assert http.is_model_ready("versioned", "1") and http.is_model_ready("doomed")

        s3_server.put(bucket, "repo/versioned/2/model.py", MODEL_PY)
        s3_server.put(bucket, "repo/changing/config.pbtxt", config("changing", add=10))
        s3_server.delete_prefix(bucket, "repo/doomed/")
        s3_server.put_model(bucket, "repo", "added", add=3)

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
        assert infer_http(server.url, "added", [1]).tolist() == [4]
        assert infer_grpc(server.grpc_url, "versioned", [7]).tolist() == [7]


def test_local_and_s3_repositories_together(s3_server, tmp_path):
    """A local folder and an S3 path in one server; a name in both is refused, and the message
    names the s3:// path, not its local copy."""
    bucket = s3_server.bucket("mixed-bucket")
    s3_server.put_model(bucket, "models", "from_s3", add=1)
    s3_server.put_model(bucket, "models", "twice")
    local = tmp_path / "local"
    for name in ("from_disk", "twice"):
        write_local_model(local, name, add=2)
    with serve(local, "--model-repository", s3_server.url(bucket, "models"), env=AWS_ENV) as server:
        assert infer_http(server.url, "from_s3", [1]).tolist() == [2]
        assert infer_http(server.url, "from_disk", [1]).tolist() == [3]
        assert not httpclient.InferenceServerClient(server.url).is_model_ready("twice")
        assert (f"exists in multiple model repositories: '{local}' and "
                f"'{s3_server.url(bucket, 'models')}'") in server.log_text()


# --- start-up failures -----------------------------------------------------------------------------

def test_missing_bucket_stops_start(s3_server):
    out = start_failure("--model-repository", s3_server.url("no-such-bucket", "models"))
    assert (f"failed to read model repository '{s3_server.url('no-such-bucket', 'models')}': "
            "bucket 'no-such-bucket' does not exist") in out


def test_missing_path_in_bucket_stops_start(s3_server):
    bucket = s3_server.bucket("path-bucket")
    s3_server.put(bucket, "other/x", "x")
    out = start_failure("--model-repository", s3_server.url(bucket, "models"))
    assert f"model repository '{s3_server.url(bucket, 'models')}' does not exist" in out


def test_endpoint_that_does_not_answer_stops_start():
    port = free_port()  # nothing listens there
    out = start_failure("--model-repository", f"s3://127.0.0.1:{port}/bucket/models")
    assert f"failed to read model repository 's3://127.0.0.1:{port}/bucket/models': cannot reach " \
           f"http://127.0.0.1:{port}" in out


def test_no_credentials_stops_start(s3_server):
    out = start_failure("--model-repository", s3_server.url("any-bucket"),
                        env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""})
    assert "no AWS credentials found" in out


def test_without_boto3_the_error_says_what_to_install():
    code = ("import sys; sys.modules['boto3'] = None; from host.cli import main; "
            "sys.exit(main(['serve', '--model-repository', 's3://127.0.0.1:1/bucket']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **AWS_ENV})
    assert result.returncode != 0
    assert "s3:// model repositories need boto3: pip install" in result.stderr, result.stderr
    assert "modelhost[s3]" in result.stderr
    assert "Traceback" not in result.stderr


# --- units: path grammar, credentials ------------------------------------------------------------

@pytest.mark.parametrize("given, bucket, prefix, endpoint", [
    ("s3://bucket", "bucket", "", None),
    ("s3://bucket/", "bucket", "", None),
    ("s3:///bucket//a///b/", "bucket", "a/b", None),
    ("s3://my.bucket-1/path/to/repo", "my.bucket-1", "path/to/repo", None),
    ("s3://127.0.0.1:4572/demo-bucket1.0", "demo-bucket1.0", "", "http://127.0.0.1:4572"),
    ("s3://localhost:4572/b/models", "b", "models", "http://localhost:4572"),
    ("s3://http://minio.local:9000/b/p", "b", "p", "http://minio.local:9000"),
    ("s3://https://minio.local:9000//b//p//", "b", "p", "https://minio.local:9000"),
])
def test_path_grammar(given, bucket, prefix, endpoint):
    parsed = s3.parse(given)
    assert (parsed.bucket, parsed.prefix, parsed.endpoint, parsed.url) == (bucket, prefix, endpoint, given)
    assert parse_root(given) == given  # kept as text for the server, not turned into a Path


def test_path_cleaning():
    assert s3.clean("s3://https://h:1///b//c/") == "s3://https://h:1/b/c"
    assert s3.clean("s3:////b") == "s3://b"


@pytest.mark.parametrize("given, message", [
    ("s3://", "Invalid bucket name: ''"),
    ("s3:////", "Invalid bucket name: '//'"),
    ("s3://localhost:9000", "No bucket name found in path: s3://localhost:9000"),
    ("s3://localhost:9000/", "No bucket name found in path"),
    ("s3://bad*bucket/x", "Invalid bucket name: 'bad*bucket'"),
    ("s3://https://bucket/x", "must be followed by host:port"),
])
def test_path_errors(given, message):
    with pytest.raises(InvalidArgumentError, match=message.replace("*", r"\*")):
        s3.parse(given)


def test_local_paths_stay_local(tmp_path):
    assert parse_root(str(tmp_path)) == tmp_path
    assert parse_root("models/s3://x") == Path("models/s3://x")  # only a leading scheme counts


def test_credential_file_longest_match(tmp_path):
    file = tmp_path / "creds.json"
    file.write_text(json.dumps({"gs": {"": "ignored"}, "s3": {
        "": {"key_id": "default-id", "secret_key": "default-secret", "region": "", "session_token": "",
             "profile": ""},
        "s3://bucket-2": {"key_id": "id2", "secret_key": "secret2", "region": "eu-west-1",
                          "session_token": "token2", "profile": "ignored-when-keys-given"},
        "s3://bucket-2/special": {"profile": "special-profile"},
    }}))
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(file)}
    assert s3.credential("s3://bucket-1/models", env) == {
        "aws_access_key_id": "default-id", "aws_secret_access_key": "default-secret"}
    assert s3.credential("s3://bucket-2/models", env) == {
        "aws_access_key_id": "id2", "aws_secret_access_key": "secret2",
        "aws_session_token": "token2", "region_name": "eu-west-1"}
    assert s3.credential("s3://bucket-2/special/models", env) == {"profile_name": "special-profile"}
    assert s3.credential("s3://bucket-2/models", {}) == {}  # no file: boto3's own chain

    file.write_text(json.dumps({"s3": {"s3://only-this": {"profile": "p"}}}))
    with pytest.raises(NotFoundError, match="Cannot match credential for path s3://other"):
        s3.credential("s3://other/models", env)
    file.write_text("{not json")
    with pytest.raises(InvalidArgumentError, match="cannot read the credential file"):
        s3.credential("s3://other/models", env)


def test_credential_file_is_used_by_the_server(s3_server, tmp_path):
    """With the file's keys (and no others in the environment), a server reads the bucket."""
    bucket = s3_server.bucket("cred-bucket")
    s3_server.put_model(bucket, "models", "identity")
    file = tmp_path / "creds.json"
    file.write_text(json.dumps({"s3": {s3_server.url(bucket): {"key_id": "from-file",
                                                               "secret_key": "from-file"}}}))
    env = {**AWS_ENV, "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
           "TRITON_CLOUD_CREDENTIAL_PATH": str(file)}
    with serve(s3_server.url(bucket, "models"), env=env) as server:
        assert infer_http(server.url, "identity", [1]).tolist() == [1]


# --- the mirror ------------------------------------------------------------------------------------

def test_hostile_keys_are_not_written_outside(s3_server, tmp_path, caplog):
    bucket = s3_server.bucket("hostile-bucket")
    hostile = ["models/../../evil", "models/m/1/../../../x", "models/m/1/..\\..\\..\\y",
               "models//abs", "models/m/./z"]
    for key in hostile:
        s3_server.put(bucket, key, "pwned")
    s3_server.put_model(bucket, "models", "m")
    assert set(hostile) <= set(s3_server.keys(bucket))  # the store kept them as written
    mount = tmp_path / "mount" / "deep"
    mount.mkdir(parents=True)
    copy = mirror_mod.Mirror(s3.S3Store(s3_server.url(bucket, "models")), str(mount))
    try:
        copy.sync()
        written = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
        assert written == {f"mount/deep/{copy.root.parent.name}/repository/m/config.pbtxt",
                           f"mount/deep/{copy.root.parent.name}/repository/m/1/model.py"}
        skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
        assert len(skipped) == len(hostile)
        assert all(f"model repository '{s3_server.url(bucket, 'models')}'" in m for m in skipped)
    finally:
        copy.close()
    assert not copy.root.exists()


def test_mirror_follows_changes_and_never_follows_links(s3_server, tmp_path):
    bucket = s3_server.bucket("sync-bucket")
    s3_server.put(bucket, "r/m/1/weights", b"aaaa")
    s3_server.put(bucket, "r/m/2/", b"")  # a folder marker: an empty version folder
    copy = mirror_mod.Mirror(s3.S3Store(s3_server.url(bucket, "r")), str(tmp_path))
    try:
        copy.sync()
        weights = copy.root / "m" / "1" / "weights"
        before = weights.stat()
        assert weights.read_bytes() == b"aaaa" and (copy.root / "m" / "2").is_dir()
        copy.sync()  # nothing changed: nothing fetched again (a fetch renames a new file into place)
        assert weights.stat().st_ino == before.st_ino

        s3_server.put(bucket, "r/m/1/weights", b"bbbb")  # same size, maybe the same second
        copy.sync()
        assert weights.read_bytes() == b"bbbb"
        assert weights.stat().st_mtime_ns != before.st_mtime_ns  # fingerprints see the change

        outside = tmp_path / "outside.txt"
        outside.write_text("keep")
        (copy.root / "m" / "1" / "link").symlink_to(outside)
        (copy.root / "m" / "link-dir").symlink_to(tmp_path, target_is_directory=True)
        copy.sync()
        assert not (copy.root / "m" / "1" / "link").is_symlink()
        assert not (copy.root / "m" / "link-dir").is_symlink()
        assert outside.read_text() == "keep"

        s3_server.delete_prefix(bucket, "r/m/1/")
        copy.sync()
        assert not (copy.root / "m" / "1").exists() and (copy.root / "m" / "2").is_dir()
    finally:
        copy.close()


def test_unreadable_bucket_during_poll_keeps_models(s3_server):
    """A poll that cannot read the bucket unloads nothing: the models serve on."""
    bucket = s3_server.bucket("flaky-bucket")
    s3_server.put_model(bucket, "repo", "identity")
    with serve(s3_server.url(bucket, "repo"), "--model-control-mode=poll", "--repository-poll-secs=1",
               env=AWS_ENV) as server:
        s3_server.delete_prefix(bucket, "repo/")
        s3_server.client.delete_bucket(Bucket=bucket)
        wait_until(lambda: "does not exist" in server.log_text(), timeout=30)
        time.sleep(1.5)  # another poll, not a timing assertion: the model must stay either way
        assert infer_http(server.url, "identity", [1]).tolist() == [1]
        assert httpclient.InferenceServerClient(server.url).is_model_ready("identity")
