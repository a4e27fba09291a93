"""Triton's model namespacing (`--model-namespacing=true`; server repo qa/L0_model_namespacing).

modelhost refused the flag. With it, each model is keyed by (repository, name), as in Triton's
model_repository_manager.cc (checked side by side with Triton 2.51 on the QA's repositories):
- a request naming a model that two repositories serve is refused with Triton's ambiguity error
  (400 / INVALID_ARGUMENT), a name never loaded is "Request for unknown model: ... is not found"
  (400), a name whose models were all unloaded "Identifier of model ... is not found in global
  map" (404), and a model known but not ready names itself as '<repository>::<name>';
- an ensemble's step uses the model of that name in the ensemble's own repository, else the only
  one there is; the linked repository is written into the step's `model_namespace`;
- each model's metrics are labelled with its repository (`namespace`);
- loading a name loads it in every repository (an ensemble also its steps' models of those
  names), unloading a name unloads it everywhere, and the index lists every copy, by
  repository then name;
- polling: a repository losing a step's model links the ensemble to the other repository's,
  and gaining it back links it home again.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.repository import ModelKey
from host.testing import serve, wait_until

pytestmark = pytest.mark.modelhost_only

# OUTPUT0 = INPUT0 <op> INPUT1: "+" in repository A, "-" in repository B.
MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a {op} b)]))
        return out
"""

IO = """
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""

ENSEMBLE = IO + """
platform: "ensemble"
ensemble_scheduling { step [ { model_name: "%s" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }
"""

A_IN, B_IN = np.array([5, 6, 7, 8], dtype=np.int32), np.array([1, 2, 3, 4], dtype=np.int32)
ADD, SUB = (A_IN + B_IN).tolist(), (A_IN - B_IN).tolist()


def _model(repo: Path, name: str, op: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(MODEL.format(op=op))
    (repo / name / "config.pbtxt").write_text(f'backend: "python"\n{IO}')


def _ensemble(repo: Path, name: str, step: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(ENSEMBLE % step)


def _repos(root: Path) -> tuple[Path, Path]:
    """A: comp (+), ens -> comp, same -> comp, only_a (+); B: comp (-), ens_b -> comp,
    same -> comp, uses_only_a -> only_a (in A only)."""
    a, b = root / "a_repo", root / "b_repo"
    _model(a, "comp", "+")
    _model(a, "only_a", "+")
    _ensemble(a, "ens", "comp")
    _ensemble(a, "same", "comp")
    _model(b, "comp", "-")
    _ensemble(b, "ens_b", "comp")
    _ensemble(b, "same", "comp")
    _ensemble(b, "uses_only_a", "only_a")
    return a, b


def _infer(client: httpclient.InferenceServerClient, model: str) -> list[int]:
    inputs = [httpclient.InferInput("INPUT0", [4], "INT32"), httpclient.InferInput("INPUT1", [4], "INT32")]
    inputs[0].set_data_from_numpy(A_IN)
    inputs[1].set_data_from_numpy(B_IN)
    return client.infer(model, inputs).as_numpy("OUTPUT0").tolist()


def _result(client: httpclient.InferenceServerClient, model: str) -> list[int] | None:
    """The output, or None while the model is not served (being relinked)."""
    try:
        return _infer(client, model)
    except InferenceServerException:
        return None


def _error(url: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{url}{path}") as response:
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["error"]


def _index(client: httpclient.InferenceServerClient) -> list[tuple[str, str]]:
    return [(row["name"], row.get("state", "")) for row in client.get_model_repository_index()]


def _ambiguity(name: str) -> str:
    return (f"There are 2 identifiers of model '{name}' in global map, model namespace must be "
            "provided to resolve ambiguity.")


@pytest.fixture(scope="module")
def explicit(tmp_path_factory) -> Iterator[tuple[httpclient.InferenceServerClient, str, str, Path, int]]:
    a, b = _repos(tmp_path_factory.mktemp("ns"))
    with serve(a, "--model-repository", str(b), "--model-namespacing=true",
               "--model-control-mode=explicit") as server:
        client = httpclient.InferenceServerClient(server.url)
        yield client, server.url, server.grpc_url, a, server.metrics_port
        client.close()


def test_requests_by_name_resolve_across_repositories(explicit):
    client, url, grpc_url, a, metrics_port = explicit
    # before any load: the name is unknown (400)
    assert _error(url, "/v2/models/comp") == (400, "Request for unknown model: 'comp' is not found")
    assert _index(client) == [("comp", ""), ("ens", ""), ("only_a", ""), ("same", ""),
                              ("comp", ""), ("ens_b", ""), ("same", ""), ("uses_only_a", "")]

    # an ensemble loads its own repository's step model, and (Triton's polling chain) the
    # models of that name in every repository
    client.load_model("ens")
    assert _infer(client, "ens") == ADD
    assert [r for r in _index(client) if r[0] == "comp"] == [("comp", "READY"), ("comp", "READY")]
    step = client.get_model_config("ens")["ensemble_scheduling"]["step"][0]
    assert step["model_name"] == "comp" and step["model_namespace"] == str(a)

    # each copy's metrics carry its repository as Triton's `namespace` label
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as response:
        metrics = response.read().decode()
    for repo in (a, a.parent / "b_repo"):
        assert f'nv_inference_request_success{{model="comp",namespace="{repo}",version="1"}}' in metrics

    # a name two repositories serve is ambiguous, over HTTP and gRPC, for every request kind
    assert _error(url, "/v2/models/comp") == (400, _ambiguity("comp"))
    with pytest.raises(InferenceServerException) as info:
        _infer(client, "comp")
    assert info.value.status() == "400" and info.value.message() == _ambiguity("comp")
    with grpcclient.InferenceServerClient(grpc_url) as grpc:
        with pytest.raises(InferenceServerException) as info:
            grpc.get_model_metadata("comp")
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert info.value.message() == _ambiguity("comp")
    assert not client.is_model_ready("comp")
    assert _error(url, "/v2/models/comp/stats") == (400, "requested model 'comp' is not available")

    # the other repository's ensemble links its own 'comp'; one whose step model is in the
    # other repository only links that one
    client.load_model("ens_b")
    client.load_model("uses_only_a")
    assert _infer(client, "ens_b") == SUB
    assert _infer(client, "uses_only_a") == ADD
    assert _infer(client, "only_a") == ADD  # one repository only: served by name

    # ensembles of one name: each links its own repository's model; the name is ambiguous
    client.load_model("same")
    assert [r for r in _index(client) if r[0] == "same"] == [("same", "READY"), ("same", "READY")]
    assert _error(url, "/v2/models/same") == (400, _ambiguity("same"))

    # unloading a name unloads it in every repository, and the ensembles over it go down
    client.unload_model("comp")
    wait_until(lambda: [r for r in _index(client) if r[0] == "comp"] ==
             [("comp", "UNAVAILABLE"), ("comp", "UNAVAILABLE")], timeout=30)
    assert _error(url, "/v2/models/comp") == (
        404, "Identifier of model 'comp' is not found in global map")
    status, message = _error(url, "/v2/models/ens")
    assert (status, message) == (404, f"Request for unknown model: '{a}::ens' has no available versions")
    client.load_model("comp")  # brings them back
    assert _infer(client, "ens") == ADD
    assert _infer(client, "ens_b") == SUB
    assert _error(url, "/v2/models/comp")[1] == _ambiguity("comp")


def test_explicit_load_links_the_repository_that_has_the_model(explicit):
    client, _, _, a, _ = explicit
    moved = a.parent / "comp_away"
    client.unload_model("ens")
    client.unload_model("comp")
    shutil.move(a / "comp", moved)
    try:
        client.load_model("ens")  # A has no 'comp' now: the only one, B's, is linked
        assert _infer(client, "ens") == SUB
        assert _infer(client, "comp") == SUB  # served by name: only B's is loaded
    finally:
        shutil.move(moved, a / "comp")
    client.load_model("ens")  # A's 'comp' is back: loading the ensemble links it again
    assert _infer(client, "ens") == ADD
    assert _infer(client, "ens_b") == SUB


def test_polling_relinks_ensembles_when_a_repository_gains_or_loses_a_model(tmp_path):
    a, b = _repos(tmp_path)
    with serve(a, "--model-repository", str(b), "--model-namespacing=true",
               "--model-control-mode=poll", "--repository-poll-secs=1") as server:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_server_ready()
        assert _infer(client, "ens") == ADD and _infer(client, "ens_b") == SUB
        with pytest.raises(InferenceServerException, match="ambiguity"):
            _infer(client, "comp")

        shutil.move(a / "comp", tmp_path / "comp")  # A loses 'comp': 'ens' uses B's
        wait_until(lambda: _index(client).count(("comp", "READY")) == 1, timeout=30)
        wait_until(lambda: _result(client, "ens") == SUB, timeout=30)
        assert _infer(client, "comp") == SUB

        shutil.move(tmp_path / "comp", a / "comp")  # and back: 'ens' links A's again
        wait_until(lambda: _index(client).count(("comp", "READY")) == 2, timeout=30)
        wait_until(lambda: _result(client, "ens") == ADD, timeout=30)
        assert _infer(client, "ens_b") == SUB
        with pytest.raises(InferenceServerException, match="ambiguity"):
            _infer(client, "comp")
        client.close()


def test_response_cache_keeps_models_of_one_name_apart(tmp_path):
    a, b = tmp_path / "a_repo", tmp_path / "b_repo"
    for repo, op in ((a, "+"), (b, "-")):
        _model(repo, "comp", op)
        with open(repo / "comp" / "config.pbtxt", "a") as config:
            config.write("response_cache { enable: true }\n")
    _ensemble(a, "ens", "comp")
    _ensemble(b, "ens_b", "comp")
    with serve(a, "--model-repository", str(b), "--model-namespacing=true",
               "--cache-config=local,size=1048576") as server:
        client = httpclient.InferenceServerClient(server.url)
        assert _infer(client, "ens") == ADD
        assert _infer(client, "ens_b") == SUB  # the same inputs, B's 'comp': not A's cached answer
        assert _infer(client, "ens") == ADD
        client.close()


def test_model_keys():
    a, b = ModelKey("m", "/a"), ModelKey("m", "/b")
    assert a != b and {a: 1, b: 2}[b] == 2 and {a: 1}.get("m") is None  # a name finds neither
    assert a == "m" and f"'{a}'" == "'m'" and json.dumps([a]) == '["m"]' and a.qualified == "/a::m"
    assert sorted([b, ModelKey("z", "/a"), a]) == [a, ModelKey("z", "/a"), b]  # repository, name
