"""Issue 15, finding 2: who may do what, and TLS.

Triton's --http-restricted-api / --grpc-restricted-protocol with the real tritonclient (headers
present, absent, wrong), and both front ends over TLS with certificates this test makes, mutual
TLS included.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import serve
from test_e2e_serve import write_identity

pytestmark = [pytest.mark.timeout(120), pytest.mark.modelhost_only]

ADMIN = {"admin-key": "s3cret"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "s3cret"}


def _http_infer(client, headers=None, **kwargs):
    x = httpclient.InferInput("INPUT0", [2], "FP32")
    x.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
    return client.infer("a", [x], headers=headers, **kwargs).as_numpy("OUTPUT0")


def _grpc_infer(client, headers=None):
    x = grpcclient.InferInput("INPUT0", [2], "FP32")
    x.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
    return client.infer("a", [x], headers=headers, client_timeout=20).as_numpy("OUTPUT0")


def test_restricted_categories_need_their_header(tmp_path):
    write_identity(tmp_path, "a")
    args = ["--model-control-mode", "explicit", "--load-model", "a",
            "--http-restricted-api", "model-repository,shared-memory:admin-key=s3cret",
            "--http-restricted-api", "inference:infer-key=abc",
            "--grpc-restricted-protocol", "model-repository,statistics:admin-key=s3cret",
            "--grpc-restricted-protocol", "inference:infer-key=abc",
            "--http-restricted-api", "trace,logging:ops=1",
            "--grpc-restricted-protocol", "trace,logging:ops=1"]
    with serve(tmp_path, *args) as server:
        http = httpclient.InferenceServerClient(server.url)
        assert http.is_server_ready() and http.get_model_metadata("a")["name"] == "a"  # open
        with pytest.raises(InferenceServerException) as info:
            http.get_model_repository_index()
        assert info.value.status() == "403"
        assert "This API is restricted, expecting header 'admin-key'" in str(info.value)
        with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
            http.get_model_repository_index(headers={"admin-key": "wrong"})
        assert http.get_model_repository_index(headers=ADMIN)[0]["name"] == "a"
        with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
            http.unload_model("a")
        with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
            http.get_system_shared_memory_status()
        with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
            _http_infer(http)
        assert _http_infer(http, {"infer-key": "abc"}).tolist() == [1.0, 2.0]
        assert http.get_inference_statistics("a")  # statistics is restricted on gRPC only
        with pytest.raises(InferenceServerException, match="expecting header 'ops'"):
            http.get_log_settings()
        with pytest.raises(InferenceServerException, match="expecting header 'ops'"):
            http.get_trace_settings()
        assert "log_info" in http.get_log_settings(headers={"ops": "1"})

        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.is_server_live()
        with pytest.raises(InferenceServerException) as info:
            grpc.get_model_repository_index()
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert ("This protocol is restricted, expecting header "
                "'triton-grpc-protocol-admin-key'") in info.value.message()
        assert grpc.get_model_repository_index(headers=GRPC_ADMIN).models[0].name == "a"
        with pytest.raises(InferenceServerException, match="triton-grpc-protocol-admin-key"):
            grpc.get_inference_statistics("a")
        with pytest.raises(InferenceServerException, match="triton-grpc-protocol-ops"):
            grpc.get_log_settings()
        assert grpc.get_log_settings(headers={"triton-grpc-protocol-ops": "1"}) is not None
        with pytest.raises(InferenceServerException, match="triton-grpc-protocol-infer-key"):
            _grpc_infer(grpc)
        assert _grpc_infer(grpc, {"triton-grpc-protocol-infer-key": "abc"}).tolist() == [1.0, 2.0]
        # the stream is an inference endpoint too
        errors = []
        grpc.start_stream(callback=lambda result, error: errors.append(error))
        x = grpcclient.InferInput("INPUT0", [1], "FP32")
        x.set_data_from_numpy(np.array([1.0], np.float32))
        try:
            grpc.async_stream_infer("a", [x])
        except InferenceServerException:
            pass  # the stream may already have ended with the error
        grpc.stop_stream()
        assert errors and "triton-grpc-protocol-infer-key" in str(errors[0])


def test_no_other_spelling_of_a_path_gets_past_the_restrictions(tmp_path):
    """falcon routes `//v2/...` (leading slashes dropped) and empty fields (`versions//infer`):
    every such spelling must answer as an unknown path, never reach the endpoint unchecked."""
    import http.client
    import json

    write_identity(tmp_path, "a")
    restricted = "health,metadata"  # everything else needs a key
    others = ",".join(c for c in ("inference", "shared-memory", "model-config", "model-repository",
                                  "statistics", "trace", "logging"))
    args = ["--model-control-mode", "explicit", "--load-model", "a",
            "--http-restricted-api", f"{others}:admin-key=s3cret"]
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                   "data": [1.0]}]})
    attempts = [("POST", "//v2/repository/index", "{}"), ("POST", "///v2/repository/index", "{}"),
                ("POST", "/v2//repository/index", "{}"), ("POST", "/v2/repository/index/", "{}"),
                ("POST", "//v2/repository/models/a/unload", "{}"), ("GET", "//v2/models/stats", ""),
                ("GET", "//v2/logging", ""), ("GET", "//v2/models/a/config", ""),
                ("GET", "//v2/systemsharedmemory/status", ""), ("POST", "//v2/models/a/infer", body),
                ("POST", "/v2/models/a/versions//infer", body), ("POST", "/v2/models//a/infer", body),
                ("POST", "/%76%32/repository/index", "{}"), ("GET", "//v2/trace/setting", ""),
                ("POST", "//v1/completions", "{}")]
    with serve(tmp_path, *args) as server:
        for method, path, data in attempts:
            conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            conn.close()
            assert answer.status in (400, 403, 404), (method, path, answer.status)
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("a")  # the unload above did not happen
        assert client.get_model_repository_index(headers=ADMIN)[0]["name"] == "a"
        assert _http_infer(client, ADMIN).tolist() == [1.0, 2.0]


@pytest.mark.parametrize("value, words", [
    ("bogus:k=v", "unknown restricted api 'bogus'"),
    ("health:k", "option format is"),
])
def test_bad_restriction_values_are_refused_at_start(tmp_path, value, words):
    done = subprocess.run([sys.executable, "-m", "host", "serve", "--model-repository", str(tmp_path),
                           "--http-restricted-api", value], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and words in done.stderr and "Traceback" not in done.stderr


def test_duplicate_category_is_refused(tmp_path):
    done = subprocess.run([sys.executable, "-m", "host", "serve", "--model-repository", str(tmp_path),
                           "--grpc-restricted-protocol", "health:a=1", "--grpc-restricted-protocol",
                           "health,metadata:b=2"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "restricted protocol 'health' can not be specified in multiple config groups" in done.stderr


# --- TLS ---------------------------------------------------------------------------------------

def _certificates(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(text):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    def make(subject, issuer, issuer_key, *, ca=False, usage=None, san=None):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if usage:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(issuer_key or key, hashes.SHA256())
        return key, cert

    ca_key, ca_cert = make("test-ca", "test-ca", None, ca=True)
    srv_key, srv_cert = make("localhost", "test-ca", ca_key, usage=ExtendedKeyUsageOID.SERVER_AUTH,
                             san=[x509.DNSName("localhost"),
                                  x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cli_key, cli_cert = make("client", "test-ca", ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    files = {}
    for label, key, cert in (("ca", ca_key, ca_cert), ("server", srv_key, srv_cert),
                             ("client", cli_key, cli_cert)):
        files[label + ".crt"] = directory / f"{label}.crt"
        files[label + ".crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[label + ".key"] = directory / f"{label}.key"
        files[label + ".key"].write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    return files


def test_mutual_tls_on_both_front_ends(tmp_path):
    repo = tmp_path / "repo"
    write_identity(repo, "a")
    certs = _certificates(tmp_path)
    probe = ssl.create_default_context(cafile=str(certs["ca.crt"]))
    probe.load_cert_chain(str(certs["client.crt"]), str(certs["client.key"]))
    args = ["--grpc-use-ssl-mutual", "--grpc-server-cert", certs["server.crt"],
            "--grpc-server-key", certs["server.key"], "--grpc-root-cert", certs["ca.crt"],
            "--http-ssl-cert", certs["server.crt"], "--http-ssl-key", certs["server.key"],
            "--http-ssl-root-cert", certs["ca.crt"], "--http-ssl-mutual"]
    with serve(repo, *map(str, args), ssl_context=probe) as server:
        read = lambda key: str(certs[key])  # noqa: E731 - tritonclient.grpc takes file names
        grpc = grpcclient.InferenceServerClient(
            server.grpc_url, ssl=True, root_certificates=read("ca.crt"),
            private_key=read("client.key"), certificate_chain=read("client.crt"))
        assert _grpc_infer(grpc).tolist() == [1.0, 2.0]
        anonymous = grpcclient.InferenceServerClient(server.grpc_url, ssl=True,
                                                     root_certificates=read("ca.crt"))
        with pytest.raises(InferenceServerException):
            _grpc_infer(anonymous)
        plain = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException):
            _grpc_infer(plain)

        https = httpclient.InferenceServerClient(
            server.url, ssl=True, network_timeout=20,
            ssl_options={"ca_certs": str(certs["ca.crt"]), "certfile": str(certs["client.crt"]),
                         "keyfile": str(certs["client.key"])})
        assert _http_infer(https).tolist() == [1.0, 2.0]
        no_cert = httpclient.InferenceServerClient(server.url, ssl=True, network_timeout=20,
                                                   ssl_options={"ca_certs": str(certs["ca.crt"])})
        with pytest.raises(Exception):
            _http_infer(no_cert)
        cleartext = httpclient.InferenceServerClient(server.url, network_timeout=20)
        with pytest.raises(Exception):
            _http_infer(cleartext)
        assert _http_infer(https).tolist() == [1.0, 2.0]  # still serving


def test_server_only_tls(tmp_path):
    repo = tmp_path / "repo"
    write_identity(repo, "a")
    certs = _certificates(tmp_path)
    probe = ssl.create_default_context(cafile=str(certs["ca.crt"]))
    args = ["--grpc-use-ssl", "--grpc-server-cert", certs["server.crt"],
            "--grpc-server-key", certs["server.key"],
            "--http-ssl-cert", certs["server.crt"], "--http-ssl-key", certs["server.key"]]
    with serve(repo, *map(str, args), ssl_context=probe) as server:
        grpc = grpcclient.InferenceServerClient(server.grpc_url, ssl=True,
                                                root_certificates=str(certs["ca.crt"]))
        assert _grpc_infer(grpc).tolist() == [1.0, 2.0]
        https = httpclient.InferenceServerClient(server.url, ssl=True, network_timeout=20,
                                                 ssl_options={"ca_certs": str(certs["ca.crt"])})
        assert _http_infer(https).tolist() == [1.0, 2.0]


@pytest.mark.parametrize("args, words", [
    (["--grpc-use-ssl"], "--grpc-server-cert is required"),
    (["--http-ssl-cert", "/nonexistent.pem", "--http-ssl-key", "/nonexistent.key"],
     "cannot read --http-ssl-cert '/nonexistent.pem'"),
    (["--http-ssl-mutual"], "--http-ssl-cert is required"),
])
def test_incomplete_tls_settings_are_refused_at_start(tmp_path, args, words):
    done = subprocess.run([sys.executable, "-m", "host", "serve", "--model-repository", str(tmp_path),
                           *args], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and words in done.stderr and "Traceback" not in done.stderr
