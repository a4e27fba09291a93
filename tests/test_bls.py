"""BLS: python models that call other models (`pb_utils.InferenceRequest(...).exec()`), served by a
real `modelhost serve` and driven with tritonclient over HTTP, gRPC and the gRPC stream.

The models are in tests/bls_models: `bls_call` (synchronous execute) and `bls_async`
(`async def execute`) are drivers whose SPEC input says what to call and whose RESULT output
reports what came back; the texts asserted here are those the real Triton 2.51 returns for the
same repository (checked side by side)."""

from __future__ import annotations

import json
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from host.testing import serve, wait_until

pytestmark = pytest.mark.modelhost_only

MODELS = Path(__file__).resolve().parent / "bls_models"
X = np.array([1.0, 2.0, 3.0], dtype=np.float32)


@pytest.fixture(scope="module")
def server():
    with serve(MODELS, "--model-control-mode", "explicit", "--load-model", "*",
               "--cache-config", "local,size=1048576") as s:
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


def call(client, spec: dict, model: str = "bls_call", x: np.ndarray = X) -> tuple[object, np.ndarray]:
    """Send one SPEC to a driver; (its RESULT, its OUTPUT0)."""
    mod = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    spec_in = mod.InferInput("SPEC", [1], "BYTES")
    spec_in.set_data_from_numpy(np.array([json.dumps(spec).encode()], dtype=np.object_))
    x_in = mod.InferInput("INPUT0", list(x.shape), "FP32")
    x_in.set_data_from_numpy(x)
    result = client.infer(model, [spec_in, x_in])
    return json.loads(result.as_numpy("RESULT")[0]), result.as_numpy("OUTPUT0")


# --- calls, from sync and async execute, over both protocols -----------------------------------

@pytest.mark.parametrize("driver", ["bls_call", "bls_async"])
def test_a_call_passes_inputs_request_fields_and_parameters(http, grpc, driver):
    spec = {"model": "identity_fp32", "version": 1, "request_id": "abc", "correlation_id": 7,
            "flags": 1, "timeout": 5000, "preferred_cpu": True,
            "parameters": {"p": 1, "s": "x", "b": True}}
    for client in (http, grpc):
        result, out = call(client, spec, driver)
        assert out.tolist() == X.tolist()
        [response] = result
        assert "error" not in response
        assert response["outputs"] == ["OUTPUT0"]
        assert response["params"] == {"p": 1, "s": "x", "b": True, "seen_id": "abc",
                                      "seen_correlation_id": 7, "seen_flags": 1,
                                      "seen_timeout": 5000}
    result, _ = call(http, {"model": "identity_fp32", "correlation_id": "corr-s"}, driver)
    assert result[0]["params"]["seen_correlation_id"] == "corr-s"


def test_tensors_pass_between_models_without_a_copy(http):
    """The callee's output is the very array the caller sent (identity returns its input)."""
    result, _ = call(http, {"model": "identity_fp32"})
    assert result[0]["same_memory"] is True


def test_async_execute_runs_calls_concurrently_with_gather(http):
    result, out = call(http, {"model": "identity_fp32", "gather": 4}, "bls_async")
    assert len(result) == 4 and all("error" not in r for r in result)
    assert out.tolist() == X.tolist() * 4


# --- errors: Triton's texts, as response errors the model can read --------------------------

ERRORS = [
    ({"model": "nope"},
     "Model nope - Error when running inference: Request for unknown model: 'nope' is not found"),
    ({"model": "identity_fp32", "version": 3},
     "Model identity_fp32 - Error when running inference: Request for unknown model: "
     "'identity_fp32' version 3 is not found"),
    ({"model": "repeat", "input_name": "IN", "input_dtype": "int32", "outputs": ["OUT"]},
     "Model repeat - Error when running inference: Model repeat is using the decoupled. The "
     "current BLS request call doesn't support models using the decoupled transaction policy. "
     "Please use 'decoupled=True' argument to the 'exec' or 'async_exec' calls for decoupled "
     "models.'"),
    ({"model": "identity_fp32", "input_name": "WRONG"},
     "Model identity_fp32 - Error when running inference: unexpected inference input 'WRONG' for "
     "model 'identity_fp32'"),
    ({"model": "identity_fp32", "outputs": ["NOPE"]},
     "Model identity_fp32 - Error when running inference: unexpected inference output 'NOPE' for "
     "model 'identity_fp32'"),
]


@pytest.mark.parametrize("driver", ["bls_call", "bls_async"])
def test_errors_reach_the_model_as_error_responses_with_tritons_texts(http, grpc, driver):
    for client in (http, grpc):
        for spec, text in ERRORS:
            result, _ = call(client, spec, driver)
            assert result == [{"outputs": [], "params": {}, "error": text, "code": 1}], spec


def test_a_failing_callee_gives_its_own_error(http):
    """The callee's own failure comes back with its message."""
    result, _ = call(http, {"model": "bls_async", "next": {"fail": "boom"}, "outputs": ["RESULT"]})
    assert result[0]["error"].startswith("Failed to process the request(s) for model "
                                         "'bls_async_0_0', message: ValueError: boom\n\nAt:\n")
    assert result[0]["error"].endswith("/bls_async/1/model.py(89): execute\n")
    assert result[0]["code"] == 1


# --- decoupled ---------------------------------------------------------------------------------

@pytest.mark.parametrize("driver", ["bls_call", "bls_async"])
def test_decoupled_exec_iterates_every_response_then_the_final_one(grpc, driver):
    spec = {"model": "repeat", "input_name": "IN", "input_dtype": "int32", "outputs": ["OUT"],
            "decoupled": True, "out": "OUT"}
    result, out = call(grpc, spec, driver, np.array([4.0, 5.0, 6.0], dtype=np.float32))
    assert [r["outputs"] for r in result] == [["OUT"], ["OUT"], ["OUT"], []]
    assert out.tolist() == [4.0, 5.0, 6.0]
    # a non-decoupled model called with decoupled=True: its one response, final
    result, out = call(grpc, {"model": "identity_fp32", "decoupled": True}, driver)
    assert [r["outputs"] for r in result] == [["OUTPUT0"]]


def test_a_decoupled_model_streams_what_its_bls_call_streams(server):
    """bls_stream (decoupled) calls repeat (decoupled) from its own thread, over the gRPC stream."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        values = np.array([7, 8, 9], dtype=np.int32)
        inp = grpcclient.InferInput("IN", [3], "INT32")
        inp.set_data_from_numpy(values)
        client.async_stream_infer("bls_stream", [inp], request_id="s1",
                                  enable_empty_final_response=True)
        outs = []
        while True:
            result, error = got.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                break
            outs.append(int(result.as_numpy("OUT")[0]))
        assert outs == [7, 8, 9]
    finally:
        client.stop_stream()
        client.close()


# --- no deadlock -------------------------------------------------------------------------------

def test_a_model_calling_itself_does_not_deadlock(http):
    """bls_call has one instance; calling itself runs on the instance its caller holds."""
    for driver in ("bls_call", "bls_async"):
        spec = {"model": driver, "outputs": ["OUTPUT0", "RESULT"], "next": {"model": "identity_fp32"}}
        result, out = call(http, spec, driver)
        assert "error" not in result[0]
        assert result[0]["nested"][0]["outputs"] == ["OUTPUT0"]
        assert out.tolist() == X.tolist()


def test_mutual_calls_on_one_chain_do_not_deadlock(http):
    """bls_call -> bls_async -> bls_call -> identity: each driver has one instance."""
    spec = {"model": "bls_async", "outputs": ["OUTPUT0", "RESULT"],
            "next": {"model": "bls_call", "outputs": ["OUTPUT0", "RESULT"],
                     "next": {"model": "identity_fp32"}}}
    result, out = call(http, spec)
    assert result[0]["nested"][0]["nested"][0]["outputs"] == ["OUTPUT0"]
    assert out.tolist() == X.tolist()


def test_a_chain_through_a_batched_model_does_not_deadlock(http):
    """bls_call -> bls_batched (runs on its batcher's thread) -> bls_call -> identity: the
    instances held along the chain travel with the request to the batcher's thread."""
    spec = {"model": "bls_batched", "batched": True, "outputs": ["OUTPUT0", "RESULT"],
            "next": {"model": "bls_call", "outputs": ["OUTPUT0", "RESULT"],
                     "next": {"model": "identity_fp32"}}}
    result, out = call(http, spec)
    assert "error" not in result[0], result
    assert result[0]["nested"][0]["outputs"] == ["OUTPUT0"]
    assert out.tolist() == X.tolist()


def test_busy_callee_instances_make_calls_wait_not_deadlock(server):
    """Many clients at once, every call funnelled into identity_fp32's single instance."""
    specs = [({"model": "identity_fp32"}, "bls_call"), ({"model": "identity_fp32", "gather": 3},
                                                        "bls_async")] * 8

    def one(item):  # a client per thread: tritonclient's HTTP client is not thread-safe
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            return call(client, *item)
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, specs))
    assert all("error" not in r for result, _ in results for r in result)


# --- the response cache and model control --------------------------------------------------------

def test_a_call_to_a_cached_model_is_served_from_the_cache(http):
    x = np.array([42.0, 43.0], dtype=np.float32)
    call(http, {"model": "identity_cached"}, x=x)
    second, out = call(http, {"model": "identity_cached"}, x=x)
    assert "error" not in second[0] and out.tolist() == x.tolist()
    stats = http.get_inference_statistics("identity_cached")["model_stats"][0]["inference_stats"]
    assert stats["cache_hit"]["count"] >= 1


def test_model_control_from_a_model(http, grpc):
    assert call(http, {"op": "ready", "model": "identity_fp32"})[0] == {"ready": True}
    assert call(http, {"op": "ready", "model": "nope"})[0] == {"ready": False}
    assert call(http, {"op": "ready", "model": "identity_fp32", "version": 5})[0] == {"ready": False}
    assert call(http, {"op": "ready", "model": "identity_fp32", "version": "x"})[0] == {"raised": (
        "Failed to check model readiness: Failed to process the request for model 'bls_call_0_0', "
        "message: failed to get model version from specified version string 'x' (details: stol), "
        "version should be an integral value > 0")}
    assert call(grpc, {"op": "load", "model": "nope"}, "bls_async")[0] == {"raised": (
        "Failed to load model: Failed to process the request for model 'bls_async_0_0', message: "
        "failed to load 'nope', failed to poll from model repository")}
    assert call(http, {"op": "unload", "model": "nope"})[0] == {"unloaded": True}  # as Triton

    assert call(http, {"op": "unload", "model": "repeat"})[0] == {"unloaded": True}
    assert not http.is_model_ready("repeat")
    assert call(http, {"op": "ready", "model": "repeat"})[0] == {"ready": False}
    assert call(grpc, {"op": "load", "model": "repeat"}, "bls_async")[0] == {"loaded": True}
    assert http.is_model_ready("repeat")

    # A model loaded from a config and files the calling model supplies.
    made = {"op": "load", "model": "bls_made", "config": json.dumps({
                "backend": "python", "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}),
            "files": {"file:1/model.py": (MODELS / "identity_fp32" / "1" / "model.py").read_text()}}
    assert call(http, made)[0] == {"loaded": True}
    assert call(http, {"model": "bls_made"})[0][0]["outputs"] == ["OUTPUT0"]

    # A model unloading itself gets its answer, and the unload completes after its request.
    assert call(http, {"op": "unload", "model": "bls_async"}, "bls_async")[0] == {"unloaded": True}
    wait_until(lambda: not http.is_model_ready("bls_async"), message="bls_async still ready")
    http.load_model("bls_async")
    assert call(http, {"model": "identity_fp32"}, "bls_async")[0][0]["outputs"] == ["OUTPUT0"]


def test_model_control_needs_explicit_mode(tmp_path):
    with serve(MODELS, "--model-control-mode", "none") as s:
        client = httpclient.InferenceServerClient(s.url)
        assert call(client, {"op": "unload", "model": "identity_fp32"})[0] == {"raised": (
            "Failed to unload model: Failed to process the request for model 'bls_call_0_0', "
            "message: explicit model load / unload is not allowed if polling is enabled")}
        assert client.is_model_ready("identity_fp32")
