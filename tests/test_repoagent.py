"""Repository agents (`model_repository_agents`, --repoagent-directory): the test agent
tests/native/repoagent.c, built here, with python models served by a real `modelhost serve` and
driven with tritonclient. (Triton's own checksum agent, built from its source against modelhost's
headers, passes Triton's qa/L0_repoagent_checksum the same way: docs/conformance.md.)"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from host.native.testing import build_library, compiler
from host.testing import serve, wait_until

pytestmark = [
    pytest.mark.modelhost_only,
    pytest.mark.skipif(compiler() is None, reason="no C compiler to build the test agent"),
]

SOURCE = Path(__file__).resolve().parent / "native" / "repoagent.c"

MODEL = textwrap.dedent("""\
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.where = args["model_repository"]

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "WHERE", np.array([self.where.encode()], dtype=np.object_))]) for _ in requests]
    """)


def config(name: str, params: dict[str, str], agent: str = "tester") -> str:
    entries = ", ".join(f'{{ key: "{k}", value: "{v}" }}' for k, v in params.items())
    return textwrap.dedent(f"""\
        name: "{name}"
        backend: "python"
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] }} ]
        model_repository_agents {{ agents [ {{ name: "{agent}", parameters [ {entries} ] }} ] }}
        """)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("repoagent")
    agents, repo, logs = root / "agents", root / "models", root / "logs"
    logs.mkdir()
    build_library(SOURCE, agents / "tester" / "libtritonrepoagent_tester.so")

    def model(name: str, params: dict[str, str], agent: str = "tester") -> Path:
        folder = repo / name
        (folder / "1").mkdir(parents=True)
        (folder / "1" / "model.py").write_text(MODEL)
        (folder / "config.pbtxt").write_text(config(name, {"LOG": str(logs / f"{name}.log"),
                                                            **params}, agent))
        return folder

    model("plain", {})
    model("required", {"REQUIRE": "1/model.py"})
    model("missing", {"REQUIRE": "1/weights.bin"})
    model("moved", {"RELOCATE": "1"})
    model("fails_unload", {"FAIL": "UNLOAD"})
    model("no_agent", {}, agent="nope")
    with serve(repo, "--repoagent-directory", str(agents), "--model-control-mode", "explicit",
               "--load-model", "*") as server:
        yield server, repo, logs, agents


def events(logs: Path, name: str) -> list[str]:
    path = logs / f"{name}.log"
    return path.read_text().splitlines() if path.exists() else []


def where(server, name: str) -> str:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.url)
    i = httpclient.InferInput("IN", [1], "INT32")
    i.set_data_from_numpy(np.zeros(1, np.int32))
    return client.infer(name, [i]).as_numpy("WHERE")[0].decode()


def test_actions_in_tritons_order(served):
    import tritonclient.http as httpclient

    server, repo, logs, _ = served
    assert where(server, "plain") == str(repo / "plain")
    lines = events(logs, "plain")
    assert lines[0].startswith("model_init plain config_has_name=1 agent_inits=1")
    assert lines[1:] == ["LOAD plain", "LOAD_COMPLETE plain"]
    httpclient.InferenceServerClient(server.url).unload_model("plain")
    wait_until(lambda: "model_fini" in events(logs, "plain"))
    assert events(logs, "plain")[3:] == ["UNLOAD plain", "UNLOAD_COMPLETE plain", "model_fini"]


def test_a_failing_load_action_fails_the_load_with_its_message(served):
    import tritonclient.http as httpclient

    server, _, logs, agents = served
    client = httpclient.InferenceServerClient(server.url)
    reasons = {r["name"]: r.get("reason", "") for r in client.get_model_repository_index()}
    assert client.is_model_ready("required")
    assert not client.is_model_ready("missing")
    assert "missing required file 1/weights.bin" in server.log_text()
    assert events(logs, "missing")[1:] == ["LOAD missing", "LOAD_FAIL missing", "model_fini"]
    assert not client.is_model_ready("no_agent")
    assert (f"unable to find 'libtritonrepoagent_nope.so' for repo agent 'nope', searched: "
            f"{agents}") in server.log_text()
    assert "missing" in reasons and client.is_server_live()


def test_an_agent_may_move_the_files_the_model_loads_from(served):
    import tritonclient.http as httpclient

    server, repo, logs, _ = served
    moved_to = next(line.split(" ", 1)[1] for line in events(logs, "moved")
                    if line.startswith("relocated "))
    assert where(server, "moved") == moved_to != str(repo / "moved")
    assert Path(moved_to, "1", "model.py").is_file()
    httpclient.InferenceServerClient(server.url).unload_model("moved")
    wait_until(lambda: "model_fini" in events(logs, "moved"))
    assert not Path(moved_to).exists()  # released by the agent at UNLOAD_COMPLETE
    assert (repo / "moved" / "1" / "model.py").is_file()  # the model's own files are untouched


def test_errors_of_other_actions_are_logged_only(served):
    import tritonclient.http as httpclient

    server, _, logs, _ = served
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_model_ready("fails_unload")
    client.unload_model("fails_unload")
    wait_until(lambda: "model_fini" in events(logs, "fails_unload"))
    assert "test agent failed as asked" in server.log_text()
    client.load_model("fails_unload")
    assert client.is_model_ready("fails_unload")
