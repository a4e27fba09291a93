"""Issue 15, finding 1: every file a model configuration names stays inside the model's directory.

A load request (explicit mode) may carry a whole configuration, so its file names are client input.
The real tritonclient sends overrides naming files outside the model directory; the server must
refuse each with a clear message and never import, open or dlopen the file.
"""

from __future__ import annotations

import json
import os

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.paths import resolve_inside
from host.errors import InvalidArgumentError
from host.testing import serve
from test_e2e_serve import infer, write_identity

pytestmark = [pytest.mark.timeout(120), pytest.mark.modelhost_only]

EVIL = """
import os
open(os.environ["EVIL_MARKER"], "w").write("imported")
class TritonPythonModel:
    def execute(self, requests):
        return []
"""


def _override(**extra) -> str:
    config = {"backend": "python", "max_batch_size": 0,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
    config.update(extra)
    return json.dumps(config)


def test_resolve_inside_rules(tmp_path):
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text("")
    assert resolve_inside(model, "model.py", "f", under="1") == model / "1" / "model.py"
    (model / "1" / "inner.py").symlink_to(model / "1" / "model.py")  # a link that stays inside
    assert resolve_inside(model, "inner.py", "f", under="1") == model / "1" / "inner.py"
    (model / "1" / "out.py").symlink_to(tmp_path / "elsewhere.py")
    for bad, words in (("/etc/passwd", "absolute"), ("../x.py", "'..'"), ("a/../../x", "'..'"),
                       ("out.py", "outside the model directory"), ("", "not a valid")):
        with pytest.raises(InvalidArgumentError, match=words):
            resolve_inside(model, bad, "default_model_filename", under="1")


def test_load_overrides_naming_files_outside_the_model_are_refused(tmp_path):
    repo = tmp_path / "repo"
    write_identity(repo, "a")
    outside = tmp_path / "evil.py"
    outside.write_text(EVIL)
    marker = tmp_path / "imported"
    (repo / "a" / "1" / "link.py").symlink_to(outside)
    env = {"EVIL_MARKER": str(marker)}
    with serve(repo, "--model-control-mode", "explicit", "--load-model", "a", env=env) as server:
        client = httpclient.InferenceServerClient(server.url)
        cases = [
            (_override(default_model_filename=str(outside)), "absolute path"),
            (_override(default_model_filename="../../evil.py"), "'..' is not allowed"),
            (_override(default_model_filename="link.py"), "outside the model directory"),
            (_override(output=[{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1],
                                "label_filename": "/etc/passwd"}]), "is outside model directory"),
            (_override(parameters={"EXECUTION_ENV_PATH": {"string_value": "/tmp/env.tar.gz"}}),
             "EXECUTION_ENV_PATH"),
            (_override(parameters={"EXECUTION_ENV_PATH": {
                "string_value": "$$TRITON_MODEL_DIRECTORY/../../env.tar.gz"}}), "EXECUTION_ENV_PATH"),
            (_override(backend="../../../tmp/x"), "invalid backend name"),
            (_override(sequence_batching={"state": [{
                "input_name": "S_IN", "output_name": "S_OUT", "data_type": "TYPE_FP32", "dims": [1],
                "initial_state": [{"name": "s", "data_type": "TYPE_FP32", "dims": [1],
                                   "data_file": "../../evil.bin"}]}]}), "initial_state data_file"),
        ]
        for config, words in cases:
            with pytest.raises(InferenceServerException, match=words) as info:
                client.load_model("a", config=config)
            assert info.value.status() in ("400", "501"), config  # labels: Triton's UNSUPPORTED
        assert not marker.exists()  # the outside file was never imported
        # the model that was serving keeps serving
        assert infer(client, "a", [2.0]).tolist() == [2.0]


def test_native_library_linked_from_outside_is_refused(tmp_path):
    repo = tmp_path / "repo"
    (repo / "nat" / "1").mkdir(parents=True)
    (repo / "nat" / "config.pbtxt").write_text('name: "nat"\nbackend: "sneaky"\n')
    lib = tmp_path / "libtriton_sneaky.so"
    lib.write_bytes(b"\x7fELF not really")
    os.symlink(lib, repo / "nat" / "libtriton_sneaky.so")
    write_identity(repo, "a")
    with serve(repo, "--model-control-mode", "explicit", "--load-model", "a") as server:
        client = httpclient.InferenceServerClient(server.url)
        with pytest.raises(InferenceServerException, match="outside the model directory"):
            client.load_model("nat")
