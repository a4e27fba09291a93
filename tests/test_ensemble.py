"""Ensembles against a real `modelhost serve`, with the real tritonclient (HTTP, gRPC, gRPC stream).

One server (explicit model control, local response cache) serves the repository that
`ensemble_models.write_repository` writes; the ensembles of `GOOD` load at start, each broken one
is loaded by its test. Model control tests that unload models run last, on their own server.
"""

from __future__ import annotations

import json
import os
import queue
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from ensemble_models import GOOD, write_broken, write_repository
from tritonclient.utils import InferenceServerException

from host.testing import serve, wait_until

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = write_repository(tmp_path_factory.mktemp("ensembles") / "models")
    return root


@pytest.fixture(scope="module")
def broken(repo: Path) -> dict[str, str]:
    return write_broken(repo)


@pytest.fixture(scope="module")
def server(repo: Path, broken):
    loads = [a for name in GOOD for a in ("--load-model", name)]
    with serve(repo, "--model-control-mode", "explicit", "--cache-config", "local,size=1048576",
               "--allow-client-shm", "true", *loads) as s:
        yield s


@pytest.fixture
def http(server):
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.close()


@pytest.fixture
def grpc(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def _inputs(module, x: np.ndarray, name: str = "INPUT0"):
    tensor = module.InferInput(name, list(x.shape), "FP32" if x.dtype == np.float32 else "INT32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def _stats(client, model: str) -> dict:
    if isinstance(client, grpcclient.InferenceServerClient):
        return client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return client.get_inference_statistics(model)["model_stats"][0]


def _stream(grpc_client, model: str, x: np.ndarray, names: tuple[str, str] = ("IN", "OUT")) -> list:
    """Every response of one streamed request (the flags-only final one ends it)."""
    responses: queue.Queue = queue.Queue()
    grpc_client.start_stream(lambda result, error: responses.put((result, error)))
    try:
        grpc_client.async_stream_infer(model, _inputs(grpcclient, x, names[0]),
                                       enable_empty_final_response=True)
        got = []
        while True:
            result, error = responses.get(timeout=30)
            if error is not None:
                raise error
            response = result.get_response()
            if result.as_numpy(names[1]) is not None:
                got.append(result.as_numpy(names[1]).tolist())
            if response.parameters["triton_final_response"].bool_param:
                return got
    finally:
        grpc_client.stop_stream()


# --- execution ---------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_chain_runs_each_step_once(request, protocol) -> None:
    client = request.getfixturevalue(protocol)
    module = httpclient if protocol == "http" else grpcclient
    before = _stats(client, "add1")
    x = np.arange(4, dtype=np.float32)
    result = client.infer("ens_chain", _inputs(module, x))
    assert result.as_numpy("OUTPUT0").tolist() == (x + 1).tolist()
    after = _stats(client, "add1")
    assert int(after["execution_count"]) == int(before["execution_count"]) + 1
    response = result.get_response()
    name = response["model_name"] if protocol == "http" else response.model_name
    assert name == "ens_chain"
    if protocol == "http":  # Triton's ensemble responses carry the sequence fields
        assert response["parameters"] == {"sequence_id": 0, "sequence_start": False,
                                          "sequence_end": False}


def test_ensemble_over_the_grpc_stream(grpc) -> None:
    got = _stream(grpc, "ens_nested", np.array([1.0, 2.0], np.float32), ("INPUT0", "OUTPUT0"))
    assert got == [[4.0, 6.0]]


def test_independent_branches_run_concurrently(http) -> None:
    # Each branch model waits at a two-party barrier: one run after the other would break it.
    x = np.ones(3, dtype=np.float32)
    result = http.infer("ens_branches", _inputs(httpclient, x))
    assert result.as_numpy("OUTPUT0").tolist() == [2.0, 2.0, 2.0]


def test_latest_version_and_pinned_version(http) -> None:
    x = np.zeros(2, dtype=np.float32)
    assert http.infer("ens_latest", _inputs(httpclient, x)).as_numpy("OUTPUT0").tolist() == [20, 20]
    assert http.infer("ens_v1", _inputs(httpclient, x)).as_numpy("OUTPUT0").tolist() == [10, 10]


def test_only_requested_outputs_come_back_and_unneeded_steps_do_not_run(http) -> None:
    before = int(_stats(http, "mul2")["execution_count"])
    x = np.arange(3, dtype=np.float32)
    result = http.infer("ens_two_outputs", _inputs(httpclient, x),
                        outputs=[httpclient.InferRequestedOutput("PLUS")])
    assert result.as_numpy("PLUS").tolist() == (x + 1).tolist()
    assert result.as_numpy("TIMES") is None
    assert int(_stats(http, "mul2")["execution_count"]) == before
    both = http.infer("ens_two_outputs", _inputs(httpclient, x))
    assert both.as_numpy("TIMES").tolist() == (x * 2).tolist()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_parameters_and_timeout_reach_the_steps(request, protocol) -> None:
    client = request.getfixturevalue(protocol)
    module = httpclient if protocol == "http" else grpcclient
    kwargs = {"timeout": 5_000_000} if protocol == "grpc" else {}
    result = client.infer("ens_echo", _inputs(module, np.ones(1, np.float32)), request_id="r-7",
                          parameters={"colour": "blue", "n": 3}, **kwargs)
    info = json.loads(result.as_numpy("INFO")[0])
    assert info["parameters"] == {"colour": "blue", "n": 3}
    assert info["id"] == "r-7"
    if protocol == "grpc":
        assert info["timeout"] == 5_000_000


def test_priority_and_timeout_fields_reach_the_step_requests(tmp_path) -> None:
    """In process: the step requests the host sends itself carry the ensemble request's fields."""
    from host.core import Host
    from host.inference import InferenceRequest, Tensor
    from host.options import ServerOptions

    repo = write_repository(tmp_path / "models")
    host = Host(ServerOptions(model_repositories=[repo], model_control_mode="explicit"))
    host.start()
    try:
        host.load_model("ens_chain")
        seen = []
        submit = host.ensembles.submit
        host.ensembles.submit = lambda mv, req, cb: (seen.append(req), submit(mv, req, cb))
        x = np.ones(2, np.float32)
        request = InferenceRequest("ens_chain", inputs={"INPUT0": Tensor("INPUT0", "FP32", [2], x)},
                                   parameters={"priority": 2, "timeout": 900, "k": "v"})
        out = host.infer(request, timeout=30)
        assert out.outputs[0].data.tolist() == [2.0, 2.0]
        assert [(r.model_name, r.priority, r.timeout_us, r.parameters) for r in seen] == [
            ("ident", 2, 900, {"k": "v"}), ("add1", 2, 900, {"k": "v"})]
        assert seen[0].inputs["INPUT0"].data is x  # passed on, not copied
    finally:
        host.stop()


# --- errors and cancellation -------------------------------------------------------------------

@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_failing_step_fails_the_request_with_its_message(request, protocol) -> None:
    client = request.getfixturevalue(protocol)
    module = httpclient if protocol == "http" else grpcclient
    with pytest.raises(InferenceServerException) as info:
        client.infer("ens_fail", _inputs(module, np.ones(2, np.float32)))
    message = info.value.message()
    # Triton's prefix and then the step's own message, nothing in between
    assert message.startswith("in ensemble 'ens_fail', boom from the fail model")
    assert client.is_server_live()


def _finished(grpc, model: str) -> int:
    stats = _stats(grpc, model)["inference_stats"]
    return int(stats["fail"].get("count", 0)) + int(stats["success"].get("count", 0))


def test_timed_out_request_cancels_its_running_step(grpc) -> None:
    before = _finished(grpc, "until_cancelled")
    with pytest.raises(InferenceServerException) as info:
        grpc.infer("ens_cancel", _inputs(grpcclient, np.ones(2, np.float32)), client_timeout=0.5)
    assert "Deadline" in str(info.value) or "DEADLINE" in str(info.value)
    # The step saw the cancellation and stopped (it answers with an error response, which
    # Triton's python backend counts as a success: the request is finished either way).
    wait_until(lambda: _finished(grpc, "until_cancelled") > before,
               timeout=20, message="the running step was not cancelled")


# --- decoupled ---------------------------------------------------------------------------------

def test_repeat_feeding_square_streams_every_response(grpc) -> None:
    got = _stream(grpc, "ens_repeat_square", np.array([1, 2, 3], np.int32))
    assert sorted(v for r in got for v in r) == [1, 4, 4, 9, 9, 9]


def test_fan_out_then_fan_in_pairs_the_responses(grpc) -> None:
    got = _stream(grpc, "ens_fan", np.array([1, 5, 7], np.int32))
    assert sorted(v for r in got for v in r) == [4, 16, 22]  # (x + 1) + 2x for each response


def test_nested_decoupled_ensemble_streams(grpc) -> None:
    got = _stream(grpc, "ens_nested_decoupled", np.array([2, 1], np.int32))
    assert sorted(v for r in got for v in r) == [2, 5, 5]


def test_decoupled_ensemble_refuses_unary_calls(http, grpc) -> None:
    x = np.array([1], np.int32)
    assert http.get_model_config("ens_repeat_square")["model_transaction_policy"]["decoupled"]
    with pytest.raises(InferenceServerException, match="HTTP end point doesn't support models with "
                                                       "decoupled transaction policy"):
        http.infer("ens_repeat_square", _inputs(httpclient, x, "IN"))
    with pytest.raises(InferenceServerException, match="doesn't support models with decoupled"):
        grpc.infer("ens_repeat_square", _inputs(grpcclient, x, "IN"))


def test_decoupled_ensemble_over_http_generate_stream(server) -> None:
    import urllib.request
    body = json.dumps({"IN": [3]}).encode()
    req = urllib.request.Request(f"{server.http_url}/v2/models/ens_repeat_square/generate_stream",
                                 data=body, headers={"Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=30) as resp:
        events = [json.loads(line[5:]) for line in resp.read().decode().splitlines()
                  if line.startswith("data:")]
    assert [e["OUT"] for e in events] == [9, 9, 9]


def test_bls_call_to_an_ensemble(http) -> None:
    x = np.arange(3, dtype=np.float32)
    result = http.infer("bls_to_ensemble", _inputs(httpclient, x))
    assert result.as_numpy("OUTPUT0").tolist() == (x + 1).tolist()


def test_nested_ensemble(http) -> None:
    x = np.arange(3, dtype=np.float32)
    assert http.infer("ens_nested", _inputs(httpclient, x)).as_numpy("OUTPUT0").tolist() == \
        ((x + 1) * 2).tolist()


# --- statistics and cache ----------------------------------------------------------------------

def test_statistics_count_the_ensemble_request_and_each_step(http) -> None:
    before_e, before_s = _stats(http, "ens_nested"), _stats(http, "mul2")
    http.infer("ens_nested", _inputs(httpclient, np.ones(2, np.float32)))
    after_e, after_s = _stats(http, "ens_nested"), _stats(http, "mul2")
    for before, after in ((before_e, after_e), (before_s, after_s)):
        assert int(after["inference_stats"]["success"]["count"]) == \
            int(before["inference_stats"]["success"]["count"]) + 1
        assert int(after["execution_count"]) == int(before["execution_count"]) + 1


def test_ensemble_cache_hit_skips_the_composing_models(http) -> None:
    x = np.array([41.0, 42.0], np.float32)
    first = http.infer("ens_cached", _inputs(httpclient, x)).as_numpy("OUTPUT0")
    steps = int(_stats(http, "add1")["execution_count"])
    second = http.infer("ens_cached", _inputs(httpclient, x)).as_numpy("OUTPUT0")
    assert first.tolist() == second.tolist() == (x + 1).tolist()
    assert int(_stats(http, "add1")["execution_count"]) == steps
    stats = _stats(http, "ens_cached")["inference_stats"]
    assert int(stats["cache_hit"]["count"]) >= 1 and int(stats["cache_miss"]["count"]) >= 1


def test_composing_model_caches_on_its_own(http) -> None:
    x = np.array([7.0], np.float32)
    for _ in range(2):
        assert http.infer("ens_composing_cached", _inputs(httpclient, x)).as_numpy("OUTPUT0").tolist() == [8.0]
    assert int(_stats(http, "ident_cached")["inference_stats"]["cache_hit"]["count"]) >= 1
    assert int(_stats(http, "ens_composing_cached")["inference_stats"]["cache_hit"]["count"]) == 0


def test_failed_cache_insertion_counts_as_a_miss(http) -> None:
    # 2 MB of output never fits a 1 MB cache: both requests are misses, neither a hit.
    x = np.full(512 * 1024, 3.0, np.float32)
    before = _stats(http, "ens_cached")["inference_stats"]
    for _ in range(2):
        assert http.infer("ens_cached", _inputs(httpclient, x)).as_numpy("OUTPUT0")[0] == 4.0
    after = _stats(http, "ens_cached")["inference_stats"]
    assert int(after["cache_miss"]["count"]) == int(before["cache_miss"]["count"]) + 2
    assert int(after["cache_hit"]["count"]) == int(before["cache_hit"]["count"])


# --- shared memory -----------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_system_shared_memory_in_and_out(request, protocol) -> None:
    client = request.getfixturevalue(protocol)
    module = httpclient if protocol == "http" else grpcclient
    x = np.arange(8, dtype=np.float32)
    name, key = f"ens_{protocol}", f"/ens_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(name, key, 2 * x.nbytes)
    try:
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory(name, key, 2 * x.nbytes)
        tensor = module.InferInput("INPUT0", [8], "FP32")
        tensor.set_shared_memory(name, x.nbytes)
        out = module.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(name, x.nbytes, offset=x.nbytes)
        client.infer("ens_chain", [tensor], outputs=[out])
        written = shm.get_contents_as_numpy(handle, np.float32, [8], offset=x.nbytes)
        assert written.tolist() == (x + 1).tolist()
        client.unregister_system_shared_memory(name)
    finally:
        shm.destroy_shared_memory_region(handle)


# --- metadata and load errors ------------------------------------------------------------------

def test_index_and_metadata_list_ensembles(http, grpc) -> None:
    rows = {r["name"]: r for r in http.get_model_repository_index()}
    assert rows["ens_chain"]["state"] == "READY"
    meta = http.get_model_metadata("ens_chain")
    assert meta["platform"] == "ensemble" and meta["inputs"][0]["name"] == "INPUT0"
    assert grpc.get_model_metadata("ens_fan").platform == "ensemble"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_load_error_names_model_step_and_tensor(http, grpc, broken, protocol) -> None:
    client = http if protocol == "http" else grpc
    for name, expected in broken.items():
        with pytest.raises(InferenceServerException) as info:
            client.load_model(name)
        if name in POLL_TIME:
            # Triton checks the ensemble's own configuration when it polls the repository: the
            # load answers its poll text, and the reason is in the log and the index
            assert info.value.message() == f"failed to load '{name}', failed to poll from model repository"
            assert info.value.status() in ("500", "StatusCode.INTERNAL"), (name, info.value.status())
            reasons = {r["name"]: r.get("reason", "") for r in http.get_model_repository_index()}
            assert expected in reasons[name], name
        else:
            assert expected in info.value.message(), name
            assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), (name, info.value.status())
        assert not client.is_model_ready(name)
    assert client.is_server_ready()


# The ensembles whose error is in their own configuration (Triton's ValidateModelConfig at poll)
POLL_TIME = {"bad_unwritten"}


# --- model control (own server: it unloads models) -----------------------------------------------

def test_model_control_loads_and_unloads_composing_models(repo, broken) -> None:
    with serve(repo, "--model-control-mode", "explicit", "--load-model", "mul2",
               "--exit-timeout-secs", "5") as s:
        client = httpclient.InferenceServerClient(s.url)
        client.load_model("ens_nested")  # loads ens_chain, ident, add1 (mul2 was loaded already)
        for model in ("ens_nested", "ens_chain", "ident", "add1", "mul2"):
            assert client.is_model_ready(model), model
        x = np.ones(1, np.float32)
        assert client.infer("ens_nested", _inputs(httpclient, x)).as_numpy("OUTPUT0").tolist() == [4.0]

        # A composing model goes away: the ensembles over it stop serving, and say why.
        client.unload_model("add1")
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows["ens_chain"]["state"] == "UNAVAILABLE"
        assert "composing model 'add1'" in rows["ens_chain"]["reason"]
        assert "composing model 'ens_chain'" in rows["ens_nested"]["reason"]
        with pytest.raises(InferenceServerException, match="ens_nested"):
            client.infer("ens_nested", _inputs(httpclient, x))
        # ... and serve again once it is back.
        client.load_model("add1")
        assert client.is_model_ready("ens_chain") and client.is_model_ready("ens_nested")

        # unload_dependents: what the ensemble loaded goes too; what was loaded on its own stays.
        client.unload_model("ens_nested", unload_dependents=True)
        assert not client.is_model_ready("ens_nested")
        assert not client.is_model_ready("ens_chain") and not client.is_model_ready("ident")
        assert client.is_model_ready("mul2") and client.is_model_ready("add1")
        # ... and the unload waited for them to finish, outside the repository lock (their
        # finishers take it: waiting under it stalled until the exit timeout, then warned).
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows["ens_chain"]["state"] == rows["ident"]["state"] == "UNAVAILABLE"
        assert "still in flight" not in s.log_text()
        client.close()


def test_poll_mode_composing_model_removed_and_back(tmp_path) -> None:
    from ensemble_models import CHAIN, IO, ensemble, python_model, unary

    repo = tmp_path / "models"
    python_model(repo, "ident", unary("INPUT0"), IO)
    python_model(repo, "add1", unary("INPUT0 + 1"), IO)
    ensemble(repo, "ens_chain", IO, CHAIN)
    with serve(repo, "--model-control-mode", "poll", "--repository-poll-secs", "1") as s:
        client = httpclient.InferenceServerClient(s.url)
        assert client.is_model_ready("ens_chain")
        os.rename(repo / "add1", tmp_path / "add1")

        def reason() -> str:
            rows = {r["name"]: r for r in client.get_model_repository_index()}
            return rows["ens_chain"].get("reason", "") if "ens_chain" in rows else ""

        assert "composing model 'add1'" in wait_until(reason, timeout=30)
        assert not client.is_model_ready("ens_chain")
        os.rename(tmp_path / "add1", repo / "add1")
        wait_until(lambda: client.is_model_ready("ens_chain"), timeout=30)
        x = np.ones(1, np.float32)
        assert client.infer("ens_chain", _inputs(httpclient, x)).as_numpy("OUTPUT0").tolist() == [2.0]
        client.close()
