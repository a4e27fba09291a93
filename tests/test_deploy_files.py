"""The deployment files, checked with real tools: hadolint on the Dockerfile; kustomize (kubectl's)
builds the Kubernetes manifests, validated against the Kubernetes API schemas
(kubernetes-validate, strict); the KServe resources against KServe's CRD schemas (vendored,
deploy/kserve/schemas/); the ConfigMap's modelhost.toml against `modelhost serve` itself.

The tools come from the `deploy-check` extra (installed with the `test` extra).
"""

from __future__ import annotations

import copy
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from host import cli

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.30.0"  # the oldest Kubernetes the manifests are written for


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[deploy-check]'")
    return path


def test_dockerfile_passes_hadolint():
    result = subprocess.run([_tool("hadolint"), "--no-color", "Dockerfile"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    # the lint is real: a root image without pinned base fails
    (tmp_path / "Dockerfile").write_text("FROM python\nRUN apt-get install gcc\nCMD python\n")
    result = subprocess.run([_tool("hadolint"), "--no-color", str(tmp_path / "Dockerfile")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3006" in result.stdout


def test_dockerfile_stages_user_and_healthcheck():
    text = (ROOT / "Dockerfile").read_text()
    stages = [line.split()[-1] for line in text.splitlines() if line.startswith("FROM ")]
    assert stages == ["build-cuda", "cuda", "build", "cpu"]  # CPU last: the default target
    assert text.count("USER 10001:10001") == 2 and text.count("HEALTHCHECK ") == 2
    assert text.count("scripts/build_rootfs.sh /opt/modelhost") == 2
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".git" in ignored and ".venv" in ignored


def _kustomize(overlay: str) -> list[dict]:
    out = subprocess.run([_tool("kubectl"), "kustomize", str(DEPLOY / "kubernetes" / overlay)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _validate(doc: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", ["base", "overlays/redis"])
def test_kubernetes_manifests_are_valid(overlay):
    docs = _kustomize(overlay)
    for doc in docs:
        _validate(doc)
    kinds = sorted(d["kind"] for d in docs)
    expected = ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PersistentVolumeClaim",
                "PodDisruptionBudget", "Service", "Service", "Service"]
    if overlay == "overlays/redis":
        expected = sorted(expected + ["Deployment", "Service"])
    assert kinds == expected
    server = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "modelhost")
    container = server["spec"]["template"]["spec"]["containers"][0]
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    volumes = {v["name"]: v for v in server["spec"]["template"]["spec"]["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "modelhost-models"
    env = {e["name"]: e["value"] for e in container["env"]}
    if overlay == "overlays/redis":
        # the variable is the --cache-config flag, as modelhost itself parses it
        args = cli.parse_serve_args(cli.build_parser(), [], env | {"MODELHOST_CONFIG_FILE": ""})
        assert args.cache_config == [("redis", "host", "modelhost-redis"), ("redis", "port", "6379")]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert {"modelhost-http", "modelhost-grpc", "modelhost-metrics"} <= set(services)


def test_validation_is_strict():
    import kubernetes_validate

    deployment = next(d for d in _kustomize("base") if d["kind"] == "Deployment")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(bad)


def test_config_map_settings_are_modelhost_settings(tmp_path):
    toml = DEPLOY / "kubernetes" / "base" / "modelhost.toml"
    args = cli.parse_serve_args(cli.build_parser(), ["--config-file", str(toml)], {})
    assert args.repos == [Path("/models")] and args.log_format == "json"


def _kserve_schema(name: str) -> dict:
    return json.loads(gzip.decompress((DEPLOY / "kserve" / "schemas" / f"{name}.json.gz").read_bytes()))


@pytest.mark.parametrize("file, schema", [
    ("servingruntime.yaml", "servingruntime-v1alpha1"),
    ("inferenceservice.yaml", "inferenceservice-v1beta1"),
    ("inferenceservice-grpc.yaml", "inferenceservice-v1beta1"),
])
def test_kserve_resources_are_valid(file, schema):
    import jsonschema

    doc = yaml.safe_load((DEPLOY / "kserve" / file).read_text())
    validator = jsonschema.Draft7Validator(_kserve_schema(schema))
    assert not [e.message for e in validator.iter_errors(doc)]
    bad = copy.deepcopy(doc)
    bad["spec"]["protocolVersion"] = "v2"  # misplaced field: refused
    assert list(validator.iter_errors(bad))
    if doc["kind"] == "ServingRuntime":
        assert doc["spec"]["protocolVersions"] == ["v2", "grpc-v2"]
        # its container's arguments are modelhost serve's own
        args = doc["spec"]["containers"][0]["args"]
        parsed = cli.parse_serve_args(cli.build_parser(), args[1:], {})
        assert (parsed.http_port, parsed.grpc_port) == (8080, 9000)
