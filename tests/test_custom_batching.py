"""Triton's custom batching strategies (TRITON_BATCH_STRATEGY_PATH, batchstrategy.so) for native
and python models: the test strategy tests/native/strategy.c (a byte limit per batch, and a log of every call)
with the identity test backend, served by a real `modelhost serve` and driven with tritonclient.

TRITONSERVER_DELAY_SCHEDULER=6 holds each dynamic batcher's first batch until six requests are
queued (Triton's testing hook), so that the batches the strategy forms are known."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from host.native.testing import build_library, compiler
from host.testing import serve, wait_until

pytestmark = [
    pytest.mark.modelhost_only,
    pytest.mark.skipif(compiler() is None, reason="no C compiler to build the test libraries"),
]

SOURCES = Path(__file__).resolve().parent / "native"

CONFIG = """
backend: "{backend}"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
{extra}
parameters {{ key: "STRATEGY_LOG" value: {{ string_value: "{log}" }} }}
"""

BATCHING = "dynamic_batching { max_queue_delay_microseconds: 100000 }"


def param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("custom-batching")
    out, repo, backends, logs = root / "libs", root / "models", root / "backends", root / "logs"
    logs.mkdir()
    identity = build_library(SOURCES / "identity.c", out / "identity.so")
    strategy = {tag: build_library(SOURCES / "strategy.c", out / f"strategy_{tag}.so",
                                   [f'-DSTRATEGY_TAG="{tag}"'])
                for tag in ("version", "model", "backend", "named")}
    partial = build_library(SOURCES / "strategy.c", out / "partial.so", ["-DSTRATEGY_PARTIAL"])
    for backend in ("identity", "identity2"):
        (backends / backend).mkdir(parents=True)
        (backends / backend / f"libtriton_{backend}.so").write_bytes(identity.read_bytes())
    # identity2's backend directory holds a batchstrategy.so: its models without one of their
    # own use it (Triton's last search location)
    (backends / "identity2" / "batchstrategy.so").write_bytes(strategy["backend"].read_bytes())

    def model(name: str, backend: str = "identity", extra: str = "",
              files: dict[str, Path] | None = None) -> Path:
        folder = repo / name
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(CONFIG.format(
            backend=backend, extra=extra, log=logs / f"{name}.log"))
        for relative, library in (files or {}).items():
            (folder / relative).write_bytes(library.read_bytes())
        return folder

    # batches of at most 48 bytes: three requests of 4 INT32
    model("volume", extra=BATCHING + param("STRATEGY_LIMIT", "48"),
          files={"batchstrategy.so": strategy["model"]})
    model("include_fails", extra=BATCHING + param("STRATEGY_LIMIT", "48")
          + param("STRATEGY_FAIL", "include"), files={"batchstrategy.so": strategy["model"]})
    model("fini_fails", extra=BATCHING + param("STRATEGY_LIMIT", "1000")
          + param("STRATEGY_FAIL", "batch_fini"), files={"batchstrategy.so": strategy["model"]})
    # search order: version folder, model folder, backend folder; the parameter before all
    model("in_version", backend="identity2",
          files={"1/batchstrategy.so": strategy["version"], "batchstrategy.so": strategy["model"]})
    model("in_model", backend="identity2", files={"batchstrategy.so": strategy["model"]})
    model("in_backend", backend="identity2")
    named = repo / "named" / "libs" / "mine.so"
    model("named", backend="identity2", extra=param("TRITON_BATCH_STRATEGY_PATH", str(named)),
          files={"1/batchstrategy.so": strategy["version"]})
    named.parent.mkdir()
    named.write_bytes(strategy["named"].read_bytes())
    model("plain", extra=BATCHING)  # no strategy anywhere: batches as usual
    # refused
    model("escapes", extra=param("TRITON_BATCH_STRATEGY_PATH", str(strategy["named"])))
    model("missing", extra=param("TRITON_BATCH_STRATEGY_PATH", str(repo / "missing" / "no.so")))
    model("sequence", extra="sequence_batching { }"
          + param("TRITON_BATCH_STRATEGY_PATH", str(repo / "sequence" / "batchstrategy.so")),
          files={"batchstrategy.so": strategy["model"]})
    model("partial", files={"batchstrategy.so": partial})
    model("init_fails", extra=param("STRATEGY_FAIL", "batcher_init"),
          files={"batchstrategy.so": strategy["model"]})
    # A python model: Triton runs a strategy for a model of any backend.
    python = repo / "python_model"
    (python / "1").mkdir(parents=True)
    (python / "1" / "model.py").write_text(textwrap.dedent("""\
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                    for r in requests]
        """))
    (python / "config.pbtxt").write_text(CONFIG.format(
        backend="python", log=logs / "python_model.log",
        extra=BATCHING + param("STRATEGY_LIMIT", "48")
        + param("TRITON_BATCH_STRATEGY_PATH", str(python / "batchstrategy.so"))))
    (python / "batchstrategy.so").write_bytes(strategy["model"].read_bytes())
    with serve(repo, "--backend-directory", str(backends), "--model-control-mode", "explicit",
               "--load-model", "*", env={"TRITONSERVER_DELAY_SCHEDULER": "6"}) as server:
        yield server, repo, logs


def events(logs: Path, name: str) -> list[str]:
    path = logs / f"{name}.log"
    return path.read_text().splitlines() if path.exists() else []


def infer_six(server, name: str) -> None:
    """Six requests at once (ids r0..r5), each answered with its own data."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.url, concurrency=6)
    pending = []
    for k in range(6):
        data = np.arange(4, dtype=np.int32).reshape(1, 4) + 10 * k
        i0 = httpclient.InferInput("INPUT0", [1, 4], "INT32")
        i0.set_data_from_numpy(data)
        pending.append((data, client.async_infer(name, [i0], request_id=f"r{k}")))
    for data, call in pending:
        np.testing.assert_array_equal(call.get_result().as_numpy("OUTPUT0"), data)
    client.close()


def batch_sizes(server, name: str) -> dict[int, int]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics(name)["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def test_strategy_closes_batches_and_sees_each_request(served):
    server, _, logs = served
    infer_six(server, "volume")
    assert batch_sizes(server, "volume") == {3: 2}
    lines = events(logs, "volume")
    assert lines[0] == "batcher_init volume tag=model limit=48"  # with the model's own config
    assert lines.count("batch_init") == lines.count("batch_fini") == 2
    included = [line for line in lines if line.endswith("-> yes")]
    assert sorted(line.split()[1] for line in included) == [f"r{k}" for k in range(6)]
    assert all("bytes=16" in line for line in included)  # InputProperties: one row of 4 INT32
    # the fourth request did not fit the first batch: it ended it, and started the next
    refused = [i for i, line in enumerate(lines) if line.endswith("-> no")]
    assert len(refused) == 1
    assert lines[refused[0] + 1] == "batch_fini" and lines[refused[0] + 2] == "batch_init"


def test_python_model_batches_by_its_strategy(served):
    server, _, logs = served
    infer_six(server, "python_model")
    assert batch_sizes(server, "python_model") == {3: 2}
    lines = events(logs, "python_model")
    assert lines[0] == "batcher_init python_model tag=model limit=48"
    assert sorted(line.split()[1] for line in lines if line.endswith("-> yes")) == [
        f"r{k}" for k in range(6)]
    import tritonclient.http as httpclient  # unload: the batcher is finalized with the model

    httpclient.InferenceServerClient(server.url).unload_model("python_model")
    wait_until(lambda: "batcher_fini python_model" in events(logs, "python_model"))


def test_models_without_a_strategy_batch_as_usual(served):
    server, _, logs = served
    infer_six(server, "plain")
    assert batch_sizes(server, "plain") == {6: 1}
    assert events(logs, "plain") == []
    assert "custom batching strategy library" not in "\n".join(
        line for line in server.log_text().splitlines() if "model plain" in line)


def test_strategy_errors_are_logged_and_do_not_fail_requests(served):
    server, _, logs = served
    infer_six(server, "include_fails")
    # an include that fails counts as "not included": every batch holds one request
    assert batch_sizes(server, "include_fails") == {1: 6}
    infer_six(server, "fini_fails")
    assert batch_sizes(server, "fini_fails") == {6: 1}
    wait_until(lambda: "Custom batching finalization function failed for model fini_fails: "
               "test strategy batch_fini failed" in server.log_text())
    assert ("Custom batching include function failed for model include_fails: "
            "test strategy include failed") in server.log_text()


def test_library_search_order_and_the_named_path(served):
    server, repo, logs = served
    assert events(logs, "in_version")[0].startswith("batcher_init in_version tag=version ")
    assert events(logs, "in_model")[0].startswith("batcher_init in_model tag=model ")
    assert events(logs, "in_backend")[0].startswith("batcher_init in_backend tag=backend ")
    assert events(logs, "named")[0].startswith("batcher_init named tag=named ")
    assert (f"Loading custom batching strategy library {repo / 'in_version' / '1' / 'batchstrategy.so'}"
            " for model in_version") in server.log_text()


def test_refused_strategies_fail_the_load_with_tritons_reasons(served):
    import tritonclient.http as httpclient

    server, repo, logs = served
    client = httpclient.InferenceServerClient(server.url)
    reasons = {r["name"]: r.get("reason", "") for r in client.get_model_repository_index()
               if r.get("state") == "UNAVAILABLE"}
    assert reasons["escapes"] == "Invalid argument: Batching library path escapes model repository."
    assert reasons["missing"] == ("Not found: Batching library path not found: "
                                  f"{repo / 'missing' / 'no.so'}")
    assert reasons["sequence"] == (
        "Invalid argument: TRITON_BATCH_STRATEGY_PATH cannot be specified with sequence batcher, "
        "using default batching strategy")
    assert reasons["partial"] == (
        f"Invalid argument: {repo / 'partial' / 'batchstrategy.so'} does not define all required "
        "custom batching functions for model partial")
    assert reasons["init_fails"] == "Not found: test strategy refuses the model"
    assert events(logs, "init_fails") == ["batcher_init init_fails tag=model limit=0"]
    assert client.is_server_live() and client.is_model_ready("volume")


def test_unload_finalizes_the_batcher_and_reload_makes_a_new_one(served):
    import tritonclient.http as httpclient

    server, _, logs = served
    client = httpclient.InferenceServerClient(server.url)
    client.unload_model("in_model")
    wait_until(lambda: "batcher_fini in_model" in events(logs, "in_model"))
    client.load_model("in_model")
    assert [line.split()[0] for line in events(logs, "in_model")] == [
        "batcher_init", "batcher_fini", "batcher_init"]
